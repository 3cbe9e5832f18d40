"""GAPrune parameter analysis and DAI: hand computations, per-sample Fisher, alignment, the dai command."""
import math

import pytest
import torch

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


def test_dai_equals_hand_computation():
    f_dom = torch.tensor([0.5, 0.1, 0.0])
    f_gen = torch.tensor([0.2, 0.3, 0.0])
    theta = torch.tensor([-0.04, 0.25, 1.0])
    s = torch.tensor([1.0, -0.5, 0.0])
    got = D.dai_score(f_dom, f_gen, theta, s, alpha=0.2, beta=1.0, gamma=0.5)
    # ((Fd - Fg)|θ| + 0.5 sqrt|θ|)(1 + 0.2 s), written out by hand
    want = [((0.5 - 0.2) * 0.04 + 0.5 * math.sqrt(0.04)) * 1.2,
            ((0.1 - 0.3) * 0.25 + 0.5 * 0.5) * 0.9,
            (0.0 + 0.5 * 1.0) * 1.0]
    assert got.tolist() == pytest.approx(want, rel=1e-6)
    assert want == pytest.approx([0.1344, 0.18, 0.5])
    # beta and gamma do what Eq. 5 says
    assert D.dai_score(f_dom, f_gen, theta, s, beta=0.0, gamma=0.0)[0] == pytest.approx(0.5 * 0.04 * 1.2)


def test_reference_variant_hand_computation():
    f_dom, f_gen = torch.tensor([2.0]), torch.tensor([1.0])
    theta, s = torch.tensor([0.5]), torch.tensor([1.0])   # 1 + 0.2·1 = 1.2, inside the clamp
    got = D.dai_score(f_dom, f_gen, theta, s, variant="reference")
    raw = (2.0 - 1.0) * 0.5 * 1.2 + 0.5 * math.sqrt(0.5 + 1e-8)
    assert float(got) == pytest.approx(math.log1p(math.exp(raw)), rel=1e-6)
    # alignment factor clamped to [0.8, 1.2]: α = 1 and s = 1 gives 2 unclamped, 1.2 clamped
    big = D.dai_score(f_dom, f_gen, theta, s, alpha=1.0, variant="reference")
    assert float(big) == pytest.approx(float(got), rel=1e-6)


def test_alignment_definitions():
    # per-sample gradients of one weight over 4 general and 4 domain samples
    gen = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, -1.0, 1.0, -1.0], [2.0, 0.0, 1.0, 1.0]]).T  # [N, weights]
    dom = torch.tensor([[0.5, 0.5, 0.5, 0.5], [3.0, 1.0, 2.0, 2.0], [-1.0, -1.0, -1.0, -1.0]]).T
    g_gen, g_dom = gen.mean(0), dom.mean(0)
    f_gen, f_dom = (gen ** 2).mean(0), (dom ** 2).mean(0)
    s = D.alignment(g_gen, g_dom, f_gen, f_dom, "consistency", eps=0.0)
    # weight 0: constant same-sign gradients -> +1; weight 1: general mean 0 -> 0;
    # weight 2: opposite signs, general gradients spread -> -cos(u,1)·cos(v,1) = -(1.0/sqrt(1.5))·1
    assert s.tolist() == pytest.approx([1.0, 0.0, -1.0 / math.sqrt(1.5)], abs=1e-6)
    assert (s.abs() <= 1 + 1e-6).all()
    sign = D.alignment(g_gen, g_dom, f_gen, f_dom, "sign", eps=1e-12)
    assert sign.tolist() == pytest.approx([1.0, 0.0, -1.0], abs=1e-6)  # the paper's per-scalar cosine
    t = D.alignment(g_gen, g_dom, f_gen, f_dom, "tensor", eps=0.0)
    cos = float(torch.nn.functional.cosine_similarity(g_gen, g_dom, dim=0))
    assert t.tolist() == pytest.approx([cos] * 3, abs=1e-6)


