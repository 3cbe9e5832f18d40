"""Shared fixtures: tiny random models of every family, saved once per session."""
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402

from dsprune.tiny import FAMILIES, save_tiny  # noqa: E402

TEXTS = ["the cell membrane regulates transport", "revenue grew by ten percent in the fiscal year 2022",
         "dense retrieval", "what is the capital expenditure of the firm and how did it change"]


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory):
    """family -> folder of a saved tiny model (random weights, local tokenizer)."""
    root = tmp_path_factory.mktemp("tiny")
    return {f: save_tiny(root / f, f) for f in FAMILIES}


@pytest.fixture
def texts():
    return list(TEXTS)
