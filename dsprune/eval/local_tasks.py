"""Local folders as mteb tasks (BEIR retrieval, Classification, STS): FinMTEB without the hub.

GAPrune Appendix B evaluates on FinMTEB, whose 8 classification and 2 STS tasks are not in mteb, so each must
be readable from a folder on disk. One JSON object per line:

- Classification: ``train.jsonl`` and ``<split>.jsonl`` (default ``test``), rows ``{"text": ..., "label": ...}``
  (label a string or an integer). mteb fits a logistic regression on train embeddings (at most 8 per label,
  10 draws) and reports accuracy on the split; every label of the split must occur in train.
- STS: ``<split>.jsonl``, rows ``{"sentence1": ..., "sentence2": ..., "score": number}``. mteb reports the
  Spearman correlation of the pairs' cosine similarities with the gold scores (``cosine_spearman``).

Retrieval folders keep the BEIR layout (``dsprune.data.load_beir``). Every file is validated here, with file
and line named, before a single text is encoded.
"""
from __future__ import annotations

import math
from pathlib import Path

from ..data import load_beir
from ..errors import DsPruneError
from ..formats import iter_jsonl

MAIN_SCORE = {"Retrieval": "ndcg_at_10", "Classification": "accuracy", "STS": "cosine_spearman"}
CATEGORY = {"Retrieval": "t2t", "Classification": "t2c", "STS": "t2t"}
LAYOUT = {
    "Retrieval": "corpus.jsonl, queries.jsonl, qrels/<split>.tsv (BEIR)",
    "Classification": 'train.jsonl and <split>.jsonl with {"text", "label"} rows',
    "STS": '<split>.jsonl with {"sentence1", "sentence2", "score"} rows',
}
TRAIN = "train"


def folder_type(folder: Path, split: str) -> str | None:
    """The task type a folder's layout says: BEIR files, else the fields of its first JSONL row."""
    if (folder / "corpus.jsonl").is_file():
        return "Retrieval"
    for path in (folder / f"{split}.jsonl", folder / f"{TRAIN}.jsonl"):
        if path.is_file():
            for _, row in iter_jsonl(path):
                if "sentence1" in row and "sentence2" in row:
                    return "STS"
                return "Classification" if "label" in row else None
    return None


def _split_file(folder: Path, split: str) -> Path:
    path = folder / f"{split}.jsonl"
    if not path.is_file():
        avail = sorted(p.stem for p in folder.glob("*.jsonl"))
        raise DsPruneError(f"split file not found: {path} (splits here: {', '.join(avail) or 'none'})")
    return path


def _text(path: Path, n: int, row: dict, key: str) -> str:
    if key not in row:
        raise DsPruneError(f"{path}: line {n}: missing field {key}")
    v = row[key]
    if not isinstance(v, str) or not v.strip():
        raise DsPruneError(f"{path}: line {n}: field {key} must be a non-empty string")
    return v


def _rows(path: Path, read) -> list:
    rows = [(n, read(n, row)) for n, row in iter_jsonl(path)]
    if not rows:
        raise DsPruneError(f"{path}: empty split (no rows)")
    return rows


def read_classification(folder: Path, split: str) -> tuple[dict[str, tuple[list[str], list[int]]], list[str]]:
    """``({split: (texts, label ids)}, label names)``; ids index the sorted names of the train labels."""
    def read(path):
        def row_of(n, row):
            if "label" not in row:
                raise DsPruneError(f"{path}: line {n}: missing field label")
            label = row["label"]
            if isinstance(label, bool) or not isinstance(label, (str, int)):
                raise DsPruneError(f"{path}: line {n}: field label must be a string or an integer")
            return _text(path, n, row, "text"), str(label)
        return _rows(path, row_of)

    train_path = _split_file(folder, TRAIN)
    splits = {TRAIN: (train_path, read(train_path))}
    if split != TRAIN:
        path = _split_file(folder, split)
        splits[split] = (path, read(path))
    names = sorted({label for _, (_, label) in splits[TRAIN][1]})
    if len(names) < 2:
        raise DsPruneError(f"{train_path}: only one label ({names[0]!r}); classification needs at least two")
    ids = {name: i for i, name in enumerate(names)}
    out = {}
    for name, (path, rows) in splits.items():
        for n, (_, label) in rows:
            if label not in ids:
                raise DsPruneError(f"{path}: line {n}: label {label!r} never occurs in {train_path}")
        out[name] = ([t for _, (t, _) in rows], [ids[lab] for _, (_, lab) in rows])
    return out, names


