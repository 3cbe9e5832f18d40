"""benchmarks/compress_embedder.py: the compress-embedder recipe's report, plan and distillation summary are
kept with their command, and RESULTS.md shows them with the retention of every model."""
import json
import shutil
import time

import pytest

from benchmarks import compress_embedder as ce
from benchmarks.grid import render
from dsprune.recipe import load_recipe
from dsprune.report import compare
from dsprune.report.compare import interval
from tests.test_family import _results


def test_recipe_chains_plan_drop_distill_and_benches_against_the_unpruned_model():
    _, stages = load_recipe(ce.RECIPE)
    by = {s.name: s for s in stages}
    assert by["drop"].args["plan"] == "${plan}" and by["distill"].args["model"] == "${drop}"
    assert by["distill"].args["mode"] == "distill" and by["distill"].args["teacher"] == "embeddinggemma-300m"
    assert by["bench"].args["baseline"] == "embeddinggemma-300m"
    assert by["report"].args["results"][0] == "${eval-full}"


def test_slim_recipe_adds_slimming_to_the_same_pipeline():
    """The coarse-drop + slim partner differs from the main recipe in the plan's fixed ratio and the
    slim/mask stages only: the same distillation, evaluations and bench."""
    _, main_stages = load_recipe(ce.RECIPE)
    _, stages = load_recipe(ce.recipe_of("slim"))
    by, main_by = {s.name: s for s in stages}, {s.name: s for s in main_stages}
    assert set(by) - set(main_by) == {"slim", "mask", "export-mask"} and set(main_by) <= set(by)
    assert by["plan"].args["slim_ratio"] == 0.5 and by["mask"].args["plan"] == "${plan}"
    assert by["slim"].args["mode"] == "slim" and by["slim"].args["model"] == "${drop}"
    assert by["distill"].args == {**main_by["distill"].args, "mask": "${mask}"}
    assert by["eval-drop"].args["model"] == "${export-mask}"
    for name in ce.SHARED_STAGES:
        assert by[name].args == main_by[name].args
    for name in ("eval", "bench", "eval-full", "eval-minilm", "eval-int8", "bench-int8", "eval-bf16", "bench-bf16",
                 "bench-bf16-both"):
        assert by[name].args == main_by[name].args


def _fake_run(tmp_path, recipe=ce.RECIPE, out_name="out", slim_ratio=0.0, renamed=None):
    out = tmp_path / out_name
    _, stages = load_recipe(recipe)
    for s in stages:
        (out / s.name).mkdir(parents=True)
        (out / s.name / "stage.json").write_text(json.dumps({"fingerprint": "f", "seconds": 120.0,
                                                            "command": s.command, "launcher": s.launcher}))
    (out / "plan" / "plan.json").write_text(json.dumps({"target_speedup": 2.0, "seq_len": 256, "attn": [20, 21],
                                                        "mlp": [23], "slim_ratio": slim_ratio, "flop_ratio": 2.03,
                                                        "num_layers": 24}))
    (out / "distill" / "manifest.json").write_text(json.dumps({"config": {
        "distill_data": ["a.jsonl"], "per_device_batch_size": 16, "num_epochs": 2, "learning_rate": 1e-4,
        "lora": False}, "distill": {"teacher": "t"}}))
    (out / "distill" / "log.jsonl").write_text("\n".join(json.dumps({"step": i + 1, "loss": 1.0 / (i + 1),
                                                                    "loss_cosine": 0.1,
                                                                    **({"eval_ndcg_at_10": 0.3} if i == 1 else {})})
                                                         for i in range(4)))
    labels = {"eval-full": ("unpruned", 0.8), "eval": ("drop + distill", 0.7), "eval-drop": ("drop only", 0.2),
              "eval-minilm": ("all-MiniLM-L6-v2", 0.6)}
    labels.update(renamed or {})
    evals = tmp_path / f"evals-{out_name}"
    for i, name in enumerate(labels):
        _results(evals / name, labels[name][1], i)
        shutil.copy(evals / name / "results.json", out / name / "results.json")
    entries = compare.load_entries([str(evals / n) for n in labels], [], [v[0] for v in labels.values()])
    (out / "report" / "report.json").write_text(json.dumps(compare.compare(entries)))
    (out / "bench" / "bench.json").write_text(json.dumps({"document": {"speedup_pairs": {
        "median": 1.9, "min": 1.8, "max": 2.1, "ratios": [1.8, 1.9, 2.1]}}}))
    return out


