"""`dsprune score`: EffiR importance of every attention, MLP and block, with the drop-order heat map."""
from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..importance import methods
from ..log import logger
from .common import CalibArgs, EncoderArgs, calibration_texts, load_encoder, weights_of


@dataclass
class Args(CalibArgs, EncoderArgs):
    out: str = field(default="out/score", metadata={"help": "output folder"})
    overwrite: bool = False
    compare_forward: bool = field(default=False, metadata={
        "help": "also time scoring against a plain forward pass over the same batches, as alternating pairs"})
    compare_pairs: int = field(default=5, metadata={"help": "timed scoring/forward pairs for --compare_forward"})


def compute_scores(enc, texts, args) -> tuple[dict, dict]:
    """1 − cos of every sub-layer, with how long scoring took (and, asked, its cost over a plain forward)."""
    t0 = time.perf_counter()
    scores = methods.get("cosine", "sublayer")(enc, texts, args.batch_size, args.calib_max_length)
    figures = {"scoring_seconds": round(time.perf_counter() - t0, 3), "n_texts": len(texts)}
    if getattr(args, "compare_forward", False):
        figures.update(scoring_over_forward(enc, texts, args))
    return scores, figures


def scoring_over_forward(enc, texts, args) -> dict:
    """Scoring's time over a plain forward's on the same batches: the median of alternating pairs with its
    min–max, as ``dsprune bench`` times models. The scoring pass before it is the warm-up of both (same
    weights, kernels and batches), and both run without autograd, so the ratio is what reading and comparing
    the streams adds."""
    import torch

    from ..eval.speed import WIDE_SPREAD, pair_ratios, time_pairs
    from ..importance.layer_cosine import plain_forward_seconds

    score = methods.get("cosine", "sublayer")

    def forward():
        with torch.no_grad():
            plain_forward_seconds(enc, texts, args.batch_size, args.calib_max_length)

    runs = {"scoring": lambda: score(enc, texts, args.batch_size, args.calib_max_length, show_progress=False),
            "forward": forward}
    times, _ = time_pairs(runs, args.compare_pairs, warmup=0, desc="timed scoring/forward pairs")
    ratio = pair_ratios(times["scoring"], times["forward"])
    if ratio["spread"] > WIDE_SPREAD:
        print(f"warning: scoring over forward {ratio['median']:.2f}x: its pairs spread {ratio['min']:.2f}–"
              f"{ratio['max']:.2f}x ({ratio['spread']:.0%} of the median): the machine's load changed during the run",
              file=sys.stderr)
    return {"plain_forward_seconds": round(statistics.median(times["forward"]), 3),
            "scoring_over_forward": round(ratio["median"], 3),
            "scoring_over_forward_min_max": [round(ratio["min"], 3), round(ratio["max"], 3)],
            "compare_pairs": args.compare_pairs}


def run(args: Args) -> int:
    from ..report.heatmap import drop_order_heatmap
    from ..surgery.prune import num_layers

    texts = calibration_texts(args)           # bad calibration input fails before the model loads
    if args.compare_forward and args.compare_pairs < 1:
        raise DsPruneError(f"compare_pairs must be at least 1, not {args.compare_pairs}")
    formats.check_output(args.out, args.overwrite)
    enc = load_encoder(args, pooling=args.pooling, max_length=args.max_length)
    n = num_layers(enc)
    logger.info(f"scoring {n} layers on {len(texts)} calibration texts")
    scores, figures = compute_scores(enc, texts, args)
    with formats.output_dir(args.out, args.overwrite) as tmp:
        doc = formats.write_scores(tmp, scores, model=args.model, weights=weights_of(args.model), family=enc.family,
                                   num_layers=n)
        drop_order_heatmap(scores, n, tmp / "drop_order.png", title=f"{Path(args.model).name}: drop order")
        formats.write_manifest(tmp, "score", {"model": args.model, "calib": args.calib or "default"},
                               asdict(args), figures)
    print_scores(doc, figures)
    print(f"wrote {args.out}/scores.json and drop_order.png")
    return 0


def print_scores(doc: dict, figures: dict) -> None:
    for g in formats.SCORE_GROUPS:
        order = doc["order"][g]
        print(f"{g:>5} drop order: {' '.join(map(str, order))}")
    for g in formats.SCORE_GROUPS:
        s = doc["scores"][g]
        print(f"{g:>5} 1-cos: " + " ".join(f"{s[str(i)]:.3f}" for i in sorted(map(int, s))))
    print("figures: " + ", ".join(f"{k}={v}" for k, v in figures.items()))
