"""The on-disk vocabulary every stage shares.

Each command writes a folder with a ``manifest.json``; scores, masks, results and bench output have one
layout each, defined here. Layer indices always refer to the original model's numbering. Folders are
written to a temporary sibling and renamed, so a failed stage never leaves a half-written output.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import json
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterator

from .errors import DsPruneError

MANIFEST = "manifest.json"
SCORES = "scores.json"
MASK = "mask.safetensors"
MASK_META = "mask.json"
MASK_SCALE = "mask_scale.safetensors"
RESULTS = "results.json"
BENCH = "bench.json"
ENCODER_CONFIG = "dsprune_encoder.json"


def code_version() -> str:
    """Git commit of the dsprune checkout (plus '-dirty'), or the package version."""
    root = Path(__file__).resolve().parents[1]
    try:
        sha = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        if sha:
            return sha + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        pass
    from . import __version__
    return __version__


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` (same suffix, so writers that infer the format still do) that
    replaces ``path`` only if the block finishes: a reader never sees half a file, a failure leaves the old one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a fresh name rather than mkstemp's file, so the writer creates it with the usual (umask) permissions
    tmp = path.with_name(f".{path.stem}.{os.getpid()}-{secrets.token_hex(4)}{path.suffix or '.tmp'}")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def write_text(path: str | os.PathLike, text: str) -> None:
    """Write text atomically (see ``atomic_file``)."""
    with atomic_file(path) as tmp:
        tmp.write_text(text)


def write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON atomically (see ``atomic_file``)."""
    write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n")


