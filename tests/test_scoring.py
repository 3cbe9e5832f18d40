"""EffiR scores read the right tensors: zeroed branches score 0, block scores match hidden states."""
import pytest
import torch

from dsprune import arch
from dsprune.importance.layer_cosine import score_layers
from dsprune.surgery.prune import drop_sublayers
from dsprune.tiny import FAMILIES, tiny_encoder

# families whose sub-layers add their output to the stream (BERT's post-LN blocks normalise the sum)
ADDITIVE = [f for f in FAMILIES if not arch.get(f).post_ln]


@pytest.mark.parametrize("family", ADDITIVE)
def test_zeroed_branch_scores_zero(family, texts):
    enc = tiny_encoder(family)
    block1, block2 = enc.arch.layers_of(enc.backbone)[1], enc.arch.layers_of(enc.backbone)[2]
    with torch.no_grad():
        block1.self_attn.o_proj.weight.zero_()
        _, _, down = enc.arch.mlp_projections(block2)
        down.weight.zero_()
    s = score_layers(enc, texts, show_progress=False)
    assert s["attn"][1] == pytest.approx(0.0, abs=1e-6)
    assert s["mlp"][2] == pytest.approx(0.0, abs=1e-6)
    assert min(s["attn"][i] for i in (0, 2, 3)) > 1e-4
    assert min(s["mlp"][i] for i in (0, 1, 3)) > 1e-5


@pytest.mark.parametrize("family", FAMILIES)
def test_block_score_equals_hand_computation_on_hidden_states(family, texts):
    enc = tiny_encoder(family)
    s = score_layers(enc, texts, show_progress=False)
    batch = enc.tokenize(texts)
    with torch.no_grad():
        hs = enc.backbone(**batch, output_hidden_states=True).hidden_states
    m = batch["attention_mask"].bool()
    n = len(enc.arch.layers_of(enc.backbone))
    for i in range(n - 1):  # the last entry of hidden_states may be after the final norm
        cos = torch.nn.functional.cosine_similarity(hs[i][m], hs[i + 1][m], dim=-1)
        assert s["block"][i] == pytest.approx(float((1 - cos).mean()), abs=1e-5)


def test_padding_is_excluded(texts):
    enc = tiny_encoder("llama")
    one = score_layers(enc, texts, batch_size=1, show_progress=False)
    batched = score_layers(enc, texts, batch_size=4, show_progress=False)
    for g in one:
        for i in one[g]:
            assert batched[g][i] == pytest.approx(one[g][i], abs=1e-5)


def test_bert_post_ln_dropped_sublayer_leaves_stream_unchanged(texts):
    enc = tiny_encoder("bert")
    drop_sublayers(enc, attn=[1], mlp=[2])
    s = score_layers(enc, texts, show_progress=False)
    assert 1 not in s["attn"] and 2 not in s["mlp"]
    batch = enc.tokenize(texts)
    with torch.no_grad():
        hs = enc.backbone(**batch, output_hidden_states=True).hidden_states
    # layer 1 now is MLP only, layer 2 attention only; a block with both dropped would be the identity
    assert not torch.allclose(hs[1], hs[2])


def test_scores_ignore_dropped_sublayers(texts):
    enc = tiny_encoder("qwen2")
    drop_sublayers(enc, attn=[0], mlp=[0, 3])
    s = score_layers(enc, texts, show_progress=False)
    assert sorted(s["attn"]) == [1, 2, 3] and sorted(s["mlp"]) == [1, 2]
    assert 0 not in s["block"] and 3 in s["block"]  # block 0 lost both sub-layers, block 3 only its MLP
