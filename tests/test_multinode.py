"""Two "nodes" of one rank each on this machine, started separately as a cluster starts them: DeepSpeed's
launcher (`--hostfile H --no_ssh --node_rank i`) and torchrun (`--nnodes 2 --node_rank i --rdzv_endpoint`).

What a second node must not change: the per-step losses and the final weights of a 1-node 2-rank run of the
same config, and its checkpoints, which resume across topologies (2 nodes -> 1 node, and 1 node -> 2 nodes
under torchrun). A node whose disk does not hold the run folder is refused at start-up.
"""
import json
import shutil
import subprocess

import pytest
from safetensors.torch import load_file

from dsprune.distributed import free_port, shm_buffers
from train_helpers import BIN, LAUNCHER, env, launch, ok, read_log, write_groups

pytestmark = pytest.mark.slow

STEPS, SAVE = 4, 2
HOSTS = "node0 slots=1\nnode1 slots=1\n"  # names only: --no_ssh never resolves them


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_dirs):
    root = tmp_path_factory.mktemp("multinode")
    data = write_groups(root / "groups.jsonl")
    cfg = root / "base.yaml"
    cfg.write_text(f"model: {tiny_dirs['llama']}\ntrain_data: [{data}]\ngroup_size: 4\nper_device_batch_size: 4\n"
                   "seed: 7\nlearning_rate: 0.001\nlora: false\n")
    (root / "hostfile").write_text(HOSTS)
    return {"root": root, "cfg": cfg, "hostfile": root / "hostfile"}


def _args(setup, out, *extra):
    return ["--config", str(setup["cfg"]), "--deepspeed", "ds_configs/zero2.json", "--output_dir", str(out),
            "--max_steps", str(STEPS), "--save_steps", str(SAVE), *extra]


def _node(i: int, port: int, form: str, hostfile) -> list[str]:
    if form == "deepspeed":
        return [str(BIN / "deepspeed"), "--hostfile", str(hostfile), "--no_ssh", "--node_rank", str(i),
                "--master_addr", "127.0.0.1", "--master_port", str(port)]
    return [str(BIN / "torchrun"), "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", str(i),
            "--rdzv_endpoint", f"127.0.0.1:{port}"]


def launch_nodes(setup, args, form="deepspeed", wrap=(None, None), timeout=300):
    """Start node 0 and node 1 as two separate launcher processes (``wrap[i]``: a prefix for node i's
    command) and wait for both; returns their CompletedProcess-like results."""
    port = free_port()
    procs = []
    for i in (0, 1):
        cmd = [*_node(i, port, form, setup["hostfile"]), str(LAUNCHER), *args]
        procs.append(subprocess.Popen(wrap[i](cmd) if wrap[i] else cmd, env=env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    for d in done:
        d.shm_left = [b.name for b in shm_buffers(port)]
    return done


def _weights(out):
    return load_file(str(out / "model" / "model.safetensors"))


def _same_run(got, ref, from_step=0):
    """Losses of every step after ``from_step`` and the exported weights equal within 1e-6."""
    a = {r["step"]: r["loss"] for r in read_log(got)}
    b = {r["step"]: r["loss"] for r in read_log(ref)}
    assert sorted(a) == sorted(b) == list(range(1, STEPS + 1))
    for s in range(from_step + 1, STEPS + 1):
        assert abs(a[s] - b[s]) <= 1e-6, (s, a[s], b[s])
    wa, wb = _weights(got), _weights(ref)
    assert sorted(wa) == sorted(wb)
    worst = max((wa[k] - wb[k]).abs().max().item() for k in wa)
    assert worst <= 1e-6, worst


def _killed_after(src, dst, step):
    """``dst``: the run folder ``src`` as a kill right after its checkpoint of ``step`` would leave it."""
    shutil.copytree(src, dst)
    for later in (dst / "checkpoints").glob("step*"):
        if int(later.name[4:]) > step:
            shutil.rmtree(later)
    (dst / "checkpoints" / "latest").write_text(f"step{step}")
    (dst / "manifest.json").unlink()
    shutil.rmtree(dst / "model")
    return dst


@pytest.fixture(scope="module")
def one_node(setup):
    out = setup["root"] / "one_node"
    ok(launch(_args(setup, out)))
    return out


@pytest.fixture(scope="module")
def two_nodes(setup):
    out = setup["root"] / "two_nodes"
    for node in launch_nodes(setup, _args(setup, out)):
        ok(node)
    return out


def test_two_nodes_equal_one_node(one_node, two_nodes):
    man = json.loads((two_nodes / "manifest.json").read_text())
    assert man["world_size"] == 2
    _same_run(two_nodes, one_node)
    assert not list(two_nodes.glob(".shared-*"))  # the start-up probe is gone


def test_two_node_checkpoint_resumes_on_one_node(setup, one_node, two_nodes):
    out = _killed_after(two_nodes, setup["root"] / "resumed_on_one", SAVE)
    ok(launch(_args(setup, out, "--resume")))
    assert json.loads((out / "manifest.json").read_text())["figures"]["resumed_from"] == SAVE
    _same_run(out, one_node, from_step=SAVE)


def test_one_node_checkpoint_resumes_on_two_torchrun_nodes(setup, one_node):
    out = _killed_after(one_node, setup["root"] / "resumed_on_two", SAVE)
    for node in launch_nodes(setup, _args(setup, out, "--resume"), form="torchrun"):
        ok(node)
    assert json.loads((out / "manifest.json").read_text())["figures"]["resumed_from"] == SAVE
    _same_run(out, one_node, from_step=SAVE)


@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare(1) for a node-local disk")
def test_node_local_output_folder_is_refused(setup):
    """Node 1 runs in its own mount namespace with an empty tmpfs over the run folder's parent: its disk, not
    the one rank 0 writes. Without the start-up check the run finishes and leaves checkpoints that miss
    node 1's shards."""
    disk = setup["root"] / "node_disk"
    disk.mkdir()
    out = disk / "run"

    def local_disk(cmd):
        return ["unshare", "-m", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs tmpfs "{disk}" && exec "$0" "$@"', *cmd]

    probe = subprocess.run(local_disk(["true"]), capture_output=True)
    if probe.returncode != 0:
        pytest.skip("no permission for a mount namespace here")
    nodes = launch_nodes(setup, _args(setup, out), wrap=(None, local_disk))
    for node in nodes:
        assert node.returncode != 0
        lines = [l for l in node.stderr.splitlines() + node.stdout.splitlines() if l.startswith("error:")]
        assert lines == [f"error: {out}: not shared by every node: {_hostname()} (rank 1) cannot read what "
                         "rank 0 writes there; put the output on storage every node mounts (checkpoints hold "
                         "every rank's shards)"], node.stderr[-2000:]
    assert not out.exists()  # nothing written


def _hostname():
    import socket
    return socket.gethostname()