def _manual_per_sample_grads(enc, weights, triplets, temperature=0.02):
    """Independent per-sample gradients: cosine logits / τ and -log softmax written out."""
    out = []
    for t in triplets:
        q = enc.tokenize([t.query], "query")
        p = enc.tokenize([t.positive, t.negative], "passage")
        qe = enc(q["input_ids"], q["attention_mask"])[0]
        pe = enc(p["input_ids"], p["attention_mask"])
        logits = pe @ qe / temperature
        loss = -(logits[0] - torch.logsumexp(logits, 0))
        out.append([g.detach() for g in torch.autograd.grad(loss, list(weights.values()))])
    return out


def test_per_sample_fisher_matches_manual_and_differs_from_squared_mean():
    enc = tiny_encoder("llama", seed=1)
    enc.eval()
    weights = target_weights(enc)
    runner = LocalRunner(enc, weights)
    stats = accumulate(runner, TRIPLETS, 0.02)
    manual = _manual_per_sample_grads(enc, weights, TRIPLETS)
    some_gap = False
    for j, name in enumerate(weights):
        gs = torch.stack([m[j].flatten() for m in manual])
        f_manual = (gs ** 2).mean(0)  # fp32 with logits / 0.02: compare at 1e-3 of the largest entry
        assert torch.allclose(stats.fisher[name], f_manual, rtol=1e-3, atol=1e-6 * float(f_manual.max()))
        assert torch.allclose(stats.grad[name], gs.mean(0), rtol=1e-3, atol=1e-6 * float(gs.abs().max()))
        sq_mean = stats.grad[name] ** 2
        assert (stats.fisher[name] >= sq_mean * (1 - 1e-4) - 1e-12).all()  # Jensen: E[g²] >= E[g]²
        some_gap |= bool((stats.fisher[name] > 2 * sq_mean + 1e-10).any())
    assert some_gap, "per-sample Fisher should exceed the squared mean gradient where samples disagree"


def test_fisher_equals_squared_mean_when_samples_agree():
    enc = tiny_encoder("llama", seed=2)
    enc.eval()
    weights = target_weights(enc)
    one = accumulate(LocalRunner(enc, weights), TRIPLETS[:1])
    same = accumulate(LocalRunner(enc, weights), [TRIPLETS[0]] * 3)
    for n in weights:
        assert torch.allclose(one.fisher[n], one.grad[n] ** 2, rtol=1e-5, atol=1e-12)
        assert torch.allclose(same.fisher[n], same.grad[n] ** 2, rtol=1e-4, atol=1e-12)
        assert torch.allclose(same.fisher[n], one.fisher[n], rtol=1e-4, atol=1e-12)


def _write(path, rows):
    import json
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _rows(triplets):
    return [{"query": t.query, "positive": t.positive, "negative": t.negative} for t in triplets]


