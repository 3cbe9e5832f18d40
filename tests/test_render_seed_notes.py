"""A quality verdict between two runs must not read as a verdict at equal speed, nor seeds that start from other
pruned models as seeds of one model: the seed lines carry each arm's measured speed and the starting models."""
from benchmarks.grid.render_seeds import comparison_lines, recovery_lines

PLAN = {"attn": [1], "mlp": [2], "slim_ratio": 0.0, "target_speedup": 2.0}
DELTA = {"diff": 0.05, "low": 0.02, "high": 0.08}


def _run(name, seed, family, speed, start, versus=None, cpu=None, delta=DELTA, **variant):
    rows = [{"label": "unpruned", "model": "m/full"},
            {"label": "trained", "model": f"out/{name}/distill/model", "speed": speed},
            {"label": "only", "model": f"out/{name}/export-mask", "fingerprint": start}]
    doc = {"variant": {"name": name, "family": family, "label": name, "report_rows": {"trained": f"{name} trained"},
                       **variant},
           "distill": {"config": {"seed": seed}}, "plan": PLAN, "report": {"rows": rows},
           "recovery": {"mean_delta": DELTA}, "versus": {}}
    if versus:
        doc["versus"] = {versus: {"run": versus, "label": f"{name} trained", "against": f"{versus} trained",
                                  "mean_delta": delta}}
    if cpu:
        doc["bench_machine"] = {"cpu": cpu}
    return doc


def _speed(doc, query, flops=2.0):
    return {"document": doc, "query": query, "flop_ratio": flops}


def test_a_slower_first_arm_in_every_seed_is_named_with_each_cpu():
    main = {"distill": {"config": {"seed": 42}}, "plan": PLAN, "report": {"rows": []}}
    runs = [_run("deep", 42, "deep", _speed(1.9, 2.2, 2.03), "d"),
            _run("deep2", 43, "deep", _speed(1.9, 1.9, 2.03), "d", cpu="Xeon"),
            _run("slim", 42, "slim", _speed(1.8, 2.0), "s1", versus="deep"),
            _run("slim2", 43, "slim", _speed(1.6, 1.8), "s2", versus="deep2", cpu="Xeon")]
    line = next(x for x in comparison_lines(main, runs) if "slim trained − deep trained" in x)
    assert "Verdict (2 seeds, every interval above 0): slim trained is better." in line
    assert ("seed 42: 1.80× / 2.00× against 1.90× / 2.20× (CPUs not recorded); seed 43: 1.60× / 1.80× against "
            "1.90× / 1.90× (both on Xeon)") in line
    assert "FLOP ratios: 2.00× against 2.03×." in line
    assert "The first is the slower in every seed, documents and queries: not a comparison at equal speed." in line
    assert "The first's seeds start from different pruned models (seed 42: s1…, seed 43: s2…" in line
    assert "The second's seeds" not in line
    # one seed faster on queries: no claim about speed either way
    runs[3]["report"]["rows"][1]["speed"] = _speed(1.6, 2.0)
    line = next(x for x in comparison_lines(main, runs) if "slim trained − deep trained" in x)
    assert "slower in every seed" not in line and "faster in every seed" not in line


def test_seeds_of_one_starting_model_say_nothing_of_it():
    main = {"distill": {"config": {"seed": 42}}, "plan": PLAN, "report": {"rows": []}}
    same = [_run("a", 42, "a", _speed(2, 2), "x"), _run("a2", 43, "a", _speed(2, 2), "x")]
    (line,) = [x for x in recovery_lines(main, same) if "Recovery in" in x]
    assert "Verdict (2 seeds" in line and "different pruned models" not in line
    same[1]["report"]["rows"][2]["fingerprint"] = "y"
    (line,) = [x for x in recovery_lines(main, same) if "Recovery in" in x]
    assert "The seeds start from different pruned models (seed 42: x…, seed 43: y…" in line


def test_a_run_made_again_pairs_beside_its_base_seeds_and_a_dominated_arm_is_named():
    main = {"distill": {"config": {"seed": 42}}, "plan": PLAN, "report": {"rows": []}}
    worse = {"diff": -0.04, "low": -0.06, "high": -0.02}
    runs = [_run("deep", 42, None, _speed(1.5, 1.5), "d"),
            _run("deep2", 43, None, _speed(1.5, 1.6), "d", versus="slim2", cpu="Xeon", delta=worse, base="deep"),
            # the seed-42 model made again, its base's settings unchanged: a seed of deep
            _run("deep-again", 42, "deep-again", _speed(1.6, 1.6), "d", versus="slim", cpu="Xeon", delta=worse,
                 base="deep", set={}),
            _run("slim", 42, None, _speed(1.8, 2.0), "s"),
            _run("slim2", 43, None, _speed(1.6, 1.8), "s", cpu="Xeon", base="slim")]
    (line,) = [x for x in comparison_lines(main, runs) if "− slim" in x]
    assert "seed 42: -0.0400 [-0.0600, -0.0200]; seed 43: -0.0400 [-0.0600, -0.0200]" in line
    assert "Verdict (2 seeds, every interval below 0): slim trained is better." in line
    assert "and the worse: the second is faster and better." in line
    assert "Seed 42: the two arms were not timed on one recorded CPU." in line
    # a variant with a family and settings of its own is a recipe of its own: its pairing stands alone
    runs[2]["variant"]["set"] = {"distill.lora": True}
    lines = [x for x in comparison_lines(main, runs) if "− slim" in x]
    assert len(lines) == 2 and all("One training seed: not a verdict." in x for x in lines)
    assert not any("faster and better" in x for x in lines)
