"""Paired bootstrap confidence intervals for a difference in mean per-query score.

Two retrievers scored on the same queries differ by far less than their scores vary across queries, so
the interval is taken on per-query differences (resampling queries), not on two independent means.
"""
from __future__ import annotations

import numpy as np

from ..errors import DsPruneError


def paired_bootstrap(a: dict[str, float], b: dict[str, float], samples: int = 2000, seed: int = 0,
                     level: float = 0.95) -> dict:
    """CI for mean(a - b) over the queries both score; ``p`` is the two-sided bootstrap p-value."""
    common = sorted(set(a) & set(b))
    if not common:
        raise DsPruneError("paired bootstrap: the two systems share no query ids")
    d = np.array([a[q] - b[q] for q in common], dtype=np.float64)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(d), size=(samples, len(d)))
    means = d[idx].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    # Two-sided: how often the resampled difference lands on the other side of 0 (shifted to the null).
    p = float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean()))) if d.any() else 1.0
    return {"diff": float(d.mean()), "low": float(lo), "high": float(hi), "p": p, "n": len(common),
            "only_a": len(set(a) - set(b)), "only_b": len(set(b) - set(a)), "level": level}


def paired_bootstrap_tasks(pairs: list[tuple[dict[str, float], dict[str, float]]], samples: int = 2000,
                           seed: int = 0, level: float = 0.95) -> dict:
    """CI for the difference in the mean over tasks of mean per-query score (queries resampled per task)."""
    if not pairs:
        raise DsPruneError("paired bootstrap: no tasks to compare")
    rng = np.random.default_rng(seed)
    total = np.zeros(samples)
    point = 0.0
    for a, b in pairs:
        common = sorted(set(a) & set(b))
        if not common:
            raise DsPruneError("paired bootstrap: a task where the two systems share no query ids")
        d = np.array([a[q] - b[q] for q in common], dtype=np.float64)
        total += d[rng.integers(0, len(d), size=(samples, len(d)))].mean(axis=1)
        point += d.mean()
    means, point = total / len(pairs), point / len(pairs)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    p = float(min(1.0, 2 * min((means <= 0).mean(), (means >= 0).mean()))) if np.any(means != 0) else 1.0
    return {"diff": float(point), "low": float(lo), "high": float(hi), "p": p, "tasks": len(pairs),
            "level": level}
