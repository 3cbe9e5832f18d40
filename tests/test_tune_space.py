"""Sweep files are checked before Ray starts: unknown knobs, empty ranges, impossible constraints."""
from pathlib import Path

import pytest

from dsprune.errors import DsPruneError
from dsprune.tune import outcome, space
from dsprune.tune.sweep import Args, build

STAGES = """
- name: slim
  launcher: train
  num_gpus: 2
  args: {model: M, train_data: [D], mode: slim, max_steps: 4}
- name: mask
  command: mask
  args: {gates: "${slim}", ratio: 0.3}
- name: export
  command: export
  args: {model: "${slim}/model", mask: "${mask}"}
- name: eval
  command: eval
  args: {model: "${export}", task: [t=F]}
- name: bench
  command: bench
  args: {model: "${export}", baseline: M}
"""


def _args(**kw):
    base = dict(stages=STAGES, space={"slim.ratio": {"grid": [0.2, 0.4]}, "slim.lambda": {"loguniform": [1, 1e3]}})
    base.update(kw)
    return Args(**base)


def test_aliases_land_on_stage_options():
    sweep = build(_args())
    assert {(p.name, p.stage, p.option) for p in sweep.params} == {
        ("slim.ratio", "mask", "ratio"), ("slim.lambda", "slim", "slim_lambda")}
    over = space.overrides(sweep.params, {"slim.ratio": 0.4, "slim.lambda": 12.5})
    assert over == {"mask": {"ratio": 0.4}, "slim": {"slim_lambda": 12.5}}


def test_literal_stage_option_and_stage_override():
    sweep = build(_args(space={"eval.batch_size": {"choice": [8, 16]},
                               "slim.ratio": {"uniform": [0.1, 0.5], "stage": "mask"}}))
    assert [(p.stage, p.option) for p in sweep.params] == [("eval", "batch_size"), ("mask", "ratio")]


def test_randint_is_inclusive_and_int():
    (p,) = space.parse_space({"drop.mlp": {"randint": [3, 5]}}, {"drop": {"drop_mlp"}})
    assert p.values == (3, 5)
    assert space.overrides([p], {"drop.mlp": 5.0}) == {"drop": {"drop_mlp": 5}}
    assert p.domain().upper == 6  # Ray's randint excludes its upper bound


@pytest.mark.parametrize("sp,msg", [
    ({"slim.ratoi": {"grid": [0.2]}}, "has no stage 'slim'|no option|unknown parameter"),
    ({"nonsense": {"grid": [1]}}, "unknown parameter"),
    ({"dai.alpha": {"uniform": [0, 1]}}, "no stage 'prune'"),
    ({"slim.ratio": {"grid": []}}, "empty range"),
    ({"slim.ratio": {"uniform": [0.5, 0.5]}}, "empty range"),
    ({"slim.lambda": {"loguniform": [0, 10]}}, "must be positive"),
    ({"drop.mlp": {"randint": [5, 3]}}, "empty range"),
    ({"slim.ratio": {"grid": [0.2], "uniform": [0, 1]}}, "exactly one of"),
    ({"slim.ratio": [0.2, 0.3]}, "expected a mapping"),
    ({"mask.no_such_option": {"grid": [1]}}, "has no option 'no_such_option'"),
    ({}, "at least one parameter"),
])
def test_bad_spaces_fail_before_any_trial(sp, msg):
    with pytest.raises(DsPruneError, match=msg):
        build(_args(space=sp))


@pytest.mark.parametrize("cons,msg", [
    ({"speedup": {"min": 2.0, "max": 1.5}}, "infeasible, min 2.0 is above max 1.5"),
    ({"ndcg_at_10": {"min": 1.2}}, "infeasible, ndcg_at_10 is at most 1.0"),
    ({"params": {"max": 0}}, "infeasible"),
    ({"latency": {"min": 1}}, "unknown metric"),
    ({"speedup": {"least": 1}}, "expected"),
    ({"speedup": {"min": "fast"}}, "finite number"),
])
def test_bad_constraints(cons, msg):
    with pytest.raises(DsPruneError, match=msg):
        build(_args(constraints=cons))


def test_constraint_needs_a_stage_that_measures_it():
    no_bench = STAGES[:STAGES.index("- name: bench")]
    with pytest.raises(DsPruneError, match="no `bench` stage"):
        build(_args(stages=no_bench, constraints={"speedup": {"min": 1.5}}))
    with pytest.raises(DsPruneError, match="needs a `bench` stage"):
        build(_args(stages=no_bench, metric="speedup"))


