"""benchmarks/gaprune_embedder.py: GAPrune's Tables 1 and 2 on a trained embedder. The recipe gives every method
the same mask budget, evaluation and retraining; the collected JSON keeps both reports and how far each mask's
decisions are from magnitude's; RESULTS.md shows them."""
import json
import shutil

import pytest
import torch

from benchmarks import gaprune_embedder as ge
from benchmarks.grid import render
from benchmarks.grid import render_gaprune_embedder as ge_render
from dsprune import formats
from dsprune.importance.gaprune import REFERENCE
from dsprune.recipe import load_recipe
from dsprune.report import compare
from tests.test_family import _results

METHODS = ("dai", "dai-ref", "magnitude", "fisher", "wanda", "random", "neurons")
ONESHOT_ONLY = ("dai-balanced", "dai-sign")


def _stages():
    _, stages = load_recipe(ge.RECIPE)
    return {s.name: s for s in stages}


def test_every_method_gets_the_same_budget_evaluation_and_retraining():
    by = _stages()
    control = by["retrain-full"].args
    for m in METHODS:
        assert by[f"prune-{m}"].args["sparsity"] == 0.5
        assert by[f"export-{m}"].args["mask"] == f"${{prune-{m}}}"
        assert by[f"eval-{m}"].args == {**by["eval-full"].args, "model": f"${{export-{m}}}"}
        assert by[f"retrain-{m}"].args == {**control, "mask": f"${{prune-{m}}}"}
        assert by[f"eval-retrain-{m}"].args["model"] == f"${{retrain-{m}}}/model"
    assert control["train_data"] == ["${shared}/data/financebench"] and control["seed"] == 42
    assert set(by["eval-full"].args["task"]) == {"financebench", "scifact_small", "msmarco_trecdl_subset"}
    for m in ONESHOT_ONLY:
        assert by[f"prune-{m}"].args["sparsity"] == 0.5
        assert by[f"eval-{m}"].args == {**by["eval-full"].args, "model": f"${{export-{m}}}"}
        assert f"retrain-{m}" not in by
    one, re = by["report-oneshot"].args, by["report-retrain"].args
    assert set(one["results"]) == {"${eval-full}", *[f"${{eval-{m}}}" for m in METHODS + ONESHOT_ONLY]}
    assert re["results"] == ["${eval-retrain-full}", *[f"${{eval-retrain-{m}}}" for m in METHODS]]
    assert len(one["labels"]) == len(one["results"]) and len(re["labels"]) == len(re["results"])


def test_the_tasks_param_scales_every_evaluation_alike():
    from dsprune.recipe import parse_params
    _, stages = load_recipe(ge.RECIPE, params=parse_params(["tasks=[scifact_small, financebench]"]))
    evals = [s for s in stages if s.command == "eval"]
    assert len(evals) == 18 and all(s.args["task"] == ["scifact_small", "financebench"] for s in evals)


def test_the_unpruned_evaluation_is_compress_embedders_stage():
    """Same arguments, so the fingerprint matches and a finished eval-full is shared rather than rerun."""
    from benchmarks import compress_embedder as ce
    _, theirs = load_recipe(ce.RECIPE)
    assert _stages()["eval-full"].args == {s.name: s for s in theirs}["eval-full"].args


def test_oneshot_part_runs_table_1_alone():
    names = ge.oneshot_stages()
    assert {"sample", "dai", "dai-ref", "eval-full", "bench-neurons", "report-oneshot"} <= set(names)
    assert not [n for n in names if "retrain" in n]
    assert set(names) | {n for n in _stages() if "retrain" in n} == set(_stages())
    cmd = ge.command({}, "oneshot")
    assert cmd[cmd.index("--only") + 1:] == names and "--only" not in ge.command({})


