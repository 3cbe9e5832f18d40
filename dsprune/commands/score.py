"""`dsprune score`: EffiR importance of every attention, MLP and block, with the drop-order heat map."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..importance import methods
from .common import CalibArgs, EncoderArgs, calibration_texts, load_encoder


@dataclass
class Args(CalibArgs, EncoderArgs):
    out: str = field(default="out/score", metadata={"help": "output folder"})
    overwrite: bool = False
    compare_forward: bool = field(default=False, metadata={"help": "also time one plain forward pass"})


def compute_scores(enc, texts, args) -> tuple[dict, dict]:
    """1 − cos of every sub-layer, with how long scoring took (and, asked, how long a plain forward takes)."""
    from ..importance.layer_cosine import plain_forward_seconds

    t0 = time.perf_counter()
    scores = methods.get("cosine", "sublayer")(enc, texts, args.batch_size, args.calib_max_length)
    figures = {"scoring_seconds": round(time.perf_counter() - t0, 3), "n_texts": len(texts)}
    if getattr(args, "compare_forward", False):
        fwd = plain_forward_seconds(enc, texts, args.batch_size, args.calib_max_length)
        figures["plain_forward_seconds"] = round(fwd, 3)
        figures["scoring_over_forward"] = round(figures["scoring_seconds"] / fwd, 3)
    return scores, figures


def run(args: Args) -> int:
    from ..report.heatmap import drop_order_heatmap
    from ..surgery.prune import num_layers

    texts = calibration_texts(args)           # bad calibration input fails before the model loads
    formats.check_output(args.out, args.overwrite)
    enc = load_encoder(args, pooling=args.pooling, max_length=args.max_length)
    n = num_layers(enc)
    scores, figures = compute_scores(enc, texts, args)
    with formats.output_dir(args.out, args.overwrite) as tmp:
        doc = formats.write_scores(tmp, scores, model=args.model, family=enc.family, num_layers=n)
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
