"""Sweep parameters: a name per pipeline option (``slim.ratio``, ``dai.alpha``, …), a domain, and the stage
argument it sets.

Users think in the papers' knobs, not in which stage reads which flag: ``slim.ratio`` is the mask stage's
``ratio``, ``slim.lambda`` the slimming launcher's ``slim_lambda``. ``ALIASES`` maps those names onto the
stage names the shipped pipelines use; any other ``STAGE.OPTION`` names a stage of the pipeline and one of
its options literally. Everything is checked against the pipeline before Ray starts, so a typo or an
empty range fails in a second with the parameter named.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import DsPruneError

# paper knob -> (stage name in the pipeline, option of that stage)
ALIASES = {
    "drop.mlp": ("drop", "drop_mlp"),
    "drop.attn": ("drop", "drop_attn"),
    "drop.blocks": ("drop", "drop_blocks"),
    "drop.last": ("drop", "drop_last"),
    "slim.ratio": ("mask", "ratio"),
    "slim.lambda": ("slim", "slim_lambda"),
    "slim.beta": ("slim", "slim_beta"),
    "slim.lr": ("slim", "slim_lr"),
    "slim.steps": ("slim", "max_steps"),
    "dai.alpha": ("prune", "dai_alpha"),
    "dai.beta": ("prune", "dai_beta"),
    "dai.gamma": ("prune", "dai_gamma"),
    "dai.sparsity": ("prune", "sparsity"),
    "train.lr": ("train", "learning_rate"),
    "train.steps": ("train", "max_steps"),
    "train.lora_r": ("train", "lora_r"),
    "train.temperature": ("train", "temperature"),
}

# domain kind -> number of values it takes ([low, high] pairs, or a non-empty list)
KINDS = ("uniform", "loguniform", "randint", "choice", "grid")


@dataclass(frozen=True)
class Param:
    name: str
    kind: str
    values: tuple
    stage: str
    option: str

    def domain(self):
        """The Ray Tune domain (``randint`` includes its upper end)."""
        from ray import tune

        if self.kind == "uniform":
            return tune.uniform(*self.values)
        if self.kind == "loguniform":
            return tune.loguniform(*self.values)
        if self.kind == "randint":
            return tune.randint(self.values[0], self.values[1] + 1)
        if self.kind == "choice":
            return tune.choice(list(self.values))
        return tune.grid_search(list(self.values))

    def size(self) -> int | None:
        """How many points a grid takes (``None`` for sampled domains)."""
        return len(self.values) if self.kind == "grid" else None


def parse_space(space: dict, stage_options: dict[str, set[str]]) -> list[Param]:
    """``{name: {kind: values, stage?: NAME}}`` -> checked ``Param`` list.

    ``stage_options`` maps each pipeline stage to the options it accepts.
    """
    if not isinstance(space, dict) or not space:
        raise DsPruneError("space: give at least one parameter, e.g. `slim.ratio: {grid: [0.2, 0.3]}`")
    params = []
    for name, spec in space.items():
        where = f"space.{name}"
        if not isinstance(spec, dict):
            raise DsPruneError(f"{where}: expected a mapping like {{uniform: [0.1, 0.5]}}, got {spec!r}")
        spec = dict(spec)
        stage_override = spec.pop("stage", None)
        kinds = [k for k in spec if k in KINDS]
        extra = sorted(set(spec) - set(KINDS))
        if extra or len(kinds) != 1:
            raise DsPruneError(f"{where}: give exactly one of {', '.join(KINDS)} (and optionally `stage`); "
                               f"got {', '.join(map(str, spec)) or 'nothing'}")
        kind = kinds[0]
        values = _check_values(where, kind, spec[kind])
        stage, option = _target(name, stage_override, stage_options)
        params.append(Param(name, kind, values, stage, option))
    return params


def _check_values(where: str, kind: str, values) -> tuple:
    if not isinstance(values, (list, tuple)) or not values:
        raise DsPruneError(f"{where}.{kind}: empty range (give a non-empty list)")
    if kind in ("choice", "grid"):
        if len(set(map(repr, values))) != len(values):
            raise DsPruneError(f"{where}.{kind}: values repeat: {list(values)}")
        return tuple(values)
    if len(values) != 2 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        raise DsPruneError(f"{where}.{kind}: expected [low, high] numbers, got {values!r}")
    low, high = values
    if not (math.isfinite(low) and math.isfinite(high)):
        raise DsPruneError(f"{where}.{kind}: bounds must be finite, got {values!r}")
    if kind == "randint":
        if int(low) != low or int(high) != high:
            raise DsPruneError(f"{where}.randint: bounds must be integers, got {values!r}")
        if high < low:
            raise DsPruneError(f"{where}.randint: empty range [{low}, {high}]")
        return int(low), int(high)
    if not high > low:
        raise DsPruneError(f"{where}.{kind}: empty range [{low}, {high}] (low must be below high)")
    if kind == "loguniform" and low <= 0:
        raise DsPruneError(f"{where}.loguniform: the lower bound must be positive, got {low}")
    return float(low), float(high)


def _target(name: str, stage_override: str | None, stage_options: dict[str, set[str]]) -> tuple[str, str]:
    if name in ALIASES:
        stage, option = ALIASES[name]
    elif "." in name:
        stage, option = name.split(".", 1)
    else:
        raise DsPruneError(f"space.{name}: unknown parameter; use a paper knob ({', '.join(sorted(ALIASES))}) "
                           "or STAGE.OPTION")
    stage = stage_override or stage
    if stage not in stage_options:
        raise DsPruneError(f"space.{name}: the pipeline has no stage {stage!r} (stages: "
                           f"{', '.join(stage_options)}); name it with `stage: NAME`")
    if option not in stage_options[stage]:
        raise DsPruneError(f"space.{name}: stage {stage!r} has no option {option!r}")
    return stage, option


def overrides(params: list[Param], config: dict) -> dict[str, dict]:
    """A trial's sampled values as recipe overrides ``{stage: {option: value}}``."""
    out: dict[str, dict] = {}
    for p in params:
        v = config[p.name]
        if p.kind == "randint":
            v = int(v)
        out.setdefault(p.stage, {})[p.option] = v
    return out
