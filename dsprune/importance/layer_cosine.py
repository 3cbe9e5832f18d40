"""EffiR layer importance: how much a sub-layer changes the residual stream, 1 − cos(x_in, x_out).

Hooks read the streams during one ordinary forward pass of the whole model, so every keyword argument a
layer receives (RoPE ``position_embeddings``, masks, cache flags) is whatever the model itself passes: no
layer is ever re-called by hand. Per family, its spec in ``dsprune.arch`` says where
the stream between attention and MLP is read (``mid``): x_in of attention is the block input, x_out the
mid stream; x_in of the MLP is the mid stream, x_out the block output; the block compares input and output.
Averages run over real (non-pad) tokens only.
"""
from __future__ import annotations

import time
from typing import Sequence

import torch

from .. import formats
from ..encoder import Encoder
from ..surgery import modeling_dsprune as md

GROUPS = tuple(formats.SCORE_GROUPS)


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _one_minus_cos(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    cos = torch.nn.functional.cosine_similarity(a.float(), b.float(), dim=-1, eps=1e-8)
    m = mask.to(cos.dtype)
    return float(((1.0 - cos) * m).sum()), float(m.sum())


@torch.no_grad()
def score_layers(enc: Encoder, texts: Sequence[str], batch_size: int = 8, max_length: int | None = None,
                 show_progress: bool = True) -> dict[str, dict[int, float]]:
    """Importance of every attention, MLP and block, keyed by original layer index.

    Sub-layers already dropped are left out (their score would be exactly 0).
    """
    from tqdm.auto import tqdm

    spec = enc.arch
    layers = spec.layers_of(enc.backbone)
    n = len(layers)
    streams: dict[tuple[int, str], torch.Tensor] = {}
    handles = []
    for i, block in enumerate(layers):
        def pre(mod, args, kwargs, i=i):
            streams[(i, "in")] = args[0] if args else kwargs["hidden_states"]

        def post(mod, args, kwargs, out, i=i):
            streams[(i, "out")] = _first(out)

        handles.append(block.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(block.register_forward_hook(post, with_kwargs=True))
        mid_name, side = spec.mid
        mid = md.get_module(block, mid_name)
        if side == "input":
            handles.append(mid.register_forward_pre_hook(
                lambda mod, args, kwargs, i=i: streams.__setitem__((i, "mid"), args[0] if args
                                                                  else kwargs["hidden_states"]),
                with_kwargs=True))
        else:
            handles.append(mid.register_forward_hook(
                lambda mod, args, out, i=i: streams.__setitem__((i, "mid"), _first(out))))
    sums = {g: torch.zeros(n, dtype=torch.float64) for g in GROUPS}
    count = 0.0
    was_training = enc.training
    enc.eval()
    try:
        for start in tqdm(range(0, len(texts), batch_size), desc="score layers", disable=not show_progress):
            batch = enc.tokenize(list(texts[start:start + batch_size]), "passage", max_length=max_length)
            mask = batch["attention_mask"].to(enc.device)
            streams.clear()
            enc.model(input_ids=batch["input_ids"].to(enc.device), attention_mask=mask, use_cache=False)
            for i in range(n):
                x_in, x_mid, x_out = streams[(i, "in")], streams[(i, "mid")], streams[(i, "out")]
                for g, (a, b) in (("attn", (x_in, x_mid)), ("mlp", (x_mid, x_out)), ("block", (x_in, x_out))):
                    s, c = _one_minus_cos(a, b, mask)
                    sums[g][i] += s
                    if g == "block" and i == 0:
                        count += c
    finally:
        for h in handles:
            h.remove()
        enc.train(was_training)
    cfg = getattr(enc.model.config, "model_type", None) == "dsprune" and enc.model.config
    gone_attn = set(cfg.drop_attn) if cfg else set()
    gone_mlp = set(cfg.drop_mlp) if cfg else set()
    out = {g: {i: float(sums[g][i] / max(count, 1.0)) for i in range(n)} for g in GROUPS}
    out["attn"] = {i: v for i, v in out["attn"].items() if i not in gone_attn}
    out["mlp"] = {i: v for i, v in out["mlp"].items() if i not in gone_mlp}
    out["block"] = {i: v for i, v in out["block"].items() if not (i in gone_attn and i in gone_mlp)}
    return out


@torch.no_grad()
def plain_forward_seconds(enc: Encoder, texts: Sequence[str], batch_size: int = 8,
                          max_length: int | None = None) -> float:
    """Time of one ordinary forward over the same batches, the yardstick for scoring's overhead."""
    enc.eval()
    t0 = time.perf_counter()
    for start in range(0, len(texts), batch_size):
        batch = enc.tokenize(list(texts[start:start + batch_size]), "passage", max_length=max_length)
        enc.model(input_ids=batch["input_ids"].to(enc.device),
                  attention_mask=batch["attention_mask"].to(enc.device), use_cache=False)
    return time.perf_counter() - t0
