"""From scores to a mask: keep exactly the top (1 − s) of the weights (or MLP neurons) in each budget group.

Every weight or neuron method — DAI, random, magnitude, Fisher·|θ|, Wanda — goes through these functions, so
methods differ only in their scores (slimming gates rank through ``importance.slim.global_mask``, which breaks
ties by z). Counts are exact: a group of N items prunes round(s·N) of them, ties at
the threshold are broken by position (lowest flat index kept first), so the sparsity never drifts.

Budget groups (``scope``): ``global`` (one ranking over all scored weights, as in GAPrune), ``layer`` (each
transformer layer keeps 1 − s of its own weights), ``row`` (each output row of each matrix, Wanda's
comparison group).
"""
from __future__ import annotations

from collections import defaultdict

import torch

from ..errors import DsPruneError

SCOPES = ("global", "layer", "row")
NEURON_AGGREGATIONS = ("sum", "positive")


def _check(scores: dict[str, torch.Tensor], sparsity: float) -> None:
    if not 0.0 <= sparsity < 1.0:
        raise DsPruneError(f"sparsity must be in [0, 1), not {sparsity}")
    if not scores:
        raise DsPruneError("no scores to rank")
    for name, s in scores.items():
        if not torch.isfinite(s).all():
            raise DsPruneError(f"scores for {name!r} contain NaN or inf")


