"""Masks: exact sparsity, one path for every method, structured neurons, export, holding during retraining."""

import pytest
import torch

from dsprune import formats
from dsprune.cli import main
from dsprune.commands.demo import SAMPLE
from dsprune.encoder import Encoder
from dsprune.importance import budget
from dsprune.surgery.mask import MaskHolder, apply_mask, apply_mask_dir, mlp_weight_names, target_weights
from dsprune.tiny import tiny_encoder


@pytest.mark.parametrize("scope", ["global", "layer", "row"])
@pytest.mark.parametrize("sparsity", [0.3, 0.5])
def test_keep_top_hits_sparsity_exactly_even_with_ties(scope, sparsity):
    g = torch.Generator().manual_seed(0)
    scores = {"layers.0.mlp.up_proj.weight": torch.randint(0, 3, (10, 20), generator=g).float(),
              "layers.0.mlp.down_proj.weight": torch.ones(20, 10),       # all tied
              "layers.1.mlp.up_proj.weight": torch.randn(10, 20, generator=g)}
    masks = budget.keep_top(scores, sparsity, scope)
    total = sum(m.numel() for m in masks.values())
    pruned = sum(int((~m).sum()) for m in masks.values())
    assert pruned == round(sparsity * total)
    if scope == "row":
        for m in masks.values():
            assert ((~m).sum(1) == round(sparsity * m.shape[1])).all()
    if scope == "layer":
        l0 = sum(int((~masks[n]).sum()) for n in masks if ".0." in n)
        assert l0 == round(sparsity * 400)
    # nothing pruned scores higher than anything kept within a group (global)
    if scope == "global":
        flat_s = torch.cat([s.flatten() for s in scores.values()])
        flat_m = torch.cat([m.flatten() for m in masks.values()])
        assert flat_s[~flat_m].max() <= flat_s[flat_m].min()


def test_neuron_aggregation_by_hand():
    # one layer, hidden 2, intermediate 3; gate/up rows and down columns per neuron
    names = {0: ("g", "u", "d")}
    gate = torch.tensor([[1.0, 1.0], [-5.0, 0.0], [0.5, 0.5]])
    up = torch.tensor([[1.0, 0.0], [4.0, 0.0], [0.5, 0.5]])
    down = torch.tensor([[1.0, -3.0, 0.5], [0.0, 0.0, 0.5]])  # [hidden, intermediate]
    sc = {"g": gate, "u": up, "d": down}
    s = budget.neuron_scores(sc, names, "sum")[0]
    assert s.tolist() == pytest.approx([1 + 1 + 1 + 0 + 1 + 0, -5 + 4 - 3, 1 + 1 + 1])  # [4, -4, 3]
    p = budget.neuron_scores(sc, names, "positive")[0]
    assert p.tolist() == pytest.approx([4, 4, 3])
    # sum drops the conflicting neuron 1 first; positive drops neuron 2
    assert budget.keep_top_neurons({0: s}, 1 / 3)[0].tolist() == [True, False, True]
    assert budget.keep_top_neurons({0: p}, 1 / 3)[0].tolist() == [True, True, False]


def test_keep_top_neurons_exact_and_never_empties_a_layer():
    scores = {0: torch.tensor([-9.0, -8.0, -7.0, -6.0]), 1: torch.tensor([1.0, 2.0, 3.0, 4.0])}
    keep = budget.keep_top_neurons(scores, 0.5)
    assert sum(int((~k).sum()) for k in keep.values()) == 4
    assert keep[0].tolist() == [False, False, False, True]  # layer 0 keeps its best one
    assert keep[1].tolist() == [False, True, True, True]
    keep_l = budget.keep_top_neurons(scores, 0.5, scope="layer")
    assert [int(k.sum()) for k in keep_l.values()] == [2, 2]


