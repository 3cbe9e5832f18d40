"""RESULTS.md's section on where a drop takes its MLPs (benchmarks/drop_position.py): the table, and what the
paired intervals say in words, worded from the intervals themselves so the text cannot outrun the numbers."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .section import section_result

RESULTS_FILE = "drop_position.json"


def render_drop_position(results: Path) -> list[str]:
    d = section_result(results / RESULTS_FILE, {"title", "command", "report", "model", "variants", "contrasts"},
                       "benchmarks/drop_position.py")
    return drop_position_section(d) if d is not None else []


def verdict(c: dict) -> str:
    """``a − b`` in words: which costs more, or that the interval cannot tell."""
    if c["high"] < 0:
        return f"{c['a']} scores lower than {c['b']}"
    if c["low"] > 0:
        return f"{c['a']} scores higher than {c['b']}"
    return f"{c['a']} and {c['b']} are not separable"


def drop_position_section(d: dict) -> list[str]:
    table = d["report"]
    model = "SmolLM2 as it ships (no retrieval training)" if d["model"] == "smollm2" else f"`{d['model']}`"
    out = [f"## {d['title']}", "", f"`{d['command']}` ({d.get('code_version')}).", "",
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
