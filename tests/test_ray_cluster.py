"""`dsprune tune --address` on a running Ray cluster: a head and a worker node started with `ray start` on this
machine (1 CPU and 1 logical GPU each: Ray hands out GPU ids without a device), a 2-trial sweep whose
trials each reserve 1 CPU + 1 GPU, so one runs on each node; their DeepSpeed stage runs on the GPU id Ray
assigned (`--include localhost:ID` instead of `--num_gpus`). The worker node is stopped in the middle of its trial:
that trial fails with its error and node in the table, the sweep ends, and once a worker node is back `--resume`
completes it.

The cluster's processes are this test's own (`ray start --block` in a session of its own, ended by signal):
`ray stop` would end every Ray on the machine, other runs' included.
"""
import fcntl
import json
import os
import shutil
import signal
import subprocess
import time

import pytest
import yaml

from dsprune.distributed import free_port
from dsprune.tune.trial import kill_group, on_trial_gpus
from train_helpers import BIN, env, ray_tmp, tune_command, write_beir, write_groups

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
    """Stop a node: its process group (``ray start``, the raylet, its agents). The raylet ends its workers, which
    run in process groups of their own."""
    kill_group(proc, grace=3)
    try:  # agents may outlive the node's leader for a moment
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Cluster:
    """A head node and worker nodes of one Ray cluster, each ``ray start --block`` in a process group of its own."""

    def __init__(self, e: dict, temp: str):
        self.env, self.temp, self.port = e, temp, free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.nodes = [_ray_start(["--head", "--port", str(self.port), "--num-cpus", "1", "--num-gpus", "1",
                                  "--temp-dir", temp, "--include-dashboard", "false",
                                  "--ray-client-server-port", str(free_port()),
                                  "--dashboard-agent-listen-port", str(free_port())], e)]

    def add_worker(self) -> subprocess.Popen:
        node = _ray_start(["--address", self.address, "--num-cpus", "1", "--num-gpus", "1",
                           "--dashboard-agent-listen-port", str(free_port())], self.env)
        self.nodes.append(node)
        return node

    def stop(self, node: subprocess.Popen) -> None:
        _end(node)
        self.nodes.remove(node)


@pytest.fixture(scope="module")
def cluster():
    temp = ray_tmp("rayc")
    c = None
    try:
        c = Cluster(dict(env(), RAY_AUTH_MODE="disabled"), temp)
        c.add_worker()
        yield c
    finally:
        for proc in reversed(c.nodes if c else []):
            _end(proc)
        shutil.rmtree(temp, ignore_errors=True)


def _first_stage_folder(doc: dict, overrides: dict, scratch) -> str:
    """The folder name (stage and fingerprint) a trial with these values builds its first stage in, as the recipe
    runner names it: the pipeline run with an ``execute`` that records the first command and fails it."""
    from dsprune.errors import DsPruneError
    from dsprune.recipe import run_recipe

    seen = []
    with pytest.raises(DsPruneError):
        run_recipe({"stages": doc["stages"], "path": "sweep stages"}, out=str(scratch), overrides=overrides,
                   cache=scratch / "stages", execute=lambda cmd, folder: seen.append(folder.name) or 1)
    return seen[0]


def _hold(lock):
    """Take a stage's build lock as its builder would: a trial reaching that stage waits until it is closed."""
    f = open(lock, "w")
    fcntl.flock(f, fcntl.LOCK_EX)
    return f


def _started(out, n: int) -> list[str] | None:
    """The trials that wrote their values (after their node), once there are ``n``."""
    ids = sorted(p.parent.name for p in out.glob("trials/*/config.json"))
    return ids if len(ids) >= n else None


def _wait(found, proc: subprocess.Popen, log, what: str, timeout: float = 300):
    t0 = time.time()
    while not (got := found()):
        assert proc.poll() is None, f"the sweep ended before {what}:\n" + log.read_text()[-3000:]
        assert time.time() - t0 < timeout, f"no {what} in {timeout:.0f} s"
        time.sleep(0.2)
    return got