def top_k_flat(flat: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of exactly ``k`` largest entries of a 1-D tensor; ties broken by lowest index."""
    n = flat.numel()
    keep = torch.zeros(n, dtype=torch.bool)
    if k <= 0:
        return keep
    if k >= n:
        return keep.fill_(True)
    thr = torch.kthvalue(flat, n - k + 1).values  # the k-th largest value
    keep = flat > thr
    need = k - int(keep.sum())
    if need > 0:
        ties = (flat == thr).nonzero().flatten()[:need]
        keep[ties] = True
    return keep


def n_pruned(n: int, sparsity: float) -> int:
    return int(round(sparsity * n))


def keep_top(scores: dict[str, torch.Tensor], sparsity: float, scope: str = "global",
             layer_of=None) -> dict[str, torch.Tensor]:
    """Per-weight bool masks (True = kept) keeping the highest scores, pruning ``sparsity`` of each group."""
    _check(scores, sparsity)
    if scope not in SCOPES:
        raise DsPruneError(f"scope must be one of {', '.join(SCOPES)}, not {scope!r}")
    if scope == "row":
        out = {}
        for name, s in scores.items():
            if s.dim() != 2:
                raise DsPruneError(f"scope 'row' needs matrices; {name!r} has shape {tuple(s.shape)}")
            k = s.shape[1] - n_pruned(s.shape[1], sparsity)
            rows = torch.zeros_like(s, dtype=torch.bool)
            if k > 0:
                # stable descending sort gives the lowest index first among ties
                idx = torch.sort(s.float(), dim=1, descending=True, stable=True).indices[:, :k]
                rows.scatter_(1, idx, True)
            out[name] = rows
        return out
    groups: dict[object, list[str]] = defaultdict(list)
    for name in scores:
        if scope == "global":
            groups[None].append(name)
        else:
            if layer_of is None:
                from ..arch import layer_of as _lo
                layer_of = _lo
            groups[layer_of(name)].append(name)
    out = {}
    for names in groups.values():
        flat = torch.cat([scores[n].detach().float().flatten().cpu() for n in names])
        keep = top_k_flat(flat, flat.numel() - n_pruned(flat.numel(), sparsity))
        off = 0
        for n in names:
            size = scores[n].numel()
            out[n] = keep[off:off + size].view(scores[n].shape)
            off += size
    return out


# ---- structured: whole MLP neurons ----------------------------------------------------------------------

def neuron_scores(scores: dict[str, torch.Tensor], mlp_names: dict[int, tuple], how: str = "sum"
                  ) -> dict[int, torch.Tensor]:
    """One score per MLP neuron: aggregate its gate row, up row and down column.

    ``sum`` (default): removing a neuron removes all of its weights, and first-order importance scores are
    additive, so the neuron's importance is the sum of its weights' scores — negative DAI entries (weights
    whose loss of domain fit is outweighed by their general-domain cost, or that conflict) lower it.
    ``positive``: sum of max(score, 0) — a neuron is worth what its helpful weights are worth; negative
    entries are ignored rather than allowed to cancel positive ones.
    """
    if how not in NEURON_AGGREGATIONS:
        raise DsPruneError(f"neuron aggregation must be one of {', '.join(NEURON_AGGREGATIONS)}, not {how!r}")
    out = {}
    for layer, (gate, up, down) in mlp_names.items():
        missing = [n for n in (gate, up, down) if n is not None and n not in scores]
        if missing:
            raise DsPruneError(f"no scores for {missing[0]!r}: structured pruning needs gate, up and down "
                               "scores of every MLP")
        parts = [scores[up].float()]
        if gate is not None:
            parts.append(scores[gate].float())
        down_t = scores[down].float().T  # [intermediate, hidden]
        parts.append(down_t)
        if how == "positive":
            parts = [p.clamp_min(0) for p in parts]
        out[layer] = sum(p.sum(1) for p in parts)
    return out


def keep_top_neurons(scores: dict[int, torch.Tensor], sparsity: float, scope: str = "global",
                     min_keep: int = 1) -> dict[int, torch.Tensor]:
    """Bool masks over each layer's neurons keeping the highest scores; exactly round(s·N) pruned per group,
    and at least ``min_keep`` neurons kept in every layer (a layer cannot vanish through this path)."""
    if scope not in ("global", "layer"):
        raise DsPruneError(f"structured scope must be 'global' or 'layer', not {scope!r}")
    _check({str(k): v for k, v in scores.items()}, sparsity)
    if scope == "layer":
        out = {}
        for layer, s in scores.items():
            k = max(min_keep, s.numel() - n_pruned(s.numel(), sparsity))
            out[layer] = top_k_flat(s.float().cpu(), k)
        return out
    layers = sorted(scores)
    sizes = [scores[l].numel() for l in layers]
    total = sum(sizes)
    k = total - n_pruned(total, sparsity)
    if k < min_keep * len(layers):
        raise DsPruneError(f"sparsity {sparsity} keeps {k} neurons, fewer than {min_keep} per layer")
    flat = torch.cat([scores[l].float().cpu() for l in layers])
    # Reserve each layer's best min_keep neurons, then rank the rest globally.
    reserved = torch.zeros(total, dtype=torch.bool)
    off = 0
    for l, n in zip(layers, sizes):
        best = torch.sort(flat[off:off + n], descending=True, stable=True).indices[:min_keep]
        reserved[off + best] = True
        off += n
    rest = flat.clone()
    rest[reserved] = float("-inf")
    keep = top_k_flat(rest, k - int(reserved.sum())) | reserved
    out, off = {}, 0
    for l, n in zip(layers, sizes):
        out[l] = keep[off:off + n].clone()
        off += n
    return out


# ---- the mask a method's scores give ------------------------------------------------------------------

def mask_from_scores(scores: dict[str, torch.Tensor], sparsity: float, scope: str, structured: bool = False,
                     mlp_names: dict[int, tuple] | None = None, neuron_agg: str = "sum"
                     ) -> tuple[dict[str, torch.Tensor], str, dict[int, float]]:
    """Mask tensors in the shared format, its kind, and the fraction pruned per layer (original numbering).

    Unstructured: one bool tensor per scored weight. Structured: per-weight scores summed per MLP neuron
    (``neuron_scores``), one bool tensor per layer under ``mlp.<layer>``; needs ``mlp_names``.
    """
    from ..formats import mlp_key

    if structured:
        keep = keep_top_neurons(neuron_scores(scores, mlp_names, neuron_agg), sparsity, scope)
        return ({mlp_key(l): k for l, k in keep.items()}, "structured",
                {l: 1 - float(k.float().mean()) for l, k in keep.items()})
    from ..arch import layer_of

    tensors = keep_top(scores, sparsity, scope)
    pruned: dict[int, int] = {}
    total: dict[int, int] = {}
    for n, m in tensors.items():
        l = layer_of(n)
        pruned[l] = pruned.get(l, 0) + int((~m).sum())
        total[l] = total.get(l, 0) + m.numel()
    return tensors, "unstructured", {l: pruned[l] / total[l] for l in total}
