"""The one tokenisation and pooling definition, and Encoder save/load."""
import pytest
import torch

from dsprune.encoder import Encoder, EncoderConfig, pool
from dsprune.errors import DsPruneError
from dsprune.tiny import tiny_encoder


def test_prompts_and_eos_are_applied_once():
    enc = tiny_encoder("llama", query_prompt="query: ", passage_prompt="", append_eos=True)
    q = enc.tokenize(["cell membrane"], "query")
    p = enc.tokenize(["cell membrane"], "passage")
    eos = enc.tokenizer.eos_token_id
    assert q["input_ids"][0, -1].item() == eos and p["input_ids"][0, -1].item() == eos
    assert q["input_ids"].shape[1] > p["input_ids"].shape[1]
    expected = enc.tokenizer("query: cell membrane")["input_ids"] + [eos]
    assert q["input_ids"][0].tolist() == expected


def test_truncation_keeps_eos_within_max_length():
    enc = tiny_encoder("llama", append_eos=True, max_length=8)
    b = enc.tokenize(["revenue grew by ten percent in the fiscal year " * 5])
    assert b["input_ids"].shape[1] == 8 and b["input_ids"][0, -1].item() == enc.tokenizer.eos_token_id


@pytest.mark.parametrize("pooling", ["mean", "last", "cls"])
def test_left_and_right_padding_give_the_same_embeddings(pooling, texts):
    right = tiny_encoder("llama", pooling=pooling, padding_side="right")
    left = tiny_encoder("llama", pooling=pooling, padding_side="left")
    a, b = right.encode(texts, show_progress=False), left.encode(texts, show_progress=False)
    assert torch.allclose(a, b, atol=1e-5)


def test_batching_does_not_change_embeddings(texts):
    enc = tiny_encoder("qwen3")
    one = torch.cat([enc.encode([t], show_progress=False) for t in texts])
    assert torch.allclose(one, enc.encode(texts, batch_size=3, show_progress=False), atol=1e-5)


def test_pool_hand_computed():
    h = torch.arange(12.0).view(1, 4, 3)
    m = torch.tensor([[1, 1, 1, 0]])
    assert torch.allclose(pool(h, m, "mean"), h[0, :3].mean(0, keepdim=True))
    assert torch.equal(pool(h, m, "last"), h[:, 2])
    assert torch.equal(pool(h, torch.tensor([[0, 1, 1, 1]]), "cls"), h[:, 1])


def test_save_load_round_trip(tmp_path, texts):
    enc = tiny_encoder("gemma3_text", query_prompt="q: ", pooling="last", append_eos=True)
    enc.save(tmp_path / "m")
    back = Encoder.load(tmp_path / "m")
    assert back.config == enc.config
    assert torch.allclose(enc.encode(texts, "query", show_progress=False),
                          back.encode(texts, "query", show_progress=False), atol=1e-6)


def test_sentence_transformers_reads_the_same_embeddings(tiny_dirs, texts):
    from sentence_transformers import SentenceTransformer

    enc = Encoder.load(tiny_dirs["bert"])
    st = SentenceTransformer(str(tiny_dirs["bert"]), device="cpu")
    ours = enc.encode(texts, show_progress=False)
    theirs = torch.from_numpy(st.encode(texts))
    assert torch.allclose(ours, theirs, atol=1e-5)


def test_bad_encoder_options_are_named():
    with pytest.raises(DsPruneError, match="pooling"):
        EncoderConfig(pooling="max")
    with pytest.raises(DsPruneError, match="unknown encoder option"):
        EncoderConfig.from_dict({"poolng": "mean"})
    with pytest.raises(DsPruneError, match=r"encoder.dense\[0\] must have exactly the keys"):
        EncoderConfig(dense=[{"in_features": 4}])
    layer = {"in_features": 4, "out_features": 8, "bias": True, "activation_function": "torch.nn.Tanh"}
    with pytest.raises(DsPruneError, match=r"encoder.dense\[1\] takes 4 features, the layer before gives 8"):
        EncoderConfig(dense=[layer, layer])
    assert EncoderConfig(dense=[layer]).dense[0]["activation_function"] == "torch.nn.modules.activation.Tanh"


def test_missing_model_folder(tmp_path):
    with pytest.raises(DsPruneError, match="model not found"):
        Encoder.load(tmp_path / "nope")
