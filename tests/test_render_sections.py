"""RESULTS.md's benchmark sections share one rule (benchmarks/grid/section.py): a missing JSON shows nothing, a
JSON of another shape is named on stderr and skipped, so one stale file never stops the render."""
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.grid import render
from benchmarks.grid.render_dai_modes import render_dai_modes
from benchmarks.grid.render_dense_runs import render_dense_runs
from benchmarks.grid.render_drop_position import render_drop_position
from benchmarks.grid.render_overlap import render_overlap
from benchmarks.grid.render_table1 import render_table1
from benchmarks.grid.render_throughput import render_throughput

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# file -> (its section, called with the results folder)
SECTIONS = {
    "compress_embedder.json": lambda r: render.render_compress(r, r.parent / "RESULTS.md"),
    "int8_padding.json": render.render_int8,
    "drop_position.json": render_drop_position,
    "dai_modes.json": lambda r: render_dai_modes(r, {}),
    "scifact_overlap.json": render_overlap,
    "table1_embedder.json": render_table1,
    "train_dense_last.json": render_dense_runs,
    "training/throughput.json": render_throughput,
}


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_section_of_another_shape_is_named_and_skipped(name, tmp_path, capsys):
    section = SECTIONS[name]
    results = tmp_path / "results"
    (results / name).parent.mkdir(parents=True)
    shutil.copy(COMMITTED / name, results / name)
    if name == "compress_embedder.json":
        for extra in COMMITTED.glob("compress_embedder_*"):
            shutil.copy(extra, results / extra.name)
    assert section(results)                                # the committed file renders its section
    (results / name).write_text(json.dumps({"title": "an older shape", "rows": []}))
    assert section(results) == []
    assert f"{results / name} is not a benchmarks/" in capsys.readouterr().err
    (results / name).unlink()
    assert section(results) == []                          # not run yet: no section, no note
    assert capsys.readouterr().err == ""
