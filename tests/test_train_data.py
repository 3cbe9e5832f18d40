"""Training data, argument validation and DeepSpeed config filling: fast, no process group."""
import json

import pytest

from dsprune.config import parse_args
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.train.arguments import TrainArgs
from dsprune.train.data import Collator, Schedule, load_groups, sample_example
from dsprune.train.engine import deepspeed_config
from dsprune.train.loop import check_before_start, train
from train_helpers import shared_data, write_beir, write_groups


def _row(**kw):
    row = {"query": "q", "pos": ["p"], "neg": ["n1", "n2"]}
    row.update(kw)
    return {k: v for k, v in row.items() if v is not None}


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("row, message", [
    (_row(neg=None), "missing field(s) 'neg'"),
    (_row(query=None), "missing field(s) 'query'"),
    (_row(neg=[]), "group has no negatives"),
    (_row(pos=[]), "group has an empty 'pos' list"),
    (_row(neg="n1"), "field 'neg' must be a list of strings"),
    (_row(pos_scores=[1.0], neg_scores=[0.5]), "'neg_scores' has 1 scores but 'neg' has 2 passages"),
    (_row(pos_scores=[1.0, 2.0], neg_scores=[0.1, 0.2]), "'pos_scores' has 2 scores but 'pos' has 1 passages"),
    (_row(pos_scores=["high"], neg_scores=[0.1, 0.2]), "'pos_scores' must be a list of numbers"),
])
def test_bad_groups_name_file_and_line(tmp_path, row, message):
    path = _write(tmp_path / "g.jsonl", [_row(), row])
    with pytest.raises(DsPruneError) as e:
        load_groups([str(path)])
    assert f"{path}:2:" in str(e.value) and message in str(e.value)


def test_kl_without_teacher_needs_scores(tmp_path):
    path = _write(tmp_path / "g.jsonl", [_row(pos_scores=[1.0], neg_scores=[0.1, 0.2]), _row()])
    assert len(load_groups([str(path)])) == 2
    with pytest.raises(DsPruneError, match=r"g.jsonl:2: kl_weight > 0 without a teacher model needs"):
        load_groups([str(path)], need_scores=True)


def test_triplets_are_grouped_by_query():
    path = shared_data("msmarco_trecdl_subset", "triplets.jsonl") / "triplets.jsonl"
    groups = load_groups([str(path)])
    assert len(groups) == 2501
    assert all(len(g.pos) == 1 and len(g.neg) > 1 and g.pos[0] not in g.neg for g in groups)
    assert len({g.query for g in groups}) == 43


def test_beir_train_qrels_become_groups(tmp_path):
    folder = write_beir(tmp_path / "b", split="train")
    groups = load_groups([str(folder)], beir_random_negatives=5, seed=1)
    assert len(groups) == 8
    docs = {json.loads(line)["_id"]: json.loads(line)["text"] for line in
            (folder / "corpus.jsonl").read_text().splitlines()}
    for i, g in enumerate(groups):
        assert g.pos == [docs[f"d{i}"]] and len(g.neg) == 5 and g.pos[0] not in g.neg
    assert [g.neg for g in groups] == [g.neg for g in load_groups([str(folder)], beir_random_negatives=5, seed=1)]
    with pytest.raises(DsPruneError, match="qrels not found"):
        load_groups([str(folder)], beir_split="dev")


def test_scifact_train_split_loads():
    shared_data("scifact", "corpus.jsonl")
    groups = load_groups(["scifact"], beir_random_negatives=4)
    assert len(groups) > 800 and all(len(g.neg) == 4 for g in groups)


def test_schedule_is_a_function_of_seed_and_step(tmp_path):
    groups = load_groups([str(write_groups(tmp_path / "g.jsonl", n=40))])
    s = Schedule(len(groups), per_device=3, world=2, accum=2, seed=5)
    assert s.global_batch == 12 and s.steps_per_epoch == 3
    step0 = [i for m in range(2) for r in range(2) for i in s.indices(0, m, r)]
    assert len(set(step0)) == 12
    epoch0 = [i for st in range(3) for m in range(2) for r in range(2) for i in s.indices(st, m, r)]
    assert len(set(epoch0)) == 36  # no group twice within an epoch
    again = Schedule(len(groups), 3, 2, 2, seed=5)
    assert s.examples(groups, 4, 4, 1, 1) == again.examples(groups, 4, 4, 1, 1)
    assert s.indices(3, 0, 0) != s.indices(0, 0, 0)  # a new epoch reshuffles
    with pytest.raises(DsPruneError, match="fewer than one global batch"):
        Schedule(10, 3, 2, 2, 0)


def test_sampled_group_keeps_scores_aligned(tmp_path):
    import random

    groups = load_groups([str(write_groups(tmp_path / "g.jsonl", n=8))])
    g = groups[0]
    ex = sample_example(g, 5, random.Random(0))
    assert ex.passages[0] in g.pos and all(p in g.neg for p in ex.passages[1:])
    for text, score in zip(ex.passages[1:], ex.scores[1:]):
        assert g.neg_scores[g.neg.index(text)] == score
    few = sample_example(g, 12, random.Random(0))  # 7 negatives available, 11 needed: repeats
    assert len(few.passages) == 12


