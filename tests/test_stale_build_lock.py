"""A lock left in torch's extension cache by a killed build is named before DeepSpeed waits on it."""
import logging
import os
import time

from dsprune import distributed


def _lock(root, name, age_s, build_folder="py311_cpu"):
    lock = root / build_folder / name / "lock" if build_folder else root / name / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    past = time.time() - age_s
    os.utime(lock, (past, past))
    return lock


def test_only_locks_older_than_any_build_are_stale(tmp_path):
    old = _lock(tmp_path, "deepspeed_shm_comm", distributed.STALE_LOCK_S + 60)
    _lock(tmp_path, "cpu_adam", 30)
    assert distributed.stale_build_locks(tmp_path) == [old]


def test_the_warning_names_the_file(tmp_path, monkeypatch, caplog):
    """Under TORCH_EXTENSIONS_DIR torch builds each op in a folder of its own, with no python/accelerator level."""
    old = _lock(tmp_path, "deepspeed_shm_comm", distributed.STALE_LOCK_S + 60, build_folder=None)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="dsprune"):
        distributed.warn_stale_build_locks()
    assert str(old) in caplog.text and "delete it" in caplog.text


def test_a_cache_without_locks_says_nothing(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="dsprune"):
        distributed.warn_stale_build_locks()
    assert caplog.text == ""
