"""A real Ray Tune sweep on a tiny model: self-slimming under the DeepSpeed launcher (2 CPU ranks), then
mask -> export -> eval (mteb) -> bench per trial; interrupted after its first trial and resumed.

One sweep for the module (grid over the slimming ratio, 2 trials, the second of which must fail): the slimming
stage is shared by both trials through the stage cache, ASHA sees the in-training eval reports, and the finished
trial meets a constraint on the parameter ratio its bench measured. That an infeasible trial is never best is
test_tune_space's (on rows, without a sweep).
"""
import fcntl
import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from dsprune.recipe import STAMP, stage_lock
from train_helpers import env, ray_tmp, tune_command, write_beir, write_groups

pytestmark = pytest.mark.slow
RATIOS = [0.6, 0.999]


def _sweep_file(root: Path, model: Path) -> Path:
    groups, beir = write_groups(root / "groups.jsonl"), write_beir(root / "beir")
    doc = {
        "out": str(root / "sweep"), "name": "tiny",
        "space": {"slim.ratio": {"grid": RATIOS}},
        "search": "grid", "scheduler": "asha", "asha_grace": 10, "asha_max_t": 10, "num_samples": 1,
        "constraints": {"param_ratio": {"min": 1.1}},
        "stages": [
            {"name": "slim", "launcher": "train", "num_gpus": 2,
             "args": {"model": str(model), "train_data": [str(groups)], "mode": "slim", "slim_train": "gates",
                      "group_size": 4, "per_device_batch_size": 4, "max_steps": 4, "slim_lr": 0.05,
                      "slim_lambda": 50, "save_steps": 0, "deepspeed": "ds_configs/zero2.json",
                      "eval_task": str(beir), "eval_steps": 2}},
            {"name": "mask", "command": "mask", "args": {"gates": "${slim}", "ratio": 0.3, "model": "${slim}/model"}},
            {"name": "export", "command": "export", "args": {"model": "${slim}/model", "mask": "${mask}"}},
            {"name": "eval", "command": "eval", "args": {"model": "${export}", "task": [f"tiny={beir}"], "quiet": True}},
            {"name": "bench", "command": "bench",
             "args": {"model": "${export}", "baseline": str(model), "data": str(beir), "docs": 8, "doc_batch": 4,
                      "doc_len": 16, "queries": 8, "query_batch": 4, "query_len": 8, "repeats": 1}},
        ],
    }
    path = root / "sweep.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _take_built_stage_lock(stages: Path, name: str):
    """The open, exclusively locked lock file of the finished stage ``name`` (None while it is being built)."""
    built = list(stages.glob(f"{name}-*/{STAMP}"))
    if not built:
        return None
    f = open(stage_lock(built[0].parent), "w")
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # its builder has not let go yet
        f.close()
        return None
    return f


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, tiny_dirs):
    root = tmp_path_factory.mktemp("tune")
    cfg = _sweep_file(root, tiny_dirs["llama"])
    out = root / "sweep"
    e = dict(env(), DSPRUNE_RAY_TMP=ray_tmp())
    # 1. start the sweep. Once the shared slimming stage is built, hold its stage lock: the first trial goes on
    #    to finish, every later one waits at that stage. Interrupt (SIGINT, as Ctrl-C) when the second trial
    #    has started, so the interruption finds one trial done and one not, however loaded the machine is.
    log1 = open(root / "first.log", "w")
    proc = subprocess.Popen(tune_command(cfg), env=e, stdout=log1, stderr=subprocess.STDOUT)
    held, t0 = None, time.time()
    try:
        while not (list(out.glob("trials/*/stages.json")) and len(list(out.glob("trials/*/config.json"))) >= 2):
            assert proc.poll() is None, (root / "first.log").read_text()[-3000:]
            assert time.time() - t0 < 600, "no trial finished in 10 minutes"
            held = held or _take_built_stage_lock(out / "stages", "slim")
            time.sleep(0.2)
        assert held, "the second trial started before the slimming stage's lock was taken"
        first_done = sorted(out.glob("trials/*/stages.json"))
        before = {p: p.read_text() for p in first_done}
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=180)
    finally:
        if held:
            held.close()  # releases the lock
        log1.close()
    interrupted = json.loads((out / "summary.json").read_text())
    # 2. resume it to the end
    r = subprocess.run(tune_command(cfg, "--resume"), env=e, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return {"out": out, "interrupted": interrupted, "before": before, "stdout": r.stdout,
            "summary": json.loads((out / "summary.json").read_text())}


def _by_ratio(summary):
    return {r["slim.ratio"]: r for r in summary["trials"]}


def test_interrupted_sweep_resumes_without_redoing_finished_work(sweep):
    first = sweep["interrupted"]
    assert first["interrupted"] and first["counts"]["not finished"] >= 1
    s = sweep["summary"]
    assert not s["interrupted"] and s["num_trials"] == len(RATIOS)
    for path, text in sweep["before"].items():  # a trial finished before the interruption was not run again
        assert path.read_text() == text
    # the slimming stage (the only DeepSpeed run) was built once and shared by every trial
    slims = sorted((sweep["out"] / "stages").glob("slim-*"))
    assert len(slims) == 1
    man = json.loads((slims[0] / "manifest.json").read_text())
    assert man["stage"] == "slim" and man["world_size"] == 2


def test_table_constraint_best_and_failed_trial(sweep):
    s = sweep["summary"]
    rows = _by_ratio(s)
    assert [rows[r]["status"] for r in RATIOS] == ["done", "error"]
    assert "would remove every neuron" in rows[0.999]["error"]  # the stage's own error line, not a traceback
    # the constraint (>= 1.1) holds on the parameter ratio the trial's bench measured
    assert rows[0.6]["param_ratio"] > 1.1 and rows[0.6]["feasible"]
    best = next(r for r in s["trials"] if r["trial"] == s["best"]["trial"])
    assert best["trial"] == rows[0.6]["trial"] and s["front"] == [best["trial"]]
    assert Path(s["best_model"]).is_dir() and (Path(s["best_model"]) / "config.json").is_file()
    table = (sweep["out"] / "trials.md").read_text()
    assert f"{best['trial']} **best**" in table and "Failed trials:" in table and "param_ratio >= 1.1" in table
    assert (sweep["out"] / "front.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"best model: {s['best_model']}" in sweep["stdout"]


def test_intermediate_reports_reach_ray_and_tensorboard(sweep):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for r in sweep["summary"]["trials"]:
        if r["status"] != "done":
            continue
        # in-training evals at steps 2 and 4 (replayed for trials that reused the slimming stage) + final
        assert r["reports"] == 3
        acc = EventAccumulator(str(sweep["out"] / "trials" / r["trial"] / "tensorboard"))
        acc.Reload()
        events = acc.Scalars("tune/ndcg_at_10")
        assert [e.step for e in events][-3:] == [1, 2, 3]
        assert events[-1].value == pytest.approx(r["ndcg_at_10"])
