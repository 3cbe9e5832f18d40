"""One rule for every RESULTS.md section that shows a benchmark's JSON: a missing file shows nothing (the
benchmark has not run), a file of another shape is named and skipped, so one stale file never stops the render."""
from __future__ import annotations

import sys
from pathlib import Path

from dsprune import formats


def section_result(p: Path, keys: set[str], made_by: str) -> dict | None:
    """The results document at ``p`` if it has ``keys``; None (with a note naming ``made_by``) otherwise."""
    if not p.is_file():
        return None
    d = formats.read_json(p, f"{made_by} results")
    if not isinstance(d, dict) or not keys <= set(d):
        print(f"note: {p} is not a {made_by} result, ignored", file=sys.stderr)
        return None
    return d


POOLINGS = {"mean": "mean pooling", "last": "the last token", "cls": "the first token"}


def pooling_words(enc: dict) -> str:
    """An encoder's pooling as the sections name it (``enc``: an EncoderConfig's pooling and append_eos)."""
    return POOLINGS[enc["pooling"]] + (" with EOS appended" if enc.get("append_eos") else "")
