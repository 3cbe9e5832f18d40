"""GAPrune's parameter analysis end to end: triplets -> per-sample Fisher and mean gradients -> DAI, on disk.

One process runs it with ``LocalRunner``; under ``deepspeed`` (``launchers/dai.py``) ``ZeroRunner`` shards the
parameters and the statistics across ranks, every rank runs the same code and rank 0 writes. The output is
one safetensors file per statistic (keys = backbone-relative weight names, ``dai.STAT_FILES``) and a manifest
whose figures include the peak memory per rank as multiples of the model's fp32 size, the quantity the
runners' memory budget (``importance.fisher``) is about.
"""
from __future__ import annotations

import contextlib
import random

from .. import formats
from . import dai as D

# The options of ``dsprune dai`` that reproduce the authors' released code rather than the paper's text: Fisher
# from batches of 4 triplets with in-batch negatives, mean gradients from batches of 2, cosine logits scaled by
# 20 (τ = 0.05), the element-wise smoothed alignment and its softplus / per-matrix z-score scoring. Not
# reproduced: it pairs general and domain batches and stops at the shorter set, and works in bf16 / float16.
REFERENCE = {"fisher_batch": 4, "grad_batch": 2, "temperature": 0.05, "alignment": "reference",
             "variant": "reference"}


def subset(triplets: list, n: int, seed: int) -> list:
    """At most ``n`` triplets (0 = all), drawn seeded and kept in their order."""
    if n and n < len(triplets):
        idx = sorted(random.Random(seed).sample(range(len(triplets)), n))
        return [triplets[i] for i in idx]
    return triplets


def summary(tensors) -> dict:
    """mean/min/max and sign fractions of a statistic, streamed tensor by tensor (no full-size copy)."""
    total, n, lo, hi, neg, pos = 0.0, 0, float("inf"), float("-inf"), 0, 0
    for t in tensors:
        total += float(t.double().sum())
        n += t.numel()
        lo, hi = min(lo, float(t.min())), max(hi, float(t.max()))
        neg += int((t < 0).sum())
        pos += int((t > 0).sum())
    return {"mean": total / n, "min": lo, "max": hi, "negative_fraction": neg / n, "positive_fraction": pos / n}


def statistics(runner, triplets: list, args, what: str):
    """F and ḡ of one dataset: from the same backward passes, or ḡ from a second pass with other batches when
    ``--grad_batch`` differs from ``--fisher_batch`` (the reference code runs its two estimates apart)."""
    from .fisher import accumulate

    kind = "per-sample gradients" if args.fisher_batch == 1 else f"gradients of {args.fisher_batch}-triplet batches"
    stats = accumulate(runner, triplets, args.temperature, f"{what}: {kind}", args.fisher_batch)
    if args.grad_batch and args.grad_batch != args.fisher_batch:
        stats.grad = accumulate(runner, triplets, args.temperature,
                                f"{what}: mean gradient, batches of {args.grad_batch}", args.grad_batch).grad
    return stats


