"""A pruned model that loads anywhere: ``AutoModel.from_pretrained(dir, trust_remote_code=True)``.

This file is copied verbatim into every dsprune export, so it imports only torch and transformers. It is
also the single definition of the structural edits dsprune makes (drop a sub-layer, give a layer its own
MLP width), used in memory by dsprune and at load time by the export: the two cannot drift apart.

Where a family keeps its parts (``layout``: the dotted paths of its block list, attention, MLP, the norms
inside each sub-layer, gate/up/down, and whether blocks are post-LN) is plain data that dsprune writes into
the export's config, so this file needs no table of families.

A pruned model keeps the original layer numbering. A dropped attention or MLP sub-layer is replaced by a
parameter-free module that adds nothing to the residual stream (its norms go too), so its weights are gone
from disk; a dropped block is both. Per-layer MLP widths (non-uniform after a global neuron ranking, which
Hugging Face configs cannot express) are recorded in ``intermediate_sizes`` and rebuilt here.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from transformers import AutoConfig, AutoModel, PretrainedConfig, PreTrainedModel


def get_module(root: nn.Module, dotted: str) -> nn.Module:
    for part in dotted.split("."):
        root = getattr(root, part)
    return root


def set_module(root: nn.Module, dotted: str, module: nn.Module) -> None:
    *parents, last = dotted.split(".")
    for part in parents:
        root = getattr(root, part)
    setattr(root, last, module)


def layers_of(backbone: nn.Module, layout: dict) -> nn.ModuleList:
    return get_module(backbone, layout["layers"])


class DroppedAttention(nn.Module):
    """An attention sub-layer that was dropped: adds nothing to the residual stream."""

    def __init__(self, post_ln: bool = False):
        super().__init__()
        self.post_ln = post_ln

    def forward(self, hidden_states, *args, **kwargs):
        # Post-LN blocks (BERT) return the new stream itself; pre-LN blocks add our output to it.
        out = hidden_states if self.post_ln else torch.zeros_like(hidden_states)
        return out, None


class DroppedMLP(nn.Module):
    """An MLP sub-layer that was dropped: adds nothing to the residual stream."""

    def forward(self, hidden_states, *args, **kwargs):
        return torch.zeros_like(hidden_states)


class PassThrough(nn.Module):
    """BERT's FFN halves once dropped: ``intermediate`` passes its input, ``output`` returns the stream."""

    def forward(self, hidden_states, input_tensor=None):
        return hidden_states if input_tensor is None else input_tensor


def drop_attention(backbone: nn.Module, layout: dict, layer: int) -> None:
    block = layers_of(backbone, layout)[layer]
    set_module(block, layout["attn"], DroppedAttention(post_ln=layout["post_ln"]))
    for name in layout["attn_norms"]:
        set_module(block, name, nn.Identity())


def drop_mlp(backbone: nn.Module, layout: dict, layer: int) -> None:
    block = layers_of(backbone, layout)[layer]
    if isinstance(layout["mlp"], str):
        set_module(block, layout["mlp"], DroppedMLP())
    else:  # an MLP split over several modules (BERT's intermediate + output)
        for name in layout["mlp"]:
            set_module(block, name, PassThrough())
    for name in layout["mlp_norms"]:
        set_module(block, name, nn.Identity())


def mlp_projections(block: nn.Module, layout: dict) -> tuple[nn.Linear | None, nn.Linear, nn.Linear]:
    """(gate, up, down) of one block; gate is None for families without a gated MLP."""
    gate = get_module(block, layout["gate"]) if layout["gate"] else None
    return gate, get_module(block, layout["up"]), get_module(block, layout["down"])


def _linear_like(old: nn.Linear, in_f: int, out_f: int) -> nn.Linear:
    return nn.Linear(in_f, out_f, bias=old.bias is not None, device=old.weight.device, dtype=old.weight.dtype)


def slice_mlp(backbone: nn.Module, layout: dict, layer: int, keep: torch.Tensor | None,
              width: int | None = None) -> None:
    """Give one MLP its own width: keep neurons ``keep`` (indices), or build empty ones of ``width``."""
    block = layers_of(backbone, layout)[layer]
    gate, up, down = mlp_projections(block, layout)
    n = len(keep) if keep is not None else width
    new = {}
    for name, old in (("gate", gate), ("up", up)):
        if old is None:
            continue
        lin = _linear_like(old, old.in_features, n)
        if keep is not None:
            with torch.no_grad():
                lin.weight.copy_(old.weight[keep])
                if old.bias is not None:
                    lin.bias.copy_(old.bias[keep])
        new[name] = lin
    lin = _linear_like(down, n, down.out_features)
    if keep is not None:
        with torch.no_grad():
            lin.weight.copy_(down.weight[:, keep])
            if down.bias is not None:
                lin.bias.copy_(down.bias)
    new["down"] = lin
    for name, mod in new.items():
        set_module(block, layout[name], mod)


