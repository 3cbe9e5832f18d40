"""RESULTS.md's section for EffiR Table 1 on a trained embedder (``benchmarks/table1_embedder.py``): each drop
against the unpruned model, and attention against MLPs (MLPs against blocks) head to head at each drop count,
with every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare
from dsprune.report.compare import interval

from .section import section_result

KINDS = {"attn": "attention layers", "mlp": "MLPs", "blocks": "blocks"}


def verdict(name: str, d: dict, drops: dict) -> str:
    """One head-to-head pair in words: which kept more, or that the interval does not separate them."""
    (a, k), (b, _) = (x.rsplit("-", 1) for x in name.split(" vs "))
    drop = drops[f"drop-{a}-{k}"]
    count = len(drop["drop_attn"] or drop["drop_mlp"])
    m = d["mean_delta"]
    if m["low"] > 0:
        word = f"dropping {KINDS[a]} keeps more than dropping {KINDS[b]}"
    elif m["high"] < 0:
        word = f"dropping {KINDS[b]} keeps more than dropping {KINDS[a]}"
    else:
        word = "the interval does not separate them"
    return f"{count} {KINDS[a]} against {count} {KINDS[b]}: {word}; mean nDCG@10 difference {interval(m)}"


def render_table1(results: Path) -> list[str]:
    d = section_result(results / "table1_embedder.json", {"report", "drops", "pairs", "stages", "command"},
                       "benchmarks/table1_embedder.py")
    if d is None:
        return []
    rep = d["report"]
    tasks = rep["tasks"]
    head = ["model", "dropped", *tasks, "mean", f"FLOP ratio ({d['flop_seq_len']} tokens)", "params"]
    out = [f"## {d['title']}", "",
           f"`{d['command']}` ({d['code_version']}; via `.venv/bin/python benchmarks/table1_embedder.py`, "
           f"{sum(s.get('seconds') or 0 for s in d['stages']) / 60:.0f} min of stages on 2 CPU cores). No training: "
           "each row is the model with its lowest-scoring sub-layers (1 − cos on 256 calibration texts) removed, "
           "its own pooling and head kept. Scaled: the MS MARCO subset is not evaluated here (its "
           "passages are most of the encoding time); SciFact is in-domain for the calibration text (it includes "
           "SciFact abstracts). One calibration sample and no training, so there is no seed to repeat; the "
           "intervals are over queries.", "",
           "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rep["rows"]:
        drop = d["drops"].get(Path(r.get("model") or "").name, {})   # a drop row's model is its stage folder
        what = ", ".join(f"{k} {v}" for k, v in (("attention", drop.get("drop_attn")), ("MLP", drop.get("drop_mlp")))
                         if v) if drop else "–"
        params = f"{r['params'] / 1e6:.1f}M" if r.get("params") else "–"
        out.append("| " + " | ".join([r["label"], what, *[compare.cell(r["tasks"][t]) for t in tasks],
                                      compare.scored(r["mean"], r.get("mean_delta")),
                                      f"{drop['flop_ratio']:.2f}×" if drop else "1.00×", params]) + " |")
    out += ["", f"nDCG@10; in brackets the difference to **{rep['reference']}** with its 95 % paired bootstrap "
                f"interval over queries ({rep['samples']} resamples), the mean over tasks resampled per task.", "",
            "Head to head at the same drop count (paired per query, mean over the tasks). Equal counts are not "
            "equal savings: an attention sub-layer costs fewer FLOPs than an MLP here (the FLOP ratio column), and "
            "a block drop removes the same layers' attention as well as their MLPs.", ""]
    out += [f"- {verdict(name, pair, d['drops'])}." for name, pair in d["pairs"].items()]
    return out + [""]

