"""Qwen2: the Llama layout (its q/k/v projections carry biases, which slicing never touches)."""
from .spec import decoder

FAMILY = decoder("qwen2")