def test_dai_runs_are_the_papers_reading_and_the_authors_code():
    by = _stages()
    assert by["dai"].args["alignment"] == "eq4" and "fisher_batch" not in by["dai"].args
    ref = by["dai-ref"].args
    assert {k: ref[k] for k in ("fisher_batch", "grad_batch", "temperature")} == \
        {k: REFERENCE[k] for k in ("fisher_batch", "grad_batch", "temperature")}
    prune = by["prune-dai-ref"].args
    assert prune["scores"] == "${dai-ref}" and prune["dai_recompute"] is True
    assert (prune["dai_alignment"], prune["dai_variant"]) == (REFERENCE["alignment"], REFERENCE["variant"])
    assert by["prune-neurons"].args["structured"] is True and by["prune-fisher"].args["method"] == "fisher_dom"
    bal = by["prune-dai-balanced"].args
    assert bal["scores"] == "${dai}" and bal["dai_recompute"] is True
    assert (bal["dai_alignment"], bal["dai_fisher_scale"]) == (by["dai"].args["alignment"], "balanced")
    sign = by["prune-dai-sign"].args
    assert sign["scores"] == "${dai}" and (sign["dai_alignment"], sign["dai_eps"]) == ("eq4", 1e-30)


def _fake_run(tmp_path, model, retrained=True):
    """Every stage stamped, masks, DAI statistics of ``model``'s MLP weights and an evaluation per mask; the
    retraining stages left out unless ``retrained``."""
    from safetensors.torch import save_file

    from dsprune.encoder import Encoder
    from dsprune.importance.dai import STAT_FILES
    from dsprune.surgery.mask import target_weights

    out = tmp_path / "out"
    by = _stages()
    for name, s in by.items():
        (out / name).mkdir(parents=True)
        (out / name / "stage.json").write_text(json.dumps({"fingerprint": "f", "seconds": 60.0, "args": s.args,
                                                           "command": s.command, "launcher": s.launcher}))
    g = torch.Generator().manual_seed(0)
    keep = {"layers.0.mlp.up_proj.weight": torch.rand(8, 4, generator=g) > 0.5,
            "layers.0.mlp.down_proj.weight": torch.rand(4, 8, generator=g) > 0.5}
    for m in METHODS + ONESHOT_ONLY:
        tensors = {k: (v if m == "magnitude" else ~v if m == "random" else v.clone()) for k, v in keep.items()}
        if m == "dai":
            tensors["layers.0.mlp.up_proj.weight"][0] = ~tensors["layers.0.mlp.up_proj.weight"][0]
        formats.write_mask(out / f"prune-{m}", tensors, "structured" if m == "neurons" else "unstructured",
                           method=m, sparsity=0.5, scope="global")
    theta = {n: w.detach().float() for n, w in target_weights(Encoder.load(str(model))).items()}
    for k, run in enumerate(ge.DAI_RUNS):
        (out / run / "manifest.json").write_text(json.dumps({
            "config": {"alignment": "eq4", "beta": 1.0, "gamma": 0.5, "eps": 1e-8},
            "figures": {"n_general": 120, "n_domain": 75, "mean_abs_fisher_term_over_magnitude_term": 1e-6}}))
        g = torch.Generator().manual_seed(k)
        for stat in ("fisher_gen", "fisher_dom"):
            save_file({n: 1e-6 * torch.rand(w.shape, generator=g) for n, w in theta.items()},
                      str(out / run / STAT_FILES[stat]))
        for stat in ("grad_gen", "grad_dom"):       # products of about 1e-8: half above ε, half below
            save_file({n: 1e-4 * torch.rand(w.shape, generator=g) * 2 for n, w in theta.items()},
                      str(out / run / STAT_FILES[stat]))
        save_file({n: torch.linspace(-1, 1, w.numel()).reshape(w.shape) for n, w in theta.items()},
                  str(out / run / STAT_FILES["alignment"]))
    for report, prefix in (("report-oneshot", "eval-"), ("report-retrain", "eval-retrain-")):
        names = ["full", *METHODS, *(ONESHOT_ONLY if prefix == "eval-" else ())]
        for i, n in enumerate(names):
            _results(tmp_path / report / n, 0.6 - 0.05 * i, i)
            shutil.copy(tmp_path / report / n / formats.RESULTS, out / f"{prefix}{n}")
        entries = compare.load_entries([str(out / f"{prefix}{n}") for n in names], [], names)
        (out / report / "report.json").write_text(json.dumps(compare.compare(entries)))
    for name, losses in (("full", [2.0] * 20 + [0.5] * 10), ("random", [2.8] * 30)):   # random never leaves it
        (out / f"retrain-{name}" / "log.jsonl").write_text(
            "\n".join(json.dumps({"step": i + 1, "loss": x}) for i, x in enumerate(losses)) + "\n")
    if not retrained:
        for folder in out.iterdir():
            if "retrain" in folder.name:
                shutil.rmtree(folder)
    return out


