"""The real launcher (`deepspeed --num_gpus 2 launchers/train.py`, gloo, 2 CPU ranks) on a tiny Llama.

Runs are module-scoped and shared by the tests: ZeRO-2 full-parameter + KL from data scores + eval;
ZeRO-3 + LoRA; the same ZeRO-3 run killed with -9 after a checkpoint, torn, and resumed; torchrun without cross-rank
negatives, distilling from the starting model itself, with gradient checkpointing.
"""
import json
import math

import pytest
import torch

from dsprune.distributed import SHM, shm_buffers
from dsprune.encoder import Encoder
from dsprune.losses import info_nce, kl_distill
from dsprune.train.data import Collator, Schedule, load_groups
from train_helpers import launch, launch_and_kill, ok, read_log, write_beir, write_groups

pytestmark = pytest.mark.slow

SEED, GROUP, PER_DEVICE, RANKS = 7, 4, 4, 2
Z3_OVERRIDES = json.dumps({"zero_optimization": {"stage3_param_persistence_threshold": 0}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_dirs):
    root = tmp_path_factory.mktemp("train")
    data = write_groups(root / "groups.jsonl")
    beir = write_beir(root / "beir")
    cfg = root / "base.yaml"
    cfg.write_text(f"model: {tiny_dirs['llama']}\ntrain_data: [{data}]\ngroup_size: {GROUP}\n"
                   f"per_device_batch_size: {PER_DEVICE}\nseed: {SEED}\nlearning_rate: 0.001\n"
                   "lora_r: 8\nlora_alpha: 16\n")
    return {"root": root, "cfg": cfg, "data": data, "beir": beir, "model": tiny_dirs["llama"]}


@pytest.fixture(scope="module")
def run_z2(setup):
    out = setup["root"] / "z2"
    ok(launch(["--config", str(setup["cfg"]), "--deepspeed", "ds_configs/zero2.json", "--output_dir", str(out),
                "--lora", "false", "--learning_rate", "0.0003", "--max_steps", "12", "--save_steps", "4", "--kl_weight", "0.5", "--eval_task", str(setup["beir"]),
                "--eval_steps", "6"]))
    return out


Z3_ARGS = ["--deepspeed", "ds_configs/zero3.json", "--deepspeed_overrides", Z3_OVERRIDES,
           "--max_steps", "16", "--save_steps", "4", "--step_breakdown", "true", "--length_buckets", "1"]


@pytest.fixture(scope="module")
def run_z3(setup):
    out = setup["root"] / "z3"
    ok(launch(["--config", str(setup["cfg"]), "--output_dir", str(out), *Z3_ARGS]))
    return out


@pytest.fixture(scope="module")
def run_z3_resumed(setup):
    """Killed with -9 after its second checkpoint, leaving its shm buffers; then its newest checkpoint is torn
    (a shard cut short) and its log ends in half a row, as a crash mid-write leaves them; then resumed."""
    out = setup["root"] / "z3_killed"
    args = ["--config", str(setup["cfg"]), "--output_dir", str(out), *Z3_ARGS]
    before = set(shm_buffers("*"))
    killed_at = launch_and_kill(args, out, min_step=8, leave_shm=True)
    orphans = set(shm_buffers("*")) - before
    assert not (out / "manifest.json").exists()
    torn = out / "checkpoints" / f"step{killed_at}"
    shard = max((p for p in torn.iterdir() if p.suffix == ".pt"), key=lambda p: p.stat().st_size)
    shard.write_bytes(shard.read_bytes()[:shard.stat().st_size // 2])
    with open(out / "log.jsonl", "a") as f:
        f.write('{"step": 99, "loss": 0.')
    proc = launch(args + ["--resume"])
    ok(proc)
    proc.orphans = sorted(p.name for p in orphans)
    return out, killed_at, proc


@pytest.fixture(scope="module")
def run_local(setup):
    out = setup["root"] / "local"
    ok(launch(["--config", str(setup["cfg"]), "--output_dir", str(out), "--max_steps", "3",
                "--cross_rank_negatives", "false", "--teacher", "self", "--kl_weight", "1.0", "--export", "false",
                "--gradient_checkpointing", "true"],
               launcher="torchrun"))
    return out


def _falls(rows, key="loss_infonce"):
    first, last = rows[0][key], sum(r[key] for r in rows[-3:]) / 3
    assert last < 0.6 * first, (first, last)


def test_zero2_full_parameter_trains_and_exports(run_z2, setup):
    rows = read_log(run_z2)
    assert [r["step"] for r in rows] == list(range(1, 13))
    _falls(rows)
    assert all(r["grad_norm"] is not None and r["grad_norm"] > 0 for r in rows)
    man = json.loads((run_z2 / "manifest.json").read_text())
    assert man["deepspeed_config"]["zero_optimization"]["stage"] == 2
    assert man["world_size"] == RANKS and man["global_batch"] == PER_DEVICE * RANKS
    assert man["figures"]["steps"] == 12 and man["figures"]["tokens_per_s"] > 0
    assert man["params"]["trainable"] == man["params"]["total"]
    peaks = man["figures"]["peak_rss_gb_per_rank"]  # each rank's own peak, a real process figure
    setup_peaks = man["figures"]["setup_peak_rss_gb_per_rank"]
    assert len(peaks) == RANKS and all(0.05 < s <= g < 64 for s, g in zip(setup_peaks, peaks))
    assert man["figures"]["malloc_mmap_threshold"] == 1 << 20  # glibc here: freed activations are returned
    enc = Encoder.load(run_z2 / "model")
    assert type(enc.model).__name__ == "DsPruneModel"
    trained = dict(enc.backbone.named_parameters())
    start = dict(Encoder.load(setup["model"]).backbone.named_parameters())
    assert all(not torch.equal(start[n], trained[n]) for n in start)  # every parameter trained


def test_zero3_lora_trains_and_exports_merged(run_z3, setup):
    rows = read_log(run_z3)
    assert len(rows) == 16
    _falls(rows)
    man = json.loads((run_z3 / "manifest.json").read_text())
    zo = man["deepspeed_config"]["zero_optimization"]
    assert zo["stage"] == 3 and zo["stage3_param_persistence_threshold"] == 0
    assert man["params"]["trainable"] < man["params"]["total"] / 2  # adapters only
    enc = Encoder.load(run_z3 / "model")
    assert type(enc.model).__name__ == "DsPruneModel"
    assert not any("lora" in n for n, _ in enc.named_parameters())
    # the gathered ZeRO-3 shards carry the training: merged weights differ from the starting model's
    start = Encoder.load(setup["model"])
    texts = ["aspirin heart attack", "interest rates affect bond prices"]
    assert not torch.allclose(enc.encode(texts, show_progress=False), start.encode(texts, show_progress=False),
                              atol=1e-4)


def test_killed_run_resumes_with_same_losses(run_z3, run_z3_resumed):
    out, killed_at, _ = run_z3_resumed
    man = json.loads((out / "manifest.json").read_text())
    k = man["figures"]["resumed_from"]
    assert 4 <= k < 16 and k % 4 == 0 and k <= killed_at
    ref = {r["step"]: r for r in read_log(run_z3)}
    got = read_log(out)
    assert [r["step"] for r in got] == list(range(1, 17))  # the killed run's rows after k were dropped
    for r in got:
        if r["step"] > k:
            assert math.isclose(r["loss"], ref[r["step"]]["loss"], rel_tol=1e-4, abs_tol=1e-5), (r, ref[r["step"]])
            assert math.isclose(r["lr"], ref[r["step"]]["lr"], rel_tol=1e-9)


def test_each_rank_logs_its_step_and_gets_its_length_bucket(run_z3, setup):
    """Every step's row holds each rank's phases and collectives; each rank's tokens are those of the groups
    length buckets deal it (recomputed here), which are not those of the unbucketed order."""
    from dsprune.train.data import padded_tokens
    rows = read_log(run_z3)
    enc = Encoder.load(setup["model"])
    groups = load_groups([str(setup["data"])], seed=SEED)
    coll = Collator(enc)
    plain, bucketed = (Schedule(len(groups), PER_DEVICE, RANKS, 1, SEED) for _ in range(2))
    bucketed.bucket_by_length(1, lambda e, i: padded_tokens(bucketed.example(groups, GROUP, e, i), coll.token_counts))

    def tokens(sched, step, rank):
        b = coll(sched.examples(groups, GROUP, step, 0, rank))
        return int(b["query"]["attention_mask"].sum() + b["passage"]["attention_mask"].sum())
    differ = 0
    for r in rows:
        assert len(r["breakdown"]) == RANKS
        for rank, b in enumerate(r["breakdown"]):
            assert all(b[k] > 0 for k in ("forward", "loss", "backward", "step", "seconds"))
            assert b["comm_bytes"] > 0 and b["comm"] > 0 and b["comm_ops"]
            assert b["tokens"] == tokens(bucketed, r["step"] - 1, rank) <= b["padded_tokens"]
            differ += b["tokens"] != tokens(plain, r["step"] - 1, rank)
    assert differ


def test_a_torn_checkpoint_falls_back_to_the_previous_complete_one(run_z3_resumed):
    out, killed_at, proc = run_z3_resumed
    said = [line for line in (proc.stdout + proc.stderr).splitlines() if "incomplete" in line]
    k = json.loads((out / "manifest.json").read_text())["figures"]["resumed_from"]
    assert k < killed_at and len(said) == 1 and f"step{killed_at} is incomplete" in said[0], said
    assert said[0].endswith(f"resuming from step{k}")
    assert all((d / "commit.json").is_file() for d in (out / "checkpoints").glob("step*"))


def test_the_next_launch_removes_the_shm_buffers_a_killed_one_left(run_z3_resumed):
    _, _, proc = run_z3_resumed
    assert len(proc.orphans) == RANKS                        # what kill -9 left in RAM
    # gone, but not necessarily by this launch: other test workers launch too, and any launch removes orphans
    # (test_edges checks what the removal says)
    assert not any((SHM / name).exists() for name in proc.orphans)


def _step1_embeddings(setup):
    """What every rank embeds at step 1, recomputed in this process with the starting model."""
    enc = Encoder.load(setup["model"]).eval()
    groups = load_groups([str(setup["data"])], seed=SEED)
    sched = Schedule(len(groups), PER_DEVICE, RANKS, 1, SEED)
    coll = Collator(enc)
    out = []
    with torch.no_grad():
        for rank in range(RANKS):
            b = coll(sched.examples(groups, GROUP, 0, 0, rank))
            q = enc(b["query"]["input_ids"], b["query"]["attention_mask"])
            p = enc(b["passage"]["input_ids"], b["passage"]["attention_mask"])
            out.append((q, p, b["teacher_scores"]))
    return out


def test_cross_rank_negatives_change_the_loss(setup, run_z2, run_local):
    per_rank = _step1_embeddings(setup)
    q_all = torch.cat([q for q, _, _ in per_rank])
    p_all = torch.cat([p for _, p, _ in per_rank])
    global_loss = info_nce(q_all, p_all, GROUP, 0.02, cross_rank=False).item()
    local_loss = sum(info_nce(q, p, GROUP, 0.02, cross_rank=False).item() for q, p, _ in per_rank) / RANKS
    z2, local = read_log(run_z2)[0], read_log(run_local)[0]
    # with cross-rank negatives every query is scored against both ranks' passages ...
    assert math.isclose(z2["loss_infonce"], global_loss, rel_tol=1e-4)
    # ... without them, against its own rank's only; more negatives make the task harder
    assert math.isclose(local["loss_infonce"], local_loss, rel_tol=1e-4)
    assert global_loss > local_loss + 0.05
    # KL from the data's teacher scores, averaged over ranks
    kl = sum(kl_distill(q, p, s, GROUP, 0.02, 1.0).item() for q, p, s in per_rank) / RANKS
    assert math.isclose(z2["loss_kl"], kl, rel_tol=1e-4)


def test_self_distillation_starts_at_zero(run_local):
    rows = read_log(run_local)
    assert abs(rows[0]["loss_kl"]) < 1e-5  # the teacher is the student before its first update
    assert rows[-1]["loss_kl"] > 1e-4


def test_lora_adapter_merge_preserves_embeddings(run_z3, setup):
    from peft import PeftModel

    merged = Encoder.load(run_z3 / "model")
    base = Encoder.load(setup["model"])
    base.model = PeftModel.from_pretrained(base.model, str(run_z3 / "adapter"))
    texts = ["gene expression embryo", "pruning removes redundant layers", "bank margins"]
    for kind in ("query", "passage"):
        a = base.encode(texts, kind, show_progress=False)
        b = merged.encode(texts, kind, show_progress=False)
        assert torch.allclose(a, b, atol=1e-5), (a - b).abs().max()


def test_tensorboard_scalars(run_z2):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = list((run_z2 / "tensorboard").glob("events.out.tfevents.*"))
    assert files
    acc = EventAccumulator(str(run_z2 / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("loss/total", "loss/infonce", "loss/kl", "train/lr", "train/grad_norm", "train/queries_per_s",
                "train/tokens_per_s", "eval/ndcg_at_10"):
        assert tag in tags, (tag, tags)
    loss = acc.Scalars("loss/total")
    assert [e.step for e in loss] == list(range(1, 13))
    assert loss[0].value == pytest.approx(read_log(run_z2)[0]["loss"], rel=1e-6)
    assert [e.step for e in acc.Scalars("eval/ndcg_at_10")] == [0, 6, 12]
    assert all(0 <= e.value <= 1 for e in acc.Scalars("eval/ndcg_at_10"))


def test_bad_data_fails_before_deepspeed_starts(setup):
    bad = setup["root"] / "bad.jsonl"
    bad.write_text(json.dumps({"query": "q", "pos": ["p"], "neg": []}) + "\n")
    out = setup["root"] / "bad_run"
    proc = launch(["--config", str(setup["cfg"]), "--train_data", str(bad), "--output_dir", str(out)])
    assert proc.returncode != 0
    assert f"{bad}:1: group has no negatives" in proc.stderr
    assert "Initializing TorchBackend" not in proc.stderr + proc.stdout
    assert not out.exists()
