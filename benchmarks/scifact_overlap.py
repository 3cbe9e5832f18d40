"""How many SciFact test queries share a relevant document with SciFact *train* positives.

    .venv/bin/python benchmarks/scifact_overlap.py

Why: the grid's general side draws on SciFact train — the dense retriever's training groups (mined SciFact
train queries), GAPrune's general triplets (k-means over SciFact train and MS MARCO) — and its general
evaluation is SciFact test (scifact_small: the same 300 queries). A test query whose relevant abstract is a
train positive has been seen, as a passage to pull towards a query, by every stage that read SciFact train, so
SciFact is an in-domain evaluation here, not a held-out general one. Reads only the shared data (qrels),
writes ``benchmarks/results/scifact_overlap.json`` and prints the figures.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO  # noqa: E402


def overlap(folder: Path, test: str = "test", train: str = "train") -> dict:
    """Test queries with at least one relevant document among the train split's positives (grade >= 1)."""
    from dsprune.data import load_beir

    te, tr = load_beir(folder, test), load_beir(folder, train)
    train_pos = {d for judged in tr.qrels.values() for d, g in judged.items() if g >= 1}
    test_rel = {q: {d for d, g in judged.items() if g >= 1} for q, judged in te.qrels.items()}
    shared = sorted((q for q, docs in test_rel.items() if docs & train_pos), key=str)
    rel_docs = set().union(*test_rel.values())
    return {"data": str(folder), "test_queries": len(test_rel), "train_queries": len(tr.qrels),
            "train_positive_documents": len(train_pos),
            "test_queries_sharing_a_relevant_document": len(shared),
            "fraction": len(shared) / len(test_rel),
            "test_relevant_documents": len(rel_docs),
            "test_relevant_documents_that_are_train_positives": len(rel_docs & train_pos),
            "shared_query_ids": shared}


def main(argv: list[str] | None = None) -> int:
    from dsprune import formats
    from dsprune.settings import data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=str(data_dir("scifact")), help="BEIR folder with test and train qrels")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "scifact_overlap.json"))
    a = ap.parse_args(argv)
    doc = overlap(Path(a.data))
    doc["data"] = "${shared}/data/" + Path(a.data).name
    doc["command"] = shlex.join([".venv/bin/python", "benchmarks/scifact_overlap.py", *(argv or sys.argv[1:])])
    doc["code_version"] = formats.code_version()
    formats.write_json(Path(a.results), doc)
    print(f"{doc['test_queries_sharing_a_relevant_document']} of {doc['test_queries']} SciFact test queries "
          f"({doc['fraction']:.1%}) share a relevant document with the {doc['train_queries']} train queries' "
          f"positives; {doc['test_relevant_documents_that_are_train_positives']} of "
          f"{doc['test_relevant_documents']} test-relevant documents are train positives -> {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
