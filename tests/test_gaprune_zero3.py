"""`launchers/dai.py` under DeepSpeed ZeRO-3 with 2 CPU ranks gives the single-process statistics, also with
the authors' batched statistics and per-matrix z-scored scores (reduced across shards)."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dsprune.distributed import free_port
from dsprune.importance.dai import STAT_FILES
from dsprune.settings import REPO_ROOT

ROWS = [("the cell membrane regulates transport", "revenue grew by ten percent", "dense retrieval"),
        ("what is the capital expenditure", "aspirin reduces the risk", "interest rates affect bonds"),
        ("gene expression changes", "net income and cash flow", "the company reported income"),
        ("a randomized trial of vitamin d", "pruning removes layers", "queries and passages")]


@pytest.mark.slow
def test_zero3_two_ranks_equal_single_process(tmp_path, tiny_dirs):
    from safetensors.torch import load_file

    from dsprune.cli import main

    if shutil.which("deepspeed", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("deepspeed launcher not installed")
    gen, dom = tmp_path / "gen.jsonl", tmp_path / "dom.jsonl"
    gen.write_text("".join(json.dumps({"query": q, "positive": p, "negative": n}) + "\n" for q, p, n in ROWS[:3]))
    dom.write_text("".join(json.dumps({"query": q, "positive": p, "negative": n}) + "\n" for q, p, n in ROWS[1:]))
    cfg = json.loads((REPO_ROOT / "ds_configs" / "dai_zero3.json").read_text())
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # shard even tiny weights
    (tmp_path / "z3.json").write_text(json.dumps(cfg))
    common = ["--model", str(tiny_dirs["llama"]), "--general", str(gen), "--domain", str(dom), "--attention",
              "--alignment", "tensor", "--variant", "reference", "--fisher_batch", "2", "--grad_batch", "3"]
    assert main(["dai", *common, "--out", str(tmp_path / "single")]) == 0
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu")
    launcher = str(Path(sys.executable).parent / "deepspeed")
    r = subprocess.run([launcher, "--num_gpus", "2", "--master_port", str(free_port()), str(REPO_ROOT / "launchers" / "dai.py"),
                        *common, "--out", str(tmp_path / "zero3"), "--deepspeed", str(tmp_path / "z3.json"),
                        "--dist_backend", "gloo"], env=env, capture_output=True, text=True, timeout=900,
                       cwd=str(REPO_ROOT))
    assert r.returncode == 0, r.stderr[-3000:]
    man = json.loads((tmp_path / "zero3" / "manifest.json").read_text())
    assert man["figures"]["world_size"] == 2 and len(man["figures"]["peak_rss_bytes_per_rank"]) == 2
    for stat, fname in STAT_FILES.items():
        a, b = load_file(str(tmp_path / "single" / fname)), load_file(str(tmp_path / "zero3" / fname))
        assert a.keys() == b.keys() and any("self_attn" in k for k in a)
        for k in a:
            scale = float(a[k].abs().max()) + 1e-12
            assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-5 * scale), (stat, k)
