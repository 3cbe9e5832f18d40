"""One comparison table over several evaluated models, each difference to the reference with a paired CI.

Reads ``results.json`` (per-query nDCG@10) and ``bench.json`` files; a bench is matched to a result by the
model fingerprint both record, so a speed-up is never attached to a different checkpoint's score. Tasks
without per-query scores (classification, STS) are listed with their main score only: no paired interval.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..eval.bootstrap import paired_bootstrap, paired_bootstrap_tasks

METRIC = "ndcg_at_10"


@dataclass
class Entry:
    label: str
    path: Path
    results: dict
    speed: dict = field(default_factory=dict)   # kind -> speed-up vs the bench baseline, plus flop/param ratios

    @property
    def fingerprint(self) -> str:
        return self.results.get("fingerprint", "")


def read_results(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / formats.RESULTS
    doc = formats.read_json(path, "results file")
    if not isinstance(doc, dict) or "tasks" not in doc:
        raise DsPruneError(f"{path}: not a dsprune results file (no 'tasks' field)")
    return doc


def read_bench(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / formats.BENCH
    doc = formats.read_json(path, "bench file")
    for key in ("fingerprint", "document", "query", "params"):
        if key not in doc:
            raise DsPruneError(f"{path}: not a dsprune bench file (no {key!r} field)")
    return doc


def load_entries(results: list[str], benches: list[str], labels: list[str] | None = None) -> list[Entry]:
    if labels and len(labels) != len(results):
        raise DsPruneError(f"{len(labels)} labels for {len(results)} results files")
    entries = []
    for i, r in enumerate(results):
        doc = read_results(r)
        label = labels[i] if labels else Path(doc.get("model", r)).name
        entries.append(Entry(label, Path(r), doc))
    by_fp = {e.fingerprint: e for e in entries}
    for b in benches:
        doc = read_bench(b)
        model_fp, base_fp = doc["fingerprint"]["model"], doc["fingerprint"]["baseline"]
        if model_fp not in by_fp and base_fp not in by_fp:
            raise DsPruneError(f"{b}: neither its model nor its baseline matches a results file (by fingerprint)")
        if model_fp in by_fp:
            by_fp[model_fp].speed = {"document": doc["document"]["speedup"], "query": doc["query"]["speedup"],
                                     "flop_ratio": doc["document"]["flop_ratio"],
                                     "param_ratio": doc["params"]["ratio"], "baseline_fp": base_fp}
        if base_fp in by_fp and not by_fp[base_fp].speed:
            by_fp[base_fp].speed = {"document": 1.0, "query": 1.0, "flop_ratio": 1.0, "param_ratio": 1.0,
                                    "baseline_fp": base_fp}
    return entries


def compare(entries: list[Entry], reference: int = 0, samples: int = 2000, seed: int = 0) -> dict:
    """Per task and on average: each model's nDCG@10 and its difference to the reference with a paired CI;
    tasks without per-query scores (``other``) carry each model's main score only."""
    ref = entries[reference]
    tasks = [t for t in ref.results["tasks"] if "per_query" in ref.results["tasks"][t]]
    other = [t for t in ref.results["tasks"] if t not in tasks]
    if not tasks and not other:
        raise DsPruneError(f"{ref.path}: the reference has no task")
    rows = []
    for e in entries:
        row = {"label": e.label, "model": e.results.get("model"), "fingerprint": e.fingerprint,
               "params": e.results.get("params"), "speed": e.speed, "tasks": {}}
        pairs = []
        for t in tasks:
            r = e.results["tasks"].get(t)
            if r is None or "per_query" not in r:
                row["tasks"][t] = None
                continue
            a, b = r["per_query"][METRIC], ref.results["tasks"][t]["per_query"][METRIC]
            cell = {"score": r.get(METRIC), "n": len(a)}
            if e is not ref:
                cell["delta"] = paired_bootstrap(a, b, samples, seed)
            row["tasks"][t] = cell
            pairs.append((a, b))
        complete = bool(tasks) and len(pairs) == len(tasks)
        row["mean"] = (sum(row["tasks"][t]["score"] for t in tasks) / len(tasks)) if complete else None
        if complete and e is not ref:
            row["mean_delta"] = paired_bootstrap_tasks(pairs, samples, seed)
        row["other"] = {t: _main(e.results["tasks"].get(t)) for t in other}
        rows.append(row)
    return {"reference": ref.label, "metric": METRIC, "tasks": tasks, "other": other, "rows": rows,
            "samples": samples}


def _main(r: dict | None) -> dict | None:
    if r is None or r.get("main_score") is None:
        return None
    return {"score": r["main_score"], "metric": r.get("main_metric")}


def interval(d: dict) -> str:
    """A paired difference and its interval as every report prints one, ``+0.0123 [-0.0040, +0.0290]``: one
    place, so the tables and claim checks of a report never disagree in digits or signs."""
    return f"{d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"


def scored(score: float | None, delta: dict | None = None) -> str:
    """A score with, when there is one, its difference to the reference in brackets; "–" when missing."""
    if score is None:
        return "–"
    return f"{score:.4f} ({interval(delta)})" if delta else f"{score:.4f}"


def cell(c: dict | None) -> str:
    """One task cell of a comparison row (``{"score", "delta"?}`` or None)."""
    return "–" if c is None else scored(c["score"], c.get("delta"))


def markdown(table: dict) -> str:
    tasks = table["tasks"]
    head = ["model", *tasks, "mean", "doc speed-up", "query speed-up", "FLOP ratio", "params"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in table["rows"]:
        mean = scored(r["mean"], r.get("mean_delta"))
        sp = r["speed"]
        fmt = (lambda k: f"{sp[k]:.2f}×" if k in sp else "–")
        params = f"{r['params'] / 1e6:.1f}M" if r.get("params") else "–"
        lines.append("| " + " | ".join([r["label"], *[cell(r["tasks"][t]) for t in tasks], mean,
                                         fmt("document"), fmt("query"), fmt("flop_ratio"), params]) + " |")
    lines.append("")
    lines.append(f"nDCG@10; in brackets the difference to **{table['reference']}** with its 95 % paired bootstrap "
                 f"interval over queries ({table['samples']} resamples). Speed-ups are measured in one run of "
                 "`dsprune bench` against its baseline.")
    other = table.get("other") or []
    if other:
        metrics = {t: next((r["other"][t]["metric"] for r in table["rows"] if r["other"].get(t)), "") for t in other}
        lines += ["", "| model | " + " | ".join(f"{t} ({metrics[t]})" for t in other) + " |",
                  "|" + "---|" * (len(other) + 1)]
        for r in table["rows"]:
            lines.append("| " + " | ".join([r["label"], *("–" if r["other"][t] is None else
                                                          f"{r['other'][t]['score']:.4f}" for t in other)]) + " |")
        lines += ["", "Tasks without per-query scores (classification, STS): mteb's main score, no interval."]
    return "\n".join(lines)
