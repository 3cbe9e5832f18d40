"""FLOPs per token from the structure agree with a count over the real Linear layers; bench writes sane JSON."""
import json

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.eval.speed import fixed_batches, flat_index_latency, flops_per_token
from dsprune.surgery import modeling_dsprune as md
from dsprune.surgery.prune import drop_sublayers, export, slice_neurons
from dsprune.tiny import tiny_encoder

from test_eval_retrieval import write_beir


def linear_count(enc, seq_len):
    """Independent count: 2 * in * out for every Linear inside the blocks, plus 4 * L * width per attention."""
    total = 0
    for block in enc.arch.layers_of(enc.backbone):
        total += sum(2 * m.in_features * m.out_features for m in block.modules() if isinstance(m, torch.nn.Linear))
        attn = md.get_module(block, enc.arch.attn)
        if not isinstance(attn, md.DroppedAttention):
            cfg = enc.backbone.config
            total += 4 * seq_len * cfg.num_attention_heads * (getattr(cfg, "head_dim", None)
                                                               or cfg.hidden_size // cfg.num_attention_heads)
    return total


@pytest.mark.parametrize("family", ["llama", "qwen3", "bert"])
def test_flops_follow_structure(family):
    enc = tiny_encoder(family)
    assert flops_per_token(enc, 48)["total"] == linear_count(enc, 48)
    full = flops_per_token(enc, 48)
    drop_sublayers(enc, attn=[1], mlp=[0, 2])
    slice_neurons(enc, {3: torch.arange(40)})
    pruned = flops_per_token(enc, 48)
    assert pruned["total"] == linear_count(enc, 48)
    assert pruned["attn_scores"] == full["attn_scores"] * 3 // 4
    assert flops_per_token(enc, 96)["attn_scores"] == 2 * pruned["attn_scores"]   # the length term


def test_fixed_batches_have_the_benched_shape():
    enc = tiny_encoder("llama", padding_side="left")
    batches = fixed_batches(enc, ["a short one", "revenue grew by ten percent " * 20, "x"], "passage", 2, 24)
    assert [tuple(b["input_ids"].shape) for b in batches] == [(2, 24), (1, 24)]
    assert batches[0]["attention_mask"][0, -1] == 1      # left padding keeps the last position real
    # Padding to the benched length leaves the embeddings as encode() makes them (the latency index uses them).
    with torch.no_grad():
        padded = torch.cat([enc(b["input_ids"], b["attention_mask"]) for b in batches])
    plain = enc.encode(["a short one", "revenue grew by ten percent " * 20, "x"], "passage", max_length=24,
                       show_progress=False)
    assert torch.allclose(padded, plain, atol=1e-5)


def test_flat_index_latency_positive():
    d, q = torch.randn(50, 16), torch.randn(7, 16)
    lat = flat_index_latency(d, q, k=5)
    assert lat["ms_per_query"] > 0 and lat["index_size"] == 50 and lat["dim"] == 16


def test_bench_writes_sane_json(tmp_path):
    data = write_beir(tmp_path / "beir")
    base = tmp_path / "full"
    enc = tiny_encoder("llama")
    enc.save(base)
    drop_sublayers(enc, mlp=[0, 1, 2])
    export(enc, tmp_path / "pruned", stage="drop")
    out = tmp_path / "bench"
    rc = main(["bench", "--model", str(tmp_path / "pruned"), "--baseline", str(base), "--out", str(out),
               "--data", str(data), "--docs", "6", "--doc_batch", "4", "--doc_len", "32", "--queries", "4",
               "--query_batch", "2", "--query_len", "8", "--repeats", "2"])
    assert rc == 0
    doc = json.loads((out / "bench.json").read_text())
    for kind, length in (("document", 32), ("query", 8)):
        r = doc[kind]
        assert r["length"] == length and len(r["model"]["seconds"]) == 2
        assert r["speedup"] > 0 and all(t > 0 for t in r["baseline"]["seconds"])
        assert r["model"]["flops_per_token"]["mlp"] < r["baseline"]["flops_per_token"]["mlp"]
        assert r["flop_ratio"] == pytest.approx(r["baseline"]["flops_per_token"]["total"]
                                                / r["model"]["flops_per_token"]["total"])
        assert r["flop_ratio"] > 1
    assert doc["params"]["ratio"] > 1 and doc["params"]["model"] < doc["params"]["baseline"]
    assert doc["fingerprint"]["model"] != doc["fingerprint"]["baseline"]
    assert all(v["ms_per_query"] > 0 and v["index_size"] == 6 for v in doc["retrieval_latency"].values())
    assert json.loads((out / "manifest.json").read_text())["stage"] == "bench"
    # the processor travels with the ratio: int8 and float kernels gain differently across instruction sets
    import torch
    assert doc["machine"]["cpu"] and doc["machine"]["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert doc["machine"]["logical_cpus"] >= 1
    assert Encoder.load(tmp_path / "pruned")  # the bench left the export intact
