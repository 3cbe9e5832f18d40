"""Why do dropped models not learn under the dense budget? Probe the embedding collapse, a few settings at once.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/train_collapse.py \
        --model out/reproduce/base-drop19m --variant base: --variant lr5e-5:learning_rate=5e-5 \
        --variant tau0.05:temperature=0.05

Under the dense run's exact options (``out/train_dense/train.yaml``) SmolLM2 learns (loss 3.97 -> ~1.8), but a
model with 19 MLPs dropped ends at the loss of a uniform guess over the candidates, ln(N), and its passages
collapse onto one direction. Each variant here trains the same model with the same data order for ``--steps``
steps, changing only the options it names; it reports the loss path against ln(N), the mean cosine between
unrelated passages before and after (collapse: towards 1) and nDCG@10 on a scifact_small subsample at step 0
and at the end (the trainer's own periodic eval, read back from its TensorBoard events). The loss shown is the
InfoNCE part (a KL variant's total adds its distillation term). Variants of an earlier probe of the same model,
config and steps are kept, so a later call adds to the table.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, sh, tensorboard_scalars  # noqa: E402


def passage_cosine(model: Path, texts: list[str]) -> float:
    """Mean cosine between different passages' embeddings (1.0 = every passage maps to one point)."""
    import torch

    from dsprune.encoder import Encoder

    emb = torch.as_tensor(Encoder.load(model).encode(texts, kind="passage")).float()
    emb = torch.nn.functional.normalize(emb, dim=-1)
    cos = emb @ emb.T
    return float(cos[~torch.eye(len(texts), dtype=torch.bool)].mean())


def tb_scalar(run: Path, tag: str) -> dict[int, float]:
    return {e.step: e.value for e in tensorboard_scalars(run / "tensorboard").get(tag, [])}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "out" / "reproduce" / "base-drop19m"))
    ap.add_argument("--config", default=str(REPO / "out" / "train_dense" / "train.yaml"))
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME:opt=value,opt=value (launcher options changed from --config); NAME: = unchanged")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--eval_queries", type=int, default=100)
    ap.add_argument("--eval_docs", type=int, default=300)
    ap.add_argument("--out", default=str(REPO / "out" / "train_collapse"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "training" / "collapse.json"))
    a = ap.parse_args()
    variants = {}
    for spec in a.variant or ["base:"]:
        name, _, opts = spec.partition(":")
        try:
            variants[name] = dict(kv.split("=", 1) for kv in opts.split(",") if kv)
        except ValueError:
            ap.error(f"--variant {spec!r}: expected NAME:opt=value,opt=value")
    for path, what in ((a.config, "--config"), (a.model, "--model")):
        if not Path(path).exists():
            ap.error(f"{what} {path}: not found")

    import yaml

    from dsprune import formats
    from dsprune.data import load_beir
    from dsprune.distributed import free_port
    from dsprune.settings import data_dir

    cfg = yaml.safe_load(Path(a.config).read_text())
    probe = load_beir(data_dir("scifact_small"), "test")
    texts = [r.get("text") or "" for r in list(probe.corpus_rows.values())[:48]]
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    env = launch_env()
    results = {"model": a.model, "config": a.config, "steps": a.steps,
               "cosine_before": round(passage_cosine(Path(a.model), texts), 4), "variants": {}}
    earlier = json.loads(Path(a.results).read_text()) if Path(a.results).exists() else {}
    same_probe = all(earlier.get(k) == results[k] for k in ("model", "config", "steps"))
    if same_probe:   # add to the variants run before
        results["variants"] = earlier.get("variants", {})
    for name, opts in variants.items():
        run = out / name
        cmd = [str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), "launchers/train.py",
               "--config", a.config, "--model", a.model, "--output_dir", str(run), "--overwrite", "true",
               "--max_steps", str(a.steps), "--save_steps", "0", "--eval_task", "scifact_small",
               "--eval_max_queries", str(a.eval_queries), "--eval_max_docs", str(a.eval_docs)]
        for k, v in opts.items():
            cmd += [f"--{k}", v]
        seconds = sh(cmd, out / "logs" / f"{name}.log", env)
        man = formats.read_manifest(run)
        rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        per_rank = cfg.get("per_device_batch_size", 8) * int(opts.get("group_size", cfg.get("group_size", 8)))
        candidates = per_rank * man["world_size"] if cfg.get("cross_rank_negatives", True) else per_rank
        evals = tb_scalar(run, "eval/ndcg_at_10")
        infonce = [r.get("loss_infonce", r["loss"]) for r in rows]
        results["variants"][name] = {
            "options": opts, "losses": [round(x, 3) for x in infonce],
            "uniform_loss": round(math.log(candidates), 3),
            "final_loss": round(sum(infonce[-4:]) / len(infonce[-4:]), 3),
            "cosine_after": round(passage_cosine(run / "model", texts), 4),
            "ndcg_at_10_start": evals.get(0), "ndcg_at_10_end": evals.get(a.steps), "seconds": round(seconds)}
    command = " ".join([sys.executable, *sys.argv])
    before = earlier.get("commands", []) if same_probe else []
    results["commands"] = [c for c in before if c != command] + [command]
    formats.write_json(Path(a.results), results)
    _plot(results, Path(a.results).with_suffix(".png"))

    print(f"\nmodel {a.model}; {a.steps} steps; mean passage cosine before training {results['cosine_before']}")
    print(f"{'variant':<12} {'options':<34} {'loss (last 4)':>13} {'ln N':>6} {'cos after':>9} {'nDCG@10 0 -> end':>17}")
    for name, r in results["variants"].items():
        opts = ",".join(f"{k}={v}" for k, v in r["options"].items()) or "(as the dense run)"
        start, end = r["ndcg_at_10_start"], r["ndcg_at_10_end"]
        nd = f"{start:.3f} -> {end:.3f}" if start is not None and end is not None else "-"
        print(f"{name:<12} {opts:<34} {r['final_loss']:>13.3f} {r['uniform_loss']:>6.2f} {r['cosine_after']:>9.3f} {nd:>17}")
    print(f"wrote {a.results} and {Path(a.results).with_suffix('.png')}")
    return 0


def _plot(results: dict, path: Path) -> None:
    from dsprune.report.figure import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for name, r in results["variants"].items():
        ax.plot(range(1, len(r["losses"]) + 1), r["losses"], marker="o", ms=3, label=name)
    uniform = {r["uniform_loss"] for r in results["variants"].values()}
    for u in uniform:
        ax.axhline(u, color="grey", ls="--", lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("InfoNCE loss")
    ax.set_title(f"{Path(results['model']).name}: loss vs ln N (dashed)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
