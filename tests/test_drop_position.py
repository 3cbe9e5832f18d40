"""benchmarks/drop_position.py end to end on a tiny model: the pairs drop exactly their MLPs, protection moves the
drop by importance, and the section says what the paired intervals say."""
import json
import shutil
from pathlib import Path

from benchmarks import drop_position
from benchmarks._common import results_name
from benchmarks.grid.render_drop_position import drop_position_section, render_drop_position, verdict
from train_helpers import write_beir


def test_drop_position_on_a_tiny_model(tiny_dirs, tmp_path):
    scores = tmp_path / "scores.json"
    mlp = {"0": 0.9, "1": 0.01, "2": 0.3, "3": 0.02}   # by importance MLPs 1 and 3 go first
    scores.write_text(json.dumps({"scores": {"attn": {}, "mlp": mlp, "block": {}}, "order": {}, "num_layers": 4}))
    beir = write_beir(tmp_path / "beir")
    results = tmp_path / "results"
    argv = ["--model", str(tiny_dirs["llama"]), "--scores", str(scores), "--early", "1", "--late", "2",
            "--drop_mlp", "2", "--protect", "2", "--task", f"tiny={beir}", "--max_length", "32", "--threads", "1",
            "--out", str(tmp_path / "out"), "--results", str(results), "--no_render"]
    assert drop_position.main(argv) == 0
    name = results_name(drop_position.NAME, str(tiny_dirs["llama"]))
    assert name.startswith("drop_position_") and results_name(drop_position.NAME, "smollm2") == "drop_position"
    doc = json.loads((results / f"{name}.json").read_text())
    assert {k: v["drop_mlp"] for k, v in doc["variants"].items()} == {
        "MLPs 1": [1], "MLPs 2": [2], "Drop-2M": [1, 3], "Drop-2M, first 2 protected": [2, 3]}
    assert doc["variants"]["MLPs 1"]["protect"] == "0,2,3"
    assert [r["label"] for r in doc["report"]["rows"]] == ["no drop", "MLPs 1", "MLPs 2", "Drop-2M",
                                                           "Drop-2M, first 2 protected"]
    assert [(c["a"], c["b"]) for c in doc["contrasts"]] == [("MLPs 1", "MLPs 2"),
                                                             ("Drop-2M, first 2 protected", "Drop-2M")]
    assert doc["command"].startswith(".venv/bin/python benchmarks/drop_position.py --model")
    text = "\n".join(drop_position_section(doc))
    assert "| MLPs 1 | 1 |" in text and all(verdict(c) in text for c in doc["contrasts"])
    # the undropped model's results reused instead of a second evaluation
    ref = tmp_path / "out" / "eval-no-drop" / "results.json"
    again = [*argv[:argv.index("--out")], "--reference_results", str(ref), "--out", str(tmp_path / "out2"),
             "--results", str(results), "--no_render"]
    assert drop_position.main(again) == 0
    doc2 = json.loads((results / f"{name}.json").read_text())
    assert doc2["reference_results"] == str(ref) and not (tmp_path / "out2" / "eval-no-drop").exists()
    assert doc2["report"]["rows"][0] == doc["report"]["rows"][0]
    # beside the committed run on SmolLM2 as it ships, this model's run renders as a section of its own
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "drop_position.json"
    shutil.copy(committed, results / "drop_position.json")
    shutil.copy(committed.parent / "dense.json", results / "dense.json")
    lines = render_drop_position(results)
    assert lines[0].startswith("## Which MLPs a drop takes")
    assert f"### The same on `{tiny_dirs['llama']}`" in lines
    assert not [line for line in lines if line.startswith("Caveat: ")]      # every stage made on its inputs
    # a run whose stages were reused by command alone (stamps without inputs) says so once, under its own section
    old = json.loads(committed.read_text())
    old["stages"] = [{k: v for k, v in st.items() if k != "inputs"} | {"reused": True} for st in old["stages"]]
    (results / "drop_position.json").write_text(json.dumps(old))
    lines = render_drop_position(results)
    caveats = [i for i, line in enumerate(lines) if line.startswith("Caveat: ")]
    assert len(caveats) == 1 and caveats[0] < lines.index(f"### The same on `{tiny_dirs['llama']}`")
    assert all("inputs" in s for s in doc["stages"])
    # a model at the dense retriever's path that is another training run is named as such, by its weights
    assert len(doc["model_fingerprint"]) == 40
    assert f"(weights {doc['model_fingerprint'][:12]}; not the grid's dense row" in "\n".join(lines)


def test_verdict_follows_the_interval():
    c = {"a": "A", "b": "B"}
    assert verdict({**c, "low": -0.2, "high": -0.01}) == "A scores lower than B"
    assert verdict({**c, "low": 0.01, "high": 0.2}) == "A scores higher than B"
    assert verdict({**c, "low": -0.01, "high": 0.2}) == "A and B are not separable"


def test_a_stage_runs_again_when_its_input_changes_at_the_same_path(tiny_dirs, tmp_path):
    from safetensors.torch import load_file, save_file

    from benchmarks._common import stage

    model = tmp_path / "model"
    shutil.copytree(tiny_dirs["llama"], model)
    scores = tmp_path / "scores.json"
    scores.write_text(json.dumps({"scores": {"attn": {}, "mlp": {"0": 0.9, "1": 0.01, "2": 0.3, "3": 0.02},
                                             "block": {}}, "order": {}, "num_layers": 4}))
    argv = ["drop", "--model", str(model), "--scores", str(scores), "--drop_mlp", "1"]
    log: list = []
    stage("drop", argv, tmp_path / "out", log)
    stage("drop", argv, tmp_path / "out", log)
    assert [s["reused"] for s in log] == [False, True]
    assert set(log[0]["inputs"]) == {str(model), str(scores)}
    # the model retrained in place: same path, same command, other weights
    weights = next(model.glob("*.safetensors"))
    tensors = load_file(weights)
    name = next(iter(tensors))
    tensors[name] = tensors[name] + 1
    save_file(tensors, weights, metadata={"format": "pt"})
    stage("drop", argv, tmp_path / "out", log)
    assert log[2]["reused"] is False and log[2]["inputs"][str(model)] != log[0]["inputs"][str(model)]
    # so are new importance scores
    scores.write_text(scores.read_text().replace("0.01", "0.5"))
    stage("drop", argv, tmp_path / "out", log)
    assert log[3]["reused"] is False


def test_the_grid_scores_serve_only_the_grid_weights(tiny_dirs, tmp_path, monkeypatch, capsys):
    import pytest

    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    results = tmp_path / "results"
    results.mkdir()
    shutil.copy(committed / "dense.json", results / "dense.json")
    model = str(tiny_dirs["llama"])
    monkeypatch.setitem(drop_position.GRID_SCORES, model, str(committed / "drop_order" / "dense-score.json"))
    with pytest.raises(SystemExit):
        drop_position.main(["--model", model, "--results", str(results), "--out", str(tmp_path / "out"),
                            "--no_render"])
    err = capsys.readouterr().err
    assert "scored the grid's dense row" in err and "another training run" in err and "dsprune score" in err
    assert not (tmp_path / "out").exists() and list(results.iterdir()) == [results / "dense.json"]
