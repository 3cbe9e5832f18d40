"""Qwen3: the Llama layout; its q_norm/k_norm sit inside the attention module and go with it."""
from .spec import pre_norm_decoder

FAMILY = pre_norm_decoder("qwen3")
