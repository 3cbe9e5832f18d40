"""Mistral: the Llama layout; sliding-window attention does not change where anything lives."""
from .spec import decoder

FAMILY = decoder("mistral")
