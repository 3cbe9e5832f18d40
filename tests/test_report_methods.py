"""The GAPrune methods figure: grouped bars per setting, drawn only from what finished."""
import pytest

from dsprune.errors import DsPruneError
from dsprune.report.methods import plot_groups


def _cell(score, diff=None):
    return {"score": score, "delta": None if diff is None else {"diff": diff, "low": diff - 0.02, "high": diff + 0.02}}


def test_groups_plot_with_missing_bars_and_tasks(tmp_path):
    groups = [{"title": "one-shot 50%", "reference": "dense", "ref_scores": {"a": 0.5, "b": 0.3},
               "bars": {"DAI": {"a": _cell(0.4, -0.1), "b": _cell(0.2, -0.1)}, "Random": {"a": _cell(0.1, -0.4),
                                                                                         "b": None}}},
              {"title": "retrain", "reference": "control", "ref_scores": {"a": None, "b": 0.4},
               "bars": {"DAI": {"a": _cell(0.3), "b": _cell(0.35, -0.05)}}},
              {"title": "nothing yet", "reference": "x", "ref_scores": {}, "bars": {}}]
    out = plot_groups(groups, ["a", "b"], tmp_path / "sub" / "m.png", "t")
    assert out.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["m.png"]        # no temporary file left


def test_nothing_finished_is_one_clear_error(tmp_path):
    with pytest.raises(DsPruneError, match="nothing to plot"):
        plot_groups([{"title": "x", "reference": "r", "ref_scores": {}, "bars": {}}], ["a"], tmp_path / "m.png")
    assert not (tmp_path / "m.png").exists()
