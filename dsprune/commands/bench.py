"""``dsprune bench``: measured encoding speed-up of a (pruned) model over a baseline, beside its FLOP ratio.

Same process, same sampled real inputs, warm-up excluded, the two models timed as pairs of passes in
alternating order; writes ``bench.json`` with the median pairwise speed-up and its min–max, throughputs,
parameters, FLOPs per token at the benched lengths and the flat-index retrieval latency. Speed-ups are ratios
from one run: timings drift 10–15 % between runs on a shared machine. ``--quantize int8`` times the model with
int8 Linear layers against the baseline as it is (float).
"""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import formats
from ..errors import DsPruneError
from ..log import logger
from .common import QuantizeArgs, check_dtype, load_encoder, torch_threads


@dataclass
class Args(QuantizeArgs):
    baseline: str = field(metadata={"help": "reference model (e.g. the unpruned model)"})
    out: str = field(metadata={"help": "output folder for bench.json"})
    data: Optional[str] = field(default=None, metadata={"help": "BEIR folder to sample texts from "
                                                               "(default: shared scifact)"})
    docs: int = 200
    doc_batch: int = 16
    doc_len: int = 256
    queries: int = 256
    query_batch: int = 64
    query_len: int = 32
    repeats: int = field(default=5, metadata={"help": "timed pairs (a model pass and a baseline pass, in "
                                                      "alternating order); the speed-up is their median ratio"})
    warmup: int = 1
    compile: bool = field(default=False, metadata={"help": "torch.compile both models"})
    threads: Optional[int] = field(default=None, metadata={"help": "torch threads (default: OMP_NUM_THREADS "
                                                                   "or torch's choice)"})
    same_texts: bool = field(default=False, metadata={
        "help": "each model tokenises the same texts itself (truncated at doc_len/query_len, padded per batch): "
                "for models with different tokenizers, e.g. a small model a user might pick instead"})
    baseline_dtype: Optional[str] = field(default=None, metadata={
        "help": "the baseline's dtype, when it is not --dtype: e.g. --dtype bfloat16 --baseline_dtype float32 "
                "times a model in bfloat16 against its float32 self"})
    seed: int = 0
    overwrite: bool = False


def run(args: Args) -> int:
    import torch

    from ..encoder import check_quantize, inference_fingerprint
    from ..eval import speed
    from ..eval.mteb_model import fingerprint
    from ..packaged import model_path
    from ..settings import data_dir

    out = formats.check_output(args.out, args.overwrite)
    check_quantize(args.quantize, args.device, args.dtype, args.quantize_skip)
    dtypes = {"model": args.dtype, "baseline": args.baseline_dtype or args.dtype}
    check_dtype(dtypes["baseline"], "--baseline_dtype")
    for n in ("repeats", "docs", "doc_batch", "doc_len", "queries", "query_batch", "query_len"):
        if getattr(args, n) < 1:
            raise DsPruneError(f"bench.{n} must be at least 1")
    folder = Path(args.data) if args.data else data_dir("scifact")
    docs, queries = speed.sample_texts(folder, args.docs, args.queries, args.seed)
    with torch_threads(args.threads):
        models, prints = {}, {}
        for role, path in (("model", args.model), ("baseline", args.baseline)):
            path = model_path(path)                  # `smollm2` works here as anywhere a path does
            p = Path(path)
            if not p.exists():
                raise DsPruneError(f"{role} not found: {p}")
            quantize, skip = (args.quantize, args.quantize_skip) if role == "model" else (None, ())
            models[role] = load_encoder(args, path, quantize=quantize, quantize_skip=skip, dtype=dtypes[role])
            prints[role] = inference_fingerprint(fingerprint(p), quantize, skip, dtypes[role])
        logger.info(f"timing {len(docs)} documents and {len(queries)} queries, {args.repeats} alternating pairs")
        res = speed.bench(models, docs, queries, args.doc_batch, args.doc_len, args.query_batch, args.query_len,
                          args.repeats, args.warmup, args.compile, same_texts=args.same_texts)
        threads = torch.get_num_threads()
    doc = {"model": str(Path(args.model).resolve()), "baseline": str(Path(args.baseline).resolve()),
           "fingerprint": prints, "data": str(folder), "threads": threads,
           "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "torch": torch.__version__,
           "machine": speed.machine(args.device), "settings": dataclasses.asdict(args), **res}
    figures = {k: res[k]["speedup"] for k in ("document", "query")}
    figures.update({f"{k}_speedup_min_max": [res[k]["speedup_pairs"]["min"], res[k]["speedup_pairs"]["max"]]
                    for k in ("document", "query")})
    figures.update({f"{k}_flop_ratio": res[k]["flop_ratio"] for k in ("document", "query")})
    figures["param_ratio"] = res["params"]["ratio"]
    with formats.output_dir(out, args.overwrite) as tmp:
        formats.write_bench(tmp, doc)
        formats.write_manifest(tmp, "bench", {"model": doc["model"], "baseline": doc["baseline"],
                                              "fingerprint": prints, "data": str(folder)},
                               dataclasses.asdict(args), figures)
    print(summary(doc))
    for w in doc["warnings"]:
        print(f"warning: {w}", file=sys.stderr)
    print(f"wrote {out / formats.BENCH}")
    return 0


