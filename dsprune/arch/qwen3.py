"""Qwen3: the Llama layout; its q_norm/k_norm sit inside the attention module and go with it."""
from .spec import decoder

FAMILY = decoder("qwen3")
