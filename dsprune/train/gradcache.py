"""Large in-batch losses at fixed memory: the gradient cache (Gao et al., 2021, "Scaling Deep Contrastive
Learning Batch Size under Memory Limited Setup").

An in-batch loss couples every embedding of the batch, so a plain step keeps the whole batch's activations
until its backward. Here the batch is embedded in chunks without a graph; the loss and its gradient with
respect to every embedding are computed on the full, detached embeddings (cross-rank gathers included, so
cross-rank negatives see exactly what a plain step sees); then each chunk is embedded again with a graph and
backpropagated with its slice of that gradient, since dL/dθ = Σ_chunks (dL/de_chunk) · de_chunk/dθ. Peak
activation memory is one chunk's; the price is a second forward pass.

Dropout must draw the same mask in both passes of a chunk, so each chunk's forward runs from a seed of its
own. DeepSpeed sees one backward per chunk: only the last may be a gradient-accumulation boundary (else
ZeRO-1/2 take each chunk's gradients for a whole micro-batch's). Under ZeRO-3 each backward must follow a
forward (its gradient partitions accumulate from the second forward of a micro-step on), which is why a
stage's extra loss rides on the first chunk's backward rather than having one of its own.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch

Inputs = dict  # {"input_ids": [n, L], "attention_mask": [n, L]}
LossFn = Callable[[list], "tuple[torch.Tensor, dict]"]


def _forward(engine, x: Inputs, start: int, end: int, device) -> torch.Tensor:
    # the batch's own padding is kept: trimming a chunk's would shift left-padded positions
    return engine(x["input_ids"][start:end].to(device), x["attention_mask"][start:end].to(device))


def _spans(inputs: Sequence[Inputs | None], chunk: int) -> list[tuple[int, int, int]]:
    spans = []
    for k, x in enumerate(inputs):
        if x is None:
            continue
        n = int(x["input_ids"].shape[0])
        spans += [(k, s, min(s + chunk, n)) for s in range(0, n, chunk)]
    return spans


def step(engine, inputs: Sequence[Inputs | None], loss_fn: LossFn, chunk: int, device, seed: int,
         extra: Callable[[], torch.Tensor] | None = None) -> tuple[torch.Tensor, dict]:
    """Embed ``inputs`` (None = nothing of that kind in this micro-batch) in chunks of ``chunk`` rows, compute
    ``loss_fn(embeddings)`` on the whole batch and backpropagate it through ``engine`` chunk by chunk.
    ``extra`` (a loss on the parameters alone) is added to the first chunk's backward. Returns the loss
    (with ``extra``) and its parts, detached; does not step the optimizer."""
    spans = _spans(inputs, chunk)
    pieces: list[list[torch.Tensor]] = [[] for _ in inputs]
    with torch.no_grad():
        for j, (k, s, e) in enumerate(spans):
            torch.manual_seed(seed + j)
            pieces[k].append(_forward(engine, inputs[k], s, e, device))
    embs = [torch.cat(p).detach().requires_grad_() if p else None for p in pieces]
    loss, parts = loss_fn(embs)
    live = {k: e for k, e in enumerate(embs) if e is not None}
    grad_of = dict(zip(live, torch.autograd.grad(loss, list(live.values()), materialize_grads=True)))
    loss = loss.detach()

    def chunk_loss(j: int, k: int, s: int, e: int) -> torch.Tensor:
        torch.manual_seed(seed + j)
        out = _forward(engine, inputs[k], s, e, device)
        surrogate = (out.float() * grad_of[k][s:e].float()).sum()
        if j == 0 and extra is not None:
            nonlocal loss
            x = extra()
            loss = loss + x.detach()
            surrogate = surrogate + x
        return surrogate

    backward_each(engine, [lambda j=j, span=span: chunk_loss(j, *span) for j, span in enumerate(spans)])
    return loss, {k: v.detach() for k, v in parts.items()}


def backward_each(engine, losses: Sequence[Callable[[], torch.Tensor]]) -> None:
    """``engine.backward`` on each loss in turn (each built just before its backward, so one graph lives at a
    time), as one micro-step: DeepSpeed's gradient-accumulation boundary, if this micro-step is one, only at
    the last. ``engine`` may also be a plain module (tests): then ``Tensor.backward``."""
    if not hasattr(engine, "set_gradient_accumulation_boundary"):
        for make in losses:
            make().backward()
        return
    boundary = engine.is_gradient_accumulation_boundary()
    try:
        for i, make in enumerate(losses):
            engine.set_gradient_accumulation_boundary(boundary and i == len(losses) - 1)
            engine.backward(make())
    finally:
        # backward does not advance DeepSpeed's micro-step count (step does): from here on, that count
        # gives the same boundary again, for engine.step() and every later micro-step
        engine.set_gradient_accumulation_boundary(None)
