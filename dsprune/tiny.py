"""Tiny random models of every supported family, with a tokenizer trained here in a second.

Tests, the tuning smoke sweep and CI use these: no hub, no download, real architectures.
"""
from __future__ import annotations

from pathlib import Path

import torch

from . import arch
from .encoder import Encoder, EncoderConfig

_TEXT = [
    "the cell membrane regulates transport of ions and proteins",
    "aspirin reduces the risk of heart attack in some patients",
    "revenue grew by ten percent in the fiscal year",
    "the company reported net income and operating cash flow",
    "dense retrieval encodes queries and passages into vectors",
    "pruning removes redundant layers from large language models",
    "gene expression changes during development of the embryo",
    "interest rates affect bond prices and bank margins",
    "what is the capital expenditure of the firm in 2022",
    "a randomized trial found no effect of vitamin d on fractures",
]


def tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE with explicit pad, bos and eos tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_TEXT * 20, trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<s>",
                                   eos_token="</s>", unk_token=None)


def tiny_encoder(family: str = "llama", seed: int = 0, layers: int = 4, pooling: str | None = None,
                 **cfg) -> Encoder:
    """A random tiny model of ``family`` wrapped as an Encoder (fp32; the family's tiny config and pooling)."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    spec = arch.get(family)
    model = AutoModel.from_config(spec.tiny_config(len(tok), layers=layers)).eval()
    if pooling is None:
        pooling = spec.pooling
    cfg.setdefault("max_length", 64)
    return Encoder(model, tok, EncoderConfig(pooling=pooling, **cfg))


def save_tiny(path: str | Path, family: str = "llama", **kw) -> Path:
    enc = tiny_encoder(family, **kw)
    enc.save(path)
    return Path(path)


# The family test matrix: tests run every family test over these (one entry per module of dsprune.arch).
FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "olmo2", "bert")
