"""Contrastive triplets (query, positive, negative): the data GAPrune differentiates.

GAPrune's parameter analysis needs triplets from a general and a domain source. They come from a JSONL
file (``{query, positive, negative}``, or FlagEmbedding groups ``{query, pos: [...], neg: [...]}`` expanded
to one triplet per positive) or are built from a BEIR folder and split: every judged (query, positive)
pair gets a negative drawn, seeded, from the corpus passages not judged relevant to that query. A source
is written ``path`` or ``path:split`` (a folder means BEIR; split defaults to ``train``).
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from ..errors import DsPruneError
from ..formats import read_jsonl


@dataclass(frozen=True)
class Triplet:
    query: str
    positive: str
    negative: str


def _text(path: Path, n: int, row: dict, field: str) -> str:
    v = row[field]
    if not isinstance(v, str) or not v.strip():
        raise DsPruneError(f"{path}: line {n}: field {field!r} must be a non-empty string")
    return v


def _texts(path: Path, n: int, row: dict, field: str) -> list[str]:
    v = row[field]
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(t, str) and t.strip() for t in v):
        raise DsPruneError(f"{path}: line {n}: field {field!r} must be a non-empty list of non-empty strings")
    return v


def read_triplets_jsonl(path: str | Path) -> list[Triplet]:
    """Triplets from JSONL; each line is ``{query, positive, negative}`` or ``{query, pos, neg}``."""
    path = Path(path)
    rows = read_jsonl(path)
    out: list[Triplet] = []
    # read_jsonl skips blank lines, so recount the physical line numbers for messages
    line_nos = [i for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1) if line.strip()]
    for n, row in zip(line_nos, rows):
        if "query" not in row:
            raise DsPruneError(f"{path}: line {n}: missing field query")
        q = _text(path, n, row, "query")
        if "positive" in row or "negative" in row:
            missing = [k for k in ("positive", "negative") if k not in row]
            if missing:
                raise DsPruneError(f"{path}: line {n}: missing field(s) {', '.join(missing)}")
            out.append(Triplet(q, _text(path, n, row, "positive"), _text(path, n, row, "negative")))
        elif "pos" in row and "neg" in row:
            pos, neg = _texts(path, n, row, "pos"), _texts(path, n, row, "neg")
            out.extend(Triplet(q, p, neg[i % len(neg)]) for i, p in enumerate(pos))
        else:
            raise DsPruneError(f"{path}: line {n}: expected fields query/positive/negative "
                               "(or FlagEmbedding query/pos/neg)")
    if not out:
        raise DsPruneError(f"{path}: no triplets (empty file)")
    return out


def beir_triplets(folder: str | Path, split: str = "train", seed: int = 0, min_grade: int = 1) -> list[Triplet]:
    """One triplet per judged (query, positive) pair of a BEIR split; negative = a random non-relevant passage."""
    from ..data import load_beir

    sp = load_beir(folder, split)
    doc_ids = sorted(sp.corpus)
    rng = random.Random(seed)
    out = []
    for qid in sorted(sp.qrels):
        judged = sp.qrels[qid]
        positives = sorted(d for d, g in judged.items() if g >= min_grade)
        if not positives:
            continue
        if len(judged) >= len(doc_ids):
            raise DsPruneError(f"{folder}: query {qid} is judged against every passage: no negative to draw")
        for did in positives:
            while True:
                neg = doc_ids[rng.randrange(len(doc_ids))]
                if neg not in judged:
                    break
            out.append(Triplet(sp.queries[qid], sp.corpus[did], sp.corpus[neg]))
    if not out:
        raise DsPruneError(f"{folder}: split {split!r} has no positive judgements (grade >= {min_grade})")
    return out


def parse_source(spec: str) -> tuple[Path, str | None]:
    """``path`` or ``path:split``; a split is only meaningful for a BEIR folder."""
    path, split = spec, None
    if ":" in spec and not Path(spec).exists():
        path, split = spec.rsplit(":", 1)
    return Path(path), split


def load_triplets(sources: str | Sequence[str], seed: int = 0) -> list[Triplet]:
    """Concatenate triplets from one or more sources (JSONL files or ``BEIR-folder[:split]``)."""
    if isinstance(sources, str):
        sources = [sources]
    if not sources:
        raise DsPruneError("no triplet source given")
    out: list[Triplet] = []
    for spec in sources:
        path, split = parse_source(spec)
        if path.is_dir():
            out.extend(beir_triplets(path, split or "train", seed))
        elif path.is_file():
            if split is not None:
                raise DsPruneError(f"{spec}: a split (':{split}') only applies to a BEIR folder")
            out.extend(read_triplets_jsonl(path))
        else:
            raise DsPruneError(f"triplet source not found: {path}")
    return out


def write_triplets(path: str | Path, triplets: Iterable[Triplet]) -> int:
    import json

    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for t in triplets:
            f.write(json.dumps({"query": t.query, "positive": t.positive, "negative": t.negative},
                               ensure_ascii=False) + "\n")
            n += 1
    return n
