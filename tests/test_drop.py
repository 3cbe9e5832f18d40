"""Drop plans and surgery: exactly the chosen sub-layers go, impossible requests fail with the option named."""
import pytest

from dsprune import arch
from dsprune.errors import DsPruneError
from dsprune.importance.drop_plan import DropRequest, plan_iterative, plan_one_shot, protect_spec
from dsprune.importance.layer_cosine import score_layers
from dsprune.surgery.prune import count_params, drop_sublayers, structure
from dsprune.tiny import FAMILIES, tiny_encoder

SCORES = {"attn": {0: 0.5, 1: 0.1, 2: 0.3, 3: 0.2}, "mlp": {0: 0.4, 1: 0.05, 2: 0.02, 3: 0.3},
          "block": {0: 0.9, 1: 0.15, 2: 0.35, 3: 0.5}}


def test_one_shot_takes_least_important_first():
    plan = plan_one_shot(SCORES, 4, DropRequest(mlp=2, attn=1))
    assert plan.mlp == [1, 2] and plan.attn == [1]
    assert [s["layer"] for s in plan.steps] == [1, 2, 1]


def test_blocks_then_sublayers_never_twice():
    plan = plan_one_shot(SCORES, 4, DropRequest(blocks=1, mlp=1, attn=1))
    assert plan.attn == [1, 3] and plan.mlp == [1, 2]


def test_drop_last():
    plan = plan_one_shot(SCORES, 4, DropRequest(last=2))
    assert plan.attn == [2, 3] and plan.mlp == [2, 3]


@pytest.mark.parametrize("req,field", [(DropRequest(mlp=5), "drop_mlp"), (DropRequest(attn=9), "drop_attn"),
                                       (DropRequest(blocks=5), "drop_blocks"), (DropRequest(mlp=-1), "drop_mlp"),
                                       (DropRequest(blocks=2, mlp=3), "drop_mlp"), (DropRequest(), "nothing")])
def test_impossible_requests_name_the_option(req, field):
    with pytest.raises(DsPruneError, match=field):
        plan_one_shot(SCORES, 4, req)


def test_already_dropped_layers_count_against_the_budget():
    with pytest.raises(DsPruneError, match="drop_mlp 3 is larger than the 2"):
        plan_one_shot(SCORES, 4, DropRequest(mlp=3), gone_mlp={0, 3})


@pytest.mark.parametrize("family", FAMILIES)
def test_surgery_removes_exactly_the_chosen_weights(family):
    enc = tiny_encoder(family)
    before = set(enc.backbone.state_dict())
    p0 = count_params(enc.model)
    drop_sublayers(enc, attn=[1], mlp=[2])
    after = set(enc.backbone.state_dict())
    gone = before - after
    assert gone and not (after - before)
    spec = arch.get(family)
    allowed = tuple(f"{spec.layers}.1.{name}." for name in (spec.attn, *spec.attn_norms)) + \
        tuple(f"{spec.layers}.2.{name}." for name in (*spec.mlp_parts, *spec.mlp_norms))
    assert all(k.startswith(allowed) for k in gone)
    assert not any(k.startswith(allowed) for k in after)
    assert count_params(enc.model) < p0
    st = structure(enc)
    assert st["drop_attn"] == [1] and st["drop_mlp"] == [2] and st["intermediate_sizes"][2] is None


def test_dropping_twice_or_out_of_range_is_refused():
    enc = tiny_encoder("llama")
    drop_sublayers(enc, mlp=[1])
    with pytest.raises(DsPruneError, match="already dropped"):
        drop_sublayers(enc, mlp=[1])
    with pytest.raises(DsPruneError, match="out of range"):
        drop_sublayers(enc, attn=[4])


def test_iterative_rescoring_differs_from_one_shot_bookkeeping(texts):
    enc = tiny_encoder("llama")
    seen = []

    def rescore():
        s = score_layers(enc, texts, show_progress=False)
        seen.append(sorted(s["mlp"]))
        return s

    plan, history = plan_iterative(rescore, lambda a, m: drop_sublayers(enc, a, m), 4, DropRequest(mlp=2, attn=1))
    assert len(history) == 3 and len(plan.mlp) == 2 and len(plan.attn) == 1
    assert len(seen[1]) == 3  # the second choice was made on the model with one MLP gone
    assert structure(enc)["drop_mlp"] == plan.mlp
    # the first drop is the one-shot choice; each later choice is the minimum of the re-scored model
    assert plan.steps[0]["layer"] == min(history[0]["mlp"], key=history[0]["mlp"].get)
    assert plan.steps[1]["layer"] == min(history[1]["mlp"], key=history[1]["mlp"].get)


def test_protect_keeps_the_first_layers_out_of_every_choice():
    plan = plan_one_shot(SCORES, 4, DropRequest(mlp=1, attn=1, blocks=1, protect=2))
    assert min(plan.attn + plan.mlp) >= 2 and plan.mlp == [2, 3] and plan.attn == [2, 3]
    plan, _ = plan_iterative(lambda: SCORES, lambda a, m: None, 4, DropRequest(mlp=1, attn=1, protect=2))
    assert plan.mlp == [2] and plan.attn == [3]


@pytest.mark.parametrize("req,msg", [
    (DropRequest(mlp=3, protect=2), "drop_mlp 3 is larger than the 2 MLP sub-layers left after protecting the first 2"),
    (DropRequest(last=3, protect=2), "drop_blocks/drop_last 3 is larger than the 2 blocks the model has after "
                                     "protecting the first 2"),
    (DropRequest(mlp=1, protect=5), "protect 5 is larger than the 4 layers"),
    (DropRequest(mlp=1, protect=-1), "protect must be >= 0"),
    (DropRequest(mlp=3, protect="1,2"), "drop_mlp 3 is larger than the 2 MLP sub-layers left after protecting "
                                        r"layer\(s\) 1, 2"),
    (DropRequest(mlp=1, protect="2,4"), "protect: layer 4 is out of range for the 4-layer model"),
    (DropRequest(last=2, protect="3,"), r"drop_last 2 reaches protected layer\(s\) \[3\]"),
    (DropRequest(mlp=1, protect="a,b"), "protect must be K .* or layers such as 2,3"),
    (DropRequest(mlp=1, protect="3-1,"), "protect must be K")])
def test_protect_that_leaves_too_few_is_refused(req, msg):
    with pytest.raises(DsPruneError, match=msg):
        plan_one_shot(SCORES, 4, req)


def test_protect_a_list_of_layers():
    # layers 1 and 2 are the weakest MLPs; protecting exactly them moves the drop to the next ones
    assert plan_one_shot(SCORES, 4, DropRequest(mlp=2)).mlp == [1, 2]
    assert plan_one_shot(SCORES, 4, DropRequest(mlp=2, protect="1,2")).mlp == [0, 3]
    assert plan_one_shot(SCORES, 4, DropRequest(mlp=2, protect=[2])).mlp == [1, 3]
    plan, _ = plan_iterative(lambda: SCORES, lambda a, m: None, 4, DropRequest(mlp=1, protect="1-2"))
    assert plan.mlp == [3]
    assert protect_spec("3") == 3 and protect_spec(" 0-2,5 ") == (0, 1, 2, 5) and protect_spec("5,") == (5,)
