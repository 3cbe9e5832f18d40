"""int8 inference, one results file per machine: ``recipes/int8-embedder.yaml``'s scores and measured speed-up,
kept with the CPU the bench ran on.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/int8_machine.py [--param model=... 'skip=[]']

Dynamic int8 gains what the CPU's int8 kernels give over its float ones, which differs between instruction sets
(AVX2, AVX-512 VNNI, AMX), so one machine's speed-up says little about another's. The recipe's stages are
reused when finished (``dsprune run``); ``--collect`` only reads them. Writes
``benchmarks/results/int8_machine_<cpu>.json`` and re-renders RESULTS.md, where every machine's file is a row.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (REPO, collect_recipe, int8_bench, keep_results, recipe_command,  # noqa: E402
                                recipe_parser, rerender, run_recipe_command)

RECIPE = REPO / "recipes" / "int8-embedder.yaml"
OUT = REPO / "out" / "recipes" / "int8-embedder"
PREFIX = "int8_machine_"


def machine_slug(machine: dict) -> str:
    """``amd-epyc-avx2``: the file name part that tells machines apart (CPU model and torch's kernel level)."""
    return re.sub(r"[^a-z0-9]+", "-", f"{machine['cpu']} {machine['cpu_capability']}".lower()).strip("-")


def collect(out: Path, params: dict, command: list[str]) -> dict:
    """The finished recipe run as a results document, with the bench's machine and its pairs' spread."""
    return {**collect_recipe(RECIPE, params, out, command, rerun=" ".join(command)), **int8_bench(out / "bench")}


def main(argv: list[str] | None = None) -> int:
    from dsprune.recipe import parse_params

    ap = recipe_parser(__doc__, "model, skip, tasks")
    ap.add_argument("--out", default=str(OUT))
    a = ap.parse_args(argv)
    params, out = parse_params(a.param), Path(a.out)
    command = recipe_command(RECIPE, out, params)
    if not a.collect:
        run_recipe_command(command, out, "")
    doc = collect(out, params, command)
    keep_results(doc, out, Path(a.results), PREFIX + machine_slug(doc["machine"]))
    from benchmarks.grid.render_int8_machines import render_int8_machines
    print("\n".join(render_int8_machines(Path(a.results))))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