def test_search_and_scheduler_checks():
    with pytest.raises(DsPruneError, match="use choice instead of grid"):
        build(_args(search="optuna"))
    with pytest.raises(DsPruneError, match="every parameter needs a grid"):
        build(_args(search="grid"))
    with pytest.raises(DsPruneError, match="scheduler must be"):
        build(_args(scheduler="hyperband2"))
    with pytest.raises(DsPruneError, match="exactly one of `pipeline"):
        build(Args(space={"slim.ratio": {"grid": [0.2]}}))
    with pytest.raises(DsPruneError, match="unknown option"):
        build(_args(stages=STAGES.replace("ratio: 0.3", "ratio: 0.3, colour: red")))


def test_judge_penalises_infeasible_trials():
    sweep = build(_args(constraints={"speedup": {"min": 1.5}}, penalty=1.0))
    assert sweep.judge({"ndcg_at_10": 0.4, "speedup": 1.6}) == {"feasible": True, "objective": 0.4}
    assert sweep.judge({"ndcg_at_10": 0.4, "speedup": 1.2}) == {"feasible": False, "objective": pytest.approx(-0.6)}
    assert sweep.judge({"ndcg_at_10": 0.4})["feasible"] is False  # cost never measured: not feasible


def test_pareto_front_by_hand():
    rows = [{"s": 0.5, "c": 1.0}, {"s": 0.4, "c": 2.0}, {"s": 0.3, "c": 1.5},  # dominated by row 1
            {"s": 0.5, "c": 0.9}, {"s": None, "c": 9.0}, {"s": 0.2, "c": 3.0}]
    assert outcome.pareto_front(rows, {"s": "max", "c": "max"}) == [0, 1, 5]
    assert outcome.pareto_front(rows, {"s": "max", "c": "min"}) == [3]


def test_eval_metrics_count_classification_and_sts_by_their_main_score(tmp_path):
    from dsprune import formats
    formats.write_json(tmp_path / formats.RESULTS, {"tasks": {
        "sci": {"type": "Retrieval", "main_score": 0.5, "ndcg_at_10": 0.5, "recall_at_100": 0.9},
        "sent": {"type": "Classification", "main_score": 0.8},
        "sts": {"type": "STS", "main_score": -0.2}}})
    m = outcome.eval_metrics(tmp_path)
    assert m["ndcg_at_10"] == 0.5 and m["recall_at_100"] == 0.9  # retrieval-only metrics skip the others
    assert m["main_score"] == pytest.approx((0.5 + 0.8 - 0.2) / 3)
    assert m["main_score/sent"] == 0.8 and "ndcg_at_10/sent" not in m
    sweep = build(_args(metric="main_score"))
    assert sweep.judge(m) == {"feasible": True, "objective": pytest.approx(1.1 / 3)}


@pytest.mark.parametrize("path", sorted((Path(__file__).resolve().parents[1] / "tuning").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_shipped_sweeps_are_valid(path):
    from dsprune.config import load_config_file

    sweep = build(Args(**load_config_file(path)))
    assert sweep.params


def test_cli_refuses_a_bad_sweep_before_ray_starts(tmp_path, capsys):
    import yaml

    from dsprune.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(yaml.safe_dump({"out": str(tmp_path / "out"), "stages": yaml.safe_load(STAGES),
                                   "space": {"slim.ratio": {"uniform": [0.5, 0.2]}}}))
    assert main(["tune", "--config", str(cfg)]) == 2
    assert "space.slim.ratio.uniform: empty range [0.5, 0.2]" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_best_and_front_come_from_feasible_trials_only(tmp_path):
    """An infeasible trial that scores higher is neither best nor on the front, but keeps its row in the table."""
    from dsprune.tune.sweep import summarise

    args = _args(out=str(tmp_path / "sweep"), space={"slim.ratio": {"grid": [0.1, 0.6, 0.999]}},
                 constraints={"param_ratio": {"min": 1.1}})
    sweep = build(args)
    rows = [{"trial": "a", "slim.ratio": 0.1, "status": "done", "ndcg_at_10": 0.5, "param_ratio": 1.05,
             "model": "ma"},
            {"trial": "b", "slim.ratio": 0.6, "status": "done", "ndcg_at_10": 0.4, "param_ratio": 1.4,
             "model": "mb"},
            {"trial": "c", "slim.ratio": 0.999, "status": "error", "error": "error: would remove every neuron"}]
    for r in rows[:2]:
        r.update(sweep.judge(r))
    s = summarise(rows, sweep, args)
    assert [r["feasible"] for r in rows[:2]] == [False, True]
    assert s["best"]["trial"] == "b" and s["best_model"] == "mb" and s["front"] == ["b"]
    table = (tmp_path / "sweep" / "trials.md").read_text()
    assert "| b **best** |" in table and "| a |" in table and "- c: error: would remove every neuron" in table
    assert "param_ratio >= 1.1" in table and "Best feasible trial: b -> mb" in table
    assert (tmp_path / "sweep" / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
