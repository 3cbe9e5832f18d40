"""The quality-vs-speed plot (the shape of EffiR Figure 1): mean nDCG@10 against measured encoding speed-up.

Error bars are the paired bootstrap interval of each model's difference to the reference, drawn around its
score, so overlapping bars mean "not distinguishable on these queries". Points carry numbers and a key beside
the axes: models of one recipe sit close together, where labels written at the points overwrite each other.
The dashed line joins the models no other model beats on both axes. A target (a speed-up and a share of the
reference's score) shades the corner a model must reach, so a bar that dips out of it reads at a glance.
"""
from __future__ import annotations

from pathlib import Path

from ..tune.outcome import pareto_front
from .figure import error_bar, pyplot, save_png

AXES_WIDTH = 6     # inches; the key takes what its longest line needs to the right of them


def plot(table: dict, path: str | Path, speed: str = "document", target: tuple[float, float] | None = None) -> Path:
    """``target``: (speed-up, share of the reference's mean), drawn as the corner to reach."""
    plt = pyplot()
    rows = [r for r in table["rows"] if r["mean"] is not None and speed in r["speed"]]
    if not rows:
        from ..errors import DsPruneError
        raise DsPruneError("nothing to plot: no model has both scores on every task and a bench speed-up")
    key = [f"{n:>2}  {r['label']}" for n, r in enumerate(rows, 1)]
    width = AXES_WIDTH + 0.3 + 0.065 * max(len(k) for k in key)     # inches: 7 pt monospace is ~0.058 in a character
    fig, ax = plt.subplots(figsize=(width, max(4.2, 0.19 * len(key) + 1.2)))
    points = [(r["speed"][speed], r["mean"]) for r in rows]
    for n, (r, (x, y)) in enumerate(zip(rows, points), 1):
        is_ref = r["label"] == table["reference"]
        ax.errorbar([x], [y], yerr=error_bar(r.get("mean_delta")), fmt="*" if is_ref else "o",
                    ms=12 if is_ref else 6, capsize=3, color="tab:red" if is_ref else "tab:blue", alpha=0.85)
        ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 3), fontsize=7)
    front = sorted(pareto_front([{"speed": x, "mean": y} for x, y in points], {"speed": "max", "mean": "max"}),
                   key=lambda i: points[i])
    if len(front) > 1:
        ax.plot([points[i][0] for i in front], [points[i][1] for i in front], "--", color="tab:gray", lw=1,
                zorder=0)
    xs, ys = [x for x, _ in points], [y for _, y in points]
    ref = next((y for r, y in zip(rows, ys) if r["label"] == table["reference"]), None)
    if target is not None and ref is not None:
        fast, share = target
        ax.axvline(fast, color="tab:green", lw=0.8, ls=":")
        ax.axhline(share * ref, color="tab:green", lw=0.8, ls=":")
        ax.fill_between([fast, max(max(xs), fast) * 1.1], share * ref, max(max(ys), share * ref) + 0.01,
                        color="tab:green", alpha=0.08, zorder=0,
                        label=f"target: ≥ {fast:g}× at ≥ {share:g} of {table['reference']}")
        ax.legend(loc="lower left", fontsize=7)
    if max(xs) / max(min(xs), 1e-9) > 4:
        ax.set_xscale("log")     # one far-off fast model would squeeze every pruned model into one column
        times = plt.FuncFormatter(lambda v, _: f"{v:g}×" if f"{v:g}"[0] in "1235" else "")
        ax.xaxis.set_major_formatter(times)
        ax.xaxis.set_minor_formatter(times)
    ax.set_xlabel(f"{speed} encoding speed-up (×, measured)")
    ax.set_ylabel(f"mean nDCG@10 over {len(table['tasks'])} task(s)")
    ax.set_title("quality vs speed")
    ax.grid(alpha=0.3)
    fig.text(AXES_WIDTH / width + 0.01, 0.95, "\n".join(key), va="top", ha="left", fontsize=7,
             family="monospace")
    fig.tight_layout(rect=(0, 0, AXES_WIDTH / width, 1))
    return save_png(fig, path, dpi=120)