@pytest.fixture(scope="module")
def sweep(cluster, tmp_path_factory, tiny_dirs):
    """A 2-trial sweep, one trial per node; the worker node is stopped while its trial runs, the sweep ends, the node
    comes back and ``--resume`` completes the sweep. Each trial waits at its first stage while the test holds that
    stage's build lock in the stage cache, so the node stops in the middle of its trial however loaded the machine."""
    from dsprune.recipe import stage_lock

    root = tmp_path_factory.mktemp("raycluster")
    out, stages, log = root / "sweep", root / "stages", root / "sweep.log"
    groups, beir = write_groups(root / "groups.jsonl", n=16), write_beir(root / "beir")
    rates = [0.001, 0.002]
    doc = {
        "out": str(out), "stage_cache": str(stages), "name": "cluster", "search": "grid", "num_samples": 1,
        "max_concurrent": 2, "trial_cpus": 1, "trial_gpus": 1, "metric": "param_ratio",
        "space": {"train.learning_rate": {"grid": rates}},
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
    stages.mkdir()
    held = {lr: _hold(stage_lock(stages / _first_stage_folder(doc, {"train": {"learning_rate": lr}}, root / f"dry{i}")))
            for i, lr in enumerate(rates)}
    storage = root / "shared" / "ray"
    tune = tune_command(cfg, "--storage_path", str(storage))
    e = dict(env(), RAY_ADDRESS=cluster.address)
    worker = cluster.nodes[-1]
    with open(log, "w") as f:
        proc = subprocess.Popen(tune, env=e, stdout=f, stderr=subprocess.STDOUT)
    try:
        trials = _wait(lambda: _started(out, 2), proc, log, "two trials")  # each waits at its first stage now
        where = {t: json.loads((out / "trials" / t / "node.json").read_text()) for t in trials}
        killed = [t for t in trials if os.getsid(where[t]["pid"]) == worker.pid]  # a process of the worker node
        assert len(killed) == 1, where
        killed, kept = killed[0], next(t for t in trials if t != killed[0])
        rate = {t: json.loads((out / "trials" / t / "config.json").read_text())["train.learning_rate"] for t in trials}
        held.pop(rate[kept]).close()  # the head node's trial goes on to finish
        cluster.stop(worker)
        held.pop(rate[killed]).close()  # were its trial retried, the retry would not wait here
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for f in held.values():
            f.close()
    assert proc.returncode == 0, log.read_text()[-3000:]
    first = {"summary": json.loads((out / "summary.json").read_text()), "table": (out / "trials.md").read_text(),
             "kept_stages": (out / "trials" / kept / "stages.json").read_text()}
    cluster.add_worker()
    r = subprocess.run([*tune, "--resume"], env=e, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return {"out": out, "storage": storage, "stdout": r.stdout, "first": first, "where": where, "killed": killed,
            "kept": kept, "summary": json.loads((out / "summary.json").read_text())}


def test_trials_run_on_both_nodes_of_the_cluster(sweep):
    s = sweep["first"]["summary"]  # before the worker node stopped: one trial on each node
    nodes = [t["node"] for t in s["trials"]]
    assert all(nodes) and len(set(nodes)) == 2, nodes  # one trial per node: each node has 1 CPU
    table = sweep["first"]["table"]
    assert "| node |" in table.replace("node | status", "node |") and all(n in table for n in nodes)
    assert (sweep["storage"] / "cluster").is_dir()  # Ray's experiment in --storage_path, not OUT/ray
    assert not (sweep["out"] / "ray").exists()


def test_a_stopped_worker_node_fails_its_trial_and_resume_completes_it(sweep):
    killed, kept = sweep["killed"], sweep["kept"]
    first = {t["trial"]: t for t in sweep["first"]["summary"]["trials"]}
    assert first[kept]["status"] == "done", first
    assert first[killed]["status"] == "error", first
    assert "actor" in first[killed]["error"], first[killed]  # Ray's word for the trial it lost with the node
    node = f"{sweep['where'][killed]['ip']} {sweep['where'][killed]['id'][:8]}"
    assert first[killed]["node"] == node != first[kept]["node"]
    assert f"- {killed}: {first[killed]['error']}" in sweep["first"]["table"] and node in sweep["first"]["table"]
    s = sweep["summary"]
    assert {t["trial"]: t["status"] for t in s["trials"]} == {kept: "done", killed: "done"}, sweep["stdout"][-3000:]
    assert not s["interrupted"]
    again = {t["trial"]: t.get("failed_before") for t in s["trials"]}
    assert again == {kept: None, killed: first[killed]["error"]}  # done now, and the table still says what it lost
    assert f"Failed, then run again:\n- {killed}: {first[killed]['error']}" in (sweep["out"] / "trials.md").read_text()
    # the finished trial was not run again
    assert (sweep["out"] / "trials" / kept / "stages.json").read_text() == sweep["first"]["kept_stages"]


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

