"""Self-slimming in one process: gates, the L0 surrogate, the global ranking, `dsprune mask`, the shared
mask path and the sliced export (EffiR §5.1, Appendix A.1)."""
import math

import pytest
import torch

from dsprune import formats
from dsprune.cli import main as cli
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.importance import slim
from dsprune.surgery import gates as G
from dsprune.surgery.mask import apply_mask, apply_mask_dir
from dsprune.surgery.prune import drop_sublayers, export, intermediate_sizes
from dsprune.tiny import FAMILIES, tiny_encoder


def _embed(enc, texts):
    t = enc.tokenize(texts, "passage")
    with torch.no_grad():
        return enc(t["input_ids"], t["attention_mask"])


def _random_gates(enc, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {i: torch.rand(m.z.numel(), generator=g) * 2 - 0.5 for i, m in G.gates_of(enc).items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_masked_model_equals_sliced_export(family, texts, tmp_path):
    """Gates at 0/1 (the model the paper retrains) == neurons physically removed, saved and reloaded."""
    enc = tiny_encoder(family).eval()
    drop_sublayers(enc, mlp=[1])  # gates must follow the original numbering around a dropped MLP
    base = _embed(enc, texts)
    G.insert_gates(enc)
    assert sorted(G.gates_of(enc)) == [0, 2, 3]
    assert torch.equal(_embed(enc, texts), base)  # z = 1: the original function
    keep = slim.global_mask(_random_gates(enc), 0.4)
    G.set_gate_values(enc, {i: m.float() for i, m in keep.items()})
    masked = _embed(enc, texts)
    assert (masked - base).abs().max() > 1e-3  # the mask really changes the model

    G.remove_gates(enc)
    apply_mask(enc, slim.as_mask_tensors(keep), "structured")
    assert intermediate_sizes(enc) == [int(keep[0].sum()), None, int(keep[2].sum()), int(keep[3].sum())]
    export(enc, tmp_path / "exp")
    again = Encoder.load(tmp_path / "exp").eval()
    assert again.model.config.intermediate_sizes == intermediate_sizes(enc) == intermediate_sizes(again)
    assert (_embed(again, texts) - masked).abs().max() <= 1e-5


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_folded_gate_values_are_exact(family, texts):
    """Survivors keep ReLU(z): folding into up rows (gated) / down columns (BERT) equals the gated model."""
    enc = tiny_encoder(family).eval()
    G.insert_gates(enc)
    values = _random_gates(enc, seed=3)
    keep = slim.global_mask(values, 0.25)
    G.set_gate_values(enc, {i: v * keep[i] for i, v in values.items()})
    gated = _embed(enc, texts)
    G.remove_gates(enc)
    scale = {formats.mlp_key(i): torch.relu(v) for i, v in values.items()}
    apply_mask(enc, slim.as_mask_tensors(keep), "structured", scale=scale)
    assert (_embed(enc, texts) - gated).abs().max() <= 1e-5


def test_remove_gates_fold(texts):
    enc = tiny_encoder("qwen3").eval()
    G.insert_gates(enc)
    G.set_gate_values(enc, _random_gates(enc, seed=1))
    gated = _embed(enc, texts)
    G.remove_gates(enc, fold=True)
    assert not G.gates_of(enc)
    assert (_embed(enc, texts) - gated).abs().max() <= 1e-5


def test_gates_get_gradients_under_lora(texts):
    """Gates sit on the activation, not a projection: LoRA on gate/up/down leaves them in the path."""
    from dsprune.train import lora

    enc = tiny_encoder("llama")
    G.insert_gates(enc)
    lora.attach(enc, r=4, alpha=8)
    zs = G.gate_parameters(enc)
    assert len(zs) == 4 and all(not z.requires_grad for z in zs)  # PEFT froze them; the stage unfreezes
    for z in zs:
        z.requires_grad_(True)
    t = enc.tokenize(texts, "passage")
    out = enc(t["input_ids"], t["attention_mask"])
    loss = out.sum() + slim.l0_surrogate(G.live_gates(enc))
    loss.backward()
    assert all(z.grad is not None and z.grad.abs().sum() > 0 for z in zs)


def test_l0_surrogate_gradient_sign_and_normalisation():
    z = torch.tensor([-2.0, -0.3, 0.2, 1.0, 3.0], requires_grad=True)
    pen = slim.l0_surrogate(z, beta=5.0, normalise="sum")
    pen.backward()
    expected = 5 * torch.sigmoid(5 * z.abs()) * (1 - torch.sigmoid(5 * z.abs())) * z.sign()
    assert torch.allclose(z.grad, expected.detach())
    # minimising pushes every gate towards 0: positive gradient for z > 0, negative for z < 0
    assert (z.grad[z > 0] > 0).all() and (z.grad[z < 0] < 0).all()
    # the slope is steepest near 0 (β/4), tiny where σ saturates (z = 1: β·σ(5)(1-σ(5)) ≈ 0.033)
    assert abs(float(z.grad[3]) - 5 * torch.sigmoid(torch.tensor(5.0)) * (1 - torch.sigmoid(torch.tensor(5.0)))) < 1e-6
    parts = [torch.ones(3), torch.zeros(5)]
    mean = slim.l0_surrogate(parts, normalise="mean")
    total = slim.l0_surrogate(parts, normalise="sum")
    assert math.isclose(float(mean), float(total) / 8, rel_tol=1e-6)
    assert 0.5 <= float(mean) <= 1.0
    with pytest.raises(DsPruneError):
        slim.l0_surrogate(parts, normalise="max")


@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.3, 0.333, 0.5, 0.7])
def test_global_ranking_removes_exactly_round_r_n(ratio):
    g = torch.Generator().manual_seed(4)
    values = {0: torch.rand(37, generator=g), 2: torch.rand(50, generator=g) + 0.3, 5: torch.rand(13, generator=g)}
    values[0][:5] = -1.0  # negative z: ReLU = 0, ties broken deterministically
    keep = slim.global_mask(values, ratio)
    n = 37 + 50 + 13
    assert sum(int((~m).sum()) for m in keep.values()) == round(ratio * n)
    # global: every removed ReLU(z) <= every kept one
    removed = torch.cat([torch.relu(values[i])[~keep[i]] for i in keep])
    kept = torch.cat([torch.relu(values[i])[keep[i]] for i in keep])
    if removed.numel():
        assert removed.max() <= kept.min()
    again = slim.global_mask(values, ratio)  # deterministic
    assert all(torch.equal(keep[i], again[i]) for i in keep)


