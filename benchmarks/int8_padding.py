"""Inference speed a user gets without retraining: batches by token count, and dynamic int8 on CPU.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/int8_padding.py

(a) Padding: the share of padded positions in SciFact's query and document batches (the model's own prompts,
    truncation and batch size) when texts are sorted by characters, as ``Encoder.encode`` once did, against
    sorting by token count after tokenising once (``Encoder.batches``).
(b) int8: the pruned model (the compress-embedder recipe's export), the unpruned model with int8 Linear layers,
    the same with the layers ``--skip`` names kept float32 (``--quantize_skip``), and pruned + int8, each against
    the unpruned float32 model: ``dsprune bench`` (median speed-up of alternating pairs, with its min–max) and
    ``dsprune eval --quantize`` on the compress-embedder recipe's three tasks, compared with ``dsprune report``'s
    paired bootstrap over queries.

Stages run in this process through dsprune's own command line, each into ``out/int8_padding/NAME``; a stage
whose command is unchanged and finished is reused. Writes ``benchmarks/results/int8_padding.json`` (with every
command), prints the tables and re-renders RESULTS.md.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, bench_speed, stage, write_and_render  # noqa: E402
from dsprune import formats  # noqa: E402

NAME = "int8_padding"
OUT = REPO / "out" / NAME
MODEL = "embeddinggemma-300m"
RECIPE_OUT = REPO / "out" / "recipes" / "compress-embedder"
PRUNED = RECIPE_OUT / "distill" / "model"
REFERENCE = "unpruned"


def padding(model: str, folder: Path, batch_sizes: list[int], max_length: int) -> dict:
    """Padded share of the batches ``encode`` makes of the folder's queries and documents, character-sorted
    (the old order) against token-sorted (``Encoder.batches``), from one tokenisation of each text."""
    from dsprune.data import doc_text
    from dsprune.encoder import Encoder
    from dsprune.eval.speed import padding_fraction

    enc = Encoder.load(model)
    texts = {"query": [r["text"] for r in formats.read_jsonl(folder / "queries.jsonl", ("_id", "text"))],
             "document": [doc_text(r) for r in formats.read_jsonl(folder / "corpus.jsonl", ("_id",))]}
    rows = []
    for kind, items in texts.items():
        side = "query" if kind == "query" else "passage"
        ids = enc.token_ids(items, side, max_length=max_length)
        by_chars = sorted(range(len(items)), key=lambda i: -len(items[i]))
        for bs in batch_sizes:
            chars = (enc.pad([ids[i] for i in by_chars[s:s + bs]]) for s in range(0, len(ids), bs))
            tokens = (b for _, b in enc.batches(items, side, bs, max_length=max_length))
            rows.append({"kind": kind, "batch_size": bs, "texts": len(items), "real_tokens": sum(map(len, ids)),
                         "by_chars": padding_fraction(chars), "by_tokens": padding_fraction(tokens)})
    return {"data": str(folder), "max_length": max_length, "rows": rows}


def skipped_label(skip: list[str]) -> str:
    return f"int8, {' '.join(skip)} float"


def pruned_model(a, out: Path, log: list) -> str:
    """The recipe's pruned export, else the same drops made here from its plan."""
    if Path(a.pruned).exists():
        return a.pruned
    plan = RECIPE_OUT / "plan"
    if not (plan / "plan.json").is_file():
        raise SystemExit(f"{a.pruned} not found and no plan in {plan}: run recipes/compress-embedder.yaml "
                         "(benchmarks/compress_embedder.py) or pass --pruned")
    return str(stage("drop", ["drop", "--model", a.model, "--plan", str(plan)], out, log))


