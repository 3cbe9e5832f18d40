"""`dsprune plan`: the chosen drops and slimming reach the FLOP target on the really pruned model, at the least
predicted cost, with protected layers kept; bad targets fail with one clear line; plan -> drop round trip."""
import json
import random

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.eval.speed import flops_per_token, shape_of
from dsprune.importance import slim
from dsprune.importance.plan import SpeedRequest, plan_speedup
from dsprune.recipe import run_recipe
from dsprune.surgery.prune import drop_sublayers, intermediate_sizes, slice_neurons
from dsprune.tiny import tiny_encoder

LAYERS = 6


def _scores(seed=0, n=LAYERS):
    rng = random.Random(seed)
    return {g: {i: rng.random() for i in range(n)} for g in ("attn", "mlp", "block")}


def _total(enc, seq_len):
    return flops_per_token(enc, seq_len)["total"]


@pytest.mark.parametrize("family,target", [("llama", 1.5), ("gemma3_text", 2.0), ("bert", 2.5)])
def test_plan_reaches_its_target_on_the_pruned_model(family, target):
    enc = tiny_encoder(family, layers=LAYERS)
    before = _total(enc, 48)
    plan = plan_speedup(_scores(), shape_of(enc), SpeedRequest(target, seq_len=48, protect=1))
    c = plan.chosen
    assert c.flop_ratio >= target and c.attn == len(plan.drop.attn) and c.mlp == len(plan.drop.mlp)
    drop_sublayers(enc, plan.drop.attn, plan.drop.mlp)
    if c.slim:   # what `dsprune mask --ratio` does: the weakest round(r·N) neurons of all kept MLPs go
        torch.manual_seed(0)
        kept = {i: torch.rand(w) for i, w in enumerate(intermediate_sizes(enc)) if w is not None}
        slice_neurons(enc, slim.global_mask(kept, c.slim))
    measured = before / _total(enc, 48)
    assert measured == pytest.approx(c.flop_ratio, rel=5e-3) and measured >= target * (1 - 5e-3)
    assert plan.flops["before"] == before


def test_cheapest_reaching_candidate_wins():
    enc = tiny_encoder("llama", layers=LAYERS)
    plan = plan_speedup(_scores(1), shape_of(enc), SpeedRequest(1.8, seq_len=32))
    reaching = [c for c in plan.front if c.flop_ratio >= 1.8]
    assert plan.chosen in plan.front and plan.chosen.cost == min(c.cost for c in reaching)
    costs = [c.cost for c in plan.front]
    ratios = [c.flop_ratio for c in plan.front]
    assert costs == sorted(costs) and ratios == sorted(ratios)   # the front: paying more buys speed
    # the dropped sub-layers are each group's least important
    s = _scores(1)
    for g, chosen in (("attn", plan.drop.attn), ("mlp", plan.drop.mlp)):
        assert sorted(chosen) == sorted(sorted(s[g], key=s[g].get)[:len(chosen)])


def test_ties_go_to_fewer_drops():
    enc = tiny_encoder("llama", layers=LAYERS)
    zero = {g: {i: 0.0 for i in range(LAYERS)} for g in ("attn", "mlp", "block")}
    plan = plan_speedup(zero, shape_of(enc), SpeedRequest(1.2, seq_len=32, slim_weight=0.0))
    assert plan.chosen.attn == plan.chosen.mlp == 0 and plan.drop.attn == plan.drop.mlp == []
    # and the least slimming that reaches it: one grid step less does not, even with no drops allowed
    assert plan.chosen.slim > 0
    with pytest.raises(DsPruneError, match="out of reach"):
        plan_speedup(zero, shape_of(enc), SpeedRequest(1.2, seq_len=32, groups=(), slim_weight=0.0,
                                                        max_slim=plan.chosen.slim - 0.05))


def test_protect_and_groups_are_honoured():
    enc = tiny_encoder("qwen2", layers=LAYERS)
    s = _scores(2)
    s["attn"][0] = s["mlp"][0] = s["attn"][1] = s["mlp"][1] = 0.0   # the cheapest, were they not protected
    plan = plan_speedup(s, shape_of(enc), SpeedRequest(2.0, seq_len=32, protect=2, max_slim=0))
    assert plan.drop.attn + plan.drop.mlp and min(plan.drop.attn + plan.drop.mlp) >= 2
    listed = plan_speedup(s, shape_of(enc), SpeedRequest(2.0, seq_len=32, protect="0,1", max_slim=0))
    assert listed.drop.attn == plan.drop.attn and listed.drop.mlp == plan.drop.mlp
    tail = plan_speedup(s, shape_of(enc), SpeedRequest(1.2, seq_len=32, protect=(LAYERS - 1,), max_slim=0))
    assert LAYERS - 1 not in tail.drop.attn + tail.drop.mlp
    with pytest.raises(DsPruneError, match=r"no top block may be dropped \(protecting layer\(s\) 5 of 6\)"):
        plan_speedup(s, shape_of(enc), SpeedRequest(1.2, seq_len=32, order="last", protect="5,"))
    only_mlp = plan_speedup(s, shape_of(enc), SpeedRequest(1.5, seq_len=32, groups=("mlp",)))
    assert only_mlp.drop.attn == [] and only_mlp.chosen.attn == 0


