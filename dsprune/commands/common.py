"""Options every model-reading command shares, and the one way they turn into an Encoder."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..encoder import Encoder


@dataclass
class ModelArgs:
    model: str = field(metadata={"help": "HF / sentence-transformers folder, dsprune export, or .gguf file"})
    dtype: str = field(default="float32", metadata={"help": "float32 | bfloat16 | float16"})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1, ..."})
    pooling: str | None = field(default=None, metadata={"help": "override the encoder's pooling (mean|last|cls)"})
    max_length: int | None = field(default=None, metadata={"help": "override the encoder's max length"})


def load_encoder(args: ModelArgs) -> Encoder:
    enc = Encoder.load(args.model, dtype=args.dtype, device=args.device)
    if args.pooling is not None:
        enc.config.pooling = args.pooling
        enc.config.__post_init__()
    if args.max_length is not None:
        enc.config.max_length = args.max_length
    return enc


@dataclass
class CalibArgs:
    calib: str | None = field(default=None, metadata={"help": "calibration text (.txt or .jsonl); default: "
                                                              "MS MARCO passages + SciFact abstracts from shared data"})
    n_samples: int = field(default=256, metadata={"help": "number of calibration texts"})
    calib_max_length: int = field(default=256, metadata={"help": "tokens per calibration text"})
    batch_size: int = 8
    seed: int = 0


def calibration_texts(args: CalibArgs) -> list[str]:
    from ..data import default_calibration, load_texts
    from ..errors import DsPruneError

    if args.n_samples < 1:
        raise DsPruneError(f"n_samples must be at least 1, not {args.n_samples}")
    if args.calib:
        return load_texts(args.calib, args.n_samples, args.seed)
    return default_calibration(args.n_samples, args.seed)
