"""RESULTS.md's section for GAPrune's Tables 1 and 2 on a trained embedder (``benchmarks/gaprune_embedder.py``):
every mask against the unpruned model one-shot, and against the unpruned model retrained alike, with how far each
mask's decisions are from magnitude's; every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .section import section_result

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


def render_gaprune_embedder(results: Path) -> list[str]:
    d = section_result(results / "gaprune_embedder.json",
                       {"report", "retrained", "dai", "masks", "against_magnitude", "stages", "command"},
                       "benchmarks/gaprune_embedder.py")
    if d is None:
        return []
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
           "scifact_small is an in-domain check here. One-shot masks have no training seed, and the retraining "
           "one seed: no row is called better or worse than another.", "",
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
    return out + [""]
