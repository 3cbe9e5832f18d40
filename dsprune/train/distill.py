"""Self-distillation recovery (``launchers/train.py --mode distill``): a pruned student learns to embed text
as its unpruned teacher (``--teacher``) does, from unlabelled text.

Data (``--distill_data``, any mix of):

- a BEIR folder: its corpus as passages, its queries as queries; each query judged (grade > 0) in the
  ``--beir_split`` qrels is paired with each of its judged passages. The default split is ``train``, so a
  folder with test judgements only gives single texts and never trains on its test labels (its queries are
  still embedded, unlabelled: pass ``passages=FOLDER/corpus.jsonl`` to leave them out);
- a JSONL file: ``{query, pos: [...]}`` or ``{query, positive}`` rows are pairs (training groups and
  triplets: their negatives become single passages), ``{query}`` rows queries, ``{text[, title]}`` rows
  passages (BEIR corpus rows); a text file: one passage per line;
- ``queries=PATH`` or ``passages=PATH``: every text of a JSONL or text file as that kind (a BEIR
  ``queries.jsonl`` on its own, say);
- ``crops=PATH``: every text of a JSONL or text file as a passage, paired with a pseudo-query cut from it: a
  span of ``CROP_WORDS`` words (Izacard et al., "Unsupervised Dense Information Retrieval with Contrastive
  Learning"; a web query is a few words). A corpus without queries then also distils the query side: the
  query prompt on short text, ranked against passages. Each text's span is drawn from its own hash, so every
  run and seed cuts the same queries and shares the teacher's cached table.

So every item is a query, a passage or a labelled pair. The teacher (``--teacher``; ``self`` is the starting
model as loaded, before any ``--mask``) embeds every distinct query text (query prompt and length) and
passage text once; the tables are cached on disk (``teacher_table``) and shared by every run and sweep trial
with the same teacher, text and lengths.

Losses, each with its weight (0 = off), over the items of the micro-batch:

- ``cosine`` (1 − cos) or ``mse`` between each student embedding and the teacher's (``distill_embed_weight``);
- ``kl``: KL(teacher ‖ student) between in-batch similarity distributions (``distill_kl_weight``). Every item
  has one row, its query or, lacking one, its passage, scored against every passage of the batch on every
  rank (``cross_rank_negatives``); a passage row leaves out its own column, a self-similarity of 1 for both
  models. A batch of plain text thus distils the passage×passage neighbourhood, a batch with queries the
  query×passage ranking that retrieval uses;
- ``infonce`` on the labelled pairs (``infonce_weight``), each query's own passage against all others; only
  when the data has pairs.

ZeRO's collectives need every rank to run the same forwards and backwards whatever its items are, so a
micro-batch embeds one query slot and one passage slot per item; a slot an item lacks holds a short
placeholder that no loss term reads.
"""
from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import formats
from ..data import doc_text, load_texts
from ..errors import DsPruneError
from ..losses import gather_with_grad
from ..settings import cache_dir
from .data import resolve_source
from .loop import Hooks, MicroBatch

CACHE = "teacher_embeddings"
KINDS = ("queries", "passages", "crops")
CROP_WORDS = (4, 12)    # a pseudo-query's length in words, both ends included
LOSSES = ("cosine", "mse")
PLACEHOLDER = "."
MASKED = -1e9  # a logit no softmax row can pick; finite, so masked entries give no NaN


@dataclass
class DistillArgs:
    distill_data: list[str] = field(default_factory=list, metadata={
        "help": "distill mode: unlabelled text, any mix of BEIR folders (corpus + queries, pairs from "
                "--beir_split qrels), JSONL ({query[, pos|positive]} or {text}) or text files, and "
                "queries=PATH / passages=PATH / crops=PATH (each passage paired with a span of its words)"})
    distill_loss: str = field(default="cosine", metadata={"help": "student-to-teacher embedding loss: cosine | mse"})
    distill_embed_weight: float = field(default=1.0, metadata={"help": "weight of the cosine/mse term"})
    distill_kl_weight: float = field(default=1.0, metadata={
        "help": "weight of the KL between the teacher's and the student's in-batch similarity distributions"})
    distill_max_items: int = field(default=0, metadata={"help": "use at most this many items (0 = all)"})