def test_collect_and_render(tmp_path):
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    doc = json.loads(ce.collect({}, out, results).read_text())
    assert doc["command"] == "dsprune run --recipe recipes/compress-embedder.yaml --out out/recipes/compress-embedder"
    assert doc["distill"]["steps"] == 4 and doc["distill"]["last"]["loss"] == 0.25 and doc["plan"]["mlp"] == [23]
    text = render.render(results, tmp_path / "RESULTS.md")
    section = text[text.index("## EmbeddingGemma-300M compressed"):text.index("## Provenance")]
    ref = doc["report"]["rows"][0]["mean"]
    row = next(r for r in doc["report"]["rows"] if r["label"] == "drop + distill")
    assert f"drop + distill: mean nDCG@10 {row['mean']:.4f} = {row['mean'] / ref:.3f} of the unpruned" in section
    assert "drop 2 attention sub-layers [20, 21] and 1 MLPs [23] of 24" in section
    assert "4 steps" in section and "full parameters" in section and "one training seed" in section
    assert doc["distill"]["curve"] == [{"step": 2, "ndcg_at_10": 0.3}]
    assert "documents median 1.90× of 3 alternating pairs (min–max 1.80–2.10×)" in section
    # a variant's model rows join the table under its label, against the same unpruned row, and each is paired
    # with the main run's model of the same stage
    vout = tmp_path / "out-last"
    shutil.copytree(out, vout)
    for stage, mean in (("eval", 0.7), ("eval-drop", 0.2)):
        shutil.copy(tmp_path / "evals-out" / stage / "results.json", out / stage / "results.json")
        (vout / stage / "stage.json").rename(tmp_path / "stage.json")
        shutil.rmtree(vout / stage)
        _results(vout / stage, mean + (0.1 if stage == "eval" else 0.0), 7)
        (tmp_path / "stage.json").rename(vout / stage / "stage.json")
    vdoc = json.loads(ce.collect({}, vout, results, "last", main=out).read_text())
    better = vdoc["against_main"]["drop-last-k + distill"]["mean_delta"]
    assert better["low"] > 0.05 and vdoc["against_main"]["drop-last-k only"]["against"] == "drop only"
    assert vdoc["command"].endswith("--set plan.order=last --out out/recipes/compress-embedder-last")
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "| drop-last-k + distill |" in section and "| drop-last-k only |" in section
    assert "**drop-last-k** (`dsprune run" in section
    assert f"drop-last-k + distill − drop + distill, paired per query, mean over the tasks: {interval(better)} (one " \
           "training seed: not a verdict)" in section
    vdoc["report"]["rows"][0]["tasks"]["scifact_small"]["score"] += 0.01
    (results / "compress_embedder_last.json").write_text(json.dumps(vdoc))
    with pytest.raises(SystemExit, match="unpruned scores differ"):
        render.render(results, tmp_path / "RESULTS.md")
    (out / "distill" / "stage.json").unlink()
    with pytest.raises(SystemExit, match="distill.*has not finished"):
        ce.collect({}, out, results)


def test_a_variant_with_its_own_recipe_joins_the_table(tmp_path):
    """The slim variant names its rows itself and says which recipe and slimming ratio it ran."""
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    ce.collect({}, out, results)
    vout = _fake_run(tmp_path, ce.recipe_of("slim"), "out-slim", 0.5,
                     {"eval": ("drop + slim + distill", 0.75), "eval-drop": ("drop + slim only", 0.3)})
    vdoc = json.loads(ce.collect({}, vout, results, "slim", main=out).read_text())
    assert vdoc["recipe"] == "recipes/compress-embedder-slim.yaml" and vdoc["plan"]["slim_ratio"] == 0.5
    assert vdoc["command"].startswith("dsprune run --recipe recipes/compress-embedder-slim.yaml --out")
    assert set(vdoc["against_main"]) == {"drop + slim + distill", "drop + slim only"}
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "| drop + slim + distill |" in section and "| drop + slim only |" in section
    assert "`recipes/compress-embedder-slim.yaml` (the same stages plus `slim`, `mask` and `export-mask`; its no-recovery row" in section
    assert "slims the kept MLPs by 0.5" in section
    assert "intermediate_sizes" not in vdoc["plan"]
    sizes = [235, None, 673] + [500] * 21
    (vout / "export-mask" / "manifest.json").write_text(json.dumps({"structure": {"intermediate_sizes": sizes}}))
    assert json.loads(ce.collect({}, vout, results, "slim", main=out).read_text())["plan"]["intermediate_sizes"] == sizes


def test_the_int8_and_bf16_rows_are_the_distilled_model_benched_against_the_float_unpruned_model():
    _, stages = load_recipe(ce.RECIPE)
    by = {s.name: s for s in stages}
    for name in ("eval-int8", "bench-int8"):
        assert by[name].args["model"] == "${distill}/model" and by[name].args["quantize"] == "int8"
        assert by[name].args["quantize_skip"] == ["down_proj"]
    for name in ("eval-bf16", "bench-bf16"):
        assert by[name].args["model"] == "${distill}/model" and by[name].args["dtype"] == "bfloat16"
    assert by["bench-bf16"].args["baseline_dtype"] == "float32"
    both = by["bench-bf16-both"].args         # the pruning's own speed-up: both sides bfloat16, else as bench-bf16
    assert both.get("baseline_dtype") is None and both == {k: v for k, v in by["bench-bf16"].args.items()
                                                           if k != "baseline_dtype"}
    assert by["bench-int8"].args["baseline"] == by["bench-bf16"].args["baseline"] == "embeddinggemma-300m"
    report = by["report"].args
    labels = dict(zip(report["results"], report["labels"]))
    assert labels["${eval-int8}"] == "drop + distill + int8" and labels["${eval-bf16}"] == "drop + distill + bf16"
    assert {"${bench-int8}", "${bench-bf16}"} <= set(report["bench"])


