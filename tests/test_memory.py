"""dsprune holds glibc's mmap threshold for training (dsprune.memory); 0 leaves glibc alone."""
import ctypes.util
import sys

import pytest

from dsprune import memory


@pytest.mark.skipif(not sys.platform.startswith("linux") or not ctypes.util.find_library("c"), reason="glibc")
def test_threshold_is_held_on_glibc(monkeypatch):
    monkeypatch.delenv("DSPRUNE_MMAP_THRESHOLD", raising=False)
    assert memory.hold_mmap_threshold() == memory.DEFAULT_MMAP_THRESHOLD
    monkeypatch.setenv("DSPRUNE_MMAP_THRESHOLD", str(4 << 20))
    assert memory.hold_mmap_threshold() == 4 << 20


def test_zero_keeps_glibc_default(monkeypatch):
    monkeypatch.setenv("DSPRUNE_MMAP_THRESHOLD", "0")
    assert memory.hold_mmap_threshold() == 0
    assert memory.hold_mmap_threshold(0) == 0


def test_rss_figures_are_real():
    block = bytearray(64 << 20)  # touched: resident
    assert memory.current_rss_bytes() > 64 << 20 and memory.peak_rss_bytes() > 64 << 20
    del block
