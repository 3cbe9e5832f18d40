"""Pruning methods side by side (GAPrune Tables 1-2 as a figure): one group of bars per setting, one bar per
method, one panel per task.

Each bar's error bar is the paired bootstrap interval of its difference to the setting's reference model,
drawn around its score, and the reference is the dashed line; so a bar whose interval stays below the line lost
quality for sure, and two methods compare by their intervals against the same line.
"""
from __future__ import annotations

from pathlib import Path

from .figure import error_bar, pyplot, save_png


def plot_groups(groups: list[dict], tasks: list[str], path: str | Path, title: str = "") -> Path:
    """``groups``: [{"title", "reference": label, "ref_scores": {task: score},
    "bars": {method: {task: {"score", "delta": {"diff", "low", "high"} | None}}}}]."""
    plt = pyplot()

    from ..errors import DsPruneError

    groups = [g for g in groups if g["bars"]]
    if not groups:
        raise DsPruneError("nothing to plot: no setting has a finished method")
    methods = list(dict.fromkeys(m for g in groups for m in g["bars"]))
    colors = {m: plt.get_cmap("tab10")(i) for i, m in enumerate(methods)}
    width = 0.8 / len(methods)
    fig, axes = plt.subplots(1, len(tasks), figsize=(max(4.5, 2.0 * len(groups)) * len(tasks), 4.6), squeeze=False)
    for ax, task in zip(axes[0], tasks):
        labelled: set[str] = set()
        for gi, g in enumerate(groups):
            ref = g["ref_scores"].get(task)
            if ref is not None:
                ax.hlines(ref, gi - 0.45, gi + 0.45, colors="black", linestyles="dashed", lw=1)
            for mi, m in enumerate(methods):
                cell = (g["bars"].get(m) or {}).get(task)
                if not cell:
                    continue
                x, y = gi - 0.4 + width * (mi + 0.5), cell["score"]
                ax.bar([x], [y], width, yerr=error_bar(cell.get("delta")), capsize=2, error_kw={"lw": 1},
                       color=colors[m], label=None if m in labelled else m)
                labelled.add(m)
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels([f"{g['title']}\n(- - {g['reference']})" for g in groups], fontsize=8)
        ax.set_ylabel(f"{task} nDCG@10")
        ax.grid(axis="y", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(methods), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    return save_png(fig, path, bbox_inches="tight")
