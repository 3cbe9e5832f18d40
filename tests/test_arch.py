"""dsprune.arch: every family's spec matches its real model, and nothing else keeps family knowledge."""
import json

import pytest
import torch
from torch import nn

from dsprune import arch
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.surgery import modeling_dsprune as md
from dsprune.surgery.prune import drop_sublayers, export
from dsprune.tiny import FAMILIES, tiny_encoder


def test_the_test_matrix_covers_every_family():
    assert sorted(FAMILIES) == sorted(arch.FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_spec_paths_resolve_on_the_real_model(family):
    spec = arch.get(family)
    enc = tiny_encoder(family)
    assert enc.family == family and enc.arch is spec
    layers = spec.layers_of(enc.backbone)
    assert isinstance(layers, nn.ModuleList) and len(layers) == 4
    block = layers[0]
    for path in (spec.attn, *spec.attn_norms, *spec.mlp_parts, *spec.mlp_norms, spec.mid[0], spec.activation):
        assert isinstance(md.get_module(block, path), nn.Module), path
    assert spec.mid[1] in ("input", "output")
    gate, up, down = spec.mlp_projections(block)
    assert (gate is None) == (spec.gate is None)
    assert up.out_features == down.in_features == 128 and up.in_features == down.out_features == 64
    assert json.loads(json.dumps(spec.layout)) == spec.layout  # plain data, as an export's config stores it


@pytest.mark.parametrize("family", FAMILIES)
def test_causal_flag_matches_the_attention(family):
    """Changing the last token changes the earlier tokens' states only under bidirectional attention."""
    enc = tiny_encoder(family)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    other = ids.clone()
    other[0, -1] = 10
    mask = torch.ones_like(ids)
    with torch.no_grad():
        a = enc.backbone(input_ids=ids, attention_mask=mask).last_hidden_state[0, :-1]
        b = enc.backbone(input_ids=other, attention_mask=mask).last_hidden_state[0, :-1]
    assert torch.allclose(a, b, atol=1e-6) == arch.get(family).causal


def test_family_of_aliases_and_refusals():
    from transformers import AutoConfig

    assert arch.family_of(AutoConfig.for_model("gemma3")) == "gemma3_text"
    with pytest.raises(DsPruneError, match="unsupported model_type 'gpt2'.*bert.*llama.*olmo2"):
        arch.family_of(AutoConfig.for_model("gpt2"))
    with pytest.raises(DsPruneError, match="unknown model family 'gpt2'"):
        arch.get("gpt2")


def test_layer_of_reads_each_family_pattern():
    assert arch.layer_of("layers.7.mlp.up_proj.weight") == 7
    assert arch.layer_of("base_model.model.layers.12.self_attn.q_proj.weight") == 12
    assert arch.layer_of("encoder.layer.3.output.dense.weight") == 3
    assert arch.layer_of("encoder.layer.3.output.dense.weight", "bert") == 3
    with pytest.raises(DsPruneError, match="cannot tell the layer"):
        arch.layer_of("encoder.layer.3.output.dense.weight", "llama")
    with pytest.raises(DsPruneError, match="cannot tell the layer"):
        arch.layer_of("embed_tokens.weight")


def test_export_config_carries_the_layout_and_load_leaves_the_auto_registry_alone(tmp_path, texts):
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    enc = tiny_encoder("olmo2")
    drop_sublayers(enc, attn=[0], mlp=[3])
    ref = enc.encode(texts, show_progress=False)
    out = export(enc, tmp_path / "exp")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["layout"] == arch.get("olmo2").layout
    back = Encoder.load(out)
    assert "dsprune" not in CONFIG_MAPPING
    assert torch.allclose(back.encode(texts, show_progress=False), ref, atol=1e-6)


def test_export_without_layout_loads_with_the_layout_from_arch(tmp_path, texts):
    """Exports written before the layout was stored in their config still load."""
    enc = tiny_encoder("bert")
    drop_sublayers(enc, mlp=[1])
    ref = enc.encode(texts, show_progress=False)
    out = export(enc, tmp_path / "exp")
    cfg = json.loads((out / "config.json").read_text())
    del cfg["layout"]
    (out / "config.json").write_text(json.dumps(cfg))
    back = Encoder.load(out)
    assert back.model.config.layout == arch.get("bert").layout
    assert torch.allclose(back.encode(texts, show_progress=False), ref, atol=1e-6)


def test_modeling_dsprune_names_no_family():
    """The exported model file reads the layout from its config: it keeps no table of families."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(md))
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    names = set(arch.FAMILIES) | {a for f in arch.FAMILIES.values() for a in f.aliases}
    assert not strings & names
    imported = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            imported |= {a.name.split(".")[0] for a in n.names}
        elif isinstance(n, ast.ImportFrom):
            imported.add(n.module.split(".")[0])
    assert imported <= {"__future__", "copy", "torch", "transformers"}
