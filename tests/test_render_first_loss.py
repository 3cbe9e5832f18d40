"""RESULTS.md's note on the EffiR rows' first training loss, read from the committed row JSONs."""
import json

from benchmarks.grid import render
from benchmarks.grid.render_first_loss import effir_start_lines, first_loss, slim_groups


def _docs(*rows):
    return {r: json.loads((render.RESULTS / f"{r}.json").read_text()) for r in rows}


def test_effir_start_compares_the_same_dropped_model():
    docs = _docs("effir", "t2-15m", "t2-19m", "effir-4m", "t2-8m")
    assert docs["effir"]["structure"]["drop_mlp"] == docs["t2-15m"]["structure"]["drop_mlp"]
    assert slim_groups(docs["effir"]) == 40 * 2 * 2
    (line,) = effir_start_lines(docs)
    assert f"starts training at loss {first_loss(docs['effir']):.3f}" in line
    assert f"Drop-15M, the same dropped MLPs without the mask, at {first_loss(docs['t2-15m']):.3f}" in line
    assert "no row trains its dropped model (MLPs 13, 14, 16, 17) without the mask" in line
    assert "withdrawn" in line
    assert effir_start_lines(_docs("t2-8m", "dense")) == []       # no slimmed row: nothing to say


def test_effir_start_does_not_pair_a_row_of_another_seed_or_other_groups():
    docs = _docs("effir", "t2-15m", "t2-19m")
    other = json.loads(json.dumps(docs["t2-15m"]))
    other["inputs"]["train_groups"] = "0" * 40            # mined again: its first batch is not the EffiR row's
    (line,) = effir_start_lines({**docs, "t2-15m": other})
    assert "Drop-15M, the same dropped MLPs" not in line and "no row trains its dropped model" in line