def test_a_number_format_left_out_is_neither_run_nor_reported(tmp_path):
    """``--without bf16``: a CPU without bfloat16 instructions would take hours over the bf16 evaluation."""
    cmd = ce.command({}, "distill-lora-rerun", ["bf16"])
    only = cmd[cmd.index("--only") + 1:]
    assert "eval-int8" in only and "report" in only and not {"eval-bf16", "bench-bf16", "bench-bf16-both"} & set(only)
    sets = dict(a.split("=", 1) for a in cmd[cmd.index("--set") + 1:cmd.index("--out")])
    assert "bf16" not in sets["report.results"] + sets["report.bench"] and "int8" in sets["report.results"]
    assert json.loads(sets["report.labels"])[-1] == "drop + distill + int8"
    assert ce.command({}, "distill-lora-rerun") == cmd[:cmd.index("--out") - 3] + cmd[cmd.index("--out"):
                                                                                  cmd.index("--only")]
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    for name in ce.left_out(["bf16"]):
        (out / name / "stage.json").unlink()
    with pytest.raises(SystemExit, match="eval-bf16.*has not finished"):
        ce.collect({}, out, results)
    doc = json.loads(ce.collect({}, out, results, without=["bf16"]).read_text())
    assert doc["left_out"] == {"formats": ["bf16"], "stages": ["eval-bf16", "bench-bf16", "bench-bf16-both"]}
    assert doc["bf16"] is None and "--only" in doc["command"]
    assert "eval-bf16" not in [s["name"] for s in doc["stages"]]
    vout = _fake_run(tmp_path, out_name="out-rerun")
    for name in ce.left_out(["bf16"]):
        (vout / name / "stage.json").unlink()
    ce.collect({}, vout, results, "distill-lora-rerun", without=["bf16"])
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "It left out bf16 (`--without`: no stage eval-bf16, bench-bf16, bench-bf16-both, no report row)." \
        in section


def _bench(vout, name, settings, machine=True, speedup=2.1):
    low, high = round(speedup - 0.1, 2), round(speedup + 0.1, 2)
    bench = {k: {"speedup": speedup, "pairs": 3, "flop_ratio": 1.6, "flop_bound": 1.6, "batch_size": 16,
                 "length": 256, "texts": 64,
                 "speedup_pairs": {"median": speedup, "min": low, "max": high, "ratios": [low, speedup, high]}}
             for k in ("document", "query")}
    bench.update(settings=settings, threads=2)
    if machine:
        bench["machine"] = {"cpu": "Some CPU", "cpu_capability": "AVX512", "cpu_isa": ["avx512f", "amx_bf16"],
                            "logical_cpus": 2}
    (vout / name / "bench.json").write_text(json.dumps(bench))


def test_a_variants_float_bench_names_its_cpu(tmp_path):
    """Two runs of a pair timed on different CPUs differ by their kernels too, so the results keep the float32
    bench's machine and RESULTS.md names it; a bench without the record names none."""
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    ce.collect({}, out, results)
    vout = _fake_run(tmp_path, out_name="out-mild")
    vdoc = json.loads(ce.collect({}, vout, results, "1.6x-lora", main=out).read_text())
    assert "bench_machine" not in vdoc
    assert "Its float32 bench ran on" not in render.render(results, tmp_path / "RESULTS.md")
    _bench(vout, "bench", {"dtype": "float32"})
    vdoc = json.loads(ce.collect({}, vout, results, "1.6x-lora", main=out).read_text())
    assert vdoc["bench_machine"]["cpu"] == "Some CPU"
    assert "Its float32 bench ran on Some CPU (torch kernels AVX512)." in render.render(results, tmp_path / "RESULTS.md")


