"""`dsprune mine`: hard negatives for a BEIR folder's train split, written as training groups (JSONL)."""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..log import logger
from ..settings import data_dir
from .common import ModelArgs, load_encoder

GROUPS = "groups.jsonl"


@dataclass
class Args(ModelArgs):
    data: str = field(metadata={"help": "BEIR folder (or a name under the shared data, e.g. scifact)"})
    out: str = field(default="out/mine", metadata={"help": f"output folder ({GROUPS} + manifest.json)"})
    overwrite: bool = False
    split: str = field(default="train", metadata={"help": "qrels split whose queries are mined"})
    n_negatives: int = 15
    rank_start: int = field(default=3, metadata={"help": "skip the miner's top ranks (unjudged positives)"})
    rank_end: int = field(default=100, metadata={"help": "sample negatives from ranks rank_start..rank_end"})
    with_scores: bool = field(default=False, metadata={"help": "keep miner similarities as teacher scores"})
    score_scale: float = field(default=50.0, metadata={"help": "teacher score = cosine x this (50 = 1/0.02)"})
    max_queries: int = field(default=0, metadata={"help": "mine at most this many queries (0 = all)"})
    max_length: int | None = field(default=None, metadata={"help": "override the miner's max length"})
    batch_size: int = 32
    seed: int = 0


def run(args: Args) -> int:
    from ..train.mine import mine_groups

    formats.check_output(args.out, args.overwrite)
    folder = Path(args.data) if Path(args.data).exists() else data_dir(args.data)
    if not folder.is_dir():
        raise DsPruneError(f"BEIR folder not found: {args.data}")
    t0 = time.time()
    enc = load_encoder(args, max_length=args.max_length or None)
    logger.info(f"mining {args.split} queries of {folder}")
    groups, stats = mine_groups(enc, folder, args.split, args.n_negatives, args.rank_start, args.rank_end,
                                args.seed, args.with_scores, args.score_scale, args.batch_size, args.max_queries)
    with formats.output_dir(args.out, args.overwrite) as tmp:
        with open(tmp / GROUPS, "w", encoding="utf-8") as f:
            for g in groups:
                f.write(json.dumps(g, ensure_ascii=False) + "\n")
        formats.write_manifest(tmp, "mine", {"model": args.model, "data": str(folder), "split": args.split},
                               dataclasses.asdict(args), {**stats, "seconds": round(time.time() - t0, 1)},
                               encoder=dataclasses.asdict(enc.config))
    print(f"mined {stats['queries']} groups x {args.n_negatives} negatives -> {Path(args.out) / GROUPS} "
          f"({time.time() - t0:.0f} s)")
    return 0