def test_gates_below_zero_go_in_order_of_z_not_of_layer():
    """More gates at ReLU(z) = 0 than the ratio removes: the ones furthest below zero go, wherever they sit."""
    values = {0: torch.tensor([-0.01, -0.02, 0.5, 0.6]), 1: torch.tensor([-0.3, -0.2, 0.7, 0.8]),
              2: torch.tensor([-0.1, -0.05, 0.9, 1.0])}
    keep = slim.global_mask(values, 0.25)                 # 3 of the 6 gates below zero go
    removed = sorted(float(values[i][j]) for i in keep for j in (~keep[i]).nonzero().flatten().tolist())
    assert removed == pytest.approx([-0.3, -0.2, -0.1])
    assert keep[0].all() and keep[2][1]                  # not the first layers' by position


def test_ranking_refuses_bad_ratios_and_empty_layers():
    values = {0: torch.full((10,), 0.01), 1: torch.ones(30)}
    for bad in (-0.1, 1.0, 1.5, float("nan")):
        with pytest.raises(DsPruneError, match="ratio must be in"):
            slim.global_mask(values, bad)
    with pytest.raises(DsPruneError, match="every neuron of MLP layer 0.*min_per_layer"):
        slim.global_mask(values, 0.25)
    keep = slim.global_mask(values, 0.25, min_per_layer=2)
    assert int(keep[0].sum()) == 2 and int((~keep[0]).sum()) + int((~keep[1]).sum()) == 10
    with pytest.raises(DsPruneError, match="leaves only"):
        slim.global_mask(values, 0.9, min_per_layer=8)