def measure(a, out: Path) -> dict:
    from dsprune.encoder import inference_fingerprint
    from dsprune.eval.mteb_model import fingerprint
    from dsprune.packaged import model_path
    from dsprune.report import compare

    log: list = []
    pruned = pruned_model(a, out, log)
    variants = {REFERENCE: (a.model, None, ()), "pruned": (pruned, None, ()), "int8": (a.model, "int8", ()),
                **({skipped_label(a.skip): (a.model, "int8", tuple(a.skip))} if a.skip else {}),
                "pruned + int8": (pruned, "int8", ())}
    results, benches = [], {}
    for label, (model, quantize, skip) in variants.items():
        q = (["--quantize", quantize] if quantize else []) + (["--quantize_skip", *skip] if skip else [])
        slug = label.replace(" + ", "-").replace(", ", "-").replace(" ", "-")
        results.append(str(stage(f"eval-{slug}", ["eval", "--model", model, "--task", *a.task, "--max_length",
                                                  str(a.max_length), "--batch_size", str(a.batch_size), "--threads",
                                                  str(a.threads), "--quiet", *q], out, log)))
        if label != REFERENCE:
            benches[label] = stage(f"bench-{slug}", [
                "bench", "--model", model, "--baseline", a.model, "--docs", str(a.docs), "--doc_len", str(a.doc_len),
                "--queries", str(a.queries), "--query_len", str(a.query_len), "--repeats", str(a.pairs),
                "--threads", str(a.threads), *(["--data", a.data] if a.data else []), *q], out, log)
    entries = compare.load_entries(results, [str(b) for b in benches.values()], list(variants))
    speed = {}
    for label, folder in benches.items():
        b = compare.read_bench(folder)
        speed[label] = bench_speed(b)
        speed[label]["warnings"] = b.get("warnings", [])
        speed[label]["threads"] = b["threads"]
    return {"variants": {k: {"model": m, "quantize": q, "quantize_skip": list(sk),
                             "fingerprint": inference_fingerprint(fingerprint(Path(model_path(m))), q, sk)}
                         for k, (m, q, sk) in variants.items()},
            "stages": log, "speed": speed, "report": compare.compare(entries)}


def main(argv: list[str] | None = None) -> int:
    from dsprune.settings import data_dir

    from benchmarks.grid import render

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=MODEL, help="the unpruned float32 model (reference)")
    ap.add_argument("--pruned", default=str(PRUNED.relative_to(REPO)), help="the pruned export")
    ap.add_argument("--task", nargs="+", default=["scifact_small", "financebench", "msmarco_trecdl_subset"],
                    help="eval task(s), NAME or NAME=FOLDER (default: the compress-embedder recipe's)")
    ap.add_argument("--skip", nargs="*", default=["down_proj"],
                    help="Linear layers the extra int8 variant keeps float32 (none: no such variant)")
    ap.add_argument("--data", default=None, help="BEIR folder for padding and bench texts (default: shared scifact)")
    ap.add_argument("--max_length", type=int, default=128, help="eval and padding max length")
    ap.add_argument("--batch_size", type=int, default=32, help="eval batch size (the first padding batch size)")
    ap.add_argument("--padding_batch_sizes", type=int, nargs="*", default=[128], help="more batch sizes for padding")
    ap.add_argument("--pairs", type=int, default=5, help="timed alternating pairs per bench")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--doc_len", type=int, default=256)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--query_len", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=str(OUT))
    ap.add_argument("--results", default=str(render.RESULTS))
    ap.add_argument("--no_render", action="store_true", help="leave RESULTS.md alone")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    doc = {"title": "Inference without retraining: batches by token count, int8 Linear layers on CPU",
           "command": shlex.join([".venv/bin/python", "benchmarks/int8_padding.py", *(argv if argv is not None
                                                                                        else sys.argv[1:])]),
           "code_version": formats.code_version(), "reference": REFERENCE,
           "padding": padding(a.model, Path(a.data) if a.data else data_dir("scifact"),
                              [a.batch_size, *a.padding_batch_sizes], a.max_length),
           **measure(a, out)}
    return write_and_render(Path(a.results), NAME, doc, "\n".join(render.int8_section(doc)), not a.no_render)


if __name__ == "__main__":
    sys.exit(main())