def analyse(args, params: D.DaiParams, config: dict) -> tuple[dict, list[str]] | None:
    """Run the analysis with the options of ``dsprune dai`` (``args``) and write ``args.out``; ``config`` is
    recorded in the manifest. Returns the manifest's figures and the scored weights' names on rank 0, None on
    the other ranks. The caller, an entry point, holds the allocator's mmap threshold
    (``memory.hold_mmap_threshold``): per-sample gradients free large blocks all the time."""
    import torch
    from safetensors.torch import save_file

    from ..encoder import Encoder
    from ..memory import current_rss_bytes, peak_rss_bytes
    from ..surgery.mask import target_weights
    from ..surgery.prune import count_params
    from .fisher import LocalRunner, ZeroRunner
    from .triplets import load_triplets

    formats.check_output(args.out, args.overwrite)
    # Data first: bad triplet files fail before any model is loaded.
    gen = subset(load_triplets(args.general, args.seed), args.max_triplets, args.seed)
    dom = subset(load_triplets(args.domain, args.seed), args.max_triplets, args.seed)
    rss_before = current_rss_bytes()
    ds_config = formats.read_json(args.deepspeed, "DeepSpeed config") if args.deepspeed else None

    enc = Encoder.load(args.model, dtype=args.dtype, device=args.device)
    if args.max_length:
        enc.config.max_length = args.max_length
    model_fp32_bytes = 4 * count_params(enc.model)
    weights = target_weights(enc, attention=args.attention)
    wanted = {id(p) for p in weights.values()}
    for p in enc.parameters():
        p.requires_grad_(id(p) in wanted)
    enc.eval()  # no dropout: per-sample gradients are deterministic and identical across ranks
    torch.manual_seed(args.seed)
    runner = (ZeroRunner(enc, weights, ds_config, args.dist_backend) if ds_config is not None
              else LocalRunner(enc, weights, args.device))

    phases = {"model_ready": (current_rss_bytes(), peak_rss_bytes())}
    s_gen, s_dom = (statistics(runner, data, args, what) for data, what in ((gen, "general"), (dom, "domain")))
    phases["accumulated"] = (current_rss_bytes(), peak_rss_bytes())
    shapes = {n: tuple(getattr(p, "ds_shape", None) or p.shape) for n, p in weights.items()}
    res = D.compute(weights, s_gen.fisher, s_dom.fisher, s_gen.grad, s_dom.grad, runner.local_theta, params,
                    runner.allreduce, shapes)
    phases["dai_computed"] = (current_rss_bytes(), peak_rss_bytes())

    # Gather one statistic at a time (rank 0 holds at most one full statistic) and write it.
    stats = {"fisher_gen": s_gen.fisher, "fisher_dom": s_dom.fisher, "grad_gen": s_gen.grad,
             "grad_dom": s_dom.grad, "alignment": res.alignment, "dai": res.dai}
    figures: dict = {}
    ctx = formats.output_dir(args.out, args.overwrite) if runner.is_main else contextlib.nullcontext(None)
    with ctx as tmp:
        for stat, local in stats.items():
            full = {n: runner.gather(n, local[n]).contiguous() for n in weights}
            if runner.is_main:
                save_file(full, str(tmp / D.STAT_FILES[stat]))
                figures[stat] = summary(full.values())
            del full
        rss = runner.gather_objects((peak_rss_bytes(), rss_before))
        phase_rss = runner.gather_objects({k: {"rss_over_model_fp32": round((c - rss_before) / model_fp32_bytes, 3),
                                               "peak_so_far_over_model_fp32": round((pk - rss_before) / model_fp32_bytes, 3)}
                                           for k, (c, pk) in phases.items()})
        if runner.is_main:
            figures.update({
                "n_general": s_gen.n, "n_domain": s_dom.n,
                "loss_general": s_gen.loss, "loss_domain": s_dom.loss,
                "mean_abs_fisher_term_over_magnitude_term": res.fisher_ratio,
                "fisher_scale_applied": res.fisher_scale,
                "scored_weights": int(sum(p.numel() if not hasattr(p, "ds_numel") else p.ds_numel
                                          for p in weights.values())),
                "model_fp32_bytes": model_fp32_bytes,
                "world_size": runner.world_size,
                "peak_rss_bytes_per_rank": [r for r, _ in rss],
                "rss_before_model_bytes_per_rank": [b for _, b in rss],
                "peak_rss_over_model_fp32": [round(r / model_fp32_bytes, 3) for r, _ in rss],
                "peak_rss_above_libraries_over_model_fp32": [round((r - b) / model_fp32_bytes, 3) for r, b in rss],
                "rss_phases_above_libraries_per_rank": phase_rss,
            })
            formats.write_manifest(tmp, "dai", {"model": args.model, "general": list(args.general),
                                                "domain": list(args.domain), "deepspeed": args.deepspeed},
                                   config, figures, weights=list(weights), files=dict(D.STAT_FILES))
    runner.barrier()
    return (figures, list(weights)) if runner.is_main else None
