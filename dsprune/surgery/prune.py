"""Structural edits on an in-memory Encoder, recorded so that the export rebuilds the same shape.

The first edit wraps the backbone in ``DsPruneModel`` (no weight copy); every later edit updates the
wrapper's config (``drop_attn``, ``drop_mlp``, ``intermediate_sizes``, original layer numbering), so what is
saved is exactly what ran in memory.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

import torch

from .. import formats
from ..encoder import Encoder
from ..errors import DsPruneError
from . import modeling_dsprune as md


def ensure_wrapped(enc: Encoder) -> md.DsPruneModel:
    if not isinstance(enc.model, md.DsPruneModel):
        enc.model = md.DsPruneModel.wrap(enc.model, enc.arch.layout)
    return enc.model


def num_layers(enc: Encoder) -> int:
    return len(enc.arch.layers_of(enc.backbone))


def structure(enc: Encoder) -> dict:
    """What has been pruned so far (empty lists for an unpruned model)."""
    cfg = enc.model.config
    if getattr(cfg, "model_type", None) != "dsprune":
        return {"drop_attn": [], "drop_mlp": [], "intermediate_sizes": intermediate_sizes(enc)}
    return {"drop_attn": list(cfg.drop_attn), "drop_mlp": list(cfg.drop_mlp),
            "intermediate_sizes": intermediate_sizes(enc)}


def intermediate_sizes(enc: Encoder) -> list[int | None]:
    """Width of every layer's MLP (None where the MLP was dropped), original numbering."""
    sizes = []
    fam = enc.arch
    for block in fam.layers_of(enc.backbone):
        try:
            _, up, _ = fam.mlp_projections(block)
            sizes.append(int(up.out_features))
        except AttributeError:
            sizes.append(None)
    return sizes


def drop_sublayers(enc: Encoder, attn: Iterable[int] = (), mlp: Iterable[int] = ()) -> dict:
    """Drop attention and MLP sub-layers (a block is both); refuses indices out of range or already gone."""
    attn, mlp = sorted({int(i) for i in attn}), sorted({int(i) for i in mlp})
    n = num_layers(enc)
    current = structure(enc)
    for kind, idx, gone in (("attention", attn, current["drop_attn"]), ("MLP", mlp, current["drop_mlp"])):
        bad = [i for i in idx if not 0 <= i < n]
        if bad:
            raise DsPruneError(f"{kind} layer index {bad[0]} out of range: the model has {n} layers (0..{n - 1})")
        again = sorted(set(idx) & set(gone))
        if again:
            raise DsPruneError(f"{kind} sub-layer(s) {again} already dropped")
    wrapper = ensure_wrapped(enc)
    layout = enc.arch.layout
    for i in attn:
        md.drop_attention(enc.backbone, layout, i)
    for i in mlp:
        md.drop_mlp(enc.backbone, layout, i)
    wrapper.config.drop_attn = sorted(set(wrapper.config.drop_attn) | set(attn))
    wrapper.config.drop_mlp = sorted(set(wrapper.config.drop_mlp) | set(mlp))
    wrapper.config.intermediate_sizes = intermediate_sizes(enc)
    return structure(enc)


def slice_neurons(enc: Encoder, keep: dict[int, torch.Tensor]) -> dict:
    """Keep only the given MLP neurons per layer (bool masks or index tensors); physically smaller."""
    wrapper = ensure_wrapped(enc)
    widths = intermediate_sizes(enc)
    for layer, k in keep.items():
        layer = int(layer)
        if not 0 <= layer < len(widths) or widths[layer] is None:
            raise DsPruneError(f"mask names MLP layer {layer}, which this model does not have")
        if k.dtype == torch.bool:
            if k.numel() != widths[layer]:
                raise DsPruneError(f"mask for MLP layer {layer} has {k.numel()} entries, layer has {widths[layer]}")
            k = k.nonzero().flatten()
        if len(k) == 0:
            raise DsPruneError(f"mask would remove every neuron of MLP layer {layer}")
        md.slice_mlp(enc.backbone, enc.arch.layout, layer, k)
    wrapper.config.intermediate_sizes = intermediate_sizes(enc)
    return structure(enc)


def count_params(module: torch.nn.Module) -> int:
    return int(sum(p.numel() for p in module.parameters()))


def export(enc: Encoder, out: str | Path, overwrite: bool = False, stage: str = "export",
           inputs: dict | None = None, config: dict | None = None, figures: dict | None = None,
           params_before: int | None = None, write_extra=None, **extra) -> Path:
    """Write a loadable pruned model (weights, tokenizer, encoder config, modeling code, manifest).

    ``write_extra(folder)`` may add files (scores, plots) inside the same atomic write.
    """
    ensure_wrapped(enc)
    params = count_params(enc.model)
    with formats.output_dir(out, overwrite) as tmp:
        enc.save(tmp)
        if write_extra is not None:
            write_extra(tmp)
        formats.write_manifest(tmp, stage, inputs or {}, config or {}, figures,
                               structure=structure(enc),
                               params={"before": params_before, "after": params}, **extra)
    return Path(out)
