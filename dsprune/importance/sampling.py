"""GAPrune's representative sampling: k-means over query embeddings, keep the real item nearest each centroid.

Gradient statistics over 5,000 well-spread triplets approximate those over the whole set at a fraction of
the cost (GAPrune §3.2.1). Centroids are not data, so each is replaced by its nearest real item; two
centroids may share a nearest item, which is kept once — the sample can be smaller than k.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..errors import DsPruneError

DEFAULT_K = 5000


def _nearest(x: torch.Tensor, c: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of ``x``: index of and squared distance to its nearest row of ``c`` (chunked)."""
    idx, dist = [], []
    c_sq = (c * c).sum(1)
    for s in range(0, x.shape[0], chunk):
        xb = x[s:s + chunk]
        d = (xb * xb).sum(1, keepdim=True) - 2 * xb @ c.T + c_sq[None]
        m, i = d.min(1)
        idx.append(i)
        dist.append(m.clamp_min(0))
    return torch.cat(idx), torch.cat(dist)


def kmeans(x: torch.Tensor, k: int, iters: int = 20, seed: int = 0, show_progress: bool = True) -> torch.Tensor:
    """Lloyd's k-means with k-means++ seeding; returns the [k, d] centroids. Empty clusters are re-seeded
    with the point farthest from its centroid, so all k centroids stay in use."""
    x = x.float()
    n = x.shape[0]
    if not 1 <= k <= n:
        raise DsPruneError(f"k-means needs 1 <= k <= n items, got k={k}, n={n}")
    g = torch.Generator().manual_seed(seed)
    # k-means++ seeding (Arthur & Vassilvitskii, 2007): random starts can put two centroids in one cluster
    # and leave another without; k-means++ costs k passes over the data, fine for tens of thousands.
    first = int(torch.randint(n, (1,), generator=g))
    chosen = [first]
    d2 = ((x - x[first]) ** 2).sum(1)
    for _ in tqdm(range(1, k), desc="k-means++ seeding", disable=not show_progress or k < 100, leave=False):
        total = float(d2.sum())
        j = int(torch.multinomial(d2, 1, generator=g)) if total > 0 else int(torch.randint(n, (1,), generator=g))
        chosen.append(j)
        d2 = torch.minimum(d2, ((x - x[j]) ** 2).sum(1))
    c = x[chosen].clone()
    for _ in tqdm(range(iters), desc="k-means", disable=not show_progress, leave=False):
        assign, dist = _nearest(x, c)
        sums = torch.zeros_like(c).index_add_(0, assign, x)
        counts = torch.bincount(assign, minlength=k).float()
        new = sums / counts.clamp_min(1)[:, None]
        empty = (counts == 0).nonzero().flatten()
        if len(empty):
            far = dist.argsort(descending=True)[:len(empty)]
            new[empty] = x[far]
        c = new
    return c


def representative_indices(emb: torch.Tensor, k: int = DEFAULT_K, iters: int = 20, seed: int = 0,
                           show_progress: bool = True) -> list[int]:
    """Indices of the items nearest to each k-means centroid, de-duplicated, ascending.

    ``k`` is capped at the number of items (then every item is its own cluster and all are kept).
    """
    n = emb.shape[0]
    if n == 0:
        raise DsPruneError("nothing to sample from: no items")
    k = min(int(k), n)
    if k == n:  # every item is its own cluster
        return list(range(n))
    c = kmeans(emb, k, iters, seed, show_progress)
    nearest, _ = _nearest(c, emb.float())
    return sorted(set(int(i) for i in nearest))