def summary(doc: dict) -> str:
    from ..encoder import quant_label

    p, st = doc["params"], doc["settings"]
    quant = quant_label(st.get("quantize"), st.get("quantize_skip") or ())
    m = doc.get("machine") or {}
    dtype = st["dtype"] if not st.get("baseline_dtype") else f"model {st['dtype']}, baseline {st['baseline_dtype']}"
    lines = [f"threads={doc['threads']} compile={st['compile']} data={doc['data']} dtype: {dtype}"
             + (f" model quantised: {quant}" if quant else "")
             + (f" on {m['cpu']} ({m['cpu_capability']})" if m else ""),
             f"params: model {p['model'] / 1e6:.2f}M, baseline {p['baseline'] / 1e6:.2f}M, ratio {p['ratio']:.3f} "
             f"(non-embedding ratio {p['non_embedding']['ratio']:.3f})",
             f"{'':<9} {'texts':>5} {'shape':>8} {'model/s':>9} {'base/s':>9} {'speed-up':>8} {'min–max':>11} "
             f"{'MFLOP/tok m':>11} {'MFLOP/tok b':>11} {'FLOP ratio':>10} {'speed-up/FLOP':>13}"]
    for kind in ("document", "query"):
        r = doc[kind]
        sp = r["speedup_pairs"]
        lines.append(f"{kind:<9} {r['texts']:>5} {r['batch_size']:>3}x{r['length']:<4} "
                     f"{r['model']['texts_per_s']:>9.1f} {r['baseline']['texts_per_s']:>9.1f} {r['speedup']:>8.3f} "
                     f"{sp['min']:>5.2f}–{sp['max']:<5.2f} "
                     f"{r['model']['flops_per_token']['total'] / 1e6:>11.2f} "
                     f"{r['baseline']['flops_per_token']['total'] / 1e6:>11.2f} {r['flop_ratio']:>10.3f} "
                     f"{r['speedup_over_flop_ratio']:>13.3f}")
    first = doc["document"]
    if first.get("same_texts"):
        lines.append("same texts, each model with its own tokenizer (truncated at the length, padded per batch): "
                     "MFLOP/tok is at the full length; the FLOP ratio counts each model's own padded positions")
    fmt = {n: first[n]["number_format"] for n in ("model", "baseline")}
    lines.append(f"speed-up: median of {first['pairs']} alternating model/baseline pairs (min–max over the pairs)"
                 + ("" if first["flop_bound"] else f"; the model computes in {fmt['model']}, the baseline in "
                    f"{fmt['baseline']}: the FLOP ratio counts the same multiply-adds and does not bound the "
                    "speed-up"))
    lat = doc["retrieval_latency"]
    lines.append("flat-index retrieval latency (ms/query): " + ", ".join(
        f"{n} {v['ms_per_query']:.4f} ({v['backend']}, {v['index_size']} docs x {v['dim']})" for n, v in lat.items()))
    return "\n".join(lines)
