"""Stages built on the training loop through its ``Hooks``: self-slimming and masked retraining.

``launchers/train.py --mode slim`` (EffiR §5.1): gates ``z`` (init 1) go into every kept MLP before
DeepSpeed wraps the model; the loss is InfoNCE (+ KL if configured) + λ·mean σ(β|z|); the gates form their
own parameter group (own learning rate, no weight decay) and train alone (``slim_train=gates``), with
LoRA (``gates+lora``) or with every weight (``full``), under any ZeRO stage. After each step the gates
are gathered (ZeRO-3 partitions them like any parameter) and their spread goes to the log and
TensorBoard (penalty, fraction under ``slim_threshold``, histogram); ``gates.safetensors`` in the run
folder always holds the latest values for ``dsprune mask``. The exported model is the trained one with
the gates removed (every survivor at 1, as the paper retrains it).

``--mask DIR`` (any mode): train with a mask from ``dsprune mask`` / ``dsprune prune`` held, through the
shared ``surgery.mask`` path. A structured mask removes its neurons before training — the masked model
and the sliced one are the same function and the removed neurons can get no gradient — so the export
comes out physically smaller with per-layer ``intermediate_sizes``. An unstructured mask is applied,
re-applied after every optimizer step (ZeRO master copies included), masks LoRA deltas in the forward
pass, and is applied once more after the LoRA merge at export.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import formats
from ..errors import DsPruneError
from ..importance import slim as slim_rank
from ..surgery import gates as gates_mod
from .arguments import TrainArgs
from .distill import DistillArgs, check_distill, distill_hooks
from .loop import Hooks
from .runlog import TENSORBOARD

MODES = ("train", "slim", "distill")
SLIM_TRAIN = ("gates", "gates+lora", "full")


@dataclass
class StageArgs(DistillArgs, TrainArgs):
    """``TrainArgs`` plus the stage: plain training, self-slimming or self-distillation (``distill``), and an
    optional held mask."""

    mode: str = field(default="train", metadata={
        "help": "train | slim (EffiR self-slimming: train MLP gates) | distill (from the unpruned teacher's "
                "embeddings of --distill_data)"})
    mask: str | None = field(default=None, metadata={
        "help": "mask folder (dsprune mask / prune) held during training: structured = neurons removed "
                "first, unstructured = zeros re-applied after every step"})
    slim_train: str = field(default="gates", metadata={
        "help": "slim mode: what trains besides the gates: gates (nothing) | gates+lora | full. Decides "
                "--lora in slim mode"})
    slim_lambda: float = field(default=slim_rank.LAMBDA, metadata={
        "help": "weight of the σ(β|z|) penalty (mean over gates by default; the paper's 1e-8 is for a sum)"})
    slim_beta: float = field(default=slim_rank.BETA, metadata={"help": "sharpness β of the sigmoid surrogate"})
    slim_normalise: str = field(default="mean", metadata={"help": "penalty over gates: mean | sum (paper)"})
    slim_lr: float = field(default=0.01, metadata={"help": "learning rate of the gates (their own group)"})
    slim_threshold: float = field(default=0.5, metadata={"help": "log the fraction of ReLU(z) below this"})
    slim_histogram_steps: int = field(default=10, metadata={"help": "gate histogram to TensorBoard every N steps"})


def check_stage(args: StageArgs) -> None:
    """Stage options, checked before any process group exists. In slim mode sets ``lora`` from
    ``slim_train`` (and says so when that changes it)."""
    if args.mode not in MODES:
        raise DsPruneError(f"mode must be one of {', '.join(MODES)}, not {args.mode!r}")
    if args.mask is not None:
        folder = Path(args.mask)
        if not (folder / formats.MASK).is_file():
            raise DsPruneError(f"mask: {folder / formats.MASK} not found")
    check_distill(args)
    if args.mode != "slim":
        return
    if args.slim_train not in SLIM_TRAIN:
        raise DsPruneError(f"slim_train must be one of {', '.join(SLIM_TRAIN)}, not {args.slim_train!r}")
    if args.slim_lambda < 0:
        raise DsPruneError(f"slim_lambda must be >= 0, not {args.slim_lambda}")
    if args.slim_beta <= 0:
        raise DsPruneError(f"slim_beta must be positive, not {args.slim_beta}")
    if args.slim_normalise not in ("mean", "sum"):
        raise DsPruneError(f"slim_normalise must be mean or sum, not {args.slim_normalise!r}")
    if args.slim_lr <= 0:
        raise DsPruneError(f"slim_lr must be positive, not {args.slim_lr}")
    if args.slim_histogram_steps < 1:
        raise DsPruneError("slim_histogram_steps must be at least 1")
    lora = args.slim_train == "gates+lora"
    if args.lora != lora:
        print(f"slim_train={args.slim_train}: setting lora={str(lora).lower()}")
        args.lora = lora


def stage_hooks(args: StageArgs) -> Hooks:
    """The ``Hooks`` that make ``loop.train`` run the stage ``args`` asks for."""
    check_stage(args)
    if args.mode == "distill":
        return distill_hooks(args, stage_hooks(_as_train(args)))
    if args.mode == "train" and args.mask is None:
        return Hooks()
    state: dict = {}
    extra: dict = {}
    mask_tensors = mask_meta = None
    export_extra: dict = {}
    if args.mask is not None:
        mask_tensors, mask_meta = formats.read_mask(args.mask)
        extra["mask"] = {"folder": str(args.mask), **{k: v for k, v in mask_meta.items() if k != "widths"}}
        from ..surgery.mask import manifest_entry, mask_counts
        export_extra = {"mask": manifest_entry(mask_meta.get("kind"), *mask_counts(mask_tensors), mask_meta)}
    slim = args.mode == "slim"
    if slim:
        extra["slim"] = {"lambda": args.slim_lambda, "beta": args.slim_beta, "normalise": args.slim_normalise,
                         "lr": args.slim_lr, "train": args.slim_train, "threshold": args.slim_threshold}

    def prepare_model(enc) -> None:
        if args.mask is not None:
            from ..surgery.mask import apply_mask_dir
            apply_mask_dir(enc, args.mask)
        if slim:
            gates_mod.insert_gates(enc)

    def param_groups(enc) -> list[dict]:
        groups = []
        if slim:
            zs = gates_mod.gate_parameters(enc)
            if args.slim_train == "gates":
                for p in enc.parameters():
                    p.requires_grad_(False)
            for z in zs:  # PEFT froze them with the base model
                z.requires_grad_(True)
            groups.append({"params": zs, "lr": args.slim_lr, "weight_decay": 0.0, "name": "gates"})
            extra["slim"]["gates"] = int(sum(z.numel() for z in zs))
            extra["slim"]["trainable_params"] = int(sum(p.numel() for p in enc.parameters() if p.requires_grad))
        if mask_meta is not None and mask_meta.get("kind") == "unstructured":
            from ..surgery.mask import MaskHolder
            holder = MaskHolder(enc, mask_tensors)
            if args.lora:
                holder.mask_lora()
            state["holder"] = holder
        return groups

    def extra_loss(model, step: int):
        pen = slim_rank.l0_surrogate(gates_mod.live_gates(model), args.slim_beta, args.slim_normalise)
        return args.slim_lambda * pen, {"slim_penalty": pen.detach()}

    def after_step(engine, step: int, row: dict) -> None:
        if "holder" in state:
            state["holder"].reapply()
        if slim:
            _log_gates(engine, step, row, args, state, extra)

    def before_export(enc) -> None:
        if mask_meta is not None and mask_meta.get("kind") == "unstructured":
            from ..surgery.mask import MaskHolder
            MaskHolder(enc, mask_tensors).reapply()  # after the LoRA merge
        if slim:
            values = gates_mod.remove_gates(enc, fold=False)
            _save_gates(Path(args.output_dir), values, enc)

    return Hooks(prepare_model=prepare_model, param_groups=param_groups,
                 extra_loss=extra_loss if slim else None,
                 after_step=after_step if (slim or args.mask is not None) else None,
                 before_export=before_export, stage="slim" if slim else ("retrain" if args.mask else "train"),
                 manifest_extra=extra, export_extra=export_extra)


def _as_train(args: StageArgs) -> StageArgs:
    import dataclasses
    return dataclasses.replace(args, mode="train", distill_data=[])


def _save_gates(out: Path, values: dict[int, torch.Tensor], enc) -> None:
    from ..surgery.prune import num_layers
    gates_mod.save_gates(out / gates_mod.GATES_FILE, values, num_layers(enc), enc.family)


def _log_gates(engine, step: int, row: dict, args: StageArgs, state: dict, extra: dict) -> None:
    """Gather the gates (a collective: every rank calls it); rank 0 logs, plots and saves them."""
    import torch.distributed as dist

    values = gates_mod.gate_values(engine.module)
    if dist.get_rank() != 0:
        return
    stats = slim_rank.gate_stats(values, args.slim_threshold)
    row["slim_frac_below"] = stats["frac_below"]
    row["slim_gate_mean"] = stats["mean"]
    row["slim_gate_std"] = stats["std"]
    out = Path(args.output_dir)
    enc = engine.module
    _save_gates(out, values, enc)
    extra["slim"]["final_gates"] = {"step": step, **stats}
    if step == 1 or step % args.slim_histogram_steps == 0:
        if "writer" not in state:
            from torch.utils.tensorboard import SummaryWriter
            state["writer"] = SummaryWriter(str(out / TENSORBOARD), filename_suffix=".gates")
        w = state["writer"]
        flat = torch.relu(torch.cat([v.flatten() for v in values.values()]))
        w.add_histogram("slim/gates_relu_z", flat, step)
        w.add_scalar("slim/frac_below_threshold", stats["frac_below"], step)
        w.flush()
        from ..report.widths import plot_gate_histogram
        plot_gate_histogram(values, out / "gates.png", args.slim_threshold,
                            title=f"self-slimming gates after {step} steps")
        extra.setdefault("figures_files", {})["gate_histogram"] = "gates.png"
