"""Which sub-layers to drop, from EffiR importance scores: one-shot, or re-scored after every drop.

Counts are checked against what the model still has before anything is dropped, so an impossible request
(``--drop-mlp 40`` on 30 layers) fails with the option named. ``protect`` keeps layers out of every choice:
the first K (the early layers build the token representations everything after them reads), or any list,
so that which layers a drop may take can itself be tested.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from ..errors import DsPruneError
from ..formats import drop_order


@dataclass
class DropRequest:
    mlp: int = 0
    attn: int = 0
    blocks: int = 0
    last: int = 0
    protect: int | str | list = 0   # never dropped: the first K layers, or these layers (``protect_spec``)

    def validate(self, n_layers: int, gone_attn: set[int], gone_mlp: set[int]) -> None:
        for name, k in (("drop_mlp", self.mlp), ("drop_attn", self.attn), ("drop_blocks", self.blocks),
                        ("drop_last", self.last)):
            if k < 0:
                raise DsPruneError(f"{name} must be >= 0, not {k}")
        guarded = protected(self.protect, n_layers)
        if self.blocks and self.last:
            raise DsPruneError("choose drop_blocks (by importance) or drop_last, not both")
        free = [i for i in range(n_layers) if i not in guarded]
        kept = f" after protecting {protect_label(self.protect)}" if guarded else ""
        blocks_left = sum(1 for i in free if not (i in gone_attn and i in gone_mlp))
        if self.blocks + self.last > blocks_left:
            raise DsPruneError(f"drop_blocks/drop_last {self.blocks + self.last} is larger than the "
                               f"{blocks_left} blocks the model has{kept}")
        if self.last:
            tail = set(range(n_layers - self.last, n_layers))
            if tail & (gone_attn & gone_mlp):
                raise DsPruneError(f"drop_last {self.last} reaches blocks already dropped")
            if tail & guarded:
                raise DsPruneError(f"drop_last {self.last} reaches protected layer(s) {sorted(tail & guarded)}")
        whole = self.blocks + self.last
        attn_left = sum(1 for i in free if i not in gone_attn) - whole
        mlp_left = sum(1 for i in free if i not in gone_mlp) - whole
        if self.attn > attn_left:
            raise DsPruneError(f"drop_attn {self.attn} is larger than the {max(attn_left, 0)} attention "
                               f"sub-layers left{kept} (model: {n_layers} layers)")
        if self.mlp > mlp_left:
            raise DsPruneError(f"drop_mlp {self.mlp} is larger than the {max(mlp_left, 0)} MLP sub-layers "
                               f"left{kept} (model: {n_layers} layers)")
        if not any((self.mlp, self.attn, self.blocks, self.last)):
            raise DsPruneError("nothing to drop: give drop_mlp, drop_attn, drop_blocks or drop_last")

    def label(self) -> str:
        parts = [f"{self.mlp}M" if self.mlp else "", f"{self.attn}A" if self.attn else "",
                 f"{self.blocks}B" if self.blocks else "", f"last{self.last}B" if self.last else ""]
        return "".join(p for p in parts if p) or "none"


PROTECT_HELP = ("never drop these layers: K = the first K; or a list such as 2,3 or 0-3,12 (one layer alone: "
                "5,)")


def protect_spec(value) -> int | tuple[int, ...]:
    """``--protect`` as given: a number K (the first K layers), or explicit layers — a list, or text such as
    ``2,3`` or ``0-3,12`` (one layer alone: ``5,``). A bare number means "the first K" because that is what
    keeping the early layers needs; a comma always means layers."""
    if isinstance(value, bool):
        value = str(value)
    if isinstance(value, int):
        if value < 0:
            raise DsPruneError(f"protect must be >= 0, not {value}")
        return value
    if isinstance(value, (list, tuple)):
        items = [str(v) for v in value]
    else:
        text = str(value).strip()
        if "," not in text:
            try:
                return protect_spec(int(text))
            except ValueError:
                pass
        items = [t.strip() for t in text.split(",") if t.strip()]
    layers: set[int] = set()
    try:
        for item in items:
            lo, _, hi = item.partition("-") if not item.startswith("-") else (item, "", "")
            lo, hi = int(lo), int(hi or lo)
            if lo < 0 or hi < lo:
                raise ValueError
            layers.update(range(lo, hi + 1))
    except ValueError:
        raise DsPruneError(f"protect must be K (the first K layers) or layers such as 2,3 or 0-3,12, "
                           f"not {value!r}") from None
    return tuple(sorted(layers))


def protected(spec, n_layers: int | None = None) -> frozenset[int]:
    """The layers ``spec`` (``protect_spec``) keeps; with ``n_layers``, refused where it names a layer the
    model does not have."""
    spec = protect_spec(spec)
    layers = frozenset(range(spec) if isinstance(spec, int) else spec)
    if n_layers is None:
        return layers
    if isinstance(spec, int) and spec > n_layers:
        raise DsPruneError(f"protect {spec} is larger than the {n_layers} layers the model has")
    outside = sorted(i for i in layers if i >= n_layers)
    if outside:
        raise DsPruneError(f"protect: layer {outside[0]} is out of range for the {n_layers}-layer model "
                           f"(layers 0-{n_layers - 1})")
    return layers


def protect_label(spec) -> str:
    spec = protect_spec(spec)
    return f"the first {spec} layers" if isinstance(spec, int) else f"layer(s) {', '.join(map(str, spec))}"


@dataclass
class DropPlan:
    attn: list[int] = field(default_factory=list)
    mlp: list[int] = field(default_factory=list)
    steps: list[dict] = field(default_factory=list)  # in drop order: {"group", "layer", "score"}


def layer_scores(doc: dict, where: str, model: str, n_layers: int,
                 weights: str | None = None) -> dict[str, dict[int, float]]:
    """The scores of a ``scores.json`` document by integer layer, refused if they are another model's: another
    layer count, or other ``weights`` (the model's content id) where the scores name theirs (older files do not)."""
    if doc.get("num_layers") not in (None, n_layers):
        raise DsPruneError(f"{where}: scores are for a {doc['num_layers']}-layer model, {model} has "
                           f"{n_layers} layers")
    if doc.get("weights") and weights and weights != doc["weights"]:
        raise DsPruneError(f"{where}: scores were computed on weights {doc['weights'][:12]}, but {model} holds "
                           f"weights {weights[:12]}; score this model (`dsprune score --model {model}`)")
    return {g: {int(k): v for k, v in s.items()} for g, s in doc["scores"].items()}


def candidates(scores: dict[int, float], exclude: set[int], protect=0) -> list[int]:
    """The layers of one group that may go, least important first (the order one-shot drops and the
    speed-up planner share)."""
    order = drop_order({str(i): v for i, v in scores.items()})
    guarded = protected(protect)   # against the model's size: DropRequest.validate
    return [i for i in order if i not in exclude and i not in guarded]


def plan_one_shot(scores: dict[str, dict[int, float]], n_layers: int, req: DropRequest,
                  gone_attn: set[int] = frozenset(), gone_mlp: set[int] = frozenset()) -> DropPlan:
    """Whole blocks first (by block score, or the last k), then attention, then MLPs by their own scores."""
    req.validate(n_layers, set(gone_attn), set(gone_mlp))
    plan = DropPlan()

    def take(group: str, k: int, exclude: set[int]) -> list[int]:
        chosen = candidates(scores[group], exclude, req.protect)[:k]
        plan.steps += [{"group": group, "layer": i, "score": scores[group][i]} for i in chosen]
        return chosen

    if req.last:
        blocks = [i for i in range(n_layers - req.last, n_layers)]
        plan.steps += [{"group": "block", "layer": i, "score": scores["block"].get(i)} for i in blocks]
    else:
        blocks = take("block", req.blocks, set(gone_attn) & set(gone_mlp))
    attn = take("attn", req.attn, set(gone_attn) | set(blocks))
    mlp = take("mlp", req.mlp, set(gone_mlp) | set(blocks))
    plan.attn = sorted(set(attn) | {b for b in blocks if b not in gone_attn})
    plan.mlp = sorted(set(mlp) | {b for b in blocks if b not in gone_mlp})
    return plan


def plan_iterative(rescore: Callable[[], dict[str, dict[int, float]]], drop: Callable[[list, list], None],
                   n_layers: int, req: DropRequest, gone_attn: set[int] = frozenset(),
                   gone_mlp: set[int] = frozenset()) -> tuple[DropPlan, list[dict]]:
    """Drop one sub-layer at a time, re-scoring the pruned model before each choice.

    Order: whole blocks, then MLPs, then attention (``drop_last`` needs no scores and goes first).
    Returns the plan and the score history (the scores seen before each drop).
    """
    req.validate(n_layers, set(gone_attn), set(gone_mlp))
    plan, history = DropPlan(), []
    gone_attn, gone_mlp = set(gone_attn), set(gone_mlp)

    def drop_new(attn: list[int], mlp: list[int]) -> tuple[list[int], list[int]]:
        attn = [i for i in attn if i not in gone_attn]
        mlp = [i for i in mlp if i not in gone_mlp]
        drop(attn, mlp)
        gone_attn.update(attn)
        gone_mlp.update(mlp)
        return attn, mlp

    if req.last:
        tail = list(range(n_layers - req.last, n_layers))
        attn, mlp = drop_new(tail, tail)
        plan.attn += attn
        plan.mlp += mlp
        plan.steps += [{"group": "block", "layer": i, "score": None} for i in tail]
    for group, k in (("block", req.blocks), ("mlp", req.mlp), ("attn", req.attn)):
        for _ in range(k):
            scores = rescore()
            history.append(scores)
            layer = candidates(scores[group], set(), req.protect)[0]
            attn, mlp = drop_new([layer] if group in ("block", "attn") else [],
                                 [layer] if group in ("block", "mlp") else [])
            plan.attn += attn
            plan.mlp += mlp
            plan.steps.append({"group": group, "layer": layer, "score": scores[group][layer]})
    plan.attn, plan.mlp = sorted(plan.attn), sorted(plan.mlp)
    return plan, history