def test_collect_and_render(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model), tmp_path / "results"
    doc = json.loads(ge.collect({"model": str(model)}, out, results).read_text())
    assert doc["against_magnitude"]["dai"]["share"] == 4 / 64           # one flipped row of 4 of 64 weights
    assert doc["against_magnitude"]["random"]["share"] == 1.0 and "neurons" not in doc["against_magnitude"]
    assert doc["masks"]["dai-ref"]["dai_alignment"] == "reference"
    assert [r["label"] for r in doc["retrained"]["rows"]][0] == "full"
    text = render.render(results, tmp_path / "RESULTS.md")
    section = text[text.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    assert "- `dai`: DAI as the paper writes it" in section and "6.25% of its keep/prune decisions differ" in section
    assert "**Retrained on FinanceBench train** (GAPrune Table 2)" in section
    assert doc["retrain_losses"]["random"] == {"steps": 30, "first": 2.8, "last_mean": pytest.approx(2.8),
                                               "last_steps": 10}
    assert "the mean of the last 10 steps): seed 42: unpruned 2.00 → 0.50, random 2.80 → 2.80." in section
    assert "the retraining ran with one seed: no retrained row is called better or worse either" in section
    alone = doc["retraining_alone"]
    assert set(alone["tasks"]) == {"scifact_small", "financebench"} and "diff" in alone["mean_delta"]
    assert f"**The retraining alone** (the unpruned model retrained − the unpruned model, paired per query; the " \
        f"retrained rows above are measured against the former): seed 42: {ge_render.pair_words(alone)}, " \
        f"scifact_small {compare.interval(alone['tasks']['scifact_small'])}." in section
    assert "**Seeds**" in section and "1 training seed;" in section and "same side of 0: none here)" in section
    assert "not a verdict" not in section         # said once in each head, not on every line
    # the fake run evaluates two tasks, as a run with the scaled `tasks` param does
    assert "msmarco_trecdl_subset" not in doc["report"]["tasks"]
    assert "the MS MARCO subset, a general eval, is left out (the recipe's `tasks` param)" in section
    assert doc["retraining"]["dtype"] == "bfloat16" and doc["retraining"]["ranks"] == 2
    assert "retraining 40 LoRA steps (r=32, α=64, learning rate 0.0002) of 2 queries per rank × 2 ranks, groups of " \
        "4 passages, in bfloat16, seed 42" in section
    # GAPrune's own comparison, DAI − each baseline, paired: the fake evaluations put DAI 0.10 above magnitude
    against = doc["dai_against"]
    assert set(against["oneshot"]) == set(ge.DAI_MASKS) and not set(ONESHOT_ONLY) & set(against["retrained"])
    assert set(against["oneshot"]["dai"]) == set(ge.BASELINES)
    dd = against["oneshot"]["dai"]["magnitude"]
    assert dd["mean_delta"]["diff"] == pytest.approx(0.10, abs=0.03) and dd["mean_delta"]["low"] > 0
    assert set(dd["tasks"]) == {"scifact_small", "financebench"}
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper) − magnitude: one-shot mean "))
    assert line.startswith(f"- DAI (paper) − magnitude: one-shot mean {compare.interval(dd['mean_delta'])}, "
                           f"financebench {compare.interval(dd['tasks']['financebench'])}; retrained, seed 42: mean ")
    assert line.endswith(".") and "erdict" not in line
    assert "a verdict only after retraining, where two training seeds agree: none here)" in section
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper), Fisher balanced − random: "))
    assert "retrained" not in line
    # the Fisher tail of each DAI run, from its statistics and the model's weights
    assert set(doc["tails"]) == set(ge.DAI_RUNS)
    kinds = doc["tails"]["dai"]["kinds"]
    assert set(kinds) == {"gate_proj", "up_proj", "down_proj"} and 0 < kinds["up_proj"]["negative_fraction"] < 1
    assert doc["tails"]["dai"]["balanced_scale"] == pytest.approx(1e6)
    assert "**Where β·F_gen outweighs F_dom** (β = 1.0, γ = 0.5)" in section
    assert "on this trained embedder Eq. 5 orders nearly all weights by γ√|θ|·(1 + α·s)" in section
    a = doc["alignment"]
    assert a["share_abs_s_over_half"] == pytest.approx(0.5, abs=0.02) and 0 < a["share_product_over_eps"] < 1
    assert (a["alignment"], a["eps"]) == ("eq4", 1e-8)
    assert f"above ε for {a['share_product_over_eps']:.2%} of the weights, and |s| > 0.5 for " in section
    assert "s is near 0" not in section and "The ε = 1e-30 mask gives every weight its sign" in section


