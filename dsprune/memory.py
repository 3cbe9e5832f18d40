"""What a process really holds: resident memory, host buffers included, which is what gets a rank
OOM-killed on a shared machine (a framework's own tensor counters miss allocator slack and library arenas).

The largest such slack on CPU is glibc's: each time a large block (an activation, a gradient) is freed, glibc
raises its mmap threshold to that block's size (up to 32 MiB), so the blocks after it come from the heap and
stay resident when freed. Holding the threshold low returns them to the system, at the price of more page
faults (no committed run measures either side: the training throughput figures all hold it). On a shared machine an
OOM-killed rank costs more, so the training and DAI entry points hold it; ``DSPRUNE_MMAP_THRESHOLD`` (bytes)
changes the threshold, 0 keeps glibc's behaviour and its speed. ``mallopt`` has no undo, so only an entry
point (a launcher or a command's ``run``) calls ``hold_mmap_threshold``, never a library function.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys

M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter number
DEFAULT_MMAP_THRESHOLD = 1 << 20


def peak_rss_bytes() -> int:
    """This process's peak resident set size."""
    peak = int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    return peak if sys.platform == "darwin" else peak * 1024  # macOS reports bytes, Linux KiB


def current_rss_bytes() -> int:
    """This process's resident set size now (the libraries' share, before a model is loaded)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return peak_rss_bytes()


def hold_mmap_threshold(threshold: int | None = None) -> int:
    """Fix glibc's mmap threshold (blocks above it are returned to the system when freed). Returns the
    threshold set, or 0 when not set (asked for 0, or no glibc: other C libraries do not grow it)."""
    if threshold is None:
        threshold = int(os.environ.get("DSPRUNE_MMAP_THRESHOLD", DEFAULT_MMAP_THRESHOLD))
    if threshold <= 0:
        return 0
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return 0
    return threshold if mallopt(M_MMAP_THRESHOLD, int(threshold)) == 1 else 0
