"""GAPrune's parameter analysis: diagonal Fisher from per-sample gradients, and mean gradients, in fp32.

For each triplet i the InfoNCE loss L_i (query against its positive and its negative, temperature τ) is
back-propagated alone, so its gradient g_i is exactly ∂L_i/∂θ. We accumulate, per scored weight,

    F = (1/N) Σ g_i²     (Eq. 3: the square of each sample's gradient, never of a batch mean)
    ḡ = (1/N) Σ g_i      (the mean gradient used by the alignment)

The authors' released code differs, and ``accumulate(batch_size=B)`` reproduces it: one backward per batch of
B triplets with in-batch negatives, F = Σ_b g_b² / N (batch gradients squared, divided by the triplet count)
and ḡ the mean of the batch gradients (``dsprune dai --fisher_batch/--grad_batch``).

All in fp32 whatever the model's dtype. Two runners read the gradients:

* ``LocalRunner`` — one process, plain autograd (tests, small models).
* ``ZeroRunner`` — DeepSpeed ZeRO-3 across ranks, so the parameters, the gradient partitions and the four
  accumulators are all sharded and a 7B model fits. ZeRO-3 reduce-scatters gradients at the end of every
  backward and *averages* them across ranks; were the ranks fed different triplets, each shard would hold
  (g_a + g_b)/2 and its square would not be a per-sample square. So **every rank processes the same
  triplet at the same micro-step**: the average of W identical gradients is that sample's gradient, and
  each rank squares its own shard (``deepspeed.utils.safe_get_local_grad``) before anything else mixes
  samples. The ranks split memory, not samples: wall time is that of one process. The engine is built with
  a torch SGD at lr 0 (ZeRO-3 only partitions gradients when it owns an optimizer) and ``engine.step()``
  after each sample resets the gradient partitions without moving a weight.

Peak memory per rank, with P = the model's fp32 bytes, t = the scored fraction of the parameters (MLP
matrices: 0.59 of SmolLM2-135M, ≈0.65 of a 7B decoder) and W ranks:
  * ``ZeroRunner``: parameters P/W, gradient partitions t·P/W, the optimizer's fp32 copy of the scored
    partitions t·P/W, four accumulators 4t·P/W, alignment and DAI 2t·P/W — (1 + 8t)·P/W — plus one
    gathered layer and one triplet's activations. Each rank also holds the whole model once while
    DeepSpeed partitions it at start-up (the model is loaded, not built under ``zero.Init``), and rank 0
    holds one gathered statistic (t·P) while writing it. For a 7B model on 8 ranks: ≈ 0.8·P per rank
    after start-up.
  * ``LocalRunner``: parameters P, gradients t·P, accumulators 4t·P, alignment and DAI 2t·P — (1 + 7t)·P,
    ≈ 5.1·P for SmolLM2's MLPs.
``dsprune dai`` records the measured peak RSS per rank beside P in its manifest, and the peak minus the
RSS before the model was loaded (the libraries' share) as a multiple of P.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from tqdm.auto import tqdm

from ..distributed import warn_stale_build_locks
from ..errors import DsPruneError
from ..losses import info_nce
from .triplets import Triplet


@dataclass
class GradStats:
    """Accumulated statistics of one dataset, local to this rank (flat 1-D fp32 per weight)."""

    fisher: dict[str, torch.Tensor]
    grad: dict[str, torch.Tensor]
    n: int = 0
    loss: float = 0.0
    losses: list[float] = field(default_factory=list)


class LocalRunner:
    """Single-process autograd; the 'local shard' of a weight is the whole flattened weight."""

    rank, world_size, is_main = 0, 1, True

    def __init__(self, enc, params: dict[str, nn.Parameter], device: str = "cpu"):
        self.enc, self.params, self.device = enc, params, torch.device(device)
        self.forward = enc

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def local_grad(self, name: str) -> torch.Tensor:
        g = self.params[name].grad
        if g is None:
            raise DsPruneError(f"weight {name!r} received no gradient: is it used by the forward pass?")
        return g.detach().float().flatten()

    def step(self) -> None:
        for p in self.params.values():
            p.grad = None

    def local_theta(self, name: str) -> torch.Tensor:
        return self.params[name].detach().float().flatten()

    def gather(self, name: str, local: torch.Tensor) -> torch.Tensor:
        return local.view(self.params[name].shape).cpu()

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        return t

    def gather_objects(self, obj) -> list:
        return [obj]

    def barrier(self) -> None:
        pass


class ZeroRunner(LocalRunner):
    """DeepSpeed ZeRO-3: every rank runs the same triplet; each reads and accumulates its own gradient shard."""

    def __init__(self, enc, params: dict[str, nn.Parameter], ds_config: dict, dist_backend: str | None = None):
        import deepspeed
        import torch.distributed as dist
        from deepspeed.accelerator import get_accelerator

        stage = ds_config.get("zero_optimization", {}).get("stage", 0)
        if stage != 3:
            raise DsPruneError(f"dai needs a ZeRO stage 3 DeepSpeed config (got stage {stage})")
        if "optimizer" in ds_config:
            raise DsPruneError("dai's DeepSpeed config must not contain an optimizer block (none is needed)")
        warn_stale_build_locks()
        deepspeed.init_distributed(dist_backend=dist_backend)
        cfg = dict(ds_config)
        cfg["train_micro_batch_size_per_gpu"] = 1
        cfg["gradient_accumulation_steps"] = 1
        cfg.pop("train_batch_size", None)
        cfg["zero_allow_untested_optimizer"] = True  # our SGD at lr 0 never moves a weight
        opt = torch.optim.SGD([p for p in params.values()], lr=0.0)
        engine, *_ = deepspeed.initialize(model=enc, optimizer=opt, config=cfg)
        engine.eval()
        self.engine, self.enc, self.params = engine, enc, params
        self.device = torch.device(get_accelerator().current_device_name())
        self.forward = engine
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_main = self.rank == 0
        self._dist = dist

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)

    def local_grad(self, name: str) -> torch.Tensor:
        from deepspeed.utils import safe_get_local_grad

        g = safe_get_local_grad(self.params[name])
        if g is None:
            raise DsPruneError(f"weight {name!r} received no gradient under ZeRO-3")
        return g.detach().float().flatten().clone()

    def step(self) -> None:
        self.engine.step()  # SGD at lr 0: resets the gradient partitions, weights unchanged

    def local_theta(self, name: str) -> torch.Tensor:
        return self.params[name].ds_tensor.detach().float().flatten().clone()

    def gather(self, name: str, local: torch.Tensor) -> torch.Tensor:
        p = self.params[name]
        parts = [torch.empty_like(local) for _ in range(self.world_size)]
        self._dist.all_gather(parts, local.contiguous())
        return torch.cat(parts)[:p.ds_numel].view(p.ds_shape).cpu()

    def allreduce(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        self._dist.all_reduce(t)
        return t

    def gather_objects(self, obj) -> list:
        out = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        self._dist.barrier()


def triplet_loss(runner: LocalRunner, triplets: list[Triplet], temperature: float) -> torch.Tensor:
    """InfoNCE of a batch of triplets: each query against every positive and negative of the batch, its own
    positive the target. One triplet is Eq. 3's per-sample loss (its query against its positive and its
    negative); more is the reference code's in-batch loss, whose Fisher squares batch gradients."""
    enc = runner.enc
    q = enc.tokenize([t.query for t in triplets], "query")
    p = enc.tokenize([x for t in triplets for x in (t.positive, t.negative)], "passage")
    dev = runner.device
    qe = runner.forward(q["input_ids"].to(dev), q["attention_mask"].to(dev))
    pe = runner.forward(p["input_ids"].to(dev), p["attention_mask"].to(dev))
    return info_nce(qe, pe, group_size=2, temperature=temperature, cross_rank=False)


