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

from pathlib import Path
from typing import Callable

import torch

from ..errors import DsPruneError

ALIGNMENTS = ("consistency", "sign", "tensor")
VARIANTS = ("paper", "reference")

# Files written by ``dsprune dai``: one safetensors per statistic, keys = weight names (backbone-relative).
STAT_FILES = {
    "fisher_gen": "fisher_gen.safetensors",
    "fisher_dom": "fisher_dom.safetensors",
    "grad_gen": "grad_gen.safetensors",
    "grad_dom": "grad_dom.safetensors",
    "alignment": "alignment.safetensors",
    "dai": "dai.safetensors",
}


def alignment(g_gen: torch.Tensor, g_dom: torch.Tensor, f_gen: torch.Tensor, f_dom: torch.Tensor,
              how: str = "consistency", eps: float = 1e-8,
              allreduce: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
    """Per-weight alignment s ∈ [−1, 1] (see the module docstring). Inputs may be shards of one weight."""
    if how == "consistency":
        return g_gen * g_dom / (torch.sqrt(f_gen) * torch.sqrt(f_dom) + eps)
    if how == "sign":
        return g_gen * g_dom / (g_gen.abs() * g_dom.abs() + eps)
    if how == "tensor":
        sums = torch.stack([(g_gen * g_dom).sum(), (g_gen * g_gen).sum(), (g_dom * g_dom).sum()]).double()
        if allreduce is not None:
            sums = allreduce(sums)
        cos = sums[0] / (torch.sqrt(sums[1]) * torch.sqrt(sums[2]) + eps)
        return torch.full_like(g_gen, float(cos))
    raise DsPruneError(f"dai.alignment must be one of {', '.join(ALIGNMENTS)}, not {how!r}")


def dai_score(f_dom: torch.Tensor, f_gen: torch.Tensor, theta: torch.Tensor, s: torch.Tensor,
              alpha: float = 0.2, beta: float = 1.0, gamma: float = 0.5, variant: str = "paper") -> torch.Tensor:
    """Eq. 5 element-wise, in fp32."""
    mag = theta.float().abs()
    net = (f_dom.float() - beta * f_gen.float()) * mag
    if variant == "paper":
        return (net + gamma * torch.sqrt(mag)) * (1.0 + alpha * s.float())
    if variant == "reference":
        factor = torch.clamp(1.0 + alpha * s.float(), 0.8, 1.2)
        return torch.nn.functional.softplus(net * factor + gamma * torch.sqrt(mag + 1e-8))
    raise DsPruneError(f"dai.variant must be one of {', '.join(VARIANTS)}, not {variant!r}")


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


def fisher_balance(f_dom: dict, f_gen: dict, theta: dict, beta: float, gamma: float) -> float:
    """mean |(F_dom − β·F_gen)·|θ|| / mean γ·√|θ| over all scored weights (full tensors)."""
    num = sum(float(((f_dom[n] - beta * f_gen[n]) * theta[n].float().abs()).abs().double().sum()) for n in theta)
    den = sum(float((gamma * theta[n].float().abs().sqrt()).double().sum()) for n in theta)
    return num / den if den > 0 else 0.0


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
    if fisher_scale == "balanced":
        r = fisher_balance(f_dom, f_gen, theta, beta, gamma)
        scale = 1.0 / r if r > 0 else 1.0
    else:
        scale = float(fisher_scale)
    out = {}
    for n, w in theta.items():
        s = alignment(g_gen[n], g_dom[n], f_gen[n], f_dom[n], alignment_how, eps)
        out[n] = dai_score(scale * f_dom[n], scale * f_gen[n], w, s, alpha, beta, gamma, variant)
    return out
