"""OLMo 2: a norm AFTER each sub-layer (``x + norm(F(x))``), q_norm/k_norm inside attention.

``post_attention_layernorm`` belongs to the attention sub-layer and ``post_feedforward_layernorm`` to the
MLP (both inside F), so a dropped sub-layer takes its norm along and adds nothing. There is no norm before
the MLP, so the stream between attention and MLP is the MLP's own input.
"""
from .spec import decoder

FAMILY = decoder(
    "olmo2",
    attn_norms=("post_attention_layernorm",),
    mlp_norms=("post_feedforward_layernorm",),
    mid=("mlp", "input"),
)
