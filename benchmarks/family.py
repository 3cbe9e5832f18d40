"""A second model family through EffiR's recipe with only the model changed: do the findings carry over?

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/family.py gemma3 > out/family.log 2>&1 &

Runs ``recipes/effir-smollm2.yaml`` with the family's params (``dsprune run --param``), into
``out/recipes/effir-FAMILY``, where finished stages are reused, so an interrupted run resumes. The recipe ends
with a report of every model against the unpruned model given the same training budget (paired bootstrap
intervals, measured speed-ups); this script keeps that report, the stage times and the command as
``benchmarks/results/families/FAMILY.json`` (+ its quality-vs-speed PNG) and re-renders RESULTS.md, so the
family's table is made by committed code like every row of the grid.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, collect_recipe, keep_results, rerender, run_recipe_command  # noqa: E402
from benchmarks.grid import render  # noqa: E402

RECIPE = REPO / "recipes" / "effir-smollm2.yaml"
# family -> (title, recipe params): the MLP drop scaled like SmolLM2's 15 of 30 (EffiR's 16 of 32)
FAMILIES = {"gemma3": ("Gemma 3 270M (18 blocks: drop 9 MLPs)", {"model": "gemma3-270m", "drop_mlp": 9})}
RESULTS = render.RESULTS / "families"      # render.render_families reads them from there


def command(family: str) -> list[str]:
    params = [f"{k}={v}" for k, v in FAMILIES[family][1].items()]
    return ["dsprune", "run", "--recipe", str(RECIPE.relative_to(REPO)), "--param", *params,
            "--out", f"out/recipes/effir-{family}"]


def collect(family: str, out: Path, results: Path) -> Path:
    """The recipe's report with what made it: stage commands and times, code version."""
    title, params = FAMILIES[family]
    doc = {"family": family, "title": title,
           **collect_recipe(RECIPE, params, out, command(family), f"benchmarks/family.py {family}")}
    return keep_results(doc, out, results, family)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--collect", action="store_true", help="only collect the finished recipe's report")
    ap.add_argument("--results", default=str(RESULTS))
    a = ap.parse_args(argv)
    out = REPO / "out" / "recipes" / f"effir-{a.family}"
    if not a.collect:
        run_recipe_command(command(a.family), out, "~1.5 h from scratch on 2 CPU cores; ")
    collect(a.family, out, Path(a.results))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
