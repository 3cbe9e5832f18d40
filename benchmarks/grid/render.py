"""RESULTS.md from the rows' results JSON files: one table per paper table (nDCG@10 with the paired bootstrap
interval of the difference to the table's reference row, pending rows marked), the papers' claims checked
pair by pair, the drop-order heat maps, the quality-vs-speed and GAPrune-methods figures, other model families
(``benchmarks/family.py``) and each row's provenance. Rendering reads only committed files, so it can run
anywhere, and writes RESULTS.md and the figures through temporary names."""
from __future__ import annotations

import os
import re
import statistics
import sys
from pathlib import Path

from dsprune import formats
from dsprune.errors import DsPruneError
from dsprune.eval.bootstrap import paired_bootstrap
from dsprune.report import compare, front, methods
from dsprune.report.compare import interval

from .._common import REPO
from .render_dai_modes import dai_tag, render_dai_modes
from .render_drop_position import render_drop_position
from .render_first_loss import effir_start_lines
from .render_seeds import another_seed, comparison_lines, family, recovery_lines, target_lines
from .render_seeds import verdict as seed_verdict
from .render_overlap import render_overlap
from .render_gaprune_embedder import render_gaprune_embedder
from .render_dense_runs import render_dense_runs
from .render_precision_machines import render_precision_machines
from .render_table1 import render_table1
from .render_sublayer_time import render_sublayer_time
from .render_throughput import render_throughput
from .rows import (DEFAULT_TASKS, DOMAIN_TASK, DROP_PAIRS, EFFIR_PAIRS, GAP_CLAIM_SETS, GAP_LABELS, GAP_METHODS,
                   HEADLINE_TASK, MODEL_NOTE, RECOVERY_PAIRS, ROWS, SCALED, TABLES, Table)
from .section import groups_of, section_result, training_seed_list, training_seeds

RESULTS = REPO / "benchmarks" / "results"       # one JSON per finished row, and the figures RESULTS.md shows
RESULTS_MD = REPO / "benchmarks" / "RESULTS.md"
SCORED = {"base-score": "SmolLM2 as shipped: these scores pick Table 2's drops",
          "dense-score": "the dense retriever: these scores pick Table 1's drops"}


def load_results(results: Path) -> dict[str, dict]:
    """Each row's results, and under ``other_seeds`` the same row trained at other seeds (``--seed``)."""
    docs, seeds = {}, {}
    for p in sorted(results.glob("*.json")):
        doc = formats.read_json(p, "results file")
        if not isinstance(doc, dict) or doc.get("row") not in ROWS or "tasks" not in doc:
            print(f"note: {p} is not a row of this grid, ignored", file=sys.stderr)
            continue
        if doc.get("seed") is None:
            docs[doc["row"]] = doc
        else:
            seeds.setdefault(doc["row"], {})[doc["seed"]] = doc
    for row, by_seed in seeds.items():
        if row in docs:
            docs[row]["other_seeds"] = dict(sorted(by_seed.items()))
    return docs


def _entry(row: str, doc: dict, tasks: list[str], results: Path, speed: dict | None = None):
    t = {k: v for k, v in doc["tasks"].items() if k in tasks and v.get("per_query", {}).get("ndcg_at_10")}
    return compare.Entry(row, results / f"{row}.json",
                         {"tasks": t, "params": doc.get("params"), "model": doc.get("model"),
                          "fingerprint": doc.get("model_fingerprint") or row}, dict(speed or {}))


def compare_rows(ref: str, rows: list[str], docs: dict, tasks: list[str], results: Path,
                 speeds: dict | None = None) -> dict:
    """Scores per row and task, with the paired bootstrap CI of the difference to ``ref`` when it exists."""
    speeds = speeds or {}
    present = [r for r in rows if r in docs]
    if ref not in docs or not any(docs[ref]["tasks"].get(t, {}).get("per_query", {}).get("ndcg_at_10")
                                  for t in tasks):
        rows = {}
        for r in present:
            cells = {t: {"score": docs[r]["tasks"][t]["ndcg_at_10"]} if t in docs[r]["tasks"] else None for t in tasks}
            done = all(cells.values())
            rows[r] = {"tasks": cells, "mean": sum(c["score"] for c in cells.values()) / len(tasks) if done else None}
        return {"rows": rows, "tasks": tasks}
    order = [ref] + [r for r in present if r != ref]
    entries = [_entry(r, docs[r], tasks, results, speeds.get(r)) for r in order]
    table = compare.compare(entries, 0, samples=2000, seed=0)
    return {"rows": {r["label"]: r for r in table["rows"]}, "tasks": table["tasks"], "table": table}


def fmt_params(doc: dict) -> str:
    if not doc.get("params"):
        return "–"
    s = f"{doc['params'] / 1e6:.1f}M"
    mask = doc.get("mask") or {}
    if mask.get("kind") == "unstructured":
        s += f" ({mask.get('sparsity', 0):.0%} of MLP weights zero)"
    return s


def fmt_minutes(doc: dict) -> str:
    """Minutes of the row's stages; ``+`` when a training stage resumed from a checkpoint, whose earlier run's
    time is not known."""
    resumed = any((t or {}).get("resumed_from") for t in (doc.get("training") or {}).values())
    return f"{doc.get('compute_seconds', 0) / 60:.0f}" + ("+" if resumed else "")


def other_seeds(a: dict, b: dict, task: str, first: dict, names: list[str]) -> str:
    """The same pair at every other training seed both rows have, and the verdict the seeds allow."""
    common = [s for s in a.get("other_seeds") or {} if s in (b.get("other_seeds") or {})]
    if not common:
        return ""
    more = {}
    for s in common:
        pa, pb = (d["other_seeds"][s]["tasks"].get(task, {}).get("per_query", {}).get("ndcg_at_10") for d in (a, b))
        if pa and pb:
            more[s] = paired_bootstrap(pa, pb, 2000, 0)
    if not more:
        return ""
    each = "; ".join(f"at seed {s}: {interval(d)}" for s, d in more.items())
    return (f" {each[0].upper()}{each[1:]}. " + seed_verdict([first, *more.values()], 1 + len(more),
                                                            f"{names[0]} keeps more", f"{names[1]} keeps more"))


