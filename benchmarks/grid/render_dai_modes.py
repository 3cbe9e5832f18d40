"""Which DAI each row used, and how far each DAI mode's mask is from magnitude's (``benchmarks/dai_modes.py``).

A DAI row's label names its alignment because the modes disagree on what GAPrune is: the rows are read from
their own stage commands, never assumed, so a row made with other options says so."""
from __future__ import annotations

import dataclasses
import os
import shlex
from pathlib import Path

from .section import grid_dense_fingerprint, model_with_weights, model_words, section_result

NEGLIGIBLE = 1e-3       # a Fisher term this far below γ√|θ| on average can reorder few weights beyond the alignment

MODES_JSON = "dai_modes.json"            # SmolLM2 as it ships
MODES_OTHERS = "dai_modes_*.json"         # every other model, by benchmarks._common.results_name


def _options(command: str) -> dict[str, str]:
    toks = shlex.split(command)
    return {t[2:]: v for t, v in zip(toks, toks[1:]) if t.startswith("--")}


def _default(args_class, name: str) -> str:
    return str(next(f.default for f in dataclasses.fields(args_class) if f.name == name))


def dai_mode(doc: dict | None) -> dict | None:
    """Alignment, scoring variant and Fisher scale of a row's DAI mask, from its ``prune`` stage (recomputed from
    saved statistics) or else its ``dai`` stage; an option not given is that command's default. None: no DAI."""
    from dsprune.commands import dai, prune

    stages = (doc or {}).get("stages") or []
    pruned = [_options(s["command"]) for s in stages if s.get("command") and "-prune-" in s["name"]]
    pruned = [o for o in pruned if o.get("method") == "dai"]
    if not pruned:
        return None
    p = pruned[-1]
    if p.get("dai_recompute", "false").lower() in ("true", "1"):
        return {"alignment": p.get("dai_alignment", _default(prune.Args, "dai_alignment")),
                "variant": p.get("dai_variant", _default(prune.Args, "dai_variant")),
                "fisher_scale": p.get("dai_fisher_scale", _default(prune.Args, "dai_fisher_scale"))}
    made = [_options(s["command"]) for s in stages if s.get("command") and s["name"].endswith("-dai")]
    o = made[-1] if made else {}
    return {"alignment": o.get("alignment", _default(dai.Args, "alignment")),
            "variant": o.get("variant", _default(dai.Args, "variant")),
            "fisher_scale": o.get("fisher_scale", _default(dai.Args, "fisher_scale"))}


def dai_tag(doc: dict | None) -> str:
    """What a DAI row's label adds: its alignment, and its scoring when not Eq. 5."""
    m = dai_mode(doc)
    if m is None:
        return ""
    return f" · {m['alignment']} alignment" + ("" if m["variant"] == "paper" else f", {m['variant']} scoring")


def rows_used(docs: dict) -> str:
    """One sentence: the modes the finished DAI rows used, with their rows."""
    used: dict[str, list[str]] = {}
    for r, d in docs.items():
        m = dai_mode(d)
        if m:
            key = f"alignment `{m['alignment']}`, scoring `{m['variant']}`"
            used.setdefault(key, []).append(r)
    return "; ".join(f"{k}: {', '.join(rows)}" for k, rows in used.items())


def render_dai_modes(results: Path, docs: dict) -> list[str]:
    """The section of RESULTS.md: every mode's mask against magnitude's, and the negative Fisher tail, on SmolLM2
    as it ships (``dai_modes.json``) and below it on every other model measured (``dai_modes_<model>.json``)."""
    found = [(p, d) for p in [results / MODES_JSON, *sorted(results.glob(MODES_OTHERS))]
             if (d := section_result(p, {"title", "command", "runs", "modes", "tails", "sparsity"},
                                     "benchmarks/dai_modes.py"))]
    grid_dense = grid_dense_fingerprint(results)
    out = []
    for i, (_, d) in enumerate(found):
        out += dai_modes_section(d, docs, None if i == 0 else f"### The same on {model_words(d)}", grid_dense)
    if found:
        out += ["Source: " + ", ".join(f"[{p.name}]({os.path.relpath(p, results.parent)})" for p, _ in found) + ".",
                ""]
    return out