def test_dai_command_writes_eq5_of_its_statistics(tmp_path, tiny_dirs):
    from safetensors.torch import load_file

    from dsprune import formats
    from dsprune.cli import main
    from dsprune.encoder import Encoder

    gen = _write(tmp_path / "gen.jsonl", _rows(TRIPLETS[:3]))
    dom = _write(tmp_path / "dom.jsonl", [{"query": t.query, "pos": [t.positive], "neg": [t.negative]}
                                          for t in TRIPLETS[1:]])
    out = tmp_path / "dai"
    assert main(["dai", "--model", str(tiny_dirs["qwen3"]), "--general", str(gen), "--domain", str(dom),
                 "--out", str(out), "--alpha", "0.3", "--gamma", "0.1"]) == 0
    stats = {k: load_file(str(out / f)) for k, f in D.STAT_FILES.items()}
    enc = Encoder.load(tiny_dirs["qwen3"])
    weights = {n: w.detach() for n, w in target_weights(enc).items()}     # values only: no autograd in the checks
    assert set(stats["dai"]) == set(weights)
    for n, w in weights.items():
        s = D.alignment(stats["grad_gen"][n], stats["grad_dom"][n], stats["fisher_gen"][n],
                        stats["fisher_dom"][n])
        assert torch.allclose(s, stats["alignment"][n], atol=1e-6)
        want = ((stats["fisher_dom"][n] - stats["fisher_gen"][n]) * w.abs() + 0.1 * w.abs().sqrt()) * (1 + 0.3 * s)
        assert torch.allclose(stats["dai"][n], want, rtol=1e-5, atol=1e-8)
    man = formats.read_manifest(out)
    assert man["figures"]["n_general"] == 3 and man["figures"]["n_domain"] == 3
    assert man["figures"]["model_fp32_bytes"] > 0 and len(man["figures"]["peak_rss_bytes_per_rank"]) == 1
    # --fisher_scale balanced: both Fisher terms scaled by one constant so |Fisher term| and γ√|θ| balance
    out_b = tmp_path / "dai_balanced"
    assert main(["dai", "--model", str(tiny_dirs["qwen3"]), "--general", str(gen), "--domain", str(dom),
                 "--out", str(out_b), "--alpha", "0.3", "--gamma", "0.1", "--fisher_scale", "balanced"]) == 0
    fig = formats.read_manifest(out_b)["figures"]
    c = fig["fisher_scale_applied"]
    assert c == pytest.approx(1 / man["figures"]["mean_abs_fisher_term_over_magnitude_term"], rel=1e-5)
    fisher_sum = sum(float(((stats["fisher_dom"][n] - stats["fisher_gen"][n]) * w.abs()).abs().sum())
                     for n, w in weights.items())
    mag_sum = sum(float((0.1 * w.abs().sqrt()).sum()) for w in weights.values())
    assert c * fisher_sum == pytest.approx(mag_sum, rel=1e-4)
    dai_b = load_file(str(out_b / D.STAT_FILES["dai"]))
    for n, w in weights.items():
        want = D.dai_score(c * stats["fisher_dom"][n], c * stats["fisher_gen"][n], w, stats["alignment"][n],
                           0.3, 1.0, 0.1)
        assert torch.allclose(dai_b[n], want, rtol=1e-4, atol=1e-7)
    # dsprune prune --dai_recompute reproduces the balanced DAI from the saved statistics (no new gradients)
    from dsprune.importance.dai import dai_from_stats
    again = dai_from_stats(out, weights, 0.3, 1.0, 0.1, fisher_scale="balanced")
    assert all(torch.allclose(again[n], dai_b[n], rtol=1e-4, atol=1e-7) for n in weights)
    assert main(["prune", "--model", str(tiny_dirs["qwen3"]), "--method", "dai", "--scores", str(out),
                 "--sparsity", "0.5", "--dai_recompute", "--dai_alpha", "0.3", "--dai_gamma", "0.1",
                 "--dai_fisher_scale", "balanced", "--out", str(tmp_path / "mask_b")]) == 0
    from dsprune.importance.budget import keep_top
    tensors, _ = formats.read_mask(tmp_path / "mask_b")
    assert all(torch.equal(tensors[n], m) for n, m in keep_top(again, 0.5).items())
    # --dai_eps: Eq. 4 with an ε far below every product of mean gradients is their sign, s = ±1
    assert main(["prune", "--model", str(tiny_dirs["qwen3"]), "--method", "dai", "--scores", str(out),
                 "--sparsity", "0.5", "--dai_recompute", "--dai_alignment", "eq4", "--dai_eps", "1e-30",
                 "--out", str(tmp_path / "mask_sign")]) == 0
    sign = {n: D.dai_score(stats["fisher_dom"][n], stats["fisher_gen"][n], w,
                           torch.sign(stats["grad_gen"][n] * stats["grad_dom"][n])) for n, w in weights.items()}
    tensors, _ = formats.read_mask(tmp_path / "mask_sign")
    assert all(torch.equal(tensors[n], m) for n, m in keep_top(sign, 0.5).items())
    # refuses to overwrite
    assert main(["dai", "--model", str(tiny_dirs["qwen3"]), "--general", str(gen), "--domain", str(dom),
                 "--out", str(out)]) == 2
