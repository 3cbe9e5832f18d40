"""benchmarks/train_dense.py --results: a finished run is kept as a results JSON that says whether the retriever
beats its untrained start (paired per query), and RESULTS.md renders it beside the grid's dense row."""
import json
import random

import pytest

from benchmarks import train_dense
from benchmarks.grid.render_dense_runs import render_dense_runs


def _eval(path, mean, seed):
    rng = random.Random(seed)
    pq = {f"q{i}": min(1.0, max(0.0, mean + rng.uniform(-0.05, 0.05))) for i in range(300)}
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({
        "model": str(path), "fingerprint": path.name, "params": 1,
        "tasks": {"scifact_small": {"ndcg_at_10": sum(pq.values()) / 300, "per_query": {"ndcg_at_10": pq}}}}))


def _run(tmp_path, untrained, trained):
    out = tmp_path / "train_dense_last"
    _eval(out / "eval_untrained", untrained, 1)
    _eval(out / "eval_trained", trained, 2)
    (out / "manifest.json").write_text(json.dumps({
        "stage": "benchmark:train_dense", "code_version": "abc1234",
        "command": f"{train_dense.REPO}/.venv/bin/python benchmarks/train_dense.py --pooling last",
        "config": {"pooling": "last", "seed": 42, "lr": 2e-4,
                   "train_config": {"encoder": {"pooling": "last", "append_eos": True}}},
        "figures": {"train": {"steps": 32, "train_seconds": 600.0, "first_loss": 8.0, "final_loss": 3.5}}}))
    return out


@pytest.mark.parametrize("trained, word", [(0.3, "so it beats its untrained start"),
                                           (0.1, "so it does not clearly beat its untrained start")])
def test_a_kept_run_says_whether_it_beats_its_untrained_start(tmp_path, trained, word):
    results = tmp_path / "results"
    results.mkdir()
    doc = json.loads(train_dense.keep(_run(tmp_path, 0.1, trained), "train_dense_last", results).read_text())
    assert doc["command"] == ".venv/bin/python benchmarks/train_dense.py --pooling last"   # no machine path
    assert doc["encoder"] == {"pooling": "last", "append_eos": True} and doc["seed"] == 42
    grid = {"model_fingerprint": "9ec8cad5aa", "tasks": {"scifact_small": {"ndcg_at_10": 0.513}},
            "training": {"train_dense.py": {"first_loss": 3.97, "final_loss": 1.75}}}
    text = "\n".join(render_dense_runs(results, grid))
    assert "**the last token with EOS appended**" in text and word in text
    assert doc["model_fingerprint"] == "eval_trained" and "abc1234, weights eval_trained)" in text
    assert "loss 8.000 at the first step, 3.500 at the last" in text
    assert ("the grid's dense row (mean pooling, the same script in another run whose command the row does not keep"
            in text and "0.5130" in text)
    assert render_dense_runs(results / "none") == []


def test_keeping_a_run_without_its_evaluations_is_one_clear_error(tmp_path):
    out = _run(tmp_path, 0.1, 0.2)
    (out / "eval_trained" / "results.json").unlink()
    with pytest.raises(SystemExit, match="eval_trained: no results.json"):
        train_dense.keep(out, "x", tmp_path)
    assert not (tmp_path / "x.json").exists()


def test_a_mean_pooled_run_says_whether_it_remade_the_grids_dense_retriever(tmp_path):
    from benchmarks.grid.render_dense_runs import same_queries

    results = tmp_path / "results"
    results.mkdir()
    doc = json.loads(train_dense.keep(_run(tmp_path, 0.1, 0.3), "train_dense_x", results).read_text())
    mine = doc["trained_scores"]["tasks"]["scifact_small"]["per_query"]["ndcg_at_10"]
    assert len(mine) == 300
    grid = {"tasks": {"scifact_small": {"per_query": {"ndcg_at_10": dict(mine)}}}}
    assert same_queries(doc, grid) == ""                    # last-token pooling: not the grid's retriever
    doc["encoder"] = {"pooling": "mean"}
    assert "scores every one of the 300 queries exactly as it does" in same_queries(doc, grid)
    grid["tasks"]["scifact_small"]["per_query"]["ndcg_at_10"]["q7"] += 0.5
    assert "scores 1 of the 300 queries otherwise than it does" in same_queries(doc, grid)


def test_a_model_made_again_is_named_as_the_grids_dense_retriever_made_again(tmp_path):
    from benchmarks.grid.section import model_with_weights, remade_dense

    results = tmp_path / "results"
    results.mkdir()
    path = train_dense.keep(_run(tmp_path, 0.1, 0.3), "train_dense_x", results)
    doc = json.loads(path.read_text())
    doc["encoder"] = {"pooling": "mean"}
    path.write_text(json.dumps(doc))
    per_query = dict(doc["trained_scores"]["tasks"]["scifact_small"]["per_query"]["ndcg_at_10"])
    grid = {"row": "dense", "model_fingerprint": "9ec8cad57838aa",
            "tasks": {"scifact_small": {"ndcg_at_10": 0.3, "per_query": {"ndcg_at_10": per_query}}}}
    (results / "dense.json").write_text(json.dumps(grid))
    remade = remade_dense(results)
    assert remade == {"eval_trained": "on scifact_small (`train_dense_x.json`)"}
    run = {"model": "out/train_dense/run/model", "model_fingerprint": "eval_trained"}
    assert "but a training run that scores every query as that row does on scifact_small (`train_dense_x.json`)" \
        in model_with_weights(run, grid["model_fingerprint"], remade=remade)
    assert "another training run" in model_with_weights({**run, "model_fingerprint": "other"},
                                                        grid["model_fingerprint"], remade=remade)
    per_query["q3"] += 0.5                                   # one query scored otherwise: not the same retriever
    (results / "dense.json").write_text(json.dumps(grid))
    assert remade_dense(results) == {}
