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


def render_gaprune_embedder(results: Path) -> list[str]:
    d = section_result(results / "gaprune_embedder.json",
                       {"report", "retrained", "dai", "masks", "against_magnitude", "stages", "command"},
                       "benchmarks/gaprune_embedder.py")
    if d is None:
        return []
    minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
    out = [f"## {d['title']}", "",
           f"`{d['command']}` ({d['code_version']}; via `.venv/bin/python benchmarks/gaprune_embedder.py`, "
           f"{minutes:.0f} min of stages on 2 CPU cores). Scaled: 120 general triplets (GAPrune: 5,000), "
           "retraining 40 LoRA steps (GAPrune: 100)"
           + ("" if "msmarco_trecdl_subset" in d["report"]["tasks"] else
              "; the MS MARCO subset, a general eval, is left out (the recipe's `tasks` param)")
           + ". SciFact train is in the general calibration set and shares judged documents with scifact_small, so "
           "scifact_small is an in-domain check here. One retraining seed: no row is called better or worse than "
           "another.", "",
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
    for title, rep in (("**One-shot** (GAPrune Table 1)", d["report"]),
                       ("**Retrained on FinanceBench train** (GAPrune Table 2)", d["retrained"])):
        out += ["", title, "", compare.markdown(rep)]
    return out + [""]
