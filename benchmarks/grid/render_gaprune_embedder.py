"""RESULTS.md's section for GAPrune's Tables 1 and 2 on a trained embedder (``benchmarks/gaprune_embedder.py``):
every mask against the unpruned model one-shot, and against the unpruned model retrained alike, with how far each
mask's decisions are from magnitude's; every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .render_seeds import verdict
from .section import section_result

KEYS = {"report", "retrained", "dai", "masks", "against_magnitude", "stages", "command"}

WHAT = {"dai": "DAI as the paper writes it: per-sample Fisher (Eq. 3), Eq. 4's alignment, Eq. 5",
        "dai-ref": "DAI as the authors' released code computes it: Fisher from batches with in-batch negatives, "
                   "their element-wise alignment and score",
        "fisher": "domain Fisher·|θ| from the same statistics", "magnitude": "|θ|", "wanda": "Wanda, |θ|·‖x‖",
        "random": "random", "neurons": "DAI summed per MLP neuron, whole neurons removed"}


def retraining_line(r: dict | None) -> str:
    """The retraining's settings as the collected stage stamp holds them; None before the retraining has run."""
    if r is None:
        return "retraining: not run yet (`--part oneshot`)"
    return (f"retraining {r['max_steps']} LoRA steps (r={r['lora_r']}, α={r['lora_alpha']}, learning rate "
            f"{r['learning_rate']}) of {r['per_device_batch_size']} queries per rank × {r['ranks']} ranks, groups of "
            f"{r['group_size']} passages, in {r.get('dtype') or 'float32'}, seed {r['seed']} (GAPrune: 100 steps); "
            "every mask and the unpruned control alike")


def retrained_runs(d: dict, results: Path) -> list[dict]:
    """The run ``d`` and every other retraining seed's run (``gaprune_embedder_seed*.json``) whose retraining has
    run, in seed order."""
    others = [section_result(p, KEYS | {"retraining"}, "benchmarks/gaprune_embedder.py --seed")
              for p in sorted(results.glob("gaprune_embedder_seed*.json"))]
    runs = [r for r in (d, *others) if r and r.get("retrained") is not None and r.get("retraining")]
    return sorted(runs, key=lambda r: r["retraining"]["seed"])


def seed_lines(runs: list[dict]) -> list[str]:
    """Table 2 per mask over the retraining seeds: each retrained mask − the unpruned model retrained alike, paired
    per query, and the verdict the seeds allow."""
    if not runs:
        return []
    seeds = len({r["retraining"]["seed"] for r in runs})
    out = ["", f"**Seeds** (Table 2: retrained mask − the unpruned model retrained alike, paired per query, mean "
               f"over the tasks; {seeds} training seed{'s' if seeds > 1 else ''}; a verdict needs two seeds "
               "with both intervals on the same side of 0)", ""]
    for row in runs[0]["retrained"]["rows"]:
        entries = [(r["retraining"]["seed"], next((x for x in r["retrained"]["rows"] if x["label"] == row["label"]),
                                                 None)) for r in runs]
        deltas = [(s, x["mean_delta"]) for s, x in entries if x and x.get("mean_delta")]
        if not deltas:
            continue            # the reference row
        each = "; ".join(f"seed {s}: {compare.interval(dd)}" for s, dd in deltas)
        out.append(f"- {row['label']}: {each}. " + verdict([dd for _, dd in deltas], len(deltas),
                                                            "the retrained mask scores above the retrained control",
                                                            "the retrained mask scores below the retrained control"))
    return out


def render_gaprune_embedder(results: Path) -> list[str]:
    d = section_result(results / "gaprune_embedder.json", KEYS, "benchmarks/gaprune_embedder.py")
    if d is None:
        return []
    runs = retrained_runs(d, results)
    seeds = len({r["retraining"]["seed"] for r in runs})
    minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
    general = sorted({x.get("n_general") for x in d["dai"].values()} - {None})
    out = [f"## {d['title']}", "",
           f"`{d['command']}` ({d['code_version']}; via `.venv/bin/python benchmarks/gaprune_embedder.py`, "
           f"{minutes:.0f} min of stages on 2 CPU cores). Scaled: "
           f"{' / '.join(map(str, general)) or '?'} general triplets (GAPrune: 5,000); "
           + retraining_line(d.get("retraining"))
           + ("" if "msmarco_trecdl_subset" in d["report"]["tasks"] else
              "; the MS MARCO subset, a general eval, is left out (the recipe's `tasks` param)")
           + ". SciFact train is in the general calibration set and shares judged documents with scifact_small, so "
           "scifact_small is an in-domain check here. One-shot masks have no training seed: no one-shot row is "
           "called better or worse than another; "
           + (f"the retraining ran with {seeds} seeds (*Seeds* below)." if seeds > 1 else
              "the retraining one seed: no retrained row is called better or worse either."), "",
           "**The masks**", ""]
    for name, m in d["masks"].items():
        diff = d["against_magnitude"].get(name)
        share = f"; {diff['share']:.2%} of its keep/prune decisions differ from magnitude's" if diff else ""
        out.append(f"- `{name}`: {WHAT.get(name, m.get('method'))} ({m.get('kind')}, sparsity "
                   f"{m.get('sparsity')}){share}.")
    for run, x in d["dai"].items():
        cfg = ", ".join(f"{k} {v}" for k, v in x["config"].items() if v is not None)
        ratio = x.get("mean_abs_fisher_term_over_magnitude_term")
        out.append(f"- DAI statistics `{run}` ({cfg}): {x.get('n_general')} general and {x.get('n_domain')} domain "
                   "triplets" + (f"; mean |Fisher term| / mean γ√|θ| = {ratio:.3g}" if ratio is not None else "")
                   + ".")
    out += ["", "**One-shot** (GAPrune Table 1)", "", compare.markdown(d["report"]),
            "", "**Retrained on FinanceBench train** (GAPrune Table 2)", ""]
    out.append(compare.markdown(d["retrained"]) if d["retrained"] is not None else
               "*pending*: the retraining stages have not run (`benchmarks/gaprune_embedder.py` without "
               "`--part oneshot` runs them and keeps both tables).")
    return out + seed_lines(runs) + [""]
