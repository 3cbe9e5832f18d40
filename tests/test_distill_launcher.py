"""Self-distillation through the real launcher (`deepspeed --num_gpus 2 launchers/train.py --mode distill`,
gloo, 2 CPU ranks): a 2-layer student learns a 4-layer teacher from a BEIR folder (train pairs) plus plain text.

Runs are module-scoped and shared: ZeRO-2 full parameters with the gradient cache, periodic eval and export;
the same options without the gradient cache (its losses must match); the first run killed after a checkpoint
and resumed (its losses must match); ZeRO-3 + LoRA. The teacher's embeddings are computed once, by the first
run, and read from the cache by every later one.
"""
import json
import math

import pytest

from dsprune.encoder import Encoder
from dsprune.tiny import save_tiny
from train_helpers import launch, launch_and_kill, ok, read_log, write_beir

pytestmark = pytest.mark.slow

STEPS = 8
Z3_OVERRIDES = json.dumps({"zero_optimization": {"stage3_param_persistence_threshold": 0}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("distill")
    teacher = save_tiny(root / "teacher", "llama", layers=4)
    student = save_tiny(root / "student", "llama", seed=1, layers=2)
    train = write_beir(root / "beir_train", split="train")
    evalset = write_beir(root / "beir_test", split="test")
    text = root / "notes.txt"
    text.write_text("".join(f"note {i} on {['cells and membranes', 'revenue and bonds'][i % 2]}\n"
                            for i in range(24)))
    cfg = root / "distill.yaml"
    cfg.write_text(f"model: {student}\nteacher: {teacher}\nmode: distill\n"
                   f"distill_data: [{train}, {text}]\nper_device_batch_size: 4\nseed: 3\n"
                   "learning_rate: 0.001\nlr_scheduler: constant\nlora: false\ntemperature: 0.05\n")
    env = {"DSPRUNE_CACHE": str(root / "cache")}
    return {"root": root, "cfg": cfg, "eval": evalset, "env": env, "cache": root / "cache" / "teacher_embeddings"}


def _args(setup, out, *extra):
    return ["--config", str(setup["cfg"]), "--output_dir", str(out), *extra]


GC = ["--grad_cache_chunk", "3", "--max_steps", str(STEPS), "--save_steps", "4"]


@pytest.fixture(scope="module")
def run_gc(setup):
    out = setup["root"] / "gc"
    ok(launch(_args(setup, out, *GC, "--eval_task", str(setup["eval"]), "--eval_steps", "4"),
              extra_env=setup["env"]))
    stamps = {p.name: p.stat().st_mtime_ns for p in setup["cache"].glob("*.safetensors")}
    return out, stamps


@pytest.fixture(scope="module")
def run_plain(setup, run_gc):
    out = setup["root"] / "plain"
    ok(launch(_args(setup, out, "--max_steps", "3", "--save_steps", "0", "--export", "false"),
              extra_env=setup["env"]))
    return out


@pytest.fixture(scope="module")
def run_resumed(setup, run_gc):
    out = setup["root"] / "killed"
    args = _args(setup, out, *GC, "--eval_task", str(setup["eval"]), "--eval_steps", "4")
    killed_at = launch_and_kill(args, out, min_step=4, extra_env=setup["env"])
    assert not (out / "manifest.json").exists()
    ok(launch(args + ["--resume"], extra_env=setup["env"]))
    return out, killed_at


@pytest.fixture(scope="module")
def run_z3_lora(setup, run_gc):
    out = setup["root"] / "z3"
    ok(launch(_args(setup, out, "--deepspeed", "ds_configs/zero3.json", "--deepspeed_overrides", Z3_OVERRIDES,
                    "--lora", "true", "--lora_r", "8", "--lora_alpha", "16", "--max_steps", "4",
                    "--grad_cache_chunk", "2"), extra_env=setup["env"]))
    return out


def test_distillation_trains_logs_every_part_and_exports(run_gc, setup):
    out, _ = run_gc
    rows = read_log(out)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    for r in rows:
        assert {"loss_cosine", "loss_kl", "loss_infonce"} <= set(r)
        assert r["loss"] == pytest.approx(r["loss_cosine"] + r["loss_kl"] + r["loss_infonce"], rel=1e-5)
    first, last = rows[0]["loss_cosine"], sum(r["loss_cosine"] for r in rows[-2:]) / 2
    assert last < 0.8 * first, (first, last)
    man = json.loads((out / "manifest.json").read_text())
    assert man["stage"] == "distill" and man["inputs"]["teacher"].endswith("teacher")
    d = man["distill"]
    assert d["pairs"] == 8 and d["items"] == 8 + 12 + 24 and d["dim"] == 64
    assert set(d["cache"]) == {"query", "passage"}
    for c in d["cache"].values():
        assert c["file"].endswith(c["key"] + ".safetensors") and c["key"].startswith(d["fingerprint"][:16])
    assert man["figures"]["eval"]["ndcg_at_10"] >= 0
    assert Encoder.load(out / "model").embedding_dim == 64

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"loss/total", "loss/cosine", "loss/kl", "loss/infonce", "eval/ndcg_at_10"} <= tags, tags
    assert [e.step for e in acc.Scalars("eval/ndcg_at_10")] == [0, 4, 8]


def test_gradient_cache_matches_the_plain_step(run_gc, run_plain):
    gc, plain = read_log(run_gc[0]), read_log(run_plain)
    for a, b in zip(gc[:3], plain):  # the same losses step after step: the same gradients and updates
        for k in ("loss", "loss_cosine", "loss_kl", "loss_infonce"):
            assert math.isclose(a[k], b[k], rel_tol=1e-4, abs_tol=1e-5), (k, a, b)


def test_killed_distillation_resumes_with_same_losses(run_gc, run_resumed):
    out, killed_at = run_resumed
    man = json.loads((out / "manifest.json").read_text())
    k = man["figures"]["resumed_from"]
    assert 4 <= k <= killed_at and k % 4 == 0
    ref = {r["step"]: r for r in read_log(run_gc[0])}
    got = read_log(out)
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for r in got:
        if r["step"] > k:
            for key in ("loss", "loss_cosine", "loss_kl", "loss_infonce"):
                assert math.isclose(r[key], ref[r["step"]][key], rel_tol=1e-4, abs_tol=1e-5), (key, r)


def test_teacher_embeddings_are_computed_once(setup, run_gc, run_plain, run_resumed, run_z3_lora):
    _, stamps = run_gc
    assert len(stamps) == 2  # one query table, one passage table
    assert {p.name: p.stat().st_mtime_ns for p in setup["cache"].glob("*.safetensors")} == stamps
    keys = {json.dumps(json.loads((o / "manifest.json").read_text())["distill"]["cache"], sort_keys=True)
            for o in (run_gc[0], run_resumed[0], run_z3_lora)}
    assert len(keys) == 1


def test_tables_the_two_ranks_share_out_equal_one_process_encoding(setup, run_gc):
    """Each rank embeds every other text and the shares are gathered: the table must hold each text's own row."""
    import torch
    from safetensors import safe_open

    from dsprune.train import distill as D
    items = D.load_items([str(setup["root"] / "beir_train"), str(setup["root"] / "notes.txt")])
    teacher = Encoder.load(setup["root"] / "teacher")
    for kind in ("query", "passage"):
        texts = sorted({getattr(i, kind) for i in items if getattr(i, kind) is not None})
        (f,) = [f for f in setup["cache"].glob(f"*-{kind}-*.safetensors")]
        with safe_open(str(f), "pt") as fh:
            table, meta = fh.get_tensor("embeddings"), fh.metadata()
        assert meta["texts_sha256"] == D.texts_hash(texts) and table.shape[0] == len(texts) > 2
        expected = teacher.encode(texts, kind, show_progress=False)
        assert torch.allclose(table, expected, atol=1e-5), (kind, (table - expected).abs().max())


def test_zero3_lora_distillation(run_z3_lora):
    rows = read_log(run_z3_lora)
    assert len(rows) == 4 and all(r["grad_norm"] and r["grad_norm"] > 0 for r in rows)
    man = json.loads((run_z3_lora / "manifest.json").read_text())
    assert man["deepspeed_config"]["zero_optimization"]["stage"] == 3
    assert man["params"]["trainable"] < man["params"]["total"] / 2
    assert not any("lora" in n for n, _ in Encoder.load(run_z3_lora / "model").named_parameters())
