"""The drop-order heat map (EffiR Figure 2a): where the redundancy sits, layer by layer."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..formats import SCORE_GROUPS
from .figure import pyplot, save_png


def drop_order_heatmap(scores: dict[str, dict], n_layers: int, path: str | Path, title: str = "",
                       chosen: dict[str, list[int]] | None = None) -> Path:
    """Rows attention / MLP / block, one column per original layer; colour = importance (1 − cos),
    number = rank in the drop order (1 = dropped first); hatched cells = chosen for dropping."""
    import matplotlib

    plt = pyplot()

    groups = [g for g in SCORE_GROUPS if g in scores]
    grid = np.full((len(groups), n_layers), np.nan)
    ranks = np.zeros((len(groups), n_layers), dtype=int)
    for r, g in enumerate(groups):
        items = sorted(((int(k), float(v)) for k, v in scores[g].items()), key=lambda kv: (kv[1], kv[0]))
        for rank, (layer, v) in enumerate(items, 1):
            grid[r, layer] = v
            ranks[r, layer] = rank
    fig, ax = plt.subplots(figsize=(max(6, 0.38 * n_layers + 2), 0.7 * len(groups) + 1.6))
    cmap = matplotlib.colormaps["viridis"].with_extremes(bad="lightgrey")
    # Log colours: the first and last layers often score 10-100x the rest and would flatten the middle.
    positive = grid[np.isfinite(grid) & (grid > 0)]
    lo, hi = (positive.min(), positive.max()) if positive.size else (1e-6, 1.0)
    norm = matplotlib.colors.LogNorm(vmin=lo, vmax=max(hi, lo * 1.0001))
    im = ax.imshow(np.ma.masked_invalid(np.where(grid > 0, grid, np.nan if not positive.size else lo)),
                   aspect="auto", cmap=cmap, norm=norm)
    mid = np.sqrt(lo * hi)
    for r in range(len(groups)):
        for c in range(n_layers):
            if ranks[r, c]:
                ax.text(c, r, str(ranks[r, c]), ha="center", va="center", fontsize=7,
                        color="black" if grid[r, c] > mid else "white")
    if chosen:
        for r, g in enumerate(groups):
            for c in chosen.get(g, []):
                ax.add_patch(plt.Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="red", lw=1.6))
    ax.set_yticks(range(len(groups)), [SCORE_GROUPS[g] for g in groups])
    ax.set_xticks(range(n_layers), [str(i) for i in range(n_layers)], fontsize=7)
    ax.set_xlabel("layer (original numbering)")
    ax.set_title(title or "importance 1 − cos(x_in, x_out); numbers = drop order")
    fig.colorbar(im, ax=ax, fraction=0.025, pad=0.01, label="1 − cos (log scale)")
    return save_png(fig, path, bbox_inches="tight")
