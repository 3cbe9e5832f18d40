"""Length buckets (``--length_buckets``): 2 ranks, simulated by the schedule's rank and world arguments, get
similarly long groups in a step; every group is still taken once per epoch; the order is a pure function of the
seed; and a group's length is the padded tokens the collator makes of it."""
import random
import re

import pytest

from dsprune.config import parse_args
from dsprune.errors import DsPruneError
from dsprune.train.arguments import TrainArgs
from dsprune.train.data import Collator, Example, Schedule, padded_tokens
from dsprune.train.loop import Hooks, train
from train_helpers import write_groups

N, PER_DEVICE, WORLD = 96, 4, 2
_RNG = random.Random(11)
LENGTHS = [_RNG.randint(8, 512) for _ in range(N + 5)]


def length(epoch: int, i: int) -> int:
    return LENGTHS[i] + epoch       # lengths may change with the epoch's sampled passages


def schedule(window: int, seed: int = 3, accum: int = 1, n: int = N) -> Schedule:
    s = Schedule(n, PER_DEVICE, WORLD, accum, seed)
    if window:
        s.bucket_by_length(window, length)
    return s


def spread(s: Schedule, epoch: int = 0) -> list[int]:
    """Per micro-batch: the longest group of the longest-padded rank minus that of the shortest-padded one."""
    out = []
    for step in range(epoch * s.steps_per_epoch, (epoch + 1) * s.steps_per_epoch):
        for micro in range(s.accum):
            tops = [max(length(epoch, i) for i in s.indices(step, micro, r)) for r in range(WORLD)]
            out.append(max(tops) - min(tops))
    return out


def taken(s: Schedule, epoch: int) -> list[int]:
    return [i for step in range(epoch * s.steps_per_epoch, (epoch + 1) * s.steps_per_epoch)
            for micro in range(s.accum) for r in range(WORLD) for i in s.indices(step, micro, r)]


@pytest.mark.parametrize("window,accum", [(1, 1), (4, 1), (2, 2)])
def test_ranks_get_similar_lengths_and_every_group_once(window, accum):
    plain, bucketed = schedule(0, accum=accum), schedule(window, accum=accum)
    if window == 1:   # the same groups per step: the longest two on different ranks, the least spread there is
        assert all(b <= p for b, p in zip(spread(bucketed), spread(plain)))
        assert sum(spread(bucketed)) < 0.7 * sum(spread(plain))
    else:             # similar lengths share a step too
        assert sum(spread(bucketed)) < sum(spread(plain)) / 4
    for epoch in (0, 1):
        assert sorted(taken(bucketed, epoch)) == sorted(taken(plain, epoch)) == list(range(N))
    if window == 1:   # each step keeps its own groups, only dealt differently
        for step in range(plain.steps_per_epoch):
            assert (sorted(i for r in range(WORLD) for m in range(accum) for i in plain.indices(step, m, r)) ==
                    sorted(i for r in range(WORLD) for m in range(accum) for i in bucketed.indices(step, m, r)))


def test_a_ragged_tail_is_the_one_left_out_without_buckets():
    plain, bucketed = schedule(0, n=N + 5), schedule(3, n=N + 5)
    assert sorted(taken(bucketed, 0)) == sorted(taken(plain, 0)) and len(taken(plain, 0)) == N


def test_the_order_is_a_function_of_seed_and_step():
    a, b = schedule(4), schedule(4)
    late = b.indices(30, 0, 1)          # asked out of order, as a resumed run does
    assert [a.indices(st, 0, r) for st in range(b.steps_per_epoch * 3) for r in range(WORLD)] == \
           [b.indices(st, 0, r) for st in range(b.steps_per_epoch * 3) for r in range(WORLD)]
    assert a.indices(30, 0, 1) == late
    assert taken(a, 0) != taken(a, 1) and taken(a, 0) != taken(schedule(4, seed=4), 0)


def test_an_examples_length_is_its_padded_tokens(tiny_dirs):
    from dsprune.encoder import Encoder

    collator = Collator(Encoder.load(tiny_dirs["llama"]), query_max_length=8, passage_max_length=12)
    short = Example("a cell", ["membranes", "revenue grew", "dense"], None)
    long = Example("what is the capital expenditure of the firm", ["the cell membrane regulates transport of "
                   "ions and proteins across the whole membrane of the cell", "bond", "rates"], None)
    for ex in (short, long):
        batch = collator([ex])
        assert padded_tokens(ex, collator.token_counts) == (batch["query"]["input_ids"].numel() +
                                                            batch["passage"]["input_ids"].numel())
    assert padded_tokens(long, collator.token_counts) > padded_tokens(short, collator.token_counts)


@pytest.mark.parametrize("value, hooks, message", [
    (-1, None, "length_buckets must be >= 0 (0 = off), not -1"),
    (1, "distill", "length_buckets: --mode distill brings its own items"),
])
def test_bad_length_buckets_fail_before_start(tmp_path, tiny_dirs, value, hooks, message):
    args = parse_args(TrainArgs, ["--model", str(tiny_dirs["llama"]), "--output_dir", str(tmp_path / "out"),
                                  "--train_data", str(write_groups(tmp_path / "g.jsonl", n=16)),
                                  "--length_buckets", str(value)])
    with pytest.raises(DsPruneError, match=re.escape(message)):
        train(args, Hooks(micro_batch=lambda *a: None, stage="distill") if hooks else None)
    assert not (tmp_path / "out").exists()
