"""Dense retrievers that ``benchmarks/train_dense.py --results NAME`` kept besides the grid's own: another pooling,
or another run of the same, at the dense row's budget. A table whose reference retriever never learned to retrieve says nothing about
dropping, so each run states first whether it beats its untrained start."""
from __future__ import annotations

from pathlib import Path

from dsprune.report.compare import interval

from .section import pooling_words, query_differences, section_result

MADE_BY = "benchmarks/train_dense.py"


def render_dense_runs(results: Path, grid_dense: dict | None = None) -> list[str]:
    """``grid_dense``: the grid's dense row (results/dense.json), named beside each run as the mean-pooled
    retriever of the same script, though from another run."""
    runs = [d for p in sorted(results.glob("train_dense_*.json"))
            if (d := section_result(p, {"command", "encoder", "train", "tasks", "untrained", "trained"}, MADE_BY))]
    if not runs:
        return []
    out = ["## Dense retrievers trained besides the grid's dense row", ""]
    for d in runs:
        tr, t = d["train"], d["tasks"][0]
        delta = d["trained"]["tasks"][t]["delta"]
        word = "beats" if delta["low"] > 0 else "does not clearly beat"
        weights = f", weights {d['model_fingerprint'][:12]}" if d.get("model_fingerprint") else ""
        out += [f"- **{pooling_words(d['encoder'])}** (`{d['command']}`, {d['code_version']}{weights}): SmolLM2 "
                f"trained with "
                f"the script's defaults otherwise, as its command shows ({tr['steps']} LoRA steps, learning rate "
                f"{d['learning_rate']}, "
                f"seed {d['seed']}); loss {tr['first_loss']:.3f} at the first step, {tr['final_loss']:.3f} at the "
                f"last, {tr['train_seconds'] / 60:.0f} min of training. On {t} it scores "
                f"{d['trained']['tasks'][t]['score']:.4f} against {d['untrained']['tasks'][t]['score']:.4f} for the "
                f"untrained model pooled the same way, so it {word} its untrained start: trained − untrained "
                f"{interval(delta)} (paired per query, one training seed)."]
    if grid_dense:
        tr = (grid_dense.get("training") or {}).get("train_dense.py") or {}
        score = (grid_dense.get("tasks") or {}).get("scifact_small", {}).get("ndcg_at_10")
        if score is not None and tr:
            out += [f"- For comparison: the grid's dense row (mean pooling, the same script in "
                    f"another run whose command the row does not keep, model fingerprint "
                    f"{str(grid_dense.get('model_fingerprint'))[:8]}…) scores "
                    f"{score:.4f} on scifact_small, its loss {tr['first_loss']:.3f} → {tr['final_loss']:.3f}."
                    + "".join(same_queries(d, grid_dense) for d in runs)]
    return out + [""]


def same_queries(d: dict, grid_dense: dict) -> str:
    """Whether a run of the same pooling scored every query as the grid's dense row did: the same retriever made
    again, whatever its weights' fingerprint says (it also covers configuration files)."""
    words = [f"on {t} the mean-pooling run above scores " + (
        f"every one of the {n} queries exactly as it does" if not differ else
        f"{differ} of the {n} queries otherwise than it does")
        for t, (differ, n) in query_differences(d, grid_dense).items()]
    return (" Paired per query, " + "; ".join(words) + ".") if words else ""
