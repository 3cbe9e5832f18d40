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

from benchmarks._common import REPO, collect_recipe, copy_file, launch_env, sh  # noqa: E402
from benchmarks.grid import render  # noqa: E402
from dsprune import formats  # noqa: E402
from dsprune.errors import DsPruneError  # noqa: E402

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
    results.mkdir(parents=True, exist_ok=True)
    png = out / "report" / "quality_vs_speed.png"
    if png.is_file():
        copy_file(png, results / f"{family}_quality_vs_speed.png")
        doc["plot"] = f"{family}_quality_vs_speed.png"
    dest = results / f"{family}.json"
    formats.write_json(dest, doc)      # written to a temporary name and renamed
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("family", choices=sorted(FAMILIES))
    ap.add_argument("--collect", action="store_true", help="only collect the finished recipe's report")
    ap.add_argument("--results", default=str(RESULTS))
    a = ap.parse_args(argv)
    out = REPO / "out" / "recipes" / f"effir-{a.family}"
    if not a.collect:
        out.mkdir(parents=True, exist_ok=True)
        cmd = command(a.family)
        cmd[0] = str(Path(sys.executable).parent / "dsprune")
        print(f"running the recipe (~1.5 h from scratch on 2 CPU cores; log {out}.log)", flush=True)
        sh(cmd, Path(f"{out}.log"), launch_env())
    dest = collect(a.family, out, Path(a.results))
    print(f"wrote {dest}")
    try:    # the family's results are kept either way; a failed render leaves RESULTS.md as it was
        render.render(render.RESULTS, render.RESULTS_MD)
        print(f"rendered {render.RESULTS_MD}")
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