def test_oneshot_collect_needs_no_retraining_and_renders_it_pending(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model, retrained=False), tmp_path / "results"
    with pytest.raises(SystemExit, match="'retrain-full' has not finished"):
        ge.collect({"model": str(model)}, out, results)
    doc = json.loads(ge.collect({"model": str(model)}, out, results, "oneshot").read_text())
    assert doc["retrained"] is None and doc["retraining"] is None and doc["part"] == "oneshot"
    assert doc["retraining_alone"] is None
    assert "--only" in doc["command"] and not [s for s in doc["stages"] if "retrain" in s["name"]]
    section = render.render(results, tmp_path / "RESULTS.md")
    section = section[section.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    assert "**One-shot** (GAPrune Table 1)" in section and "retraining: not run yet" in section
    assert "*pending*: the retraining stages have not run" in section
    assert "the retraining has not run." in section and "ran with one seed" not in section


def test_a_second_seed_changes_the_retraining_alone():
    """Only the retraining reads the seed, so another seed's run reuses every one-shot stage of the first."""
    from dsprune.recipe import parse_params
    first = _stages()
    _, stages = load_recipe(ge.RECIPE, params=parse_params(["seed=43"]))
    for s in stages:
        want = {**first[s.name].args, "seed": 43} if s.name.startswith("retrain-") else first[s.name].args
        assert s.args == want, s.name
    assert ge.default_seed() == 42 and ge.run_of(42) == (ge.OUT, "gaprune_embedder")
    assert ge.run_of(43) == (ge.OUT.with_name("gaprune-embedder-seed43"), "gaprune_embedder_seed43")


def test_seed_options_that_cannot_be_honoured_are_refused(capsys):
    with pytest.raises(SystemExit):
        ge.main(["--part", "oneshot", "--seed", "43", "--collect"])
    assert "reads no training seed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        ge.main(["--param", "seed=43", "--collect"])
    assert "is --seed" in capsys.readouterr().err


def test_a_calibration_draw_reseeds_the_triplets_and_redoes_only_what_reads_them(tmp_path, monkeypatch):
    """Draw N sets the seed of every stage drawing triplets; magnitude, Wanda, random and the unpruned model read no
    triplets, so another draw shares them with the first run."""
    from dsprune.recipe import load_recipe, parse_sets

    assert ge.calibration_sets(0) == {}
    cmd = ge.command({}, "oneshot", draw=2)
    sets = cmd[cmd.index("--set") + 1:cmd.index("--out")]
    assert sets == ["sample.seed=2", "dai.seed=2", "dai-ref.seed=2"]
    _, stages = load_recipe(ge.RECIPE, parse_sets(sets))
    first = _stages()
    assert {s.name for s in stages if s.args != first[s.name].args} == set(ge.CALIBRATION)
    drawn = ge.reads_calibration()
    assert {"prune-dai", "eval-dai", "prune-fisher", "eval-neurons", "bench-neurons", "report-oneshot"} <= drawn
    assert not {"prune-magnitude", "eval-magnitude", "prune-wanda", "eval-random", "eval-full"} & drawn
    assert ge.run_of(42, 2) == (ge.OUT.with_name("gaprune-embedder-calib2"), "gaprune_embedder_calib2")
    # the first run's finished stages that read no triplets are linked in; the others are left to run
    monkeypatch.setattr(ge, "OUT", tmp_path / "first")
    for name in ("eval-magnitude", "eval-dai"):
        (ge.OUT / name).mkdir(parents=True)
        (ge.OUT / name / "stage.json").write_text("{}")
    ge.share_oneshot(tmp_path / "draw", 2)
    assert sorted(p.name for p in (tmp_path / "draw").iterdir()) == ["eval-magnitude"]


def test_calibration_options_that_cannot_be_honoured_are_refused(capsys):
    for argv, words in ((["--calibration", "1", "--seed", "43"], "Table 1 only"),
                        (["--calibration", "1", "--part", "all"], "Table 1 only"),
                        (["--calibration", "-1"], "0 or more"),
                        (["--only", "sample", "--collect"], "collects nothing")):
        with pytest.raises(SystemExit):
            ge.main(argv)
        assert words in capsys.readouterr().err, argv


def test_two_seeds_of_the_retraining_render_a_verdict_per_mask(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model), tmp_path / "results"
    ge.collect({"model": str(model)}, out, results)
    second = tmp_path / "out-seed43"
    shutil.copytree(out, second)
    stamp = second / "retrain-full" / "stage.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "args": {
        **json.loads(stamp.read_text())["args"], "seed": 43}}))
    ge.collect({"model": str(model), "seed": "43"}, second, results, keep_as="gaprune_embedder_seed43")
    text = render.render(results, tmp_path / "RESULTS.md")
    section = text[text.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    assert "the retraining ran with 2 seeds (*Seeds* below)" in section
    assert "seed 42 and 43 in another run, which otherwise has the same settings" in section
    assert "**Retrained on FinanceBench train** (GAPrune Table 2, seed 42)" in section
    assert "**Retrained on FinanceBench train, seed 43** (the same one-shot masks;" in section
    assert "2 training seeds;" in section
    line = next(x for x in section.splitlines() if x.startswith("- random: seed 42: "))
    assert "; seed 43: " in line and ("Verdict (2 seeds" in line or "No verdict" in line)
    assert not [x for x in section.splitlines() if x.startswith("- full: seed")]
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper) − random: one-shot "))
    assert "; retrained, seed 42: " in line and "; seed 43: " in line and "On the mean: Verdict (2 seeds" in line
    assert " On financebench: " in line



