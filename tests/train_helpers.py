"""Small training data and a launcher runner shared by the training tests."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from dsprune.distributed import free_port, remove_shm_buffers, shm_buffers
from dsprune.settings import data_dir

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = REPO / "launchers" / "train.py"
BIN = Path(sys.executable).parent

TOPICS = [
    ("cell membrane transport", "the cell membrane regulates transport of ions and proteins"),
    ("aspirin heart attack", "aspirin reduces the risk of heart attack in some patients"),
    ("revenue growth", "revenue grew by ten percent in the fiscal year"),
    ("net income cash flow", "the company reported net income and operating cash flow"),
    ("dense retrieval vectors", "dense retrieval encodes queries and passages into vectors"),
    ("pruning layers", "pruning removes redundant layers from large language models"),
    ("gene expression embryo", "gene expression changes during development of the embryo"),
    ("interest rates bonds", "interest rates affect bond prices and bank margins"),
]


def shared_data(name: str, file: str | None = None) -> Path:
    """The shared data folder ``name`` (its ``file`` must be there too, if named); the test is skipped on a checkout
    with no shared data beside it."""
    import pytest

    folder = data_dir(name)
    if not ((folder / file).is_file() if file else folder.is_dir()):
        pytest.skip("shared data not present")
    return folder


def write_groups(path: Path, n: int = 64, seed: int = 0, scores: bool = True) -> Path:
    """``n`` groups over 8 topics: the positive shares the query's topic, negatives are other topics."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for i in range(n):
            t = i % len(TOPICS)
            q, doc = TOPICS[t]
            others = [d for j, (_, d) in enumerate(TOPICS) if j != t]
            row = {"query": f"{q} {i % 3}", "pos": [doc, f"{doc} study {i % 5}"], "neg": others}
            if scores:
                row["pos_scores"] = [2.0, 1.5]
                row["neg_scores"] = [round(rng.uniform(-1, 0.5), 3) for _ in others]
            f.write(json.dumps(row) + "\n")
    return path


def write_beir(folder: Path, split: str = "test") -> Path:
    """A tiny BEIR folder: 8 topic documents + 12 distractors, one judged document per query."""
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    docs = [{"_id": f"d{i}", "title": "", "text": d} for i, (_, d) in enumerate(TOPICS)]
    docs += [{"_id": f"x{i}", "title": "", "text": f"unrelated note number {i} about weather"} for i in range(12)]
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": q}) + "\n"
                                                  for i, (q, _) in enumerate(TOPICS)))
    (folder / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(TOPICS))))
    return folder


def env(extra: dict | None = None) -> dict:
    e = dict(os.environ)
    e.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
             PYTHONPATH=str(REPO))
    e.update(extra or {})
    return e


def command(args: list[str], launcher: str = "deepspeed", ranks: int = 2, port: int | None = None) -> list[str]:
    port = str(port or free_port())
    if launcher == "deepspeed":
        return [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", port, str(LAUNCHER), *args]
    if launcher == "torchrun":
        return [str(BIN / "torchrun"), "--nproc_per_node", str(ranks), "--master_port", port, str(LAUNCHER), *args]
    return [sys.executable, str(LAUNCHER), *args]


def launch(args: list[str], launcher: str = "deepspeed", ranks: int = 2, timeout: int = 300,
           extra_env: dict | None = None):
    """Run the launcher; ``.shm_left`` lists DeepSpeed shm buffers of this run still in /dev/shm (RAM) after it."""
    port = free_port()
    proc = subprocess.run(command(args, launcher, ranks, port), env=env(extra_env), capture_output=True,
                          text=True, timeout=timeout)
    proc.shm_left = [p.name for p in shm_buffers(port)]
    return proc


def ok(proc) -> None:
    """A launch ended well: exit 0, and no shared-memory buffer left behind in RAM."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not getattr(proc, "shm_left", []), f"DeepSpeed shm buffers left in /dev/shm: {proc.shm_left}"


def launch_and_kill(args: list[str], out: Path, min_step: int, timeout: int = 300,
                    extra_env: dict | None = None, leave_shm: bool = False) -> int:
    """Start a run, SIGKILL its whole process group once a checkpoint of step >= ``min_step`` is complete (its
    commit mark written: DeepSpeed's ``latest`` can name a checkpoint other ranks are still writing); returns that
    step. Its shm buffers are removed unless ``leave_shm`` (as a user's kill leaves them, for the next launch)."""
    from dsprune.train import checkpoints

    port = free_port()
    proc = subprocess.Popen(command(args, port=port), env=env(extra_env), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    t0, done = time.time(), []
    try:
        while time.time() - t0 < timeout and not done:
            done = [int(t.name[4:]) for t in checkpoints.tags(out / "checkpoints")
                    if int(t.name[4:]) >= min_step and (t / checkpoints.COMMIT).is_file()]
            if not done and proc.poll() is not None:
                raise AssertionError("training finished before it could be killed")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
        if not leave_shm:
            remove_shm_buffers(port)  # killed ranks never unlink theirs
    assert done, f"no complete checkpoint of step >= {min_step} within {timeout} s"
    return max(done)


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines() if line.strip()]


def ray_tmp(prefix: str = "ray") -> str:
    """A short folder for a Ray session: its socket paths must stay under 107 bytes."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


def tune_command(cfg: Path, *extra: str) -> list[str]:
    """``dsprune tune --config CFG ...`` with this venv's dsprune."""
    return [str(BIN / "dsprune"), "tune", "--config", str(cfg), *extra]
