"""Ray Tune sweeps over dsprune pipelines: ``python tuning/sweep.py --config tuning/SWEEP.yaml [--opt v]``.

The same as ``dsprune tune``; the sweep files in this folder are the shipped search spaces.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when not pip-installed
    from dsprune.cli import entry

    entry(["tune", *sys.argv[1:]])
