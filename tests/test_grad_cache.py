"""The gradient cache (``--grad_cache_chunk``): the loss and every parameter gradient of a chunked step equal
the plain full-batch step, in one process and with 2 ranks (cross-rank negatives through gather_with_grad)
under ZeRO-0 to ZeRO-3 with gradient accumulation.

Run as a script (``torchrun --nproc_per_node 2 tests/test_grad_cache.py OUT``) this file is the 2-rank
worker the test starts.
"""
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dsprune.tiny import tiny_encoder
from dsprune.train import gradcache
from dsprune.train.loop import contrastive_loss

GROUP, TOL = 4, 1e-5
LOSS = SimpleNamespace(infonce_weight=1.0, kl_weight=0.5, group_size=GROUP, temperature=0.05,
                       teacher_temperature=1.0, cross_rank_negatives=True)
WORDS = "cell membrane aspirin revenue income retrieval pruning gene interest bond heart cash".split()


def _batch(enc, n_queries: int, seed: int):
    g = torch.Generator().manual_seed(seed)

    def text(k):
        return " ".join(WORDS[i] for i in torch.randint(len(WORDS), (k,), generator=g).tolist())
    queries = [text(2 + i % 3) for i in range(n_queries)]
    passages = [text(4 + i % 7) for i in range(n_queries * GROUP)]
    scores = torch.randn(n_queries, GROUP, generator=g)
    return [enc.tokenize(queries, "query"), enc.tokenize(passages, "passage")], scores


def _plain(model, inputs, loss_fn, extra=None):
    embs = [model(x["input_ids"], x["attention_mask"]) for x in inputs]
    loss, _ = loss_fn(embs)
    if extra is not None:
        loss = loss + extra()
    loss.backward()
    return loss.detach()


def _grads(model):
    out = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad(set_to_none=True)
    return out


def _same(a: dict, b: dict):
    assert a.keys() == b.keys() and a
    worst = max((a[n] - b[n]).abs().max().item() for n in a)
    assert worst <= TOL, worst


@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_chunked_step_equals_plain_step(chunk):
    enc = tiny_encoder("llama").train()
    inputs, scores = _batch(enc, 6, seed=chunk)

    def loss_fn(e):
        return contrastive_loss(e[0], e[1], scores, LOSS)

    def extra():  # a loss on the parameters alone, like the slim penalty: rides on the first chunk
        return 1e-3 * enc.model.norm.weight.pow(2).sum()

    ref = _plain(enc, inputs, loss_fn, extra)
    ref_grads = _grads(enc)
    loss, parts = gradcache.step(enc, inputs, loss_fn, chunk, "cpu", seed=0, extra=extra)
    assert abs(loss.item() - ref.item()) <= TOL and set(parts) == {"infonce", "kl"}
    _same(_grads(enc), ref_grads)


def test_a_missing_kind_is_skipped():
    """A micro-batch may hold none of a kind (a distillation batch of passages only)."""
    enc = tiny_encoder("llama").train()
    inputs, _ = _batch(enc, 3, seed=1)
    inputs = [None, inputs[1]]

    def loss_fn(e):
        assert e[0] is None
        return (e[1] @ e[1].T).logsumexp(-1).mean(), {}
    ref = _plain(enc, [inputs[1]], lambda e: loss_fn([None, e[0]]))
    ref_grads = _grads(enc)
    loss, _ = gradcache.step(enc, inputs, loss_fn, 5, "cpu", seed=0)
    assert abs(loss.item() - ref.item()) <= TOL
    _same(_grads(enc), ref_grads)


@pytest.mark.slow
def test_two_ranks_every_zero_stage_equals_plain_step(tmp_path):
    from train_helpers import BIN, REPO, env, free_port
    out = tmp_path / "result.json"
    proc = subprocess.run([str(BIN / "torchrun"), "--nproc_per_node", "2", "--master_port", str(free_port()),
                           str(Path(__file__).resolve()), str(out)], env=env(), cwd=REPO, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert set(res) == {"zero0", "zero1", "zero2", "zero3"}
    for stage, r in res.items():
        assert r["n_params"] > 10, stage
        assert r["loss_diff"] <= TOL and r["grad_diff"] <= TOL, (stage, r)
        # cross-rank negatives really were in the loss: each rank's loss differs from its local-only one
        assert r["cross_minus_local"] > 1e-3, (stage, r)


# ---- the 2-rank worker --------------------------------------------------------------------------------------
def _engine(stage: int, accum: int):
    import deepspeed
    enc = tiny_encoder("llama").train()
    for p in enc.parameters():
        p.requires_grad_(True)
    cfg = {"train_micro_batch_size_per_gpu": 6, "gradient_accumulation_steps": accum,
           "train_batch_size": 6 * accum * 2, "zero_optimization": {"stage": stage,
                                                                     "stage3_param_persistence_threshold": 0}}
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-3)
    engine, *_ = deepspeed.initialize(model=enc, optimizer=opt, config=cfg, dist_init_required=False)
    return engine


def _full_grads(engine) -> dict:
    from deepspeed.utils import safe_get_full_grad
    return {n: safe_get_full_grad(p).clone() for n, p in engine.module.named_parameters()}


def _worker(out: Path) -> None:
    import deepspeed
    import torch.distributed as dist
    from dsprune.losses import info_nce

    deepspeed.init_distributed(dist_backend="gloo")
    rank, accum = dist.get_rank(), 2
    result = {}
    for stage in (0, 1, 2, 3):
        plain, cached = _engine(stage, accum), _engine(stage, accum)
        loss_diff, local_gap = 0.0, 0.0
        for micro in range(accum):  # the second micro-step is the accumulation boundary
            inputs, scores = _batch(plain.module, 6, seed=100 * rank + micro)

            def loss_fn(e):
                return contrastive_loss(e[0], e[1], scores, LOSS)
            embs = [plain(x["input_ids"], x["attention_mask"]) for x in inputs]
            a, _ = loss_fn(embs)
            with torch.no_grad():
                local_gap = (info_nce(embs[0], embs[1], GROUP, LOSS.temperature, cross_rank=True)
                             - info_nce(embs[0], embs[1], GROUP, LOSS.temperature, cross_rank=False)).item()
            plain.backward(a)
            b, _ = gradcache.step(cached, inputs, loss_fn, 4, "cpu", seed=micro)
            loss_diff = max(loss_diff, abs(a.item() - b.item()))
            if micro < accum - 1:
                plain.step()
                cached.step()
        ga, gb = _full_grads(plain), _full_grads(cached)
        grad_diff = max((ga[n] - gb[n]).abs().max().item() for n in ga)
        result[f"zero{stage}"] = {"loss_diff": loss_diff, "grad_diff": grad_diff, "n_params": len(ga),
                                  "cross_minus_local": local_gap}
        plain.step()
        cached.step()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if rank == 0:
        merged = {k: {m: max(r[k][m] for r in gathered) for m in result[k]} for k in result}
        out.write_text(json.dumps(merged))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
