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


# Modules that start DeepSpeed, Ray or many stage processes, longest first. Under pytest-xdist (`make test` runs
# `-n 2 --dist loadfile --no-loadscope-reorder`) a module runs whole on one worker; starting the long ones first
# keeps one worker from running the longest module alone at the end.
LONGEST_FIRST = ["test_tune_sweep", "test_multinode", "test_train_launcher", "test_tune_optuna",
                 "test_distill_launcher", "test_ray_cluster", "test_recipe", "test_gaprune_retrain", "test_quantize",
                 "test_slim_launcher", "test_gaprune_zero3", "test_st_export", "test_grad_cache", "test_export",
                 "test_reproduce", "test_demo", "test_logging"]


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rpartition(".")[2], len(rank)))
