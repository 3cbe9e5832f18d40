"""`dsprune plan`: ask for a speed-up, get the drops and slimming ratio that reach it by the FLOP count.

Writes ``plan.json`` (chosen sub-layers, counts, slimming ratio, predicted FLOP ratio, the cost/speed front
of all candidates) for ``dsprune drop --plan`` and ``dsprune mask --ratio``; ``dsprune bench`` then measures
what the FLOP ratio predicts. The policy is in ``importance/plan.py``.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .. import formats
from ..importance.drop_plan import PROTECT_HELP, protect_spec
from .common import CalibArgs, EncoderArgs, calibration_texts, load_encoder, weights_of


@dataclass
class Args(CalibArgs, EncoderArgs):
    target_speedup: float = field(kw_only=True, metadata={
        "help": "FLOP ratio to reach (model as given over the pruned one), above 1"})
    out: str = field(default="out/plan", metadata={"help": "output folder (plan.json, manifest)"})
    overwrite: bool = False
    scores: str | None = field(default=None, metadata={"help": "scores.json (or its folder) from `dsprune score`;"
                                                                " default: score here"})
    seq_len: int = field(default=256, metadata={"help": "tokens per text the FLOPs are counted at (bench's "
                                                        "document length)"})
    protect: str = field(default="0", metadata={"help": PROTECT_HELP})
    drop_groups: list[str] = field(default_factory=lambda: ["attn", "mlp"], metadata={
        "help": "sub-layer groups that may be dropped: attn, mlp (mlp alone: keep every attention; none: "
                "slimming only)"})
    max_slim: float = field(default=0.5, metadata={"help": "largest MLP slimming ratio considered; 0 = drops only"})
    slim_step: float = field(default=0.05, metadata={"help": "step of the slimming-ratio grid"})
    slim_weight: float = field(default=1.0, metadata={
        "help": "predicted damage of slimming r: slim_weight * r * sum of the kept MLPs' scores"})
    slim_ratio: float | None = field(default=None, metadata={
        "help": "slim the kept MLPs by exactly this ratio and plan the drops for the rest of the target "
                "(EffiR Table 3's coarse drop + slimming); overrides max_slim"})
    order: str = field(default="importance", metadata={
        "help": "importance: the cheapest drops and slimming by the scores; last: the fewest whole blocks from "
                "the top (the drop-last-k baseline)"})


def request(args: Args):
    from ..importance.plan import SpeedRequest

    groups = tuple(g for g in args.drop_groups if g != "none")
    req = SpeedRequest(args.target_speedup, args.seq_len, protect_spec(args.protect), groups, args.max_slim, args.slim_step,
                       args.slim_weight, args.order, args.slim_ratio)
    req.validate()
    return req


def run(args: Args) -> int:
    from ..eval.speed import shape_of
    from ..importance.drop_plan import layer_scores
    from ..importance.plan import PLAN, plan_speedup, table
    from ..surgery.prune import num_layers
    from .score import compute_scores

    req = request(args)                          # bad numbers fail before anything loads
    formats.check_output(args.out, args.overwrite)
    scores_doc = formats.read_scores(args.scores) if args.scores else None
    texts = calibration_texts(args) if scores_doc is None else None
    enc = load_encoder(args, pooling=args.pooling, max_length=args.max_length)
    n = num_layers(enc)
    figures: dict = {}
    if scores_doc is not None:
        scores = layer_scores(scores_doc, args.scores, args.model, n, weights_of(args.model))
    else:
        scores, figures = compute_scores(enc, texts, args)
    plan = plan_speedup(scores, shape_of(enc), req)
    doc = plan.to_json(model=args.model, family=enc.family)
    with formats.output_dir(args.out, args.overwrite) as tmp:
        formats.write_json(tmp / PLAN, doc)
        if scores_doc is None:                   # scored here: keep them for a later drop or plan
            formats.write_scores(tmp, scores, model=args.model, weights=weights_of(args.model), family=enc.family,
                                 num_layers=n)
        formats.write_manifest(tmp, "plan", {"model": args.model, "scores": args.scores}, asdict(args),
                               {**figures, "flop_ratio": doc["flop_ratio"], "n_candidates": doc["n_candidates"]},
                               files={"plan": PLAN})
    c = plan.chosen
    print(f"{doc['n_candidates']} candidates at {req.seq_len} tokens; cost/speed front:\n{table(plan)}")
    print(f"plan for {req.target}x: drop attention {plan.drop.attn or '-'}, MLP {plan.drop.mlp or '-'}, "
          f"slim {c.slim} -> FLOP ratio {c.flop_ratio:.3f}x (predicted cost {c.cost:.4f})")
    print(f"wrote {args.out}/{PLAN}: `dsprune drop --plan {args.out}`, then `dsprune mask --plan {args.out}`")
    return 0
