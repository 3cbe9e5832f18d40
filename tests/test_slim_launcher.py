"""Self-slimming and masked retraining through the real launcher (`deepspeed --num_gpus 2`, 2 CPU ranks).

One ZeRO-3 slimming run on a tiny Llama with every parameter partitioned (persistence threshold 0), a
`dsprune mask` of its gates, and a retraining run on the structured mask (neurons removed, export physically
smaller). Unstructured masks held through retraining: test_gaprune_retrain.py.
"""
import json

import pytest
import torch

from dsprune import formats
from dsprune.cli import main as cli
from dsprune.encoder import Encoder
from dsprune.surgery import gates as G
from dsprune.surgery.prune import intermediate_sizes
from train_helpers import launch, ok, read_log, write_groups

pytestmark = pytest.mark.slow

Z3 = json.dumps({"zero_optimization": {"stage3_param_persistence_threshold": 0}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory, tiny_dirs):
    root = tmp_path_factory.mktemp("slim")
    data = write_groups(root / "groups.jsonl")
    cfg = root / "base.yaml"
    cfg.write_text(f"model: {tiny_dirs['llama']}\ntrain_data: [{data}]\ngroup_size: 4\nper_device_batch_size: 4\n"
                   "seed: 3\nlearning_rate: 0.001\nlora_r: 8\nlora_alpha: 16\nsave_steps: 0\n")
    return {"root": root, "cfg": cfg, "model": tiny_dirs["llama"]}


@pytest.fixture(scope="module")
def slim_run(setup):
    out = setup["root"] / "slim"
    ok(launch(["--config", str(setup["cfg"]), "--mode", "slim", "--slim_train", "gates", "--output_dir", str(out),
                "--deepspeed", "ds_configs/zero3.json", "--deepspeed_overrides", Z3, "--max_steps", "6",
                "--slim_lambda", "50", "--slim_lr", "0.05", "--slim_histogram_steps", "3"]))
    return out


def test_gates_train_under_zero3(slim_run, setup):
    values, meta = G.load_gates(slim_run)
    assert meta["num_layers"] == 4 and sorted(values) == [0, 1, 2, 3]
    z = torch.cat(list(values.values()))
    # the penalty pulls the gates down; InfoNCE moves them apart (with Adam, the penalty alone would move
    # every gate by the same amount): both gradients reached the partitioned parameter
    assert z.mean() < 0.99
    assert z.std() > 1e-3
    rows = read_log(slim_run)
    assert len(rows) == 6 and all("loss_slim_penalty" in r and "slim_frac_below" in r for r in rows)
    assert rows[-1]["loss_slim_penalty"] < rows[0]["loss_slim_penalty"]
    assert rows[0]["lr"] == pytest.approx(0.05)  # the gates group, its own learning rate
    man = formats.read_manifest(slim_run)
    assert man["stage"] == "slim" and man["config"]["lora"] is False
    assert man["slim"]["trainable_params"] == man["slim"]["gates"] == 4 * 128
    # the export carries the trained (here: unchanged) weights without gates, loadable like any export
    start, exported = Encoder.load(setup["model"]).eval(), Encoder.load(slim_run / "model").eval()
    t = start.tokenize(["cell membrane transport"], "query")
    with torch.no_grad():
        assert torch.allclose(start(**t), exported(**t), atol=1e-6)


def test_tensorboard_gate_histogram(slim_run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(slim_run / "tensorboard"), size_guidance={"histograms": 0, "scalars": 0})
    acc.Reload()
    tags = acc.Tags()
    assert "slim/gates_relu_z" in tags["histograms"]
    assert [e.step for e in acc.Histograms("slim/gates_relu_z")] == [1, 3, 6]
    assert {"loss/slim_penalty", "train/slim_frac_below", "slim/frac_below_threshold"} <= set(tags["scalars"])


@pytest.fixture(scope="module")
def retrain_run(setup, slim_run):
    mask = setup["root"] / "mask"
    assert cli(["mask", "--gates", str(slim_run), "--ratio", "0.3", "--out", str(mask)]) == 0
    out = setup["root"] / "retrain"
    ok(launch(["--config", str(setup["cfg"]), "--model", str(slim_run / "model"), "--mask", str(mask),
                "--output_dir", str(out), "--deepspeed", "ds_configs/zero2.json", "--max_steps", "3"]))
    return out, mask


def test_retrain_with_structured_mask_exports_sliced(retrain_run):
    out, mask = retrain_run
    tensors, meta = formats.read_mask(mask)
    enc = Encoder.load(out / "model")
    assert intermediate_sizes(enc) == [int(tensors[f"mlp.{i}"].sum()) for i in range(4)]
    assert sum(intermediate_sizes(enc)) == meta["kept"] == 4 * 128 - round(0.3 * 4 * 128)
    man = formats.read_manifest(out)
    assert man["stage"] == "retrain" and man["mask"]["method"] == "slim"
    rows = read_log(out)
    assert len(rows) == 3 and all(math_finite(r["loss"]) for r in rows)


def math_finite(x):
    return x == x and abs(x) != float("inf")


def _weights(folder) -> dict:
    from safetensors.torch import load_file
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update({k.removeprefix("backbone."): v for k, v in load_file(str(f)).items()})
    return out


def test_gates_only_export_is_its_input_bit_for_bit(slim_run, setup):
    # gates-only slimming trains nothing but z, and the export drops z unfolded: the next stage must start
    # from exactly the model the slimming started from (its gates only choose the mask)
    before, after = _weights(setup["model"]), _weights(slim_run / "model")
    assert sorted(before) == sorted(after)
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert not changed, f"gates-only slimming changed {changed[:3]}"


def _first_loss(run_dir, model) -> float:
    """The loss the run in ``run_dir`` logged at its first step, recomputed in this process for ``model``: the
    same options, batch (both ranks, cross-rank negatives) and held mask, before any update."""
    import dataclasses

    from dsprune.losses import info_nce
    from dsprune.train.data import Collator, Schedule
    from dsprune.train.loop import load_data, load_student
    from dsprune.train.slim import StageArgs, stage_hooks

    args = StageArgs(**formats.read_json(run_dir / "train_args.json"))
    args = dataclasses.replace(args, model=str(model))
    enc = load_student(args, "cpu", stage_hooks(args), attach_lora=False).eval()
    groups = load_data(args)
    world = 2
    sched = Schedule(len(groups), args.per_device_batch_size, world, args.gradient_accumulation_steps, args.seed)
    collate = Collator(enc, args.query_max_length, args.passage_max_length)
    q, p = [], []
    with torch.no_grad():
        for rank in range(world):
            b = collate(sched.examples(groups, args.group_size, 0, 0, rank))
            q.append(enc(b["query"]["input_ids"], b["query"]["attention_mask"]))
            p.append(enc(b["passage"]["input_ids"], b["passage"]["attention_mask"]))
        return float(info_nce(torch.cat(q), torch.cat(p), args.group_size, args.temperature, cross_rank=False))


def test_next_stage_starts_from_the_unslimmed_model(retrain_run, setup, slim_run):
    # the stage after slimming (here: its mask held) logs as first loss the loss of the input model with that
    # mask on that batch: slimming itself left no trace in the weights the next stage trains
    out, _ = retrain_run
    logged = read_log(out)[0]["loss"]
    assert logged == pytest.approx(_first_loss(out, setup["model"]), rel=1e-5, abs=1e-6)
    assert logged == pytest.approx(_first_loss(out, slim_run / "model"), rel=1e-5, abs=1e-6)
