"""Which saved step a resumed run may trust.

DeepSpeed's ``latest`` is written by rank 0 as soon as its own files are saved, while other ranks may still be
writing theirs, so a run killed in that window leaves ``latest`` naming a torn checkpoint. Each checkpoint
therefore gets a commit mark, written last once every rank has saved: its files and their sizes. A checkpoint
without the mark, or whose files differ from it, is never loaded. Kept free of torch so that the recipe runner can
ask before it starts a launcher.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from ..errors import DsPruneError

COMMIT = "commit.json"


def files(tag: Path) -> dict[str, int]:
    """A checkpoint's files (relative paths) and their sizes, the mark's own file left out."""
    return {str(p.relative_to(tag)): p.stat().st_size for p in sorted(tag.rglob("*"))
            if p.is_file() and p.name != COMMIT}


def tags(ckdir: Path) -> list[Path]:
    """The checkpoints in ``ckdir``, newest first."""
    found = [p for p in Path(ckdir).glob("step*") if p.is_dir() and p.name[4:].isdigit()]
    return sorted(found, key=lambda p: -int(p.name[4:]))


def torn(tag: Path) -> str | None:
    """Why the checkpoint ``tag`` cannot be trusted, or None when its files are the ones its commit lists."""
    try:
        listed = json.loads((tag / COMMIT).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return "no commit mark: the save did not finish"
    found = files(tag)
    bad = sorted(f for f in set(listed) | set(found) if listed.get(f) != found.get(f))
    if not bad:
        return None
    f, more = bad[0], f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
    if f not in found:
        return f"{f} is missing{more}"
    if f not in listed:
        return f"{f} was not part of the save{more}"
    return f"{f} has {found[f]:,} bytes, {listed[f]:,} when written{more}"


def resumable(ckdir: Path) -> bool:
    """Whether ``ckdir`` holds a checkpoint a resumed run can load."""
    return any(torn(t) is None for t in tags(ckdir))


def complete_checkpoint(ckdir: Path) -> str:
    """The newest checkpoint whose commit mark matches its files; newer torn ones are named in one line (by the
    first rank only)."""
    skipped = []
    for tag in tags(ckdir):
        why = torn(tag)
        if why is None:
            if skipped and os.environ.get("RANK", "0") == "0":
                print(f"--resume: checkpoint {'; '.join(skipped)}; resuming from {tag.name}", flush=True)
            return tag.name
        skipped.append(f"{tag.name} is incomplete ({why})")
    raise DsPruneError(f"--resume: no complete checkpoint in {ckdir}"
                       + (f": {'; '.join(skipped)}" if skipped else "") + " (start again with --overwrite)")
