"""Sentence-transformers folders as input: Dense head, every named prompt, bidirectional attention, and one
clear error for whatever dsprune cannot carry.

The models are tiny sentence-transformers models assembled with sentence-transformers itself: a random
dsprune.tiny backbone, mean pooling, two random Dense layers (one with bias and Tanh, one without),
Normalize, and more named prompts than query and document.
"""
import json
import shutil
import warnings
from pathlib import Path

import pytest
import torch

from dsprune.encoder import Encoder, EncoderConfig
from dsprune.errors import DsPruneError
from dsprune.eval.mteb_model import named_prompt, query_prompt
from dsprune.packaged import model_path
from dsprune.tiny import tiny_encoder

PROMPTS = {"query": "q: ", "document": "d: ", "STS": "sts: ", "Retrieval-query": "rq: ",
           "Retrieval-document": "rd: ", "Classification": "cls: "}


def bidirectional_gemma3(seed: int = 0):
    """The tiny gemma3 encoder rebuilt with bidirectional attention (the flag acts when the config is made)."""
    from transformers import AutoConfig, AutoModel

    enc = tiny_encoder("gemma3_text", seed=seed, pooling="mean")
    cfg = enc.model.config.to_dict()
    cfg["use_bidirectional_attention"] = True
    torch.manual_seed(seed)
    enc.model = AutoModel.from_config(AutoConfig.for_model(**cfg)).eval()
    return enc


