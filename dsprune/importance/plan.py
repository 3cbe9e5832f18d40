"""Ask for a speed, get a plan: drop counts and a slimming ratio that reach a FLOP speed-up at the least
predicted damage, from EffiR importance scores.

Candidates: every (drop ``a`` attention sub-layers, drop ``m`` MLP sub-layers, slim the kept MLPs by ``r``),
the sub-layers taken least important first from each group's drop order (``drop_plan.candidates``, so the
plan is exactly what ``dsprune drop`` would take for those counts), the ``protect`` layers (the first K, or a
list) never dropped, ``r`` on a grid from 0 to ``max_slim`` (or fixed: ``slim``). The FLOP ratio of a candidate (the model as given over the
candidate, per token at ``seq_len``) is counted analytically by ``eval.speed.count_flops``, the function
``dsprune bench`` reports — no model is touched. ``r`` is the fraction of the kept MLP neurons that
``dsprune mask --ratio`` removes; MLP FLOPs only depend on the total width, so where slimming takes the
neurons from does not change the count.

Predicted cost (a heuristic, documented as such): the sum of the 1 − cos scores of what is dropped, plus
``slim_weight · r · Σ(scores of the kept MLPs)`` — slimming every kept MLP by ``r`` counted as a fraction
``r`` of dropping them all. Gates pick the weakest neurons, so this overstates slimming's damage at
``slim_weight = 1``; it makes the planner drop the weakest sub-layers first and slim to cover the rest.
The plan is the cheapest candidate whose FLOP ratio reaches the target; ties go to fewer drops, then to
less slimming.

``order = "last"`` is the baseline the papers compare against instead: the fewest whole blocks taken from the
top of the stack (drop-last-k) that reach the target, the scores ignored, no slimming.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DsPruneError
from ..eval.speed import Shape, count_flops
from ..formats import read_json
from .drop_plan import DropPlan, DropRequest, candidates, plan_one_shot, protect_label, protect_spec, protected

PLAN = "plan.json"
GROUPS = ("attn", "mlp")
ORDERS = ("importance", "last")


@dataclass
class SpeedRequest:
    target: float
    seq_len: int = 256
    protect: int | str | list = 0       # the first K layers, or a list (drop_plan.protect_spec)
    groups: tuple[str, ...] = GROUPS      # sub-layer groups that may be dropped
    max_slim: float = 0.5                 # 0: no slimming
    slim_step: float = 0.05
    slim_weight: float = 1.0
    order: str = "importance"             # last: drop-last-k blocks
    slim: float | None = None             # a fixed slimming ratio (EffiR Table 3's "coarse + slim"): drops cover the rest

    def validate(self) -> None:
        if self.order not in ORDERS:
            raise DsPruneError(f"order must be one of {', '.join(ORDERS)}, not {self.order!r}")
        if not (isinstance(self.target, (int, float)) and math.isfinite(self.target) and self.target > 1):
            raise DsPruneError(f"target_speedup must be a number above 1, not {self.target}")
        if self.seq_len < 1:
            raise DsPruneError(f"seq_len must be at least 1, not {self.seq_len}")
        protect_spec(self.protect)
        bad = sorted(set(self.groups) - set(GROUPS))
        if bad:
            raise DsPruneError(f"drop_groups: unknown group(s) {', '.join(bad)}; choose from attn, mlp")
        if not 0 <= self.max_slim < 1:
            raise DsPruneError(f"max_slim must be in [0, 1), not {self.max_slim}")
        if self.max_slim and self.slim_step <= 0:
            raise DsPruneError(f"slim_step must be positive, not {self.slim_step}")
        if self.slim_weight < 0:
            raise DsPruneError(f"slim_weight must be >= 0, not {self.slim_weight}")
        if self.slim is not None and not (isinstance(self.slim, (int, float)) and 0 <= self.slim < 1):
            raise DsPruneError(f"slim_ratio must be in [0, 1), not {self.slim}")
        if self.slim and self.order == "last":
            raise DsPruneError("slim_ratio: the drop-last-k order does not slim")

    def slim_grid(self) -> list[float]:
        if self.slim is not None:
            return [float(self.slim)]
        steps = int(math.floor(self.max_slim / self.slim_step + 1e-9)) if self.max_slim else 0
        grid = [round(i * self.slim_step, 6) for i in range(steps + 1)]
        return grid + ([self.max_slim] if self.max_slim - grid[-1] > 1e-9 else [])


@dataclass
class Candidate:
    attn: int
    mlp: int
    slim: float
    flop_ratio: float
    cost: float

    def key(self) -> tuple:
        """Cheaper first; ties: fewer drops, less slimming, then the faster."""
        return round(self.cost, 12), self.attn + self.mlp, self.slim, -self.flop_ratio


@dataclass
class SpeedPlan:
    request: SpeedRequest
    chosen: Candidate
    drop: DropPlan
    num_layers: int
    flops: dict                                   # per token: {"before": total, "after": total}
    front: list[Candidate] = field(default_factory=list)   # no candidate is both cheaper and faster
    n_candidates: int = 0

    def to_json(self, **extra) -> dict:
        c = self.chosen
        return {**extra, "num_layers": self.num_layers, "target_speedup": self.request.target,
                "seq_len": self.request.seq_len, "protect": self.request.protect,
                "attn": self.drop.attn, "mlp": self.drop.mlp,
                "drop_attn": c.attn, "drop_mlp": c.mlp, "slim_ratio": c.slim, "flop_ratio": c.flop_ratio,
                "predicted_cost": c.cost, "flops_per_token": self.flops, "steps": self.drop.steps,
                "policy": {k: v for k, v in dataclasses.asdict(self.request).items()
                           if k in ("order", "groups", "max_slim", "slim_step", "slim_weight", "slim")},
                "n_candidates": self.n_candidates, "candidates": [dataclasses.asdict(x) for x in self.front]}


def plan_speedup(scores: dict[str, dict[int, float]], shape: Shape, req: SpeedRequest) -> SpeedPlan:
    """The cheapest (drops, slimming) whose FLOP ratio over ``shape`` reaches ``req.target`` (module doc)."""
    req.validate()
    n = len(shape.widths)
    protected(req.protect, n)
    missing = [g for g in GROUPS if g not in scores]
    if missing:
        raise DsPruneError(f"scores have no {'/'.join(missing)} group: run `dsprune score` again")
    gone_attn = set(shape.drop_attn)
    gone_mlp = {i for i, w in enumerate(shape.widths) if w is None}
    order = {g: candidates(scores[g], gone, req.protect) if g in req.groups else []
             for g, gone in (("attn", gone_attn), ("mlp", gone_mlp))}
    mlp_scores = {i: s for i, s in scores["mlp"].items() if i not in gone_mlp}
    before = count_flops(shape, req.seq_len)["total"]
    if req.order == "last":
        return _plan_last(scores, shape, req, before, gone_attn, gone_mlp)
    grid = req.slim_grid()
    found = []
    for a in range(len(order["attn"]) + 1):
        attn = order["attn"][:a]
        drop_attn = tuple(sorted(gone_attn | set(attn)))
        for m in range(len(order["mlp"]) + 1):
            mlp = set(order["mlp"][:m])
            dropped = sum(scores["attn"][i] for i in attn) + sum(mlp_scores[i] for i in mlp)
            kept = sum(s for i, s in mlp_scores.items() if i not in mlp)
            if not any(w is not None and i not in mlp for i, w in enumerate(shape.widths)):
                continue   # a model without an MLP left is no encoder worth keeping (check_keeps)
            for r in grid:
                widths = tuple(None if w is None or i in mlp else w * (1 - r) for i, w in enumerate(shape.widths))
                after = count_flops(dataclasses.replace(shape, drop_attn=drop_attn, widths=widths),
                                    req.seq_len)["total"]
                found.append(Candidate(a, m, r, before / after, dropped + req.slim_weight * r * kept))
    reach = [c for c in found if c.flop_ratio >= req.target * (1 - 1e-9)]
    if not reach:
        best = max(found, key=lambda c: c.flop_ratio)
        kept = f" with {protect_label(req.protect)} protected" if protected(req.protect) else ""
        raise DsPruneError(f"target speed-up {req.target}x is out of reach{kept}: the best is "
                           f"{best.flop_ratio:.3f}x (drop {best.attn} attention, {best.mlp} MLP, slim "
                           f"{best.slim}; groups {', '.join(req.groups) or 'none'}, max_slim {req.max_slim})")
    chosen = min(reach, key=Candidate.key)
    drop = DropPlan()
    if chosen.attn or chosen.mlp:
        drop = plan_one_shot(scores, n, DropRequest(mlp=chosen.mlp, attn=chosen.attn, protect=req.protect),
                             gone_attn, gone_mlp)
    after = before / chosen.flop_ratio
    return SpeedPlan(req, chosen, drop, n, {"before": before, "after": after}, pareto(found), len(found))


def _plan_last(scores, shape: Shape, req: SpeedRequest, before: float, gone_attn: set[int],
               gone_mlp: set[int]) -> SpeedPlan:
    """The fewest top blocks whose removal reaches the target (at least one layer is always kept)."""
    n = len(shape.widths)
    guarded = protected(req.protect, n)
    found = []
    for k in range(1, n):   # at least one layer is kept
        top = set(range(n - k, n))
        if top & guarded:
            break
        widths = tuple(None if i in top else w for i, w in enumerate(shape.widths))
        after = count_flops(dataclasses.replace(shape, drop_attn=tuple(sorted(gone_attn | top)), widths=widths),
                            req.seq_len)["total"]
        cost = sum(scores["attn"].get(i, 0.0) for i in top - gone_attn) + \
            sum(scores["mlp"].get(i, 0.0) for i in top - gone_mlp)
        found.append(Candidate(len(top - gone_attn), len(top - gone_mlp), 0.0, before / after, cost))
        if found[-1].flop_ratio >= req.target * (1 - 1e-9):
            drop = plan_one_shot(scores, n, DropRequest(last=k, protect=req.protect), gone_attn, gone_mlp)
            return SpeedPlan(req, found[-1], drop, n, {"before": before, "after": after}, found, len(found))
    raise DsPruneError(f"target speed-up {req.target}x is out of reach by dropping the last blocks: the best, "
                       f"keeping {n - len(found)} layer(s), is {found[-1].flop_ratio:.3f}x" if found else
                       f"target speed-up {req.target}x: no top block may be dropped (protecting "
                       f"{protect_label(req.protect)} of {n})")


def pareto(found: list[Candidate]) -> list[Candidate]:
    """The candidates no other beats on both cost and FLOP ratio, cheapest first."""
    front, best = [], 0.0
    for c in sorted(found, key=Candidate.key):
        if c.flop_ratio > best + 1e-12:
            front.append(c)
            best = c.flop_ratio
    return front


def check_keeps(num_layers: int, attn, mlp, where: str) -> None:
    """Refuse a drop that leaves no MLP, or no layer at all. Such a model still loads and encodes, so nothing
    downstream would stop it: its embeddings are the input embeddings mixed by attention alone, or not at all."""
    layers = set(range(num_layers))
    if layers <= set(mlp):
        what = "every layer" if layers <= set(attn) else "every MLP"
        raise DsPruneError(f"{where} removes {what} of the {num_layers}-layer model; drop fewer")


def read_plan(path) -> dict:
    """A ``plan.json`` (or the folder holding it), checked for what ``dsprune drop`` reads."""
    path = Path(path)
    path = path / PLAN if path.is_dir() else path
    doc = read_json(path, "plan file")
    for key in ("attn", "mlp", "num_layers", "slim_ratio"):
        if key not in doc:
            raise DsPruneError(f"{path}: missing field '{key}'")
    check_keeps(doc["num_layers"], doc["attn"], doc["mlp"], f"{path}: the plan")
    return doc


def table(plan: SpeedPlan, rows: int = 12) -> str:
    """The cost/speed front around the chosen plan, one line each (the chosen one marked)."""
    front = plan.front
    at = next((i for i, c in enumerate(front) if c is plan.chosen), 0)
    lo = max(0, min(at - rows // 2, len(front) - rows))
    lines = [f"  {'attn':>4} {'mlp':>4} {'slim':>5} {'FLOPs x':>8} {'cost':>8}"]
    for c in front[lo:lo + rows]:
        mark = "<- plan" if c is plan.chosen else ""
        lines.append(f"  {c.attn:>4} {c.mlp:>4} {c.slim:>5.2f} {c.flop_ratio:>8.3f} {c.cost:>8.4f} {mark}")
    return "\n".join(lines)