def test_a_milder_plan_with_int8_and_bf16_joins_the_table_unpaired_with_the_main_run(tmp_path):
    """The 1.6x variant's plan differs from the main run's, so its models are not paired with the main run's;
    its int8 and bfloat16 rows come with the CPU they were timed on, and a bench without that record is refused."""
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    ce.collect({}, out, results)
    vout = _fake_run(tmp_path, out_name="out-mild", renamed={"eval": ("drop + distill", 0.78),
                                                             "eval-int8": ("drop + distill + int8", 0.5),
                                                             "eval-bf16": ("drop + distill + bf16", 0.77)})
    _bench(vout, "bench-int8", {"quantize": "int8", "quantize_skip": ["down_proj"]}, machine=False)
    with pytest.raises(SystemExit, match="bench-int8.*predates the machine record"):
        ce.collect({}, vout, results, "1.6x-lora", main=out)
    _bench(vout, "bench-int8", {"quantize": "int8", "quantize_skip": ["down_proj"]})
    _bench(vout, "bench-bf16", {"dtype": "bfloat16", "baseline_dtype": "float32"})
    vdoc = json.loads(ce.collect({}, vout, results, "1.6x-lora", main=out).read_text())
    assert "both" not in vdoc["bf16"]             # a run from before the both-in-bfloat16 bench
    _bench(vout, "bench-bf16-both", {"dtype": "bfloat16"}, speedup=1.2)
    vdoc = json.loads(ce.collect({}, vout, results, "1.6x-lora", main=out).read_text())
    assert vdoc["bf16"]["both"]["dtype"] == {"model": "bfloat16", "baseline": "bfloat16"}
    assert vdoc["bf16"]["both"]["speed"]["query"]["speedup"] == 1.2 and vdoc["bf16"]["speed"]["query"]["speedup"] == 2.1
    assert "against_main" not in vdoc and vdoc["int8"]["speed"]["document"]["speedup"] == 2.1
    assert vdoc["bf16"]["dtype"] == {"model": "bfloat16", "baseline": "float32"}
    cost = vdoc["int8"]["against_float"]["mean_delta"]
    assert cost["high"] < 0      # 0.5 against 0.78
    bf16_cost = vdoc["bf16"]["against_float"]["mean_delta"]
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "| 1.6× plan: drop + distill (LoRA) + int8 |" in section and "| 1.6× plan: drop only |" in section
    assert "| 1.6× plan: drop + distill (LoRA) + bf16 |" in section
    assert "benched against the float32 unpruned model in one run on Some CPU (torch kernels AVX512, 2 threads)" \
        in section and "(`down_proj` kept float32)" in section
    assert f"int8 − the same model in float32, paired per query, mean over the tasks: {interval(cost)}" in section
    assert "**bfloat16** (`eval-bf16`, `bench-bf16`): the distilled model computed in bfloat16" in section
    assert f"bfloat16 − the same model in float32, paired per query, mean over the tasks: {interval(bf16_cost)}" \
        in section
    assert ("With the unpruned model in bfloat16 too (`bench-bf16-both`, one run on Some CPU): the pruning's own "
            "speed-up where bfloat16 is served, 1.20× documents (pairs 1.10–1.30×) / 1.20× queries") in section


def _with_seed(out, seed):
    man = json.loads((out / "distill" / "manifest.json").read_text())
    man["config"]["seed"] = seed
    (out / "distill" / "manifest.json").write_text(json.dumps(man))


def test_a_second_seed_of_the_same_plan_gives_the_recovery_verdict(tmp_path):
    """distilled − no recovery is paired per query in each run; two seeds above 0 make a verdict, one does not."""
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    _with_seed(out, 42)
    doc = json.loads(ce.collect({}, out, results).read_text())
    assert doc["recovery"]["mean_delta"]["low"] > 0.3      # 0.7 against 0.2
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "Recovery in the main run (distilled − no recovery, paired per query, mean over the tasks): seed 42: " \
           f"{interval(doc['recovery']['mean_delta'])}. One training seed: not a verdict." in section
    vout = _fake_run(tmp_path, out_name="out-seed2", renamed={"eval": ("drop + distill", 0.72)})
    _with_seed(vout, 43)
    # the second seed shares the pruned model's evaluation
    shutil.copy(out / "eval-drop" / "results.json", vout / "eval-drop" / "results.json")
    assert "eval-drop" in ce.VARIANTS["seed2"]["share"]
    vdoc = json.loads(ce.collect({}, vout, results, "seed2", main=out).read_text())
    assert set(vdoc["against_main"]) == {"drop + distill, seed 43"}
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "| drop + distill, seed 43 |" in section and "drop only, seed" not in section
    assert f"seed 42: {interval(doc['recovery']['mean_delta'])}; seed 43: " \
           f"{interval(vdoc['recovery']['mean_delta'])}. Verdict (2 seeds, every interval above 0): the " \
           "distillation recovers quality at this plan." in section
    # a seed whose interval reaches 0 withholds the verdict
    vdoc["recovery"]["mean_delta"]["low"] = -0.01
    (results / "compress_embedder_seed2.json").write_text(json.dumps(vdoc))
    assert "No verdict: the 2 seeds' intervals do not all exclude 0" in render.render(results, tmp_path / "RESULTS.md")


def test_recollecting_keeps_the_code_version_that_made_the_numbers(tmp_path):
    out, results = _fake_run(tmp_path), tmp_path / "results"
    results.mkdir()
    dest = ce.collect({}, out, results)
    doc = json.loads(dest.read_text())
    doc["code_version"] = "0000000"
    dest.write_text(json.dumps(doc))
    again = json.loads(ce.collect({}, out, results).read_text())
    assert again["code_version"] == "0000000" and again["recollected_by"] != "0000000"
    # another distillation in the same folder is a new run: its own code version
    (out / "distill" / "log.jsonl").write_text(json.dumps({"step": 1, "loss": 0.5}))
    fresh = json.loads(ce.collect({}, out, results).read_text())
    assert fresh["code_version"] != "0000000" and "recollected_by" not in fresh


