"""Options several commands share, declared once, and the one way each turns into what the command uses.

``ModelArgs`` is keyword-only so a command's own required options (``--out``, ``--general``, …) may follow
its defaults; its fields come first in every command's ``--help``.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ..log import logger


DTYPES = ("float32", "bfloat16", "float16")   # what the encoder, training and the exports carry


@dataclass(kw_only=True)
class ModelArgs:
    model: str = field(metadata={"help": "HF / sentence-transformers folder, dsprune export, or .gguf file"})
    dtype: str = field(default="float32", metadata={"help": " | ".join(DTYPES)})
    device: str = field(default="cpu", metadata={"help": "cpu, cuda, cuda:1, ..."})


@dataclass(kw_only=True)
class QuantizeArgs(ModelArgs):
    """Post-training quantisation of the model a command scores or times (bench: not its baseline)."""
    quantize: Optional[str] = field(default=None, metadata={"help": "int8: dynamic int8 Linear layers (CPU)"})
    quantize_skip: list[str] = field(default_factory=list, metadata={
        "help": "Linear layers to keep float32, by a part of their module name (e.g. down_proj)"})


@dataclass(kw_only=True)
class EncoderArgs(ModelArgs):
    pooling: str | None = field(default=None, metadata={"help": "override the encoder's pooling (mean|last|cls)"})
    max_length: int | None = field(default=None, metadata={"help": "override the encoder's max length"})


def load_encoder(args: ModelArgs, path: str | None = None, quantize: str | None = None,
                 quantize_skip: Sequence[str] = (), dtype: str | None = None, **overrides):
    """``args.model`` (or ``path``) as an Encoder in ``dtype`` (default ``args.dtype``), ``quantize``d for
    inference if asked (but the Linear layers ``quantize_skip`` names); ``overrides`` replace encoder settings
    (None = keep)."""
    from ..encoder import Encoder, check_quantize, quant_label

    path = args.model if path is None else path
    dtype = dtype or args.dtype
    check_model(args, path, dtype)
    check_quantize(quantize, args.device, dtype, quantize_skip)   # fails before a load is announced
    label = quant_label(quantize, quantize_skip)
    logger.info(f"loading {path}" + (f" ({label})" if label else ""))
    enc = Encoder.load(path, dtype=dtype, device=args.device, quantize=quantize, quantize_skip=quantize_skip)
    enc.configure(**{k: v for k, v in overrides.items() if v is not None})
    logger.debug(f"{path}: {enc.family}, {dtype} on {args.device}, encoder {enc.config}")
    return enc


def weights_of(model: str) -> str:
    """The content id of a model's weights (a short name resolved first): what scores, masks and results say they
    came from, so that another checkpoint at the same path is told apart."""
    from ..eval.mteb_model import fingerprint
    from ..packaged import model_path

    return fingerprint(model_path(model))


def check_model(args: ModelArgs, path: str | None = None, dtype: str | None = None) -> None:
    """Refuse, before any weight is read, what would fail deep inside loading with a traceback, or only after
    it: a dtype dsprune does not carry, a device this machine lacks, a damaged GGUF file, a model family
    dsprune has no module for (read from config.json or the GGUF metadata, not from the loaded model)."""
    check_dtype(dtype or args.dtype)
    check_device(args.device)
    check_model_files(args.model if path is None else path)


def check_dtype(dtype: str, option: str = "--dtype") -> None:
    """A dtype dsprune carries, refused by the option's name before anything loads (a typo deep inside
    ``from_pretrained`` is an AttributeError on torch)."""
    from ..errors import DsPruneError

    if dtype not in DTYPES:
        raise DsPruneError(f"{option} {dtype!r}: choose one of {', '.join(DTYPES)}")


def check_model_files(path: str, what: str = "model") -> None:
    """The model's files, before a loader reads them: there, a GGUF file whole, a family dsprune knows."""
    from .. import arch, formats
    from ..errors import DsPruneError
    from ..packaged import gguf_architecture, model_path

    source = Path(model_path(path))
    if not source.exists():
        raise DsPruneError(f"{what} not found: {source}")
    if source.suffix == ".gguf":
        config, where = {"model_type": gguf_architecture(source)}, source
    elif (source / "config.json").is_file():
        where = source / "config.json"
        config = formats.read_json(where, "model config")
    else:
        return                           # the loader names what is missing
    try:
        arch.family_of(config)
    except DsPruneError as e:
        raise DsPruneError(f"{where}: {e}") from None


def check_device(name: str) -> None:
    """A device torch can name and this machine has: asked of torch's module for the device type
    (``torch.cuda``, ``torch.xpu``, ``torch.cpu``, ...), so every backend is checked the same way."""
    import torch

    from ..errors import DsPruneError

    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise DsPruneError(f"--device {name!r}: not a device name (cpu, cuda, cuda:1, ...)") from None
    backend = getattr(torch, device.type, None)
    available = getattr(backend, "is_available", lambda: False)()
    count = getattr(backend, "device_count", lambda: 0)() if available else 0
    if count == 0:
        raise DsPruneError(f"--device {name}: this machine has no {device.type} device (torch sees none)")
    if device.index is not None and device.index >= count:
        raise DsPruneError(f"--device {name}: this machine has {count} {device.type} device(s)")


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


@contextlib.contextmanager
def torch_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` torch threads (None or 0: as they are), then restore the previous number, so a
    command run in-process (tests, the demo) leaves its caller's setting alone."""
    if not n:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