def groups_difference(a: dict, b: dict) -> list[str]:
    """Where a pair's two rows trained on different mined groups, seed by seed: a pair meant to differ in one
    thing then differs in its training data as well."""
    seeds = [("the first seed", a, b)] + [(f"seed {s}", a["other_seeds"][s], b["other_seeds"][s])
                                          for s in a.get("other_seeds") or {} if s in (b.get("other_seeds") or {})]
    return [f"{where}: {ga[:8]}… against {gb[:8]}…" for where, x, y in seeds
            if (ga := groups_of(x)) and (gb := groups_of(y)) and ga != gb]


def structure_difference(a: dict, b: dict) -> list[str]:
    """What two rows' models differ in beyond their weights (dropped sub-layers, per-layer MLP widths): a pair that
    should differ only in its recovery says so when the models it starts from are not the same shape."""
    sa, sb = a.get("structure") or {}, b.get("structure") or {}
    return [k for k in sorted(set(sa) | set(sb)) if sa.get(k) != sb.get(k)]


def training_steps(doc: dict) -> str:
    steps = [str(v.get("steps")) for v in (doc.get("training") or {}).values() if v.get("steps") is not None]
    return " + ".join(steps) if steps else "–"


def training_time(doc: dict) -> str:
    """Seconds of the row's training loops (its ``train_seconds``), stage by stage."""
    secs = [f"{v['train_seconds']:.0f}" for v in (doc.get("training") or {}).values() if v.get("train_seconds")]
    return " + ".join(secs) if secs else "–"


def slim_mask_without_ties(doc: dict) -> bool:
    """A row with a `dsprune mask` stage whose mask does not record how it broke ties (made before it did)."""
    masked = any((st.get("command") or "").startswith("dsprune mask ") for st in doc.get("stages") or [])
    return masked and "ties" not in (doc.get("mask") or {})


def under_trained(docs: dict) -> dict[str, dict]:
    """Trained rows that score clearly *below the untrained model* on the bar task (scifact_small): their
    training failed, and a finding counts only from properly trained models. Row -> paired interval."""
    task = DEFAULT_TASKS[0]
    base = ((docs.get("untrained") or {}).get("tasks", {}).get(task) or {}).get("per_query", {}).get("ndcg_at_10")
    out = {}
    for r, d in docs.items():
        pq = (d["tasks"].get(task) or {}).get("per_query", {}).get("ndcg_at_10")
        if base and pq and d.get("training") and r != "dense" and ROWS[r].trained_last:
            ci = paired_bootstrap(pq, base, 2000, 0)
            if ci["high"] < 0:
                out[r] = ci
    return out


def main_tasks(docs: dict) -> list[str]:
    seen = {t for d in docs.values() for t in d["tasks"] if t != HEADLINE_TASK}
    return [t for t in DEFAULT_TASKS if t in seen] + sorted(seen - set(DEFAULT_TASKS)) or list(DEFAULT_TASKS)


