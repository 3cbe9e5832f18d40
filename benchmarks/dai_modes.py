"""How far each DAI mode's mask is from magnitude's, and where β·F_gen outweighs F_dom.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/dai_modes.py

Why: every DAI row of the grid used this project's "consistency" alignment, and DAI scored far below magnitude
there. This measures, on one model and one set of triplets, what each reading of GAPrune does to the mask:
Eq. 4 as written ("eq4"), the per-matrix cosine ("tensor"), the grid's modes ("consistency", and with the
Fisher term rescaled: "balanced"), and the authors' released code ("reference": batched in-batch Fisher,
smoothed element-wise alignment, per-matrix z-scored softplus; ``gaprune.REFERENCE``). Two ``dsprune dai`` runs
give the statistics — per-sample (Eq. 3) and the reference code's batches — and every mode is recomputed from
them (``dai.compute``, no new gradients). For each mode: the share of the scored MLP weights whose keep/prune
decision at ``--sparsity`` differs from magnitude's (``budget.keep_top``, the global budget ``dsprune prune``
uses). For each statistics run and MLP matrix kind: the share of weights with F_dom − β·F_gen < 0, and how
negative the Fisher term gets against γ·√|θ| (r = (F_dom − β·F_gen)·|θ| / (γ·√|θ|); r < −1 makes Eq. 5's
score negative, below every weight it keeps). A statistics run is reused while its options are unchanged.
Writes ``benchmarks/results/dai_modes[_<model>].json`` (``_common.results_name``) with the command that made it.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import NamedTuple

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, results_name, sh  # noqa: E402
from dsprune.commands.common import weights_of  # noqa: E402

ALPHA, BETA, GAMMA = 0.2, 1.0, 0.5       # Eq. 5's, as the paper sets them


class Mode(NamedTuple):
    name: str
    stats: str            # which statistics run
    alignment: str
    variant: str
    fisher_scale: str
    what: str


MODES = [
    Mode("consistency", "per-sample", "consistency", "paper", "1",
         "this project's graded alignment, Eq. 5: every DAI row of the grid"),
    Mode("eq4", "per-sample", "eq4", "paper", "1", "Eq. 4 as written (cosine of one weight's two mean gradients), Eq. 5"),
    Mode("tensor", "per-sample", "tensor", "paper", "1", "cosine of a whole matrix's mean gradients, Eq. 5"),
    Mode("balanced", "per-sample", "consistency", "paper", "balanced",
         "consistency with the Fisher term rescaled to γ·√|θ|'s mean size: the grid's daibal rows"),
    Mode("reference", "reference", "reference", "reference", "1", "the authors' released code"),
]


def stats_runs() -> dict[str, dict]:
    """``dsprune dai`` options of each statistics run beyond the common ones."""
    from dsprune.importance.gaprune import REFERENCE

    return {"per-sample": {}, "reference": dict(REFERENCE)}


def run_stats(a, name: str, extra: dict, out: Path) -> dict:
    """One ``dsprune dai`` run (reused when its manifest holds the same options); its figures and seconds."""
    from dsprune import formats

    folder = out / name
    opts = {"max_length": a.max_length, "max_triplets": a.max_triplets, "seed": a.seed, **extra}
    cmd = [str(BIN / "dsprune"), "dai", "--model", a.model, "--general", *a.general, "--domain", *a.domain,
           *[x for k, v in opts.items() for x in (f"--{k}", str(v))], "--out", str(folder)]
    seconds = None
    man = formats.read_manifest(folder) if (folder / "manifest.json").is_file() else None
    same = man and all(str(man["config"].get(k)) == str(v) for k, v in opts.items()) and \
        man["config"].get("model") == a.model and man["config"].get("general") == list(a.general) and \
        man["config"].get("domain") == list(a.domain)
    if not same:
        out.mkdir(parents=True, exist_ok=True)
        seconds = sh(cmd + (["--overwrite"] if man else []), out / f"{name}.log", launch_env(OMP_NUM_THREADS="2"))
        man = formats.read_manifest(folder)
    else:
        print(f"reusing {folder}")
    fig = man["figures"]
    keep = ("n_general", "n_domain", "loss_general", "loss_domain", "mean_abs_fisher_term_over_magnitude_term")
    return {"options": opts, "command": shlex.join(["dsprune", *cmd[1:]]), "seconds": seconds,
            **{k: fig[k] for k in keep}}


def kind_of(name: str) -> str:
    """gate_proj / up_proj / down_proj (or the family's names) from a backbone-relative weight name."""
    return name.rsplit(".", 2)[-2]


def tails(theta: dict, f_gen: dict, f_dom: dict, scale: float) -> dict:
    """Per matrix kind: the share with F_dom − β·F_gen < 0 and the spread of r = Fisher term / γ√|θ| there."""
    import numpy as np
    import torch

    by_kind: dict[str, list] = {}
    for n, w in theta.items():
        mag = w.float().abs().flatten()
        net = (f_dom[n].flatten() - BETA * f_gen[n].flatten()).double()
        r = (net * mag.double()) / (GAMMA * mag.double().sqrt()).clamp_min(1e-30)
        by_kind.setdefault(kind_of(n), []).append((net < 0, r))
    out = {}
    for kind, parts in by_kind.items():
        neg = torch.cat([p[0] for p in parts])
        r = torch.cat([p[1] for p in parts])
        rn = r[neg].numpy()
        out[kind] = {"weights": int(neg.numel()), "negative_fraction": float(neg.float().mean()),
                     "r_median_of_negative": float(np.median(rn)) if rn.size else None,
                     "r_p01_of_negative": float(np.percentile(rn, 1)) if rn.size else None,
                     "r_min": float(r.min()),
                     "below_minus_one": float((r < -1).double().mean()),
                     "below_minus_one_balanced": float((scale * r < -1).double().mean())}
    return out


def differs(keep: dict, ref: dict) -> tuple[float, dict]:
    """Share of weights whose decision differs, overall and per matrix kind."""
    total, diff, kinds = 0, 0, {}
    for n, k in keep.items():
        d = int((k != ref[n]).sum())
        total += k.numel()
        diff += d
        kd = kinds.setdefault(kind_of(n), [0, 0])
        kd[0] += d
        kd[1] += k.numel()
    return diff / total, {kind: d / t for kind, (d, t) in kinds.items()}


def measure(a, out: Path) -> dict:
    from dsprune.encoder import Encoder
    from dsprune.importance import dai as D
    from dsprune.importance.baselines import fisher_scores, magnitude_scores
    from dsprune.importance.budget import keep_top
    from dsprune.surgery.mask import target_weights

    runs = {name: run_stats(a, name, extra, out) for name, extra in stats_runs().items()}
    enc = Encoder.load(a.model)
    theta = {n: w.detach().float().cpu() for n, w in target_weights(enc).items()}
    del enc
    magnitude = keep_top(magnitude_scores(theta), a.sparsity)
    modes, tail = [], {}
    for run in runs:
        stats = {s: D.read_stat(out / run, s) for s in ("fisher_gen", "fisher_dom", "grad_gen", "grad_dom")}
        if run == "per-sample":
            d, kinds = differs(keep_top(fisher_scores(theta, stats["fisher_dom"]), a.sparsity), magnitude)
            modes.append({"name": "domain Fisher", "stats": run, "what": "F_dom·|θ| (a baseline, for scale)",
                          "differs_from_magnitude": d, "differs_by_kind": kinds})
        scale = None
        for m in (m for m in MODES if m.stats == run):
            p = D.DaiParams(ALPHA, BETA, GAMMA, m.alignment, m.variant, m.fisher_scale)
            res = D.compute(theta, stats["fisher_gen"], stats["fisher_dom"], stats["grad_gen"], stats["grad_dom"],
                            theta.__getitem__, p)
            d, kinds = differs(keep_top(res.dai, a.sparsity), magnitude)
            modes.append({**m._asdict(), "differs_from_magnitude": d, "differs_by_kind": kinds,
                          "negative_score_fraction": float(sum(int((s < 0).sum()) for s in res.dai.values()))
                          / sum(s.numel() for s in res.dai.values()),
                          "fisher_term_over_magnitude_term": res.fisher_ratio,
                          "fisher_scale_applied": res.fisher_scale})
            scale = D.balanced_scale(res.fisher_ratio)
            del res
        tail[run] = {"balanced_scale": scale,
                     "kinds": tails(theta, stats["fisher_gen"], stats["fisher_dom"], scale)}
        del stats
    return {"runs": runs, "modes": modes, "tails": tail, "scored_weights": sum(w.numel() for w in theta.values())}


def table(doc: dict) -> str:
    lines = [f"{'mode':<16} {'statistics':<11} differs from magnitude at {doc['sparsity']:.0%}   by kind"]
    for m in doc["modes"]:
        kinds = ", ".join(f"{k} {v:.2%}" for k, v in m["differs_by_kind"].items())
        lines.append(f"{m['name']:<16} {m['stats']:<11} {m['differs_from_magnitude']:>8.2%}                      {kinds}")
    lines.append("")
    lines.append("F_dom − β·F_gen < 0 (share), r = Fisher term / γ√|θ| among those: median, 1st percentile; "
                 "share r < −1 (as written / balanced)")
    for run, t in doc["tails"].items():
        for kind, x in t["kinds"].items():
            lines.append(f"{run:<11} {kind:<10} {x['negative_fraction']:.1%}  median {x['r_median_of_negative']:.3g}  "
                         f"p01 {x['r_p01_of_negative']:.3g}  r<−1 {x['below_minus_one']:.3%} / "
                         f"{x['below_minus_one_balanced']:.3%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from dsprune import formats
    from dsprune.settings import data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--general", nargs="+", default=[f"{data_dir('scifact')}:train",
                                                     str(data_dir("msmarco_trecdl_subset") / "triplets.jsonl")])
    ap.add_argument("--domain", nargs="+", default=[f"{data_dir('financebench')}:train"])
    ap.add_argument("--max_triplets", type=int, default=64, help="per dataset, drawn seeded (dsprune dai)")
    ap.add_argument("--max_length", type=int, default=128)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(REPO / "out" / "dai_modes"))
    ap.add_argument("--results", default=None, help="results file (default: benchmarks/results/dai_modes.json "
                    "for smollm2, dai_modes_dense.json for the grid's dense retriever, else dai_modes_<model folder>"
                    ".json)")
    a = ap.parse_args(argv)
    t0 = time.time()
    a.results = a.results or str(REPO / "benchmarks" / "results" / f"{results_name('dai_modes', a.model)}.json")
    doc = {"title": "DAI modes against magnitude", "model": a.model, "model_fingerprint": weights_of(a.model),
           "general": a.general, "domain": a.domain,
           "max_triplets": a.max_triplets, "max_length": a.max_length, "sparsity": a.sparsity,
           "alpha": ALPHA, "beta": BETA, "gamma": GAMMA, **measure(a, Path(a.out))}
    shared = str(data_dir())
    for k in ("general", "domain"):                    # the shared folder's place is not part of the result
        doc[k] = [s.replace(shared, "${shared}/data") for s in doc[k]]
    for r in doc["runs"].values():
        r["command"] = r["command"].replace(shared, "${shared}/data").replace(str(REPO) + "/", "")
    doc["command"] = shlex.join(["flock", "/tmp/dsprune-heavy.lock", ".venv/bin/python", "benchmarks/dai_modes.py",
                                 *(sys.argv[1:] if argv is None else argv)])
    doc["code_version"] = formats.code_version()
    doc["seconds"] = round(time.time() - t0, 1)
    formats.write_json(Path(a.results), doc)
    print(table(doc))
    print(f"wrote {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
