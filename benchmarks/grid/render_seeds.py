"""What the compress-embedder runs say when the same plan was distilled with more than one seed: about
recovery, about one run against another, and about the recipe's target (≥ 2× at ≥ 0.97 of the unpruned mean).

A verdict needs two training seeds whose paired intervals (distilled − the same pruned model, per query)
both exclude 0 on the same side, and the target two seeds whose intervals' low ends clear its bar; the words
are taken from the intervals, so they cannot outrun them.
"""
from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from dsprune.report.compare import interval

# what the compress-embedder recipe is for: this measured speed-up (documents and queries) at this share of the
# unpruned model's mean nDCG@10, the share read from the low end of the paired interval, not the point estimate
TARGET = (2.0, 0.97)


class SeedRow(NamedTuple):
    """One trained row of one seed's run, as the target lines weigh it."""
    seed: object
    label: str
    speed: dict
    delta: dict
    tasks: dict
    number_format: str = ""     # "int8…" or "bfloat16" for the distilled model converted at load, "" as trained


def seed_of(doc: dict) -> object:
    return ((doc.get("distill") or {}).get("config") or {}).get("seed")


def same_plan(a: dict, b: dict) -> bool:
    keys = ("attn", "mlp", "slim_ratio", "target_speedup")
    return all(a["plan"].get(k) == b["plan"].get(k) for k in keys)


def family(doc: dict) -> str:
    """The run a variant repeats with another seed (its ``base``; "" is the main run), else the variant itself; a
    run made again names its own ``family``: it repeats its base's seed, so it is no other seed of it."""
    v = doc.get("variant") or {}
    return v.get("family") or v.get("base", v.get("name", "")) if v else ""


def lineage(doc: dict, runs: dict[str, dict]) -> str:
    """The run whose seeds ``doc`` stands among when paired with another run: a run made again (its own
    ``family``, its base's settings unchanged) takes its base's, so that its pairing lines up with the pairings
    of that base's other seeds. A variant with a family and settings of its own is a recipe of its own."""
    v = doc.get("variant") or {}
    base = runs.get(v.get("base", "")) if v.get("family") and not v.get("set") else None
    return lineage(base, runs) if base is not None else family(doc)


def another_seed(doc: dict, of: dict) -> bool:
    """``doc`` trains the same plan the same way as ``of``, with another seed."""
    return family(doc) == family(of) and same_plan(doc, of) and seed_of(doc) != seed_of(of)


def recovery_lines(main: dict, variants: list[dict]) -> list[str]:
    """One line per run and its seeds that have a recovery pairing: each seed's interval, then the verdict or
    why none."""
    groups: dict[str, list[dict]] = {}
    for doc in (main, *variants):
        if (doc.get("recovery") or {}).get("mean_delta"):
            groups.setdefault(family(doc), []).append(doc)
    out = []
    for name, docs in groups.items():
        if any(not same_plan(d, docs[0]) for d in docs):
            raise SystemExit(f"compress-embedder runs of {name or 'the main run'} hold different plans")
        deltas = [(seed_of(d), d["recovery"]["mean_delta"]) for d in docs]
        head = next((d for d in docs if d.get("variant", {}) and d["variant"]["name"] == name), docs[0])
        label = "the main run" if not name else f"the {head['variant']['label']} run"
        how = recovered_by(docs[0])
        each = "; ".join(f"seed {s}: {interval(d)}" for s, d in deltas)
        what = "the distillation" if how == "distilled" else f"the {how} recovery"
        out.append(f"  - Recovery in {label} ({how} − no recovery, paired per query, mean over the tasks): "
                   f"{each}. " + verdict([d for _, d in deltas], len({s for s, _ in deltas}),
                                         f"{what} recovers quality at this plan", f"{what} loses quality at this plan")
                   + starts_note(docs))
    return (["- **Does the recovery training recover quality?** A verdict needs two seeds with both intervals on "
             "the same side of 0."] + out) if out else []


# the stages whose model a run's no-recovery row evaluates: the dropped model, or the dropped and slimmed one
UNTRAINED = ("drop", "export-mask")


def starts_note(docs: list[dict], who: str = "The seeds") -> str:
    """Seeds of one plan whose pruned starting models differ (a slimming run again on another machine can keep
    other neurons): then the seeds differ in more than the training seed, and the line says so."""
    prints = {}
    for d in docs:
        for r in d["report"]["rows"]:
            if Path(r.get("model") or "").name in UNTRAINED and r.get("fingerprint"):
                prints[seed_of(d)] = r["fingerprint"]
    if len(set(prints.values())) < 2:
        return ""
    each = ", ".join(f"seed {s}: {f[:8]}…" for s, f in prints.items())
    return (f" {who} start from different pruned models ({each}, `fingerprint` of the no-recovery row): "
            "they differ in more than the training seed.")


