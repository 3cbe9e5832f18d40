"""``dsprune eval``: score a model on retrieval, classification and STS tasks through mteb, and optionally
its embedding geometry.

Writes ``results.json`` (main scores, per-query nDCG@10 of retrieval tasks for paired comparisons, the
model's fingerprint) beside a copy of the model's manifest, in a fresh output folder. Nothing is cached
between runs: a score always belongs to the checkpoint whose fingerprint sits next to it.
"""
from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import formats
from ..errors import DsPruneError


@dataclass
class Args:
    model: str = field(metadata={"help": "model folder (HF, sentence-transformers, dsprune export) or .gguf"})
    out: str = field(metadata={"help": "output folder for results.json"})
    task: list[str] = field(default_factory=list, metadata={
        "help": "NAME (mteb/dsprune task or suite: beir13, finmteb, chemteb) or NAME=FOLDER (local folder: BEIR for "
                "retrieval, train/<split>.jsonl of text+label for classification, <split>.jsonl of "
                "sentence1+sentence2+score for STS)"})
    split: Optional[str] = field(default=None, metadata={"help": "split (default: test, or the task's own)"})
    batch_size: int = 32
    max_length: Optional[int] = field(default=None, metadata={"help": "override the encoder's max_length"})
    dtype: str = "float32"
    device: str = "cpu"
    threads: Optional[int] = field(default=None, metadata={"help": "torch threads (default: leave as is)"})
    geometry: bool = field(default=False, metadata={"help": "also compute embedding geometry metrics"})
    geometry_data: Optional[str] = field(default=None, metadata={
        "help": "BEIR folder for geometry pairs (default: the first local retrieval task's folder)"})
    geometry_samples: int = 1000
    reference: Optional[str] = field(default=None, metadata={
        "help": "reference model for geometry's cosine-to-reference (e.g. the unpruned model)"})
    overwrite: bool = False
    quiet: bool = field(default=False, metadata={"help": "no progress bars"})


def _load(path: str, args: Args):
    from ..encoder import Encoder
    enc = Encoder.load(path, dtype=args.dtype, device=args.device)
    if args.max_length is not None:
        enc.config = dataclasses.replace(enc.config, max_length=args.max_length)
    return enc


def run(args: Args) -> int:
    import torch

    from ..eval import evaluate, geometry, tasks
    from ..eval.mteb_model import MtebEncoder, fingerprint

    if not args.task and not args.geometry:
        raise DsPruneError("nothing to do: give --task NAME[=FOLDER] ... and/or --geometry")
    out = Path(args.out)
    if out.exists() and not args.overwrite:
        raise DsPruneError(f"output folder exists: {out} (pass --overwrite to replace it)")
    from ..packaged import model_path
    model_dir = Path(model_path(args.model))     # `smollm2` works here as anywhere a path does
    if not model_dir.exists():
        raise DsPruneError(f"model not found: {model_dir}")
    if args.threads:
        torch.set_num_threads(args.threads)

    specs = [s for t in args.task for s in tasks.resolve(t, args.split)]
    names = [s.name for s in specs]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise DsPruneError(f"task(s) given twice: {', '.join(dup)}")
    loaded = evaluate.load_tasks(specs)          # bad data fails here, before the model loads
    beir = [s for s in specs if s.folder and s.type == "Retrieval"]
    geo_folder = args.geometry_data or next((str(s.folder) for s in beir), None)
    if args.geometry and geo_folder is None:
        raise DsPruneError("--geometry needs a BEIR folder: pass --geometry_data FOLDER or a NAME=FOLDER "
                           "retrieval task")
    geo_split = args.split or next((s.split for s in beir), "test")
    pairs = geometry.pairs_from_beir(geo_folder, geo_split, args.geometry_samples) if args.geometry else None

    weights_dir = model_dir.parent if str(model_dir).endswith(".gguf") else model_dir
    fp = fingerprint(weights_dir)
    enc = _load(str(model_dir), args)
    model = MtebEncoder(enc, model_dir.name, fp, {s.name: s.instruction for s in specs},
                        batch_size=args.batch_size, show_progress=not args.quiet)
    print(f"model {model_dir} ({model.mteb_model_meta.n_parameters / 1e6:.1f}M params, fingerprint {fp[:12]}); "
          f"encoder: pooling={enc.config.pooling} normalize={enc.config.normalize} "
          f"max_length={enc.config.max_length} query_max_length={enc.config.query_max_length}")
    results = evaluate.run(model, specs, loaded, batch_size=args.batch_size)

    geo = None
    if args.geometry:
        qs, ps = pairs
        kw = dict(batch_size=args.batch_size, show_progress=not args.quiet)
        q, p = enc.encode(qs, "query", **kw), enc.encode(ps, "passage", **kw)
        q_ref = p_ref = None
        if args.reference:
            ref = _load(args.reference, args)
            q_ref, p_ref = ref.encode(qs, "query", **kw), ref.encode(ps, "passage", **kw)
            del ref
        geo = {"data": geo_folder, "split": geo_split, "reference": args.reference,
               **geometry.geometry(q, p, q_ref, p_ref)}

    import mteb
    manifest_src = weights_dir / formats.MANIFEST
    doc = {"model": str(model_dir.resolve()), "fingerprint": fp, "params": model.mteb_model_meta.n_parameters,
           "encoder": dataclasses.asdict(enc.config), "mteb_version": mteb.__version__,
           "model_manifest": formats.MANIFEST if manifest_src.is_file() else None,
           "tasks": results}
    if geo is not None:
        doc["geometry"] = geo
    figures = {n: {"ndcg_at_10": r.get("ndcg_at_10"), "recall_at_100": r.get("recall_at_100"),
                   "main_score": r["main_score"], "main_metric": r["main_metric"]} for n, r in results.items()}
    with formats.output_dir(out, args.overwrite) as tmp:
        formats.write_results(tmp, doc)
        if manifest_src.is_file():
            shutil.copy(manifest_src, tmp / "model_manifest.json")
        formats.write_manifest(tmp, "eval", {"model": str(model_dir.resolve()), "fingerprint": fp,
                                             "tasks": {s.name: s.source for s in specs}},
                               dataclasses.asdict(args), figures)
    print(table(results, geo))
    print(f"wrote {out / formats.RESULTS}")
    return 0


def table(results: dict, geo: dict | None = None) -> str:
    """One row per task: nDCG@10 and R@100 for retrieval, the main score (and its metric) for every task."""
    rows = [f"{'task':<24} {'type':<14} {'split':<6} {'queries':>7} {'nDCG@10':>8} {'R@100':>7} {'main':>7} "
            f"{'metric':<15}  source"]
    for name, r in results.items():
        nd, rc = r.get("ndcg_at_10"), r.get("recall_at_100")
        rows.append(f"{name:<24} {r.get('type', ''):<14} {r['split']:<6} {r.get('num_queries', ''):>7} "
                    f"{'' if nd is None else f'{nd:.4f}':>8} {'' if rc is None else f'{rc:.4f}':>7} "
                    f"{r['main_score']:>7.4f} {r.get('main_metric', ''):<15}  {r['source']}")
    if geo:
        keys = ("uniformity", "alignment", "cross_dim_correlation", "effective_dim", "isotropy",
                "cosine_to_reference")
        rows.append("geometry: " + ", ".join(f"{k}={geo[k]:.4g}" for k in keys if k in geo))
    return "\n".join(rows)