def test_two_calibration_draws_render_a_one_shot_verdict(tmp_path, monkeypatch, tiny_dirs):
    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model, retrained=False), tmp_path / "results"
    ge.collect({"model": str(model)}, out, results, "oneshot")
    draw = ge.collect({"model": str(model)}, out, results, "oneshot", "gaprune_embedder_calib1", 1)
    doc = json.loads(draw.read_text())
    assert doc["calibration"] == 1 and "eval-dai" in doc["calibration_stages"]
    assert "eval-magnitude" not in doc["calibration_stages"] and "sample.seed=1" in doc["command"]
    section = render.render(results, tmp_path / "RESULTS.md")
    section = section[section.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    assert "were drawn from 2 calibration samples" in section and "no one-shot row is called" not in section
    assert "**One-shot** (GAPrune Table 1, calibration draw 0)" in section
    assert "**One-shot, calibration draw 1** (the triplets drawn again with seed 1;" in section
    assert "one-shot, a verdict where the 2 calibration draws agree; retrained, where two training seeds agree: " \
           "none here)" in section
    # the fake evaluations put DAI 0.10 above magnitude, the same in both draws
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper) − magnitude: one-shot, "))
    assert "calibration draw 0: mean " in line and "; calibration draw 1: mean " in line
    assert "One-shot on the mean: Verdict (2 calibration draws, every interval above 0): DAI (paper) keeps more." \
        in line and "One-shot on financebench: " in line and line.endswith(".")


