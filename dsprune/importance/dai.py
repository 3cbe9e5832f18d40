"""GAPrune's Domain-Alignment Importance (Eq. 5), element-wise so it runs on ZeRO-3 shards as on full tensors.

    DAI_j = ((F_dom_j − β·F_gen_j)·|θ_j| + γ·√|θ_j|) · (1 + α·s_j)        α = 0.2, β = 1, γ = 0.5

**The per-parameter alignment s_j** (``alignment=``). The paper's Eq. 4 is a cosine of the two mean gradients
*of one parameter* — two scalars — so as written it is sign(ḡ_gen·ḡ_dom), or ~0 where |ḡ_gen·ḡ_dom| is
below ε: ``"eq4"`` (``"sign"`` is its older name). The default ``"consistency"`` is this project's own
reading: it keeps the sign but grades it,

    s_j = ḡ_gen_j · ḡ_dom_j / (√F_gen_j · √F_dom_j + ε)

ḡ is the mean of the per-sample gradients and F the mean of their squares, so |ḡ| ≤ √F (Cauchy–Schwarz) and
s_j ∈ [−1, 1]. It equals cos(u, 1)·cos(v, 1), where u and v are the parameter's per-sample gradients over
the general and domain samples: ±1 only when every sample pushes the parameter the same way in both
datasets, near 0 when the mean gradients are noise. ``"tensor"`` is the per-matrix cosine of the flattened
mean gradients, broadcast to every weight of the matrix (the reference code's summary figure, and its
fallback when per-weight arrays are missing). ``"reference"`` is the per-weight array the reference code's
pruning reads: ḡ_gen/‖ḡ_gen‖ · ḡ_dom/‖ḡ_dom‖ element-wise (norms over the whole matrix), averaged over each
weight's 3×3 neighbourhood of the matrix (zero padding). Its values are ~1/numel, so the alignment factor is ~1.

``variant="reference"`` is the reference code's scoring: softplus((F_dom − β·F_gen)·|θ| · clamp(1 + α·s,
0.8, 1.2) + γ·√(|θ| + 1e-8)), then standardised within each matrix and squashed (sigmoid of the z-score)
before the global ranking — so each matrix loses about the same share, whatever its scale. Its statistics come
from batches (``fisher.accumulate``); ``gaprune.REFERENCE`` lists the options that reproduce it. Kept from it
only in spirit: it stores F and s in float16 and adds 1e-8 to F (cancelled by β = 1); here all is fp32.
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


def _consistency(g_gen, g_dom, f_gen, f_dom, eps, allreduce, shape):
    return g_gen * g_dom / (torch.sqrt(f_gen) * torch.sqrt(f_dom) + eps)


def _eq4(g_gen, g_dom, f_gen, f_dom, eps, allreduce, shape):
    return g_gen * g_dom / (g_gen.abs() * g_dom.abs() + eps)


def _sums(terms: list[torch.Tensor], allreduce) -> torch.Tensor:
    """Sums over the whole matrix in float64, across shards when ``allreduce`` is given."""
    sums = torch.stack([t.double().sum() for t in terms])
    return allreduce(sums) if allreduce is not None else sums


def _tensor(g_gen, g_dom, f_gen, f_dom, eps, allreduce, shape):
    sums = _sums([g_gen * g_dom, g_gen * g_gen, g_dom * g_dom], allreduce)
    cos = sums[0] / (torch.sqrt(sums[1]) * torch.sqrt(sums[2]) + eps)
    return torch.full_like(g_gen, float(cos))


def _reference_alignment(g_gen, g_dom, f_gen, f_dom, eps, allreduce, shape):
    norms = _sums([g_gen * g_gen, g_dom * g_dom], allreduce).sqrt()
    if norms[0] <= eps or norms[1] <= eps:
        return torch.zeros_like(g_gen)
    s = (g_gen / (float(norms[0]) + eps)) * (g_dom / (float(norms[1]) + eps))
    shape = tuple(shape or g_gen.shape)
    if len(shape) != 2 or min(shape) < 3:
        return s
    if s.numel() != shape[0] * shape[1]:
        raise DsPruneError("alignment 'reference' averages each weight with its neighbours in the matrix, so it "
                           "needs whole matrices, not ZeRO-3 shards: run `dsprune dai` in one process, or "
                           "recompute from saved statistics "
                           "(`dsprune prune --dai_recompute --dai_alignment reference`)")
    kernel = torch.full((1, 1, 3, 3), 1.0 / 9, dtype=s.dtype)
    smooth = torch.nn.functional.conv2d(s.reshape(1, 1, *shape), kernel, padding=1)
    return smooth.reshape(g_gen.shape)


def _paper(net, mag, s, alpha, gamma):
    return (net + gamma * torch.sqrt(mag)) * (1.0 + alpha * s.float())


def _reference(net, mag, s, alpha, gamma):
    factor = torch.clamp(1.0 + alpha * s.float(), 0.8, 1.2)
    return torch.nn.functional.softplus(net * factor + gamma * torch.sqrt(mag + 1e-8))


def matrix_zscore_sigmoid(score: torch.Tensor, mag: torch.Tensor, eps: float = 1e-8,
                          allreduce: Allreduce | None = None) -> torch.Tensor:
    """The reference code's post-processing of one matrix's scores: sigmoid of their z-score (unbiased std),
    after spreading near-constant scores by |θ| relative to its mean, as it does. Shards reduce together."""
    def moments(t):                     # two passes: the scores' spread can be tiny beside their mean
        t = t.double()
        total, n = _sums([t, torch.ones_like(t)], allreduce)
        mean = total / n
        return float(mean), float(torch.sqrt(_sums([(t - mean) ** 2], allreduce)[0] / (n - 1)))

    mean, std = moments(score)
    if std < 1e-6:
        score = score * (0.5 + 0.5 * mag / (moments(mag)[0] + eps))
        mean, std = moments(score)
    return torch.sigmoid((score.double() - mean) / (std + eps)).float()


# DAI's modes by name: how the alignment s is read (the module docstring), and how Eq. 5 combines the terms.
ALIGNMENTS = {"consistency": _consistency, "sign": _eq4, "tensor": _tensor, "eq4": _eq4,
              "reference": _reference_alignment}
VARIANTS = {"paper": _paper, "reference": _reference}


def _mode(table: dict, name: str, what: str):
    """``table[name]``; ``what`` names the option in the error as the user set it."""
    if name not in table:
        raise DsPruneError(f"{what} must be one of {', '.join(table)}, not {name!r}")
    return table[name]


def alignment(g_gen: torch.Tensor, g_dom: torch.Tensor, f_gen: torch.Tensor, f_dom: torch.Tensor,
              how: str = "consistency", eps: float = 1e-8, allreduce: Allreduce | None = None,
              shape: tuple | None = None) -> torch.Tensor:
    """Per-weight alignment s ∈ [−1, 1] (see the module docstring). Inputs may be shards of one weight, flat;
    ``shape`` is the whole weight's (default: the inputs')."""
    return _mode(ALIGNMENTS, how, "dai.alignment")(g_gen, g_dom, f_gen, f_dom, eps, allreduce, shape)


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
                raise DsPruneError(f"--fisher_scale must be a number or 'balanced', "
                                   f"not {self.fisher_scale!r}") from None
        return self


@dataclass
class DaiResult:
    alignment: dict[str, torch.Tensor]
    dai: dict[str, torch.Tensor]
    fisher_ratio: float | None        # mean |Fisher term| / mean γ√|θ| before scaling (None: no magnitude term)
    fisher_scale: float               # the scale applied to both Fisher terms


def balanced_scale(ratio: float | None) -> float:
    """The factor that gives the Fisher term the mean size of γ√|θ|, from their measured ratio (1 when the Fisher
    term is all zero: there is nothing to scale)."""
    return 1.0 / ratio if ratio else 1.0


def compute(names: Iterable[str], f_gen: dict, f_dom: dict, g_gen: dict, g_dom: dict,
            theta: Callable[[str], torch.Tensor], p: DaiParams, allreduce: Allreduce | None = None,
            shapes: dict[str, tuple] | None = None) -> DaiResult:
    """Alignment and DAI of every weight in ``names``: the one place Eq. 5 is evaluated, for the statistics
    ``dsprune dai`` has just accumulated (shards, with ``allreduce`` summing across ranks) and for the ones it
    saved (whole tensors). ``theta(name)`` gives the weight's values in the statistics' layout; ``shapes`` the
    whole weights' shapes when the statistics are flat."""
    names = list(names)
    reduce = allreduce or (lambda t: t)
    sums = torch.zeros(2, dtype=torch.float64)
    for n in names:
        th = theta(n).float().abs()
        sums[0] += ((f_dom[n] - p.beta * f_gen[n]) * th).abs().double().sum()
        sums[1] += (p.gamma * th.sqrt()).double().sum()
    sums = reduce(sums)
    ratio = float(sums[0] / sums[1]) if sums[1] > 0 else None
    scale = balanced_scale(ratio) if p.fisher_scale == "balanced" else float(p.fisher_scale)
    align, dai = {}, {}
    for n in names:
        align[n] = alignment(g_gen[n], g_dom[n], f_gen[n], f_dom[n], p.alignment, p.eps, allreduce,
                             (shapes or {}).get(n))
        dai[n] = dai_score(scale * f_dom[n], scale * f_gen[n], theta(n), align[n], p.alpha, p.beta, p.gamma,
                           p.variant)
        if p.variant == "reference":
            dai[n] = matrix_zscore_sigmoid(dai[n], theta(n).float().abs(), p.eps, allreduce)
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
