"""Inference in another number format, one results file per machine and format: ``recipes/int8-embedder.yaml``
(dynamic int8 Linear layers) or ``recipes/bf16-embedder.yaml`` (bfloat16 throughout), scored and timed against
float32, kept with the CPU the bench ran on.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/precision_machine.py [--format bf16] [--param ...]

A format gains what the CPU's kernels for it give over its float32 ones, which differs between instruction sets
(AVX2, AVX-512 VNNI and BF16, AMX), so one machine's speed-up says little about another's. The recipe's stages
are reused when finished (``dsprune run``), and the float32 evaluation, the same stage in both recipes, is taken
from the other format's run when it finished there; ``--collect`` only reads them. Writes
``benchmarks/results/<format>_machine_<cpu>.json`` and re-renders RESULTS.md, where every file is a row.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (REPO, collect_recipe, link_finished_stage, machine_bench, keep_results,  # noqa: E402
                                recipe_command, recipe_parser, rerender, run_recipe_command)

# format -> its recipe; the results file is named <format>_machine_<cpu>.json
RECIPES = {"int8": REPO / "recipes" / "int8-embedder.yaml", "bf16": REPO / "recipes" / "bf16-embedder.yaml"}
SHARED_STAGE = "eval-full"


def out_of(fmt: str) -> Path:
    return REPO / "out" / "recipes" / RECIPES[fmt].stem


def machine_slug(machine: dict) -> str:
    """``amd-epyc-avx2``: the file name part that tells machines apart (CPU model and torch's kernel level)."""
    return re.sub(r"[^a-z0-9]+", "-", f"{machine['cpu']} {machine['cpu_capability']}".lower()).strip("-")


def results_name(fmt: str, machine: dict) -> str:
    return f"{fmt}_machine_{machine_slug(machine)}"


def collect(fmt: str, out: Path, params: dict, command: list[str]) -> dict:
    """The finished recipe run as a results document, with the bench's machine and its pairs' spread."""
    return {"format": fmt, **collect_recipe(RECIPES[fmt], params, out, command, rerun=" ".join(command)),
            **machine_bench(out / "bench")}


def main(argv: list[str] | None = None) -> int:
    from dsprune.recipe import parse_params

    ap = recipe_parser(__doc__, "model, tasks; int8: skip")
    ap.add_argument("--format", choices=sorted(RECIPES), default="int8")
    ap.add_argument("--out", help="the run's folder (default out/recipes/<recipe>)")
    a = ap.parse_args(argv)
    params = parse_params(a.param)
    out = Path(a.out) if a.out else out_of(a.format)
    command = recipe_command(RECIPES[a.format], out, params)
    if not a.collect:
        for other in RECIPES:     # the recipe checks the stage's fingerprint: another model or tasks rerun it
            if other != a.format:
                link_finished_stage(out_of(other) / SHARED_STAGE, out / SHARED_STAGE)
        run_recipe_command(command, out, "")
    doc = collect(a.format, out, params, command)
    keep_results(doc, out, Path(a.results), results_name(a.format, doc["machine"]))
    from benchmarks.grid.render_precision_machines import render_precision_machines
    print("\n".join(render_precision_machines(Path(a.results))))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
