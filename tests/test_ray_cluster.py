"""`dsprune tune --address` on a running Ray cluster: a head and a worker node started with `ray start` on this
machine (1 CPU and 1 logical GPU each: Ray hands out GPU ids without a device), a 2-trial sweep whose
trials each reserve 1 CPU + 1 GPU, so one runs on each node; their DeepSpeed stage runs on the GPU id Ray
assigned (`--include localhost:ID` instead of `--num_gpus`).

The cluster's processes are this test's own (`ray start --block` in a session of its own, ended by signal):
`ray stop` would end every Ray on the machine, other runs' included.
"""
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import yaml

from dsprune.distributed import free_port
from dsprune.tune.trial import kill_group, on_trial_gpus
from train_helpers import BIN, env, write_beir, write_groups

pytestmark = pytest.mark.slow


def _ray_start(args: list[str], e: dict) -> subprocess.Popen:
    """``ray start --block ...`` (one node); returns once the node is up."""
    proc = subprocess.Popen([str(BIN / "ray"), "start", "--block", "--disable-usage-stats", *args], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if "Ray runtime started" in line:
            return proc
    raise AssertionError("ray start failed:\n" + "".join(seen[-30:]))


def _end(proc: subprocess.Popen) -> None:
    """End a node and everything it started (its raylet, workers, agents share its process group)."""
    kill_group(proc, grace=3)
    try:  # agents may outlive the node's leader for a moment
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.fixture(scope="module")
def cluster():
    e = dict(env(), RAY_AUTH_MODE="disabled")
    port, temp = free_port(), tempfile.mkdtemp(prefix="rayc", dir="/tmp")  # short: Ray's socket paths
    head = _ray_start(["--head", "--port", str(port), "--num-cpus", "1", "--num-gpus", "1",
                       "--temp-dir", temp, "--include-dashboard", "false",
                       "--ray-client-server-port", str(free_port()),
                       "--dashboard-agent-listen-port", str(free_port())], e)
    nodes = [head]
    try:
        nodes.append(_ray_start(["--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--num-gpus", "1",
                                 "--dashboard-agent-listen-port", str(free_port())], e))
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(nodes):
            _end(proc)
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(scope="module")
def sweep(cluster, tmp_path_factory, tiny_dirs):
    root = tmp_path_factory.mktemp("raycluster")
    groups, beir = write_groups(root / "groups.jsonl", n=16), write_beir(root / "beir")
    doc = {
        "out": str(root / "sweep"), "name": "cluster", "search": "grid", "num_samples": 1,
        "max_concurrent": 2, "trial_cpus": 1, "trial_gpus": 1, "metric": "param_ratio",
        "space": {"train.learning_rate": {"grid": [0.001, 0.002]}},
        "stages": [
            {"name": "train", "launcher": "train", "num_gpus": 1,
             "args": {"model": str(tiny_dirs["llama"]), "train_data": [str(groups)], "group_size": 4,
                      "per_device_batch_size": 4, "max_steps": 2, "save_steps": 0,
                      "deepspeed": "ds_configs/zero2.json"}},
            {"name": "bench", "command": "bench",
             "args": {"model": "${train}/model", "baseline": str(tiny_dirs["llama"]), "data": str(beir), "docs": 4,
                      "doc_batch": 4, "doc_len": 8, "queries": 4, "query_batch": 4, "query_len": 8, "repeats": 1}},
        ]}
    cfg = root / "sweep.yaml"
    cfg.write_text(yaml.safe_dump(doc, sort_keys=False))
    storage = root / "shared" / "ray"
    r = subprocess.run([str(BIN / "dsprune"), "tune", "--config", str(cfg), "--storage_path", str(storage)],
                       env=dict(env(), RAY_ADDRESS=cluster), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"out": root / "sweep", "storage": storage, "stdout": r.stdout,
            "summary": json.loads((root / "sweep" / "summary.json").read_text())}


def test_trials_run_on_both_nodes_of_the_cluster(sweep):
    s = sweep["summary"]
    assert [t["status"] for t in s["trials"]] == ["done", "done"]
    nodes = [t["node"] for t in s["trials"]]
    assert all(nodes) and len(set(nodes)) == 2, nodes  # one trial per node: each node has 1 CPU
    table = (sweep["out"] / "trials.md").read_text()
    assert "| node |" in table.replace("node | status", "node |") and all(n in table for n in nodes)
    assert (sweep["storage"] / "cluster").is_dir()  # Ray's experiment in --storage_path, not OUT/ray
    assert not (sweep["out"] / "ray").exists()


def test_each_stage_runs_on_its_trials_gpu(sweep):
    for t in sweep["summary"]["trials"]:
        node = json.loads((sweep["out"] / "trials" / t["trial"] / "node.json").read_text())
        assert [str(g) for g in node["gpus"]] == ["0"]  # each node's only GPU
        log = (sweep["out"] / "trials" / t["trial"] / "logs").glob("train-*.log")
        text = next(log).read_text()
        assert text.splitlines()[0].split()[2:5] == ["--include", "localhost:0", "--master_port"]
        assert "--num_gpus" not in text.splitlines()[0]
        assert "CUDA_VISIBLE_DEVICES=0" in text  # what DeepSpeed's launcher gave the rank


def test_stage_command_takes_the_trials_gpus():
    cmd = ["deepspeed", "--num_gpus", "2", "--master_port", "1", "launchers/train.py", "--x", "1"]
    assert on_trial_gpus(cmd, ["3", "5", "6"]) == ["deepspeed", "--include", "localhost:3,5", "--master_port", "1",
                                                   "launchers/train.py", "--x", "1"]
    assert on_trial_gpus(cmd, []) == cmd  # a CPU trial: its ranks as the stage asks
    assert on_trial_gpus(["python", "-m", "dsprune.cli", "eval"], ["1"]) == ["python", "-m", "dsprune.cli", "eval"]
    with pytest.raises(ValueError, match="asks for 2 GPUs, its trial holds 1"):
        on_trial_gpus(cmd, ["0"])


def test_cpus_with_a_cluster_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from dsprune.errors import DsPruneError
    from dsprune.tune.sweep import Args, run

    out = tmp_path / "sweep"
    stages = [{"name": "bench", "command": "bench", "args": {"model": "m", "baseline": "m"}}]
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    with pytest.raises(DsPruneError, match=r"^cpus sizes a local Ray; a cluster .* has its own CPUs$"):
        run(Args(out=str(out), stages=stages, metric="params", space={"bench.docs": {"grid": [4, 8]}}, cpus=2))
    assert not out.exists()


def test_trial_gpus_below_a_stages_ranks_is_refused():
    from dsprune.errors import DsPruneError
    from dsprune.tune.sweep import Args, build

    stages = [{"name": "train", "launcher": "train", "num_gpus": 2, "args": {"model": "m", "train_data": ["d"]}},
              {"name": "bench", "command": "bench", "args": {"model": "${train}/model", "baseline": "m"}}]
    args = Args(stages=stages, metric="params", space={"train.learning_rate": {"grid": [0.001, 0.002]}})
    build(args)  # a CPU sweep: the stage's 2 ranks on the trial's CPUs
    with pytest.raises(DsPruneError, match=r"trial_gpus 1: fewer GPUs than the ranks of stage\(s\) train \(2\)"):
        build(Args(**{**args.__dict__, "trial_gpus": 1}))
    one_rank = [{**stages[0], "num_gpus": 1}, stages[1]]
    build(Args(**{**args.__dict__, "stages": one_rank, "trial_gpus": 0.5}))  # two trials share one GPU
