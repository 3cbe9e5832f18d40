"""The quality-vs-speed plot (the shape of EffiR Figure 1): mean nDCG@10 against measured encoding speed-up.

Error bars are the paired bootstrap interval of each model's difference to the reference, drawn around its
score, so overlapping bars mean "not distinguishable on these queries".
"""
from __future__ import annotations

from pathlib import Path

from .figure import error_bar, pyplot, save_png


def plot(table: dict, path: str | Path, speed: str = "document") -> Path:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(6, 4.2))
    placed = 0
    for r in table["rows"]:
        if r["mean"] is None or speed not in r["speed"]:
            continue
        x, y = r["speed"][speed], r["mean"]
        yerr = error_bar(r.get("mean_delta"))
        is_ref = r["label"] == table["reference"]
        ax.errorbar([x], [y], yerr=yerr, fmt="*" if is_ref else "o", ms=12 if is_ref else 7, capsize=3,
                    color="tab:red" if is_ref else "tab:blue")
        ax.annotate(r["label"], (x, y), textcoords="offset points", xytext=(6, 6), fontsize=8)
        placed += 1
    if placed == 0:
        from ..errors import DsPruneError
        plt.close(fig)
        raise DsPruneError("nothing to plot: no model has both scores on every task and a bench speed-up")
    ax.set_xlabel(f"{speed} encoding speed-up (×, measured)")
    ax.set_ylabel(f"mean nDCG@10 over {len(table['tasks'])} task(s)")
    ax.set_title("quality vs speed")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path, dpi=120)
