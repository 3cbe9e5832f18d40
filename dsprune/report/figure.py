"""One way to make and save a figure: headless (Agg), so plots work on servers without a display, and saved
atomically, so a reader never sees half a PNG and a failed plot leaves the previous one."""
from __future__ import annotations

from pathlib import Path

from ..formats import atomic_file


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (imported late: matplotlib is only needed for figures)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_png(fig, path: str | Path, dpi: int = 130, **savefig) -> Path:
    """Save ``fig`` to ``path`` atomically and close it."""
    path = Path(path)
    try:
        with atomic_file(path) as tmp:
            fig.savefig(tmp, dpi=dpi, format="png", **savefig)
    finally:
        pyplot().close(fig)
    return path


def error_bar(delta: dict | None) -> list[list[float]] | None:
    """matplotlib's ``yerr`` for a paired difference's interval drawn around a model's own score (not around the
    difference), so the bar reads against the reference's score: below it when the interval is below 0."""
    return [[delta["diff"] - delta["low"]], [delta["high"] - delta["diff"]]] if delta else None
