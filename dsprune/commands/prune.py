"""``dsprune prune``: one-shot mask from DAI or a baseline, unstructured (weights) or structured (MLP neurons).

Every method is a per-weight entry of ``importance.methods``; its scores go through one path,
``budget.mask_from_scores``, to ``formats.write_mask``. Apply the mask with ``dsprune export --mask``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .. import formats
from ..errors import DsPruneError
from ..importance import methods
from .common import ModelArgs

PLOT = "sparsity_per_layer.png"
# options whose value names an importance method of this unit (recipes and sweeps check them by it)
METHOD_OPTIONS = {"method": "weight"}


@dataclass
class Args(ModelArgs):
    method: str = field(metadata={"help": " | ".join(methods.names("weight"))})
    sparsity: float = field(metadata={"help": "fraction of the scored weights (or neurons) to remove"})
    out: str = field(metadata={"help": "output folder (mask.safetensors, mask.json, manifest.json)"})
    scores: Optional[str] = field(default=None, metadata={"help": "`dsprune dai` output (dai, fisher_*)"})
    scope: str = field(default="global", metadata={"help": "budget group: global | layer | row (unstructured)"})
    structured: bool = field(default=False, metadata={"help": "remove whole MLP neurons (gate/up rows, down column)"})
    neuron_agg: str = field(default="sum", metadata={"help": "per-neuron aggregation: sum | positive"})
    attention: bool = field(default=False, metadata={"help": "also mask attention projections (unstructured)"})
    dai_recompute: bool = field(default=False, metadata={"help": "recompute DAI from the saved statistics with "
                                                                  "the dai_* options below (no new gradients)"})
    dai_alpha: float = 0.2
    dai_beta: float = 1.0
    dai_gamma: float = 0.5
    dai_alignment: str = "consistency"
    dai_variant: str = "paper"
    dai_fisher_scale: str = field(default="1", metadata={"help": "number, or 'balanced' (see dsprune dai)"})
    dai_eps: float = field(default=1e-8, metadata={"help": "ε of the alignment's denominator (dsprune dai --eps): "
                                                        "where products of mean gradients are far below it, "
                                                        "Eq. 4's s is ~0 rather than ±1"})
    calib: Optional[str] = field(default=None, metadata={"help": "wanda calibration text (.txt/.jsonl); "
                                                                 "default: MS MARCO + SciFact passages"})
    n_calib: int = 256
    calib_batch_size: int = 8
    max_length: Optional[int] = None
    seed: int = 0
    overwrite: bool = False


def context(args: Args, enc, weights: dict) -> methods.WeightContext:
    """What the chosen method may read, from the command's options."""
    from ..data import default_calibration, load_texts
    from ..importance.dai import DaiParams

    def texts():
        return load_texts(args.calib, args.n_calib, args.seed) if args.calib else \
            default_calibration(args.n_calib, args.seed)

    dai = DaiParams(args.dai_alpha, args.dai_beta, args.dai_gamma, args.dai_alignment, args.dai_variant,
                    args.dai_fisher_scale, args.dai_eps) if args.dai_recompute else None
    return methods.WeightContext(enc, weights, args.scores, args.seed, texts, args.calib_batch_size,
                                 args.max_length, dai, args.attention)


def _plot(path, per_layer: dict[int, float], ylabel: str, title: str) -> None:
    from ..report.figure import pyplot, save_png

    fig, ax = pyplot().subplots(figsize=(7, 3))
    layers = sorted(per_layer)
    ax.bar(layers, [per_layer[l] for l in layers], color="#4477aa")
    ax.set_xlabel("layer (original numbering)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def run(args: Args) -> int:
    from ..importance import budget
    from ..surgery.mask import mlp_weight_names, target_weights
    from .common import load_encoder

    if not 0.0 <= args.sparsity < 1.0:
        raise DsPruneError(f"--sparsity must be in [0, 1), not {args.sparsity}")
    if args.structured and args.attention:
        raise DsPruneError("--structured removes MLP neurons; --attention applies to unstructured masks only")
    if args.structured and args.scope == "row":
        raise DsPruneError("--scope row is for unstructured masks; use global or layer with --structured")
    formats.check_output(args.out, args.overwrite)            # fail before loading anything
    methods.get(args.method, "weight")
    enc = load_encoder(args)
    weights = target_weights(enc, attention=args.attention)
    scores = methods.score_weights(args.method, context(args, enc, weights))
    tensors, kind, per_layer = budget.mask_from_scores(
        scores, args.sparsity, args.scope, args.structured,
        mlp_weight_names(enc) if args.structured else None, args.neuron_agg)
    meta = {"method": args.method, "sparsity": args.sparsity, "scope": args.scope, "model": args.model,
            "scores": args.scores, **({"neuron_agg": args.neuron_agg} if args.structured else {})}
    kept = sum(int(t.sum()) for t in tensors.values())
    total = sum(t.numel() for t in tensors.values())
    what = "neurons" if args.structured else "weights"
    with formats.output_dir(args.out, args.overwrite) as tmp:
        formats.write_mask(tmp, tensors, kind, ratio=args.sparsity, **meta)
        _plot(tmp / PLOT, per_layer, f"fraction of {what} pruned",
              f"{args.method} {kind} mask, sparsity {args.sparsity:g} ({args.scope})")
        formats.write_manifest(tmp, "prune", {"model": args.model, "scores": args.scores},
                               {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")},
                               figures={"kept": kept, "total": total, "achieved_sparsity": 1 - kept / total,
                                        "pruned_per_layer": {str(l): v for l, v in sorted(per_layer.items())},
                                        "plot": PLOT})
    print(f"{args.method} {kind} mask: kept {kept}/{total} {what} (sparsity {1 - kept / total:.4f}) -> {args.out}")
    return 0
