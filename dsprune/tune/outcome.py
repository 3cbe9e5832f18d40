"""What a trial is worth: its eval score and its cost, read from the stages it ran; constraints on them;
the Pareto front over several objectives.

The numbers come from the files the pipeline's own commands wrote (``results.json`` of ``dsprune eval``,
``bench.json`` of ``dsprune bench``), never from anything the sweep computes itself, so a trial's row
is the same number a user gets by running that pipeline by hand.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .. import formats
from ..errors import DsPruneError

# metric -> (what it is, lowest possible, highest possible); None = unbounded
METRICS = {
    "ndcg_at_10": ("mean nDCG@10 over the last eval stage's tasks", 0.0, 1.0),
    "recall_at_100": ("mean recall@100 over the last eval stage's tasks", 0.0, 1.0),
    "main_score": ("mean of each task's own main score (nDCG@10, accuracy, Spearman) over the last eval "
                   "stage's tasks, so classification and STS tasks count too", -1.0, 1.0),
    "speedup": ("document encoding speed-up over the bench baseline (measured)", 0.0, None),
    "query_speedup": ("query encoding speed-up over the bench baseline (measured)", 0.0, None),
    "flop_ratio": ("baseline / model FLOPs per document token", 0.0, None),
    "param_ratio": ("baseline / model parameters", 0.0, None),
    "params": ("model parameters", 0.0, None),
}
# which stage command produces a metric
SOURCE = {"ndcg_at_10": "eval", "recall_at_100": "eval", "main_score": "eval", "speedup": "bench",
          "query_speedup": "bench", "flop_ratio": "bench", "param_ratio": "bench", "params": "bench"}


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def eval_metrics(folder: str | Path) -> dict:
    """Mean and per-task scores of one ``dsprune eval`` output."""
    doc = formats.read_json(Path(folder) / formats.RESULTS, "eval results")
    tasks = doc["tasks"]
    out = {"ndcg_at_10": _mean([t.get("ndcg_at_10") for t in tasks.values()]),
           "recall_at_100": _mean([t.get("recall_at_100") for t in tasks.values()]),
           "main_score": _mean([t.get("main_score") for t in tasks.values()])}
    out.update({f"ndcg_at_10/{name}": t.get("ndcg_at_10") for name, t in tasks.items() if "ndcg_at_10" in t})
    out.update({f"main_score/{name}": t.get("main_score") for name, t in tasks.items()})
    return out


def bench_metrics(folder: str | Path) -> dict:
    doc = formats.read_json(Path(folder) / formats.BENCH, "bench results")
    return {"speedup": doc["document"]["speedup"], "query_speedup": doc["query"]["speedup"],
            "flop_ratio": doc["document"]["flop_ratio"], "param_ratio": doc["params"]["ratio"],
            "params": doc["params"]["model"]}


def pipeline_metrics(report: dict[str, dict]) -> dict:
    """Metrics of a finished ``run_recipe`` report: the last eval and the last bench stage count."""
    out: dict = {}
    for info in report.values():
        if info.get("command") == "eval":
            out.update(eval_metrics(info["folder"]))
        elif info.get("command") == "bench":
            out.update(bench_metrics(info["folder"]))
    return out


@dataclass(frozen=True)
class Constraint:
    metric: str
    min: float | None = None
    max: float | None = None

    def violation(self, metrics: dict) -> float:
        """0 when met; else how far off, relative to the bound (missing metric counts as fully off)."""
        v = metrics.get(self.metric)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return 1.0
        off = 0.0
        if self.min is not None and v < self.min:
            off = max(off, (self.min - v) / max(abs(self.min), 1e-12))
        if self.max is not None and v > self.max:
            off = max(off, (v - self.max) / max(abs(self.max), 1e-12))
        return off

    def __str__(self) -> str:
        parts = ([f"{self.metric} >= {self.min:g}"] if self.min is not None else []) + \
                ([f"{self.metric} <= {self.max:g}"] if self.max is not None else [])
        return " and ".join(parts)


def parse_constraints(spec: dict | None, stage_commands: list[str]) -> list[Constraint]:
    """``{metric: {min: x, max: y}}`` -> constraints; fails on unknown metrics, metrics no stage of the
    pipeline measures, and bounds no model can meet (outside the metric's range, or min above max)."""
    out = []
    for metric, bounds in (spec or {}).items():
        where = f"constraints.{metric}"
        if metric not in METRICS:
            raise DsPruneError(f"{where}: unknown metric (known: {', '.join(METRICS)})")
        if SOURCE[metric] not in stage_commands:
            raise DsPruneError(f"{where}: no `{SOURCE[metric]}` stage in the pipeline measures it")
        if not isinstance(bounds, dict) or not bounds or set(bounds) - {"min", "max"}:
            raise DsPruneError(f"{where}: expected {{min: X}} and/or {{max: Y}}, got {bounds!r}")
        lo, hi = bounds.get("min"), bounds.get("max")
        for k, v in (("min", lo), ("max", hi)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise DsPruneError(f"{where}.{k}: expected a finite number, got {v!r}")
        _, floor, ceil = METRICS[metric]
        if lo is not None and hi is not None and lo > hi:
            raise DsPruneError(f"{where}: infeasible, min {lo} is above max {hi}")
        if lo is not None and ceil is not None and lo > ceil:
            raise DsPruneError(f"{where}: infeasible, {metric} is at most {ceil} (min {lo})")
        if hi is not None and floor is not None and hi <= floor:
            raise DsPruneError(f"{where}: infeasible, {metric} is always above {floor} (max {hi})")
        out.append(Constraint(metric, lo, hi))
    return out


def feasible(metrics: dict, constraints: list[Constraint]) -> bool:
    return all(c.violation(metrics) == 0 for c in constraints)


def pareto_front(rows: list[dict], objectives: dict[str, str]) -> list[int]:
    """Indices of the rows no other row dominates (at least as good in every objective, better in one).

    ``objectives`` maps a metric to ``max`` or ``min``; rows missing an objective are never on the front.
    """
    sign = {m: (1.0 if mode == "max" else -1.0) for m, mode in objectives.items()}
    pts = []
    for i, r in enumerate(rows):
        if all(isinstance(r.get(m), (int, float)) and math.isfinite(r[m]) for m in sign):
            pts.append((i, [sign[m] * r[m] for m in sign]))
    front = []
    for i, a in pts:
        dominated = any(all(x >= y for x, y in zip(b, a)) and any(x > y for x, y in zip(b, a))
                        for j, b in pts if j != i)
        if not dominated:
            front.append(i)
    return front
