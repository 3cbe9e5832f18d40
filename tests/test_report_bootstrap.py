"""Paired bootstrap CIs behave, geometry metrics have their known values, report builds table and plot."""
import json
import math

import numpy as np
import pytest
import torch

from dsprune.cli import main
from dsprune.eval import geometry as g
from dsprune.eval.bootstrap import paired_bootstrap, paired_bootstrap_tasks

from test_eval_retrieval import write_beir


def per_query(values):
    return {f"q{i}": float(v) for i, v in enumerate(values)}


def test_identical_systems_ci_contains_zero():
    rng = np.random.default_rng(1)
    a = per_query(rng.uniform(0, 1, 200))
    r = paired_bootstrap(a, dict(a))
    assert r["diff"] == 0 and r["low"] <= 0 <= r["high"] and r["p"] == 1.0


def test_noisy_equal_systems_ci_contains_zero():
    rng = np.random.default_rng(2)
    base = rng.uniform(0, 1, 300)
    a, b = per_query(base + rng.normal(0, 0.05, 300)), per_query(base + rng.normal(0, 0.05, 300))
    r = paired_bootstrap(a, b)
    assert r["low"] <= 0 <= r["high"]


def test_clearly_better_system_ci_excludes_zero():
    rng = np.random.default_rng(3)
    base = rng.uniform(0, 0.8, 300)
    better = per_query(base + 0.1 + rng.normal(0, 0.05, 300))
    r = paired_bootstrap(better, per_query(base))
    assert r["low"] > 0 and r["diff"] == pytest.approx(0.1, abs=0.02) and r["p"] < 0.01
    multi = paired_bootstrap_tasks([(better, per_query(base)), (better, per_query(base))])
    assert multi["low"] > 0 and multi["tasks"] == 2


def test_geometry_known_values():
    e = torch.eye(4)
    assert g.isotropy(e) == pytest.approx(0.0)                       # orthogonal: perfectly isotropic
    assert g.alignment(e, e) == pytest.approx(0.0)
    assert g.uniformity(e) == pytest.approx(-2.0 * 2.0)               # all pairwise squared distances are 2
    q = torch.randn(64, 8)
    assert g.cross_dim_correlation(q, 3 * q + 1) == pytest.approx(1.0)
    assert g.mean_cosine(q, 2 * q) == pytest.approx(1.0)
    z = torch.tensor([[1.0], [-1.0]]) * torch.tensor([10.0, 1.0, 0.1, 0.1])   # variances ∝ 100, 1, .01, .01
    assert g.effective_dim(z) == 1                                    # 100 / 101.02 >= 0.95
    assert g.effective_dim(z, share=0.999) == 2                       # 101 / 101.02
    assert g.effective_dim(z, share=0.99995) == 4


def fake_results(path, model, fp, scores):
    """A results.json as `dsprune eval` writes it (only the fields report reads)."""
    path.mkdir(parents=True)
    tasks = {}
    for name, s in scores.items():
        tasks[name] = {"ndcg_at_10": float(np.mean(list(s.values()))), "main_score": 0.0,
                       "per_query": {"ndcg_at_10": s}}
    (path / "results.json").write_text(json.dumps({"model": model, "fingerprint": fp, "params": 1000,
                                                   "tasks": tasks}))
    return path


def test_report_table_and_plot(tiny_dirs, tmp_path):
    """Real eval + bench on tiny models, then report: table with CIs and a PNG."""
    from dsprune.encoder import Encoder
    from dsprune.surgery.prune import drop_sublayers, export

    data = write_beir(tmp_path / "beir")
    enc = Encoder.load(tiny_dirs["llama"])
    drop_sublayers(enc, mlp=[1, 2])
    export(enc, tmp_path / "pruned", stage="drop")
    for name, model in (("full", tiny_dirs["llama"]), ("pruned", tmp_path / "pruned")):
        assert main(["eval", "--model", str(model), "--task", f"tiny={data}", "--out", str(tmp_path / f"eval-{name}"),
                     "--quiet", "--geometry", "--reference", str(tiny_dirs["llama"])]) == 0
    geo = json.loads((tmp_path / "eval-full" / "results.json").read_text())["geometry"]
    assert geo["cosine_to_reference"] == pytest.approx(1.0) and geo["n_pairs"] == 4
    assert main(["bench", "--model", str(tmp_path / "pruned"), "--baseline", str(tiny_dirs["llama"]),
                 "--out", str(tmp_path / "bench"), "--data", str(data), "--docs", "4", "--doc_len", "16",
                 "--queries", "4", "--query_len", "8", "--repeats", "1"]) == 0
    out = tmp_path / "report"
    rc = main(["report", "--results", str(tmp_path / "eval-full"), str(tmp_path / "eval-pruned"), "--bench",
               str(tmp_path / "bench"), "--labels", "full", "pruned", "--out", str(out), "--samples", "200"])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    ref, pr = rep["rows"]
    assert ref["speed"]["document"] == 1.0 and pr["speed"]["document"] > 0
    d = pr["tasks"]["tiny"]["delta"]
    assert d["low"] <= d["diff"] <= d["high"] and d["n"] == 4
    assert "tiny" in (out / "report.md").read_text()
    assert (out / "quality_vs_speed.png").read_bytes()[:4] == b"\x89PNG"


def test_report_refuses_unmatched_bench(tmp_path):
    a = fake_results(tmp_path / "a", "/m/a", "fa", {"t": per_query([0.5, 0.6])})
    bench = tmp_path / "b"
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps({"fingerprint": {"model": "x", "baseline": "y"},
                                                  "document": {}, "query": {}, "params": {}}))
    assert main(["report", "--results", str(a), "--bench", str(bench), "--out", str(tmp_path / "r")]) == 2
    assert not (tmp_path / "r").exists()


def test_report_ci_over_models(tmp_path):
    rng = np.random.default_rng(0)
    base = rng.uniform(0, 0.8, 100)
    a = fake_results(tmp_path / "a", "/m/a", "fa", {"t": per_query(base)})
    b = fake_results(tmp_path / "b", "/m/b", "fb", {"t": per_query(base + 0.15)})
    c = fake_results(tmp_path / "c", "/m/c", "fc", {"t": per_query(base)})
    assert main(["report", "--results", str(a), str(b), str(c), "--out", str(tmp_path / "r")]) == 0
    rows = json.loads((tmp_path / "r" / "report.json").read_text())["rows"]
    assert rows[1]["tasks"]["t"]["delta"]["low"] > 0
    assert rows[2]["tasks"]["t"]["delta"]["low"] <= 0 <= rows[2]["tasks"]["t"]["delta"]["high"]
    assert math.isclose(rows[1]["mean_delta"]["diff"], 0.15, abs_tol=1e-9)
