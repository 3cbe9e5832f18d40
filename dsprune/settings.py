"""Where things live on this machine: read from the environment, with defaults relative to the checkout."""
from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The shared folder (papers, real data); ``DSPRUNE_SHARED`` overrides the default ``../shared``."""
    return Path(os.environ.get("DSPRUNE_SHARED", REPO_ROOT.parent / "shared")).resolve()


def data_dir(name: str = "") -> Path:
    return shared_dir() / "data" / name if name else shared_dir() / "data"


def models_dir() -> Path:
    """Downloaded models used by their short name (``--model embeddinggemma-300m``); ``DSPRUNE_MODELS`` overrides
    the default ``<checkout>/.cache/models``."""
    return Path(os.environ.get("DSPRUNE_MODELS", REPO_ROOT / ".cache" / "models")).resolve()


def cache_dir() -> Path:
    """Cache for converted GGUF models and compiled ops; ``DSPRUNE_CACHE`` overrides it."""
    p = Path(os.environ.get("DSPRUNE_CACHE", REPO_ROOT / ".cache"))
    p.mkdir(parents=True, exist_ok=True)
    return p


def ray_tmp_dir() -> Path:
    """Ray's session folder; ``DSPRUNE_RAY_TMP`` overrides it. Short on purpose: Ray's socket paths inside it
    must stay under 107 bytes."""
    return Path(os.environ.get("DSPRUNE_RAY_TMP", "/tmp/dsprune-ray")).resolve()
