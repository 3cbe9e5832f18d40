"""Gemma 3 (text): each sub-layer is wrapped in two norms, one before and one after it.

Both norms belong to the sub-layer (inside F), so dropping it removes both and the stream passes on
unchanged. The stream between attention and MLP is the input of the MLP's pre-norm.
"""
from .spec import decoder, tiny

FAMILY = decoder(
    "gemma3_text",
    attn_norms=("input_layernorm", "post_attention_layernorm"),
    mlp_norms=("pre_feedforward_layernorm", "post_feedforward_layernorm"),
    mid=("pre_feedforward_layernorm", "input"),
    # the multimodal config's text tower has the same blocks
    aliases=("gemma3",),
    tiny_config=tiny("gemma3_text", sliding_window=16, query_pre_attn_scalar=16),
)