@dataclass(frozen=True)
class Item:
    """A query, a passage, or a labelled pair."""
    query: str | None
    passage: str | None


def check_distill(args) -> None:
    """Distillation options, before any process group exists."""
    if args.mode != "distill":
        if args.distill_data:
            raise DsPruneError("distill_data is read in --mode distill only")
        return
    if not args.distill_data:
        raise DsPruneError("--mode distill: give --distill_data (BEIR folders, JSONL or text files)")
    if args.train_data:
        raise DsPruneError("--mode distill reads --distill_data, not train_data: give labelled pairs as "
                           "{query, pos} rows or BEIR train qrels there")
    if not args.teacher:
        raise DsPruneError("--mode distill needs --teacher: the unpruned model (or 'self', the starting model)")
    if args.kl_weight:
        raise DsPruneError("kl_weight is --mode train's grouped KL; in distill mode use distill_kl_weight")
    if args.distill_loss not in LOSSES:
        raise DsPruneError(f"distill_loss must be one of {', '.join(LOSSES)}, not {args.distill_loss!r}")
    weights = (args.distill_embed_weight, args.distill_kl_weight, args.infonce_weight)
    if min(weights) < 0 or not any(weights):
        raise DsPruneError("distill weights (distill_embed_weight, distill_kl_weight, infonce_weight) must be "
                           ">= 0 and not all 0")
    if args.distill_max_items < 0:
        raise DsPruneError(f"distill_max_items must be >= 0, not {args.distill_max_items}")


# ---- data -------------------------------------------------------------------------------------------------
def load_items(sources, split: str = "train", max_items: int = 0, seed: int = 0) -> list[Item]:
    """Every item of every source, in source order, duplicates dropped; a seeded subsample of ``max_items``."""
    items: list[Item] = []
    for spec in sources:
        kind, _, rest = str(spec).partition("=")
        if rest and kind in KINDS:
            texts = load_texts(resolve_source(rest))
            if kind == "crops":
                items += [Item(crop(t), t) for t in texts]
            else:
                items += [Item(t, None) if kind == "queries" else Item(None, t) for t in texts]
            continue
        path = resolve_source(spec)
        if path.is_dir():
            items += _beir_items(path, split)
        elif path.suffix == ".jsonl":
            items += _jsonl_items(path)
        else:
            items += [Item(None, t) for t in load_texts(path)]
    items = list(dict.fromkeys(items))
    if not items:
        raise DsPruneError(f"distill_data: no text in {', '.join(map(str, sources))}")
    if max_items and max_items < len(items):
        keep = sorted(random.Random(seed).sample(range(len(items)), max_items))
        items = [items[i] for i in keep]
    return items


def crop(text: str) -> str:
    """A span of ``CROP_WORDS`` consecutive words of ``text`` (the whole text when shorter), at a place and
    length drawn from the text's own hash."""
    words = text.split()
    rng = random.Random(hashlib.sha256(text.encode()).digest())
    n = min(len(words), rng.randint(*CROP_WORDS))
    start = rng.randint(0, len(words) - n)
    return " ".join(words[start:start + n])


def _beir_items(folder: Path, split: str) -> list[Item]:
    from ..data import load_beir
    if not (folder / "corpus.jsonl").is_file():
        raise DsPruneError(f"{folder}: not a BEIR folder (no corpus.jsonl)")
    queries = load_texts(folder / "queries.jsonl", field="text") if (folder / "queries.jsonl").is_file() else []
    if not (folder / "qrels" / f"{split}.tsv").is_file():
        return [Item(q, None) for q in queries] + [Item(None, p) for p in load_texts(folder / "corpus.jsonl")]
    beir = load_beir(folder, split)
    pairs = [Item(beir.queries[q], beir.corpus[d]) for q in sorted(beir.qrels)
             for d, g in sorted(beir.qrels[q].items()) if g > 0]
    paired_q, paired_p = {i.query for i in pairs}, {i.passage for i in pairs}
    return (pairs + [Item(q, None) for q in queries if q not in paired_q]
            + [Item(None, p) for p in beir.corpus.values() if p not in paired_p])


