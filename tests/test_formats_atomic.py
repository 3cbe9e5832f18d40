"""Atomic writes: a reader sees the old file or the new one, never half of one, and a failed write leaves
no temporary file behind."""
import os

import pytest

from dsprune import formats
from dsprune.report.figure import pyplot, save_png


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    formats.write_json(path, {"a": 1})
    with pytest.raises(RuntimeError, match="boom"):
        with formats.atomic_file(path) as tmp:
            tmp.write_text("half")
            assert tmp.parent == path.parent and tmp.suffix == ".json" and tmp != path
            raise RuntimeError("boom")
    assert formats.read_json(path) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]


def test_text_is_written_with_the_usual_permissions_into_a_new_folder(tmp_path):
    path = tmp_path / "new" / "table.md"
    formats.write_text(path, "| a |\n")
    assert path.read_text() == "| a |\n"
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask          # not mkstemp's 0600


def test_a_figure_that_fails_to_save_is_closed_and_leaves_the_old_png(tmp_path):
    plt = pyplot()
    path = save_png(plt.subplots()[0], tmp_path / "f.png")
    before = path.read_bytes()
    fig, _ = plt.subplots()
    with pytest.raises(Exception):
        save_png(fig, path, not_a_savefig_option=1)
    assert not plt.fignum_exists(fig.number)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["f.png"]
