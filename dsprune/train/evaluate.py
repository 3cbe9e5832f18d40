"""A periodic in-training retrieval score (nDCG@10 on a BEIR split), computed by all ranks together.

Under ZeRO-3 every rank must run the same forwards (parameters are gathered collectively), so each rank
encodes an equal shard of the texts and the embeddings are all-gathered. This is a training monitor; the
headline numbers come from ``dsprune eval`` (mteb) on the exported model.
"""
from __future__ import annotations

import math
import random

import torch
import torch.distributed as dist

from ..data import load_beir


class EvalSet:
    def __init__(self, folder, split: str = "test", max_queries: int = 0, max_docs: int = 0, seed: int = 0):
        beir = load_beir(folder, split)
        qids = sorted(beir.qrels)
        if max_queries and max_queries < len(qids):
            qids = sorted(random.Random(seed).sample(qids, max_queries))
        judged = sorted({d for q in qids for d in beir.qrels[q]})
        others = sorted(set(beir.corpus) - set(judged))
        if max_docs and max_docs < len(beir.corpus):
            others = random.Random(seed).sample(others, max(0, max_docs - len(judged)))
        self.doc_ids = judged + sorted(others)
        self.docs = [beir.corpus[d] for d in self.doc_ids]
        self.qids = qids
        self.queries = [beir.queries[q] for q in qids]
        self.qrels = {q: beir.qrels[q] for q in qids}


def _sharded_encode(enc, texts: list[str], kind: str, batch_size: int, max_length: int | None) -> torch.Tensor:
    """Every rank encodes an equal slice (padded), then all ranks gather all embeddings in order."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    rank = dist.get_rank() if dist.is_initialized() else 0
    per = math.ceil(len(texts) / world)
    padded = texts + [texts[-1]] * (per * world - len(texts))
    mine = padded[rank * per:(rank + 1) * per]
    # equal-length shards give every rank the same number of forwards (needed by ZeRO-3)
    emb = enc.encode(mine, kind, batch_size=batch_size, show_progress=False, max_length=max_length).to(enc.device)
    if world > 1:
        parts = [torch.empty_like(emb) for _ in range(world)]
        dist.all_gather(parts, emb.contiguous())
        emb = torch.cat(parts)
    return emb[:len(texts)].cpu()


def ndcg_at_k(scores: torch.Tensor, doc_ids: list[str], qids: list[str], qrels: dict, k: int = 10) -> float:
    """Mean nDCG@k with linear gains (trec_eval's definition)."""
    top = scores.topk(min(k, scores.shape[1]), dim=1).indices
    total = 0.0
    for i, q in enumerate(qids):
        rel = qrels[q]
        dcg = sum(rel.get(doc_ids[j], 0) / math.log2(r + 2) for r, j in enumerate(top[i].tolist()))
        ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:k]
        idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
        total += dcg / idcg if idcg > 0 else 0.0
    return total / max(1, len(qids))


@torch.no_grad()
def evaluate(enc, data: EvalSet, batch_size: int = 32, max_length: int | None = None) -> dict:
    """nDCG@10 of ``enc`` on ``data``; ``max_length`` truncates queries and documents (None: the encoder's
    own lengths), so that the monitor can score as the final evaluation does."""
    was = enc.training
    enc.eval()
    q = _sharded_encode(enc, data.queries, "query", batch_size, max_length)
    d = _sharded_encode(enc, data.docs, "passage", batch_size, max_length)
    enc.train(was)
    return {"ndcg_at_10": ndcg_at_k(q @ d.T, data.doc_ids, data.qids, data.qrels, 10)}
