"""`dsprune mask`: turn self-slimming gates into a structured neuron mask (EffiR §5.1).

Ranks ReLU(z) of every kept MLP globally, removes the lowest ``round(r·N)`` neurons (set to 0) and keeps
the rest (set to 1, as the paper does; ``--keep_gate_values`` stores the survivors' ReLU(z) beside the mask
so that applying it folds them into the weights). Writes the shared mask format, a per-layer width plot
(EffiR Figure 2b, with a few reference ratios from the same gates) and a manifest. With ``--model`` the
mask is also applied to that model through the shared path to check it fits and count parameters.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..importance import methods, slim
from .common import ModelArgs, check_model


@dataclass
class Args:
    gates: str = field(metadata={"help": "gates.safetensors or the slimming run folder holding it"})
    ratio: float | None = field(default=None, metadata={"help": "fraction of all kept MLP neurons to remove, in [0, 1)"})
    plan: str | None = field(default=None, metadata={"help": "take the ratio from `dsprune plan`'s plan.json"})
    out: str = field(default="out/mask", metadata={"help": "mask folder"})
    overwrite: bool = False
    min_per_layer: int = field(default=0, metadata={
        "help": "keep at least this many neurons (the layer's strongest gates) in every MLP; 0 = refuse a "
                "mask that empties a layer"})
    keep_gate_values: bool = field(default=False, metadata={
        "help": "store the survivors' ReLU(z) so applying the mask folds them into the weights (default: "
                "survivors at 1, as the paper)"})
    model: str | None = field(default=None, metadata={
        "help": "optional model the gates were trained on: apply the mask to it to check and count params"})
    plot_ratios: list[float] = field(default_factory=lambda: [0.1, 0.3, 0.5], metadata={
        "help": "extra overall ratios drawn in the width plot for comparison"})


def run(args: Args) -> int:
    import torch

    from ..report.widths import plot_widths
    from ..surgery.gates import load_gates

    if (args.ratio is None) == (args.plan is None):
        raise DsPruneError("give exactly one of --ratio and --plan")
    if args.plan:
        from ..importance.plan import read_plan
        args.ratio = float(read_plan(args.plan)["slim_ratio"])
    slim.check_ratio(args.ratio)
    formats.check_output(args.out, args.overwrite)
    if args.model:
        check_model(ModelArgs(model=args.model))
    values, meta = load_gates(args.gates)
    importance = methods.get("gates", "neuron")(values)
    keep = slim.global_mask(importance, args.ratio, args.min_per_layer)
    widths = {i: int(m.sum()) for i, m in keep.items()}
    full = {i: int(m.numel()) for i, m in keep.items()}
    total, kept = sum(full.values()), sum(widths.values())
    num_layers = int(meta.get("num_layers", max(values) + 1))
    stats = slim.gate_stats(values, 0.5)

    params = None
    if args.model:
        params = _params_after(args.model, keep, values if args.keep_gate_values else None)

    extra_widths = {}
    for r in args.plot_ratios:
        if abs(r - args.ratio) < 1e-12:
            continue
        try:
            m = slim.global_mask(importance, r, args.min_per_layer)
        except DsPruneError:  # a reference ratio that empties a layer is simply not drawn
            continue
        extra_widths[float(r)] = {i: int(v.sum()) for i, v in m.items()}

    figures = {"removed": total - kept, "total": total, "kept": kept, "ratio_exact": (total - kept) / total,
               "widths": {str(i): w for i, w in widths.items()}, "gates": stats}
    if params:
        figures["params"] = params
    with formats.output_dir(args.out, args.overwrite) as tmp:
        formats.write_mask(tmp, slim.as_mask_tensors(keep), kind="structured", method="slim", ratio=args.ratio,
                           min_per_layer=args.min_per_layer, gates=str(args.gates), ties=slim.TIES,
                           survivors="gate values" if args.keep_gate_values else "1",
                           widths={str(i): w for i, w in widths.items()}, num_layers=num_layers)
        if args.keep_gate_values:
            formats.write_mask_scale(tmp, {formats.mlp_key(i): torch.relu(v.float()) for i, v in values.items()})
        plot_widths({**extra_widths, float(args.ratio): widths}, full, num_layers, tmp / "widths.png",
                    chosen=float(args.ratio),
                    title=f"self-slimming: -{args.ratio:.0%} of {total} MLP neurons ({Path(args.gates).name})")
        formats.write_manifest(tmp, "mask", {"gates": str(args.gates), "model": args.model}, asdict(args),
                               figures, files={"mask": formats.MASK, "plot": "widths.png"})
    print(f"removed {total - kept} of {total} MLP neurons ({(total - kept) / total:.2%}); "
          f"widths per layer: " + ", ".join(f"{i}:{w}" for i, w in widths.items()))
    if params:
        print(f"parameters {params['before']:,} -> {params['after']:,} ({params['ratio']:.3f}x)")
    print(f"mask: {args.out}")
    return 0


def _params_after(model: str, keep: dict, scale) -> dict:
    import torch

    from ..encoder import Encoder
    from ..surgery.mask import apply_mask
    from ..surgery.prune import count_params, intermediate_sizes

    enc = Encoder.load(model)
    sizes = intermediate_sizes(enc)
    for i, m in keep.items():
        if i >= len(sizes) or sizes[i] != m.numel():
            have = sizes[i] if i < len(sizes) else "no layer"
            raise DsPruneError(f"gates do not fit {model}: MLP layer {i} has {m.numel()} gates, model has {have}")
    gated = [i for i, s in enumerate(sizes) if s is not None]
    if sorted(keep) != gated:
        raise DsPruneError(f"gates do not fit {model}: gated MLP layers {sorted(keep)}, model has {gated}")
    before = count_params(enc.model)
    tensors = slim.as_mask_tensors(keep)
    sc = None if scale is None else {formats.mlp_key(i): torch.relu(v.float()) for i, v in scale.items()}
    apply_mask(enc, tensors, "structured", where="dsprune mask", scale=sc)
    after = count_params(enc.model)
    return {"before": before, "after": after, "ratio": round(after / before, 4)}
