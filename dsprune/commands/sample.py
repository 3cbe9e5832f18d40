"""``dsprune sample``: GAPrune's representative sampling of a triplet set (k-means over query embeddings)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import formats
from ..errors import DsPruneError
from .common import ModelArgs, load_encoder

TRIPLETS = "triplets.jsonl"


@dataclass
class Args(ModelArgs):
    input: list[str] = field(metadata={"help": "triplet sources: JSONL files or BEIR folders as DIR[:split]"})
    out: str = field(metadata={"help": "output folder (triplets.jsonl + manifest.json)"})
    k: int = field(default=5000, metadata={"help": "clusters; capped at the number of triplets"})
    iters: int = field(default=20, metadata={"help": "k-means iterations"})
    seed: int = 0
    batch_size: int = 32
    max_length: int = field(default=128, metadata={"help": "query truncation for the embedding"})
    overwrite: bool = False


def run(args: Args) -> int:
    from ..importance.sampling import representative_indices
    from ..importance.triplets import load_triplets, write_triplets

    if args.k < 1 or args.iters < 1:
        raise DsPruneError("--k and --iters must be at least 1")
    formats.check_output(args.out, args.overwrite)          # fail before embedding anything
    triplets = load_triplets(args.input, seed=args.seed)
    queries = [t.query for t in triplets]
    enc = load_encoder(args)
    emb = enc.encode(queries, kind="query", batch_size=args.batch_size, max_length=args.max_length)
    idx = representative_indices(emb, args.k, args.iters, args.seed)
    with formats.output_dir(args.out, args.overwrite) as tmp:
        n = write_triplets(tmp / TRIPLETS, (triplets[i] for i in idx))
        formats.write_manifest(tmp, "sample", {"model": args.model, "input": list(args.input)},
                               vars(args),
                               figures={"triplets_in": len(triplets), "triplets_out": n,
                                        "k": min(args.k, len(triplets))})
    print(f"sampled {n} of {len(triplets)} triplets (k={min(args.k, len(triplets))}) -> {args.out}/{TRIPLETS}")
    return 0
