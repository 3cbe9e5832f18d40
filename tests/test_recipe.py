"""Recipes run stage by stage and reuse a stage only when its inputs are unchanged."""
import json
import shutil

import pytest

from dsprune.errors import DsPruneError
from dsprune.recipe import load_recipe, run_recipe


def _recipe(tmp_path, model, calib, drop_mlp):
    p = tmp_path / "r.yaml"
    p.write_text(f"""
out: {tmp_path / 'out'}
stages:
  - name: score
    command: score
    args: {{model: {model}, calib: {calib}, n_samples: 4}}
  - name: drop
    command: drop
    args: {{model: {model}, scores: "${{score}}", drop_mlp: {drop_mlp}}}
""")
    return p


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_dirs):
    """One run of the score -> drop recipe (drop_mlp 1); a test that changes it works on a copy."""
    from conftest import TEXTS

    root = tmp_path_factory.mktemp("recipe")
    calib = root / "c.txt"
    calib.write_text("\n".join(TEXTS))
    recipe = _recipe(root, tiny_dirs["llama"], calib, 1)
    return {"root": root, "calib": calib, "recipe": recipe, "report": run_recipe(recipe)}


def _copy(finished, tmp_path, stages=("score", "drop")):
    """The finished run's ``stages`` copied into ``tmp_path/out``: the recipe there reads the same inputs."""
    for name in stages:
        shutil.copytree(finished["root"] / "out" / name, tmp_path / "out" / name)
    return finished["calib"]


def test_run_resume_and_rerun_on_change(tiny_dirs, tmp_path, finished):
    r1 = finished["report"]
    assert [v["status"] for v in r1.values()] == ["ran", "ran"]
    man = json.loads((finished["root"] / "out" / "drop" / "manifest.json").read_text())
    assert len(man["structure"]["drop_mlp"]) == 1
    calib = _copy(finished, tmp_path)
    r2 = run_recipe(_recipe(tmp_path, tiny_dirs["llama"], calib, 1))
    assert [v["status"] for v in r2.values()] == ["reused", "reused"]
    r3 = run_recipe(_recipe(tmp_path, tiny_dirs["llama"], calib, 2))
    assert [v["status"] for v in r3.values()] == ["reused", "ran"]
    man = json.loads((tmp_path / "out" / "drop" / "manifest.json").read_text())
    assert len(man["structure"]["drop_mlp"]) == 2


@pytest.mark.parametrize("body,msg", [
    ("stages: []", "non-empty 'stages'"),
    ("stages:\n  - name: a\n    command: nosuch", "unknown command 'nosuch'"),
    ("stages:\n  - name: a\n    command: drop\n    args: {scores: '${b}'}", "refers to ${b}"),
    ("stages:\n  - name: a\n    command: drop\n  - name: a\n    command: score", "used twice"),
    ("stages:\n  - name: a\n    launcher: nosuch", "no launcher"),
])
def test_bad_recipes(tmp_path, body, msg):
    p = tmp_path / "r.yaml"
    p.write_text(body)
    with pytest.raises(DsPruneError, match=msg.replace("$", r"\$").replace("{", r"\{").replace("}", r"\}")):
        load_recipe(p)


def test_failed_stage_keeps_finished_ones(tiny_dirs, tmp_path, finished):
    calib = _copy(finished, tmp_path, ["score"])
    with pytest.raises(DsPruneError, match="stage 'drop' failed"):
        run_recipe(_recipe(tmp_path, tiny_dirs["llama"], calib, 99))
    assert (tmp_path / "out" / "score" / "stage.json").is_file()
    assert not (tmp_path / "out" / "drop").exists()


def _param_recipe(tmp_path, model, calib):
    p = tmp_path / "p.yaml"
    p.write_text(f"""
out: {tmp_path / 'out'}
params:
  model: {model}
  drop_mlp: 1
stages:
  - name: score
    command: score
    args: {{model: "${{model}}", calib: {calib}, n_samples: 4}}
  - name: drop
    command: drop
    args: {{model: "${{model}}", scores: "${{score}}", drop_mlp: "${{drop_mlp}}"}}
""")
    return p


def test_params_switch_the_model_from_the_command_line(tiny_dirs, tmp_path, texts):
    from dsprune.cli import main

    calib = tmp_path / "c.txt"
    calib.write_text("\n".join(texts))
    recipe = _param_recipe(tmp_path, tiny_dirs["llama"], calib)
    assert main(["run", "--recipe", str(recipe), "--param", f"model={tiny_dirs['gemma3_text']}", "drop_mlp=2"]) == 0
    stamp = json.loads((tmp_path / "out" / "drop" / "stage.json").read_text())
    assert stamp["args"]["drop_mlp"] == 2 and stamp["args"]["model"] == str(tiny_dirs["gemma3_text"])   # typed, not "2"
    man = json.loads((tmp_path / "out" / "drop" / "manifest.json").read_text())
    assert len(man["structure"]["drop_mlp"]) == 2
    config = json.loads((tmp_path / "out" / "drop" / "config.json").read_text())
    assert config["base"]["model_type"].startswith("gemma3")                     # the other family went through
    # the declared defaults: another model and drop count, so both stages rerun, with those values
    ran = []
    r = run_recipe(recipe, execute=lambda cmd, folder: ran.append(cmd) or 0)
    assert [v["status"] for v in r.values()] == ["ran", "ran"]
    assert all(str(tiny_dirs["llama"]) in cmd for cmd in ran) and ran[1][ran[1].index("--drop_mlp") + 1] == "1"