def _jsonl_items(path: Path) -> list[Item]:
    items = []
    for n, row in formats.iter_jsonl(path):
        where = f"{path}:{n}"
        if "query" in row:
            q = row["query"]
            pos = row.get("pos", [row["positive"]] if "positive" in row else [])
            if not isinstance(q, str) or not q.strip():
                raise DsPruneError(f"{where}: field 'query' must be a non-empty string")
            if not isinstance(pos, list) or not all(isinstance(p, str) and p.strip() for p in pos):
                raise DsPruneError(f"{where}: 'pos'/'positive' must hold non-empty strings")
            neg = row.get("neg", [row["negative"]] if "negative" in row else [])
            if not isinstance(neg, list) or not all(isinstance(p, str) and p.strip() for p in neg):
                raise DsPruneError(f"{where}: 'neg'/'negative' must hold non-empty strings")
            items += ([Item(q, p) for p in pos] or [Item(q, None)]) + [Item(None, p) for p in neg]
        elif isinstance(row.get("text"), str) and doc_text(row):
            items.append(Item(None, doc_text(row)))
        else:
            raise DsPruneError(f"{where}: a distillation row needs a 'query' (with 'pos' or 'positive' for a "
                               "pair) or a non-empty 'text'")
    return items


# ---- the teacher's embeddings, cached -----------------------------------------------------------------------
def fingerprint(model: str, overrides: dict | None = None) -> str:
    """sha256 of every file of a model (weights, configs, tokenizer, heads; a run's manifest left out) and
    the encoder options it is used with: a changed or retrained teacher never reads another's cache."""
    from ..packaged import model_path
    root = Path(model_path(model))
    if not root.exists():
        raise DsPruneError(f"teacher not found: {model}")
    files = [root] if root.is_file() else sorted(
        p for p in root.rglob("*") if p.is_file() and p.name != formats.MANIFEST
        and not any(part.startswith(".") for part in p.relative_to(root).parts))
    h = hashlib.sha256(json.dumps(overrides or {}, sort_keys=True).encode())
    for f in files:
        h.update(f"{f.name if f == root else f.relative_to(root)}\0".encode())
        with open(f, "rb") as fh:
            h.update(hashlib.file_digest(fh, "sha256").digest())
    return h.hexdigest()


def texts_hash(texts) -> str:
    h = hashlib.sha256()
    for t in texts:
        b = t.encode()
        h.update(f"{len(b)}:".encode() + b)
    return h.hexdigest()


@dataclass
class TeacherTable:
    """The teacher's embedding of each text of one kind, row ``index[text]`` of ``emb``."""
    path: Path
    key: str
    index: dict[str, int]
    emb: torch.Tensor

    def rows(self, texts, dim: int) -> torch.Tensor:
        """Rows for ``texts`` (zeros where a text is None: a slot its item does not have)."""
        out = torch.zeros(len(texts), dim)
        for i, t in enumerate(texts):
            if t is not None:
                out[i] = self.emb[self.index[t]]
        return out


def teacher_table(fp: str, kind: str, texts, max_length: int | None, dtype: str, load_teacher,
                  batch_size: int = 32, show_progress: bool = False) -> TeacherTable:
    """The cached table for (teacher ``fp``, text set, ``kind``, ``max_length``, ``dtype``), written atomically.

    In a distributed run every rank embeds its share of the texts and the shares are gathered, so the one-off
    teacher pass takes 1/world of the time; a rank whose file system lacks the file then writes it (one rank
    per shared cache, by the file's lock). Outside one, the first process to take the lock computes the table
    and the others wait, then read it."""
    texts = sorted(set(texts))
    th = texts_hash(texts)
    key = f"{fp[:16]}-{kind}-L{max_length or 'cfg'}-{dtype}-{th[:16]}"
    path = cache_dir() / CACHE / f"{key}.safetensors"
    meta = {"fingerprint": fp, "texts_sha256": th, "kind": kind, "max_length": str(max_length),
            "dtype": dtype, "n": str(len(texts))}

    def embed(part: list[str]) -> torch.Tensor:
        return load_teacher().encode(part, kind, batch_size=batch_size, show_progress=show_progress,
                                     max_length=max_length).float().cpu()

    def write(make) -> None:
        from safetensors.torch import save_file
        with formats.exclusive(path.with_name(f".{key}.lock")):
            if path.is_file():
                return
            with formats.atomic_file(path) as tmp:
                save_file({"embeddings": make().contiguous()}, str(tmp), metadata=meta)

    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world == 1:
        if not path.is_file():
            write(lambda: embed(texts))
    elif missing_on_any_rank(path):
        rank = dist.get_rank()
        shares: list = [None] * world
        dist.all_gather_object(shares, embed(texts[rank::world]) if texts[rank::world] else None)
        emb = torch.empty(len(texts), next(x for x in shares if x is not None).shape[1])
        for r, share in enumerate(shares):
            if share is not None:
                emb[r::world] = share
        write(lambda: emb)
        dist.barrier()
    return TeacherTable(path, key, {t: i for i, t in enumerate(texts)}, read_table(path, meta))


