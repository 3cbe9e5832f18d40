"""RESULTS.md's section for EffiR Table 1 on a trained embedder (``benchmarks/table1_embedder.py``): each drop
against the unpruned model, and attention against MLPs (MLPs against blocks) head to head at each drop count,
with every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare
from dsprune.report.compare import interval

from .section import pooling_words, section_result

KINDS = {"attn": "attention layers", "mlp": "MLPs", "blocks": "blocks"}


def verdict(name: str, d: dict, drops: dict) -> str:
    """One head-to-head pair in words: which kept more, or that the interval does not separate them; the per-task
    intervals too, since a verdict on the mean can rest on some tasks alone."""
    (a, k), (b, _) = (x.rsplit("-", 1) for x in name.split(" vs "))
    drop = drops[f"drop-{a}-{k}"]
    count = len(drop["drop_attn"] or drop["drop_mlp"])
    m = d["mean_delta"]
    if m["low"] > 0:
        word = f"dropping these {KINDS[a]} keeps more than dropping these {KINDS[b]}"
    elif m["high"] < 0:
        word = f"dropping these {KINDS[b]} keeps more than dropping these {KINDS[a]}"
    else:
        word = "the interval does not separate them"
    per_task = ", ".join(f"{t} {interval(x['delta'])}" for t, x in d["tasks"].items())
    return (f"{count} {KINDS[a]} against {count} {KINDS[b]}: {word}; mean nDCG@10 difference {interval(m)} "
            f"(per task: {per_task})")


def render_table1(results: Path) -> list[str]:
    """One section per model the table was run on: EmbeddingGemma first, then each tagged run."""
    out = []
    for p in sorted(results.glob("table1_embedder*.json"), key=lambda p: (p.stem != "table1_embedder", p.stem)):
        out += render_one(p)
    return out


def pooling_of(enc: dict | None) -> str:
    if not enc:
        return "its own pooling and head"
    return pooling_words(enc) + (", then its Dense head" if enc["dense_head"] else "")


def untrained_lines(check: dict | None) -> list[str]:
    """Whether the model is a trained retriever at all: trained − untrained, both pooled alike, paired per query."""
    if not check:
        return []
    t = check["tasks"][0]
    d = check["trained"]["tasks"][t]
    word = "beats" if d["delta"]["low"] > 0 else "does not clearly beat"
    return [f"The model is trained by `{check['command']}`; on {t} it scores {d['score']:.4f} against "
            f"{check['untrained']['tasks'][t]['score']:.4f} untrained (pooled the same way), so it {word} its "
            f"untrained start: {interval(d['delta'])}.", ""]


def render_one(path: Path) -> list[str]:
    made_by = "benchmarks/table1_embedder.py"
    d = section_result(path, {"report", "drops", "pairs", "stages", "command"}, made_by)
    if d is None:
        return []
    via = made_by + (f" --tag {d['tag']}" if d.get("tag") else "")
    rep = d["report"]
    tasks = rep["tasks"]
    head = ["model", "dropped", *tasks, "mean", f"FLOP ratio ({d['flop_seq_len']} tokens)", "params"]
    skipped = "" if "msmarco_trecdl_subset" in tasks else (
        "Scaled: the MS MARCO subset is not evaluated here (its passages are most of the encoding time); ")
    out = [f"## {d['title']}", "",
           f"`{d['command']}` ({d['code_version']}; via `.venv/bin/python {via}`, "
           f"{sum(s.get('seconds') or 0 for s in d['stages']) / 60:.0f} min of stages on 2 CPU cores). No training: "
           "each row is the model with its lowest-scoring sub-layers (1 − cos on 256 calibration texts) removed, "
           f"its encoder kept ({pooling_of(d.get('encoder'))}). {skipped}SciFact is in-domain for the calibration "
           "text (it includes SciFact abstracts). One calibration sample and no training after the drop, so there "
           "is no seed to repeat; the intervals are over queries.", "", *untrained_lines(d.get("untrained_check")),
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
            "a block drop removes the same layers' attention as well as their MLPs. No training, so no training seed: "
            "each pair is the drops of one calibration sample, and its words say only where its query interval "
            "lies.", ""]
    out += [f"- {verdict(name, pair, d['drops'])}." for name, pair in d["pairs"].items()]
    return out + [""]

