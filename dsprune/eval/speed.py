"""Honest speed: encoding throughput of two models on the same real inputs, and the FLOPs that explain it.

Both models run in one process on the same sampled documents and queries, each padded to exactly the benched
length (so every batch costs what its shape says), after a warm-up, timed as pairs of passes whose order
alternates, so drift in the machine hits both; the speed-up is the median of the pairs' ratios, with their
min and max as its spread (a ratio of two medians taken apart can land above anything the models' work
allows when the load changes between them). FLOPs per token are counted from the model's structure — per-layer MLP
widths, dropped attention/MLP sub-layers, and attention's term that grows with the sequence length — so the
measured speed-up can be set against the FLOP ratio. Convention: one multiply-add = 2 FLOPs, forward pass,
full (non-causal) attention over the benched length, elementwise ops and norms not counted.
"""
from __future__ import annotations

import os
import platform
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


def count_weights(module: torch.nn.Module) -> int:
    """Parameters, with the weights and biases of dynamically quantised Linear layers (packed, so they are
    not parameters) counted too: quantising changes bytes per weight, not the number of weights."""
    from torch.ao.nn.quantized import Linear as QuantizedLinear

    packed = 0
    for m in module.modules():
        if isinstance(m, QuantizedLinear):
            w, b = m._weight_bias()
            packed += w.numel() + (0 if b is None else b.numel())
    return count_params(module) + packed


def non_embedding_params(enc: Encoder) -> int:
    return count_weights(enc.arch.layers_of(enc.backbone))


def padding_fraction(batches) -> float:
    """Share of the positions in padded batches that are padding (compute spent on no token)."""
    real = total = 0
    for b in batches:
        real += int(b["attention_mask"].sum())
        total += b["attention_mask"].numel()
    return 1.0 - real / total if total else 0.0


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


def own_batches(enc: Encoder, texts: list[str], kind: str, batch_size: int, length: int) -> list[dict]:
    """The Encoder's own tokenisation truncated at ``length`` and padded per batch, as ``encode`` runs it: what
    two models with different tokenizers compute for the same texts."""
    batches = []
    for i in range(0, len(texts), batch_size):
        b = enc.tokenize(texts[i:i + batch_size], kind=kind, max_length=length)
        batches.append({"input_ids": b["input_ids"], "attention_mask": b["attention_mask"]})
    return batches


def flops_per_text(enc: Encoder, batches: list[dict]) -> float:
    """Forward FLOPs per text over ``batches``, every padded position counted at its batch's length."""
    total = n = 0
    for b in batches:
        rows, length = b["input_ids"].shape
        total += rows * length * flops_per_token(enc, length)["total"]
        n += rows
    return total / n


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

# A speed-up's spread (max − min over its median) above this says the machine's load changed during the run.
WIDE_SPREAD = 0.15
# A measured speed-up may exceed its FLOP ratio by this much (fixed costs, cache effects) before it is suspect:
# removing work cannot make the rest of it faster.
FLOP_MARGIN = 0.10


def time_pairs(runs: dict, pairs: int = 5, warmup: int = 1, desc: str = "timed pairs") -> tuple[dict, dict]:
    """Seconds of each callable over ``pairs`` rounds whose order alternates (a, b; b, a; ...), after ``warmup``
    calls of each; also each one's output from its last call."""
    if pairs < 1:
        raise DsPruneError(f"the number of timed pairs must be at least 1, not {pairs}")
    from tqdm.auto import tqdm

    names = list(runs)
    for _ in range(warmup):
        for n in names:
            runs[n]()
    times, last = {n: [] for n in names}, {}
    bar = tqdm(total=pairs * len(names), desc=desc, leave=False)
    for r in range(pairs):
        for n in (names if r % 2 == 0 else names[::-1]):
            t0 = time.perf_counter()
            last[n] = runs[n]()
            times[n].append(time.perf_counter() - t0)
            bar.update(1)
    bar.close()
    return times, last


def pair_ratios(num: list[float], den: list[float]) -> dict:
    """``num[i] / den[i]`` of each timed pair: the median, its min–max and relative spread, and every ratio."""
    ratios = [a / b for a, b in zip(num, den, strict=True)]
    med = statistics.median(ratios)
    return {"median": med, "min": min(ratios), "max": max(ratios), "spread": (max(ratios) - min(ratios)) / med,
            "ratios": ratios}


@torch.inference_mode()
def _run(fn, batches: list[dict], device) -> list[torch.Tensor]:
    return [fn(b["input_ids"].to(device), b["attention_mask"].to(device)) for b in batches]


def speed_warning(kind: str, res: dict) -> str | None:
    """One line when a measured speed-up should not be trusted as it is, else None."""
    sp, why = res["speedup_pairs"], []
    if sp["spread"] > WIDE_SPREAD:
        why.append(f"its pairs spread {sp['min']:.2f}–{sp['max']:.2f}x ({sp['spread']:.0%} of the median): the "
                   "machine's load changed during the run")
    if res["flop_bound"] and res["speedup"] > res["flop_ratio"] * (1 + FLOP_MARGIN):
        why.append(f"it exceeds the FLOP ratio {res['flop_ratio']:.2f}x by more than {FLOP_MARGIN:.0%}, which "
                   "removing work cannot do: something else slowed the baseline's passes")
    if not why:
        return None
    return f"{kind} speed-up {res['speedup']:.2f}x: " + "; ".join(why) + " (rerun on a quiet machine)"


