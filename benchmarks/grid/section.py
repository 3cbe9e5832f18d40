"""One rule for every RESULTS.md section that shows a benchmark's JSON: a missing file shows nothing (the
benchmark has not run), a file of another shape is named and skipped, so one stale file never stops the render;
and what a grid row's JSON says of its training (seeds, mined groups), which several sections compare."""
from __future__ import annotations

import sys
from pathlib import Path

from dsprune import formats


def section_result(p: Path, keys: set[str], made_by: str) -> dict | None:
    """The results document at ``p`` if it has ``keys``; None (with a note naming ``made_by``) otherwise."""
    if not p.is_file():
        return None
    d = formats.read_json(p, f"{made_by} results")
    if not isinstance(d, dict) or not keys <= set(d):
        print(f"note: {p} is not a {made_by} result, ignored", file=sys.stderr)
        return None
    return d


def grid_dense_fingerprint(results: Path) -> str | None:
    """The weights fingerprint of the grid's dense row, to tell whether another benchmark's model is that one."""
    dense = section_result(results / "dense.json", {"model_fingerprint"}, "benchmarks/reproduce.py")
    return dense["model_fingerprint"] if dense else None


def model_words(d: dict) -> str:
    """The model a benchmark's results document (``model``) ran on, as the sections name it."""
    return "SmolLM2 as it ships (no retrieval training)" if d["model"] == "smollm2" else f"`{d['model']}`"


def query_differences(run: dict, grid_dense: dict) -> dict[str, tuple[int, int]]:
    """task -> (queries scored otherwise, queries) between a mean-pooled ``benchmarks/train_dense.py`` run's
    trained model and the grid's dense row, on the tasks both scored on the same queries."""
    if run["encoder"].get("pooling") != "mean":
        return {}
    out = {}
    for t, r in ((run.get("trained_scores") or {}).get("tasks") or {}).items():
        mine = r["per_query"]["ndcg_at_10"]
        theirs = ((grid_dense.get("tasks") or {}).get(t) or {}).get("per_query", {}).get("ndcg_at_10")
        if theirs is not None and set(theirs) == set(mine):
            out[t] = (sum(mine[q] != theirs[q] for q in mine), len(mine))
    return out


def remade_dense(results: Path) -> dict[str, str]:
    """Weights fingerprint -> where it shows, for each dense retriever ``benchmarks/train_dense.py`` made again
    that scores every query as the grid's dense row does: another fingerprint, the same retriever by what is
    kept."""
    dense = section_result(results / "dense.json", {"tasks"}, "benchmarks/reproduce.py")
    out = {}
    for p in sorted(results.glob("train_dense_*.json")) if dense else []:
        run = formats.read_json(p, "benchmarks/train_dense.py results")
        diffs = query_differences(run, dense) if run.get("model_fingerprint") else {}
        if diffs and not any(n for n, _ in diffs.values()):
            out[run["model_fingerprint"]] = f"on {', '.join(diffs)} (`{p.name}`)"
    return out


def model_with_weights(d: dict, grid_dense: str | None,
                       differs: str = "whose drops are not the grid rows' models",
                       remade: dict[str, str] | None = None) -> str:
    """``model_words`` and, for a model at a path, its weights and whether they are the grid's dense row's
    (``grid_dense``; else ``differs`` says what that means, unless ``remade``, from ``remade_dense``, names a run
    that scores as the row does): the dense retriever's path may hold another training run."""
    model, fp = model_words(d), d.get("model_fingerprint")
    again = (remade or {}).get(fp)
    if fp and d["model"] != "smollm2":
        model += f" (weights {fp[:12]}" + (
            "" if grid_dense is None else
            ", the grid's dense row" if fp == grid_dense else
            f"; not the grid's dense row's fingerprint, {grid_dense[:12]}, but a training run that scores every "
            f"query as that row does {again}" if again else
            f"; not the grid's dense row, {grid_dense[:12]}: another training run, {differs}") + ")"
    return model


POOLINGS = {"mean": "mean pooling", "last": "the last token", "cls": "the first token"}


def pooling_words(enc: dict) -> str:
    """An encoder's pooling as the sections name it (``enc``: an EncoderConfig's pooling and append_eos)."""
    return POOLINGS[enc["pooling"]] + (" with EOS appended" if enc.get("append_eos") else "")


def groups_of(doc: dict) -> str | None:
    """The fingerprint of the mined groups a row trained on (older rows keep it bare, newer with its path)."""
    g = (doc.get("inputs") or {}).get("train_groups")
    return g.get("fingerprint") if isinstance(g, dict) else g


def training_seed_list(doc: dict) -> list[str]:
    """The training seed(s) of a row (a verdict needs two), its own first: kept with its training, or read from
    the training stage's command in rows made before the seed was kept."""
    import shlex
    commands = {st.get("name"): st.get("command") for st in doc.get("stages") or []}
    seeds = []
    for name, run in (doc.get("training") or {}).items():
        seed = run.get("seed")
        if seed is None and commands.get(name):
            argv = shlex.split(commands[name])
            seed = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--seed"), None)
        seed = "not kept" if seed is None else str(seed)
        if seed not in seeds:
            seeds.append(seed)
    return seeds + [str(x) for x in doc.get("other_seeds") or {}]


def training_seeds(doc: dict) -> str:
    """``training_seed_list`` as the tables' seed column shows it."""
    return ", ".join(training_seed_list(doc)) or "–"