def recovered_by(doc: dict) -> str:
    return (doc.get("variant") or {}).get("recovery") or "distilled"


def comparison_lines(main: dict, variants: list[dict]) -> list[str]:
    """Two trained models of different runs at the same seed, paired per query, grouped over seeds: a variant
    against the main run (``against_main``, seeds equal) and a variant's second seed against the main run's
    second seed or another variant's (``versus``)."""
    runs = {family(d) if not d.get("variant") else d["variant"]["name"]: d for d in (main, *variants)}
    groups: dict[tuple, list] = {}
    for doc in variants:
        pairs = []
        if family(doc) == doc["variant"]["name"] and seed_of(doc) == seed_of(main):
            pairs = [(label, a, main) for label, a in (doc.get("against_main") or {}).items() if a.get("trained")]
        for a in (doc.get("versus") or {}).values():
            other = runs.get(a["run"])
            if other is not None and seed_of(other) == seed_of(doc):
                pairs.append((a["label"], a, other))
        for label, a, other in pairs:
            key = (lineage(doc, runs), lineage(other, runs))
            groups.setdefault(key, []).append((seed_of(doc), label, a, doc, other))
    out = []
    for entries in groups.values():
        entries.sort(key=lambda e: str(e[0]))
        seeds = {e[0] for e in entries}
        _, label, first, _, _ = entries[0]
        each = "; ".join(f"seed {s}: {interval(a['mean_delta'])}" for s, _, a, _, _ in entries)
        out.append(f"  - {label} − {first['against']} (each at the same seed, paired per query, mean over the "
                   f"tasks): {each}. " + verdict([a["mean_delta"] for _, _, a, _, _ in entries], len(seeds),
                                                f"{label} is better", f"{first['against']} is better")
                   + speed_note(entries) + starts_note([e[3] for e in entries], "The first's seeds")
                   + starts_note([e[4] for e in entries], "The second's seeds"))
    return (["- **Which run is better at the same seed?** A verdict needs two seeds with both intervals on the "
             "same side of 0."] + out) if out else []


def row_speed(doc: dict, label: str) -> dict:
    """The measured speed-ups of the row ``label`` names (a variant's renamed label or the report's own)."""
    names = (doc.get("variant") or {}).get("report_rows") or {}
    return next((r.get("speed") or {} for r in doc["report"]["rows"] if names.get(r["label"], r["label"]) == label
                 or r["label"] == label), {})


def speed_note(entries: list[tuple]) -> str:
    """Each arm's measured speed-ups per seed and the CPU that timed them, since a quality verdict between two
    models says nothing of their speed; whether one arm was the slower in every seed is read from the figures."""
    arms = [(row_speed(doc, label), row_speed(other, a["against"]), doc, other)
            for _, label, a, doc, other in entries]
    if not all("document" in x and "document" in y for x, y, _, _ in arms):
        return ""

    def cpus(doc: dict, other: dict) -> str:
        a, b = ((d.get("bench_machine") or {}).get("cpu") for d in (doc, other))
        if a == b:
            return f"both on {a}" if a else "CPUs not recorded"
        return f"{a or 'a CPU not recorded'} against {b or 'a CPU not recorded'}"

    each = "; ".join(
        f"seed {s}: {x['document']:.2f}× / {x['query']:.2f}× against {y['document']:.2f}× / {y['query']:.2f}× "
        f"({cpus(doc, other)})" for (s, *_), (x, y, doc, other) in zip(entries, arms))
    flops = "; ".join(dict.fromkeys(f"{x['flop_ratio']:.2f}× against {y['flop_ratio']:.2f}×" for x, y, _, _ in arms
                                    if x.get("flop_ratio") and y.get("flop_ratio")))
    note = f" Measured speed-ups (documents / queries, each against the unpruned model in its run's bench): {each}."
    if flops:
        note += f" FLOP ratios: {flops}."
    keys = ("document", "query")
    deltas = [a["mean_delta"] for _, _, a, _, _ in entries]
    # a slower arm that is also the worse one in every seed loses whatever speed the other had to give up
    worse = len(deltas) > 1 and all(d["high"] < 0 for d in deltas)
    better = len(deltas) > 1 and all(d["low"] > 0 for d in deltas)
    if all(x[k] < y[k] for x, y, _, _ in arms for k in keys):
        note += (" The first is the slower in every seed, documents and queries, and the worse: the second is "
                 "faster and better." if worse else
                 " The first is the slower in every seed, documents and queries: not a comparison at equal speed.")
    elif all(x[k] > y[k] for x, y, _, _ in arms for k in keys):
        note += (" The first is the faster in every seed, documents and queries, and the better: it is faster "
                 "and better." if better else " The first is the faster in every seed, documents and queries.")
    else:
        return note
    apart = [str(s) for (s, *_), (_, _, doc, other) in zip(entries, arms) if not cpus(doc, other).startswith("both")]
    if apart:
        note += f" Seed {', '.join(apart)}: the two arms were not timed on one recorded CPU."
    return note


