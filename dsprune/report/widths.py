"""Per-layer MLP widths after self-slimming (EffiR Figure 2b): which layers the global ranking thins.

One line per overall sparsity ratio (the chosen one drawn heavy), x = original layer index, y = kept
neurons; dropped MLPs are marked at 0 so depth and width pruning read on one axis.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .figure import pyplot, save_png


def plot_widths(widths_by_ratio: dict[float, dict[int, int]], full: dict[int, int], num_layers: int,
                path: str | Path, chosen: float | None = None, title: str = "") -> Path:
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(max(6.0, 0.28 * num_layers + 2), 3.8))
    xs = sorted(full)
    ax.plot(xs, [full[i] for i in xs], color="0.6", ls="--", lw=1, label="before (kept MLPs)")
    cmap = plt.get_cmap("viridis")
    ratios = sorted(widths_by_ratio)
    for k, r in enumerate(ratios):
        w = widths_by_ratio[r]
        heavy = chosen is not None and abs(r - chosen) < 1e-12
        ax.plot(xs, [w[i] for i in xs], marker="o", ms=3 if not heavy else 5, lw=2.5 if heavy else 1,
                color="C3" if heavy else cmap(k / max(1, len(ratios) - 1) * 0.85),
                label=f"-{r:.0%}" + (" (mask)" if heavy else ""))
    dropped = [i for i in range(num_layers) if i not in full]
    if dropped:
        ax.scatter(dropped, [0] * len(dropped), marker="x", color="k", s=25, label="MLP dropped", zorder=3)
    ax.set_xlabel("layer (original numbering)")
    ax.set_ylabel("intermediate neurons kept")
    ax.set_xlim(-0.5, num_layers - 0.5)
    from matplotlib.ticker import MaxNLocator
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(bottom=-max(full.values()) * 0.04)
    ax.set_title(title or "MLP width per layer after global gate ranking")
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    return save_png(fig, path)


def plot_gate_histogram(values: dict[int, torch.Tensor], path: str | Path, threshold: float | None = None,
                        title: str = "") -> Path:
    """Histogram of ReLU(z) over all gates (log count), to show how far slimming spread them."""
    plt = pyplot()

    flat = torch.relu(torch.cat([v.flatten().float() for v in values.values()])).numpy()
    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    ax.hist(flat, bins=80, color="C0")
    ax.set_yscale("log")
    if threshold is not None:
        ax.axvline(threshold, color="C3", ls="--", lw=1, label=f"threshold {threshold:g}: "
                                                             f"{(flat < threshold).mean():.1%} below")
        ax.legend(fontsize=8)
    ax.set_xlabel("ReLU(z)")
    ax.set_ylabel("gates")
    ax.set_title(title or f"self-slimming gates (n={flat.size})")
    fig.tight_layout()
    return save_png(fig, path)
