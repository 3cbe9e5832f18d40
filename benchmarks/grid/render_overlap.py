"""The SciFact train/test overlap (``benchmarks/scifact_overlap.py``): why SciFact is not a held-out general
evaluation in this grid."""
from __future__ import annotations

import os
from pathlib import Path

from .section import section_result

OVERLAP_JSON = "scifact_overlap.json"


def render_overlap(results: Path) -> list[str]:
    p = results / OVERLAP_JSON
    d = section_result(p, {"command", "test_queries", "test_queries_sharing_a_relevant_document", "fraction"},
                       "benchmarks/scifact_overlap.py")
    if d is None:
        return []
    return ["## SciFact is an in-domain evaluation here", "",
            f"{d['test_queries_sharing_a_relevant_document']} of the {d['test_queries']} SciFact test queries "
            f"({d['fraction']:.0%}; the queries scifact_small and full SciFact score) have a relevant abstract that "
            f"is also a positive of a SciFact *train* query ({d['test_relevant_documents_that_are_train_positives']}"
            f" of {d['test_relevant_documents']} test-relevant abstracts). The dense retriever was trained on mined "
            "SciFact train queries (`benchmarks/train_dense.py`), and GAPrune's general triplets are drawn from "
            "SciFact train and MS MARCO, so scifact_small measures quality on a domain that training and DAI "
            "already saw, not held-out general quality. The general side has not been rerun with MS MARCO alone.",
            "", f"`{d['command']}` ({d.get('code_version')}); source: "
            f"[{OVERLAP_JSON}]({os.path.relpath(p, results.parent)}).", ""]
