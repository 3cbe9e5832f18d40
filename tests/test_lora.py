"""LoRA attach/merge on plain and pruned models: merging changes nothing the encoder computes."""
import pytest
import torch

from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.surgery.prune import drop_sublayers, export, slice_neurons, structure
from dsprune.tiny import tiny_encoder
from dsprune.train import lora

TEXTS = ["gene expression during development", "bond prices and interest rates", "aspirin"]


def _perturb_adapters(enc, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in enc.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_only_adapters_train_and_merge_preserves_embeddings():
    enc = tiny_encoder("llama")
    before = enc.encode(TEXTS, show_progress=False)
    kind = type(enc.model)
    lora.attach(enc, r=4, alpha=8)
    trainable = [n for n, p in enc.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert {n.split(".")[-4] for n in trainable if "lora_A" in n} >= {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                        "gate_proj", "up_proj", "down_proj"}
    assert torch.allclose(enc.encode(TEXTS, show_progress=False), before, atol=1e-6)  # B = 0 at start
    _perturb_adapters(enc)
    adapted = enc.encode(TEXTS, show_progress=False)
    assert not torch.allclose(adapted, before, atol=1e-4)
    lora.merge(enc)
    assert type(enc.model) is kind and not any("lora" in n for n, _ in enc.named_parameters())
    assert torch.allclose(enc.encode(TEXTS, show_progress=False), adapted, atol=1e-5)


def test_pruned_model_keeps_structure_through_lora_and_export(tmp_path):
    enc = tiny_encoder("qwen3")
    drop_sublayers(enc, attn=[1], mlp=[2])
    slice_neurons(enc, {0: torch.arange(128) % 3 != 0})
    shape = structure(enc)
    lora.attach(enc, r=4, alpha=8)
    _perturb_adapters(enc, seed=1)
    adapted = enc.encode(TEXTS, "query", show_progress=False)
    lora.merge(enc)
    assert structure(enc) == shape
    export(enc, tmp_path / "m")
    loaded = Encoder.load(tmp_path / "m")
    assert structure(loaded) == shape and shape["intermediate_sizes"][0] == 85
    assert torch.allclose(loaded.encode(TEXTS, "query", show_progress=False), adapted, atol=1e-5)


def test_lora_errors():
    enc = tiny_encoder("llama")
    with pytest.raises(DsPruneError, match="lora_targets .*query_key"):
        lora.attach(enc, targets="q_proj,query_key")
    with pytest.raises(DsPruneError, match="no LoRA adapters"):
        lora.merge(enc)
