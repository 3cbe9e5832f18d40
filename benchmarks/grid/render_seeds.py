"""What the compress-embedder runs say about recovery when the same plan was distilled with more than one seed.

A verdict needs two training seeds whose paired intervals (distilled − the same pruned model, per query)
both exclude 0 on the same side; the words are taken from the intervals, so they cannot outrun them.
"""
from __future__ import annotations

from dsprune.report.compare import interval


def seed_of(doc: dict) -> object:
    return ((doc.get("distill") or {}).get("config") or {}).get("seed")


def same_plan(a: dict, b: dict) -> bool:
    keys = ("attn", "mlp", "slim_ratio", "target_speedup")
    return all(a["plan"].get(k) == b["plan"].get(k) for k in keys)


def recovery_lines(main: dict, variants: list[dict]) -> list[str]:
    """One line per plan that has a recovery pairing: each seed's interval, then the verdict or why none."""
    runs = [main, *variants]
    out, seen = [], set()
    for i, doc in enumerate(runs):
        if i in seen or not (doc.get("recovery") or {}).get("mean_delta"):
            continue
        group = [j for j in range(i, len(runs)) if (runs[j].get("recovery") or {}).get("mean_delta")
                 and same_plan(doc, runs[j])]
        seen.update(group)
        deltas = [(seed_of(runs[j]), runs[j]["recovery"]["mean_delta"]) for j in group]
        name = "the main plan" if i == 0 else f"the {doc['variant']['label']} plan"
        each = "; ".join(f"seed {s}: {interval(d)}" for s, d in deltas)
        out.append(f"  - Recovery at {name} (distilled − no recovery, paired per query, mean over the tasks): "
                   f"{each}. {verdict([d for _, d in deltas], len({s for s, _ in deltas}))}")
    return (["- **Does the distillation recover quality?** A verdict needs two seeds with both intervals on "
             "the same side of 0."] + out) if out else []


def verdict(deltas: list[dict], seeds: int) -> str:
    if seeds < 2:
        return "One training seed: not a verdict."
    if all(d["low"] > 0 for d in deltas):
        return f"Verdict ({seeds} seeds, every interval above 0): the distillation recovers quality at this plan."
    if all(d["high"] < 0 for d in deltas):
        return f"Verdict ({seeds} seeds, every interval below 0): the distillation loses quality at this plan."
    return f"No verdict: the {seeds} seeds' intervals do not all exclude 0 on the same side."
