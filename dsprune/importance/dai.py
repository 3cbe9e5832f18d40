"""GAPrune's Domain-Alignment Importance (Eq. 5), element-wise so it runs on ZeRO-3 shards as on full tensors.

    DAI_j = ((F_dom_j − β·F_gen_j)·|θ_j| + γ·√|θ_j|) · (1 + α·s_j)        α = 0.2, β = 1, γ = 0.5

**The per-parameter alignment s_j.** The paper's Eq. 4 is a cosine of the two mean gradients *of one
parameter* — two scalars — so it degenerates to sign(ḡ_gen·ḡ_dom) (±1, or 0 when ε dominates). We keep
that literal reading as ``alignment="sign"``; the default ``"consistency"`` keeps the sign but grades it:

    s_j = ḡ_gen_j · ḡ_dom_j / (√F_gen_j · √F_dom_j + ε)

ḡ is the mean of the per-sample gradients and F the mean of their squares, so |ḡ| ≤ √F (Cauchy–Schwarz) and
s_j ∈ [−1, 1]. It equals cos(u, 1)·cos(v, 1), where u and v are the parameter's per-sample gradients over
the general and domain samples: ±1 only when every sample pushes the parameter the same way in both
datasets, near 0 when the mean gradients are noise. It needs no statistic beyond the four GAPrune already
accumulates. ``"tensor"`` is the reference repository's per-matrix cosine of the flattened mean gradients,
broadcast to every weight of the matrix (needs a cross-shard reduction, supplied as ``allreduce``).

``variant="reference"`` is the reference repository's scoring: softplus((F_dom − β·F_gen)·|θ| ·
clamp(1 + α·s, 0.8, 1.2) + γ·√(|θ| + 1e-8)) — γ outside the modulation, alignment factor clamped.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from ..errors import DsPruneError

# Files written by ``dsprune dai``: one safetensors per statistic, keys = weight names (backbone-relative).
STAT_FILES = {
    "fisher_gen": "fisher_gen.safetensors",
    "fisher_dom": "fisher_dom.safetensors",
    "grad_gen": "grad_gen.safetensors",
    "grad_dom": "grad_dom.safetensors",
    "alignment": "alignment.safetensors",
    "dai": "dai.safetensors",
}
Allreduce = Callable[[torch.Tensor], torch.Tensor]


def _consistency(g_gen, g_dom, f_gen, f_dom, eps, allreduce):
    return g_gen * g_dom / (torch.sqrt(f_gen) * torch.sqrt(f_dom) + eps)


def _sign(g_gen, g_dom, f_gen, f_dom, eps, allreduce):
    return g_gen * g_dom / (g_gen.abs() * g_dom.abs() + eps)


def _tensor(g_gen, g_dom, f_gen, f_dom, eps, allreduce):
    sums = torch.stack([(g_gen * g_dom).sum(), (g_gen * g_gen).sum(), (g_dom * g_dom).sum()]).double()
    if allreduce is not None:
        sums = allreduce(sums)
    cos = sums[0] / (torch.sqrt(sums[1]) * torch.sqrt(sums[2]) + eps)
    return torch.full_like(g_gen, float(cos))


def _paper(net, mag, s, alpha, gamma):
    return (net + gamma * torch.sqrt(mag)) * (1.0 + alpha * s.float())


def _reference(net, mag, s, alpha, gamma):
    factor = torch.clamp(1.0 + alpha * s.float(), 0.8, 1.2)
    return torch.nn.functional.softplus(net * factor + gamma * torch.sqrt(mag + 1e-8))


# DAI's modes by name: how the alignment s is read (the module docstring), and how Eq. 5 combines the terms.
ALIGNMENTS = {"consistency": _consistency, "sign": _sign, "tensor": _tensor}
VARIANTS = {"paper": _paper, "reference": _reference}


def _mode(table: dict, name: str, what: str):
    """``table[name]``; ``what`` names the option in the error as the user set it."""
    if name not in table:
        raise DsPruneError(f"{what} must be one of {', '.join(table)}, not {name!r}")
    return table[name]


def alignment(g_gen: torch.Tensor, g_dom: torch.Tensor, f_gen: torch.Tensor, f_dom: torch.Tensor,
              how: str = "consistency", eps: float = 1e-8, allreduce: Allreduce | None = None) -> torch.Tensor:
    """Per-weight alignment s ∈ [−1, 1] (see the module docstring). Inputs may be shards of one weight."""
    return _mode(ALIGNMENTS, how, "dai.alignment")(g_gen, g_dom, f_gen, f_dom, eps, allreduce)


def dai_score(f_dom: torch.Tensor, f_gen: torch.Tensor, theta: torch.Tensor, s: torch.Tensor,
              alpha: float = 0.2, beta: float = 1.0, gamma: float = 0.5, variant: str = "paper") -> torch.Tensor:
    """Eq. 5 element-wise, in fp32."""
    combine = _mode(VARIANTS, variant, "dai.variant")
    mag = theta.float().abs()
    return combine((f_dom.float() - beta * f_gen.float()) * mag, mag, s, alpha, gamma)


@dataclass(frozen=True)
class DaiParams:
    """Eq. 5's hyperparameters and modes. ``fisher_scale`` multiplies both Fisher terms: a number (1 is the
    paper), or ``balanced`` to give the Fisher term the same mean size as γ√|θ| — on real models F is tiny and
    Eq. 5 is then magnitude modulated by alignment, and the balanced scale shows what the Fisher term adds."""

    alpha: float = 0.2
    beta: float = 1.0
    gamma: float = 0.5
    alignment: str = "consistency"
    variant: str = "paper"
    fisher_scale: str | float = "1"
    eps: float = 1e-8

    def check(self) -> "DaiParams":
        """The option names of ``dsprune dai`` in the messages: they are what the user typed."""
        _mode(ALIGNMENTS, self.alignment, "--alignment")
        _mode(VARIANTS, self.variant, "--variant")
        if self.fisher_scale != "balanced":
            try:
                float(self.fisher_scale)
            except ValueError:
                raise DsPruneError(f"--fisher_scale must be a number or 'balanced', not {self.fisher_scale!r}") from None
        return self


@dataclass
class DaiResult:
    alignment: dict[str, torch.Tensor]
    dai: dict[str, torch.Tensor]
    fisher_ratio: float | None        # mean |Fisher term| / mean γ√|θ| before scaling (None: no magnitude term)
    fisher_scale: float               # the scale applied to both Fisher terms


def compute(names: Iterable[str], f_gen: dict, f_dom: dict, g_gen: dict, g_dom: dict,
            theta: Callable[[str], torch.Tensor], p: DaiParams, allreduce: Allreduce | None = None) -> DaiResult:
    """Alignment and DAI of every weight in ``names``: the one place Eq. 5 is evaluated, for the statistics
    ``dsprune dai`` has just accumulated (shards, with ``allreduce`` summing across ranks) and for the ones it
    saved (whole tensors). ``theta(name)`` gives the weight's values in the statistics' layout."""
    names = list(names)
    reduce = allreduce or (lambda t: t)
    sums = torch.zeros(2, dtype=torch.float64)
    for n in names:
        th = theta(n).float().abs()
        sums[0] += ((f_dom[n] - p.beta * f_gen[n]) * th).abs().double().sum()
        sums[1] += (p.gamma * th.sqrt()).double().sum()
    sums = reduce(sums)
    ratio = float(sums[0] / sums[1]) if sums[1] > 0 else None
    scale = (1.0 / ratio if ratio else 1.0) if p.fisher_scale == "balanced" else float(p.fisher_scale)
    align, dai = {}, {}
    for n in names:
        align[n] = alignment(g_gen[n], g_dom[n], f_gen[n], f_dom[n], p.alignment, p.eps, allreduce)
        dai[n] = dai_score(scale * f_dom[n], scale * f_gen[n], theta(n), align[n], p.alpha, p.beta, p.gamma,
                           p.variant)
    return DaiResult(align, dai, ratio, scale)


def read_stat(folder: str | Path, stat: str) -> dict[str, torch.Tensor]:
    """One statistic written by ``dsprune dai`` (``fisher_gen``, ``fisher_dom``, ``grad_*``, ``alignment``,
    ``dai``)."""
    from safetensors.torch import load_file

    if stat not in STAT_FILES:
        raise DsPruneError(f"unknown DAI statistic {stat!r} (known: {', '.join(STAT_FILES)})")
    path = Path(folder) / STAT_FILES[stat]
    if not path.is_file():
        raise DsPruneError(f"{path} not found: is {folder} the output of `dsprune dai`?")
    return load_file(str(path))


def dai_from_stats(folder: str | Path, theta: dict[str, torch.Tensor], alpha: float, beta: float, gamma: float,
                   alignment_how: str = "consistency", variant: str = "paper", fisher_scale: str | float = 1.0,
                   eps: float = 1e-8) -> dict[str, torch.Tensor]:
    """DAI recomputed from the statistics ``dsprune dai`` saved, with other hyperparameters — a sweep over
    α, β, γ, the alignment or the Fisher scale needs no new gradients."""
    f_gen, f_dom = read_stat(folder, "fisher_gen"), read_stat(folder, "fisher_dom")
    g_gen, g_dom = read_stat(folder, "grad_gen"), read_stat(folder, "grad_dom")
    theta = {n: w.detach().cpu() for n, w in theta.items()}      # values only: no autograd graph over the model
    missing = [n for n in theta if n not in f_dom]
    if missing:
        raise DsPruneError(f"{folder}: no statistics for {missing[0]!r}")
    p = DaiParams(alpha, beta, gamma, alignment_how, variant, fisher_scale, eps)
    return compute(theta, f_gen, f_dom, g_gen, g_dom, theta.__getitem__, p).dai
