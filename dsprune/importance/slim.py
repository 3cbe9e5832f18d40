"""Self-slimming: the sparsity penalty on the gates and the global ranking that turns them into a mask.

Penalty (EffiR Appendix A.1): the sigmoid surrogate of the ℓ0 norm, σ(β|z|), β = 5. The paper sums it
over all gates and weights it with λ = 1e-8; with ~10⁴–10⁵ gates each then gets a gradient of ~1e-10
against InfoNCE gradients many decades larger, so the gates do not move. Here the penalty
is the **mean** over all gates — the soft fraction of active neurons, between 0.5 and 1 — so λ weighs
"fraction of the MLP kept" against the InfoNCE loss and means the same for any model size. The paper's
summed form is ``normalise="sum"``.

Mask (EffiR §5.1): rank ReLU(z) of every kept MLP globally, set the lowest ``round(r·N)`` to 0 and the
rest to 1. The penalty drives many gates below zero, where ReLU(z) ties at 0 — often more of them than the
ratio removes — so ties break by z itself (the further below zero, the sooner a neuron goes), which orders
the positive gates exactly as ReLU(z) does; breaking them by position would let the layer order choose. Layer indices are the original model's; the result is the shared structured mask format
(``mlp.<layer>`` -> bool[width], ``formats.write_mask``).
"""
from __future__ import annotations

import math

import torch

from ..errors import DsPruneError
from ..formats import mlp_key

BETA = 5.0
# how ``global_mask`` orders gates that tie at ReLU(z) = 0, recorded in every mask it makes
TIES = "z"
# λ for the mean-normalised penalty. A gate then feels λ/N·β·σ'(β|z|) — at z = 1 that is λ·0.033/N, about
# 1.4e-3 for λ = 1000 and a SmolLM2 with 15 MLPs left (N ≈ 23k gates): between the InfoNCE gradients of gates
# that retrieval barely uses and of those it relies on, so the former fall (and, σ' growing towards 0, keep
# falling) while the latter follow InfoNCE. For a model with k times more gates, scale λ by k (or use "sum").
LAMBDA = 1000.0


def l0_surrogate(z: torch.Tensor | list[torch.Tensor], beta: float = BETA, normalise: str = "mean") -> torch.Tensor:
    """Σ or mean of σ(β|z|) over all gates (one tensor or a list, one per layer)."""
    if beta <= 0:
        raise DsPruneError(f"slim beta must be positive, not {beta}")
    zs = z if isinstance(z, (list, tuple)) else [z]
    if not zs:
        raise DsPruneError("no gates to penalise")
    total = sum(torch.sigmoid(beta * t.float().abs()).sum() for t in zs)
    if normalise == "mean":
        return total / sum(t.numel() for t in zs)
    if normalise == "sum":
        return total
    raise DsPruneError(f"slim normalise must be 'mean' or 'sum', not {normalise!r}")


def gate_stats(values: dict[int, torch.Tensor], threshold: float) -> dict:
    """Spread of ReLU(z): fraction under ``threshold``, quantiles (for logs and manifests)."""
    flat = torch.relu(torch.cat([v.flatten().float() for v in values.values()]))
    q = torch.quantile(flat, torch.tensor([0.01, 0.1, 0.5, 0.9, 0.99]))
    return {"gates": flat.numel(), "threshold": threshold,
            "frac_below": float((flat < threshold).float().mean()),
            "mean": float(flat.mean()), "std": float(flat.std()) if flat.numel() > 1 else 0.0,
            "min": float(flat.min()), "max": float(flat.max()),
            **{f"q{int(p * 100):02d}": float(x) for p, x in zip((0.01, 0.1, 0.5, 0.9, 0.99), q)}}


def check_ratio(ratio: float) -> float:
    if not (isinstance(ratio, (int, float)) and math.isfinite(ratio) and 0.0 <= ratio < 1.0):
        raise DsPruneError(f"ratio must be in [0, 1) (the fraction of MLP neurons to remove), not {ratio}")
    return float(ratio)


def global_mask(values: dict[int, torch.Tensor], ratio: float, min_per_layer: int = 0) -> dict[int, torch.Tensor]:
    """layer -> bool[width] (True = kept): the lowest ``round(ratio·N)`` of ReLU(z) across all layers go.

    ``values`` are the gates z (``methods`` "gates" gives z: ranking z orders ReLU(z), its zeros by z) or any
    importance; ties at ReLU(z) = 0 break by z (module doc), then by (layer, neuron), so the mask is
    deterministic. ``min_per_layer``
    protects each layer's top-k gates from removal; without it a mask that would empty a layer is refused.
    """
    ratio = check_ratio(ratio)
    if not values:
        raise DsPruneError("no gate values to rank")
    if min_per_layer < 0:
        raise DsPruneError(f"min_per_layer must be >= 0, not {min_per_layer}")
    layers = sorted(int(k) for k in values)
    widths = {i: values[i].numel() for i in layers}
    small = [i for i in layers if widths[i] < min_per_layer]
    if small:
        raise DsPruneError(f"min_per_layer={min_per_layer} exceeds the width of MLP layer {small[0]} "
                           f"({widths[small[0]]})")
    total = sum(widths.values())
    n_remove = int(round(ratio * total))
    vals, lay, idx, protected = [], [], [], []
    for i in layers:
        v = values[i].flatten().float()       # ranked as z: ReLU(z)'s order, its zeros ordered by z
        keep_top = torch.zeros(v.numel(), dtype=torch.bool)
        if min_per_layer:
            # the layer's strongest gates (ties: lower index first) are never candidates
            order = sorted(range(v.numel()), key=lambda j: (-float(v[j]), j))[:min_per_layer]
            keep_top[order] = True
        vals.append(v)
        lay.append(torch.full((v.numel(),), i, dtype=torch.long))
        idx.append(torch.arange(v.numel()))
        protected.append(keep_top)
    vals, lay, idx, protected = map(torch.cat, (vals, lay, idx, protected))
    candidates = (~protected).nonzero().flatten()
    if n_remove > candidates.numel():
        raise DsPruneError(f"ratio {ratio} removes {n_remove} neurons but min_per_layer={min_per_layer} leaves "
                           f"only {candidates.numel()} removable")
    # sort candidates by (value, layer, neuron): stable lexicographic sort, least important first
    c = candidates
    order = torch.argsort(idx[c], stable=True)
    c = c[order]
    c = c[torch.argsort(lay[c], stable=True)]
    c = c[torch.argsort(vals[c], stable=True)]
    removed = c[:n_remove]
    keep = torch.ones(total, dtype=torch.bool)
    keep[removed] = False
    out, start = {}, 0
    for i in layers:
        out[i] = keep[start:start + widths[i]].clone()
        start += widths[i]
    empty = [i for i in layers if not out[i].any()]
    if empty:
        raise DsPruneError(f"ratio {ratio} would remove every neuron of MLP layer {empty[0]} "
                           f"(pass --min_per_layer K to keep at least K neurons per layer)")
    return out


def as_mask_tensors(keep: dict[int, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The shared structured mask format: ``mlp.<layer>`` -> bool[width]."""
    return {mlp_key(i): m.to(torch.bool) for i, m in sorted(keep.items())}
