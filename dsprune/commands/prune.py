"""``dsprune prune``: one-shot mask from DAI or a baseline, unstructured (weights) or structured (MLP neurons).

All methods share one path: per-weight scores -> ``budget.keep_top`` (or, with ``--structured``,
``budget.neuron_scores`` + ``keep_top_neurons``) -> ``formats.write_mask``. Apply the mask with
``dsprune export --mask``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import formats
from ..errors import DsPruneError

PLOT = "sparsity_per_layer.png"


@dataclass
class Args:
    model: str = field(metadata={"help": "the model the mask is for"})
    method: str = field(metadata={"help": "dai | magnitude | fisher_dom | fisher_gen | random | wanda"})
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
    calib: Optional[str] = field(default=None, metadata={"help": "wanda calibration text (.txt/.jsonl); "
                                                                 "default: MS MARCO + SciFact passages"})
    n_calib: int = 256
    calib_batch_size: int = 8
    max_length: Optional[int] = None
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    overwrite: bool = False


def scores_for(args: Args, enc, weights: dict) -> dict:
    """Per-weight scores of ``args.method`` for ``weights`` (backbone-relative names)."""
    from ..importance import baselines as B
    from ..importance.dai import read_stat

    if args.method not in B.METHODS:
        raise DsPruneError(f"--method must be one of {', '.join(B.METHODS)}, not {args.method!r}")
    if args.method in ("dai", "fisher_dom", "fisher_gen") and not args.scores:
        raise DsPruneError(f"--method {args.method} needs --scores (the output folder of `dsprune dai`)")
    if args.method == "random":
        return B.random_scores(weights, args.seed)
    if args.method == "magnitude":
        return B.magnitude_scores(weights)
    if args.method in ("fisher_dom", "fisher_gen"):
        return B.fisher_scores(weights, read_stat(args.scores, args.method))
    if args.method == "dai" and args.dai_recompute:
        from ..importance.dai import dai_from_stats
        return dai_from_stats(args.scores, weights, args.dai_alpha, args.dai_beta, args.dai_gamma,
                              args.dai_alignment, args.dai_variant, args.dai_fisher_scale)
    if args.method == "dai":
        dai = read_stat(args.scores, "dai")
        for n, w in weights.items():
            if n not in dai:
                raise DsPruneError(f"{args.scores}: no DAI score for {n!r} (was `dsprune dai` run with "
                                   f"--attention {args.attention} on this model?)")
            if tuple(dai[n].shape) != tuple(w.shape):
                raise DsPruneError(f"{args.scores}: DAI for {n!r} has shape {tuple(dai[n].shape)}, the weight "
                                   f"{tuple(w.shape)}: scores come from a different model")
        return {n: dai[n].float() for n in weights}
    from ..data import default_calibration, load_texts
    texts = load_texts(args.calib, args.n_calib, args.seed) if args.calib else default_calibration(args.n_calib,
                                                                                                   args.seed)
    return B.wanda_scores(enc, weights, texts, args.calib_batch_size, args.max_length)


def _plot(path, per_layer: dict[int, float], ylabel: str, title: str) -> None:
    from ..report.figure import pyplot, save_png

    plt = pyplot()

    fig, ax = plt.subplots(figsize=(7, 3))
    layers = sorted(per_layer)
    ax.bar(layers, [per_layer[l] for l in layers], color="#4477aa")
    ax.set_xlabel("layer (original numbering)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    fig.tight_layout()
    save_png(fig, path, dpi=120)


def run(args: Args) -> int:
    from ..encoder import Encoder
    from ..importance import budget
    from ..surgery.mask import layer_of, mlp_weight_names, target_weights

    if not 0.0 <= args.sparsity < 1.0:
        raise DsPruneError(f"--sparsity must be in [0, 1), not {args.sparsity}")
    if args.structured and args.attention:
        raise DsPruneError("--structured removes MLP neurons; --attention applies to unstructured masks only")
    if args.structured and args.scope == "row":
        raise DsPruneError("--scope row is for unstructured masks; use global or layer with --structured")
    if Path(args.out).exists() and not args.overwrite:  # fail before loading anything
        raise DsPruneError(f"output folder exists: {args.out} (pass --overwrite to replace it)")
    enc = Encoder.load(args.model, dtype=args.dtype, device=args.device)
    weights = target_weights(enc, attention=args.attention)
    scores = scores_for(args, enc, weights)
    meta = {"method": args.method, "sparsity": args.sparsity, "scope": args.scope, "model": args.model,
            "scores": args.scores}
    if args.structured:
        names = mlp_weight_names(enc)
        per_neuron = budget.neuron_scores(scores, names, args.neuron_agg)
        keep = budget.keep_top_neurons(per_neuron, args.sparsity, args.scope)
        tensors = {formats.mlp_key(l): k for l, k in keep.items()}
        kind = "structured"
        meta["neuron_agg"] = args.neuron_agg
        per_layer = {l: 1 - float(k.float().mean()) for l, k in keep.items()}
    else:
        tensors = budget.keep_top(scores, args.sparsity, args.scope)
        kind = "unstructured"
        pruned, total = {}, {}
        for n, m in tensors.items():
            l = layer_of(n)
            pruned[l] = pruned.get(l, 0) + int((~m).sum())
            total[l] = total.get(l, 0) + m.numel()
        per_layer = {l: pruned[l] / total[l] for l in total}
    kept = sum(int(t.sum()) for t in tensors.values())
    total_n = sum(t.numel() for t in tensors.values())
    with formats.output_dir(args.out, args.overwrite) as tmp:
        formats.write_mask(tmp, tensors, kind, ratio=args.sparsity, **meta)
        what = "neurons" if args.structured else "weights"
        _plot(tmp / PLOT, per_layer, f"fraction of {what} pruned",
              f"{args.method} {kind} mask, sparsity {args.sparsity:g} ({args.scope})")
        formats.write_manifest(tmp, "prune", {"model": args.model, "scores": args.scores},
                               {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")},
                               figures={"kept": kept, "total": total_n,
                                        "achieved_sparsity": 1 - kept / total_n,
                                        "pruned_per_layer": {str(l): v for l, v in sorted(per_layer.items())},
                                        "plot": PLOT})
    print(f"{args.method} {kind} mask: kept {kept}/{total_n} {('neurons' if args.structured else 'weights')} "
          f"(sparsity {1 - kept / total_n:.4f}) -> {args.out}")
    return 0