def _another_draw(tmp_path, out):
    """A copy of ``out`` (run again, not linked) whose DAI mask is another model and whose evaluations add a task,
    as a draw run with the recipe's `tasks` param set otherwise than the first."""
    import random

    draw = tmp_path / "out-calib1"
    shutil.copytree(out, draw)
    names = ["full", *METHODS, *ONESHOT_ONLY]
    rng = random.Random(7)
    for n in names:
        path = draw / f"eval-{n}" / formats.RESULTS
        doc = json.loads(path.read_text())
        if n == "dai":
            doc["fingerprint"] = "dai-draw1"
        pq = {f"m{i}": doc["tasks"]["financebench"]["per_query"]["ndcg_at_10"][f"q{i}"] + rng.uniform(-0.01, 0.01)
              for i in range(40)}
        doc["tasks"]["msmarco_trecdl_subset"] = {"ndcg_at_10": sum(pq.values()) / 40,
                                                 "per_query": {"ndcg_at_10": pq}}
        path.write_text(json.dumps(doc))
    entries = compare.load_entries([str(draw / f"eval-{n}") for n in names], [], names)
    (draw / "report-oneshot" / "report.json").write_text(json.dumps(compare.compare(entries)))
    return draw


def test_a_draw_over_other_tasks_gets_a_verdict_per_shared_task_and_names_its_rows_origin(tmp_path, monkeypatch,
                                                                                           tiny_dirs):
    """Means over different tasks are not one quantity, so the one-shot verdict falls to the tasks both draws
    evaluate; rows run again beside a first run that is gone are checked to be the first draw's models."""
    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model, retrained=False), tmp_path / "results"
    ge.collect({"model": str(model)}, out, results, "oneshot")
    draw = _another_draw(tmp_path, out)
    doc = json.loads(ge.collect({"model": str(model)}, draw, results, "oneshot", "gaprune_embedder_calib1", 1)
                     .read_text())
    assert doc["shared_stages"] == [] and set(doc["per_query"]) == {f"eval-{n}" for n in
                                                                     ("full", *METHODS, *ONESHOT_ONLY)}
    assert len(doc["per_query"]["eval-dai"]["tasks"]["msmarco_trecdl_subset"]["per_query"]["ndcg_at_10"]) == 40
    section = render.render(results, tmp_path / "RESULTS.md")
    section = section[section.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    head = next(x for x in section.splitlines() if x.startswith("**One-shot, calibration draw 1**"))
    # the fake report's labels are the stage names
    assert "the other rows read no triplets; all run again in this draw's folder; the same models as draw 0's, " \
           "scoring alike on every task both evaluate: *full*, *dai-ref*, *magnitude*," in head
    assert "; other models or scores: *dai*;" in head
    assert "evaluated on scifact_small, financebench, msmarco_trecdl_subset only (the recipe's `tasks` param)" in head
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper) − magnitude: one-shot, "))
    assert "One-shot on the mean: none, the calibration draws average over different tasks. One-shot on " \
           "financebench: Verdict (2 calibration draws, every interval above 0): DAI (paper) keeps more. " \
           "One-shot on scifact_small (+" in line and "]): Verdict (2 calibration draws" in line
    assert "msmarco_trecdl_subset: Verdict" not in line
    # a draw that took its other rows from the first run's folders says so
    linked = tmp_path / "out-calib2"
    linked.mkdir()
    for stage in out.iterdir():
        (ge.link_finished_stage if stage.name in ("prune-magnitude", "eval-magnitude") else
         lambda a, b: shutil.copytree(a, b))(stage, linked / stage.name)
    assert ge.shared_with_first(linked) == ["eval-magnitude", "prune-magnitude"]


