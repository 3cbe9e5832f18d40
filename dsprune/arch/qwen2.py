"""Qwen2: the Llama layout (its q/k/v projections carry biases, which slicing never touches)."""
from .spec import pre_norm_decoder

FAMILY = pre_norm_decoder("qwen2")