def test_methods_share_one_path_and_hit_sparsity(tmp_path, tiny_dirs):
    model = str(tiny_dirs["llama"])
    enc = Encoder.load(model)
    weights = target_weights(enc)
    masks = {}
    for method in ("magnitude", "random", "wanda"):
        out = tmp_path / method
        assert main(["prune", "--model", model, "--method", method, "--sparsity", "0.3", "--out", str(out),
                     "--n_calib", "8", "--calib", str(SAMPLE / "calibration.jsonl")]) == 0
        tensors, meta = formats.read_mask(out)
        assert meta["kind"] == "unstructured" and meta["method"] == method
        assert set(tensors) == set(weights)
        total = sum(t.numel() for t in tensors.values())
        assert total - sum(int(t.sum()) for t in tensors.values()) == round(0.3 * total)
        assert (out / "sparsity_per_layer.png").is_file()
        masks[method] = tensors
    # magnitude prunes exactly the smallest |w|
    flat_w = torch.cat([w.detach().abs().flatten() for w in weights.values()])
    flat_m = torch.cat([masks["magnitude"][n].flatten() for n in weights])
    assert flat_w[~flat_m].max() <= flat_w[flat_m].min()
    assert not torch.equal(flat_m, torch.cat([masks["random"][n].flatten() for n in weights]))
    # fisher needs the dai statistics
    assert main(["prune", "--model", model, "--method", "fisher_dom", "--sparsity", "0.3",
                 "--out", str(tmp_path / "f")]) == 2


def test_fisher_and_dai_masks_follow_their_scores(tmp_path, tiny_dirs):
    from safetensors.torch import save_file

    from dsprune.importance.dai import STAT_FILES

    model = str(tiny_dirs["llama"])
    enc = Encoder.load(model)
    weights = target_weights(enc)
    g = torch.Generator().manual_seed(3)
    scores_dir = tmp_path / "dai"
    scores_dir.mkdir()
    fake = {}
    for stat in ("fisher_dom", "fisher_gen", "dai"):
        fake[stat] = {n: torch.rand(w.shape, generator=g) for n, w in weights.items()}
        save_file(fake[stat], str(scores_dir / STAT_FILES[stat]))
    for method in ("fisher_dom", "dai"):
        out = tmp_path / f"mask_{method}"
        assert main(["prune", "--model", model, "--method", method, "--sparsity", "0.5", "--scope", "layer",
                     "--scores", str(scores_dir), "--out", str(out)]) == 0
        tensors, _ = formats.read_mask(out)
        s = fake[method] if method == "dai" else {n: fake[method][n] * weights[n].detach().abs() for n in weights}
        assert all(torch.equal(tensors[n], m) for n, m in budget.keep_top(s, 0.5, "layer").items())


