"""Reading the text dsprune works on: calibration text and BEIR folders, validated line by line.

Every error names the file and line, so bad data fails before any model is loaded.
"""
from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from .errors import DsPruneError
from .formats import read_jsonl
from .settings import data_dir


def doc_text(row: dict) -> str:
    """A BEIR document as one string: title and text, as BEIR evaluators join them."""
    title = (row.get("title") or "").strip()
    text = (row.get("text") or "").strip()
    return f"{title} {text}".strip() if title else text


def load_texts(path: str | Path, n: int | None = None, seed: int = 0, field: str | None = None) -> list[str]:
    """Texts from a .txt (one per line) or .jsonl file (``field``, else text/title+text/query/positive)."""
    path = Path(path)
    if not path.is_file():
        raise DsPruneError(f"calibration file not found: {path}")
    if path.suffix in (".jsonl", ".json"):
        texts = []
        for n_line, row in enumerate(read_jsonl(path), 1):
            if field is not None:
                if field not in row:
                    raise DsPruneError(f"{path}: row {n_line}: missing field {field!r}")
                t = row[field]
            elif "text" in row:
                t = doc_text(row)
            else:
                t = next((row[k] for k in ("query", "positive", "passage", "content") if k in row), None)
            if not isinstance(t, str) or not t.strip():
                raise DsPruneError(f"{path}: row {n_line}: no text (expected a non-empty "
                                   f"{field or 'text/query/positive'} field)")
            texts.append(t)
    else:
        try:
            texts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except UnicodeDecodeError as e:
            raise DsPruneError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    if not texts:
        raise DsPruneError(f"{path}: no text found")
    if n is not None and n < len(texts):
        texts = random.Random(seed).sample(texts, n)
    return texts


def default_calibration(n: int = 256, seed: int = 0) -> list[str]:
    """Half MS MARCO passages (general web text), half SciFact abstracts (science), from the shared data."""
    parts = [data_dir("msmarco_trecdl_subset") / "corpus.jsonl", data_dir("scifact") / "corpus.jsonl"]
    for p in parts:
        if not p.is_file():
            raise DsPruneError(f"default calibration text not found: {p} (set DSPRUNE_SHARED or pass --calib)")
    half = n // 2
    return load_texts(parts[0], half, seed) + load_texts(parts[1], n - half, seed)


@dataclass
class BeirSplit:
    """One split of a BEIR folder: ``corpus`` and ``queries`` map id -> text, ``qrels`` qid -> {docid: grade}."""

    corpus: dict[str, str]
    corpus_rows: dict[str, dict]
    queries: dict[str, str]
    qrels: dict[str, dict[str, int]]


def load_beir(folder: str | Path, split: str = "test") -> BeirSplit:
    """One split of a BEIR folder, validated; ``queries`` keeps the queries the split judges."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DsPruneError(f"BEIR folder not found: {folder}")
    corpus_rows, queries = {}, {}
    cpath, qpath = folder / "corpus.jsonl", folder / "queries.jsonl"
    for n, row in enumerate(read_jsonl(cpath, ("_id",)), 1):
        if "text" not in row:
            raise DsPruneError(f"{cpath}: line {n}: missing field text")
        corpus_rows[str(row["_id"])] = row
    for n, row in enumerate(read_jsonl(qpath, ("_id", "text")), 1):
        queries[str(row["_id"])] = row["text"]
    qrels = read_qrels(folder / "qrels" / f"{split}.tsv", corpus_rows, queries)
    queries = {q: queries[q] for q in qrels}
    if not corpus_rows:
        raise DsPruneError(f"{cpath}: empty corpus")
    return BeirSplit({k: doc_text(v) for k, v in corpus_rows.items()}, corpus_rows, queries, qrels)


def read_qrels(path: Path, corpus: dict, queries: dict) -> dict[str, dict[str, int]]:
    if not path.is_file():
        avail = sorted(p.stem for p in path.parent.glob("*.tsv")) if path.parent.is_dir() else []
        raise DsPruneError(f"qrels not found: {path} (splits here: {', '.join(avail) or 'none'})")
    qrels: dict[str, dict[str, int]] = {}
    with open(path, encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f, delimiter="\t"), 1):
            if not row or (n == 1 and row[0] in ("query-id", "query_id", "qid")):
                continue
            if len(row) < 3:
                raise DsPruneError(f"{path}: line {n}: expected 3 tab-separated columns "
                                   "(query-id, corpus-id, score)")
            qid, did, score = row[0], row[1], row[2]
            if qid not in queries:
                raise DsPruneError(f"{path}: line {n}: unknown query id {qid!r}")
            if did not in corpus:
                raise DsPruneError(f"{path}: line {n}: unknown corpus id {did!r}")
            try:
                grade = int(float(score))
            except ValueError:
                raise DsPruneError(f"{path}: line {n}: score {score!r} is not a number") from None
            qrels.setdefault(qid, {})[did] = grade
    if not qrels:
        raise DsPruneError(f"{path}: empty split (no judgements)")
    return qrels
