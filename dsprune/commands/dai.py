"""``dsprune dai``: GAPrune parameter analysis (per-sample Fisher, mean gradients, alignment) and DAI scores.

Runs in one process by default; ``launchers/dai.py`` runs the same command under ``deepspeed`` with a
ZeRO-3 config (``--deepspeed ds_configs/dai_zero3.json``) so the statistics are sharded across ranks. The
pipeline is ``importance.gaprune.analyse``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Optional

from .common import ModelArgs, check_model


@dataclass
class Args(ModelArgs):
    general: list[str] = field(metadata={"help": "general triplets: JSONL files or BEIR folders DIR[:split]"})
    domain: list[str] = field(metadata={"help": "domain triplets: JSONL files or BEIR folders DIR[:split]"})
    out: str = field(metadata={"help": "output folder"})
    alpha: float = field(default=0.2, metadata={"help": "dai.alpha: weight of the alignment modulation"})
    beta: float = field(default=1.0, metadata={"help": "dai.beta: penalty on general Fisher"})
    gamma: float = field(default=0.5, metadata={"help": "dai.gamma: weight of sqrt|theta|"})
    alignment: str = field(default="consistency", metadata={
        "help": "consistency (this project's) | eq4 (the paper's Eq. 4 per weight; 'sign' is its older name) | "
                "tensor (per-matrix cosine) | reference (the authors' code: element-wise, 3x3-smoothed)"})
    variant: str = field(default="paper", metadata={"help": "paper (Eq. 5) | reference (the authors' code: "
                                                            "softplus, clamped, z-scored per matrix)"})
    eps: float = 1e-8
    fisher_scale: str = field(default="1", metadata={"help": "multiply both Fisher terms by this (1 = paper), "
                                                             "or 'balanced': mean |Fisher term| = mean γ√|θ|"})
    temperature: float = field(default=0.02, metadata={"help": "InfoNCE temperature (the authors' code: 0.05, "
                                                                "cosine x 20)"})
    fisher_batch: int = field(default=1, metadata={"help": "triplets per backward for the Fisher: 1 = per "
                                                           "sample (Eq. 3); more = in-batch negatives (the "
                                                           "authors' code: 4)"})
    grad_batch: int = field(default=0, metadata={"help": "triplets per backward for the mean gradients, in a "
                                                         "second pass (0 = the Fisher's; the authors' code: 2)"})
    attention: bool = field(default=False, metadata={"help": "score attention projections too (MLP always)"})
    max_triplets: int = field(default=0, metadata={"help": "use at most this many triplets per dataset "
                                                           "(0 = all; run `dsprune sample` for k-means)"})
    seed: int = 0
    max_length: Optional[int] = field(default=None, metadata={"help": "override the encoder's max_length"})
    deepspeed: Optional[str] = field(default=None, metadata={"help": "DeepSpeed ZeRO-3 config (JSON); "
                                                                     "use with launchers/dai.py"})
    dist_backend: Optional[str] = field(default=None, metadata={"help": "torch.distributed backend "
                                                                        "(default: the accelerator's)"})
    overwrite: bool = False


SHOWN = ("n_general", "n_domain", "loss_general", "loss_domain", "mean_abs_fisher_term_over_magnitude_term",
         "peak_rss_over_model_fp32", "peak_rss_above_libraries_over_model_fp32")


def run(args: Args) -> int:
    from ..errors import DsPruneError
    from ..importance import gaprune
    from ..importance.dai import DaiParams
    from ..memory import hold_mmap_threshold

    check_model(args)
    if args.fisher_batch < 1 or args.grad_batch < 0:
        raise DsPruneError(f"--fisher_batch must be >= 1 and --grad_batch >= 0, not {args.fisher_batch} and "
                           f"{args.grad_batch}")
    if args.deepspeed and args.alignment == "reference":
        raise DsPruneError("--alignment reference smooths over whole matrices, which ZeRO-3 shards: run without "
                           "--deepspeed, or save the statistics and recompute (`dsprune prune --dai_recompute "
                           "--dai_alignment reference`)")
    params = DaiParams(args.alpha, args.beta, args.gamma, args.alignment, args.variant, args.fisher_scale,
                       args.eps).check()
    hold_mmap_threshold()  # per-sample gradients free large blocks all the time (dsprune.memory)
    config = {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")}
    done = gaprune.analyse(args, params, config)
    if done is not None:                                    # rank 0
        figures, weights = done
        print(json.dumps({k: figures[k] for k in SHOWN}, indent=1))
        print(f"DAI scores for {len(weights)} weights -> {args.out}")
    return 0
