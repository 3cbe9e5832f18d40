"""Mistral: the Llama layout; sliding-window attention does not change where anything lives."""
from .spec import pre_norm_decoder

FAMILY = pre_norm_decoder("mistral")
