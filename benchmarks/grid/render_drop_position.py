"""RESULTS.md's section on where a drop takes its MLPs (benchmarks/drop_position.py): the table, and what the
paired intervals say in words, worded from the intervals themselves so the text cannot outrun the numbers."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .section import grid_dense_fingerprint, model_with_weights, model_words, section_result

RESULTS_FILES = "drop_position*.json"     # one per model: SmolLM2 as it ships, the dense retriever, ...


def render_drop_position(results: Path) -> list[str]:
    """The first model's section under the title, every other model's below it as a subsection."""
    docs = [d for p in sorted(results.glob(RESULTS_FILES))
            if (d := section_result(p, {"title", "command", "report", "model", "variants", "contrasts"},
                                    "benchmarks/drop_position.py"))]
    grid_dense = grid_dense_fingerprint(results)
    out = []
    for i, d in enumerate(docs):
        out += drop_position_section(d, heading=None if i == 0 else f"### The same on {model_words(d)}",
                                     grid_dense=grid_dense)
    return out


def verdict(c: dict) -> str:
    """``a − b`` in words: which costs more, or that the interval cannot tell."""
    if c["high"] < 0:
        return f"{c['a']} scores lower than {c['b']}"
    if c["low"] > 0:
        return f"{c['a']} scores higher than {c['b']}"
    return f"{c['a']} and {c['b']} are not separable"


def drop_position_section(d: dict, heading: str | None = None, grid_dense: str | None = None) -> list[str]:
    """``grid_dense``: the fingerprint of the grid's dense retriever, to say whether ``d`` dropped from it."""
    table = d["report"]
    model = model_with_weights(d, grid_dense)
    out = [heading or f"## {d['title']}", "", f"`{d['command']}` ({d.get('code_version')}).", "",
           f"Each row drops MLPs of {model} with `dsprune drop` and the scores `{d['scores']}`, then is evaluated "
           f"at ≤ {d['max_length']} tokens with no training. For the pairs every other layer is protected "
           "(`--protect`), so exactly those two MLPs go; *Drop-N, first k protected* is the drop by importance "
           "with layers 0 to k−1 kept." + (f" *{d['reference']}* is `{d['reference_results']}`, evaluated before "
                                            "with the same settings." if d.get("reference_results") else ""), ""]
    out += [compare.markdown(table), "", "| row | MLPs dropped |", "|---|---|"]
    out += [f"| {label} | {', '.join(map(str, v['drop_mlp']))} |" for label, v in d["variants"].items()]
    out += ["", "Differences between rows (paired bootstrap over queries, 95 %):", ""]
    out += [f"- {c['a']} − {c['b']} on {c['task']}: {compare.interval(c)} (p = {c['p']:.3f}): {verdict(c)}."
            for c in d["contrasts"]]
    return out + [""]
