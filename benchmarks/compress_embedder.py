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
import os
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
# the same recipe with one stage option changed; its model rows join the main table in RESULTS.md
VARIANTS = {"last": {"label": "drop-last-k", "set": {"plan.order": "last"},
                     "rows": {"drop + distill": "drop-last-k + distill", "drop only": "drop-last-k only"}},
            "1.5x": {"label": "1.5× plan", "set": {"plan.target_speedup": 1.5},
                     "rows": {"drop + distill": "1.5× plan: drop + distill", "drop only": "1.5× plan: drop only"}},
            # EffiR Table 3's pair at the same target: fewer drops + self-slimming against the main run's deeper drop
            "slim": {"label": "coarse drop + slim", "recipe": "recipes/compress-embedder-slim.yaml", "set": {},
                     "rows": {"drop + distill": "drop + slim + distill", "drop only": "drop + slim only"}},
            # the same plan and drop, another distillation seed: only the trained row is new
            "seed2": {"label": "second training seed", "set": {"distill.seed": 43},
                      "rows": {"drop + distill": "drop + distill, seed 43"}, "share": ("plan", "drop", "eval-drop")}}
# stages a variant can take from the main run as they are: they read no stage the variant changes
SHARED_STAGES = ("score", "mine", "mine-fin", "eval-full", "eval-minilm", "bench-minilm")
# the pair that says whether the distillation recovers anything, paired per query within one run
RECOVERY = ("eval", "eval-drop")


def out_of(variant: str) -> Path:
    return OUT.with_name(f"{OUT.name}-{variant}") if variant else OUT


def name_of(variant: str) -> str:
    return f"{NAME}_{variant}" if variant else NAME


def recipe_of(variant: str) -> Path:
    return REPO / VARIANTS[variant]["recipe"] if variant and "recipe" in VARIANTS[variant] else RECIPE


def command(params: dict, variant: str = "") -> list[str]:
    sets = VARIANTS[variant]["set"] if variant else {}
    return ["dsprune", "run", "--recipe", str(recipe_of(variant).relative_to(REPO)),
            *(["--param", *[f"{k}={v}" for k, v in params.items()]] if params else []),
            *(["--set", *[f"{k}={v}" for k, v in sets.items()]] if sets else []),
            "--out", str(out_of(variant).relative_to(REPO))]


def share_finished_stages(variant: str) -> None:
    """Hard-link the main run's finished stages that the variant would compute identically (the recipe then
    finds their stamps and reuses them)."""
    import shutil
    for name in SHARED_STAGES + VARIANTS[variant].get("share", ()):
        src, dst = OUT / name, out_of(variant) / name
        if (src / "stage.json").is_file() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(src, dst, copy_function=os.link)


def distill_summary(run: Path) -> dict:
    """What the distillation did: its settings, step count, first/last losses and the in-training scores
    (``eval_ndcg_at_10`` rows: the learning curve) from its own log."""
    man = formats.read_json(run / "manifest.json", "distill manifest")
    log = formats.read_jsonl(run / "log.jsonl")
    rows = [r for r in log if "loss" in r]
    keep = ("loss", "loss_cosine", "loss_kl", "loss_infonce")
    return {"config": {k: man.get("config", {}).get(k) for k in
                       ("distill_data", "per_device_batch_size", "num_epochs", "max_steps", "learning_rate",
                        "warmup_steps", "lora", "freeze", "passage_max_length", "query_max_length",
                        "distill_embed_weight", "distill_kl_weight", "infonce_weight", "eval_task", "eval_split",
                        "seed")},
            "distill": man.get("distill"), "steps": len(rows),
            "first": {k: rows[0].get(k) for k in keep} if rows else None,
            "last": {k: rows[-1].get(k) for k in keep} if rows else None,
            "curve": [{"step": r["step"], "ndcg_at_10": r["eval_ndcg_at_10"]} for r in log if "eval_ndcg_at_10" in r]}


def collect(params: dict, out: Path, results: Path, variant: str = "", main: Path = OUT) -> Path:
    doc = {"title": "EmbeddingGemma-300M compressed to a target speed-up, recovered by self-distillation",
           **collect_recipe(recipe_of(variant), params, out, command(params, variant),
                            "benchmarks/compress_embedder.py" + (f" --variant {variant}" if variant else "")),
           "variant": {"name": variant, **VARIANTS[variant]} if variant else None}
    plan = formats.read_json(out / "plan" / "plan.json", "plan")
    doc["plan"] = {k: plan.get(k) for k in ("target_speedup", "seq_len", "attn", "mlp", "slim_ratio",
                                            "flop_ratio", "num_layers")}
    doc["distill"] = distill_summary(out / "distill")
    bench = out / "bench" / "bench.json"
    bench = formats.read_json(bench, "bench") if bench.is_file() else {}
    doc["bench_pairs"] = {k: bench[k]["speedup_pairs"] for k in ("document", "query")
                          if "speedup_pairs" in bench.get(k, {})}
    doc["recovery"] = recovery(out)
    if variant:
        doc["against_main"] = against_main(main, out, variant)
    keep_version(doc, results / f"{name_of(variant)}.json")
    return keep_results(doc, out, results, name_of(variant))


def keep_version(doc: dict, dest: Path) -> None:
    """Collecting a run again whose training is the one already kept (new fields or stages added around the
    same distillation) keeps the code version that trained it, and names the one that collected it."""
    if dest.is_file():
        old = formats.read_json(dest, "compress-embedder results")
        if old.get("distill") == doc["distill"] and old.get("code_version") != doc["code_version"]:
            doc["recollected_by"] = doc["code_version"]
            doc["code_version"] = old.get("code_version")


def recovery(out: Path) -> dict:
    """The distilled model − the same pruned model without recovery, paired per query: the training's own
    effect in this run, at its seed."""
    return {"stages": list(RECOVERY), **paired(out / RECOVERY[1], out / RECOVERY[0])}


def paired(base: Path, other: Path) -> dict:
    """``other`` − ``base`` (two eval folders), paired per query: the mean over the tasks and each task."""
    row = compare.compare(compare.load_entries([str(base), str(other)], [], ["base", "other"]))["rows"][1]
    return {"mean_delta": row.get("mean_delta"), "tasks": {t: c.get("delta") for t, c in row["tasks"].items() if c}}


def against_main(main: Path, out: Path, variant: str) -> dict:
    """A variant's models paired per query with the main run's models of the same stage (the question is
    the variant against the main run, which two intervals to the unpruned model do not answer)."""
    found = {}
    for stage, main_label in (("eval", "drop + distill"), ("eval-drop", "drop only")):
        label = VARIANTS[variant]["rows"].get(main_label)
        if label is None:      # the variant shares this model with the main run
            continue
        found[label] = {"against": main_label, "trained": stage == "eval", **paired(main / stage, out / stage)}
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--param", nargs="*", default=[], help="NAME=VALUE recipe params (model, target_speedup)")
    ap.add_argument("--collect", action="store_true", help="only collect the finished recipe's report")
    ap.add_argument("--results", default=str(render.RESULTS))
    ap.add_argument("--variant", default="", choices=["", *VARIANTS],
                    help="run the recipe with a variant's stage options into its own folder (finished stages "
                         "of the main run that it shares are reused)")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    out = out_of(a.variant)
    if not a.collect:
        if a.variant:
            share_finished_stages(a.variant)
        run_recipe_command(command(params, a.variant), out, "")
    dest = collect(params, out, Path(a.results), a.variant)
    print(compare.markdown(formats.read_json(dest, "results")["report"]))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
