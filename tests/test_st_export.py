"""Exports of a sentence-transformers model are again sentence-transformers models: every module, the Dense
weights and all named prompts, loading in a fresh process without dsprune and embedding like the pruned
Encoder in memory."""
import json
import subprocess
import sys

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.surgery.mask import apply_mask, target_weights
from dsprune.surgery.prune import drop_sublayers, export, slice_neurons

from test_st_load import PROMPTS, st_model

FRESH = r"""
import sys, json
from sentence_transformers import SentenceTransformer
st = SentenceTransformer(sys.argv[1], trust_remote_code=True, device="cpu")
texts = json.loads(sys.argv[2])
out = {"prompts": st.prompts, "max_seq_length": st.max_seq_length,
       "modules": [type(m).__name__ for m in st],
       "query": st.encode(texts, prompt_name="query").tolist(),
       "document": st.encode(texts, prompt_name="document").tolist()}
assert not any(k.startswith("dsprune") for k in sys.modules), "dsprune was imported"
print("RESULT " + json.dumps(out))
"""


def fresh(path, texts, tmp_path) -> dict:
    r = subprocess.run([sys.executable, "-c", FRESH, str(path), json.dumps(texts)], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.split("RESULT ")[-1].strip())


def assert_same_as_fresh(enc, out, texts, tmp_path):
    got = fresh(out, texts, tmp_path)
    assert got["prompts"] == PROMPTS
    assert got["max_seq_length"] == enc.config.max_length
    assert got["modules"] == ["Transformer", "Pooling", "Dense", "Dense", "Normalize"]
    for kind, name in (("query", "query"), ("passage", "document")):
        ref = enc.encode(texts, kind, show_progress=False)
        assert (torch.tensor(got[name]) - ref).abs().max() <= 1e-5


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


@pytest.mark.parametrize("family, edit", [("llama", _drop), ("llama", _prune), ("llama", _mask),
                                          ("gemma3_bidir", _drop)])
def test_export_is_a_sentence_transformers_model(st_dirs, family, edit, tmp_path, texts):
    enc = Encoder.load(st_dirs[family])
    edit(enc)
    out = export(enc, tmp_path / "exp")
    assert_same_as_fresh(enc, out, texts, tmp_path)
    back = Encoder.load(out)
    assert back.config == enc.config
    assert torch.allclose(back.encode(texts, show_progress=False), enc.encode(texts, show_progress=False), atol=1e-5)
    if family == "gemma3_bidir":
        assert back.backbone.config.use_bidirectional_attention
        assert json.loads((out / "config.json").read_text())["base"]["use_bidirectional_attention"] is True


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
    for out in ("d", "e", "ge"):
        enc = Encoder.load(tmp_path / out)
        assert enc.embedding_dim == 48 and enc.config.prompts == Encoder.load(model).config.prompts
        assert_same_as_fresh(enc, tmp_path / out, texts, tmp_path)
