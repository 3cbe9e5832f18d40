"""Llama: the pre-norm decoder layout (RMSNorm before each sub-layer, SiLU-gated MLP)."""
from .spec import pre_norm_decoder

FAMILY = pre_norm_decoder("llama")