def accumulate(runner: LocalRunner, triplets: list[Triplet], temperature: float = 0.02,
               desc: str = "per-sample gradients", batch_size: int = 1) -> GradStats:
    """One backward per ``batch_size`` consecutive triplets (the last batch may be smaller); returns this
    rank's shards of F = Σ_b g_b² / N over the N triplets (Eq. 3 when ``batch_size`` is 1; the reference code
    divides its squared batch gradients by the triplet count too) and ḡ = the mean of the batch gradients."""
    if not triplets:
        raise DsPruneError(f"{desc}: no triplets")
    if batch_size < 1:
        raise DsPruneError(f"{desc}: batch size must be at least 1, not {batch_size}")
    names = list(runner.params)
    stats = GradStats({}, {})
    batches = [triplets[i:i + batch_size] for i in range(0, len(triplets), batch_size)]
    bar = tqdm(batches, desc=desc, disable=not runner.is_main)
    for batch in bar:
        loss = triplet_loss(runner, batch, temperature)
        runner.backward(loss)
        for n in names:
            g = runner.local_grad(n)
            if n not in stats.fisher:
                stats.fisher[n] = torch.zeros_like(g)
                stats.grad[n] = torch.zeros_like(g)
            stats.fisher[n].addcmul_(g, g)
            stats.grad[n].add_(g)
        runner.step()
        stats.n += len(batch)
        stats.losses.append(float(loss.detach()))
        bar.set_postfix(loss=f"{stats.losses[-1]:.3f}")
    for n in names:
        stats.fisher[n].div_(stats.n)
        stats.grad[n].div_(len(batches))
    stats.loss = sum(stats.losses) / len(batches)
    return stats
