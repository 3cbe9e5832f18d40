"""The importance registry: every method by name, one lookup for prune, recipes and sweeps."""
import pytest
import torch

from dsprune.errors import DsPruneError
from dsprune.importance import baselines, methods
from dsprune.importance.dai import DaiParams
from dsprune.recipe import load_recipe
from dsprune.tune.sweep import Args, build


def test_units_and_names():
    assert methods.names("weight") == ("dai", "magnitude", "fisher_dom", "fisher_gen", "random", "wanda")
    assert methods.names("sublayer") == ("cosine",)
    assert methods.names("neuron") == ("gates",)
    assert all(methods.METHODS[n].needs_stats for n in ("dai", "fisher_dom", "fisher_gen"))


def test_unknown_or_wrong_unit_names_the_choices():
    with pytest.raises(DsPruneError, match="--method must be one of dai, magnitude, .*wanda, not 'cosine'"):
        methods.get("cosine", "weight")
    with pytest.raises(DsPruneError, match="not 'nope'"):
        methods.get("nope", "sublayer")


def test_weight_methods_match_their_implementations():
    g = torch.Generator().manual_seed(0)
    weights = {"layers.0.mlp.up_proj.weight": torch.randn(4, 3, generator=g)}
    ctx = methods.WeightContext(enc=None, weights=weights, seed=5)
    mag = methods.score_weights("magnitude", ctx)
    assert torch.equal(mag["layers.0.mlp.up_proj.weight"], weights["layers.0.mlp.up_proj.weight"].abs())
    rnd = methods.score_weights("random", ctx)
    assert torch.equal(rnd["layers.0.mlp.up_proj.weight"], baselines.random_scores(weights, 5)[
        "layers.0.mlp.up_proj.weight"])
    with pytest.raises(DsPruneError, match="--method fisher_dom needs --scores"):
        methods.score_weights("fisher_dom", ctx)


def test_gates_keep_z_so_ties_at_relu_zero_can_break_by_it():
    out = methods.get("gates", "neuron")({0: torch.tensor([-1.0, 0.5]), 2: torch.tensor([[2.0, -3.0]])})
    assert out[0].tolist() == [-1.0, 0.5] and out[2].tolist() == [2.0, -3.0]


def test_dai_params_check_names_the_option():
    assert DaiParams().check().alignment == "consistency"
    with pytest.raises(DsPruneError, match="--alignment must be one of consistency, sign, tensor"):
        DaiParams(alignment="cos").check()
    with pytest.raises(DsPruneError, match="--fisher_scale must be a number or 'balanced'"):
        DaiParams(fisher_scale="big").check()


def test_recipes_and_sweeps_check_method_names(tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("stages:\n  - name: prune\n    command: prune\n"
                 "    args: {model: M, method: magnitud, sparsity: 0.3}\n")
    with pytest.raises(DsPruneError, match="stage 'prune': method must be one of dai, magnitude"):
        load_recipe(p)
    p.write_text("stages:\n  - name: prune\n    command: prune\n    args: {model: M, method: '${m}', sparsity: 0.3}\n"
                 "params: {m: wanda}\n")
    assert load_recipe(p)[1][0].args["method"] == "wanda"
    stages = ("[{name: prune, command: prune, args: {model: M, method: dai, sparsity: 0.3}},"
              " {name: eval, command: eval, args: {model: M, task: [t=F]}}]")
    sweep = build(Args(stages=stages, space={"prune.method": {"choice": ["dai", "wanda"]}}))
    assert sweep.params[0].values == ("dai", "wanda")
    with pytest.raises(DsPruneError, match="space.prune.method: method must be one of"):
        build(Args(stages=stages, space={"prune.method": {"grid": ["dai", "cosine"]}}))
