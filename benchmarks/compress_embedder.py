"""A trained embedder made k× faster and recovered by self-distillation: how much quality does it keep?

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/compress_embedder.py > out/ce.log 2>&1 &

Runs ``recipes/compress-embedder.yaml`` (score → plan → drop → distill → eval → bench → report) on
EmbeddingGemma-300M (``$DSPRUNE_MODELS/embeddinggemma-300m``; ``../shared/models/get-embeddinggemma.sh``
fetches it) into ``out/recipes/compress-embedder``, where finished stages are reused, so an interrupted run
resumes. Keeps the recipe's report (every model against the unpruned one, paired bootstrap intervals), the
plan, the distillation's settings and losses, the stage times and the command as
``benchmarks/results/compress_embedder.json``, prints the table and re-renders RESULTS.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, collect_recipe, keep_results, rerender, run_recipe_command  # noqa: E402
from benchmarks.grid import render  # noqa: E402
from dsprune import formats  # noqa: E402
from dsprune.report import compare  # noqa: E402

RECIPE = REPO / "recipes" / "compress-embedder.yaml"
OUT = REPO / "out" / "recipes" / "compress-embedder"
NAME = "compress_embedder"


def command(params: dict) -> list[str]:
    return ["dsprune", "run", "--recipe", str(RECIPE.relative_to(REPO)),
            *(["--param", *[f"{k}={v}" for k, v in params.items()]] if params else []),
            "--out", str(OUT.relative_to(REPO))]


def distill_summary(run: Path) -> dict:
    """What the distillation did: its settings, step count and first/last losses from its own log."""
    man = formats.read_json(run / "manifest.json", "distill manifest")
    rows = [r for r in formats.read_jsonl(run / "log.jsonl") if "loss" in r]
    keep = ("loss", "loss_cosine", "loss_kl", "loss_infonce")
    return {"config": {k: man.get("config", {}).get(k) for k in
                       ("distill_data", "per_device_batch_size", "num_epochs", "learning_rate", "lora",
                        "passage_max_length", "query_max_length", "distill_embed_weight", "distill_kl_weight",
                        "infonce_weight", "seed")},
            "distill": man.get("distill"), "steps": len(rows),
            "first": {k: rows[0].get(k) for k in keep} if rows else None,
            "last": {k: rows[-1].get(k) for k in keep} if rows else None}


def collect(params: dict, out: Path, results: Path) -> Path:
    doc = {"title": "EmbeddingGemma-300M compressed to a target speed-up, recovered by self-distillation",
           **collect_recipe(RECIPE, params, out, command(params), "benchmarks/compress_embedder.py")}
    plan = formats.read_json(out / "plan" / "plan.json", "plan")
    doc["plan"] = {k: plan.get(k) for k in ("target_speedup", "seq_len", "attn", "mlp", "slim_ratio",
                                            "flop_ratio", "num_layers")}
    doc["distill"] = distill_summary(out / "distill")
    return keep_results(doc, out, results, NAME)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--param", nargs="*", default=[], help="NAME=VALUE recipe params (model, target_speedup)")
    ap.add_argument("--collect", action="store_true", help="only collect the finished recipe's report")
    ap.add_argument("--results", default=str(render.RESULTS))
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    if not a.collect:
        run_recipe_command(command(params), OUT, "")
    dest = collect(params, OUT, Path(a.results))
    print(compare.markdown(formats.read_json(dest, "results")["report"]))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