def verdict(deltas: list[dict], seeds: int, above: str, below: str,
            unit: tuple[str, str] = ("training seed", "seeds")) -> str:
    """The words for intervals of ``seeds`` training seeds (or other repeats, ``unit``: singular and plural):
    ``above`` when all exclude 0 above, ``below`` when all exclude it below."""
    one, many = unit
    if seeds < 2:
        return f"One {one}: not a verdict."
    if all(d["low"] > 0 for d in deltas):
        return f"Verdict ({seeds} {many}, every interval above 0): {above}."
    if all(d["high"] < 0 for d in deltas):
        return f"Verdict ({seeds} {many}, every interval below 0): {below}."
    return f"No verdict: the {seeds} {many}' intervals do not all exclude 0 on the same side."


def target_caveats(entries: list[SeedRow], speed: float) -> list[str]:
    """What a kept mean can hide: a task every seed loses on, and a speed-up the pruning's FLOP ratio does not
    reach by itself (the rest is the row's number format)."""
    found = []
    for task in entries[0].tasks:
        deltas = [e.tasks.get(task, {}).get("delta") for e in entries]
        if all(d and d["high"] < 0 for d in deltas):
            found.append(f"Below the unpruned model on {task} in every seed: "
                         f"{'; '.join(interval(d) for d in deltas)}.")
    flops = [e.speed.get("flop_ratio") for e in entries]
    if all(f and f < speed for f in flops):
        found.append(f"The pruning's FLOP ratio is {max(flops):.2f}×: " + (
            "the rest of the speed-up is the number format's." if all(e.number_format for e in entries) else
            "the measured speed-up exceeds it."))
    return found


def target_lines(main: dict, variants: list[dict], ref: dict, target: tuple[float, float] = TARGET) -> list[str]:
    """Every row measured at the target speed-up, grouped over a run's seeds: whether the low end of its paired
    interval keeps the target share of the unpruned mean. "Shown" needs two seeds that both keep it."""
    speed, share = target
    bar = (share - 1) * ref["mean"]
    groups: dict[tuple, list[SeedRow]] = {}
    for doc in (main, *variants):
        names = (doc.get("variant") or {}).get("report_rows") or {}
        for r in doc["report"]["rows"]:
            sp, delta = r.get("speed") or {}, r.get("mean_delta")
            # the run's own trained model (and it in int8 or bfloat16), not the rows every run shares
            trained = Path(r.get("model") or "").parent.name == "distill"
            if trained and delta and min(sp.get("document", 0), sp.get("query", 0)) >= speed:
                label = names.get(r["label"], r["label"])
                groups.setdefault((family(doc), r["label"]), []).append(
                    SeedRow(seed_of(doc), label, sp, delta, r.get("tasks") or {},
                            (r.get("fingerprint") or "").partition("+")[2]))
    out = []
    for entries in groups.values():
        entries.sort(key=lambda e: str(e.seed))
        keeps = [e.delta["low"] >= bar for e in entries]
        seeds = len({e.seed for e in entries})
        each = "; ".join(f"seed {e.seed}: {interval(e.delta)} at {e.speed['document']:.2f}× / "
                         f"{e.speed['query']:.2f}×, {'keeps' if k else 'misses'}" for e, k in zip(entries, keeps))
        words = ("not shown: a seed's low end is under the bar" if not all(keeps) else
                 f"shown ({seeds} seeds, every low end above the bar)" if seeds >= 2 else
                 "kept in one training seed: not shown")
        line = f"  - {entries[0].label}: {each}. {words[0].upper()}{words[1:]}."
        if all(keeps):
            line += "".join(f" {c}" for c in target_caveats(entries, speed))
        out.append(line)
    head = (f"- **≥ {speed:g}× at ≥ {share:g} of the unpruned mean?** The trained rows of the table below "
            f"measured at ≥ {speed:g}× for both documents and queries; the bar is a paired interval whose low end "
            f"is at least {bar:+.4f} ({share:g} × {ref['mean']:.4f} − {ref['mean']:.4f}), in two training seeds.")
    return [head] + out if out else [head, "  - No row is measured at that speed-up."]
