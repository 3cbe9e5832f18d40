"""Hard-negative mining: the training groups contrastive fine-tuning learns most from.

Any Encoder embeds the corpus and the training queries of a BEIR folder; for every query the negatives are
drawn from the documents ranked ``rank_start..rank_end`` that are not judged relevant (skipping the very
top, where unjudged positives hide — FlagEmbedding's range-for-sampling). The miner's similarities can be
kept as teacher scores (``pos_scores``/``neg_scores``) for KL distillation. Output: FlagEmbedding group JSONL.
"""
from __future__ import annotations

import random
from pathlib import Path

from ..data import load_beir
from ..encoder import Encoder
from ..errors import DsPruneError


def mine_groups(enc: Encoder, folder: str | Path, split: str = "train", n_negatives: int = 15,
                rank_start: int = 3, rank_end: int = 100, seed: int = 0, with_scores: bool = False,
                score_scale: float = 1.0, batch_size: int = 32, max_queries: int = 0,
                show_progress: bool = True) -> tuple[list[dict], dict]:
    """Groups ``{query, pos, neg[, pos_scores, neg_scores]}`` for every judged query with a positive."""
    if not 0 <= rank_start < rank_end:
        raise DsPruneError(f"need 0 <= rank_start < rank_end, got {rank_start}..{rank_end}")
    if n_negatives < 1:
        raise DsPruneError(f"n_negatives must be at least 1, not {n_negatives}")
    beir = load_beir(folder, split)
    qids = [q for q in sorted(beir.qrels) if any(g > 0 for g in beir.qrels[q].values())]
    if max_queries and max_queries < len(qids):
        qids = sorted(random.Random(seed).sample(qids, max_queries))
    doc_ids = sorted(beir.corpus)
    if rank_end > len(doc_ids):
        rank_end = len(doc_ids)
    d = enc.encode([beir.corpus[i] for i in doc_ids], "passage", batch_size, show_progress=show_progress)
    q = enc.encode([beir.queries[i] for i in qids], "query", batch_size, show_progress=show_progress)
    sims = q @ d.T
    top = sims.topk(rank_end, dim=1).indices
    pos_index = {did: j for j, did in enumerate(doc_ids)}
    groups, short, pos_sims = [], 0, []
    for i, qid in enumerate(qids):
        judged = beir.qrels[qid]
        pos = [did for did, g in sorted(judged.items()) if g > 0]
        pos_sims += [float(sims[i, pos_index[p]]) for p in pos]
        window = [doc_ids[j] for j in top[i, rank_start:rank_end].tolist() if doc_ids[j] not in judged]
        rng = random.Random(f"{seed}:{qid}")
        neg = rng.sample(window, min(n_negatives, len(window)))
        if len(neg) < n_negatives:
            short += 1
        if not neg:
            continue
        row = {"query": beir.queries[qid], "pos": [beir.corpus[p] for p in pos],
               "neg": [beir.corpus[n] for n in neg], "qid": qid, "pos_ids": pos, "neg_ids": neg}
        if with_scores:
            row["pos_scores"] = [round(float(sims[i, pos_index[p]]) * score_scale, 5) for p in pos]
            row["neg_scores"] = [round(float(sims[i, pos_index[n]]) * score_scale, 5) for n in neg]
        groups.append(row)
    if not groups:
        raise DsPruneError(f"{folder}: no group could be mined (corpus too small for rank window "
                           f"{rank_start}..{rank_end}?)")
    stats = {"queries": len(groups), "docs": len(doc_ids), "negatives_per_query": n_negatives,
             "queries_with_fewer_negatives": short,
             "mean_positive_cosine": round(sum(pos_sims) / len(pos_sims), 4),
             "mean_window_cosine": round(float(sims.gather(1, top[:, rank_start:]).mean()), 4)}
    return groups, stats