def _runs(tmp_path, monkeypatch, scores: dict, seeds: dict):
    """Fake finished runs of ``scores`` (variant -> (recovered, no recovery) mean) under a moved OUT, each with
    its seed."""
    monkeypatch.setattr(ce, "OUT", tmp_path / "compress-embedder")
    for v, (trained, untrained) in scores.items():
        _, stages = load_recipe(ce.recipe_of(v))
        report = next(s for s in stages if s.name == "report").args
        labels = {ref[2:-1]: label for ref, label in zip(report["results"], report["labels"])}
        names = {"eval": (labels["eval"], trained), "eval-drop": (labels["eval-drop"], untrained)}
        out = _fake_run(tmp_path, ce.recipe_of(v), ce.out_of(v).name, 0.5 if "slim" in v else 0.0, names)
        _with_seed(out, seeds[v])
    results = tmp_path / "results"
    results.mkdir()
    for v in scores:
        ce.collect({}, ce.out_of(v), results, v)
    return results


def test_a_variants_second_seed_reuses_its_base_runs_untrained_stages(tmp_path, monkeypatch):
    monkeypatch.setattr(ce, "OUT", tmp_path / "compress-embedder")
    for run in (ce.OUT, ce.out_of("slim")):
        for name in ("score", "plan", "slim", "eval-full"):
            (run / name).mkdir(parents=True, exist_ok=True)
            (run / name / "stage.json").write_text(json.dumps({"fingerprint": f"{run.name}-{name}"}))
    ce.share_finished_stages("slim-seed2")
    new = ce.out_of("slim-seed2")
    assert json.loads((new / "slim" / "stage.json").read_text())["fingerprint"] == "compress-embedder-slim-slim"
    # the base's own copy: the base's plan read that one, so the variant reuses the plan as well
    assert json.loads((new / "score" / "stage.json").read_text())["fingerprint"] == "compress-embedder-slim-score"
    assert " ".join(ce.command({}, "slim-seed2")).startswith(
        "dsprune run --recipe recipes/compress-embedder-slim.yaml --set distill.seed=43 --out")
    # a stage the base run lacks comes from the main run
    import shutil
    shutil.rmtree(ce.out_of("slim") / "eval-full")
    shutil.rmtree(new)
    ce.share_finished_stages("slim-seed2")
    assert json.loads((new / "score" / "stage.json").read_text())["fingerprint"] == "compress-embedder-slim-score"
    assert json.loads((new / "eval-full" / "stage.json").read_text())["fingerprint"] == "compress-embedder-eval-full"
    # a stage neither has comes from another variant's run
    other = ce.out_of("distill-lora-seed2-rerun") / "mine"
    other.mkdir(parents=True)
    (other / "stage.json").write_text(json.dumps({"fingerprint": "rerun-mine"}))
    shutil.rmtree(new)
    ce.share_finished_stages("slim-seed2")
    assert json.loads((new / "mine" / "stage.json").read_text())["fingerprint"] == "rerun-mine"
    assert json.loads((new / "eval-full" / "stage.json").read_text())["fingerprint"] == "compress-embedder-eval-full"


def test_the_same_comparison_at_two_seeds_gives_a_verdict(tmp_path, monkeypatch):
    """coarse + slim against the main plan, paired at seed 42 (slim vs main) and at 43 (slim-seed2 vs seed2)."""
    results = _runs(tmp_path, monkeypatch, {"": (0.5, 0.2), "seed2": (0.5, 0.2), "slim": (0.8, 0.3),
                                            "slim-seed2": (0.8, 0.3)},
                    {"": 42, "seed2": 43, "slim": 42, "slim-seed2": 43})
    vdoc = json.loads((results / "compress_embedder_slim-seed2.json").read_text())
    assert vdoc["versus"]["seed2"]["against"] == "drop + distill, seed 43"
    assert vdoc["versus"]["seed2"]["label"] == "drop + slim + distill, seed 43"
    assert set(vdoc["against_main"]) == {"drop + slim + distill, seed 43"}     # against its base, seed 42
    text = render.render(results, tmp_path / "RESULTS.md")
    assert "drop + slim + distill − drop + distill (each at the same seed, paired per query, mean over the tasks): " \
           "seed 42: " in text
    assert "Verdict (2 seeds, every interval above 0): drop + slim + distill is better." in text
    assert "drop + slim + distill, seed 43 − drop + slim + distill, paired per query, mean over the tasks: " in text
    assert "(the same plan, another seed: the spread between seeds)" in text
    assert "Recovery in the coarse drop + slim run (distilled − no recovery" in text
    # one seed of a comparison is no verdict
    (results / "compress_embedder_slim-seed2.json").unlink()
    assert "drop + slim + distill is better" not in render.render(results, tmp_path / "RESULTS.md")


