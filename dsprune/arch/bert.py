"""BERT: a post-LN encoder with bidirectional attention and an ungated GELU MLP split over two modules.

A sub-layer's output is LN(x + F(x)), so the stream after it is already normalised and its LayerNorm lives
inside the sub-layer's output module: dropping the sub-layer replaces the modules that compute F and the
LayerNorm by pass-throughs, and the stream goes on unchanged.
"""
from .spec import Family, tiny

FAMILY = Family(
    name="bert",
    layers="encoder.layer",
    attn="attention",
    mlp=("intermediate", "output"),
    attn_norms=(),
    mlp_norms=(),
    mid=("attention", "output"),
    gate=None,
    up="intermediate.dense",
    down="output.dense",
    activation="intermediate.intermediate_act_fn",
    post_ln=True,
    causal=False,
    pooling="cls",
    tiny_config=tiny("bert", grouped_query=False, attn_implementation="eager", type_vocab_size=1),
)
