"""A real Ray Tune sweep driven by Optuna over GAPrune's DAI knobs, two objectives: the Pareto front of what it ran.
Its own module, so that a parallel test run can start it beside the slimming sweep of test_tune_sweep.py."""
import json
import subprocess

import pytest
import yaml

from train_helpers import env, ray_tmp, tune_command, write_beir

pytestmark = pytest.mark.slow


def test_optuna_multi_objective_sweep_over_dai_knobs(tmp_path, tiny_dirs):
    """Optuna (TPE) over continuous DAI knobs, two objectives -> the Pareto front; DAI statistics are
    computed once (stage cache) and every trial recomputes DAI from them."""
    from dsprune.tune import outcome

    model, beir = tiny_dirs["llama"], write_beir(tmp_path / "beir")
    trip = tmp_path / "trip.jsonl"
    trip.write_text("".join(json.dumps({"query": q, "positive": p, "negative": n}) + "\n" for q, p, n in [
        ("cell membrane", "the cell membrane regulates transport", "revenue grew"),
        ("revenue growth", "revenue grew by ten percent", "gene expression"),
        ("dense retrieval", "dense retrieval encodes queries", "interest rates")]))
    doc = {
        "out": str(tmp_path / "sweep"), "name": "dai", "search": "optuna", "num_samples": 2, "seed": 1,
        "max_concurrent": 2,
        "space": {"dai.alpha": {"uniform": [0.0, 1.0]}, "dai.sparsity": {"uniform": [0.1, 0.6]}},
        "objectives": {"ndcg_at_10": "max", "param_ratio": "max"},
        "stages": [
            {"name": "dai", "command": "dai", "args": {"model": str(model), "general": [str(trip)],
                                                      "domain": [str(trip)]}},
            {"name": "prune", "command": "prune", "args": {"model": str(model), "method": "dai", "sparsity": 0.3,
                                                          "scores": "${dai}", "dai_recompute": True,
                                                          "structured": True}},
            {"name": "export", "command": "export", "args": {"model": str(model), "mask": "${prune}"}},
            {"name": "eval", "command": "eval", "args": {"model": "${export}", "task": [f"tiny={beir}"],
                                                        "quiet": True}},
            {"name": "bench", "command": "bench",
             "args": {"model": "${export}", "baseline": str(model), "data": str(beir), "docs": 4, "doc_batch": 4,
                      "doc_len": 8, "queries": 4, "query_batch": 4, "query_len": 8, "repeats": 1}},
        ]}
    cfg = tmp_path / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = subprocess.run(tune_command(cfg), env=dict(env(), DSPRUNE_RAY_TMP=ray_tmp()),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    s = json.loads((tmp_path / "sweep" / "summary.json").read_text())
    rows = s["trials"]
    assert [t["status"] for t in rows] == ["done"] * 2
    assert len({t["dai.sparsity"] for t in rows}) == 2 and all(0.1 <= t["dai.sparsity"] <= 0.6 for t in rows)
    assert len(list((tmp_path / "sweep" / "stages").glob("dai-*"))) == 1  # statistics computed once
    # the front is exactly the non-dominated trials, recomputed by hand here
    objs = {"ndcg_at_10": "max", "param_ratio": "max"}
    assert sorted(s["front"]) == sorted(rows[i]["trial"] for i in outcome.pareto_front(rows, objs))
    # more neurons removed -> fewer parameters
    by_sparsity = sorted(rows, key=lambda t: t["dai.sparsity"])
    assert [t["param_ratio"] for t in by_sparsity] == sorted(t["param_ratio"] for t in by_sparsity)