def test_mask_command(tmp_path, texts):
    enc = tiny_encoder("llama")
    drop_sublayers(enc, mlp=[2])
    model = export(enc, tmp_path / "model")
    enc = Encoder.load(model).eval()
    G.insert_gates(enc)
    values = _random_gates(enc, seed=7)
    G.save_gates(tmp_path / G.GATES_FILE, values, 4, "llama")
    out = tmp_path / "mask"
    assert cli(["mask", "--gates", str(tmp_path), "--ratio", "0.3", "--out", str(out), "--model", str(model),
                "--keep_gate_values", "true"]) == 0
    tensors, meta = formats.read_mask(out)
    n = sum(v.numel() for v in values.values())
    assert meta["kind"] == "structured" and meta["method"] == "slim" and meta["ties"] == "z"
    assert sorted(tensors) == ["mlp.0", "mlp.1", "mlp.3"]
    assert meta["total"] - meta["kept"] == round(0.3 * n)
    assert (out / "widths.png").stat().st_size > 0
    man = formats.read_manifest(out)
    assert man["figures"]["params"]["after"] < man["figures"]["params"]["before"]
    # the shared path folds the stored gate values: equals the gated model with the mask applied
    keep = {int(k.split(".")[1]): v for k, v in tensors.items()}
    G.set_gate_values(enc, {i: v * keep[i] for i, v in values.items()})
    gated = _embed(enc, texts)
    fresh = Encoder.load(model).eval()
    apply_mask_dir(fresh, out)
    assert (_embed(fresh, texts) - gated).abs().max() <= 1e-5
    # the export's manifest says how the mask broke ties, so a reader of the model alone can tell
    assert cli(["export", "--model", str(model), "--mask", str(out), "--out", str(tmp_path / "exp")]) == 0
    held = formats.read_manifest(tmp_path / "exp")["mask"]
    assert held["ties"] == "z" and held["method"] == "slim" and held["kind"] == "structured"
    # refusals: existing output, bad ratio, a layer emptied without the floor option
    assert cli(["mask", "--gates", str(tmp_path), "--ratio", "0.3", "--out", str(out)]) == 2
    assert cli(["mask", "--gates", str(tmp_path), "--ratio", "1.0", "--out", str(tmp_path / "m2")]) == 2
    G.save_gates(tmp_path / "g2.safetensors", {0: torch.zeros(4), 1: torch.ones(40)}, 4, "llama")
    assert cli(["mask", "--gates", str(tmp_path / "g2.safetensors"), "--ratio", "0.1", "--out",
                str(tmp_path / "m3")]) == 2
    assert not (tmp_path / "m3").exists()
    assert cli(["mask", "--gates", str(tmp_path / "g2.safetensors"), "--ratio", "0.1", "--out",
                str(tmp_path / "m3"), "--min_per_layer", "1"]) == 0


def test_gate_insertion_refusals():
    enc = tiny_encoder("llama")
    G.insert_gates(enc)
    with pytest.raises(DsPruneError, match="already has"):
        G.insert_gates(enc)
    with pytest.raises(DsPruneError, match="entries"):
        G.set_gate_values(enc, {0: torch.ones(3)})
    with pytest.raises(DsPruneError, match="no gate in MLP layer 9"):
        G.set_gate_values(enc, {9: torch.ones(3)})
    G.remove_gates(enc)
    with pytest.raises(DsPruneError, match="no self-slimming gates"):
        G.remove_gates(enc)