def missing_on_any_rank(path: Path) -> bool:
    """Whether some rank lacks ``path``: one answer for every rank, so all take the same collectives."""
    flags: list = [None] * dist.get_world_size()
    dist.all_gather_object(flags, not path.is_file())
    return any(flags)


def read_table(path: Path, meta: dict) -> torch.Tensor:
    """A cache file's embeddings; a truncated, corrupted or mislabelled file is one error naming it."""
    from safetensors import safe_open
    try:
        with safe_open(str(path), "pt") as f:
            got = f.metadata()
            emb = f.get_tensor("embeddings")
    except Exception as e:  # safetensors raises its own and OS errors; all mean the same here
        raise DsPruneError(f"teacher cache {path}: unreadable ({type(e).__name__}: {e}); delete it to "
                           "recompute") from None
    if got != meta or emb.ndim != 2 or emb.shape[0] != int(meta["n"]) or not torch.isfinite(emb).all():
        raise DsPruneError(f"teacher cache {path}: does not hold the {meta['n']} finite embeddings its name "
                           f"promises (metadata {got}); delete it to recompute")
    return emb


# ---- the loss -------------------------------------------------------------------------------------------------
def distill_loss(q, p, tq, tp, has_q, has_p, args, infonce: bool) -> tuple[torch.Tensor, dict]:
    """The weighted distillation terms (see the module's docstring) for one micro-batch: ``q``/``p`` the
    student's query and passage slots [B, d], ``tq``/``tp`` the teacher's, ``has_q``/``has_p`` [B] which
    slots hold a real text."""
    dev = q.device
    q, p, tq, tp = q.float(), p.float(), tq.to(dev).float(), tp.to(dev).float()
    has_q, has_p = has_q.to(dev), has_p.to(dev)
    parts, total = {}, q.new_zeros(())
    if args.distill_embed_weight > 0:
        s, t = torch.cat([q[has_q], p[has_p]]), torch.cat([tq[has_q], tp[has_p]])
        v = (1 - F.cosine_similarity(s, t, dim=-1)).mean() if args.distill_loss == "cosine" else F.mse_loss(s, t)
        parts[args.distill_loss] = v
        total = total + args.distill_embed_weight * v
    if args.distill_kl_weight > 0 or infonce:
        b = q.shape[0]
        cross = args.cross_rank_negatives and dist.is_available() and dist.is_initialized()
        p_all = gather_with_grad(p) if cross else p
        tp_all = gather_with_grad(tp) if cross else tp
        col_ok = (gather_with_grad(has_p.float()) if cross else has_p.float()) > 0
        own = torch.arange(b, device=dev) + (dist.get_rank() * b if cross else 0)
        valid = col_ok.unsqueeze(0).repeat(b, 1)
        valid[torch.arange(b, device=dev), own] &= has_q  # a passage row leaves out its own column
        rows = valid.any(1)
        student = torch.where(has_q[:, None], q, p) @ p_all.T / args.temperature
        student = student.masked_fill(~valid, MASKED)
        if args.distill_kl_weight > 0:
            teacher = torch.where(has_q[:, None], tq, tp) @ tp_all.T / args.temperature
            log_t = F.log_softmax(teacher.masked_fill(~valid, MASKED) / args.teacher_temperature, dim=-1)
            log_s = F.log_softmax(student, dim=-1)
            kl = torch.where(valid, log_t.exp() * (log_t - log_s), 0.0).sum(1)
            parts["kl"] = (kl * rows).sum() / rows.sum().clamp_min(1)
            total = total + args.distill_kl_weight * parts["kl"]
        if infonce:
            pair = (has_q & has_p).float()
            ce = F.cross_entropy(student, own, reduction="none")
            parts["infonce"] = (ce * pair).sum() / pair.sum().clamp_min(1)
            total = total + args.infonce_weight * parts["infonce"]
    return total, parts


