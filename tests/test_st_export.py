"""Exports of a sentence-transformers model are again sentence-transformers models: every module, the Dense
weights and all named prompts, loading in a fresh process without dsprune and embedding like the pruned
Encoder in memory."""
import json

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.surgery.mask import apply_mask, target_weights
from dsprune.surgery.prune import drop_sublayers, export, slice_neurons

from conftest import TEXTS
from fresh_process import load_fresh
from test_st_load import PROMPTS, st_model

def assert_same_as_fresh(enc, seen, texts):
    """``seen``: what a fresh process without dsprune loaded from ``enc``'s export (fresh_process.load_fresh)."""
    assert seen["prompts"] == PROMPTS
    assert seen["max_seq_length"] == enc.config.max_length
    assert seen["modules"] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    for kind, name in (("query", "query"), ("passage", "document")):
        ref = enc.encode(texts, kind, show_progress=False)
        assert (torch.tensor(seen[name]) - ref).abs().max() <= 1e-5


@pytest.fixture(scope="module")
def st_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("st")
    return {f: st_model(root / f, f) for f in ("llama", "gemma3_bidir")}


def _drop(enc):
    drop_sublayers(enc, attn=[1], mlp=[2])


def _prune(enc):
    keep = torch.zeros(128, dtype=torch.bool)
    keep[::3] = True
    slice_neurons(enc, {0: keep, 3: ~keep})


def _mask(enc):
    g = torch.Generator().manual_seed(0)
    masks = {n: torch.rand(p.shape, generator=g) > 0.5 for n, p in target_weights(enc).items()}
    apply_mask(enc, masks, "unstructured")


EDITS = [("llama", _drop), ("llama", _prune), ("llama", _mask), ("gemma3_bidir", _drop)]


@pytest.fixture(scope="module")
def edited(st_dirs, tmp_path_factory):
    """(family, edit) -> (edited Encoder, its export folder, what a fresh process loaded from that folder)."""
    root = tmp_path_factory.mktemp("edited")
    done = {}
    for family, edit in EDITS:
        enc = Encoder.load(st_dirs[family])
        edit(enc)
        done[family, edit.__name__] = enc, export(enc, root / f"{family}{edit.__name__}")
    seen = load_fresh([out for _, out in done.values()], list(TEXTS), root)
    return {k: (enc, out, seen[out]) for k, (enc, out) in done.items()}


@pytest.mark.parametrize("family, edit", EDITS)
def test_export_is_a_sentence_transformers_model(edited, family, edit, texts):
    enc, out, seen = edited[family, edit.__name__]
    assert_same_as_fresh(enc, seen, texts)
    back = Encoder.load(out)
    assert back.config == enc.config
    assert torch.allclose(back.encode(texts, show_progress=False), enc.encode(texts, show_progress=False), atol=1e-5)
    if family == "gemma3_bidir":
        assert back.backbone.config.use_bidirectional_attention
        assert json.loads((out / "config.json").read_text())["base"]["use_bidirectional_attention"] is True


@pytest.mark.parametrize("family, edit", EDITS)
def test_an_export_loads_whole_in_bfloat16(edited, family, edit, texts):
    """The backbone as well as the Dense head, through dsprune's loader and through sentence-transformers'
    ``model_kwargs={"dtype": ...}`` in a process without dsprune: a dsprune export's own loader once kept its
    float32, whatever dtype it was asked for."""
    _, out, seen = edited[family, edit.__name__]
    bf16 = Encoder.load(out, dtype="bfloat16")
    assert {p.dtype for p in bf16.parameters()} == {torch.bfloat16}
    ref = Encoder.load(out).encode(texts, "passage", show_progress=False)
    got = bf16.encode(texts, "passage", show_progress=False).float()
    assert torch.nn.functional.cosine_similarity(got, ref).min() > 0.98
    assert seen["bf16_dtypes"] == ["torch.bfloat16"]
    assert torch.nn.functional.cosine_similarity(torch.tensor(seen["bf16_document"]), ref).min() > 0.98


def test_commands_on_a_sentence_transformers_model(st_dirs, tmp_path, texts):
    """score -> drop, prune --structured -> export --mask, and mask (from gates) -> export --mask."""
    from dsprune.surgery.gates import save_gates

    model = str(st_dirs["llama"])
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 3))
    assert main(["score", "--model", model, "--calib", str(calib), "--out", str(tmp_path / "s")]) == 0
    assert main(["drop", "--model", model, "--scores", str(tmp_path / "s"), "--drop-mlp", "1",
                 "--out", str(tmp_path / "d")]) == 0
    assert main(["prune", "--model", model, "--method", "magnitude", "--structured", "--sparsity", "0.25",
                 "--out", str(tmp_path / "m")]) == 0
    assert main(["export", "--model", model, "--mask", str(tmp_path / "m"), "--out", str(tmp_path / "e")]) == 0
    g = torch.Generator().manual_seed(0)
    save_gates(tmp_path / "gates.safetensors", {i: torch.rand(128, generator=g) for i in range(4)}, 4, "llama")
    assert main(["mask", "--gates", str(tmp_path / "gates.safetensors"), "--ratio", "0.3",
                 "--out", str(tmp_path / "gm")]) == 0
    assert main(["export", "--model", model, "--mask", str(tmp_path / "gm"), "--out", str(tmp_path / "ge")]) == 0
    outs = [tmp_path / out for out in ("d", "e", "ge")]
    seen = load_fresh(outs, texts, tmp_path)
    for out in outs:
        enc = Encoder.load(out)
        assert enc.embedding_dim == 48 and enc.config.prompts == Encoder.load(model).config.prompts
        assert_same_as_fresh(enc, seen[out], texts)
