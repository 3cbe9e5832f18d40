"""A pruned export is really smaller, loads without dsprune, and embeds exactly like the in-memory model."""
import json

import pytest
import torch
from safetensors import safe_open

from dsprune import arch
from dsprune.encoder import Encoder
from dsprune.surgery.prune import drop_sublayers, export, slice_neurons
from dsprune.tiny import FAMILIES, tiny_encoder

from conftest import TEXTS
from fresh_process import load_fresh

FRESH_FAMILIES = ["llama", "gemma3_text", "olmo2", "bert"]


def _pruned(family):
    enc = tiny_encoder(family)
    drop_sublayers(enc, attn=[1], mlp=[2])
    keep = torch.zeros(128, dtype=torch.bool)
    keep[::3] = True
    slice_neurons(enc, {0: keep})
    return enc


@pytest.mark.parametrize("family", FAMILIES)
def test_export_round_trip(family, tmp_path, texts):
    enc = _pruned(family)
    ref = enc.encode(texts, show_progress=False)
    out = export(enc, tmp_path / "exp")
    back = Encoder.load(out)
    got = back.encode(texts, show_progress=False)
    assert ((got - ref).norm() / ref.norm()) <= 1e-5
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["drop_attn"] == [1] and cfg["drop_mlp"] == [2]
    assert cfg["intermediate_sizes"][0] == 43 and cfg["intermediate_sizes"][2] is None
    assert {"AutoModel", "AutoConfig"} <= set(cfg["auto_map"])
    spec = arch.get(family)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        up = next(k for k in keys if k.endswith(f"{spec.layers}.0.{spec.up}.weight"))
        assert f.get_tensor(up).shape[0] == 43
    assert not any(f"{spec.layers}.2.{part}." in k for k in keys for part in spec.mlp_parts)


@pytest.fixture(scope="module")
def fresh_exports(tmp_path_factory):
    """family -> (in-memory pruned encoder, what a fresh process without dsprune loaded from its export)."""
    root = tmp_path_factory.mktemp("fresh")
    encs = {f: _pruned(f) for f in FRESH_FAMILIES}
    outs = {f: export(enc, root / f) for f, enc in encs.items()}
    seen = load_fresh(list(outs.values()), list(TEXTS), root)
    return {f: (encs[f], seen[outs[f]]) for f in encs}


@pytest.mark.parametrize("family", FRESH_FAMILIES)
def test_fresh_process_loads_export_without_dsprune(family, fresh_exports, texts):
    enc, seen = fresh_exports[family]
    ref = enc.encode(texts, show_progress=False)
    assert seen["n_params"] == sum(p.numel() for p in enc.model.parameters())
    got = torch.tensor(seen["plain"])
    assert ((got - ref).norm() / ref.norm()) <= 1e-5


def test_existing_output_is_refused_and_left_untouched(tmp_path):
    from dsprune.errors import DsPruneError

    enc = _pruned("llama")
    out = tmp_path / "exp"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DsPruneError, match="exists"):
        export(enc, out)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_failed_export_leaves_nothing(tmp_path, monkeypatch):
    enc = _pruned("llama")

    def boom(folder):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        export(enc, tmp_path / "exp", write_extra=boom)
    assert list(tmp_path.iterdir()) == []