def tail_table(tails: dict, beta: float, gamma: float) -> list[str]:
    """Per statistics run and matrix kind, where β·F_gen outweighs F_dom and how far (``dai_modes.tails``)."""
    out = [f"**Where β·F_gen outweighs F_dom** (β = {beta}, γ = {gamma}): the share of weights with "
           "F_dom − β·F_gen < 0, and r = (F_dom − β·F_gen)·|θ| / (γ·√|θ|) there. r < −1 makes Eq. 5's score "
           "negative, below every weight magnitude would keep; *balanced* applies the Fisher scale of the "
           "balanced mode.", "",
           "| statistics | matrix | F_dom − β·F_gen < 0 | median r there | 1st percentile r | smallest r | "
           "r < −1 as written | r < −1 balanced |", "|---|---|---|---|---|---|---|---|"]
    for run, t in tails.items():
        for kind, x in t["kinds"].items():
            out.append(f"| {run} | {kind} | {x['negative_fraction']:.1%} | {x['r_median_of_negative']:.2g} | "
                       f"{x['r_p01_of_negative']:.2g} | {x['r_min']:.2g} | {x['below_minus_one']:.3%} | "
                       f"{x['below_minus_one_balanced']:.2%} |")
    return out


def tail_words(tails: dict) -> str:
    """How many weights the Fisher term as written pushes below zero, in words."""
    worst = max(x["below_minus_one"] for t in tails.values() for x in t["kinds"].values())
    return ("no weight has r < −1" if worst == 0 else
            f"at most {worst:.1e} of a matrix kind's weights have r < −1")


def dai_modes_section(d: dict, docs: dict, heading: str | None, grid_dense: str | None) -> list[str]:
    runs = d["runs"]
    pct = f"{d['sparsity']:.0%}"
    model = model_with_weights(d, grid_dense, "whose masks are not the grid rows' masks")
    on_grid_dense = d.get("model_fingerprint") is not None and d.get("model_fingerprint") == grid_dense
    out = [heading or f"## {d['title']}", "",
           f"`{d['command']}` ({d.get('code_version')})."
           + ("" if heading else " Which DAI the rows above used, read from their stage commands: "
              f"{rows_used(docs) or 'no DAI row finished'}."), "",
           f"Statistics: two `dsprune dai` runs on {model} with at most {d['max_triplets']} triplets per set "
           f"(drawn seeded, no k-means) from {', '.join(f'`{g}`' for g in d['general'])} (general) and "
           f"{', '.join(f'`{g}`' for g in d['domain'])} (domain), ≤ {d['max_length']} tokens: "
           + "; ".join(f"*{name}* (`{r['command']}`, {r['n_general']} + {r['n_domain']} triplets)"
                       for name, r in runs.items())
           + ". Every mode is recomputed from them. "
           + ("The grid's DAI rows scored this model with other triplets (k-means sampled); their statistics are "
              "not kept (`out/` is not committed)." if on_grid_dense else
              "The grid's DAI rows scored the grid's dense retriever (`gap-*`) or it after FinanceBench retraining "
              "(`gapft-*`), and their statistics are not kept (`out/` is not committed): these show what each mode "
              "does to a mask of this model, not the rows' own masks."), "",
           f"| mode | statistics | alignment | scoring | Fisher term / γ·√\\|θ\\| | decision differs from "
           f"magnitude at {pct} | gate / up / down | what |", "|---|---|---|---|---|---|---|---|"]
    for m in d["modes"]:
        ratio = m.get("fisher_term_over_magnitude_term")
        scale = m.get("fisher_scale_applied")
        term = "–" if ratio is None else f"{ratio:.2g}" + (f" (× {scale:.3g})" if scale not in (None, 1.0) else "")
        kinds = " / ".join(f"{v:.2%}" for v in m["differs_by_kind"].values())
        out.append(f"| {m['name']} | {m['stats']} | {m.get('alignment', '–')} | {m.get('variant', '–')} | {term} | "
                   f"{m['differs_from_magnitude']:.2%} | {kinds} | {m['what'].replace('|', chr(92) + '|')} |")
    out += [""] + tail_table(d["tails"], d["beta"], d["gamma"])
    by = {m["name"]: m["differs_from_magnitude"] for m in d["modes"]}
    written = [r for m in d["modes"] if (r := m.get("fisher_term_over_magnitude_term")) is not None
               and m.get("fisher_scale_applied") in (None, 1.0)]
    if written and max(written) < NEGLIGIBLE:
        out += ["", f"As written the Fisher term is below {NEGLIGIBLE:g} of γ√|θ| on average in every mode, and "
                f"{tail_words(d['tails'])}, so it can move few weights: what separates an Eq. 5 mode's mask from "
                "magnitude's is then mostly its alignment factor"
                + (f" (consistency {by['consistency']:.2%}, Eq. 4 {by['eq4']:.2%} of the decisions)"
                   if {"consistency", "eq4"} <= set(by) else "")
                + "; an inference from the averages and the tail, as no mode here separates the two terms. The "
                "reference code's z-scores each matrix."]
    else:
        out += ["", f"Where β·F_gen outweighs F_dom: {tail_words(d['tails'])}."]
    return out + [""]