def machine(device: str | None = None) -> dict:
    """The processor a speed-up was measured on: int8 and float kernels gain by different factors on CPUs with and
    without AVX-512/AMX, so a ratio means little without it."""
    name = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    flags: list[str] = []
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                name = value.strip()
            elif key.strip() == "flags":
                flags = value.split()
                break
    out = {"cpu": name, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
           "cpu_isa": sorted(f for f in flags if f.startswith(("avx", "amx")) or f in ("fma", "f16c")),
           "logical_cpus": os.cpu_count()}
    if device and device.startswith("cuda") and torch.cuda.is_available():
        out["device"] = torch.cuda.get_device_name(torch.device(device))
    return out


def tokenizer_difference(a: Encoder, b: Encoder) -> str | None:
    """How two encoders' tokenizers differ (vocabulary, or the ids of a probe text), or None if they agree: at a
    fixed token length, models with different tokenizers encode different amounts of text."""
    probe = "Tokenisers differ: naïve café 2,048 tokens; IL-6 → p<0.05 (β=1.3e-4) in DNA-seq."
    ta, tb = a.tokenizer, b.tokenizer
    if len(ta) != len(tb):
        return f"vocabularies of {len(ta)} and {len(tb)} tokens"
    ia, ib = ta(probe)["input_ids"], tb(probe)["input_ids"]
    if ia != ib:
        return f"a probe text becomes {len(ia)} and {len(ib)} tokens" + (", different ids" if len(ia) == len(ib)
                                                                         else "")
    if ta.get_vocab() != tb.get_vocab():
        return "vocabularies of the same size with different tokens"
    return None


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
          doc_len: int = 256, query_batch: int = 64, query_len: int = 32, pairs: int = 5, warmup: int = 1,
          compile: bool = False, latency_k: int = 10, same_texts: bool = False) -> dict:
    """Throughput of each model on the same texts; ``models`` = {"model": enc, "baseline": enc}.

    ``speedup`` is the median over ``pairs`` alternating pairs of baseline/model seconds (``speedup_pairs``
    holds its min–max); the FLOP ratio bounds it only when both models compute in the same number format
    (``flop_bound``), so an int8 or bfloat16 model against a float32 one is not held to it. By default every batch is
    padded to exactly the length asked, which needs one tokenizer; ``same_texts`` lets each model tokenise the
    texts itself (truncated at that length, padded per batch), so models with different tokenizers compare
    on the same texts, and the FLOP ratio counts each one's own positions."""
    differ = tokenizer_difference(models["model"], models["baseline"])
    if differ and not same_texts:
        raise DsPruneError(f"the model's and the baseline's tokenizers differ ({differ}): at the same token length "
                           "they encode different text, so their speed-up would not compare like with like "
                           "(--same_texts times each on the same texts with its own tokenizer)")
    make_batches = own_batches if same_texts else fixed_batches
    fns, devices = {}, {}
    for n, enc in models.items():
        enc.eval()
        fns[n] = torch.compile(enc) if compile else enc
        devices[n] = enc.device
    out: dict = {}
    embeddings: dict = {}
    for kind, texts, bs, length in (("document", docs, doc_batch, doc_len), ("query", queries, query_batch,
                                                                              query_len)):
        batches = {n: make_batches(enc, texts, "passage" if kind == "document" else "query", bs, length)
                   for n, enc in models.items()}
        runs = {n: (lambda n=n: _run(fns[n], batches[n], devices[n])) for n in models}
        times, last = time_pairs(runs, pairs, warmup, desc=f"timed {kind} pairs")
        embeddings[kind] = {n: torch.cat(o).float().cpu() for n, o in last.items()}
        res = {}
        for n, ts in times.items():
            med = statistics.median(ts)
            real = int(sum(int(b["attention_mask"].sum()) for b in batches[n]))
            positions = sum(b["input_ids"].numel() for b in batches[n])
            res[n] = {"seconds": ts, "median_s": med, "texts_per_s": len(texts) / med,
                      "tokens_per_s": positions / med, "positions": positions, "real_tokens": real,
                      "quantize": models[n].quantized, "number_format": models[n].number_format,
                      "flops_per_token": flops_per_token(models[n], length),
                      "flops_per_text": flops_per_text(models[n], batches[n])}
        res["speedup_pairs"] = pair_ratios(times["baseline"], times["model"])
        res["speedup"] = res["speedup_pairs"]["median"]
        res["flop_ratio"] = res["baseline"]["flops_per_text"] / res["model"]["flops_per_text"]
        res["speedup_over_flop_ratio"] = res["speedup"] / res["flop_ratio"]
        res["flop_bound"] = models["model"].number_format == models["baseline"].number_format
        res.update(texts=len(texts), batch_size=bs, length=length, pairs=pairs, same_texts=same_texts)
        out[kind] = res
    out["warnings"] = [w for k in ("document", "query") if (w := speed_warning(k, out[k]))]
    params = {n: count_weights(enc.model) for n, enc in models.items()}
    non_emb = {n: non_embedding_params(enc) for n, enc in models.items()}
    out["params"] = {**params, "ratio": params["baseline"] / params["model"],
                     "non_embedding": {**non_emb, "ratio": non_emb["baseline"] / non_emb["model"]}}
    # Retrieval latency (EffiR A.5): each model's own document embeddings (from its timed pass) as the index.
    out["retrieval_latency"] = {n: flat_index_latency(embeddings["document"][n], embeddings["query"][n],
                                                      k=latency_k) for n in models}
    return out
