"""One logger for every command: -q/--quiet and -v/--verbose, before or after the command name, and the
libraries' load reports and bars kept out of a normal run, on a tiny model as a user runs the CLI."""
import json
import logging
import os

import pytest
from transformers.utils import logging as tf_logging

from dsprune import log
from dsprune.cli import level_flags, main


@pytest.fixture
def calib(tmp_path, texts):
    p = tmp_path / "calib.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return p


def _run(capfd, *argv):
    code = main(list(argv))
    out, err = capfd.readouterr()
    assert code == 0, err
    return out, err


def test_default_says_what_it_does_without_library_reports(tiny_dirs, calib, tmp_path, capfd):
    model = str(tiny_dirs["qwen2"])
    verbosity = tf_logging.get_verbosity()
    out, err = _run(capfd, "score", "--model", model, "--calib", str(calib), "--out", str(tmp_path / "s"))
    assert f"loading {model}" in err and "scoring 4 layers on 4 calibration texts" in err
    assert "score layers" in err                              # its progress bar
    assert "Loading weights" not in err and "LOAD REPORT" not in err
    assert "wrote" in out and "loading" not in out            # results on stdout, status on stderr
    # the run put the libraries' switches back: an app that imports dsprune keeps its own
    assert tf_logging.get_verbosity() == verbosity and tf_logging.is_progress_bar_enabled()
    assert logging.getLogger("dsprune").handlers == []


def test_quiet_before_or_after_the_command(tiny_dirs, calib, tmp_path, capfd):
    model = str(tiny_dirs["qwen2"])
    out, err = _run(capfd, "--quiet", "score", "--model", model, "--calib", str(calib), "--out", str(tmp_path / "s"))
    assert "loading" not in err and "scoring" not in err and "score layers" not in err
    assert "Loading weights" not in err and "LOAD REPORT" not in err
    assert (tmp_path / "s" / "scores.json").is_file() and "drop order" in out
    out, err = _run(capfd, "drop", "--model", model, "--drop-last", "1", "--out", str(tmp_path / "d"), "-q")
    assert "loading" not in err and "Loading weights" not in err and (tmp_path / "d" / "manifest.json").is_file()


def test_verbose_shows_debug_and_the_libraries(tiny_dirs, tmp_path, capfd):
    model = str(tiny_dirs["qwen2"])
    out, err = _run(capfd, "drop", "-v", "--model", model, "--drop-last", "1", "--out", str(tmp_path / "d"))
    assert f"loading {model}" in err and "encoder EncoderConfig(" in err
    assert "Loading weights" in err                           # transformers' own bar, silenced without -v


def test_a_command_with_its_own_quiet_keeps_it():
    assert level_flags(["--quiet", "--task", "x"], {"quiet", "task"}) == (logging.WARNING, ["--quiet", "--task", "x"])
    assert level_flags(["-q", "--model", "m"], {"model"}) == (logging.WARNING, ["--model", "m"])
    assert level_flags(["-v"], set()) == (logging.DEBUG, [])
    assert level_flags([], set()) == (logging.INFO, [])


def test_processes_a_run_starts_inherit_its_level(monkeypatch):
    """Recipe stages and launcher ranks are started as `python -m dsprune.cli STAGE ...` without the flag."""
    monkeypatch.delenv(log.ENV, raising=False)
    with log.configured(log.QUIET):
        assert level_flags(["--model", "m"], {"model"})[0] == logging.WARNING
    assert log.ENV not in os.environ and level_flags([], set())[0] == logging.INFO


@pytest.mark.parametrize("launcher", ["train", "dai"])
def test_launchers_take_the_same_flags(launcher, tmp_path):
    """A launcher started with -q refuses a bad model in one line, as the CLI does, instead of an argparse
    usage error for -q."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "launchers" / f"{launcher}.py"
    extra = (["--train_data", "x", "--output_dir", str(tmp_path / "o")] if launcher == "train"
             else ["--domain", "x", "--general", "x", "--deepspeed", "ds_configs/dai_zero3.json",
                   "--output_dir", str(tmp_path / "o")])
    r = subprocess.run([sys.executable, str(script), "-q", "--model", str(tmp_path / "nope"), *extra],
                       capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    assert r.returncode == 2 and "unrecognized arguments" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines()[-1].startswith("error:") and not (tmp_path / "o").exists()