def apply_structure(backbone: nn.Module, layout: dict, drop_attn=(), drop_mlp_layers=(),
                    intermediate_sizes=None) -> None:
    """Rebuild the pruned shape on a freshly built model (weights are loaded afterwards)."""
    for i in drop_attn:
        drop_attention(backbone, layout, int(i))
    for i in drop_mlp_layers:
        drop_mlp(backbone, layout, int(i))
    if intermediate_sizes:
        dropped = {int(i) for i in drop_mlp_layers}
        for i, width in enumerate(intermediate_sizes):
            if i in dropped or width is None:
                continue
            _, up, _ = mlp_projections(layers_of(backbone, layout)[i], layout)
            if up.out_features != width:
                slice_mlp(backbone, layout, i, None, width=int(width))


class DsPruneConfig(PretrainedConfig):
    """The original model's config (``base``), where its family keeps its parts (``layout``) and what was
    pruned, in the original layer numbering."""

    model_type = "dsprune"

    def __init__(self, base: dict | None = None, drop_attn=(), drop_mlp=(), intermediate_sizes=None,
                 layout: dict | None = None, **kwargs):
        self.base = dict(base or {})
        self.layout = dict(layout) if layout else None
        self.drop_attn = sorted(int(i) for i in drop_attn)
        self.drop_mlp = sorted(int(i) for i in drop_mlp)
        self.intermediate_sizes = list(intermediate_sizes) if intermediate_sizes is not None else None
        for key in ("hidden_size", "num_hidden_layers", "vocab_size", "max_position_embeddings",
                    "pad_token_id", "eos_token_id", "bos_token_id"):
            if key in self.base and key not in kwargs:
                kwargs[key] = self.base[key]
        super().__init__(**kwargs)

    def base_config(self) -> PretrainedConfig:
        base = copy.deepcopy(self.base)
        return AutoConfig.for_model(base.pop("model_type"), **base)


class DsPruneModel(PreTrainedModel):
    """The original architecture with dropped sub-layers and per-layer MLP widths; same outputs."""

    config_class = DsPruneConfig
    base_model_prefix = "backbone"
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_attention_backend = True

    def __init__(self, config: DsPruneConfig, backbone: nn.Module | None = None):
        super().__init__(config)
        if backbone is None:  # loading: rebuild the pruned shape, weights follow from the checkpoint
            base = config.base_config()
            if getattr(config, "_attn_implementation_internal", None):
                base._attn_implementation = config._attn_implementation
            if not config.layout:
                raise ValueError("this export's config.json has no 'layout'; load it once with dsprune's "
                                 "Encoder.load and save it again")
            # from_pretrained builds under the dtype it was asked for; from_config would take the dtype the
            # base config recorded instead
            backbone = AutoModel.from_config(base, dtype=torch.get_default_dtype())
            apply_structure(backbone, config.layout, config.drop_attn, config.drop_mlp,
                            config.intermediate_sizes)
        self.backbone = backbone
        self.post_init()

    @classmethod
    def wrap(cls, backbone: nn.Module, layout: dict) -> "DsPruneModel":
        """Wrap an in-memory model (not yet pruned) without copying its weights."""
        cfg = DsPruneConfig(base=backbone.config.to_dict(), intermediate_sizes=None, layout=layout)
        cfg.auto_map = {"AutoConfig": "modeling_dsprune.DsPruneConfig",
                        "AutoModel": "modeling_dsprune.DsPruneModel"}
        return cls(cfg, backbone=backbone)

    def _init_weights(self, module):
        # Every weight comes from the checkpoint; the backbone initialises itself when built fresh.
        pass

    def get_input_embeddings(self):
        return self.backbone.get_input_embeddings()

    def set_input_embeddings(self, value):
        self.backbone.set_input_embeddings(value)

    def forward(self, *args, **kwargs):
        return self.backbone(*args, **kwargs)
