"""`dsprune demo` runs on the sample shipped inside the package: no shared data folder is needed."""
import contextlib
import io
import json

import pytest

from dsprune import formats
from dsprune.cli import main
from dsprune.commands import demo
from dsprune.tiny import save_tiny
from train_helpers import shared_data


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One demo on a tiny model, with the shared data folder pointing at an empty one."""
    root = tmp_path_factory.mktemp("demo")
    model = save_tiny(root / "tiny", "llama")
    (root / "empty").mkdir()
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv("DSPRUNE_SHARED", str(root / "empty"))
        code = main(["demo", "--model", str(model), "--drop_mlp", "2", "--out", str(root / "out")])
    return code, out.getvalue(), root / "out"


def test_demo_needs_no_shared_data(run):
    code, printed, out = run
    assert code == 0
    table = printed[printed.index("nDCG@10 ("):]
    for row in ("nDCG@10 (64 queries)", "document speed-up", "query speed-up", "parameters", "export reload"):
        assert row in table
    assert "95 % paired bootstrap" in table
    figures = formats.read_manifest(out)["figures"]
    q = figures["ndcg_at_10"]
    assert q["queries"] == 64 and q["delta"]["low"] <= q["delta"]["diff"] <= q["delta"]["high"]
    assert abs(q["delta"]["diff"] - (q["dropped"] - q["full"])) < 1e-4      # mteb rounds its mean to 5 digits
    assert figures["document_speedup"] > 0 and figures["params_dropped"] < figures["params_full"]
    speed = json.loads((out / "speed.json").read_text())
    assert speed["document"]["texts"] == 16 and speed["query"]["texts"] == 32
    assert (out / "drop" / "drop_order.png").stat().st_size > 0        # the heat map, drops marked
    assert (out / "score" / "drop_order.png").stat().st_size > 0
    calib = formats.read_manifest(out / "score")["inputs"]["calib"]
    assert calib == str(demo.SAMPLE / "calibration.jsonl")


def test_demo_bad_data_is_one_error(tmp_path, capsys):
    code = main(["demo", "--model", "none", "--data", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and f"BEIR folder not found: {tmp_path / 'missing'}" in err
    assert not (tmp_path / "o").exists()


def test_sample_is_reproducible_from_shared_data():
    """The shipped sample equals a fresh cut of the shared data (the PROVENANCE note's recipe)."""
    from benchmarks import demo_sample

    shared_data("scifact", "corpus.jsonl")
    assert demo_sample.main(["--check"]) == 0
