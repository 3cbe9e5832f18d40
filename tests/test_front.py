"""The quality-vs-speed front: which models are on it, and the plot with its numbered key."""
import pytest

from dsprune.errors import DsPruneError
from dsprune.report import front
from dsprune.tune.outcome import pareto_front


def test_the_front_keeps_models_nothing_beats_on_both_axes():
    points = [(1.0, 0.86), (1.1, 0.85), (1.2, 0.80), (2.0, 0.84), (2.0, 0.70), (9.0, 0.77), (3.0, 0.84)]
    # (1.2, 0.80) and (2.0, 0.70) lose to (2.0, 0.84); (2.0, 0.84) ties (3.0, 0.84) on quality and is slower
    kept = pareto_front([{"speed": x, "mean": y} for x, y in points], {"speed": "max", "mean": "max"})
    assert sorted(kept, key=lambda i: points[i]) == [0, 1, 6, 5]


def _row(label, mean, speed):
    return {"label": label, "mean": mean, "speed": {"document": speed} if speed else {},
            "mean_delta": {"diff": mean - 0.86, "low": mean - 0.9, "high": mean - 0.82}}


def test_plot_writes_a_png_and_refuses_an_empty_table(tmp_path):
    table = {"reference": "unpruned", "tasks": ["a", "b"],
             "rows": [_row("unpruned", 0.86, 1.0), _row("pruned", 0.84, 1.9), _row("small", 0.77, 9.2),
                      _row("not benched", 0.8, None)]}
    png = front.plot(table, tmp_path / "f.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(DsPruneError, match="nothing to plot"):
        front.plot({**table, "rows": table["rows"][3:]}, tmp_path / "g.png")
    assert not (tmp_path / "g.png").exists()


def test_a_target_shades_the_corner_to_reach(tmp_path):
    table = {"reference": "unpruned", "tasks": ["a"],
             "rows": [_row("unpruned", 0.86, 1.0), _row("pruned", 0.84, 2.4), _row("small", 0.77, 9.2)]}
    plain = front.plot(table, tmp_path / "plain.png").read_bytes()
    marked = front.plot(table, tmp_path / "target.png", target=(2.0, 0.97)).read_bytes()
    assert marked != plain
    # without the reference among the rows there is no score to take the share of: the plot stays plain
    rest = {**table, "rows": table["rows"][1:]}
    assert (front.plot(rest, tmp_path / "a.png", target=(2.0, 0.97)).read_bytes()
            == front.plot(rest, tmp_path / "b.png").read_bytes())
