"""`dsprune drop`: remove the least important sub-layers (EffiR §4) and export a really smaller model."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..importance import methods
from ..importance.drop_plan import (PROTECT_HELP, DropPlan, DropRequest, layer_scores, plan_iterative,
                                   plan_one_shot, protect_label, protect_spec, protected)
from .common import CalibArgs, EncoderArgs, calibration_texts, load_encoder, weights_of
from ..importance.plan import check_keeps
from .score import compute_scores


@dataclass
class Args(CalibArgs, EncoderArgs):
    out: str = field(default="out/drop", metadata={"help": "export folder"})
    overwrite: bool = False
    scores: str | None = field(default=None, metadata={"help": "scores.json (or its folder) from `dsprune score`;"
                                                                " default: score here"})
    drop_mlp: int = field(default=0, metadata={"help": "number of MLP sub-layers to drop"})
    drop_attn: int = field(default=0, metadata={"help": "number of attention sub-layers to drop"})
    drop_blocks: int = field(default=0, metadata={"help": "number of whole blocks to drop (by block score)"})
    drop_last: int = field(default=0, metadata={"help": "drop the last k blocks (no scores needed)"})
    iterative: bool = field(default=False, metadata={"help": "re-score after each single drop"})
    protect: str = field(default="0", metadata={"help": PROTECT_HELP})
    plan: str | None = field(default=None, metadata={"help": "plan.json (or its folder) from `dsprune plan`: "
                                                              "drop exactly its sub-layers"})


def run(args: Args) -> int:
    from ..report.heatmap import drop_order_heatmap
    from ..surgery.prune import count_params, drop_sublayers, num_layers, structure

    req = DropRequest(mlp=args.drop_mlp, attn=args.drop_attn, blocks=args.drop_blocks, last=args.drop_last,
                      protect=protect_spec(args.protect))
    formats.check_output(args.out, args.overwrite)
    if args.plan:
        return _run_plan(args, req)
    scores_doc = formats.read_scores(args.scores) if args.scores else None
    texts = None
    if args.iterative or (scores_doc is None and (req.mlp or req.attn or req.blocks)):
        texts = calibration_texts(args)
    enc = load_encoder(args, pooling=args.pooling, max_length=args.max_length)
    n = num_layers(enc)
    weights = weights_of(args.model) if scores_doc is not None or texts is not None else None   # drop_last: no scores
    before = structure(enc)
    gone_attn, gone_mlp = set(before["drop_attn"]), set(before["drop_mlp"])
    req.validate(n, gone_attn, gone_mlp)
    if not protected(req.protect) and req.mlp + req.blocks + req.last >= n - len(gone_mlp):   # the counts tell, unscored
        whole = req.blocks + req.last >= n - len(gone_attn & gone_mlp)
        check_keeps(n, range(n) if whole else gone_attn, range(n), f"drop {req.label()}")
    params_before = count_params(enc.model)
    figures: dict = {}
    if args.iterative:
        plan, history = plan_iterative(
            lambda: methods.get("cosine", "sublayer")(enc, texts, args.batch_size, args.calib_max_length,
                                                      show_progress=False),
            lambda a, m: drop_sublayers(enc, a, m), n, req, gone_attn, gone_mlp)
        scores = history[0] if history else None
    else:
        if scores_doc is not None:
            scores = layer_scores(scores_doc, args.scores, args.model, n, weights)
        elif texts is not None:
            scores, figures = compute_scores(enc, texts, args)
        else:  # drop_last alone needs no scores
            scores = None
        plan = plan_one_shot(scores or {"attn": {}, "mlp": {}, "block": {}}, n, req, gone_attn, gone_mlp)
        drop_sublayers(enc, plan.attn, plan.mlp)
    check_keeps(n, gone_attn | set(plan.attn), gone_mlp | set(plan.mlp), f"drop {req.label()}")
    out = Path(args.out)

    def write_scores_and_plot(folder: Path) -> None:
        if scores is not None:
            formats.write_scores(folder, scores, model=args.model, weights=weights, family=enc.family,
                                 num_layers=n, iterative=args.iterative)
            drop_order_heatmap(scores, n, folder / "drop_order.png", chosen={"attn": plan.attn, "mlp": plan.mlp},
                               title=f"{Path(args.model).name}: drop {req.label()} (red = dropped)")

    params_after = _export(enc, args, plan, req.label(), params_before, {"model": args.model, "scores": args.scores},
                           figures, write_scores_and_plot)
    print(f"dropped {req.label()}: attention {plan.attn or '-'}, MLP {plan.mlp or '-'}")
    print(f"parameters {params_before:,} -> {params_after:,} ({params_after / params_before:.3f}x)")
    print(f"export: {out}")
    return 0


def _run_plan(args: Args, req: DropRequest) -> int:
    """Drop what a ``dsprune plan`` chose: no scores, no counts (they would contradict it)."""
    from ..importance.plan import read_plan
    from ..surgery.prune import count_params, drop_sublayers, num_layers, structure

    if any((req.mlp, req.attn, req.blocks, req.last, args.iterative, args.scores)):
        raise DsPruneError("--plan chooses the sub-layers itself: drop drop_mlp/drop_attn/drop_blocks/"
                           "drop_last/iterative/scores")
    doc = read_plan(args.plan)
    plan = DropPlan(sorted(doc["attn"]), sorted(doc["mlp"]), doc.get("steps", []))
    enc = load_encoder(args, pooling=args.pooling, max_length=args.max_length)
    n = num_layers(enc)
    if doc["num_layers"] != n:
        raise DsPruneError(f"{args.plan}: the plan is for a {doc['num_layers']}-layer model, {args.model} has "
                           f"{n} layers")
    early = sorted(set(plan.attn + plan.mlp) & protected(req.protect, doc["num_layers"]))
    if early:
        raise DsPruneError(f"{args.plan}: the plan drops layer(s) {early}, inside --protect {args.protect} "
                           f"({protect_label(req.protect)})")
    gone = structure(enc)
    check_keeps(n, set(gone["drop_attn"]) | set(plan.attn), set(gone["drop_mlp"]) | set(plan.mlp),
                f"{args.plan}: the plan, on {args.model},")
    before = count_params(enc.model)
    drop_sublayers(enc, plan.attn, plan.mlp)
    label = DropRequest(mlp=len(plan.mlp), attn=len(plan.attn)).label()
    after = _export(enc, args, plan, label, before, {"model": args.model, "plan": args.plan}, {})
    print(f"dropped {label} (plan {args.plan}): attention {plan.attn or '-'}, MLP {plan.mlp or '-'}; "
          f"parameters {before:,} -> {after:,}; export: {args.out}")
    return 0


def _export(enc, args: Args, plan: DropPlan, label: str, before: int, inputs: dict, figures: dict,
            write_extra=None) -> int:
    """The dropped model's export with its parameter counts (both ways of choosing what to drop end here)."""
    from ..surgery.prune import count_params, export

    after = count_params(enc.model)
    figures.update(params_before=before, params_after=after, param_ratio=round(after / before, 4))
    export(enc, args.out, overwrite=args.overwrite, stage="drop", inputs=inputs, config=asdict(args),
           figures=figures, params_before=before, write_extra=write_extra, drop=label, steps=plan.steps)
    return after