def test_unstructured_export_stores_zeros_and_reloads(tmp_path, tiny_dirs, texts):
    model = str(tiny_dirs["qwen2"])
    assert main(["prune", "--model", model, "--method", "magnitude", "--sparsity", "0.5",
                 "--out", str(tmp_path / "m")]) == 0
    assert main(["export", "--model", model, "--mask", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 0
    man = formats.read_manifest(tmp_path / "e")
    assert man["mask"]["zeros_on_disk"] is True and man["mask"]["kind"] == "unstructured"
    enc = Encoder.load(model)
    apply_mask_dir(enc, tmp_path / "m")
    re = Encoder.load(tmp_path / "e")
    tensors, _ = formats.read_mask(tmp_path / "m")
    w = dict(re.backbone.named_parameters())
    for n, m in tensors.items():
        assert (w[n][~m] == 0).all()
    assert torch.allclose(enc.encode(texts, show_progress=False), re.encode(texts, show_progress=False), atol=1e-5)


@pytest.mark.parametrize("family", ["llama", "bert"])
def test_structured_dai_export_is_smaller_and_equals_zeroed_neurons(tmp_path, tiny_dirs, texts, family):
    model = str(tiny_dirs[family])
    enc = Encoder.load(model)
    names = mlp_weight_names(enc)
    # structured DAI from a fake score file with negative entries
    from safetensors.torch import save_file

    from dsprune.importance.dai import STAT_FILES
    g = torch.Generator().manual_seed(5)
    d = tmp_path / "dai"
    d.mkdir()
    save_file({n: torch.randn(w.shape, generator=g) for n, w in target_weights(enc).items()},
              str(d / STAT_FILES["dai"]))
    assert main(["prune", "--model", model, "--method", "dai", "--structured", "--sparsity", "0.25",
                 "--scores", str(d), "--out", str(tmp_path / "m")]) == 0
    tensors, meta = formats.read_mask(tmp_path / "m")
    assert meta["kind"] == "structured" and set(tensors) == {formats.mlp_key(l) for l in names}
    total = sum(t.numel() for t in tensors.values())
    assert total - sum(int(t.sum()) for t in tensors.values()) == round(0.25 * total)
    # reference: the same neurons zeroed in place (down columns -> the neuron contributes nothing)
    ref = Encoder.load(model)
    params = dict(ref.backbone.named_parameters())
    with torch.no_grad():
        for l, (_, _, down) in names.items():
            params[down][:, ~tensors[formats.mlp_key(l)]] = 0
    assert main(["export", "--model", model, "--mask", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 0
    man = formats.read_manifest(tmp_path / "e")
    assert man["mask"]["zeros_on_disk"] is False
    assert man["params"]["after"] < man["params"]["before"]
    re = Encoder.load(tmp_path / "e")
    assert torch.allclose(ref.encode(texts, show_progress=False), re.encode(texts, show_progress=False), atol=1e-5)


def test_mask_file_mismatch_fails_cleanly(tmp_path, tiny_dirs):
    enc = tiny_encoder("llama")
    w = target_weights(enc)
    name = next(iter(w))
    from dsprune.errors import DsPruneError
    with pytest.raises(DsPruneError, match="shape"):
        apply_mask(enc, {name: torch.ones(3, 3, dtype=torch.bool)}, "unstructured")
    with pytest.raises(DsPruneError, match="not in this model"):
        apply_mask(enc, {"layers.9.mlp.up_proj.weight": torch.ones(3, dtype=torch.bool)}, "unstructured")
    with pytest.raises(DsPruneError, match="mlp.<layer>"):
        apply_mask(enc, {"neurons.0": torch.ones(3, dtype=torch.bool)}, "structured")


def test_mask_holder_survives_training_steps_and_lora_merge():
    from peft import LoraConfig, get_peft_model

    enc = tiny_encoder("llama", seed=4)
    w = target_weights(enc)
    masks = budget.keep_top({n: p.detach().abs() for n, p in w.items()}, 0.5)
    apply_mask(enc, masks, "unstructured")
    # full fine-tuning: an optimizer step un-zeroes weights, reapply puts the zeros back
    holder = MaskHolder(enc, masks)
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-2)
    b = enc.tokenize(["revenue grew by ten percent", "the cell membrane"], "passage")
    enc(b["input_ids"], b["attention_mask"]).sum().backward()
    opt.step()
    n0 = next(iter(masks))
    assert (w[n0][~masks[n0]] != 0).any()
    holder.reapply()
    assert all((w[n][~m] == 0).all() for n, m in masks.items())

    # LoRA: the delta is masked in the forward pass, and the merge keeps the zeros after reapply
    peft_model = get_peft_model(enc.model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                                      target_modules=["gate_proj", "up_proj", "down_proj"]))
    for n, p in peft_model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.5)
    lora_holder = MaskHolder(peft_model, masks)
    assert lora_holder.mask_lora() == len(masks)
    enc.model = peft_model
    enc.eval()
    x = torch.randn(2, 5, 64)
    layer = peft_model.base_model.model.layers[1].mlp.up_proj
    key = "layers.1.mlp.up_proj.weight"
    want = x @ ((layer.base_layer.weight + layer.get_delta_weight("default")) * masks[key]).T
    assert torch.allclose(layer(x), want, atol=1e-5)
    with torch.no_grad():
        hooked = enc(b["input_ids"], b["attention_mask"])
    merged = peft_model.merge_and_unload()
    lora_holder.remove_hooks()
    MaskHolder(merged, masks).reapply()
    enc.model = merged
    with torch.no_grad():
        after = enc(b["input_ids"], b["attention_mask"])
    assert torch.allclose(hooked, after, atol=1e-5)
    params = dict(merged.named_parameters())
    assert all((params[n][~m] == 0).all() for n, m in masks.items())


def test_wanda_norms_ignore_padding():
    from dsprune.importance.baselines import input_norms

    enc = tiny_encoder("llama")
    up = enc.backbone.layers[0].mlp.up_proj
    texts = ["revenue grew", "the cell membrane regulates transport of ions and proteins in the cell"]
    padded = input_norms(enc, {"u": up}, texts, batch_size=2)["u"]
    alone = input_norms(enc, {"u": up}, texts, batch_size=1)["u"]
    assert torch.allclose(padded, alone, rtol=1e-4)
