"""GAPrune's DAI modes: Eq. 4 as written, and the authors' released code (batched in-batch Fisher, element-wise
smoothed alignment, per-matrix z-scored softplus), each checked against a computation written out here."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

from dsprune.errors import DsPruneError
from dsprune.importance import dai as D
from dsprune.importance.fisher import LocalRunner, accumulate
from dsprune.importance.triplets import Triplet
from dsprune.surgery.mask import target_weights
from dsprune.tiny import tiny_encoder

TRIPLETS = [
    Triplet("what is the capital expenditure", "revenue grew by ten percent", "the cell membrane"),
    Triplet("aspirin and heart attack", "a randomized trial found no effect", "interest rates and bonds"),
    Triplet("gene expression in the embryo", "development of the embryo", "net income and cash flow"),
    Triplet("dense retrieval of passages", "queries and passages into vectors", "vitamin d and fractures"),
]


def _reference_batch_grads(enc, weights, batches, scale=20.0):
    """The authors' loss per batch: cosine of every query against [all positives; all negatives] times 20,
    cross-entropy with each query's own positive as the target, mean over the batch's queries."""
    out = []
    for batch in batches:
        q = enc.tokenize([t.query for t in batch], "query")
        pos = enc.tokenize([t.positive for t in batch], "passage")
        neg = enc.tokenize([t.negative for t in batch], "passage")
        qe = F.normalize(enc(q["input_ids"], q["attention_mask"]), dim=-1)
        docs = torch.cat([F.normalize(enc(x["input_ids"], x["attention_mask"]), dim=-1) for x in (pos, neg)])
        loss = F.cross_entropy(qe @ docs.T * scale, torch.arange(len(batch)))
        out.append([g.detach().flatten() for g in torch.autograd.grad(loss, list(weights.values()))])
    return out


def test_batched_statistics_are_the_reference_codes_in_batch_fisher():
    enc = tiny_encoder("llama", seed=3)
    enc.eval()
    weights = target_weights(enc)
    stats = accumulate(LocalRunner(enc, weights), TRIPLETS, temperature=0.05, batch_size=2)
    per_sample = accumulate(LocalRunner(enc, weights), TRIPLETS, temperature=0.05)
    grads = _reference_batch_grads(enc, weights, [TRIPLETS[:2], TRIPLETS[2:]])
    assert stats.n == 4 and len(stats.losses) == 2
    differs = False
    for j, n in enumerate(weights):
        g = torch.stack([b[j] for b in grads])
        want_f = (g ** 2).sum(0) / 4               # squared batch gradients over the triplet count
        assert torch.allclose(stats.fisher[n], want_f, rtol=1e-3, atol=1e-6 * float(want_f.max()))
        assert torch.allclose(stats.grad[n], g.mean(0), rtol=1e-3, atol=1e-6 * float(g.abs().max()))
        differs |= not torch.allclose(stats.fisher[n], per_sample.fisher[n], rtol=1e-2)
    assert differs, "in-batch Fisher should differ from the per-sample one"


def test_eq4_is_the_papers_cosine_per_weight_and_reference_alignment_is_smoothed():
    torch.manual_seed(0)
    g_gen, g_dom = torch.randn(4, 5), torch.randn(4, 5)
    ones = torch.ones(4, 5)
    eq4 = D.alignment(g_gen, g_dom, ones, ones, "eq4", eps=1e-12)
    assert torch.equal(eq4, torch.sign(g_gen * g_dom))     # Eq. 4 on two scalars is the sign of their product
    assert torch.equal(D.alignment(g_gen, g_dom, ones, ones, "sign", eps=1e-12), eq4)
    ref = D.alignment(g_gen, g_dom, ones, ones, "reference")
    unit = (g_gen / g_gen.norm()) * (g_dom / g_dom.norm())
    want = F.avg_pool2d(unit[None, None], 3, stride=1, padding=1, count_include_pad=True)[0, 0]
    assert torch.allclose(ref, want, atol=1e-7)
    assert not torch.allclose(ref, unit, atol=1e-4)
    with pytest.raises(DsPruneError, match="whole matrices"):       # a ZeRO-3 shard has no neighbours
        D.alignment(g_gen.flatten()[:10], g_dom.flatten()[:10], ones.flatten()[:10], ones.flatten()[:10],
                    "reference", shape=(4, 5))


def test_reference_variant_z_scores_each_matrix():
    torch.manual_seed(1)
    signs = torch.randn(6, 8).sign()
    theta = {"a": signs * (torch.rand(6, 8) * 0.01), "b": signs * (torch.rand(6, 8) + 0.5)}   # every |b| > every |a|
    zero = {n: torch.zeros(6, 8) for n in theta}
    p = D.DaiParams(alignment="consistency", variant="reference")
    got = D.compute(theta, zero, zero, zero, zero, theta.__getitem__, p).dai
    for n, w in theta.items():
        raw = F.softplus(0.5 * torch.sqrt(w.abs() + 1e-8))
        z = (raw - raw.mean()) / (raw.std() + 1e-8)
        assert torch.allclose(got[n], torch.sigmoid(z), atol=1e-6)
    from dsprune.importance.budget import keep_top
    paper = D.compute(theta, zero, zero, zero, zero, theta.__getitem__, D.DaiParams()).dai
    assert keep_top(paper, 0.5)["b"].all()                 # Eq. 5: the small matrix goes first, whole
    kept = keep_top(got, 0.5)
    assert 0.3 < kept["a"].float().mean() < 0.7 and 0.3 < kept["b"].float().mean() < 0.7


def test_dai_command_reference_mode(tmp_path, tiny_dirs, capsys):
    from safetensors.torch import load_file

    from dsprune import formats
    from dsprune.cli import main
    from dsprune.encoder import Encoder
    from dsprune.importance.gaprune import REFERENCE

    gen = tmp_path / "gen.jsonl"
    gen.write_text("".join(json.dumps({"query": t.query, "positive": t.positive, "negative": t.negative}) + "\n"
                           for t in TRIPLETS))
    out = tmp_path / "ref"
    common = ["dai", "--model", str(tiny_dirs["qwen3"]), "--general", str(gen), "--domain", str(gen)]
    opts = [x for k, v in {**REFERENCE, "fisher_batch": 2, "grad_batch": 1}.items() for x in (f"--{k}", str(v))]
    assert main([*common, *opts, "--out", str(out)]) == 0
    enc = Encoder.load(tiny_dirs["qwen3"])
    enc.eval()
    weights = target_weights(enc)
    batched = accumulate(LocalRunner(enc, weights), TRIPLETS, 0.05, batch_size=2)
    single = accumulate(LocalRunner(enc, weights), TRIPLETS, 0.05, batch_size=1)
    saved = {s: load_file(str(out / D.STAT_FILES[s])) for s in ("fisher_gen", "grad_gen", "dai")}
    for n in weights:
        f = batched.fisher[n]
        assert torch.allclose(saved["fisher_gen"][n].flatten(), f, rtol=1e-3, atol=1e-6 * float(f.max()))
        g = single.grad[n]                                  # --grad_batch 1: the mean of per-sample gradients
        assert torch.allclose(saved["grad_gen"][n].flatten(), g, rtol=1e-3, atol=1e-6 * float(g.abs().max()))
    theta = {n: w.detach() for n, w in weights.items()}
    again = D.dai_from_stats(out, theta, 0.2, 1.0, 0.5, "reference", "reference")
    assert all(torch.allclose(again[n], saved["dai"][n], atol=1e-6) for n in theta)
    cfg = formats.read_manifest(out)["config"]
    assert (cfg["fisher_batch"], cfg["grad_batch"], cfg["alignment"]) == (2, 1, "reference")
    capsys.readouterr()
    bad = [[*opts, "--deepspeed", str(gen)], ["--fisher_batch", "0"]]
    for extra, what in zip(bad, ("whole matrices", "--fisher_batch must be")):
        assert main([*common, *extra, "--out", str(tmp_path / "no")]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and what in err[0]
        assert not (tmp_path / "no").exists()
    assert math.isfinite(float(saved["dai"][next(iter(theta))].sum()))