def st_model(root: Path, family: str = "llama", max_seq_length: int | None = 48) -> Path:
    """Save a tiny sentence-transformers model with a Dense head under ``root / 'st'``."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # newer releases moved sentence_transformers.models
        from sentence_transformers import SentenceTransformer, models

    enc = bidirectional_gemma3() if family == "gemma3_bidir" else tiny_encoder(family, pooling="mean")
    backbone = root / "backbone"
    enc.model.save_pretrained(backbone)
    enc.tokenizer.save_pretrained(backbone)
    torch.manual_seed(1)
    transformer = models.Transformer(str(backbone))
    if max_seq_length:
        transformer.max_seq_length = max_seq_length
    hidden = enc.model.config.hidden_size
    mods = [transformer, models.Pooling(hidden, "mean"),
            models.Dense(hidden, 96, bias=True, activation_function=torch.nn.Tanh()),
            models.Dense(96, 48, bias=False, activation_function=torch.nn.Identity()), models.Normalize()]
    SentenceTransformer(modules=mods, prompts=dict(PROMPTS), device="cpu").save(str(root / "st"))
    return root / "st"


# ---- loading ------------------------------------------------------------------------------------------

def _st(path):
    from sentence_transformers import SentenceTransformer
    return SentenceTransformer(str(path), device="cpu", trust_remote_code=True)


@pytest.fixture(scope="module")
def st_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return {f: st_model(root / f, f) for f in ("llama", "gemma3_bidir", "bert")}


@pytest.mark.parametrize("family", ["llama", "gemma3_bidir", "bert"])
def test_load_equals_sentence_transformers(st_dirs, family, texts):
    enc = Encoder.load(st_dirs[family])
    st = _st(st_dirs[family])
    assert enc.embedding_dim == 48 and len(enc.head) == 2
    assert enc.config.max_length == 48 and enc.config.normalize
    for kind, name in (("query", "query"), ("passage", "document")):
        ours = enc.encode(texts, kind, show_progress=False)
        theirs = torch.from_numpy(st.encode(texts, prompt_name=name))
        assert (ours - theirs).abs().max() <= 1e-5


def test_every_named_prompt_is_kept(st_dirs):
    cfg = Encoder.load(st_dirs["llama"]).config
    assert (cfg.query_prompt, cfg.passage_prompt) == ("q: ", "d: ")
    assert {"query": cfg.query_prompt, "document": cfg.passage_prompt, **cfg.prompts} == PROMPTS


def test_head_is_part_of_the_encoder(st_dirs, tmp_path, texts):
    enc = Encoder.load(st_dirs["llama"])
    names = {n for n, _ in enc.named_parameters()}
    assert {"head.0.linear.weight", "head.0.linear.bias", "head.1.linear.weight"} <= names
    enc.save(tmp_path / "m")
    back = Encoder.load(tmp_path / "m")
    assert back.config == enc.config
    assert torch.equal(back.head[0].linear.weight, enc.head[0].linear.weight)
    assert torch.allclose(back.encode(texts, show_progress=False), enc.encode(texts, show_progress=False), atol=1e-6)


def test_bidirectional_attention_is_kept(st_dirs, tmp_path):
    enc = Encoder.load(st_dirs["gemma3_bidir"])
    assert enc.backbone.config.use_bidirectional_attention
    ids = enc.tokenize(["dense retrieval encodes queries and passages"])["input_ids"]
    changed = ids.clone()
    changed[0, -1] = (changed[0, -1] + 7) % enc.tokenizer.vocab_size

    def first_token(model, x):
        with torch.no_grad():
            return model(input_ids=x, attention_mask=torch.ones_like(x)).last_hidden_state[0, 0]

    # the first token sees the last one only when attention runs both ways
    assert not torch.allclose(first_token(enc.model, ids), first_token(enc.model, changed))
    causal = tiny_encoder("gemma3_text", pooling="mean").model
    assert torch.allclose(first_token(causal, ids), first_token(causal, changed))


def test_explicit_config_takes_the_folders_head(st_dirs, texts):
    enc = Encoder.load(st_dirs["llama"], config={"pooling": "mean", "max_length": 48, "query_prompt": "q: "})
    assert enc.embedding_dim == 48
    ref = Encoder.load(st_dirs["llama"])
    assert torch.allclose(enc.encode(texts, "query", show_progress=False),
                          ref.encode(texts, "query", show_progress=False), atol=1e-6)


# ---- what dsprune cannot carry ---------------------------------------------------------------------------

def _edit(src, tmp_path, file, change):
    dst = tmp_path / "m"
    shutil.copytree(src, dst)
    doc = json.loads((dst / file).read_text())
    doc = change(doc) or doc
    (dst / file).write_text(json.dumps(doc))
    return dst


def _extra_module(mods):
    mods.insert(2, {"idx": 9, "name": "9", "path": "9_LayerNorm", "type": "sentence_transformers.models.LayerNorm"})


@pytest.mark.parametrize("file, change, message", [
    ("modules.json", _extra_module, r"modules.json: module '9' \(sentence_transformers.models.LayerNorm\)"),
    ("modules.json", lambda m: [m[0], m[1], m[4], m[2], m[3]], r"modules.json: modules .*Normalize -> Dense"),
    ("1_Pooling/config.json", lambda p: p.update(include_prompt=False), r"1_Pooling/config.json: include_prompt"),
    ("1_Pooling/config.json", lambda p: p.update(pooling_mode="max"), r"1_Pooling/config.json: pooling max"),
    ("2_Dense/config.json", lambda d: d.update(activation_function="mypackage.Swish"),
     r"2_Dense/config.json \(module '2'\): activation 'mypackage.Swish'"),
    ("3_Dense/config.json", lambda d: d.update(in_features=80), r"3_Dense/config.json.*takes 80 features"),
])
def test_what_dsprune_cannot_carry_is_an_error(st_dirs, tmp_path, file, change, message):
    bad = _edit(st_dirs["llama"], tmp_path, file, change)
    with pytest.raises(DsPruneError, match=message):
        Encoder.load(bad)


def test_dense_weights_that_do_not_fit(st_dirs, tmp_path):
    from safetensors.torch import save_file

    bad = tmp_path / "m"
    shutil.copytree(st_dirs["llama"], bad)
    save_file({"linear.weight": torch.zeros(48, 95)}, str(bad / "3_Dense" / "model.safetensors"))
    with pytest.raises(DsPruneError, match="3_Dense/model.safetensors: weights do not fit"):
        Encoder.load(bad)


# ---- prompts in mteb, models by short name ----------------------------------------------------------------

def test_mteb_picks_named_prompts_by_task_like_sentence_transformers(st_dirs):
    cfg = Encoder.load(st_dirs["llama"]).config
    assert query_prompt(cfg, "SciFact", None, "Retrieval") == "rq: "
    assert named_prompt(cfg, "SciFact", "Retrieval", "document") == "rd: "
    assert query_prompt(cfg, "STSBenchmark", None, "STS") == "sts: "
    assert query_prompt(cfg, "Banking77", None, "Classification") == "cls: "
    assert query_prompt(cfg, "Clustering", None, "Clustering") == "q: "
    # a model without named prompts keeps its prompt and instruction template
    plain = EncoderConfig(query_prompt="Instruct: {instruction}\nQuery: ")
    assert query_prompt(plain, "SciFact", "find", "Retrieval") == "Instruct: find\nQuery: "
    assert named_prompt(plain, "SciFact", "Retrieval", "document") is None


def test_short_model_name_resolves_under_models_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPRUNE_MODELS", str(tmp_path))
    with pytest.raises(DsPruneError, match=r"embeddinggemma-300m not found .*get-embeddinggemma.sh"):
        model_path("embeddinggemma-300m")
    (tmp_path / "embeddinggemma-300m").mkdir()
    (tmp_path / "embeddinggemma-300m" / "config.json").write_text("{}")
    assert model_path("embeddinggemma-300m") == str(tmp_path / "embeddinggemma-300m")
