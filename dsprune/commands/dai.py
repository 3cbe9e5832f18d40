"""``dsprune dai``: GAPrune parameter analysis (per-sample Fisher, mean gradients, alignment) and DAI scores.

Runs in one process by default; ``launchers/dai.py`` runs the same function under ``deepspeed`` with a
ZeRO-3 config (``--deepspeed ds_configs/dai_zero3.json``) so the statistics are sharded across ranks.
Writes one safetensors file per statistic (keys = backbone-relative weight names) and a manifest.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .. import formats
from ..errors import DsPruneError


@dataclass
class Args:
    model: str = field(metadata={"help": "the model to analyse (HF / sentence-transformers / dsprune export / .gguf)"})
    general: list[str] = field(metadata={"help": "general triplets: JSONL files or BEIR folders DIR[:split]"})
    domain: list[str] = field(metadata={"help": "domain triplets: JSONL files or BEIR folders DIR[:split]"})
    out: str = field(metadata={"help": "output folder"})
    alpha: float = field(default=0.2, metadata={"help": "dai.alpha: weight of the alignment modulation"})
    beta: float = field(default=1.0, metadata={"help": "dai.beta: penalty on general Fisher"})
    gamma: float = field(default=0.5, metadata={"help": "dai.gamma: weight of sqrt|theta|"})
    alignment: str = field(default="consistency", metadata={"help": "consistency | sign (paper-literal) | tensor"})
    variant: str = field(default="paper", metadata={"help": "paper (Eq. 5) | reference (softplus, clamped)"})
    eps: float = 1e-8
    fisher_scale: str = field(default="1", metadata={"help": "multiply both Fisher terms by this (1 = paper), "
                                                             "or 'balanced': mean |Fisher term| = mean γ√|θ|"})
    temperature: float = field(default=0.02, metadata={"help": "InfoNCE temperature"})
    attention: bool = field(default=False, metadata={"help": "score attention projections too (MLP always)"})
    max_triplets: int = field(default=0, metadata={"help": "use at most this many triplets per dataset "
                                                           "(0 = all; run `dsprune sample` for k-means)"})
    seed: int = 0
    max_length: Optional[int] = field(default=None, metadata={"help": "override the encoder's max_length"})
    dtype: str = "float32"
    device: str = "cpu"
    deepspeed: Optional[str] = field(default=None, metadata={"help": "DeepSpeed ZeRO-3 config (JSON); "
                                                                     "use with launchers/dai.py"})
    dist_backend: Optional[str] = field(default=None, metadata={"help": "torch.distributed backend "
                                                                        "(default: the accelerator's)"})
    overwrite: bool = False


def _subset(triplets: list, n: int, seed: int) -> list:
    if n and n < len(triplets):
        import random
        idx = sorted(random.Random(seed).sample(range(len(triplets)), n))
        return [triplets[i] for i in idx]
    return triplets


def _summary(tensors) -> dict:
    """mean/min/max and sign fractions of a statistic, streamed tensor by tensor (no full-size copy)."""
    total, n, lo, hi, neg, pos = 0.0, 0, float("inf"), float("-inf"), 0, 0
    for t in tensors:
        total += float(t.double().sum())
        n += t.numel()
        lo, hi = min(lo, float(t.min())), max(hi, float(t.max()))
        neg += int((t < 0).sum())
        pos += int((t > 0).sum())
    return {"mean": total / n, "min": lo, "max": hi, "negative_fraction": neg / n, "positive_fraction": pos / n}


def run(args: Args) -> int:
    import torch
    from safetensors.torch import save_file

    from ..encoder import Encoder
    from ..importance import dai as D
    from ..importance.fisher import LocalRunner, ZeroRunner, accumulate
    from ..importance.triplets import load_triplets
    from ..memory import current_rss_bytes, hold_mmap_threshold, peak_rss_bytes
    from ..surgery.mask import target_weights
    from ..surgery.prune import count_params

    if args.alignment not in D.ALIGNMENTS:
        raise DsPruneError(f"--alignment must be one of {', '.join(D.ALIGNMENTS)}, not {args.alignment!r}")
    if args.variant not in D.VARIANTS:
        raise DsPruneError(f"--variant must be one of {', '.join(D.VARIANTS)}, not {args.variant!r}")
    if args.fisher_scale != "balanced":
        try:
            float(args.fisher_scale)
        except ValueError:
            raise DsPruneError(f"--fisher_scale must be a number or 'balanced', not {args.fisher_scale!r}") from None
    if Path(args.out).exists() and not args.overwrite:
        raise DsPruneError(f"output folder exists: {args.out} (pass --overwrite to replace it)")
    # Data first: bad triplet files fail before any model is loaded.
    gen = _subset(load_triplets(args.general, args.seed), args.max_triplets, args.seed)
    dom = _subset(load_triplets(args.domain, args.seed), args.max_triplets, args.seed)
    hold_mmap_threshold()  # per-sample gradients free large blocks all the time (dsprune.memory)
    rss_before = current_rss_bytes()
    ds_config = None
    if args.deepspeed:
        ds_config = formats.read_json(args.deepspeed, "DeepSpeed config")

    enc = Encoder.load(args.model, dtype=args.dtype, device=args.device)
    if args.max_length:
        enc.config.max_length = args.max_length
    model_fp32_bytes = 4 * count_params(enc.model)
    params = target_weights(enc, attention=args.attention)
    wanted = {id(p) for p in params.values()}
    for p in enc.parameters():
        p.requires_grad_(id(p) in wanted)
    enc.eval()  # no dropout: per-sample gradients are deterministic and identical across ranks
    torch.manual_seed(args.seed)
    runner = (ZeroRunner(enc, params, ds_config, args.dist_backend) if ds_config is not None
              else LocalRunner(enc, params, args.device))

    phases = {"model_ready": (current_rss_bytes(), peak_rss_bytes())}
    s_gen = accumulate(runner, gen, args.temperature, "general: per-sample gradients")
    s_dom = accumulate(runner, dom, args.temperature, "domain: per-sample gradients")
    phases["accumulated"] = (current_rss_bytes(), peak_rss_bytes())
    # How much of DAI the Fisher term carries against the magnitude term: on real models F is tiny and
    # Eq. 5 is then magnitude modulated by alignment. --fisher_scale balanced rescales F (both datasets by
    # one constant) so the two terms have equal mean size; the default 1 is the paper.
    sums = torch.zeros(2, dtype=torch.float64)
    for n in params:
        th = runner.local_theta(n).abs()
        sums[0] += ((s_dom.fisher[n] - args.beta * s_gen.fisher[n]) * th).abs().double().sum()
        sums[1] += (args.gamma * th.sqrt()).double().sum()
    sums = runner.allreduce(sums)
    ratio = float(sums[0] / sums[1]) if sums[1] > 0 else None
    scale = (1.0 / ratio if ratio else 1.0) if args.fisher_scale == "balanced" else float(args.fisher_scale)
    align, dai = {}, {}
    for n in params:
        align[n] = D.alignment(s_gen.grad[n], s_dom.grad[n], s_gen.fisher[n], s_dom.fisher[n],
                               args.alignment, args.eps, runner.allreduce)
        dai[n] = D.dai_score(scale * s_dom.fisher[n], scale * s_gen.fisher[n], runner.local_theta(n), align[n],
                             args.alpha, args.beta, args.gamma, args.variant)

    phases["dai_computed"] = (current_rss_bytes(), peak_rss_bytes())
    # Gather one statistic at a time (rank 0 holds at most one full statistic) and write it.
    stats = {"fisher_gen": s_gen.fisher, "fisher_dom": s_dom.fisher, "grad_gen": s_gen.grad,
             "grad_dom": s_dom.grad, "alignment": align, "dai": dai}
    figures: dict = {}
    import contextlib
    ctx = formats.output_dir(args.out, args.overwrite) if runner.is_main else contextlib.nullcontext(None)
    with ctx as tmp:
        for stat, local in stats.items():
            full = {n: runner.gather(n, local[n]).contiguous() for n in params}
            if runner.is_main:
                save_file(full, str(tmp / D.STAT_FILES[stat]))
                figures[stat] = _summary(full.values())
            del full
        rss = runner.gather_objects((peak_rss_bytes(), rss_before))
        phase_rss = runner.gather_objects({k: {"rss_over_model_fp32": round((c - rss_before) / model_fp32_bytes, 3),
                                               "peak_so_far_over_model_fp32": round((pk - rss_before) / model_fp32_bytes, 3)}
                                           for k, (c, pk) in phases.items()})
        if runner.is_main:
            figures.update({
                "n_general": s_gen.n, "n_domain": s_dom.n,
                "loss_general": s_gen.loss, "loss_domain": s_dom.loss,
                "mean_abs_fisher_term_over_magnitude_term": ratio,
                "fisher_scale_applied": scale,
                "scored_weights": int(sum(p.numel() if not hasattr(p, "ds_numel") else p.ds_numel
                                          for p in params.values())),
                "model_fp32_bytes": model_fp32_bytes,
                "world_size": runner.world_size,
                "peak_rss_bytes_per_rank": [r for r, _ in rss],
                "rss_before_model_bytes_per_rank": [b for _, b in rss],
                "peak_rss_over_model_fp32": [round(r / model_fp32_bytes, 3) for r, _ in rss],
                "peak_rss_above_libraries_over_model_fp32": [round((r - b) / model_fp32_bytes, 3) for r, b in rss],
                "rss_phases_above_libraries_per_rank": phase_rss,
            })
            config = {k: v for k, v in vars(args).items() if k not in ("out", "overwrite")}
            formats.write_manifest(tmp, "dai", {"model": args.model, "general": list(args.general),
                                                "domain": list(args.domain), "deepspeed": args.deepspeed},
                                   config, figures, weights=list(params),
                                   files=dict(D.STAT_FILES))
    runner.barrier()
    if runner.is_main:
        print(json.dumps({k: figures[k] for k in ("n_general", "n_domain", "loss_general", "loss_domain",
                                                  "mean_abs_fisher_term_over_magnitude_term",
                                                  "peak_rss_over_model_fp32",
                                                  "peak_rss_above_libraries_over_model_fp32")}, indent=1))
        print(f"DAI scores for {len(params)} weights -> {args.out}")
    return 0
