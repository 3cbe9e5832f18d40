"""``dsprune eval``: a model's retrieval, classification and STS scores through mteb, and its embedding geometry.

Writes ``results.json`` (main scores, per-query nDCG@10 of retrieval tasks for paired comparisons, the model's
fingerprint) beside a copy of the model's manifest. Nothing is cached between runs: a score always belongs to
the checkpoint whose fingerprint sits next to it.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import random
import shutil
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Optional

from .. import formats
from ..errors import DsPruneError
from .common import QuantizeArgs, load_encoder, torch_threads


@dataclass
class Args(QuantizeArgs):
    out: Optional[str] = field(default=None, metadata={"help": "output folder for results.json "
                                                               "(default: out/eval-<model>-<time>)"})
    task: list[str] = field(default_factory=list, metadata={"help": (
        "NAME (mteb/dsprune task or suite: beir13, finmteb, chemteb) or NAME=FOLDER (local folder: BEIR for retrieval, "
        "train/<split>.jsonl of text+label for classification, <split>.jsonl of sentence1+sentence2+score for STS)")})
    split: Optional[str] = field(default=None, metadata={"help": "split (default: test, or the task's own)"})
    batch_size: int = 32
    max_length: Optional[int] = field(default=None, metadata={"help": "override the encoder's max_length"})
    encoder: Optional[str] = field(default=None, metadata={
        "help": "encoder config overrides as JSON, as the trainer takes them (e.g. "
                "'{\"pooling\": \"last\", \"append_eos\": true}'); the results' fingerprint records them"})
    threads: Optional[int] = field(default=None, metadata={"help": "torch threads (default: leave as is)"})
    geometry: bool = field(default=False, metadata={"help": "also compute embedding geometry metrics"})
    geometry_data: Optional[str] = field(default=None, metadata={
        "help": "BEIR folder for geometry pairs (default: the first local retrieval task's folder)"})
    geometry_samples: int = 1000
    reference: Optional[str] = field(default=None, metadata={
        "help": "reference model for geometry's cosine-to-reference (e.g. the unpruned model)"})
    overwrite: bool = False
    quiet: bool = field(default=False, metadata={"help": "print nothing but the result table"})


def run(args: Args) -> int:
    from ..eval import evaluate, tasks
    from ..packaged import model_path

    if not args.task and not args.geometry:
        raise DsPruneError("nothing to do: give --task NAME[=FOLDER] ... and/or --geometry")
    from ..encoder import config_overrides
    over = config_overrides(args.encoder)        # a misspelt option fails before any model or task loads
    model_dir = Path(model_path(args.model))     # `smollm2` works here as anywhere a path does
    if args.out is None:                         # as mteb does: a fresh folder per run, named by model and time
        args.out = f"out/eval-{model_dir.name.removesuffix('.gguf')}-{time.strftime('%Y%m%d-%H%M%S')}"
    out = formats.check_output(args.out, args.overwrite)
    if not model_dir.exists():
        raise DsPruneError(f"model not found: {model_dir}")
    weights_dir = model_dir.parent if str(model_dir).endswith(".gguf") else model_dir
    with torch_threads(args.threads), _silenced(args.quiet):
        specs = [s for t in args.task for s in tasks.resolve(t, args.split)]
        dup = sorted(n for n, c in Counter(s.name for s in specs).items() if c > 1)
        if dup:
            raise DsPruneError(f"task(s) given twice: {', '.join(dup)}")
        # bad task data fails in load_tasks, before the model loads
        doc = _evaluate(args, model_dir, weights_dir, specs, evaluate.load_tasks(specs), over)
        figures = {n: {"ndcg_at_10": r.get("ndcg_at_10"), "recall_at_100": r.get("recall_at_100"),
                       "main_score": r["main_score"], "main_metric": r["main_metric"]}
                   for n, r in doc["tasks"].items()}
        with formats.output_dir(out, args.overwrite) as tmp:
            formats.write_results(tmp, doc)
            if doc["model_manifest"]:
                shutil.copy(weights_dir / formats.MANIFEST, tmp / "model_manifest.json")
            formats.write_manifest(tmp, "eval", {"model": doc["model"], "fingerprint": doc["fingerprint"],
                                                 "tasks": {s.name: s.source for s in specs}},
                                   dataclasses.asdict(args), figures)
    print(table(doc["tasks"], doc.get("geometry")))
    if not args.quiet:
        print(f"wrote {out / formats.RESULTS}")
    return 0


@contextlib.contextmanager
def _silenced(quiet: bool) -> Iterator[None]:
    """With --quiet, what the libraries print while the model loads and encodes (progress bars, load reports)
    goes nowhere; an error still reaches the user, printed by the CLI once the block is left."""
    if not quiet:
        yield
        return
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null), contextlib.redirect_stderr(null):
        yield


def _texts(node) -> Iterator[str]:
    """Every text an mteb task's loaded data will have encoded: retrieval corpus and queries, the text
    columns of classification and STS splits, through any nesting of subsets and splits."""
    if hasattr(node, "corpus") and hasattr(node, "queries"):
        for part in (node.corpus, node.queries):
            yield from _texts(part)
    elif hasattr(node, "column_names"):
        for column in ("text", "sentence1", "sentence2"):
            if column in node.column_names:
                yield from (t for t in node[column] if isinstance(t, str))
    elif isinstance(node, dict):
        for value in node.values():
            yield from _texts(value)


def estimate(enc, texts: list[str], batch_size: int, seed: int = 0) -> dict:
    """Roughly how long encoding ``texts`` takes: one timed batch of a random sample gives the seconds per
    token at this max length, the sample's truncated token counts the tokens of all texts. Said before the
    encoding starts, so a run that would take hours (a long max length on CPU) can be stopped and shortened."""
    if not texts:
        return {"texts": 0, "tokens": 0, "seconds": 0.0}
    rng = random.Random(seed)
    sample = rng.sample(texts, min(len(texts), 256))
    lengths = [len(ids) for ids in enc.token_ids(sample, "passage")]
    timed = sample[:batch_size]
    enc.encode(timed[:2], "passage", batch_size=2, show_progress=False)                    # warm-up
    t0 = time.perf_counter()
    enc.encode(timed, "passage", batch_size=batch_size, show_progress=False)
    per_token = (time.perf_counter() - t0) / max(1, sum(lengths[:len(timed)]))
    tokens = sum(lengths) / len(lengths) * len(texts)
    return {"texts": len(texts), "tokens": int(tokens), "seconds": tokens * per_token}


def _evaluate(args: Args, model_dir: Path, weights_dir: Path, specs: list, loaded, over: dict) -> dict:
    """results.json's document: the tasks' scores, and the embedding geometry if asked; ``over``: the checked
    ``--encoder`` options."""
    import mteb

    from ..encoder import inference_fingerprint, overridden_fingerprint
    from ..eval import evaluate, geometry
    from ..eval.mteb_model import MtebEncoder, fingerprint

    beir = [s for s in specs if s.folder and s.type == "Retrieval"]
    geo_folder = args.geometry_data or next((str(s.folder) for s in beir), None)
    if args.geometry and geo_folder is None:
        raise DsPruneError("--geometry needs a BEIR folder: pass --geometry_data FOLDER or a NAME=FOLDER "
                           "retrieval task")
    geo_split = args.split or next((s.split for s in beir), "test")
    pairs = geometry.pairs_from_beir(geo_folder, geo_split, args.geometry_samples) if args.geometry else None
    fp = overridden_fingerprint(inference_fingerprint(fingerprint(weights_dir), args.quantize, args.quantize_skip,
                                                      args.dtype), over)
    enc = load_encoder(args, str(model_dir), quantize=args.quantize, quantize_skip=args.quantize_skip,
                       **{**over, "max_length": args.max_length})
    model = MtebEncoder(enc, model_dir.name, fp, {s.name: s.instruction for s in specs},
                        batch_size=args.batch_size, show_progress=not args.quiet)
    shown = ("pooling", "normalize", "max_length", "query_max_length")
    print(f"model {model_dir} ({model.mteb_model_meta.n_parameters / 1e6:.1f}M params, fingerprint {fp[:12]}); "
          "encoder: " + " ".join(f"{k}={getattr(enc.config, k)}" for k in shown))
    if not args.quiet:
        guess = estimate(enc, [t for task in loaded for t in _texts(task.dataset)], args.batch_size)
        print(f"max length {enc.config.max_length} tokens (--max_length to change): {guess['texts']:,} texts, "
              f"~{guess['tokens']:,} tokens, about {_duration(guess['seconds'])} to encode (estimate)", flush=True)
    results = evaluate.run(model, specs, loaded, batch_size=args.batch_size)
    doc = {"model": str(model_dir.resolve()), "fingerprint": fp, "params": model.mteb_model_meta.n_parameters,
           "encoder": dataclasses.asdict(enc.config), "mteb_version": mteb.__version__,
           "model_manifest": formats.MANIFEST if (weights_dir / formats.MANIFEST).is_file() else None,
           "tasks": results}
    if args.geometry:                            # the reference, if any, is embedded on the same pairs
        kw = dict(batch_size=args.batch_size, show_progress=not args.quiet)
        encs = [enc] + ([load_encoder(args, args.reference, max_length=args.max_length)] if args.reference else [])
        embs = [x for e in encs for x in (e.encode(pairs[0], "query", **kw), e.encode(pairs[1], "passage", **kw))]
        doc["geometry"] = {"data": geo_folder, "split": geo_split, "reference": args.reference,
                           **geometry.geometry(*embs)}
    return doc


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200 else \
        f"{seconds / 3600:.1f} h"


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
        keys = ("uniformity", "alignment", "cross_dim_correlation", "effective_dim", "isotropy", "cosine_to_reference")
        rows.append("geometry: " + ", ".join(f"{k}={geo[k]:.4g}" for k in keys if k in geo))
    return "\n".join(rows)