def test_a_draw_can_leave_a_dai_run_out_and_table_1_renders_without_its_row(tmp_path, monkeypatch, tiny_dirs):
    """A draw that skips the authors'-code DAI run (to fit in less time) runs and keeps the rest; its mask gets a
    one-shot line from draw 0 alone, no verdict."""
    from dsprune.recipe import parse_sets

    cmd = ge.command({}, "oneshot", draw=1, without=("dai-ref",))
    only = cmd[cmd.index("--only") + 1:]
    assert "report-oneshot" in only and not [s for s in only if "dai-ref" in s]
    sets = cmd[cmd.index("--set") + 1:cmd.index("--out")]
    _, stages = load_recipe(ge.RECIPE, parse_sets(sets))
    report = next(s for s in stages if s.name == "report-oneshot").args
    assert "${eval-dai-ref}" not in report["results"] and "DAI (authors' code)" not in report["labels"]
    assert len(report["results"]) == len(report["labels"]) == 9 and "DAI (paper), ε = 1e-30" in report["labels"]
    with pytest.raises(SystemExit):
        ge.main(["--without", "dai-ref", "--collect"])

    monkeypatch.setattr(ge, "OUT", tmp_path / "out")
    model = tiny_dirs["llama"]
    out, results = _fake_run(tmp_path, model, retrained=False), tmp_path / "results"
    ge.collect({"model": str(model)}, out, results, "oneshot")
    draw = tmp_path / "out-calib1"
    shutil.copytree(out, draw)
    for name in ("dai-ref", "prune-dai-ref", "export-dai-ref", "eval-dai-ref"):
        shutil.rmtree(draw / name)
    names = ["full", *(m for m in METHODS if m != "dai-ref"), *ONESHOT_ONLY]
    entries = compare.load_entries([str(draw / f"eval-{n}") for n in names], [], names)
    (draw / "report-oneshot" / "report.json").write_text(json.dumps(compare.compare(entries)))
    doc = json.loads(ge.collect({"model": str(model)}, draw, results, "oneshot", "gaprune_embedder_calib1", 1,
                                ("dai-ref",)).read_text())
    assert doc["without"] == ["dai-ref"] and set(doc["dai"]) == {"dai"} and "dai-ref" not in doc["dai_against"]["oneshot"]
    assert "eval-dai-ref" not in doc["calibration_stages"] and "eval-dai" in doc["calibration_stages"]
    section = render.render(results, tmp_path / "RESULTS.md")
    section = section[section.index("## GAPrune Tables 1 and 2 on a trained embedder"):]
    assert "; left out of this draw, to fit it in less time: `dai-ref` (DAI (authors' code): its statistics, mask, " \
           "evaluation and row))" in section
    line = next(x for x in section.splitlines() if x.startswith("- DAI (authors' code) − magnitude: "))
    assert line.startswith("- DAI (authors' code) − magnitude: one-shot, calibration draw 0 only: mean ")
    assert "erdict" not in line
    line = next(x for x in section.splitlines() if x.startswith("- DAI (paper) − magnitude: "))
    assert "One-shot on the mean: Verdict (2 calibration draws" in line
