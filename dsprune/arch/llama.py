"""Llama: the pre-norm decoder layout (RMSNorm before each sub-layer, SiLU-gated MLP)."""
from .spec import decoder

FAMILY = decoder("llama")
