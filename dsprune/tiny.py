"""Tiny random models of every supported family, with a tokenizer trained here in a second.

Tests, the tuning smoke sweep and CI use these: no hub, no download, real architectures.
"""
from __future__ import annotations

from pathlib import Path

import torch

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


def tiny_config(family: str, vocab_size: int, layers: int = 4, hidden: int = 64, intermediate: int = 128):
    from transformers import AutoConfig

    common = dict(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=4, max_position_embeddings=512,
                  pad_token_id=0, bos_token_id=1, eos_token_id=2)
    if family == "bert":
        return AutoConfig.for_model("bert", **common, type_vocab_size=1)
    extra = dict(num_key_value_heads=2, head_dim=hidden // 4)
    if family == "gemma3_text":
        extra.update(sliding_window=16, query_pre_attn_scalar=16)
    return AutoConfig.for_model(family, **common, **extra)


def tiny_encoder(family: str = "llama", seed: int = 0, layers: int = 4, pooling: str | None = None,
                 **cfg) -> Encoder:
    """A random tiny model of ``family`` wrapped as an Encoder (fp32, sdpa attention, eager for BERT)."""
    from transformers import AutoModel

    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    config = tiny_config(family, len(tok), layers=layers)
    config._attn_implementation = "sdpa" if family != "bert" else "eager"
    model = AutoModel.from_config(config).eval()
    if pooling is None:
        pooling = "cls" if family == "bert" else "mean"
    cfg.setdefault("max_length", 64)
    return Encoder(model, tok, EncoderConfig(pooling=pooling, **cfg))


def save_tiny(path: str | Path, family: str = "llama", **kw) -> Path:
    enc = tiny_encoder(family, **kw)
    enc.save(path)
    return Path(path)


FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text", "bert")
