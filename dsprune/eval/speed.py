"""Honest speed: encoding throughput of two models on the same real inputs, and the FLOPs that explain it.

Both models run in one process on the same sampled documents and queries, each padded to exactly the benched
length (so every batch costs what its shape says), after a warm-up, alternating models between repeats so
drift in the machine hits both. FLOPs per token are counted from the model's structure — per-layer MLP
widths, dropped attention/MLP sub-layers, and attention's term that grows with the sequence length — so the
measured speed-up can be set against the FLOP ratio. Convention: one multiply-add = 2 FLOPs, forward pass,
full (non-causal) attention over the benched length, elementwise ops and norms not counted.
"""
from __future__ import annotations

import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from ..data import doc_text
from ..encoder import Encoder
from ..errors import DsPruneError
from ..formats import read_jsonl
from ..surgery.prune import count_params, structure


# ---- FLOPs ---------------------------------------------------------------------------------------------

def _attn_dims(cfg) -> tuple[int, int, int]:
    heads = int(cfg.num_attention_heads)
    kv = int(getattr(cfg, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // heads)
    return heads, kv, head_dim


def _attended_length(cfg, layer: int, seq_len: int) -> int:
    """How many keys a token attends to in ``layer`` (sliding-window layers see at most the window)."""
    types = getattr(cfg, "layer_types", None)
    window = getattr(cfg, "sliding_window", None)
    if types and window and types[layer] == "sliding_attention":
        return min(seq_len, int(window))
    if not types and window and getattr(cfg, "use_sliding_window", True) and cfg.model_type == "mistral":
        return min(seq_len, int(window))
    return seq_len


@dataclass(frozen=True)
class Shape:
    """What the FLOP count reads from a model: its config, whether its MLP is gated, the dropped attention
    sub-layers and every layer's MLP width (None = dropped). The planner passes shapes that do not exist
    yet (fractional widths for a slimming ratio), so bench and planner count with the same function."""
    config: Any
    gated: bool
    drop_attn: tuple[int, ...]
    widths: tuple[float | None, ...]


def shape_of(enc: Encoder) -> Shape:
    st = structure(enc)
    return Shape(enc.backbone.config, enc.arch.gate is not None, tuple(st["drop_attn"]),
                 tuple(st["intermediate_sizes"]))


def count_flops(shape: Shape, seq_len: int) -> dict:
    """Forward FLOPs per token at ``seq_len``, split into attention projections, attention scores, MLP.

    The token embedding is a lookup (EmbeddingGemma's 260M-parameter one included): no FLOPs per token."""
    cfg = shape.config
    h = int(cfg.hidden_size)
    heads, kv, hd = _attn_dims(cfg)
    dropped_attn = set(shape.drop_attn)
    proj = scores = mlp = 0
    for layer, width in enumerate(shape.widths):
        if layer not in dropped_attn:
            proj += 2 * (h * heads * hd + 2 * h * kv * hd + heads * hd * h)
            # QK^T and attention-weighted V: each seq x (heads * head_dim) multiply-adds per token.
            scores += 4 * _attended_length(cfg, layer, seq_len) * heads * hd
        if width is not None:
            mlp += 2 * (3 if shape.gated else 2) * h * width
    return {"seq_len": seq_len, "attn_proj": proj, "attn_scores": scores, "mlp": mlp,
            "total": proj + scores + mlp}


def flops_per_token(enc: Encoder, seq_len: int) -> dict:
    """Forward FLOPs per token of ``enc`` as it is now (see ``count_flops``)."""
    return count_flops(shape_of(enc), seq_len)


def non_embedding_params(enc: Encoder) -> int:
    return count_params(enc.arch.layers_of(enc.backbone))


# ---- inputs ----------------------------------------------------------------------------------------------

def sample_texts(folder: str | Path, n_docs: int, n_queries: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """Real documents and queries from a BEIR folder, sampled with a fixed seed."""
    folder = Path(folder)
    docs = [doc_text(r) for r in read_jsonl(folder / "corpus.jsonl", ("_id",))]
    queries = [r["text"] for r in read_jsonl(folder / "queries.jsonl", ("_id", "text"))]
    docs, queries = [d for d in docs if d.strip()], [q for q in queries if q.strip()]
    if len(docs) < n_docs or len(queries) < n_queries:
        raise DsPruneError(f"{folder}: has {len(docs)} documents and {len(queries)} queries, the bench asks for "
                           f"{n_docs} and {n_queries}")
    rng = random.Random(seed)
    return rng.sample(docs, n_docs), rng.sample(queries, n_queries)


def fixed_batches(enc: Encoder, texts: list[str], kind: str, batch_size: int, length: int) -> list[dict]:
    """Tokenise with the Encoder's own tokenisation, truncate and pad every batch to exactly ``length``."""
    batches = []
    pad_id = enc.tokenizer.pad_token_id
    for i in range(0, len(texts), batch_size):
        b = enc.tokenize(texts[i:i + batch_size], kind=kind, max_length=length)
        ids, mask = b["input_ids"], b["attention_mask"]
        extra = length - ids.shape[1]
        side = (extra, 0) if enc.config.padding_side == "left" else (0, extra)
        batches.append({"input_ids": F.pad(ids, side, value=pad_id), "attention_mask": F.pad(mask, side, value=0)})
    return batches


# ---- timing --------------------------------------------------------------------------------------------

@torch.inference_mode()
def _run(fn, batches: list[dict], device) -> list[torch.Tensor]:
    return [fn(b["input_ids"].to(device), b["attention_mask"].to(device)) for b in batches]


def time_models(fns: dict, batches: dict[str, list[dict]], devices: dict, repeats: int = 3,
                warmup: int = 1) -> tuple[dict[str, list[float]], dict[str, torch.Tensor]]:
    """Seconds per full pass over the batches, per model (models alternate order every repeat), and each
    model's embeddings from its last pass."""
    names = list(fns)
    for _ in range(warmup):
        for n in names:
            _run(fns[n], batches[n], devices[n])
    from tqdm.auto import tqdm

    times = {n: [] for n in names}
    last = {}
    bar = tqdm(total=repeats * len(names), desc="timed passes", leave=False)
    for r in range(repeats):
        for n in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            out = _run(fns[n], batches[n], devices[n])
            times[n].append(time.perf_counter() - t0)
            last[n] = out
            bar.update(1)
    bar.close()
    return times, {n: torch.cat(o).float().cpu() for n, o in last.items()}


def flat_index_latency(docs: torch.Tensor, queries: torch.Tensor, k: int = 10, repeats: int = 3) -> dict:
    """ms per query of exact inner-product search (faiss IndexFlatIP if installed, else a torch matmul)."""
    d = docs.float().contiguous().numpy()
    q = queries.float().contiguous().numpy()
    k = min(k, d.shape[0])
    try:
        import faiss
        index = faiss.IndexFlatIP(d.shape[1])
        index.add(d)
        search, backend = (lambda x: index.search(x, k)), "faiss.IndexFlatIP"
    except ImportError:
        dt = torch.from_numpy(d)
        search, backend = (lambda x: torch.topk(torch.from_numpy(x) @ dt.T, k)), "torch.matmul+topk"
    search(q[:1])
    one, batch = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for i in range(len(q)):
            search(q[i:i + 1])
        one.append((time.perf_counter() - t0) / len(q))
        t0 = time.perf_counter()
        search(q)
        batch.append((time.perf_counter() - t0) / len(q))
    return {"backend": backend, "index_size": int(d.shape[0]), "dim": int(d.shape[1]), "k": k,
            "ms_per_query": 1e3 * statistics.median(one), "ms_per_query_batched": 1e3 * statistics.median(batch)}


def bench(models: dict[str, Encoder], docs: list[str], queries: list[str], doc_batch: int = 16,
          doc_len: int = 256, query_batch: int = 64, query_len: int = 32, repeats: int = 3, warmup: int = 1,
          compile: bool = False, latency_k: int = 10) -> dict:
    """Throughput of each model on the same texts; ``models`` = {"model": enc, "baseline": enc}."""
    if repeats < 1:
        raise DsPruneError("bench.repeats must be at least 1")
    fns, devices = {}, {}
    for n, enc in models.items():
        enc.eval()
        fns[n] = torch.compile(enc) if compile else enc
        devices[n] = enc.device
    out: dict = {}
    embeddings: dict = {}
    for kind, texts, bs, length in (("document", docs, doc_batch, doc_len), ("query", queries, query_batch,
                                                                              query_len)):
        batches = {n: fixed_batches(enc, texts, "passage" if kind == "document" else "query", bs, length)
                   for n, enc in models.items()}
        times, embs = time_models(fns, batches, devices, repeats, warmup)
        embeddings[kind] = embs
        res = {}
        for n, ts in times.items():
            med = statistics.median(ts)
            real = int(sum(int(b["attention_mask"].sum()) for b in batches[n]))
            res[n] = {"seconds": ts, "median_s": med, "texts_per_s": len(texts) / med,
                      "tokens_per_s": len(texts) * length / med, "real_tokens": real,
                      "flops_per_token": flops_per_token(models[n], length)}
        res["speedup"] = res["baseline"]["median_s"] / res["model"]["median_s"]
        res["flop_ratio"] = res["baseline"]["flops_per_token"]["total"] / res["model"]["flops_per_token"]["total"]
        res["speedup_over_flop_ratio"] = res["speedup"] / res["flop_ratio"]
        res.update(texts=len(texts), batch_size=bs, length=length)
        out[kind] = res
    params = {n: count_params(enc.model) for n, enc in models.items()}
    non_emb = {n: non_embedding_params(enc) for n, enc in models.items()}
    out["params"] = {**params, "ratio": params["baseline"] / params["model"],
                     "non_embedding": {**non_emb, "ratio": non_emb["baseline"] / non_emb["model"]}}
    # Retrieval latency (EffiR A.5): each model's own document embeddings (from its timed pass) as the index.
    out["retrieval_latency"] = {n: flat_index_latency(embeddings["document"][n], embeddings["query"][n],
                                                      k=latency_k) for n in models}
    return out
