"""benchmarks/family.py: another model family goes through effir-smollm2.yaml's stages (the same training
budget for the EffiR model and its unpruned control), and its report lands in RESULTS.md with its command."""
import json
import random
from pathlib import Path

import pytest

from benchmarks import family as fam
from benchmarks.grid import render
from dsprune.recipe import load_recipe
from dsprune.report import compare

REPO = Path(__file__).resolve().parents[1]


def test_control_gets_the_effir_models_training_budget():
    _, stages = load_recipe(REPO / "recipes" / "effir-smollm2.yaml", params={"model": "gemma3-270m", "drop_mlp": 9})
    by = {s.name: s for s in stages}
    train, full = by["train"].args, by["train-full"].args
    assert {k for k in set(train) | set(full) if train.get(k) != full.get(k)} == {"model", "mask"}
    assert full["model"] == "gemma3-270m" and "mask" not in full and by["drop"].args["drop_mlp"] == 9
    assert by["eval-base"].args["model"] == "gemma3-270m"
    assert by["bench"].args["baseline"] == "${train-full}/model"       # speed-up over the control, at 1x in the plot
    assert by["report"].args["results"][0] == "${eval-full}"          # the reference: the trained control


def _results(path: Path, mean: float, seed: int) -> None:
    rng = random.Random(seed)
    tasks = {}
    for task, n in (("scifact_small", 300), ("financebench", 75)):
        pq = {f"q{i}": min(1.0, max(0.0, mean + rng.uniform(-0.2, 0.2))) for i in range(n)}
        tasks[task] = {"ndcg_at_10": sum(pq.values()) / n, "per_query": {"ndcg_at_10": pq}}
    path.mkdir(parents=True)
    (path / "results.json").write_text(json.dumps({"model": str(path), "fingerprint": path.name, "tasks": tasks}))


def test_collect_keeps_the_report_and_render_shows_it(tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    _, stages = load_recipe(fam.RECIPE, params=fam.FAMILIES["gemma3"][1])
    for i, s in enumerate(stages):
        (out / s.name).mkdir(parents=True)
        (out / s.name / "stage.json").write_text(json.dumps({"fingerprint": "f", "seconds": 60.0 * (i + 1),
                                                            "command": s.command, "launcher": s.launcher}))
    for i, (name, mean) in enumerate((("eval-full", 0.6), ("eval", 0.55), ("eval-untrained", 0.3),
                                      ("eval-base", 0.2))):
        _results(tmp_path / "evals" / name, mean, i)
    entries = compare.load_entries([str(tmp_path / "evals" / n) for n in ("eval-full", "eval", "eval-untrained",
                                                                          "eval-base")], [],
                                   ["full + training", "EffiR + training", "EffiR untrained", "as shipped"])
    (out / "report" / "report.json").write_text(json.dumps(compare.compare(entries)))

    dest = fam.collect("gemma3", out, results / "families")
    doc = json.loads(dest.read_text())
    assert doc["command"] == ("dsprune run --recipe recipes/effir-smollm2.yaml --param model=gemma3-270m "
                              "drop_mlp=9 --out out/recipes/effir-gemma3")
    assert [s["name"] for s in doc["stages"]] == [s.name for s in stages]

    text = render.render(results, tmp_path / "RESULTS.md")
    section = text[text.index("## A second model family: Gemma 3 270M"):text.index("## Provenance")]
    assert "`.venv/bin/python benchmarks/family.py gemma3`" in section
    assert f"{sum(60 * (i + 1) for i in range(len(stages))) / 60:.0f} min of stages" in section
    base = next(r for r in doc["report"]["rows"] if r["label"] == "as shipped")
    d = base["mean_delta"]
    assert "| as shipped | " in section and f"({d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}])" in section
    assert d["high"] < 0                                                   # fabricated: clearly below the control

    (out / "eval-base" / "stage.json").unlink()                           # an unfinished stage: one clear error
    with pytest.raises(SystemExit, match="eval-base.*has not finished"):
        fam.collect("gemma3", out, results / "families")
