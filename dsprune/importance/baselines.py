"""Per-weight scores of GAPrune's baselines, ranked by the same ``budget.keep_top`` as DAI (registered by
name in ``importance.methods``).

* random — i.i.d. uniform scores, seeded (GAPrune's "Random Pruning").
* magnitude — |θ| (Han et al., 2015).
* fisher_dom, fisher_gen — F·|θ| with F the per-sample diagonal Fisher of the general or the domain triplets
  (GAPrune's "Fisher Pruning", Fisher weighted by magnitude; F comes from ``dsprune dai``).
* wanda — |θ_ij|·‖X_j‖₂, the weight times the L2 norm of its input feature over calibration tokens
  (Sun et al., 2024; EffiR Table 4). Norms are collected with forward hooks on the scored linears, over
  real tokens only (padding excluded).
"""
from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from ..errors import DsPruneError


def random_scores(weights: dict[str, torch.Tensor], seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {n: torch.rand(w.shape, generator=g) for n, w in weights.items()}


def magnitude_scores(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {n: w.detach().float().abs().cpu() for n, w in weights.items()}


def fisher_scores(weights: dict[str, torch.Tensor], fisher: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for n, w in weights.items():
        if n not in fisher:
            raise DsPruneError(f"no Fisher statistic for {n!r}: run `dsprune dai` with the same targets "
                               "(--attention) on this model")
        if tuple(fisher[n].shape) != tuple(w.shape):
            raise DsPruneError(f"Fisher for {n!r} has shape {tuple(fisher[n].shape)}, weight {tuple(w.shape)}: "
                               "scores come from a different model")
        out[n] = fisher[n].float() * w.detach().float().abs().cpu()
    return out


@torch.no_grad()
def input_norms(enc, modules: dict[str, nn.Linear], texts: Sequence[str], batch_size: int = 8,
                max_length: int | None = None) -> dict[str, torch.Tensor]:
    """‖X_j‖₂ per input feature of each linear, over the real tokens of ``texts`` (passage tokenisation)."""
    if not texts:
        raise DsPruneError("wanda needs calibration text")
    sq = {n: torch.zeros(m.in_features, dtype=torch.float64) for n, m in modules.items()}
    state = {"mask": None}

    def make_hook(name):
        def hook(mod, args):
            x = args[0].detach().float()
            m = state["mask"]
            if m is not None and x.dim() == 3:
                x = x[m.bool()]
            sq[name] += (x.reshape(-1, x.shape[-1]) ** 2).sum(0).double().cpu()
        return hook

    hooks = [m.register_forward_pre_hook(make_hook(n)) for n, m in modules.items()]
    was = enc.training
    enc.eval()
    try:
        dev = enc.device
        for s in tqdm(range(0, len(texts), batch_size), desc="wanda: activation norms", leave=False):
            b = enc.tokenize(list(texts[s:s + batch_size]), "passage", max_length=max_length)
            state["mask"] = b["attention_mask"].to(dev)
            enc(b["input_ids"].to(dev), b["attention_mask"].to(dev))
    finally:
        for h in hooks:
            h.remove()
        enc.train(was)
    return {n: v.sqrt().float() for n, v in sq.items()}


def wanda_scores(enc, weights: dict[str, nn.Parameter], texts: Sequence[str], batch_size: int = 8,
                 max_length: int | None = None) -> dict[str, torch.Tensor]:
    mods = {}
    owner = {id(m.weight): m for m in enc.backbone.modules() if isinstance(m, nn.Linear)}
    for n, w in weights.items():
        if id(w) not in owner:
            raise DsPruneError(f"wanda scores linear layers; {n!r} is not the weight of one")
        mods[n] = owner[id(w)]
    norms = input_norms(enc, mods, texts, batch_size, max_length)
    return {n: w.detach().float().abs().cpu() * norms[n][None, :] for n, w in weights.items()}
