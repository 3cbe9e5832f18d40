"""Peak resident memory of a training step at batch 16 and 256, with and without the gradient cache.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/grad_cache_memory.py

Why: ``--grad_cache_chunk`` claims that an in-batch loss over a large batch needs one chunk's activations, so
a batch of 256 queries (each with its positive and a hard negative: 768 sequences) should cost about what a
batch of 16 does. Each configuration is its own one-rank ``launchers/train.py`` run (ZeRO-2, fp32, full
parameters, 2 steps) because a process's peak only grows; the figures are the trainer's own, from its
manifest: peak RSS after the model and engine are set up, and over the whole run (``dsprune.memory``).
The model is a random Llama (hidden 128, 4 layers) and the texts are long enough to fill ``--seq`` tokens,
so activations, not the model, decide the peak. Writes ``benchmarks/results/grad_cache_memory.json`` and
exits 1 if the cached batch-256 peak exceeds 1.2× the batch-16 peak.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, sh  # noqa: E402

LIMIT = 1.2
WORDS = ("cell membrane transport protein revenue growth fiscal year income cash flow dense retrieval vector "
         "pruning layer model gene expression embryo interest rate bond price bank margin heart attack").split()


def write_data(root: Path, n: int, words: int, seed: int = 0) -> Path:
    rng = random.Random(seed)

    def text(k: int) -> str:
        return " ".join(rng.choice(WORDS) for _ in range(k))
    path = root / "groups.jsonl"
    path.write_text("".join(json.dumps({"query": text(words // 4), "pos": [text(words)], "neg": [text(words)]})
                            + "\n" for _ in range(n)))
    return path


def write_model(path: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import AutoModel

    from dsprune import arch
    from dsprune.encoder import Encoder, EncoderConfig
    from dsprune.tiny import tiny_tokenizer

    torch.manual_seed(0)
    tok = tiny_tokenizer()
    model = AutoModel.from_config(arch.get("llama").tiny_config(len(tok), layers=layers, hidden=hidden,
                                                               intermediate=4 * hidden))
    Encoder(model, tok, EncoderConfig(max_length=512)).save(path)
    return path


def run(root: Path, name: str, model: Path, data: Path, batch: int, chunk: int, seq: int) -> dict:
    from dsprune import formats

    out = root / name
    sh([str(BIN / "python"), str(REPO / "launchers" / "train.py"), "--model", str(model), "--train_data",
        str(data), "--output_dir", str(out), "--overwrite", "--lora", "false", "--group_size", "2",
        "--per_device_batch_size", str(batch), "--grad_cache_chunk", str(chunk), "--max_steps", "2",
        "--save_steps", "0", "--export", "false", "--query_max_length", str(seq), "--passage_max_length", str(seq)],
       env=launch_env(), log=root / f"{name}.log")
    figures = formats.read_manifest(out)["figures"]
    return {"batch": batch, "grad_cache_chunk": chunk, "sequences_per_step": 3 * batch,
            "setup_peak_rss_gb": figures["setup_peak_rss_gb_per_rank"][0],
            "peak_rss_gb": figures["peak_rss_gb_per_rank"][0], "queries_per_s": figures["queries_per_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64, help="query and passage length in tokens")
    ap.add_argument("--chunk", type=int, default=16)
    ap.add_argument("--out", default=str(REPO / "out" / "grad_cache_memory"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "grad_cache_memory.json"))
    a = ap.parse_args()
    root = Path(a.out)
    root.mkdir(parents=True, exist_ok=True)
    model = write_model(root / "model", a.hidden, a.layers)
    data = write_data(root, 512, a.seq * 2)
    runs = {"plain_16": run(root, "plain_16", model, data, 16, 0, a.seq),
            "cached_16": run(root, "cached_16", model, data, 16, a.chunk, a.seq),
            "cached_256": run(root, "cached_256", model, data, 256, a.chunk, a.seq),
            "plain_256": run(root, "plain_256", model, data, 256, 0, a.seq)}
    base = runs["plain_16"]["peak_rss_gb"]
    ratio = runs["cached_256"]["peak_rss_gb"] / base
    growth = {k: round(r["peak_rss_gb"] - r["setup_peak_rss_gb"], 2) for k, r in runs.items()}
    doc = {"what": "peak RSS of one-rank ZeRO-2 training steps (2 steps, group of 3 sequences per query)",
           "model": {"family": "llama", "hidden": a.hidden, "layers": a.layers, "seq": a.seq},
           "runs": runs, "peak_above_setup_gb": growth,
           "cached_256_over_plain_16": round(ratio, 3),
           "cached_256_over_cached_16": round(runs["cached_256"]["peak_rss_gb"] / runs["cached_16"]["peak_rss_gb"], 3),
           "plain_256_over_plain_16": round(runs["plain_256"]["peak_rss_gb"] / base, 3),
           "limit": LIMIT, "within_limit": ratio <= LIMIT}
    from dsprune import formats
    formats.write_json(a.results, doc)
    print(json.dumps(doc, indent=2))
    return 0 if ratio <= LIMIT else 1


if __name__ == "__main__":
    sys.exit(main())
