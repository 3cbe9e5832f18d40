"""The on-disk vocabulary every stage shares.

Each command writes a folder with a ``manifest.json``; scores, masks, results and bench output have one
layout each, defined here. Layer indices always refer to the original model's numbering. Folders are
written to a temporary sibling and renamed, so a failed stage never leaves a half-written output.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import fcntl
import glob
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
    """Refuse a user's output folder before any work starts: one that exists (unless overwriting a folder a
    dsprune manifest marks as its own), one that cannot be created, or one another run is writing now. The
    folder is then claimed until it is written (``output_dir``) or the command ends (``claims_released``)."""
    out = Path(out)
    if out.exists():
        if not overwrite:
            raise DsPruneError(f"output folder exists: {out} (pass --overwrite to replace it)")
        check_replaceable(out)
    check_creatable(out)
    if os.environ.get("RANK", "0") == "0":     # the ranks of one launch share their output; rank 0 writes it
        _claim(out)
    return out


def check_replaceable(out: str | os.PathLike, option: str = "--out", marks: tuple[str, ...] = ()) -> None:
    """--overwrite replaces only what dsprune wrote (an empty folder, one with a dsprune manifest or one of
    ``marks``: a training run's arguments file before its manifest exists), never the folder a user works in."""
    out = Path(out)
    if out.is_dir() and Path.cwd().resolve().is_relative_to(out.resolve()):
        raise DsPruneError(f"{option} {out}: refusing to replace the current folder or one above it")
    if not out.is_dir():
        raise DsPruneError(f"{option} {out}: a file, not an output folder; refusing to replace it")
    if not any(out.iterdir()) or any((out / m).is_file() for m in marks):
        return                               # nothing to lose, or dsprune's own unfinished run
    try:
        mark = json.loads((out / MANIFEST).read_text())
    except (OSError, ValueError):
        mark = None
    if not isinstance(mark, dict) or "stage" not in mark:
        raise DsPruneError(f"{option} {out}: no dsprune {MANIFEST} inside, so not a dsprune output; refusing to "
                           f"replace it (remove it yourself or choose another {option})")


def check_creatable(out: str | os.PathLike, option: str = "--out") -> None:
    """``out`` (or, for ``output_dir``, its temporary sibling) must be creatable: found now, not after hours
    of work."""
    out = Path(out)
    place = out.absolute().parent
    while not place.exists() and not place.is_symlink() and place != place.parent:
        place = place.parent
    if not place.is_dir():
        raise DsPruneError(f"{option} {out}: cannot be created under {place}, which is a file")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".dsprune-probe-", dir=place))
    except OSError as e:
        raise DsPruneError(f"{option} {out}: cannot write in {place} ({e.strerror})") from None


_CLAIMS: dict[Path, Any] = {}


def _claim(out: Path) -> None:
    """Hold a lock named after ``out`` for as long as this process writes it, so a second run writing the same
    folder at once fails at its start instead of silently replacing one result with the other. The locks
    live outside ``out``'s folder: taking one writes nothing beside the output."""
    key = out.absolute()
    if key in _CLAIMS:
        return
    import hashlib
    locks = Path(tempfile.gettempdir()) / f"dsprune-{os.getuid()}-outputs"
    locks.mkdir(parents=True, exist_ok=True)
    f = open(locks / (hashlib.sha1(str(key).encode()).hexdigest()[:20] + ".lock"), "a+")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.seek(0)
        holder = f.read().strip()
        f.close()
        raise DsPruneError(f"--out {out}: another run is writing it now ({holder or 'another process'})") from None
    f.truncate(0)
    f.write(f"pid {os.getpid()}")
    f.flush()
    _CLAIMS[key] = f


def release_output(out: str | os.PathLike) -> None:
    """Let other runs write ``out`` again."""
    f = _CLAIMS.pop(Path(out).absolute(), None)
    if f is not None:
        f.close()      # closing drops the lock; the empty lock file stays, so no run locks a stale name


@contextlib.contextmanager
def claims_released() -> Iterator[None]:
    """Output folders claimed inside the block are released when it ends, and only those: a command run
    in-process (tests, the demo) frees what it claimed, not what its caller holds."""
    before = set(_CLAIMS)
    try:
        yield
    finally:
        for key in set(_CLAIMS) - before:
            release_output(key)


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

    Refuses an existing ``out`` unless ``overwrite``; on error, or on SIGTERM/SIGHUP, the temporary folder is
    removed and any previous ``out`` is left untouched. Temporary folders of ``out`` that a killed run left
    are removed first: while ``out`` is claimed, no other run can be writing them.
    """
    out = Path(out)
    if out.exists() and not overwrite:
        raise DsPruneError(f"output folder exists: {out} (pass --overwrite to replace it)")
    if out.exists() and Path.cwd().resolve().is_relative_to(out.resolve()):
        raise DsPruneError(f"{out}: refusing to replace the current folder or one above it")
    if os.environ.get("RANK", "0") == "0":
        _claim(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.absolute() in _CLAIMS:
            for kind in ("tmp", "old"):
                for stale in out.parent.glob(f".{glob.escape(out.name)}.{kind}-*"):
                    shutil.rmtree(stale, ignore_errors=True)
        # a fresh name rather than mkdtemp's 0700 folder: the output gets the usual (umask) permissions
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}")
        tmp.mkdir()
        try:
            with _signals_raise():
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
    finally:
        release_output(out)


@contextlib.contextmanager
def _signals_raise() -> Iterator[None]:
    """Inside the block, SIGTERM and SIGHUP end the process through an exception, so the cleanup around a
    temporary output runs (their default action ends it at once and leaves the partial folder behind). A
    handler someone else installed is left alone."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    taken = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGHUP)
             if signal.getsignal(s) is signal.SIG_DFL}
    try:
        yield
    finally:
        for s, handler in taken.items():
            signal.signal(s, handler)


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


@contextlib.contextmanager
def open_safetensors(path: str | os.PathLike) -> Iterator[Any]:
    """safetensors' reader (``safe_open``) with a damaged or foreign file refused by name in one line."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            yield f
    except SafetensorError as e:
        raise DsPruneError(f"{path}: not a readable safetensors file ({e})") from None


def load_safetensors(path: str | os.PathLike) -> dict:
    """Every tensor of a safetensors file (see ``open_safetensors``)."""
    with open_safetensors(path) as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def read_mask(folder: str | os.PathLike) -> tuple[dict, dict]:
    folder = Path(folder)
    if not (folder / MASK).is_file():
        raise DsPruneError(f"mask not found: {folder / MASK}")
    meta = read_json(folder / MASK_META, "mask metadata")
    return load_safetensors(folder / MASK), meta


def write_mask_scale(folder: str | os.PathLike, tensors: dict[str, Any]) -> None:
    import torch
    from safetensors.torch import save_file

    folder = Path(folder)
    with atomic_file(folder / MASK_SCALE) as tmp:
        save_file({k: v.to(torch.float32).contiguous().cpu() for k, v in tensors.items()}, str(tmp))


def read_mask_scale(folder: str | os.PathLike) -> dict | None:
    """The optional per-neuron values stored beside a structured mask (None when there are none)."""
    path = Path(folder) / MASK_SCALE
    return load_safetensors(path) if path.is_file() else None


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
