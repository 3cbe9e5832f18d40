"""What a process really holds: resident memory, host buffers included, which is what gets a rank
OOM-killed on a shared machine (a framework's own tensor counters miss allocator slack and library arenas)."""
from __future__ import annotations

import resource
import sys


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
