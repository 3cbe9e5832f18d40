"""GAPrune on the dense SmolLM2 retriever: one-shot MLP pruning, DAI vs magnitude vs Fisher vs random.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/gaprune.py > out/gaprune.log 2>&1 &

Every step is a real dsprune command:
  1. ``dsprune sample``: k-means representative sampling of the general triplets (SciFact train qrels with
     random negatives + the shipped MS MARCO triplets) down to ``--n-general`` (GAPrune: 5,000);
  2. ``dsprune dai``: per-sample Fisher and mean gradients on the general sample and on the domain triplets
     (FinanceBench ``qrels/train.tsv`` questions only — the test questions are never seen), DAI (α=0.2, β=1, γ=0.5);
  3. for each sparsity (30 %, 50 % of the MLP weights) and method (dai, magnitude, fisher_dom, fisher_gen,
     random): ``dsprune prune`` (global budget, as the paper), ``dsprune export`` (zeros on disk), and
     ``dsprune eval`` on FinanceBench test (domain) and ``scifact_small`` (general);
  4. prints a table, writes ``gaprune.json`` and ``gaprune.png`` (nDCG@10 vs sparsity per method).
``--structured`` adds DAI/magnitude neuron masks (really smaller models), exported and scored alike.

Scaled for 2 CPU cores: 120 general triplets instead of 5,000, passages cut at 128 tokens; the
model is the SmolLM2-135M-Instruct Q4_1 GGUF dequantised and contrastively trained here (a stand-in for a
base LLM embedder). Outputs that already exist (with a manifest) are reused, so an interrupted run resumes.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import BIN, REPO, sh  # noqa: E402

sys.path.insert(0, str(REPO))

METHODS = ("dai", "dai_balanced", "magnitude", "fisher_dom", "fisher_gen", "random")
# dai_balanced: DAI recomputed from the same statistics with both Fisher terms rescaled so that the Fisher
# term and γ·√|θ| have equal mean size (on real models F is ~1e-5 of it, and Eq. 5 is magnitude × alignment).
EXTRA = {"dai_balanced": ["--method", "dai", "--dai_recompute", "--dai_fisher_scale", "balanced"]}




def done(folder: Path) -> bool:
    return (folder / "manifest.json").is_file()


def dsprune(args: list[str], folder: Path, logs: Path, env: dict) -> None:
    if done(folder):
        print(f"(reusing {folder})", flush=True)
        return
    sh([str(BIN / "dsprune"), *args, "--out", str(folder), "--overwrite"], logs / f"{folder.name}.log", env)


def scores(folder: Path) -> dict:
    doc = json.loads((folder / "results.json").read_text())
    return {t: r.get("ndcg_at_10") for t, r in doc["tasks"].items()}


def main() -> int:
    from dsprune import formats
    from dsprune.settings import data_dir

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(REPO / "out" / "train_dense" / "run" / "model"),
                    help="the dense retriever to prune (default: benchmarks/train_dense.py's output)")
    ap.add_argument("--out", default=str(REPO / "out" / "gaprune"))
    ap.add_argument("--n-general", type=int, default=120, help="k of the k-means sample of general triplets")
    ap.add_argument("--n-domain", type=int, default=0, help="cap on domain triplets (0 = all FinanceBench train)")
    ap.add_argument("--sparsity", type=float, nargs="+", default=[0.3, 0.5])
    ap.add_argument("--methods", nargs="+", default=[m for m in METHODS if m != "fisher_gen"],
                    help="default: all but fisher_gen (GAPrune App. E: it ranks like fisher_dom, r = 0.978)")
    ap.add_argument("--structured", action="store_true", help="also neuron-level DAI and magnitude masks")
    ap.add_argument("--tasks", nargs="+", default=["financebench"],
                    help="eval tasks (add scifact_small for the general side; ~4 min per model)")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    model = Path(a.model)
    if not (model / "config.json").is_file():
        sys.exit(f"dense model not found: {model} (train it with benchmarks/train_dense.py or pass --model)")
    out = Path(a.out)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"), DS_ACCELERATOR="cpu",
               HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    general = [f"{data_dir('scifact')}:train", str(data_dir("msmarco_trecdl_subset") / "triplets.jsonl")]
    domain = [f"{data_dir('financebench')}:train"]
    t0 = time.time()
    timings = {}

    # 1. representative sampling of the general triplets
    t = time.time()
    dsprune(["sample", "--model", str(model), "--input", *general, "--k", str(a.n_general),
             "--seed", str(a.seed), "--max_length", "64"], out / "sample_general", logs, env)
    timings["sample"] = time.time() - t
    # 2. parameter analysis and DAI
    t = time.time()
    dai_args = ["dai", "--model", str(model), "--general", str(out / "sample_general" / "triplets.jsonl"),
                "--domain", *domain, "--max_length", str(a.max_length), "--seed", str(a.seed)]
    if a.n_domain:
        dai_args += ["--max_triplets", str(a.n_domain)]
    dsprune(dai_args, out / "dai", logs, env)
    timings["dai"] = time.time() - t
    dai_fig = json.loads((out / "dai" / "manifest.json").read_text())["figures"]

    # 3. masks, exports, evaluation
    task_args = ["--task", *a.tasks, "--max_length", str(a.max_length), "--quiet"]
    rows = []
    t = time.time()
    dsprune(["eval", "--model", str(model), *task_args], out / "eval_dense", logs, env)
    rows.append({"method": "dense", "kind": "-", "sparsity": 0.0, **scores(out / "eval_dense")})
    runs = [(m, s, False) for s in a.sparsity for m in a.methods]
    if a.structured:
        runs += [(m, s, True) for s in a.sparsity for m in ("dai", "dai_balanced", "magnitude")]
    for method, s, structured in runs:
        tag = f"{method}-{'neurons' if structured else 'weights'}-{int(round(s * 100))}"
        prune_args = ["prune", "--model", str(model), *EXTRA.get(method, ["--method", method]),
                      "--sparsity", str(s), "--scores", str(out / "dai"), "--seed", str(a.seed)]
        if structured:
            prune_args.append("--structured")
        dsprune(prune_args, out / f"mask-{tag}", logs, env)
        dsprune(["export", "--model", str(model), "--mask", str(out / f"mask-{tag}")], out / f"model-{tag}", logs, env)
        dsprune(["eval", "--model", str(out / f"model-{tag}"), *task_args], out / f"eval-{tag}", logs, env)
        man = json.loads((out / f"model-{tag}" / "manifest.json").read_text())
        rows.append({"method": method, "kind": "neurons" if structured else "weights", "sparsity": s,
                     "params": man["params"]["after"], **scores(out / f"eval-{tag}")})
    timings["prune_export_eval"] = time.time() - t

    # 4. table, JSON, plot
    head = f"{'method':<11} {'kind':<8} {'sparsity':>8} " + " ".join(f"{t:>14}" for t in a.tasks)
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['method']:<11} {r['kind']:<8} {r['sparsity']:>8.2f} "
                     + " ".join(f"{(r.get(t) if r.get(t) is not None else float('nan')):>14.4f}" for t in a.tasks))
    table = "\n".join(lines)
    print("\nnDCG@10 (FinanceBench = domain test questions; scifact_small = general)\n" + table)
    print("\nDAI statistics:", json.dumps({k: dai_fig[k] for k in (
        "n_general", "n_domain", "mean_abs_fisher_term_over_magnitude_term", "peak_rss_over_model_fp32")}))
    doc = {"command": " ".join([sys.executable, *sys.argv]), "model": str(model), "general": general,
           "domain": domain, "rows": rows, "dai": dai_fig, "timings_s": timings, "table": table,
           "scaled_settings": {"n_general": a.n_general, "max_length": a.max_length,
                               "note": "GAPrune samples 5,000 triplets per dataset; 2 CPU cores here"},
           "model_note": "SmolLM2-135M-Instruct Q4_1 dequantised, contrastively trained here (stand-in for a base LLM)"}
    formats.write_json(out / "gaprune.json", doc)
    _plot(rows, a.tasks, out / "gaprune.png")
    print(f"\nwrote {out / 'gaprune.json'} and {out / 'gaprune.png'} in {(time.time() - t0) / 60:.1f} min")
    return 0


def _plot(rows: list[dict], tasks: list[str], path: Path) -> None:
    from dsprune.report.figure import pyplot, save_png

    plt = pyplot()

    fig, axes = plt.subplots(1, len(tasks), figsize=(5 * len(tasks), 3.6), squeeze=False)
    dense = next(r for r in rows if r["method"] == "dense")
    for ax, task in zip(axes[0], tasks):
        series = sorted({(r["method"], r["kind"]) for r in rows if r["method"] != "dense"})
        for method, kind in series:
            pts = sorted((r["sparsity"], r.get(task)) for r in rows if (r["method"], r["kind"]) == (method, kind))
            xs = [0.0] + [p[0] for p in pts]
            ys = [dense.get(task)] + [p[1] for p in pts]
            ax.plot(xs, ys, marker="o", ls="-" if kind == "weights" else "--", label=f"{method} ({kind})")
        ax.set_title(task)
        ax.set_xlabel("MLP sparsity")
        ax.set_ylabel("nDCG@10")
        ax.grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.suptitle("One-shot pruning of the dense SmolLM2 retriever")
    fig.tight_layout()
    save_png(fig, path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