def test_two_variants_paired_at_each_seed_give_their_own_verdict(tmp_path, monkeypatch):
    """The distillation through LoRA against the InfoNCE LoRA recovery (two variants, neither the main run) at
    seeds 42 and 43, besides each against the main plan at its seed."""
    results = _runs(tmp_path, monkeypatch,
                    {"": (0.5, 0.2), "seed2": (0.5, 0.2), "infonce": (0.7, 0.2), "infonce-seed2": (0.7, 0.2),
                     "distill-lora": (0.6, 0.2), "distill-lora-seed2": (0.6, 0.2)},
                    {"": 42, "seed2": 43, "infonce": 42, "infonce-seed2": 43, "distill-lora": 42,
                     "distill-lora-seed2": 43})
    vdoc = json.loads((results / "compress_embedder_distill-lora-seed2.json").read_text())
    assert set(vdoc["versus"]) == {"seed2", "infonce-seed2"}
    # a second seed trains as its base does, so it carries the base's recovery name
    assert json.loads((results / "compress_embedder_infonce-seed2.json").read_text())["variant"]["recovery"] \
        == "InfoNCE LoRA" and "recovery" not in vdoc["variant"]
    assert vdoc["versus"]["infonce-seed2"]["mean_delta"]["high"] < 0        # 0.6 against 0.7
    text = render.render(results, tmp_path / "RESULTS.md")
    assert "drop + distill (LoRA) − drop + InfoNCE LoRA (each at the same seed, paired per query, mean over the " \
           "tasks): seed 42: " in text
    assert "Verdict (2 seeds, every interval below 0): drop + InfoNCE LoRA is better." in text
    assert "Verdict (2 seeds, every interval above 0): drop + distill (LoRA) is better." in text
    # the report names what the LoRA run trains, where the main run trains full parameters
    manifest = ce.out_of("distill-lora-seed2") / "distill" / "manifest.json"
    m = json.loads(manifest.read_text())
    m["config"].update(lora=True, lora_r=32, lora_alpha=64)
    manifest.write_text(json.dumps(m))
    ce.collect({}, ce.out_of("distill-lora-seed2"), results, "distill-lora-seed2")
    assert ("then the distillation on the same text through LoRA r=32 α=64 instead of full parameters (4 steps, "
            "seed 43)") in render.render(results, tmp_path / "RESULTS.md")
    # without the second seed's run, its pairing with the InfoNCE run is one seed: no verdict
    (results / "compress_embedder_distill-lora-seed2.json").unlink()
    assert "every interval below 0): drop + InfoNCE LoRA is better" not in render.render(results,
                                                                                       tmp_path / "RESULTS.md")


def test_a_longer_run_over_more_text_names_that_text_and_pairs_with_its_shorter_run(tmp_path, monkeypatch):
    seeds = {"": 42, "1.6x-lora": 42, "1.6x-lora-long": 42}
    results = _runs(tmp_path, monkeypatch, {"": (0.6, 0.2), "1.6x-lora": (0.7, 0.3), "1.6x-lora-long": (0.75, 0.3)},
                    seeds)
    for run, extra in (("", []), ("1.6x-lora", []), ("1.6x-lora-long", ["passages=msmarco_trecdl_subset/corpus.jsonl"])):
        manifest = ce.out_of(run) / "distill" / "manifest.json"
        m = json.loads(manifest.read_text())
        m["config"]["distill_data"] = [f"out/recipes/{ce.out_of(run).name}/mine/groups.jsonl",
                                       "passages=financebench/corpus.jsonl", *extra]
        manifest.write_text(json.dumps(m))
    ce.collect({}, ce.OUT, results)
    ce.collect({}, ce.out_of("1.6x-lora"), results, "1.6x-lora")
    doc = json.loads(ce.collect({}, ce.out_of("1.6x-lora-long"), results, "1.6x-lora-long").read_text())
    assert "against_main" not in doc and list(doc["versus"]) == ["1.6x-lora"]  # another plan than the main run's
    text = render.render(results, tmp_path / "RESULTS.md")
    assert "then the distillation on more text (4 steps, seed 42)" in text
    # every fake stage took 2 min: the variant's line states its recipe's whole time
    assert f"Its stages' times sum to {2 * len(load_recipe(ce.RECIPE)[1])} min" in text
    assert "  - **Confound:** its distillation text adds passages=msmarco_trecdl_subset/corpus.jsonl, unlabelled;" \
        in text
    assert text.count("**Confound:**") == 2  # the main run's, and the one run whose text differs from it
    assert "  - 1.6× plan: drop + distill (LoRA), 600 steps − 1.6× plan: drop + distill (LoRA) (each at the same " \
           "seed, paired per query, mean over the tasks): seed 42: " in text
    # its untrained stages come from the shorter run, not from the main run of another plan
    for run in (ce.OUT, ce.out_of("1.6x-lora")):
        (run / "plan" / "stage.json").write_text(json.dumps({"fingerprint": run.name}))
    shutil.rmtree(ce.out_of("1.6x-lora-long"))
    ce.share_finished_stages("1.6x-lora-long")
    assert json.loads((ce.out_of("1.6x-lora-long") / "plan" / "stage.json").read_text())["fingerprint"] == \
        "compress-embedder-1.6x-lora"