def render_table(table: Table, docs: dict, tasks: list[str], results: Path, md: Path) -> list[str]:
    labels = table.labels or {}
    cmp = compare_rows(table.reference, table.rows, docs, tasks, results)
    speed_cols = any(ROWS[r].bench or (docs.get(r) or {}).get("speed") for r in table.rows)
    means = len(tasks) > 1                    # one task: its mean would repeat its cell
    head = ["row", *[f"{t} nDCG@10" for t in tasks], *(["mean"] if means else []), "params"]
    head += ["doc speed-up", "query speed-up"] if speed_cols else []
    head += ["train steps", "seed", "min", "run"]
    lines = [f"### {table.title}", "", table.note, "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    failed = under_trained(docs)
    for r in table.rows:
        name = labels.get(r, ROWS[r].label) + dai_tag(docs.get(r)) + (" *(ref)*" if r == table.reference else "")
        name += " †" if r in failed else ""
        run = f"`--rows {r}`"
        if r not in docs:
            cells = [name, *["pending"] * len(tasks), *(["pending"] if means else []), "–"]
            cells += ["–", "–"] if speed_cols else []
            lines.append("| " + " | ".join(cells + ["–", "–", "–", run]) + " |")
            continue
        doc, c = docs[r], cmp["rows"].get(r, {})
        mean = compare.scored(c.get("mean"), c.get("mean_delta"))
        cells = [name, *[compare.cell((c.get("tasks") or {}).get(t)) for t in tasks], *([mean] if means else []),
                 fmt_params(doc)]
        if speed_cols:
            sp = doc.get("speed") or {}
            one = "1.00× (baseline)" if r == "dense" and not sp else "–"
            cells += [f"{sp['document']:.2f}×" if sp else one, f"{sp['query']:.2f}×" if sp else one]
        cells += [training_steps(doc), training_seeds(doc), fmt_minutes(doc), run]
        lines.append("| " + " | ".join(cells) + " |")
    if table.reference not in docs:
        lines += ["", f"No intervals yet: the reference row `{table.reference}` is pending."]
    plots = {r: results / f"{r}-widths.png" for r in table.rows}
    widths = [f"[{labels.get(r, ROWS[r].label)}]({os.path.relpath(p, md.parent)})" for r, p in plots.items() if p.is_file()]
    if widths:
        lines += ["", "Per-layer MLP widths after slimming (EffiR Figure 2b, from each row's `dsprune mask` stage): "
                  + ", ".join(widths) + "."]
    untied = [labels.get(r, ROWS[r].label) for r in table.rows if r in docs and slim_mask_without_ties(docs[r])]
    if untied:
        lines += ["", f"The slimming masks of {', '.join(untied)} were made before `dsprune mask` broke ties at "
                  "ReLU(z) = 0 by z: gates below zero then went in order of layer position, so where more gates sat "
                  "below zero than the ratio removes, position chose among them. Their gates are not kept and the "
                  "rows have not been rerun."]
    return lines + [""]


def render_checks(docs: dict, tasks: list[str], results: Path) -> list[str]:
    def pq(row: str, t: str) -> dict:
        return docs[row]["tasks"].get(t, {}).get("per_query", {}).get("ndcg_at_10") or {}

    lines = ["## Checks", ""]
    if "dense" in docs and "untrained" in docs:
        for t in tasks:
            if pq("dense", t) and pq("untrained", t):
                d = paired_bootstrap(pq("dense", t), pq("untrained", t), 2000, 0)
                seed = (training_seed_list(docs["dense"]) or ["not kept"])[0]   # the row's own run: its scores
                runs = "one training run, its seed not kept" if seed == "not kept" else f"one training run, seed {seed}"
                verdict = f"clearly better (interval above 0; {runs})" if d["low"] > 0 else "NOT clearly better"
                lines.append(f"- dense − untrained on {t}: {interval(d)}: "
                             f"{verdict}.")
    else:
        lines.append("- dense vs untrained: pending.")
    def pair_checks(pairs, sizes: bool):
        """row − rival per task; a pair's optional third item names the question it answers."""
        for a, b, *question in pairs:
            if a not in docs or b not in docs:
                continue
            lead = f"{question[0]}: " if question else ""
            names = [ROWS[r].label + (f" ({fmt_params(docs[r])})" if sizes else "") for r in (a, b)]
            for t in tasks:
                if pq(a, t) and pq(b, t):
                    d = paired_bootstrap(pq(a, t), pq(b, t), 2000, 0)
                    lines.append(f"- {lead}{names[0]} − {names[1]} on {t}: {interval(d)} (p = {d['p']:.3f})."
                                 + other_seeds(docs[a], docs[b], t, d, names))
            groups = groups_difference(docs[a], docs[b])
            if groups:
                lines.append(f"- {lead}**{names[0]} and {names[1]} trained on different mined groups** at "
                             + "; ".join(groups) + ", so more than the pair's question differs between them.")

    pair_checks(EFFIR_PAIRS, sizes=False)   # EffiR's claim: slimming beats deeper dropping at equal size
    lines += effir_start_lines(docs)
    pair_checks(DROP_PAIRS, sizes=True)     # EffiR's claims on what to drop
    pair_checks(RECOVERY_PAIRS, sizes=False)   # does distillation undo the collapse?
    for a, b, question in RECOVERY_PAIRS:
        if a in docs and b in docs:
            diff = structure_difference(docs[a], docs[b])
            lines.append(f"- {question}: the two models have the same structure (dropped sub-layers, MLP widths; "
                         "which neurons a mask keeps is not compared)."
                         if not diff else f"- {question}: **the two models differ in {', '.join(diff)}**, so more "
                         "than the recovery differs between them.")
    seconds = {r: training_time(docs[r]) for a, b, _ in RECOVERY_PAIRS for r in (a, b) if r in docs}
    if any(a in docs for a, _, _ in RECOVERY_PAIRS):
        lines.append("- recovery time, seconds of training (slimming + training for the EffiR rows): "
                     + ", ".join(f"{r} {s}" for r, s in seconds.items()) + ".")
    for what, _, row_of, _ in GAP_CLAIM_SETS:   # GAPrune's claim: DAI keeps domain quality best
        dai = row_of("dai")
        if dai not in docs or not pq(dai, DOMAIN_TASK):
            continue
        rivals = {m: pq(row_of(m), DOMAIN_TASK) for m in GAP_METHODS if m != "dai" and row_of(m) in docs}
        diffs = {m: paired_bootstrap(pq(dai, DOMAIN_TASK), scores, 2000, 0) for m, scores in rivals.items() if scores}
        if diffs:
            lines.append(f"- DAI − other masks, {what}, on {DOMAIN_TASK} (the domain): " + "; ".join(
                f"{GAP_LABELS[m].lower()} {interval(d)}"
                for m, d in diffs.items()) + ".")
            for m, d in diffs.items():
                more = other_seeds(docs[dai], docs[row_of(m)], DOMAIN_TASK, d, ["DAI", GAP_LABELS[m].lower()])
                if more:
                    lines.append(f"  - DAI − {GAP_LABELS[m].lower()}:{more}")
    failed = under_trained(docs)
    if failed:
        lines.append(f"- **† not properly trained**: {', '.join(failed)} score below the *untrained* model on "
                     f"{DEFAULT_TASKS[0]} (row − untrained: " + "; ".join(
                         f"{r} {interval(c)}" for r, c in failed.items())
                     + "). Their training failed, so they test no claim of the papers; "
                     "`benchmarks/train_collapse.py` shows how (loss against ln N, passage cosine).")
    budgets = {r: training_steps(docs[r]) for r in docs if r.startswith(("t2-", "effir", "sd-"))}
    if budgets:
        lines.append("- training steps (Table 2, EffiR and self-distilled rows; a slimmed row's are slimming + its "
                     "training or distillation): "
                     + ", ".join(f"{r} {s}" for r, s in budgets.items()) + ".")
    dense_fp = (docs.get("dense") or {}).get("model_fingerprint")
    stale = [r for r, d in docs.items() if dense_fp and (d.get("inputs") or {}).get("dense", {}).get("fingerprint")
             not in (None, dense_fp)]
    if stale:
        theirs = sorted({docs[r]["inputs"]["dense"]["fingerprint"][:8] for r in stale})
        lines.append(f"- **warning**: {', '.join(stale)} {'was' if len(stale) == 1 else 'were'} made from (trained "
                     f"or distilled from) dense model {', '.join(theirs)}, not the dense row ({dense_fp[:8]}): the "
                     "reference their intervals are against is not the model they were built from. "
                     "`--force` reruns them on whatever dense model the grid's inputs then hold, which need not be the "
                     "dense row's either; the intervals pair only rows made from one dense model, so rerun the dense "
                     "row and these rows together.")
    return lines + [""]


def render(results: Path, md: Path) -> str:
    docs = load_results(results) if results.is_dir() else {}
    tasks = main_tasks(docs)
    png = results / "quality_vs_speed.png"
    out = ["# Reproducing EffiR and GAPrune at small scale", "",
           f"Rendered by `benchmarks/reproduce.py` from `{os.path.relpath(results, md.parent)}/*.json`: "
           f"{len(docs)} of {len(ROWS)} rows done. Every number below comes from a row's results JSON, made by "
           "the command shown (code version per row under *Provenance*); rows not yet run say *pending*.", "",
           "**Run.** `.venv/bin/python benchmarks/reproduce.py` runs every pending row (about 12 h on 2 CPU cores "
           "from scratch; `--list` shows rows, stages and rough minutes); `--rows ROW|TABLE ...` picks some. A row "
           "resumes stage by stage; a finished row is skipped while its configuration is unchanged.", "",
           f"**Model.** {MODEL_NOTE}", "",
           "**Reading the tables.** nDCG@10 per task; in brackets the difference to the table's reference row "
           "*(ref)* with its 95 % paired bootstrap interval over queries (2,000 resamples, "
           "`dsprune.eval.bootstrap`); *mean* is over the tasks, its interval resamples queries per task. "
           "Speed-ups are measured by `dsprune bench` in one run (±0.1 between runs). *min*: wall minutes of the "
           "row's stages on 2 CPU cores (a shared stage such as scoring counts in every row that uses it; *+*: a "
           "training stage resumed from a checkpoint and only its last run is counted). *seed*: the row's "
           "training seed(s), from its training stages; a verdict needs two seeds whose paired intervals exclude 0 "
           "on the same side, so a row "
           "with one seed decides none (*not kept*: the row's JSON does not hold it; a second seed comes from "
           "`--seed N`, and the checks below then give each seed's interval). "
           "*run*: `.venv/bin/python benchmarks/reproduce.py --rows ROW`.", "",
           "**Scaled settings** (2 CPU cores; the papers' settings in brackets):", ""]
    out += [f"- {k}: {v}" for k, v in SCALED.items()] + learning_rates(docs) + [""]
    for table in TABLES:
        out += render_table(table, docs, tasks, results, md)
    heads = [r for r in docs if HEADLINE_TASK in docs[r]["tasks"]]
    if heads:
        rows = ["dense"] + [r for r in ROWS if r in heads and r != "dense"]
        out += render_table(Table("headline", "Headline rows on full SciFact (5,183 documents, 300 queries)",
                                  "dense", rows, "Only with `--headline-scifact`."), docs, [HEADLINE_TASK], results, md)
    out += render_checks(docs, tasks, results)
    out += render_drop_order(results, md)
    out += render_drop_position(results, docs)
    if plot_front(docs, tasks, results, png):
        out += ["## Quality vs speed", "", f"![quality vs speed]({os.path.relpath(png, md.parent)})", "",
                "Mean nDCG@10 against the measured document-encoding speed-up; bars: the paired interval of "
                "the difference to the dense retriever.", ""]
    gap_png = results / "gaprune_methods.png"
    if plot_gaprune(docs, tasks, results, gap_png):
        out += ["## GAPrune methods side by side", "", f"![GAPrune methods]({os.path.relpath(gap_png, md.parent)})",
                "", "nDCG@10 of each mask per setting; dashed: the setting's unpruned reference (dense, or the "
                "control retrained on FinanceBench train); bars: the paired interval of the difference to it.", ""]
    out += render_dai_modes(results, docs)
    out += render_overlap(results)
    out += render_families(results, md)
    out += render_compress(results, md)
    out += render_sublayer_time(results)
    out += render_table1(results)
    out += render_dense_runs(results, docs.get("dense"))
    out += render_gaprune_embedder(results)
    out += render_int8(results)
    out += render_throughput(results)
    out += ["## Provenance", ""]
    for r in ROWS:
        if r in docs:
            d = docs[r]
            out.append(f"- **{r}** ({d.get('code_version')}, {fmt_minutes(d)} min of "
                       f"stages, {d.get('wall_seconds', 0) / 60:.0f} min in its last run): `{d.get('command')}`")
            out += [f"  - `{s['command']}`" for s in d.get("stages", [])]
            out += [f"  - training `{name}`: its command and code version are not kept" for name in unkept(d)]
            for seed, sd in (d.get("other_seeds") or {}).items():
                out.append(f"  - seed {seed} ({sd.get('code_version')}, {fmt_minutes(sd)} min of stages): "
                           f"`{sd.get('command')}`")
    text = "\n".join(out).rstrip() + "\n"
    formats.write_text(md, text)
    return text


def unkept(doc: dict) -> list[str]:
    """The row's training stages whose command (and so code version and options) the row does not keep."""
    staged = {s.get("name") for s in doc.get("stages", [])}
    return [name for name in doc.get("training") or {} if name not in staged]


def learning_rates(docs: dict) -> list[str]:
    """The learning rate of the rows' training stages by what they train, read from their commands (EffiR trains
    LoRA at 1e-4)."""
    rates: dict[tuple[str, str | None], set[str]] = {}
    for r, d in docs.items():
        for s in d.get("stages", []):
            toks = (s.get("command") or "").split()
            if "launchers/train.py" not in toks:
                continue

            def opt(name: str, default: str | None = None) -> str | None:
                return toks[toks.index(name) + 1] if name in toks[:-1] else default
            if opt("--mode") == "slim" and opt("--slim_train") == "gates":
                key = ("slimming gates", opt("--slim_lr", "the trainer's default"))
            else:
                key = ("full parameters" if opt("--lora", "true") == "false" else "LoRA",
                       opt("--learning_rate", "the trainer's default"))
            rates.setdefault(key, set()).add(r)
    if not rates:
        return []
    # a training whose command a row does not keep (the dense row's) cannot be read, so the count leaves it out
    unread = sorted(r for r, d in docs.items() if unkept(d))
    return ["- learning rate of every training stage whose command a row keeps, by what it trains"
            + (f" (not kept: {', '.join(unread)}; *Provenance*)" if unread else "") + ": " + "; ".join(
        f"{what} {lr} in {len(rows)} row{'s' if len(rows) > 1 else ''}" for (what, lr), rows in rates.items())
        + " (EffiR, Appendix A.2: LoRA at 1e-4)"]


def render_drop_order(results: Path, md: Path) -> list[str]:
    """The score stages' heat maps, each with the median importance per kind of sub-layer read from its scores."""
    maps = sorted((results / "drop_order").glob("*.png"))
    if not maps:
        return []
    out = ["## Drop order (EffiR Figure 2a)", "",
           "Importance 1 − cos(x_in, x_out) of every sub-layer on the calibration text (`dsprune score`); a number "
           "is the place in the drop order (1 = dropped first), colours are on a log scale.", ""]
    names = formats.SCORE_GROUPS
    docs = {png.stem: formats.read_scores(png.with_suffix(".json")) for png in maps}
    for png in maps:
        doc = docs[png.stem]
        medians = ", ".join(f"{names.get(k, k)} {statistics.median(v.values()):.4f}"
                            for k, v in doc["scores"].items() if v)
        first = "; ".join(f"{names.get(k, k)} {', '.join(map(str, v[:5]))}" for k, v in doc["order"].items() if v)
        out += [f"**`{png.stem}`**: {SCORED.get(png.stem, Path(doc.get('model', png.stem)).name)}. Median importance: "
                f"{medians}. First five to drop: {first}.", "",
                f"![drop order of {png.stem}]({os.path.relpath(png, md.parent)})", ""]
    if {"base-score", "dense-score"} <= set(docs):
        out += [drop_order_shift(docs["base-score"], docs["dense-score"]), ""]
    return out


def drop_order_shift(base: dict, tuned: dict, k: int = 8) -> str:
    """EffiR Figure 2a's two observations, measured: retrieval training keeps the drop order (rank correlation of
    the scores, overlap of the first k), and later layers are the more prunable (where the first k sit)."""
    from scipy.stats import spearmanr

    parts = []
    for kind, scores in tuned["scores"].items():
        layers = sorted(set(scores) & set(base["scores"].get(kind, {})), key=int)
        if len(layers) < 3:
            continue
        rho = spearmanr([base["scores"][kind][i] for i in layers], [scores[i] for i in layers]).statistic
        first = tuned["order"][kind][:k]
        shared = len(set(first) & set(base["order"][kind][:k]))
        # the layers themselves, not only their mean: first candidates at both ends of the stack average to its middle
        parts.append(f"{formats.SCORE_GROUPS.get(kind, kind)} ρ = {rho:.2f}, {shared} of the first {k} shared; the "
                     f"trained model's first {k} at layers {', '.join(map(str, sorted(first)))} "
                     f"(mean {sum(first) / len(first):.1f})")
    n = tuned.get("num_layers") or len(next(iter(tuned["scores"].values())))
    return ("**After retrieval training** (`base-score` → `dense-score`; EffiR: the pattern stays, later layers "
            "are the more prunable): " + "; ".join(parts) + f" (the middle layer is {(n - 1) / 2:.1f}).")


def render_families(results: Path, md: Path) -> list[str]:
    """Another model family through recipes/effir-smollm2.yaml (benchmarks/family.py): the recipe's own report."""
    out = []
    for p in sorted((results / "families").glob("*.json")):
        d = section_result(p, {"title", "command", "report", "stages"}, "benchmarks/family.py")
        if d is None:
            continue
        minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
        changed = ", ".join(f"`{k}={v}`" for k, v in (d.get("params") or {}).items())
        out += [f"## A second model family: {d['title']}", "",
                f"`{d['recipe']}`'s stages with only its params changed ({changed}): `.venv/bin/python "
                f"benchmarks/family.py {d['family']}` runs `{d['command']}` ({d.get('code_version')}, "
                f"{minutes:.0f} min of stages on 2 CPU cores) and keeps the recipe's `report` stage. The reference "
                "is the unpruned model given the same training budget (`train-full`); *as shipped* is the model before any retrieval training.", "",
                compare.markdown(d["report"]), ""]
        png = results / "families" / d.get("plot", "")
        if d.get("plot") and png.is_file():
            out += [f"![{d['title']}: quality vs speed]({os.path.relpath(png, md.parent)})", ""]
        out += ["Stage minutes: " + ", ".join(f"{s['name']} {(s.get('seconds') or 0) / 60:.0f}"
                                              for s in d["stages"]) + ".", ""]
    return out


def render_compress(results: Path, md: Path) -> list[str]:
    """A trained embedder through recipes/compress-embedder.yaml (benchmarks/compress_embedder.py), with the
    model rows of its variants (``compress_embedder_<variant>.json``) in the same table."""
    runs = compress_runs(results)
    if runs is None:
        return []
    d, variants, table = runs
    plan, dist = d["plan"], d["distill"]
    cfg = dist["config"]
    minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
    ref = next(r for r in table["rows"] if r["label"] == table["reference"])
    length = (f"{dist['steps']} steps" if cfg.get("max_steps") else f"{cfg['num_epochs']} epochs ({dist['steps']} steps)")
    frozen = f", `{cfg['freeze']}` frozen" if cfg.get("freeze") else ""
    out = [f"## {d['title']}", "",
           f"`.venv/bin/python benchmarks/compress_embedder.py` runs `{d['command']}` ({d.get('code_version')}, "
           f"{minutes:.0f} min of stages on 2 CPU cores) and keeps the recipe's `report` stage. The reference is "
           "the unpruned model. Each row is one training seed (seed in the distillation's settings below); a row "
           "is called better or worse only where two seeds agree, which is said below.", "",
           f"- **Plan** (`dsprune plan`, target {plan['target_speedup']}× by FLOPs at {plan['seq_len']} tokens): "
           f"drop {len(plan['attn'])} attention sub-layers {plan['attn']} and {len(plan['mlp'])} MLPs "
           f"{plan['mlp']} of {plan['num_layers']}, slimming {plan['slim_ratio']}; FLOP ratio "
           f"{plan['flop_ratio']:.3f}×.",
           f"- **Distillation** (`launchers/train.py --mode distill`, teacher: the unpruned model): {length} of "
           f"{cfg['per_device_batch_size']} items per rank × 2 ranks, data {cfg['distill_data']}, learning rate "
           f"{cfg['learning_rate']}"
           f"{f' ({w} warm-up steps, then linear decay)' if (w := cfg.get('warmup_steps')) is not None else ''}, "
           f"{'LoRA' if cfg['lora'] else 'full parameters'}{frozen}, seed {cfg.get('seed')}; loss "
           f"{dist['first']['loss']:.4f} at the first step, {dist['last']['loss']:.4f} at the last.",
           "- **Confound:** the distillation text holds passages of the SciFact corpus (scifact_small's documents "
           "are a subset) and the FinanceBench corpus, unlabelled; no test query or test label."]
    out += precision_lines(d, "- ")
    out += curve_lines(d, variants, table)
    named = {v["variant"]["name"]: v for v in variants}
    for v in variants:
        vp = v["plan"]
        base = named.get(family(v), d)
        how = (f"`{v['recipe']}` (the same stages plus `slim`, `mask` and `export-mask`; its no-recovery row "
               "is the masked export)" if v["recipe"] != d["recipe"] else "the same recipe")
        if base is not d and base is not v:   # a second seed's `set` holds only what differs from the run it repeats
            how = f"the *{base['variant']['label']}* run"
        sets = v["variant"]["set"]
        how += (" with " + ", ".join(f"`{k}={x}`" for k, x in sets.items())) if sets else ""
        slimmed = f", slims the kept MLPs by {vp['slim_ratio']}" if vp.get("slim_ratio") else ""
        out.append(f"- **{v['variant']['label']}** (`{v['command']}`): {how}: drops "
                   f"{len(vp['attn'])} attention sub-layers {vp['attn']} and {len(vp['mlp'])} MLPs {vp['mlp']}"
                   f"{slimmed}, FLOP ratio {vp['flop_ratio']:.3f}×, then {recovery_of(v, d)}. {stage_minutes(v)}"
                   + left_out_note(v) + bench_machine_note(v))
        added = [x for x in text_sources(v) if x not in text_sources(d)]
        if added:
            out.append(f"  - **Confound:** its distillation text adds {', '.join(added)}, unlabelled; where one is a "
                       "corpus the tables evaluate on, the student has seen its documents, never its test queries or "
                       "labels.")
        out += precision_lines(v, "  - ")
        # a slimmed model's mask comes from gates trained on the task: no recovery, but not no training
        untrained = (" (no recovery training; its mask comes from slimming gates trained on labelled groups, one run: "
                     "not a verdict)." if vp.get("slim_ratio") else " (no training).")
        for label, a in (v.get("against_main") or {}).items():
            out.append(f"  - {label} − {a['against']}, paired per query, mean over the tasks: "
                       f"{interval(a['mean_delta'])}"
                       + ((" (the same plan, another seed: the spread between seeds)." if another_seed(v, base)
                           else " (one training seed: not a verdict).") if a.get("trained") else untrained))
        before = v.get("paired_before") or {}
        if before:
            runs = (["the main run"] if "against_main" in before else []) + [
                f"*{x}*" for x in (before.get("versus") or {}).get("runs", [])]
            out.append(f"  - Its pairing with {' and '.join(runs)} was computed when these same models were first "
                       "collected (same training losses and in-run scores, same score on every task); that run's "
                       "evaluation is gone from out/ since and kept no per-query scores.")
        if (v.get("unpaired") or {}).get("against_main"):
            out.append(f"  - Not paired with the main run: {v['unpaired']['against_main']}.")
    out += recovery_lines(d, variants) + comparison_lines(d, variants) + target_lines(d, variants, ref)
    out.append("")
    for r in table["rows"]:
        if r is not ref and r.get("mean") is not None and ref.get("mean"):
            sp = r.get("speed") or {}
            speed = (f", measured speed-up {sp['document']:.2f}× (documents) / {sp['query']:.2f}× (queries)"
                     if "document" in sp else "")
            out.append(f"- {r['label']}: mean nDCG@10 {r['mean']:.4f} = {r['mean'] / ref['mean']:.3f} of the "
                       f"unpruned {ref['mean']:.4f}{speed}.")
    if d.get("bench_pairs"):
        out.append("- Speed-ups of the main run: " + "; ".join(
            f"{'queries' if k == 'query' else k + 's'} median {x['median']:.2f}× of {len(x['ratios'])} alternating pairs (min–max "
            f"{x['min']:.2f}–{x['max']:.2f}×)" for k, x in d["bench_pairs"].items()) + ".")
    out += ["", compare.markdown(table), ""]
    for name, alt in (("compress_embedder_front.png", "quality vs speed, every run"),
                      ("compress_embedder_curves.png", "learning curves against time")):
        if (results / name).is_file():
            out += [f"![{alt}]({os.path.relpath(results / name, md.parent)})", ""]
    out += ["Stage minutes: " + ", ".join(f"{s['name']} {(s.get('seconds') or 0) / 60:.0f}"
                                          for s in d["stages"]) + ".", ""]
    return out


def compress_runs(results: Path) -> tuple[dict, list[dict], dict] | None:
    """The main compress-embedder run, its variants, and one table of every model row (the variants' rows
    under their own labels, against the same unpruned row)."""
    p = results / "compress_embedder.json"
    d = section_result(p, {"title", "command", "report", "plan", "distill", "stages"}, "benchmarks/compress_embedder.py")
    if d is None:
        return None
    table = d["report"]
    ref = next(r for r in table["rows"] if r["label"] == table["reference"])
    variants = [formats.read_json(v, "compress-embedder variant") for v in results.glob(f"{p.stem}_*.json")]
    # a run's other seeds right after it
    variants.sort(key=lambda v: (family(v), v["variant"]["name"] != family(v), v["variant"]["name"]))
    return d, variants, {**table, "rows": table["rows"] + [r for v in variants for r in variant_rows(v, ref)]}


def left_out_note(v: dict) -> str:
    """The number formats a run left out (``--without``): their rows are missing by choice, not by failure."""
    gone = v.get("left_out")
    return (f" It left out {', '.join(gone['formats'])} (`--without`: no stage {', '.join(gone['stages'])}, "
            "no report row).") if gone else ""


def bench_machine_note(v: dict) -> str:
    """The CPU the run's float32 speed-ups were timed on: runs timed on other CPUs differ by their kernels as well
    as by their models (results collected before the record was kept say nothing)."""
    m = v.get("bench_machine")
    return f" Its float32 bench ran on {m['cpu']} (torch kernels {m['cpu_capability']})." if m else ""


def stage_minutes(v: dict) -> str:
    """The run's compute: its stages' seconds, where a distillation that resumed in later processes counts
    each process's span from its TensorBoard events (the recipe's stamp holds only the last process's)."""
    processes = (v.get("distill") or {}).get("processes") or []
    pieced = len(processes) > 1
    total = sum((sum(processes) if pieced and s["name"] == "distill" else s.get("seconds") or 0)
                for s in v["stages"])
    return (f"Its stages' times sum to {total / 60:.0f} min (a stage taken finished from another run counts that "
            "run's time" + (f"; the distillation ran in {len(processes)} processes, resumed from its checkpoints, "
                            "and counts their spans, without each one's start-up" if pieced else "") + ").")


def curve_lines(d: dict, variants: list[dict], table: dict) -> list[str]:
    """Each run's in-training scores (step: nDCG@10, and the minutes since the run's step-0 score where its
    TensorBoard events were kept), so recoveries of different step costs can be read at equal time."""
    cfg = d["distill"]["config"]
    runs = [("main run", d), *((v["variant"]["label"], v) for v in variants)]
    runs = [(name, r) for name, r in runs if r["distill"].get("curve")]
    if not runs:
        return []
    task = f"{cfg.get('eval_task')} {cfg.get('eval_split')}"
    drop_only = next((r for r in table["rows"] if r["label"] == "drop only"), None)
    start = drop_only["tasks"].get(cfg.get("eval_task"), {}).get("score") if drop_only else None
    out = [f"- **Learning curves** (nDCG@10 on {task}, scored by the trainer during each run; monitoring only, "
           "never used to pick a checkpoint; unless a run names a length, the trainer encodes at the model's own "
           "maximum length, not truncated as in the tables' evaluation, so its scores are not the tables'; "
           "step: score, in brackets wall-clock minutes since the run's step-0 "
           "score, lengthened by whatever else ran on the machine at the time; a run resumed in a later process "
           "counts each process's own minutes, not the pause between them"
           + (f"; before training, the main plan's drop only scores {start:.4f} by `dsprune eval`" if start is not None
              else "") + "):"]
    for name, r in runs:
        points = [f"{c['step']}: {c['ndcg_at_10']:.4f}" + (f" ({c['seconds'] / 60:.0f} min)" if "seconds" in c else "")
                  for c in r["distill"]["curve"]]
        length = r["distill"]["config"].get("eval_max_length")
        out.append(f"  - {name}" + (f" (at most {length} tokens)" if length else "") + ": " + ", ".join(points) + ".")
    return out


def precision_lines(doc: dict, bullet: str) -> list[str]:
    """How a run's int8 and bfloat16 rows were made and on which CPU each was timed: their speed-ups are that CPU's
    kernels'."""
    out = []
    for key, name, made in (("int8", "int8", "with dynamic int8 Linear layers"),
                            ("bf16", "bfloat16", "computed in bfloat16 (weights cast at load)")):
        q = doc.get(key)      # kept from the run's eval-KEY and bench-KEY stages (compress_embedder.PRECISIONS)
        if not q:
            continue
        m = q["machine"]
        kept = ", ".join(f"`{x}`" for x in q["quantize_skip"])
        out.append(f"{bullet}**{name}** (`eval-{key}`, `bench-{key}`): the distilled model {made}"
                   + (f" ({kept} kept float32)" if kept else "") + ", benched against the float32 unpruned model in "
                   f"one run on {m['cpu']} (torch kernels {m['cpu_capability']}, {q['threads']} threads); {name}'s "
                   "speed-up is this CPU's (*int8 and bfloat16 per machine*)."
                   + (f" {name} − the same model in float32, paired per query, mean over the tasks: "
                      f"{interval(d['mean_delta'])} (nothing trained between the two: the interval is over queries)."
                      if (d := q.get("against_float")) else ""))
        if both := q.get("both"):
            sp = both["speed"]
            out.append(f"  {bullet}With the unpruned model in {name} too (`{both['stage']}`, one run on "
                       f"{both['machine']['cpu']}): the pruning's own speed-up where {name} is served, "
                       + " / ".join(f"{sp[k]['speedup']:.2f}× {plural} "
                                    f"(pairs {sp[k]['min']:.2f}–{sp[k]['max']:.2f}×)"
                                    for k, plural in (("document", "documents"), ("query", "queries")))
                       + f"; the row's speed-up against float32 holds {name}'s own as well.")
    return out


# distillation settings besides loss, trained parameters, text, steps and seed that a variant may change
RECOVERY_SETTINGS = ("learning_rate", "per_device_batch_size", "group_size", "passage_max_length",
                     "query_max_length", "eval_max_length")


def recovery_of(v: dict, main: dict) -> str:
    """How a variant recovered its pruned model: the main run's distillation, or its own training."""
    dist, cfg, main_cfg = v["distill"], v["distill"]["config"], main["distill"]["config"]
    lora = trained_params(cfg)
    if (cfg.get("mode") or "distill") == (main_cfg.get("mode") or "distill"):
        how = "" if lora == trained_params(main_cfg) else f" through {lora} instead of {trained_params(main_cfg)}"
        own, main_text = text_sources(v), text_sources(main)
        what = ("the distillation on the same text" if own == main_text else
                "the distillation on more text" if set(main_text) <= set(own) else "the distillation on other text")
        # the settings the summary keeps that differ from the main run's are named (the variant's own options, the
        # number format among them, stand at the head of its line)
        other = [f"{k} {cfg[k]}" for k in RECOVERY_SETTINGS if k in cfg and k in main_cfg and cfg[k] != main_cfg[k]]
        return f"{what}{how} ({dist['steps']} steps, seed {cfg.get('seed')}{''.join(', ' + x for x in other)})"
    return (f"{v['variant'].get('recovery', cfg.get('mode'))} instead of the distillation: {dist['steps']} steps of "
            f"{cfg['per_device_batch_size']} queries per rank × 2 ranks, groups of {cfg.get('group_size')} "
            f"passages from {cfg.get('train_data')}, {lora}, learning rate {cfg['learning_rate']}, temperature "
            f"{cfg.get('temperature')}, seed {cfg.get('seed')}; no teacher")


def text_sources(doc: dict) -> list[str]:
    """A run's distillation text, its own run folder left out (each run mines its groups into its own folder), so
    that two runs over the same text compare equal."""
    return [re.sub(r"^(.*/)?out/recipes/[^/]+/", "", x)
            for x in (doc["distill"]["config"].get("distill_data") or [])]


def trained_params(cfg: dict) -> str:
    return f"LoRA r={cfg['lora_r']} α={cfg['lora_alpha']}" if cfg.get("lora") else "full parameters"


def variant_rows(v: dict, ref: dict) -> list[dict]:
    """A variant run's own model rows, named after the variant. Its intervals are against its own reference
    row, so that row must hold the main run's per-task scores."""
    vref = next(r for r in v["report"]["rows"] if r["label"] == v["report"]["reference"])
    if {t: x["score"] for t, x in vref["tasks"].items()} != {t: x["score"] for t, x in ref["tasks"].items()}:
        raise SystemExit(f"compress-embedder variant {v['variant']['name']}: its unpruned scores differ from the "
                         "main run's; rerun it")
    names = v["variant"]["report_rows"]
    return [{**r, "label": names[r["label"]]} for r in v["report"]["rows"] if r["label"] in names]


def render_int8(results: Path) -> list[str]:
    """Padding by token count and int8 inference (benchmarks/int8_padding.py)."""
    d = section_result(results / "int8_padding.json", {"title", "command", "padding", "report"},
                       "benchmarks/int8_padding.py")
    if d is None:
        return render_precision_machines(results, "## int8 and bfloat16 on CPU")
    return int8_section(d) + render_precision_machines(results)


def int8_section(d: dict) -> list[str]:
    """The section RESULTS.md shows and benchmarks/int8_padding.py prints: padding per sort, then every variant's
    nDCG@10 (paired interval to the float32 unpruned model) beside its median speed-up and min–max."""
    pad, table = d["padding"], d["report"]
    out = [f"## {d['title']}", "", f"`{d['command']}` ({d.get('code_version')}).", "",
           f"**Padding** of `Encoder.encode`'s batches at ≤ {pad['max_length']} tokens (the model's prompts, "
           f"`{pad['data']}`): the share of positions that hold no token.", "",
           "| texts | count | batch size | sorted by characters | sorted by token count |", "|---|---|---|---|---|"]
    out += [f"| {r['kind']} | {r['texts']} | {r['batch_size']} | {r['by_chars']:.1%} | {r['by_tokens']:.1%} |"
            for r in pad["rows"]]
    tasks = table["tasks"]
    ref = next(r for r in table["rows"] if r["label"] == table["reference"])
    per_task = tasks if len(tasks) > 1 else []
    out += ["", f"**Pruned and int8** against the float32 unpruned model. nDCG@10 on {', '.join(tasks)}"
            + (" and their mean" if per_task else "") + "; in brackets the difference with its 95 % paired "
            f"bootstrap interval over queries ({table['samples']} resamples). *Kept*: the mean as a share of the "
            "unpruned model's. Speed-up: median of the bench's alternating model/baseline pairs, min–max in "
            "brackets.", "",
            "| model | " + "".join(f"{t} | " for t in per_task) + ("mean" if per_task else "nDCG@10")
            + " | kept | document speed-up | query speed-up | FLOP ratio |",
            "|---|" + "---|" * (len(per_task) + 5)]
    for r in table["rows"]:
        sp = d["speed"].get(r["label"])
        fmt = (lambda k: f"{sp[k]['speedup']:.2f}× ({sp[k]['min']:.2f}–{sp[k]['max']:.2f}, {sp[k]['pairs']} pairs)"
               if sp else "1")
        flops = f"{sp['document']['flop_ratio']:.2f}×" if sp else "1"
        cells = [compare.cell(r["tasks"][t]) for t in per_task]
        out.append(f"| {r['label']} | " + "".join(f"{c} | " for c in cells)
                   + f"{compare.scored(r['mean'], r.get('mean_delta'))} | {r['mean'] / ref['mean']:.3f} | "
                   f"{fmt('document')} | {fmt('query')} | {flops} |")
    skipped = {k: v["quantize_skip"] for k, v in d["variants"].items() if v.get("quantize_skip")}
    if skipped:
        out += ["", "Kept float32 (`--quantize_skip`): " + "; ".join(
            f"{k}: every Linear layer whose name holds {', '.join(f'`{x}`' for x in v)}" for k, v in skipped.items())
            + ". Dynamic int8 quantises each layer's input with one scale per batch."]
    shapes = next(iter(d["speed"].values()), None)
    if shapes:
        out += ["", f"Bench shapes: documents {shapes['document']['texts']} × {shapes['document']['length']} tokens "
                f"in batches of {shapes['document']['batch_size']}, queries {shapes['query']['texts']} × "
                f"{shapes['query']['length']} in batches of {shapes['query']['batch_size']}; torch "
                f"threads: {shapes['threads']}. int8 does the same multiply-adds as float32, so the FLOP ratio bounds only the float rows. "
                "int8's speed-up rests on the CPU's int8 instructions, and these benches predate the CPU record "
                "in `bench.json`: read their speed-ups as one machine's (*int8 and bfloat16 per machine* names the CPU of each "
                "later run)."]
    warned = [f"{label}: {w}" for label, sp in d["speed"].items() for w in sp.get("warnings", [])]
    out += ([""] + [f"- warning from the bench, {w}" for w in warned]) if warned else []
    return out + [""]


def plot_front(docs: dict, tasks: list[str], results: Path, png: Path) -> bool:
    """The quality-vs-speed figure (dsprune.report.front) over every benched row, the dense row at 1×."""
    benched = [r for r in ROWS if (docs.get(r) or {}).get("speed")]
    if not benched or "dense" not in docs:
        return False
    speeds = {r: docs[r]["speed"] for r in benched}
    speeds["dense"] = {"document": 1.0, "query": 1.0}
    cmp = compare_rows("dense", ["dense", *benched], docs, tasks, results, speeds)
    if "table" not in cmp:
        return False
    try:
        front.plot(cmp["table"], png)
    except DsPruneError:
        return False
    return True


def plot_gaprune(docs: dict, tasks: list[str], results: Path, png: Path) -> bool:
    """GAPrune's settings as grouped bars (dsprune.report.methods), a bar per finished mask."""
    groups = []
    for _, title, row_of, ref in GAP_CLAIM_SETS:
        rows = {GAP_LABELS[m]: row_of(m) for m in GAP_LABELS if row_of(m) in docs}   # docs hold grid rows only
        if not rows or ref not in docs:
            continue
        cmp = compare_rows(ref, [ref, *rows.values()], docs, tasks, results)
        groups.append({"title": title, "reference": ROWS[ref].label,
                       "ref_scores": {t: (cmp["rows"][ref]["tasks"].get(t) or {}).get("score") for t in tasks},
                       "bars": {label: cmp["rows"][r]["tasks"] for label, r in rows.items()}})
    try:
        methods.plot_groups(groups, tasks, png, "GAPrune: masks of the MLP weights")
    except DsPruneError:
        return False
    return True

