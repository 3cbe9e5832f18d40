"""Embedding geometry: does pruning keep the shape of the embedding space? (GAPrune App. F, EffiR A.6)

Computed on (query, positive passage) pairs. Uniformity, alignment and isotropy are taken on L2-normalised
embeddings (Wang & Isola define them on the hypersphere); effective dimensionality follows GAPrune Eq. 9
(per-dimension variances, not PCA eigenvalues) and cross-dimensional correlation Eq. 8.
"""
from __future__ import annotations

import random
from pathlib import Path

import torch
from torch.nn import functional as F

from ..data import load_beir
from ..errors import DsPruneError


def _offdiag_mean(m: torch.Tensor) -> torch.Tensor:
    n = m.shape[0]
    if n < 2:
        raise DsPruneError("geometry metrics need at least 2 embeddings")
    return (m.sum() - m.diagonal().sum()) / (n * (n - 1))


def uniformity(z: torch.Tensor, t: float = 2.0) -> float:
    """log E_{i != j} exp(-t ||z_i - z_j||^2) (GAPrune Eq. 6); lower is more uniform."""
    z = F.normalize(z.double(), dim=-1)
    sq = torch.cdist(z, z).pow(2)
    return float(torch.log(_offdiag_mean(torch.exp(-t * sq))))


def alignment(q: torch.Tensor, p: torch.Tensor, alpha: float = 2.0) -> float:
    """E_i ||q_i - p_i||^alpha (GAPrune Eq. 7); lower means queries sit closer to their positives."""
    q, p = F.normalize(q.double(), dim=-1), F.normalize(p.double(), dim=-1)
    return float((q - p).norm(dim=-1).pow(alpha).mean())


def cross_dim_correlation(q: torch.Tensor, p: torch.Tensor) -> float:
    """(1/d) sum_k |corr(q_k, p_k)| over embedding dimensions (GAPrune Eq. 8)."""
    q, p = q.double(), p.double()
    qc, pc = q - q.mean(0), p - p.mean(0)
    denom = qc.norm(dim=0) * pc.norm(dim=0)
    corr = (qc * pc).sum(0) / denom.clamp_min(1e-12)
    return float(corr.abs().mean())


def effective_dim(z: torch.Tensor, share: float = 0.95) -> int:
    """Fewest dimensions whose (sorted) variances hold ``share`` of the total (GAPrune Eq. 9)."""
    var = z.double().var(0).sort(descending=True).values
    cum = var.cumsum(0) / var.sum().clamp_min(1e-30)
    return int((cum < share).sum()) + 1


def mean_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean cosine between row i of a and row i of b (GAPrune Eq. 10: pruned vs dense)."""
    if a.shape != b.shape:
        raise DsPruneError(f"cosine to the reference needs equal shapes, got {tuple(a.shape)} vs "
                           f"{tuple(b.shape)} (different embedding widths?)")
    return float(F.cosine_similarity(a.double(), b.double(), dim=-1).mean())


def isotropy(z: torch.Tensor) -> float:
    """Average pairwise cosine over i != j (EffiR A.6); lower is more isotropic."""
    z = F.normalize(z.double(), dim=-1)
    return float(_offdiag_mean(z @ z.T))


def pairs_from_beir(folder: str | Path, split: str = "test", n: int = 1000, seed: int = 0) -> tuple[list, list]:
    """(query, positive passage) pairs: each judged query with its highest-graded document, sampled."""
    beir = load_beir(folder, split)
    pairs = []
    for qid, docs in sorted(beir.qrels.items()):
        best = max(docs.items(), key=lambda kv: (kv[1], kv[0]))
        if best[1] > 0:
            pairs.append((beir.queries[qid], beir.corpus[best[0]]))
    if len(pairs) < 2:
        raise DsPruneError(f"{folder}: need at least 2 queries with a positive document for geometry metrics")
    if len(pairs) > n:
        pairs = random.Random(seed).sample(pairs, n)
    return [q for q, _ in pairs], [p for _, p in pairs]


def geometry(q: torch.Tensor, p: torch.Tensor, q_ref: torch.Tensor | None = None,
             p_ref: torch.Tensor | None = None) -> dict:
    """All metrics for one model; uniformity, effective dim and isotropy over queries and passages together."""
    z = torch.cat([q, p])
    out = {"n_pairs": int(q.shape[0]), "dim": int(q.shape[1]),
           "uniformity": uniformity(z), "alignment": alignment(q, p),
           "cross_dim_correlation": cross_dim_correlation(q, p), "effective_dim": effective_dim(z),
           "isotropy": isotropy(z), "isotropy_queries": isotropy(q)}
    if q_ref is not None and p_ref is not None:
        out["cosine_to_reference"] = mean_cosine(z, torch.cat([q_ref, p_ref]))
    return out
