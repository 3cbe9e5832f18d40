"""`dsprune tune --config tuning/SWEEP.yaml`: a Ray Tune sweep over a pipeline (see ``dsprune.tune.sweep``)."""
from __future__ import annotations

from pathlib import Path

from ..log import logger
from ..tune.sweep import TABLE, Args, run as run_sweep

__all__ = ["Args", "run"]


def run(args: Args) -> int:
    summary = run_sweep(args)
    print(Path(args.out, TABLE).read_text())
    c = summary["counts"]
    print(f"{summary['num_trials']} trials: " + ", ".join(f"{n} {s}" for s, n in c.items()))
    if summary["interrupted"]:
        print(f"interrupted: continue with `dsprune tune --config ... --out {args.out} --resume`")
    if summary.get("plot"):
        print(f"front: {summary['plot']}")
    print(f"best model: {summary['best_model']}")
    logger.info(f"wrote {Path(args.out) / TABLE}")
    return 0
