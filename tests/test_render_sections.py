"""RESULTS.md's benchmark sections share one rule (benchmarks/grid/section.py): a missing JSON shows nothing, a
JSON of another shape is named on stderr and skipped, and the rest of the page still renders."""
import json
import shutil
from pathlib import Path

import pytest

from benchmarks.grid import render

COMMITTED = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
# file -> the heading its section starts with
SECTIONS = {
    "compress_embedder.json": "## EmbeddingGemma-300M compressed",
    "int8_padding.json": "**Padding** of `Encoder.encode`",
    "drop_position.json": "Each row drops MLPs of",
    "dai_modes.json": "Which DAI the rows above used",
    "scifact_overlap.json": "## SciFact is an in-domain evaluation here",
    "table1_embedder.json": "recipes/effir-table1.yaml",
    "training/throughput.json": "## Training throughput",
}


@pytest.fixture(scope="module")
def committed_page(tmp_path_factory):
    results = tmp_path_factory.mktemp("committed") / "results"
    shutil.copytree(COMMITTED, results)
    return results, render.render(results, results.parent / "RESULTS.md")


@pytest.mark.parametrize("name", sorted(SECTIONS))
def test_a_section_of_another_shape_is_named_and_skipped(name, committed_page, tmp_path, capsys):
    results, page = committed_page
    assert SECTIONS[name] in page                      # the committed file renders its section
    broken = tmp_path / "results"
    shutil.copytree(results, broken)
    (broken / name).write_text(json.dumps({"title": "an older shape", "rows": []}))
    text = render.render(broken, tmp_path / "RESULTS.md")
    assert SECTIONS[name] not in text and "## Checks" in text
    assert f"{broken / name} is not a benchmarks/" in capsys.readouterr().err
