"""Reproduce EffiR's and GAPrune's findings at small scale: the grid of
``benchmarks/grid``, row by row, on 2 CPU cores.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/reproduce.py > out/reproduce.log 2>&1 &
    .venv/bin/python benchmarks/reproduce.py --list                  # rows, their stages, estimated time
    .venv/bin/python benchmarks/reproduce.py --rows t1-15m effir     # some rows, or whole tables: --rows effir-t2
    .venv/bin/python benchmarks/reproduce.py --render                # only re-render benchmarks/RESULTS.md

Each row is a recipe (``dsprune.recipe.run_recipe``) written to ``OUT/rows/ROW.yaml``: every stage a real
``dsprune`` command or DeepSpeed launcher, its folder ``OUT/STAGE`` reused while its inputs are unchanged, so an
interrupted row resumes stage by stage. Rows share stages by name (one ``dense-score`` for all of Table 1, one
``base-drop15m`` for Table 2's 15M row and EffiR). Inputs the grid does not make itself (the dense retriever,
its training groups) enter through content-addressed links ``OUT/inputs/NAME-<hash>``, so a retrained dense
model never reuses stale stages.

When a row finishes, ``benchmarks/results/ROW.json`` holds its scores (per task nDCG@10, recall@100 and the
per-query nDCG@10 that paired bootstrap intervals need), parameters, speed-ups, the commands run, wall time,
code version and scaled settings. A row whose JSON carries the same config fingerprint is skipped, so the
grid resumes across sessions even without ``OUT``. Every invocation ends by rendering ``benchmarks/RESULTS.md``
(one table per paper table, CIs against the table's reference row, pending rows marked) and, when speed-ups
exist, ``benchmarks/results/quality_vs_speed.png``.

The dense retriever (``--dense``, default out/train_dense/run/model) is made by ``benchmarks/train_dense.py``
when missing; Table 2 and EffiR rows train with exactly its options (``train.yaml`` beside it): same data,
same steps. SmolLM2 has 30 blocks: the papers' counts for Mistral-7B's 32 are scaled by 30/32 (16 -> 15,
20 -> 19). SmolLM2 here is the Instruct model, Q4_1 GGUF dequantised to fp32, standing in for a base model.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO  # noqa: E402
from benchmarks.grid.inputs import DEFAULT_DENSE  # noqa: E402
from benchmarks.grid.render import RESULTS, RESULTS_MD, render  # noqa: E402
from benchmarks.grid.rows import DEFAULT_TASKS, select  # noqa: E402
from benchmarks.grid.run import list_rows, run_rows  # noqa: E402
from dsprune.errors import DsPruneError  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", metavar="NAME", help="rows or table ids to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the rows and their stages, run nothing")
    ap.add_argument("--render", action="store_true", help="only render RESULTS.md from the results JSON files")
    ap.add_argument("--out", default=str(REPO / "out" / "reproduce"), help="stage folders, row recipes and input links")
    ap.add_argument("--results", default=str(RESULTS), help="one JSON per finished row")
    ap.add_argument("--results-md", default=str(RESULTS_MD))
    ap.add_argument("--model", default="smollm2", help="the base LM (packaged name, folder or .gguf)")
    ap.add_argument("--dense", default=DEFAULT_DENSE, help="the trained dense retriever (made by "
                    "benchmarks/train_dense.py when this default is missing)")
    ap.add_argument("--train-config", default=None, help="launcher options of the dense run, reused by every "
                    "trained row (default: train.yaml two folders above --dense)")
    ap.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="eval tasks: NAME or NAME=BEIR_FOLDER")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--headline-scifact", action="store_true", help="also score the headline rows (dense, "
                    "t2-15m, effir) on full SciFact (~25 min each)")
    ap.add_argument("--seed", type=int, default=None, help="run the rows' training at this seed instead of their "
                    "own (42): trained stages and what reads them get NAME-seedN folders, results ROW-seedN.json; "
                    "rows without training are skipped")
    ap.add_argument("--force", action="store_true", help="rerun rows whose results are current (their stages are "
                    "still reused when unchanged)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    results, md = Path(a.results), Path(a.results_md)
    failed = []
    try:
        rows = select(a.rows)
        if a.list:
            list_rows(rows, a, results)
            return 0
        if not a.render:
            failed = run_rows(rows, a, results)
        render(results, md)
        print(f"rendered {md}")
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if failed:
        print(f"failed rows: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