def _json_default(o: Any) -> Any:
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "__dataclass_fields__"):
        import dataclasses
        return dataclasses.asdict(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def read_json(path: str | os.PathLike, what: str = "file") -> Any:
    path = Path(path)
    if not path.is_file():
        raise DsPruneError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise DsPruneError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None


def iter_jsonl(path: str | os.PathLike) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a malformed line names the file and line."""
    path = Path(path)
    if not path.is_file():
        raise DsPruneError(f"file not found: {path}")
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            yield n, json_object(line, f"{path}: line {n}")


def json_object(text: str, where: str) -> dict:
    """One JSON object from text; anything else is one error naming where the text came from."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise DsPruneError(f"{where}: malformed JSON ({e.msg})") from None
    if not isinstance(obj, dict):
        raise DsPruneError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_jsonl(path: str | os.PathLike, required: tuple[str, ...] = ()) -> list[dict]:
    """Read a JSONL file; a malformed line or a missing field is reported with file and line number."""
    rows = []
    for n, row in iter_jsonl(path):
        missing = [k for k in required if k not in row]
        if missing:
            raise DsPruneError(f"{path}: line {n}: missing field(s) {', '.join(missing)}")
        rows.append(row)
    return rows


def check_output(out: str | os.PathLike, overwrite: bool = False) -> Path:
    """Refuse an existing output folder before any work starts (unless overwriting)."""
    out = Path(out)
    if out.exists() and not overwrite:
        raise DsPruneError(f"output folder exists: {out} (pass --overwrite to replace it)")
    return out


@contextlib.contextmanager
def exclusive(lock: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive lock on the file ``lock``, so two processes (two ranks of one launch, two runs of one
    recipe) never build the same output at once; the second waits, then finds it made."""
    lock = Path(lock)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


@contextlib.contextmanager
def output_dir(out: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary folder that becomes ``out`` only if the block finishes.

    Refuses an existing ``out`` unless ``overwrite``; on error the temporary folder is removed and any
    previous ``out`` is left untouched.
    """
    out = check_output(out, overwrite)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def manifest(stage: str, inputs: dict, config: dict, figures: dict | None = None, **extra: Any) -> dict:
    """The record every stage writes: what went in, with which settings, which code, what came out."""
    return {
        "stage": stage,
        "inputs": inputs,
        "config": config,
        "figures": figures or {},
        "code_version": code_version(),
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        **extra,
    }


def write_manifest(folder: str | os.PathLike, stage: str, inputs: dict, config: dict,
                   figures: dict | None = None, **extra: Any) -> dict:
    m = manifest(stage, inputs, config, figures, **extra)
    write_json(Path(folder) / MANIFEST, m)
    return m


def read_manifest(folder: str | os.PathLike) -> dict:
    return read_json(Path(folder) / MANIFEST, "manifest")


# ---- scores.json -------------------------------------------------------------------------------------
# {"model": ..., "num_layers": L, "layer_ids": [...original ids...],
#  "scores": {"attn": {"<layer>": s, ...}, "mlp": {...}, "block": {...}},
#  "order":  {"attn": [least important first...], "mlp": [...], "block": [...]},
#  "history": [...]  # iterative scoring: one entry per drop step}
SCORE_GROUPS = {"attn": "attention", "mlp": "MLP", "block": "block"}   # the groups, in order, and their names

def drop_order(scores: dict[str, float]) -> list[int]:
    """Least important first; ties broken by layer index so the order is deterministic."""
    return [int(k) for k, _ in sorted(scores.items(), key=lambda kv: (kv[1], int(kv[0])))]


def write_scores(folder: str | os.PathLike, scores: dict[str, dict[int, float]], **extra: Any) -> dict:
    doc = {
        "scores": {g: {str(k): float(v) for k, v in s.items()} for g, s in scores.items()},
        "order": {g: drop_order({str(k): v for k, v in s.items()}) for g, s in scores.items()},
        **extra,
    }
    write_json(Path(folder) / SCORES, doc)
    return doc


def read_scores(path: str | os.PathLike) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / SCORES
    doc = read_json(path, "scores file")
    for key in ("scores", "order"):
        if key not in doc:
            raise DsPruneError(f"{path}: missing field '{key}'")
    return doc


# ---- masks --------------------------------------------------------------------------------------------
# mask.safetensors: one 0/1 tensor per masked weight or per MLP neuron set.
#   structured:   "mlp.<layer>" -> bool[intermediate] (neurons kept), layer = original index
#   unstructured: "<parameter name>" -> bool[shape of the weight] (weights kept)
# mask.json: {"kind": "structured"|"unstructured", "method": ..., "ratio": r, "kept": n, "total": N, ...}
# mask_scale.safetensors (optional, structured only): "mlp.<layer>" -> float[intermediate], a value per
#   neuron folded into the weights before the masked neurons are removed (self-slimming's gate values).

def write_mask(folder: str | os.PathLike, tensors: dict[str, Any], kind: str, **meta: Any) -> None:
    import torch
    from safetensors.torch import save_file

    if kind not in ("structured", "unstructured"):
        raise DsPruneError(f"mask kind must be 'structured' or 'unstructured', not {kind!r}")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.to(torch.bool).contiguous().cpu() for k, v in tensors.items()}
    kept = int(sum(int(v.sum()) for v in tensors.values()))
    total = int(sum(v.numel() for v in tensors.values()))
    with atomic_file(folder / MASK) as tmp:
        save_file(tensors, str(tmp))
    write_json(folder / MASK_META, {"kind": kind, "kept": kept, "total": total, **meta})


def read_mask(folder: str | os.PathLike) -> tuple[dict, dict]:
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / MASK).is_file():
        raise DsPruneError(f"mask not found: {folder / MASK}")
    meta = read_json(folder / MASK_META, "mask metadata")
    return load_file(str(folder / MASK)), meta


def write_mask_scale(folder: str | os.PathLike, tensors: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    with atomic_file(folder / MASK_SCALE) as tmp:
        save_file({k: v.to(torch.float32).contiguous().cpu() for k, v in tensors.items()}, str(tmp))


def read_mask_scale(folder: str | os.PathLike) -> dict | None:
    """The optional per-neuron values stored beside a structured mask (None when there are none)."""
    from safetensors.torch import load_file

    path = Path(folder) / MASK_SCALE
    return load_file(str(path)) if path.is_file() else None


def mlp_key(layer: int) -> str:
    return f"mlp.{int(layer)}"


# ---- results.json / bench.json -----------------------------------------------------------------------
# results.json: {"model": dir, "tasks": {task: {"type": ..., "main_score": x, "main_metric": ..., "scores": {...},
#                 retrieval only: "ndcg_at_10": x, "recall_at_100": y, "per_query": {"ndcg_at_10": {qid: v}}}}, ...}
# bench.json:   {"model": dir, "baseline": dir, "query": {...}, "document": {...}, "params": ..., "flops": ...}

def write_results(folder: str | os.PathLike, doc: dict) -> None:
    write_json(Path(folder) / RESULTS, doc)


def write_bench(folder: str | os.PathLike, doc: dict) -> None:
    write_json(Path(folder) / BENCH, doc)