def test_infonce_recovery_is_a_train_stage_the_launcher_accepts(tmp_path):
    """The InfoNCE variant turns the recipe's recovery stage into LoRA InfoNCE training on the same labelled groups,
    with no teacher: checked by the launcher's own argument parser."""
    from dsprune.config import parse_args
    from dsprune.recipe import _argv, _resolve, parse_sets
    from dsprune.train.slim import StageArgs, check_stage
    cmd = ce.command({}, "infonce")
    sets = cmd[cmd.index("--set") + 1:cmd.index("--out")]
    _, stages = load_recipe(ce.recipe_of("infonce"), parse_sets(sets))
    stage = next(s for s in stages if s.name == "distill")
    folders = {n: str(tmp_path / n) for n in ("drop", "mine", "mine-fin")}
    args = parse_args(StageArgs, _argv(_resolve(stage.args, folders)) + ["--output_dir", str(tmp_path / "o")])
    check_stage(args)
    assert args.mode == "train" and args.teacher is None and not args.distill_data
    assert args.lora and (args.lora_r, args.lora_alpha, args.group_size) == (32, 64, 2)
    assert args.train_data == [str(tmp_path / "mine" / "groups.jsonl"), str(tmp_path / "mine-fin" / "groups.jsonl")]


def test_infonce_variant_renders_its_recovery_and_the_curves_meet_in_minutes(tmp_path, monkeypatch):
    from torch.utils.tensorboard import SummaryWriter
    results = _runs(tmp_path, monkeypatch, {"": (0.6, 0.2), "infonce": (0.4, 0.2)}, {"": 42, "infonce": 42})
    run = ce.out_of("infonce") / "distill"
    man = json.loads((run / "manifest.json").read_text())
    man["config"].update(mode="train", train_data=["g.jsonl"], group_size=2, lora=True, lora_r=32, lora_alpha=64,
                         temperature=0.02, eval_max_length=128)
    (run / "manifest.json").write_text(json.dumps(man))
    writer = SummaryWriter(str(run / "tensorboard"))
    writer.add_scalar("eval/ndcg_at_10", 0.2, 0, walltime=1000.0)
    writer.add_scalar("loss/total", 1.0, 1, walltime=1010.0)
    writer.add_scalar("eval/ndcg_at_10", 0.3, 2, walltime=1180.0)
    writer.close()
    # resumed an hour later in another process: the pause is no training time
    time.sleep(1.1)                         # events files are named by the second they were opened
    writer = SummaryWriter(str(run / "tensorboard"))
    writer.add_scalar("loss/total", 0.5, 3, walltime=4800.0)
    writer.add_scalar("eval/ndcg_at_10", 0.35, 4, walltime=4860.0)
    writer.close()
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    log[3]["eval_ndcg_at_10"] = 0.35
    (run / "log.jsonl").write_text("\n".join(map(json.dumps, log)))
    doc = json.loads(ce.collect({}, ce.out_of("infonce"), results, "infonce").read_text())
    assert doc["distill"]["curve"] == [{"step": 2, "ndcg_at_10": 0.3, "seconds": 180.0},
                                       {"step": 4, "ndcg_at_10": 0.35, "seconds": 240.0}]
    assert doc["distill"]["processes"] == [180.0, 60.0]
    ce.plot_runs(results)
    assert (results / "compress_embedder_curves.png").is_file()
    text = render.render(results, tmp_path / "RESULTS.md")
    assert "then InfoNCE LoRA instead of the distillation: 4 steps of 16 queries per rank × 2 ranks, groups of 2 " \
           "passages from ['g.jsonl'], LoRA r=32 α=64" in text
    assert "Recovery in the InfoNCE LoRA recovery run (InfoNCE LoRA − no recovery" in text
    assert "  - InfoNCE LoRA recovery (at most 128 tokens): 2: 0.3000 (3 min), 4: 0.3500 (4 min)." in text
    # the recipe's stamp holds the last process's seconds only; the sum counts both processes' spans
    others = sum(s["seconds"] or 0 for s in doc["stages"] if s["name"] != "distill")
    assert (f"Its stages' times sum to {(others + 240) / 60:.0f} min (a stage taken finished from another run counts "
            "that run's time; the distillation ran in 2 processes, resumed from its checkpoints, and counts their "
            "spans, without each one's start-up)." in text)
    assert "![learning curves against time](results/compress_embedder_curves.png)" in text


@pytest.mark.parametrize("variant", sorted(ce.VARIANTS))
def test_every_variant_command_loads_as_a_recipe_run(variant):
    from dsprune.recipe import parse_sets
    cmd = ce.command({}, variant)
    sets = cmd[cmd.index("--set") + 1:cmd.index("--out")] if "--set" in cmd else []
    _, stages = load_recipe(cmd[cmd.index("--recipe") + 1], parse_sets(sets))
    by = {s.name: s for s in stages}
    assert set(ce.VARIANTS[variant].get("share", ())) <= set(by)
    for key, value in ce.sets_of(variant).items():
        stage, option = key.split(".", 1)
        assert by[stage].args.get(option) == value