def test_last_order_takes_the_fewest_top_blocks():
    enc = tiny_encoder("llama", layers=LAYERS)
    before = _total(enc, 32)
    plan = plan_speedup(_scores(3), shape_of(enc), SpeedRequest(1.9, seq_len=32, order="last"))
    k = len(plan.drop.mlp)
    assert plan.drop.attn == plan.drop.mlp == list(range(LAYERS - k, LAYERS)) and plan.chosen.slim == 0
    drop_sublayers(enc, plan.drop.attn, plan.drop.mlp)
    assert before / _total(enc, 32) == pytest.approx(plan.chosen.flop_ratio, rel=5e-3)
    assert plan.chosen.flop_ratio >= 1.9
    assert plan.front[-2].flop_ratio < 1.9     # one block fewer does not reach it
    with pytest.raises(DsPruneError, match="out of reach by dropping the last blocks"):
        plan_speedup(_scores(3), shape_of(tiny_encoder("llama", layers=LAYERS)),
                     SpeedRequest(4.0, seq_len=32, order="last", protect=4))


@pytest.mark.parametrize("req,msg", [
    (SpeedRequest(2.0, order="first"), "order must be one of importance, last"),
    (SpeedRequest(1.0), "above 1"), (SpeedRequest(0.5), "above 1"), (SpeedRequest(float("nan")), "above 1"),
    (SpeedRequest(50.0), r"50.0x is out of reach: the best is \d+\.\d+x"),
    (SpeedRequest(3.0, protect=5, max_slim=0), "out of reach with the first 5 layers protected"),
    (SpeedRequest(2.0, protect=7), "protect 7 is larger than the 6 layers"),
    (SpeedRequest(2.0, protect="1,6"), "protect: layer 6 is out of range for the 6-layer model"),
    (SpeedRequest(2.0, protect="x"), "protect must be K"),
    (SpeedRequest(2.0, groups=("block",)), "unknown group"), (SpeedRequest(2.0, max_slim=1.0), "max_slim"),
    (SpeedRequest(2.0, slim=1.0), r"slim_ratio must be in \[0, 1\)"),
    (SpeedRequest(2.0, slim=-0.1), r"slim_ratio must be in \[0, 1\)"),
    (SpeedRequest(2.0, slim=0.3, order="last"), "drop-last-k order does not slim"),
])
def test_bad_requests(req, msg):
    with pytest.raises(DsPruneError, match=msg):
        plan_speedup(_scores(), shape_of(tiny_encoder("llama", layers=LAYERS)), req)


def test_fixed_slim_ratio_trades_drops_for_slimming():
    """EffiR Table 3's pair: at one target, a fixed slimming ratio leaves fewer drops than the free plan,
    and the slimmed model still reaches the target."""
    enc = tiny_encoder("llama", layers=LAYERS)
    free = plan_speedup(_scores(2), shape_of(enc), SpeedRequest(1.6, seq_len=32, max_slim=0))
    coarse = plan_speedup(_scores(2), shape_of(enc), SpeedRequest(1.6, seq_len=32, slim=0.5))
    assert coarse.chosen.slim == 0.5 and {c.slim for c in coarse.front} == {0.5}
    assert coarse.chosen.flop_ratio >= 1.6
    assert coarse.chosen.attn + coarse.chosen.mlp < free.chosen.attn + free.chosen.mlp
    assert coarse.to_json()["policy"]["slim"] == 0.5 and coarse.to_json()["slim_ratio"] == 0.5