def read_sts(folder: Path, split: str) -> tuple[list[str], list[str], list[float]]:
    """``(sentence1, sentence2, score)`` columns of one split."""
    path = _split_file(folder, split)

    def row_of(n, row):
        if "score" not in row:
            raise DsPruneError(f"{path}: line {n}: missing field score")
        s = row["score"]
        if isinstance(s, bool) or not isinstance(s, (int, float)) or not math.isfinite(s):
            raise DsPruneError(f"{path}: line {n}: field score must be a finite number")
        return _text(path, n, row, "sentence1"), _text(path, n, row, "sentence2"), float(s)

    rows = [r for _, r in _rows(path, row_of)]
    scores = [s for _, _, s in rows]
    if min(scores) == max(scores):
        raise DsPruneError(f"{path}: all {len(rows)} gold scores are equal ({scores[0]}): Spearman is undefined")
    return [a for a, _, _ in rows], [b for _, b, _ in rows], scores


class _FromFolder:
    """An mteb task whose data is read from ``spec.folder`` once; a subclass only says how (``fill``)."""

    def __init__(self, spec, **kw):
        self.spec = spec
        super().__init__(**kw)

    def load_data(self, num_proc=None, **kwargs) -> None:
        if not self.data_loaded:
            self.fill()
            self.data_loaded = True


def task_class(type_: str):
    """The mteb base class with ``load_data`` reading a local folder (mteb imported only when asked)."""
    from datasets import Dataset, DatasetDict

    if type_ == "Retrieval":
        from mteb.abstasks.retrieval import AbsTaskRetrieval
        from mteb.abstasks.retrieval_dataset_loaders import RetrievalSplitData

        class LocalBeirRetrieval(_FromFolder, AbsTaskRetrieval):
            """A BEIR folder on disk as an mteb retrieval task (no hub)."""

            def fill(self) -> None:
                split = load_beir(self.spec.folder, self.spec.split)
                ids = list(split.corpus_rows)
                corpus = Dataset.from_dict({
                    "id": ids,
                    "title": [(split.corpus_rows[i].get("title") or "") for i in ids],
                    "text": [(split.corpus_rows[i].get("text") or "") for i in ids]})
                qids = list(split.queries)
                queries = Dataset.from_dict({"id": qids, "text": [split.queries[q] for q in qids]})
                self.dataset = {"default": {self.spec.split: RetrievalSplitData(
                    corpus=corpus, queries=queries, relevant_docs=split.qrels, top_ranked=None)}}

        return LocalBeirRetrieval
    if type_ == "Classification":
        from mteb.abstasks.classification import AbsTaskClassification

        class LocalClassification(_FromFolder, AbsTaskClassification):
            """A Classification folder on disk as an mteb task (no hub)."""

            def fill(self) -> None:
                splits, self.label_names = read_classification(self.spec.folder, self.spec.split)
                self.dataset = DatasetDict({name: Dataset.from_dict({"text": texts, "label": labels})
                                            for name, (texts, labels) in splits.items()})

        return LocalClassification
    if type_ == "STS":
        from mteb.abstasks.sts import AbsTaskSTS

        class LocalSTS(_FromFolder, AbsTaskSTS):
            """An STS folder on disk as an mteb task (no hub); gold scores may use any range."""

            def fill(self) -> None:
                s1, s2, scores = read_sts(self.spec.folder, self.spec.split)
                # mteb rescales gold scores by (min, max); correlations do not change under it
                self.min_score, self.max_score = min(scores), max(scores)
                self.dataset = DatasetDict({self.spec.split: Dataset.from_dict(
                    {"sentence1": s1, "sentence2": s2, "score": scores})})

        return LocalSTS
    raise DsPruneError(f"no local task type {type_!r} (local folders: {', '.join(LAYOUT)})")