def test_a_run_pairs_with_another_whose_folder_is_gone_through_its_kept_scores(tmp_path, monkeypatch):
    """EffiR Table 3's pair through LoRA on both sides: slim-lora against distill-lora run again (whose results
    keep per-query scores), paired per query from that run's results JSON once its folder under out/ is gone."""
    import shutil

    runs = {"": (0.5, 0.2), "distill-lora-rerun": (0.6, 0.2), "slim-lora": (0.7, 0.3)}
    results = _runs(tmp_path, monkeypatch, runs, dict.fromkeys(runs, 42))
    first = json.loads((results / "compress_embedder_slim-lora.json").read_text())["versus"]["distill-lora-rerun"]
    kept = json.loads((results / "compress_embedder_distill-lora-rerun.json").read_text())["per_query"]
    assert set(kept) == {"eval", "eval-drop"} and all("per_query" in t for t in kept["eval"]["tasks"].values())
    shutil.rmtree(ce.out_of("distill-lora-rerun"))
    ce.collect({}, ce.out_of("slim-lora"), results, "slim-lora")
    again = json.loads((results / "compress_embedder_slim-lora.json").read_text())["versus"]["distill-lora-rerun"]
    assert again == first and first["mean_delta"]["low"] > 0 and first["against"] == "drop + distill (LoRA), run again"
    # neither the folder nor kept scores: the pairing kept when this very model was collected before stays
    doc = json.loads((results / "compress_embedder_distill-lora-rerun.json").read_text())
    del doc["per_query"]
    (results / "compress_embedder_distill-lora-rerun.json").write_text(json.dumps(doc))
    ce.collect({}, ce.out_of("slim-lora"), results, "slim-lora")
    kept = json.loads((results / "compress_embedder_slim-lora.json").read_text())
    assert kept["versus"]["distill-lora-rerun"] == first
    assert kept["paired_before"] == {"versus": {"runs": ["distill-lora-rerun"], "code_version": kept["code_version"]}}
    # ... but not when the model differs from the one kept: one clear error, the results left as they were
    kept["report"]["rows"][1]["tasks"]["financebench"]["score"] += 0.01
    before = json.dumps(kept)
    (results / "compress_embedder_slim-lora.json").write_text(before)
    with pytest.raises(SystemExit, match="keeps no per-query scores of it; run `benchmarks/compress_embedder.py "
                                         "--variant distill-lora-rerun` again"):
        ce.collect({}, ce.out_of("slim-lora"), results, "slim-lora")
    assert (results / "compress_embedder_slim-lora.json").read_text() == before


def test_a_rerun_of_the_same_model_keeps_its_pairing_with_a_main_run_that_is_gone(tmp_path, monkeypatch):
    """distill-lora run again once the main run's folder is gone: the main run's kept per-query scores pair it
    afresh; without them its models score as the kept ones did after the same training, so the pairing kept then
    still holds; another model is left unpaired, saying why, and keeps its own results."""
    import shutil

    runs = {"": (0.5, 0.2), "infonce": (0.55, 0.2), "distill-lora": (0.6, 0.2)}
    results = _runs(tmp_path, monkeypatch, runs, dict.fromkeys(runs, 42))
    first = json.loads((results / "compress_embedder_distill-lora.json").read_text())
    assert "paired_before" not in first and set(first["against_main"]) == {"drop + distill (LoRA)"}
    shutil.rmtree(ce.OUT)
    shutil.rmtree(ce.out_of("infonce"))
    fresh = json.loads(ce.collect({}, ce.out_of("distill-lora"), results, "distill-lora").read_text())
    assert fresh["against_main"] == first["against_main"] and "paired_before" not in fresh
    main_doc = json.loads((results / "compress_embedder.json").read_text())
    del main_doc["per_query"]
    (results / "compress_embedder.json").write_text(json.dumps(main_doc))
    again = json.loads(ce.collect({}, ce.out_of("distill-lora"), results, "distill-lora").read_text())
    assert again["against_main"] == first["against_main"] and again["versus"] == first["versus"]
    assert again["paired_before"]["against_main"] == first["code_version"]
    assert "versus" not in again["paired_before"]          # infonce's kept per-query scores pair it afresh
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "  - Its pairing with the main run was computed when these same models were first collected" in section
    log = ce.out_of("distill-lora") / "distill" / "log.jsonl"
    log.write_text(log.read_text().replace('"loss": 0.25', '"loss": 0.26'))
    other = json.loads(ce.collect({}, ce.out_of("distill-lora"), results, "distill-lora").read_text())
    assert other["against_main"] is None and "paired_before" not in other
    assert other["unpaired"]["against_main"] == (
        "its run folder compress-embedder is gone and compress_embedder.json keeps no per-query scores of eval; "
        "run `benchmarks/compress_embedder.py` again to pair")
    assert other["report"]["rows"] and other["recovery"]["mean_delta"]
    section = render.render(results, tmp_path / "RESULTS.md")
    assert "  - Not paired with the main run: its run folder compress-embedder is gone" in section