def test_collator_tokenises_like_evaluation(tiny_dirs):
    enc = Encoder.load(tiny_dirs["llama"], config={"query_prompt": "query: ", "append_eos": True,
                                                   "padding_side": "left", "max_length": 16})
    groups = load_groups([str(_write_g(tiny_dirs))])
    batch = Collator(enc)(Schedule(len(groups), 2, 1, 1, 0).examples(groups, 3, 0, 0, 0))
    ref_q = enc.tokenize(batch["queries"], "query")
    ref_p = enc.tokenize(batch["passages"], "passage")
    for key in ("input_ids", "attention_mask"):
        assert batch["query"][key].equal(ref_q[key]) and batch["passage"][key].equal(ref_p[key])
    assert (batch["query"]["input_ids"][:, -1] == enc.tokenizer.eos_token_id).all()


def _write_g(tiny_dirs):
    from pathlib import Path
    return write_groups(Path(tiny_dirs["llama"]).parent / "collate_groups.jsonl", n=8)


def _args(tmp_path, tiny_dirs, **kw):
    data = write_groups(tmp_path / "g.jsonl", n=16)
    argv = ["--model", str(tiny_dirs["llama"]), "--train_data", str(data), "--output_dir", str(tmp_path / "out")]
    for k, v in kw.items():
        argv += [f"--{k}", str(v)]
    return parse_args(TrainArgs, argv)


@pytest.mark.parametrize("kw, message", [
    ({"dtype": "float64"}, "dtype must be one of"),
    ({"group_size": 1}, "group_size must be at least 2"),
    ({"infonce_weight": 0}, "all loss weights are 0"),
    ({"deepspeed": "ds_configs/nope.json"}, "deepspeed config not found"),
    ({"encoder": '{"poolin": "mean"}'}, "encoder: unknown option(s) poolin"),
    ({"deepspeed_overrides": '{"optimizer": {"type": "AdamW"}}'}, "remove the 'optimizer' block"),
    ({"deepspeed_overrides": '{"train_micro_batch_size_per_gpu": 3}'}, "contradicts the training arguments"),
    ({"teacher": "/no/such/teacher"}, "teacher not found"),
    ({"resume": "true"}, "--resume: no complete checkpoint"),
    ({"grad_cache_chunk": -1}, "grad_cache_chunk must be >= 0"),
    ({"eval_max_length": 1}, "eval_max_length must be 0"),
])
def test_bad_options_fail_before_start(tmp_path, tiny_dirs, kw, message):
    args = _args(tmp_path, tiny_dirs, **kw)
    with pytest.raises(DsPruneError) as e:
        train(args)  # fails before any process group or model exists
    assert message in str(e.value)
    assert not (tmp_path / "out").exists()


def test_unknown_config_key_and_bad_data_via_train(tmp_path, tiny_dirs):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("model: x\nlearnig_rate: 0.1\n")
    with pytest.raises(DsPruneError, match="unknown option.*learnig_rate"):
        parse_args(TrainArgs, ["--config", str(cfg)])
    bad = _write(tmp_path / "bad.jsonl", [_row(pos_scores=[1.0], neg_scores=[0.5])])
    args = _args(tmp_path, tiny_dirs)
    args.train_data = [str(bad)]
    with pytest.raises(DsPruneError, match=r"bad.jsonl:1: 'neg_scores' has 1 scores"):
        train(args)


def test_deepspeed_config_auto_values(tmp_path, tiny_dirs):
    args = _args(tmp_path, tiny_dirs, per_device_batch_size=3, gradient_accumulation_steps=2, dtype="bfloat16",
                 deepspeed="ds_configs/zero3_offload.json")
    check_before_start(args)
    cfg = deepspeed_config(args, world=4, hidden=64)
    assert cfg["train_batch_size"] == 24 and cfg["train_micro_batch_size_per_gpu"] == 3
    assert cfg["bf16"]["enabled"] is True and cfg["fp16"]["enabled"] is False
    zo = cfg["zero_optimization"]
    assert zo["stage"] == 3 and zo["offload_optimizer"]["device"] == "cpu"
    assert zo["stage3_param_persistence_threshold"] == 640 and zo["reduce_bucket_size"] == 4096
    assert "auto" not in json.dumps(cfg)


def test_a_packaged_model_name_trains_like_a_path(tmp_path, tiny_dirs, monkeypatch):
    """`--model smollm2` works in the launcher as in every command (the recipes' train-full stage uses it)."""
    import dsprune.packaged as packaged
    monkeypatch.setitem(packaged.PACKAGED, "tinyllm", ("tiny_pkg", None, "pip install tiny-pkg"))
    monkeypatch.setattr(packaged, "resolve", lambda name: tiny_dirs["llama"])
    check_before_start(_args(tmp_path, tiny_dirs, model="tinyllm"))
    with pytest.raises(DsPruneError, match="model not found: nosuch"):
        check_before_start(_args(tmp_path, tiny_dirs, model="nosuch"))


def test_freeze_keeps_named_parameters_out_of_full_training(tmp_path, tiny_dirs):
    from dsprune.train.loop import Hooks, load_student
    args = _args(tmp_path, tiny_dirs, lora="false", freeze="embed_tokens")
    enc = load_student(args, "cpu", Hooks())
    frozen = {n for n, p in enc.named_parameters() if not p.requires_grad}
    assert frozen and all("embed_tokens" in n for n in frozen)
    assert any(p.requires_grad for p in enc.parameters())
    args.freeze = "embed_tokenz"
    with pytest.raises(DsPruneError, match="freeze: no parameter name contains 'embed_tokenz'"):
        load_student(args, "cpu", Hooks())
    with pytest.raises(DsPruneError, match="freeze applies to full-parameter training"):
        train(_args(tmp_path, tiny_dirs, freeze="embed_tokens"))