def test_plan_then_drop_from_the_command_line(tiny_dirs, tmp_path, texts, capsys):
    model = str(tiny_dirs["llama"])
    calib = tmp_path / "c.txt"
    calib.write_text("\n".join(texts * 3))
    out = tmp_path / "plan"
    assert main(["plan", "--model", model, "--calib", str(calib), "--target-speedup", "1.6", "--protect", "1",
                 "--max-slim", "0", "--seq-len", "64", "--out", str(out)]) == 0
    assert "<- plan" in capsys.readouterr().out
    doc = json.loads((out / "plan.json").read_text())
    assert (out / "scores.json").is_file() and doc["flop_ratio"] >= 1.6 and doc["slim_ratio"] == 0
    assert min(doc["attn"] + doc["mlp"]) >= 1 and doc["candidates"]
    assert main(["drop", "--model", model, "--plan", str(out), "--out", str(tmp_path / "d")]) == 0
    man = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert man["structure"]["drop_attn"] == doc["attn"] and man["structure"]["drop_mlp"] == doc["mlp"]
    dropped = Encoder.load(tmp_path / "d")
    ratio = _total(Encoder.load(model), 64) / _total(dropped, 64)
    assert ratio == pytest.approx(doc["flop_ratio"])
    # the plan's scores serve another plan; counts beside --plan, or a plan inside --protect, are refused
    assert main(["plan", "--model", model, "--scores", str(out), "--target-speedup", "1.3",
                 "--out", str(tmp_path / "p2")]) == 0
    assert main(["drop", "--model", model, "--plan", str(out), "--drop-mlp", "1", "--out", str(tmp_path / "x")]) == 2
    assert "--plan chooses the sub-layers itself" in capsys.readouterr().err
    assert main(["drop", "--model", model, "--plan", str(out), "--protect", "4", "--out", str(tmp_path / "x")]) == 2
    assert "inside --protect 4" in capsys.readouterr().err and not (tmp_path / "x").exists()


@pytest.mark.parametrize("argv,msg", [
    (["--scores", "nowhere", "--target-speedup", "2"], "scores file not found: nowhere"),
    (["--target-speedup", "1"], "target_speedup must be a number above 1"),
    (["--scores", "SCORES", "--target-speedup", "99"], "out of reach"),
    (["--scores", "SCORES", "--target-speedup", "1.1", "--protect", "5"], "protect 5 is larger than the 4 layers"),
    (["--scores", "SCORES30", "--target-speedup", "2"], "scores are for a 30-layer model"),
    (["--scores", "SCORES", "--target-speedup", "2", "--drop-groups", "none", "--max-slim", "0.2"], "out of reach"),
])
def test_plan_command_errors(tiny_dirs, tmp_path, capsys, argv, msg):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"scores": _scores(n=4), "order": {}, "num_layers": 4}))
    (tmp_path / "s30.json").write_text(json.dumps({"scores": _scores(n=4), "order": {}, "num_layers": 30}))
    argv = [{"SCORES": str(scores), "SCORES30": str(tmp_path / "s30.json")}.get(a, a) for a in argv]
    assert main(["plan", "--model", str(tiny_dirs["llama"]), *argv, "--out", str(tmp_path / "p")]) == 2
    assert msg in capsys.readouterr().err and not (tmp_path / "p").exists()


def test_recipe_plan_then_drop(tiny_dirs, tmp_path):
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"scores": _scores(n=4), "order": {}, "num_layers": 4}))
    recipe = {"path": "speed.yaml", "params": {"target_speedup": 1.5},
              "stages": [{"name": "plan", "command": "plan",
                          "args": {"model": str(tiny_dirs["llama"]), "scores": str(scores),
                                   "target_speedup": "${target_speedup}", "max_slim": 0}},
                         {"name": "drop", "command": "drop",
                          "args": {"model": str(tiny_dirs["llama"]), "plan": "${plan}"}}]}
    report = run_recipe(recipe, out=str(tmp_path / "r"), params={"target_speedup": 2.0},
                        execute=lambda cmd, folder: main(cmd[3:]))
    doc = json.loads((tmp_path / "r" / "plan" / "plan.json").read_text())
    man = json.loads((tmp_path / "r" / "drop" / "manifest.json").read_text())
    assert doc["target_speedup"] == 2.0 and doc["flop_ratio"] >= 2.0
    assert man["structure"]["drop_mlp"] == doc["mlp"] and report["drop"]["status"] == "ran"


def test_mask_takes_its_ratio_from_the_plan(tmp_path, capsys):
    import torch

    from dsprune.surgery.gates import save_gates

    torch.manual_seed(0)
    gates = tmp_path / "gates.safetensors"
    save_gates(gates, {i: torch.rand(32) for i in range(4)}, num_layers=4, family="llama")
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"attn": [], "mlp": [1], "num_layers": 4, "slim_ratio": 0.25}))
    assert main(["mask", "--gates", str(gates), "--plan", str(plan), "--out", str(tmp_path / "m")]) == 0
    man = json.loads((tmp_path / "m" / "manifest.json").read_text())
    assert man["figures"]["removed"] == 32 and man["config"]["ratio"] == 0.25
    assert main(["mask", "--gates", str(gates), "--plan", str(plan), "--ratio", "0.1",
                 "--out", str(tmp_path / "x")]) == 2
    assert "exactly one of --ratio and --plan" in capsys.readouterr().err and not (tmp_path / "x").exists()
