"""Training groups for contrastive fine-tuning: one format for every stage, read from three sources.

A *group* is FlagEmbedding's ``{query, pos[], neg[], pos_scores?, neg_scores?}``. The loader also reads
triplet JSONL (``{query, positive, negative}``, as shipped with the MS MARCO subset: the negatives of one
query are pooled into each of its groups) and BEIR folders with train qrels (judged docs are positives,
random corpus docs negatives; ``dsprune mine`` writes groups with hard ones). Everything is validated,
with file and line, before a model is loaded.

The order of examples is a pure function of (seed, step): the permutation of epoch e is drawn from
``seed + e`` and the passages sampled from a group from (seed, epoch, index). A resumed run therefore
sees exactly the batches the uninterrupted run would have seen, with no loader state to checkpoint.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data import load_beir
from ..errors import DsPruneError
from ..formats import iter_jsonl
from ..settings import data_dir


@dataclass
class Group:
    query: str
    pos: list[str]
    neg: list[str]
    pos_scores: list[float] | None = None
    neg_scores: list[float] | None = None
    where: str = ""  # "file:line" for error messages


@dataclass
class Example:
    """One sampled training example: the query and its group of passages, positive first."""
    query: str
    passages: list[str]
    scores: list[float] | None


def resolve_source(path: str) -> Path:
    """A path as given, else a folder name under the shared data (``scifact``)."""
    p = Path(path)
    if p.exists():
        return p
    q = data_dir(path)
    if q.exists():
        return q
    raise DsPruneError(f"training data not found: {path}")


def _texts(value, where: str, name: str, allow_empty: bool = False) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(t, str) for t in value):
        raise DsPruneError(f"{where}: field '{name}' must be a list of strings")
    if not value and not allow_empty:
        what = "no negatives" if name == "neg" else f"an empty '{name}' list"
        raise DsPruneError(f"{where}: group has {what}")
    return value


def _scores(row: dict, name: str, n: int, where: str) -> list[float] | None:
    if name not in row or row[name] is None:
        return None
    s = row[name]
    if not isinstance(s, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in s):
        raise DsPruneError(f"{where}: field '{name}' must be a list of numbers")
    if len(s) != n:
        field_ = name.split("_")[0]
        raise DsPruneError(f"{where}: '{name}' has {len(s)} scores but '{field_}' has {n} passages")
    return [float(x) for x in s]


def _rows(path: Path):
    for n, row in iter_jsonl(path):
        yield f"{path}:{n}", row


def load_jsonl_groups(path: Path) -> list[Group]:
    """Groups or triplets from one JSONL file (the kind is decided by the first row's fields)."""
    rows = list(_rows(path))
    if not rows:
        raise DsPruneError(f"{path}: no training rows")
    triplets = "positive" in rows[0][1] and "pos" not in rows[0][1]
    required = ("query", "positive", "negative") if triplets else ("query", "pos", "neg")
    for where, row in rows:
        missing = [k for k in required if k not in row]
        if missing:
            kind = "triplet" if triplets else "group"
            raise DsPruneError(f"{where}: missing field(s) {', '.join(repr(k) for k in missing)} "
                               f"(a {kind} row needs {', '.join(required)})")
        if not isinstance(row["query"], str) or not row["query"].strip():
            raise DsPruneError(f"{where}: field 'query' must be a non-empty string")
    if triplets:
        return _triplet_groups(rows)
    groups = []
    for where, row in rows:
        pos = _texts(row["pos"], where, "pos")
        neg = _texts(row["neg"], where, "neg")
        groups.append(Group(row["query"], pos, neg, _scores(row, "pos_scores", len(pos), where),
                            _scores(row, "neg_scores", len(neg), where), where))
    return groups


def _triplet_groups(rows) -> list[Group]:
    """One group per triplet; its negatives are all negatives of that query (minus its positives)."""
    negs: dict[str, list[str]] = {}
    poss: dict[str, set] = {}
    for where, row in rows:
        for k in ("positive", "negative"):
            if not isinstance(row[k], str) or not row[k].strip():
                raise DsPruneError(f"{where}: field '{k}' must be a non-empty string")
        key = str(row.get("qid", row["query"]))
        poss.setdefault(key, set()).add(row["positive"])
        lst = negs.setdefault(key, [])
        if row["negative"] not in lst:
            lst.append(row["negative"])
    groups = []
    for where, row in rows:
        key = str(row.get("qid", row["query"]))
        neg = [t for t in negs[key] if t not in poss[key]]
        if not neg:
            raise DsPruneError(f"{where}: group has no negatives (every negative of this query is also a positive)")
        groups.append(Group(row["query"], [row["positive"]], neg, None, None, where))
    return groups


def load_beir_groups(folder: Path, split: str, n_negatives: int, seed: int) -> list[Group]:
    """Judged (grade > 0) docs are positives; negatives are random unjudged corpus docs (deterministic)."""
    beir = load_beir(folder, split)
    ids = sorted(beir.corpus)
    groups = []
    for qid in sorted(beir.qrels):
        judged = beir.qrels[qid]
        pos = [beir.corpus[d] for d, g in sorted(judged.items()) if g > 0]
        if not pos:
            continue
        rng = random.Random(f"{seed}:{qid}")
        neg: list[str] = []
        for d in rng.sample(ids, min(len(ids), n_negatives + len(judged))):
            if d not in judged and len(neg) < n_negatives:
                neg.append(beir.corpus[d])
        if not neg:
            raise DsPruneError(f"{folder}: query {qid}: corpus has no unjudged document to use as a negative")
        groups.append(Group(beir.queries[qid], pos, neg, None, None, f"{folder}/qrels/{split}.tsv:{qid}"))
    if not groups:
        raise DsPruneError(f"{folder}/qrels/{split}.tsv: no query has a positive (grade > 0) document")
    return groups


def load_groups(sources: Sequence[str], beir_split: str = "train", beir_random_negatives: int = 32,
                seed: int = 0, max_examples: int = 0, need_scores: bool = False) -> list[Group]:
    """All groups from all sources, validated; ``need_scores`` demands teacher scores on every group."""
    groups: list[Group] = []
    for src in sources:
        path = resolve_source(src)
        if path.is_dir():
            groups += load_beir_groups(path, beir_split, beir_random_negatives, seed)
        else:
            groups += load_jsonl_groups(path)
    if need_scores:
        for g in groups:
            if g.pos_scores is None or g.neg_scores is None:
                raise DsPruneError(f"{g.where}: kl_weight > 0 without a teacher model needs 'pos_scores' and "
                                   f"'neg_scores' in every group")
    if max_examples and max_examples < len(groups):
        keep = sorted(random.Random(seed).sample(range(len(groups)), max_examples))
        groups = [groups[i] for i in keep]
    return groups


def sample_example(group: Group, group_size: int, rng: random.Random) -> Example:
    """One positive and ``group_size - 1`` negatives (repeating negatives only if the group has too few)."""
    i = rng.randrange(len(group.pos))
    n = group_size - 1
    idx = list(range(len(group.neg)))
    if len(idx) >= n:
        chosen = rng.sample(idx, n)
    else:
        chosen = []
        while len(chosen) < n:
            rng.shuffle(idx)
            chosen += idx[:n - len(chosen)]
    passages = [group.pos[i]] + [group.neg[j] for j in chosen]
    scores = None
    if group.pos_scores is not None and group.neg_scores is not None:
        scores = [group.pos_scores[i]] + [group.neg_scores[j] for j in chosen]
    return Example(group.query, passages, scores)


class Schedule:
    """Which groups every rank sees at every step: a pure function of (seed, step) and, with length buckets,
    of the groups' lengths."""

    def __init__(self, n_groups: int, per_device: int, world: int, accum: int, seed: int):
        self.n, self.per_device, self.world, self.accum, self.seed = n_groups, per_device, world, accum, seed
        self.global_batch = per_device * world * accum
        if n_groups < self.global_batch:
            raise DsPruneError(f"{n_groups} training groups are fewer than one global batch "
                               f"({per_device} per device x {world} ranks x {accum} accumulation steps)")
        self.steps_per_epoch = n_groups // self.global_batch  # the ragged tail of an epoch is dropped
        self.window, self.length = 0, None
        self._order: tuple[int, list[int]] | None = None

    def bucket_by_length(self, window: int, length: Callable[[int, int], int]) -> None:
        """Sort each run of ``window`` global batches of an epoch by ``length(epoch, group)`` and cut it into
        global batches again, taken in a shuffled order; within a step the ranks are dealt the sorted groups
        in turn. Why: every rank pads to its longest text and the step waits for the slowest rank, so ranks
        that get similar lengths stay in step (``window`` 1 keeps each step's groups and only deals them
        evenly; a larger window also puts similar lengths into one step, which saves padding)."""
        self.window, self.length, self._order = window, length, None

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def order(self, epoch: int) -> list[int]:
        """The groups of ``epoch`` in the order the steps take them (its last, ragged part is never taken)."""
        if self._order is None or self._order[0] != epoch:
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            self._order = (epoch, self._bucketed(perm, epoch) if self.window else perm)
        return self._order[1]

    def _bucketed(self, perm: list[int], epoch: int) -> list[int]:
        gb, used = self.global_batch, self.steps_per_epoch * self.global_batch
        out: list[int] = []
        for start in range(0, used, self.window * gb):
            # a stable sort: equal lengths keep the epoch's random order
            run = sorted(perm[start:min(start + self.window * gb, used)], key=lambda i: self.length(epoch, i))
            batches = [run[b:b + gb] for b in range(0, len(run), gb)]
            random.Random(f"{self.seed}:{epoch}:{start}").shuffle(batches)
            for batch in batches:
                out += self._dealt(batch)
        return out + perm[used:]

    def _dealt(self, batch: list[int]) -> list[int]:
        """A global batch sorted by length, laid out so that each micro-batch takes a run of similar lengths and
        deals it to the ranks in turn (rank r of a micro-batch gets its r-th, (r + world)-th, ... group)."""
        span, out = self.world * self.per_device, []
        for m in range(self.accum):
            run = batch[m * span:(m + 1) * span]
            for r in range(self.world):
                out += run[r::self.world]
        return out

    def indices(self, step: int, micro: int, rank: int) -> list[int]:
        """Group indices for optimizer step ``step`` (0-based), micro-batch ``micro``, rank ``rank``."""
        epoch, k = divmod(step, self.steps_per_epoch)
        start = k * self.global_batch + (micro * self.world + rank) * self.per_device
        return self.order(epoch)[start:start + self.per_device]

    def examples(self, groups: Sequence[Group], group_size: int, step: int, micro: int, rank: int) -> list[Example]:
        epoch = self.epoch_of(step)
        return [self.example(groups, group_size, epoch, i) for i in self.indices(step, micro, rank)]

    def example(self, groups: Sequence[Group], group_size: int, epoch: int, i: int) -> Example:
        """Group ``i`` as sampled in ``epoch`` (its positive and negatives)."""
        return sample_example(groups[i], group_size, random.Random(f"{self.seed}:{epoch}:{i}"))


def padded_tokens(example: Example, tokens: Callable[[list[str], str], list[int]]) -> int:
    """The tokens an example costs once padded inside its group: its query, and every passage as long as the
    group's longest (``tokens(texts, kind)`` counts each text's tokens as the collator cuts them)."""
    return tokens([example.query], "query")[0] + len(example.passages) * max(tokens(example.passages, "passage"))


class Collator:
    """Examples -> tensors through ``Encoder.tokenize``: the tokenisation evaluation uses, by construction."""

    def __init__(self, encoder, query_max_length: int | None = None, passage_max_length: int | None = None):
        self.encoder = encoder
        self.query_max_length = query_max_length
        self.passage_max_length = passage_max_length
        self._counts: dict[tuple[str, str], int] = {}

    def token_counts(self, texts: Sequence[str], kind: str) -> list[int]:
        """Each text's tokens as this collator cuts it; remembered, since length buckets ask every epoch."""
        todo = [t for t in dict.fromkeys(texts) if (kind, t) not in self._counts]
        if todo:
            cut = self.query_max_length if kind == "query" else self.passage_max_length
            for t, ids in zip(todo, self.encoder.token_ids(todo, kind, max_length=cut)):
                self._counts[(kind, t)] = len(ids)
        return [self._counts[(kind, t)] for t in texts]

    def __call__(self, examples: Sequence[Example]) -> dict:
        queries = [e.query for e in examples]
        passages = [p for e in examples for p in e.passages]
        batch = {"query": self.encoder.tokenize(queries, "query", max_length=self.query_max_length),
                 "passage": self.encoder.tokenize(passages, "passage", max_length=self.passage_max_length),
                 "queries": queries, "passages": passages, "teacher_scores": None}
        if examples and all(e.scores is not None for e in examples):
            batch["teacher_scores"] = torch.tensor([e.scores for e in examples], dtype=torch.float32)
        return batch