# ---- the stage ---------------------------------------------------------------------------------------------
def distill_hooks(args, base: Hooks) -> Hooks:
    """``base`` (a held mask, if any) plus distillation: its data, the teacher tables, its loss."""
    state: dict = {}
    tables: dict[str, TeacherTable] = {}
    info: dict = {"teacher": args.teacher, "loss": args.distill_loss, "sources": list(args.distill_data),
                  "weights": {args.distill_loss: args.distill_embed_weight, "kl": args.distill_kl_weight,
                              "infonce": args.infonce_weight}}
    base.manifest_extra["distill"] = info

    def load_data(a) -> list[Item]:
        items = load_items(a.distill_data, a.beir_split, a.distill_max_items, a.seed)
        info.update(items=len(items), pairs=sum(i.query is not None and i.passage is not None for i in items))
        return items

    def after_set_up(run) -> None:
        from ..encoder import Encoder
        from .loop import encoder_overrides
        a = run.args
        teacher_path = a.model if a.teacher == "self" else a.teacher
        over = encoder_overrides(a) if a.teacher == "self" else {}
        fp = fingerprint(teacher_path, over)
        teacher: list = []

        def load_teacher():
            if not teacher:
                enc = Encoder.load(teacher_path, dtype=a.dtype, device=run.device).eval()
                teacher.append(enc.configure(**over))
            return teacher[0]
        for kind, ml in (("query", a.query_max_length), ("passage", a.passage_max_length)):
            texts = [getattr(i, kind) for i in run.groups if getattr(i, kind) is not None]
            if texts:
                tables[kind] = teacher_table(fp, kind, texts, ml, a.dtype, load_teacher, a.eval_batch_size,
                                             run.rank == 0)
        state["dim"] = next(iter(tables.values())).emb.shape[1]
        info.update(fingerprint=fp, dim=state["dim"], cache={k: {"key": t.key, "file": str(t.path),
                                                                 "texts": len(t.index)} for k, t in tables.items()})

    held = base.prepare_model  # a held mask's, if any

    def prepare_model(enc) -> None:
        if held:
            held(enc)
        if "dim" in state and enc.embedding_dim != state["dim"]:
            raise DsPruneError(f"--mode distill: the student embeds in {enc.embedding_dim} dimensions, the "
                               f"teacher {args.teacher} in {state['dim']}: their embeddings cannot be compared")

    def micro_batch(run, m, step: int, micro: int) -> MicroBatch:
        a, dim = run.args, state["dim"]
        items = [run.groups[i] for i in run.schedule.indices(step, micro, run.rank)]
        qs, ps = [i.query for i in items], [i.passage for i in items]
        has_q = torch.tensor([t is not None for t in qs])
        has_p = torch.tensor([t is not None for t in ps])
        qb = m.model.tokenize([t or PLACEHOLDER for t in qs], "query", max_length=a.query_max_length)
        pb = m.model.tokenize([t or PLACEHOLDER for t in ps], "passage", max_length=a.passage_max_length)
        tq = tables["query"].rows(qs, dim) if "query" in tables else torch.zeros(len(items), dim)
        tp = tables["passage"].rows(ps, dim) if "passage" in tables else torch.zeros(len(items), dim)
        infonce = a.infonce_weight > 0 and info["pairs"] > 0
        tokens = int(qb["attention_mask"][has_q].sum() + pb["attention_mask"][has_p].sum())
        return MicroBatch([qb, pb], lambda e: distill_loss(e[0], e[1], tq, tp, has_q, has_p, a, infonce), tokens)

    base.load_data, base.after_set_up, base.micro_batch = load_data, after_set_up, micro_batch
    base.prepare_model, base.stage = prepare_model, "distill"
    return base

