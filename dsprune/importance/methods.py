"""Importance methods by name, the way Torch-Pruning keeps its importance classes.

Each method is a small callable registered with the unit it scores:

* ``weight`` — per-weight scores for ``budget.keep_top`` (or, summed per neuron, ``keep_top_neurons``):
  ``fn(ctx: WeightContext) -> {weight name: tensor}``. ``dsprune prune --method`` chooses among these.
* ``sublayer`` — EffiR's 1 − cos per attention, MLP and block: ``fn(enc, texts, batch_size, max_length,
  show_progress) -> {group: {layer: score}}`` (``dsprune score``, ``dsprune drop``).
* ``neuron`` — self-slimming's gates: ``fn(values) -> {layer: importance}`` (``dsprune mask``).

Commands, recipes and sweeps look methods up here, so a name is checked the same way everywhere, before any
model is loaded. The implementations live beside this module; the callables only adapt their arguments.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import DsPruneError

UNITS = ("weight", "sublayer", "neuron")


@dataclass(frozen=True)
class Method:
    name: str
    unit: str
    fn: Callable
    summary: str
    needs_stats: bool = False   # reads the statistics `dsprune dai` writes

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


METHODS: dict[str, Method] = {}


def register(name: str, unit: str, summary: str, needs_stats: bool = False):
    """Decorator: add ``fn`` to the registry under ``name``."""
    if unit not in UNITS:
        raise ValueError(f"unknown unit {unit!r}")

    def add(fn: Callable) -> Callable:
        if name in METHODS:
            raise ValueError(f"importance method {name!r} registered twice")
        METHODS[name] = Method(name, unit, fn, summary, needs_stats)
        return fn
    return add


def names(unit: str) -> tuple[str, ...]:
    """The methods of one unit, in registration order."""
    return tuple(n for n, m in METHODS.items() if m.unit == unit)


def get(name: str, unit: str, what: str = "--method") -> Method:
    """The method ``name`` of ``unit``; ``what`` names the option in the error (a recipe stage, a sweep key)."""
    m = METHODS.get(name)
    if m is None or m.unit != unit:
        raise DsPruneError(f"{what} must be one of {', '.join(names(unit))}, not {name!r}")
    return m


@dataclass
class WeightContext:
    """What a per-weight method may read; each reads only its part."""

    enc: object
    weights: dict                          # backbone-relative name -> parameter
    stats: str | None = None               # folder written by `dsprune dai`
    seed: int = 0
    texts: Callable[[], Sequence[str]] | None = None   # calibration text, read lazily (wanda only)
    batch_size: int = 8
    max_length: int | None = None
    dai: object | None = None              # dai.DaiParams: recompute DAI from the statistics (None: saved DAI)
    attention: bool = False                # whether attention weights are scored (named in mismatch errors)


def score_weights(name: str, ctx: WeightContext) -> dict:
    m = get(name, "weight")
    if m.needs_stats and not ctx.stats:
        raise DsPruneError(f"--method {name} needs --scores (the output folder of `dsprune dai`)")
    return m(ctx)


# ---- per-weight methods (GAPrune's DAI and its baselines; Wanda) -----------------------------------------

@register("dai", "weight", "GAPrune's domain-alignment importance (Eq. 5)", needs_stats=True)
def _dai(ctx: WeightContext) -> dict:
    from .dai import dai_from_stats, read_stat

    if ctx.dai is not None:
        p = ctx.dai
        return dai_from_stats(ctx.stats, ctx.weights, p.alpha, p.beta, p.gamma, p.alignment, p.variant,
                              p.fisher_scale, p.eps)
    dai = read_stat(ctx.stats, "dai")
    for n, w in ctx.weights.items():
        if n not in dai:
            raise DsPruneError(f"{ctx.stats}: no DAI score for {n!r} (was `dsprune dai` run with "
                               f"--attention {ctx.attention} on this model?)")
        if tuple(dai[n].shape) != tuple(w.shape):
            raise DsPruneError(f"{ctx.stats}: DAI for {n!r} has shape {tuple(dai[n].shape)}, the weight "
                               f"{tuple(w.shape)}: scores come from a different model")
    return {n: dai[n].float() for n in ctx.weights}


@register("magnitude", "weight", "|θ| (Han et al., 2015)")
def _magnitude(ctx: WeightContext) -> dict:
    from .baselines import magnitude_scores
    return magnitude_scores(ctx.weights)


def _fisher(stat: str) -> Callable:
    def fisher(ctx: WeightContext) -> dict:
        from .baselines import fisher_scores
        from .dai import read_stat
        return fisher_scores(ctx.weights, read_stat(ctx.stats, stat))
    return fisher


register("fisher_dom", "weight", "F_dom·|θ|, Fisher of the domain triplets", needs_stats=True)(_fisher("fisher_dom"))
register("fisher_gen", "weight", "F_gen·|θ|, Fisher of the general triplets", needs_stats=True)(_fisher("fisher_gen"))


@register("random", "weight", "seeded uniform scores")
def _random(ctx: WeightContext) -> dict:
    from .baselines import random_scores
    return random_scores(ctx.weights, ctx.seed)


@register("wanda", "weight", "|θ_ij|·‖X_j‖₂ over calibration tokens (Sun et al., 2024)")
def _wanda(ctx: WeightContext) -> dict:
    from .baselines import wanda_scores
    return wanda_scores(ctx.enc, ctx.weights, ctx.texts(), ctx.batch_size, ctx.max_length)


# ---- coarser units ----------------------------------------------------------------------------------------

@register("cosine", "sublayer", "EffiR's 1 − cos(x_in, x_out) of every attention, MLP and block")
def _cosine(enc, texts, batch_size: int = 8, max_length: int | None = None, show_progress: bool = True) -> dict:
    from .layer_cosine import score_layers
    return score_layers(enc, texts, batch_size, max_length, show_progress=show_progress)


@register("gates", "neuron", "self-slimming: each MLP neuron's gate z, ranked as ReLU(z) with ties at 0 "
                            "broken by z")
def _gates(values: dict) -> dict:
    return {i: v.flatten().float() for i, v in values.items()}