@pytest.mark.parametrize("body,params,msg", [
    ("params: {model: a}\nstages:\n  - name: model\n    command: score", {}, "share a name"),
    ("params: {model: a}\nstages:\n  - name: s\n    command: score", {"modle": "b"}, "unknown param(s) modle"),
    ("params: [a]\nstages:\n  - name: s\n    command: score", {}, "'params' must be a mapping"),
])
def test_bad_params(tmp_path, body, params, msg):
    p = tmp_path / "r.yaml"
    p.write_text(body)
    with pytest.raises(DsPruneError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        load_recipe(p, params=params)


def test_param_values_from_the_command_line_are_typed():
    from dsprune.recipe import parse_params

    assert parse_params(["drop_mlp=9", "model=gemma3-270m", "ratio=0.3"]) == {"drop_mlp": 9, "model": "gemma3-270m",
                                                                              "ratio": 0.3}
    with pytest.raises(DsPruneError, match="NAME=VALUE"):
        parse_params(["drop_mlp"])


def test_train_stage_resumes_only_its_own_interrupted_run(tmp_path):
    """A complete checkpoint left by an interrupted run is continued; one left by a run with other inputs is
    replaced, and so is a run killed while writing its first checkpoint (DeepSpeed's `latest` already names it)."""
    from dsprune import formats
    from dsprune.train import checkpoints

    def recipe(lr):
        p = tmp_path / "t.yaml"
        p.write_text(f"out: {tmp_path / 'out'}\nstages:\n  - name: fit\n    launcher: train\n"
                     f"    args: {{model: m, train_data: d, learning_rate: {lr}}}\n")
        return p

    calls = []

    def interrupted(cmd, folder, marked=True):   # the launch dies after (or while) writing its first checkpoint
        calls.append(cmd)
        tag = folder / "checkpoints" / "step1"
        tag.mkdir(parents=True, exist_ok=True)
        (tag / "shard.pt").write_bytes(b"x")
        (folder / "checkpoints" / "latest").write_text("step1")
        if marked:
            formats.write_json(tag / checkpoints.COMMIT, {"step": 1, "files": checkpoints.files(tag)})
        return 1

    for lr in (0.1, 0.1, 0.2):
        with pytest.raises(DsPruneError, match="stage 'fit' failed"):
            run_recipe(recipe(lr), execute=interrupted)
    first, same, changed = calls
    assert "--resume" not in first
    assert "--resume" in same and "--overwrite" not in same
    assert "--resume" not in changed and "--overwrite" in changed

    shutil.rmtree(tmp_path / "out")
    for _ in range(2):
        with pytest.raises(DsPruneError, match="stage 'fit' failed"):
            run_recipe(recipe(0.1), execute=lambda cmd, folder: interrupted(cmd, folder, marked=False))
    assert "--resume" not in calls[-1] and "--overwrite" in calls[-1]


def test_set_changes_one_stage_option_for_a_run(tiny_dirs, tmp_path, finished, capsys):
    from dsprune.cli import main
    calib = _copy(finished, tmp_path)
    r = str(_recipe(tmp_path, tiny_dirs["llama"], calib, 1))
    assert main(["run", r, "--set", "drop.drop_mlp=2"]) == 0
    man = json.loads((tmp_path / "out" / "drop" / "manifest.json").read_text())
    assert len(man["structure"]["drop_mlp"]) == 2
    for bad, msg in ((["--set", "dorp.drop_mlp=2"], "--set names no stage dorp"),
                     (["--set", "drop_mlp=2"], "expected STAGE.OPTION=VALUE"),
                     (["--set", "drop.drop_mpl=2"], "unknown option.*drop_mpl")):
        assert main(["run", r, *bad]) == 2
        assert msg.split(".*")[0] in capsys.readouterr().err


def test_a_finished_run_copied_elsewhere_is_reused_there(tmp_path, finished):
    first = finished["report"]
    shutil.copytree(finished["root"] / "out", tmp_path / "moved")
    moved = run_recipe(finished["recipe"], out=str(tmp_path / "moved"))
    assert [v["status"] for v in moved.values()] == ["reused", "reused"]
    assert moved["drop"]["fingerprint"] == first["drop"]["fingerprint"]
    assert moved["drop"]["folder"] == str(tmp_path / "moved" / "drop")


def test_stamps_of_the_older_fingerprint_are_reused_and_upgraded(tiny_dirs, tmp_path, finished):
    import hashlib
    calib = _copy(finished, tmp_path)
    recipe = _recipe(tmp_path, tiny_dirs["llama"], calib, 1)
    first = finished["report"]
    old = {}   # the older fingerprint: resolved folder paths in the arguments, upstream by older fingerprints
    for name, up in (("score", []), ("drop", ["score"])):
        stamp = tmp_path / "out" / name / "stage.json"
        # as if the older code had run here: its arguments name this run's folders
        doc = json.loads(stamp.read_text().replace(str(finished["root"] / "out"), str(tmp_path / "out")))
        blob = json.dumps({"command": doc["command"], "launcher": None, "num_gpus": 1, "args": doc["args"],
                           "upstream": sorted(old[u] for u in up)}, sort_keys=True)
        old[name] = doc["fingerprint"] = hashlib.sha256(blob.encode()).hexdigest()[:16]
        stamp.write_text(json.dumps(doc))
    assert old["drop"] != first["drop"]["fingerprint"]
    again = run_recipe(recipe)
    assert [v["status"] for v in again.values()] == ["reused", "reused"]
    stamped = json.loads((tmp_path / "out" / "drop" / "stage.json").read_text())
    assert stamped["fingerprint"] == first["drop"]["fingerprint"]


def _three(tmp_path, model, calib):
    """score, then drop reading it, then a second score no other stage reads."""
    p = _recipe(tmp_path, model, calib, 2)
    p.write_text(p.read_text() + f"""  - name: rescore
    command: score
    args: {{model: {model}, calib: {calib}, n_samples: 2}}
""")
    return p


def _ran(calls):
    def execute(cmd, folder):
        calls.append(folder.name)
        return 0
    return execute


def test_only_skips_stale_stages_it_does_not_select(tiny_dirs, tmp_path, finished):
    calib = _copy(finished, tmp_path, ["score"])
    calls = []
    report = run_recipe(_three(tmp_path, tiny_dirs["llama"], calib), only=["rescore"], execute=_ran(calls))
    assert {n: r["status"] for n, r in report.items()} == {"score": "reused", "drop": "skipped", "rescore": "ran"}
    assert calls == ["rescore"]
    assert not (tmp_path / "out" / "drop").exists()


def test_only_refuses_a_selected_stage_that_reads_a_skipped_one(tiny_dirs, tmp_path, finished):
    calls = []
    with pytest.raises(DsPruneError, match="stage 'drop' reads score, which is not up to date"):
        run_recipe(_three(tmp_path, tiny_dirs["llama"], finished["calib"]), only=["drop", "rescore"],
                   execute=_ran(calls))
    assert calls == []


def test_only_names_an_unknown_stage(tiny_dirs, tmp_path, finished):
    with pytest.raises(DsPruneError, match=r"--only names no stage of the recipe: nosuch \(its stages: score, drop, "
                                           r"rescore\)"):
        run_recipe(_three(tmp_path, tiny_dirs["llama"], finished["calib"]), only=["score", "nosuch"])


def test_a_stage_that_read_a_remade_output_is_rerun(tiny_dirs, tmp_path, finished):
    """Remaking a stage with the same inputs may change its output (a timing, a sample), so what read it reruns
    although its fingerprint is unchanged; then both are reused."""
    calib = _copy(finished, tmp_path)
    recipe = _recipe(tmp_path, tiny_dirs["llama"], calib, 1)
    shutil.rmtree(tmp_path / "out" / "score")
    shutil.copytree(finished["root"] / "out" / "score", tmp_path / "out" / "score")
    assert [v["status"] for v in run_recipe(recipe).values()] == ["reused", "reused"]   # the same output
    shutil.rmtree(tmp_path / "out" / "score")
    calls = []
    report = run_recipe(recipe, execute=_ran(calls))
    assert calls == ["score", "drop"] and report["drop"]["fingerprint"] == finished["report"]["drop"]["fingerprint"]
    assert report["drop"]["read"] == {"score": report["score"]["made"]} != finished["report"]["drop"]["read"]
    assert [v["status"] for v in run_recipe(recipe, execute=_ran(calls)).values()] == ["reused", "reused"]


def test_stamps_that_name_no_run_stand_until_an_upstream_stage_is_remade(tiny_dirs, tmp_path, finished):
    calib = _copy(finished, tmp_path)
    recipe = _recipe(tmp_path, tiny_dirs["llama"], calib, 1)
    for name in ("score", "drop"):      # as stamps written before stages named their runs
        stamp = tmp_path / "out" / name / "stage.json"
        doc = json.loads(stamp.read_text())
        del doc["made"], doc["read"]
        stamp.write_text(json.dumps(doc))
    assert [v["status"] for v in run_recipe(recipe).values()] == ["reused", "reused"]
    shutil.rmtree(tmp_path / "out" / "score")
    calls = []
    run_recipe(recipe, execute=_ran(calls))
    assert calls == ["score", "drop"]
