"""What dsprune knows about one model family, as one ``Family`` value per module of this package.

Paths are dotted attribute names: ``layers`` from the backbone (the plain Hugging Face model), every other
path from one block of that list. The structural part (``Family.layout``) is plain JSON data: it is written
into every export's config, so the exported ``modeling_dsprune.py`` can rebuild the pruned shape without
importing dsprune or keeping a family table of its own.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

# What modeling_dsprune needs to drop sub-layers and resize MLPs; the rest of a Family serves dsprune only.
LAYOUT_KEYS = ("layers", "attn", "mlp", "attn_norms", "mlp_norms", "gate", "up", "down", "post_ln")


@dataclass(frozen=True)
class Family:
    name: str                       # the config's model_type; the key of the registry
    layers: str                     # the list of blocks
    attn: str                       # the attention sub-layer
    mlp: str | tuple[str, ...]      # the MLP sub-layer; a tuple when it is split over modules (BERT)
    attn_norms: tuple[str, ...]     # norms inside the attention sub-layer's F: dropped with it
    mlp_norms: tuple[str, ...]      # norms inside the MLP sub-layer's F: dropped with it
    # (module, "input" | "output"): where the residual stream between attention and MLP can be read, for
    # scoring a sub-layer by the streams around it.
    mid: tuple[str, str]
    gate: str | None                # gate projection; None for an ungated MLP down(act(up x))
    up: str
    down: str
    activation: str                 # the module between up (and gate) and down: self-slimming gates wrap it
    # Post-LN blocks (BERT) return LN(x + F(x)): a dropped sub-layer must hand the stream on, not add zeros.
    post_ln: bool
    causal: bool                    # a token attends only to the tokens before it
    tiny_config: Callable           # (vocab_size, layers=4, hidden=64, intermediate=128) -> a random config
    aliases: tuple[str, ...] = ()   # other model_types whose backbone has this layout
    pooling: str = "mean"           # how a new encoder of this family pools when nobody says otherwise

    @property
    def layout(self) -> dict:
        """The structural spec as JSON data (lists, not tuples): what an export's config stores."""
        out = {}
        for key in LAYOUT_KEYS:
            value = getattr(self, key)
            out[key] = list(value) if isinstance(value, tuple) else value
        return out

    @property
    def mlp_parts(self) -> tuple[str, ...]:
        """The module(s) that make up the MLP sub-layer."""
        return (self.mlp,) if isinstance(self.mlp, str) else self.mlp

    @property
    def layer_pattern(self) -> re.Pattern:
        """Finds the layer index in a weight name such as ``layers.7.mlp.up_proj.weight``, prefixed or not."""
        return re.compile(r"(?:^|\.)" + re.escape(self.layers) + r"\.(\d+)\.")

    # modeling_dsprune is imported on use: it imports transformers, which ``import dsprune`` does not need.
    def layers_of(self, backbone):
        from ..surgery import modeling_dsprune as md
        return md.layers_of(backbone, self.layout)

    def mlp_projections(self, block):
        """(gate, up, down) Linears of one block; gate is None for an ungated MLP."""
        from ..surgery import modeling_dsprune as md
        return md.mlp_projections(block, self.layout)


# ---- tiny random configs (tests and CI: real architectures, no download) -----------------------------------

def tiny(model_type: str, grouped_query: bool = True, attn_implementation: str = "sdpa", **extra) -> Callable:
    """A builder of small random configs of ``model_type``: 4 heads (with ``grouped_query``, 2 KV heads),
    512 positions, pad/bos/eos token ids 0/1/2, plus the family's ``extra`` config fields."""
    def build(vocab_size: int, layers: int = 4, hidden: int = 64, intermediate: int = 128):
        from transformers import AutoConfig

        kw = dict(extra)
        if grouped_query:
            kw.update(num_key_value_heads=2, head_dim=hidden // 4)
        config = AutoConfig.for_model(model_type, vocab_size=vocab_size, hidden_size=hidden,
                                      intermediate_size=intermediate, num_hidden_layers=layers,
                                      num_attention_heads=4, max_position_embeddings=512, pad_token_id=0,
                                      bos_token_id=1, eos_token_id=2, **kw)
        config._attn_implementation = attn_implementation
        return config
    return build


def decoder(name: str, **changes) -> Family:
    """A decoder family: the Llama layout (a norm before each sub-layer, a SiLU-gated MLP, causal attention)
    with ``changes`` where the family differs."""
    spec = dict(name=name, layers="layers", attn="self_attn", mlp="mlp", attn_norms=("input_layernorm",),
                mlp_norms=("post_attention_layernorm",), mid=("post_attention_layernorm", "input"),
                gate="mlp.gate_proj", up="mlp.up_proj", down="mlp.down_proj", activation="mlp.act_fn",
                post_ln=False, causal=True, tiny_config=tiny(name))
    spec.update(changes)
    return Family(**spec)
