"""RESULTS.md's section on where a drop takes its MLPs (benchmarks/drop_position.py): the table, and what the
paired intervals say in words, worded from the intervals themselves so the text cannot outrun the numbers."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .._common import REPO
from .section import grid_dense_fingerprint, model_with_weights, model_words, remade_dense, section_result

RESULTS_FILES = "drop_position*.json"     # one per model: SmolLM2 as it ships, the dense retriever, ...


def render_drop_position(results: Path, rows: dict[str, dict] | None = None) -> list[str]:
    """The first model's section under the title, every other model's below it as a subsection. ``rows``: the
    grid's rows as ``render.load_results`` reads them from ``results`` (read here when not given)."""
    if rows is None:
        from .render import load_results    # here, not at the top: render imports this module

        rows = load_results(results)
    docs = [d for p in sorted(results.glob(RESULTS_FILES))
            if (d := section_result(p, {"title", "command", "report", "model", "variants", "contrasts"},
                                    "benchmarks/drop_position.py"))]
    grid_dense, remade = grid_dense_fingerprint(results), remade_dense(results)
    grid = grid_drops(rows)
    out = []
    for i, d in enumerate(docs):
        out += drop_position_section(d, heading=None if i == 0 else f"### The same on {model_words(d)}",
                                     grid_dense=grid_dense, remade=remade)
        out += reuse_caveat(d, grid)
    return out


def grid_drops(rows: dict[str, dict]) -> dict[tuple, list[tuple[str, str, float]]]:
    """Untrained grid rows by the MLPs they drop: (row, task, score), to tell a reused stage's model by its
    scores."""
    out: dict[tuple, list] = {}
    for d in rows.values():
        st = d.get("structure") if not d.get("training") else None
        if st and st.get("drop_mlp") and not st.get("drop_attn"):
            out.setdefault(tuple(st["drop_mlp"]), []).extend(
                (d["row"], t, v["ndcg_at_10"]) for t, v in d.get("tasks", {}).items() if "ndcg_at_10" in v)
    return out


def reuse_caveat(d: dict, grid: dict) -> list[str]:
    """Stages reused before reuse matched their inputs' content (a stage log without ``inputs``) may be of an
    earlier model at the same path; a row scoring exactly what a grid row with the same drop scores says so."""
    old = [s["name"] for s in d.get("stages", []) if s.get("reused") and "inputs" not in s]
    if not old:
        return []
    same = []
    for row in d["report"]["rows"]:
        drop = tuple((d["variants"].get(row["label"]) or {}).get("drop_mlp") or ())
        for name, task, score in grid.get(drop, []):
            mine = (row["tasks"].get(task) or {}).get("score")
            if mine is not None and round(mine, 5) == round(score, 5):
                same.append(f"{row['label']} scores {mine:.5f} on {task}, exactly what the grid's `{name}` "
                            "(the same MLPs dropped, no training) scores")
    return [f"Caveat: {len(old)} of its {len(d['stages'])} stages were reused from earlier runs, matched by their "
            "command alone (stages now match their inputs' content as well), so a stage may hold the output of an "
            "earlier model or scores file at the same path; the weights named above are the path's when the "
            "results were collected." + (" " + "; ".join(same) + "." if same else ""), ""]


def reference_words(d: dict) -> str:
    """Where the undropped model's scores come from, and whether its evaluation is known to match the rows': a
    committed results file says its split and length, a file under ``out/`` is no longer there to ask."""
    import json

    ref = d.get("reference_results")
    if not ref:
        return ""
    words = f" *{d['reference']}* is `{ref}`, evaluated before"
    path = REPO / ref
    ev = (json.loads(path.read_text()).get("eval") or {}) if path.is_file() else {}
    if ev.get("max_length") == d["max_length"] and ev.get("split") == "test":
        return words + f" with the same settings (test split, ≤ {d['max_length']} tokens)."
    if ev:
        return words + f" with other settings ({ev}): its intervals compare two evaluations."
    return words + "; its evaluation settings are not recorded, so that they match the rows' is not shown."


def verdict(c: dict) -> str:
    """``a − b`` in words: which costs more, or that the interval cannot tell."""
    if c["high"] < 0:
        return f"{c['a']} scores lower than {c['b']}"
    if c["low"] > 0:
        return f"{c['a']} scores higher than {c['b']}"
    return f"{c['a']} and {c['b']} are not separable"


def drop_position_section(d: dict, heading: str | None = None, grid_dense: str | None = None,
                          remade: dict[str, str] | None = None) -> list[str]:
    """``grid_dense``: the fingerprint of the grid's dense retriever, to say whether ``d`` dropped from it;
    ``remade``: fingerprints of runs that made that retriever again (``section.remade_dense``)."""
    table = d["report"]
    model = model_with_weights(d, grid_dense, remade=remade)
    out = [heading or f"## {d['title']}", "", f"`{d['command']}` ({d.get('code_version')}).", "",
           f"Each row drops MLPs of {model} with `dsprune drop` and the scores `{d['scores']}`, then is evaluated "
           f"at ≤ {d['max_length']} tokens with no training. For the pairs every other layer is protected "
           "(`--protect`), so exactly those two MLPs go; *Drop-N, first k protected* is the drop by importance "
           "with layers 0 to k−1 kept." + reference_words(d), ""]
    out += [compare.markdown(table), "", "| row | MLPs dropped |", "|---|---|"]
    out += [f"| {label} | {', '.join(map(str, v['drop_mlp']))} |" for label, v in d["variants"].items()]
    out += ["", "Differences between rows (paired bootstrap over queries, 95 %; each row is one model, untrained, so "
            "no seed; the drops by importance take the MLPs one scoring run's calibration sample ranked lowest):",
            ""]
    out += [f"- {c['a']} − {c['b']} on {c['task']}: {compare.interval(c)} (p = {c['p']:.3f}): {verdict(c)}."
            for c in d["contrasts"]]
    return out + [""]
