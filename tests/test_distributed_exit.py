"""A launcher's rank leaves through ``exit_rank``: its code and everything it printed must survive the
skipped interpreter finalization, and an abort must name the Python stack it happened in. A plain
``python`` start gets its rendezvous variables from ``one_rank_env``, for its time only."""
import os
import subprocess
import sys

import pytest

from dsprune.distributed import one_rank_env
from dsprune.errors import DsPruneError
from dsprune.settings import REPO_ROOT

RENDEZVOUS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def _run(code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as without `-u`
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=str(REPO_ROOT), env=env)


def test_exit_rank_keeps_code_and_buffered_output():
    # no newline and a pipe (block-buffered): only an explicit flush gets these out before os._exit
    r = _run("import sys\n"
             "from dsprune.distributed import exit_rank\n"
             "print('written to stdout', end='')\n"
             "sys.stderr.write('written to stderr')\n"
             "import atexit; atexit.register(print, 'atexit ran')\n"
             "exit_rank(3)\n")
    assert r.returncode == 3
    assert r.stdout == "written to stdout"  # and no finalization: the atexit handler never ran
    assert r.stderr == "written to stderr"


def test_report_aborts_prints_the_python_stack_of_an_abort():
    r = _run("import os, signal\n"
             "from dsprune.distributed import report_aborts\n"
             "report_aborts()\n"
             "def finishing_the_run():\n"
             "    os.kill(os.getpid(), signal.SIGABRT)\n"
             "finishing_the_run()\n")
    assert r.returncode != 0
    assert "Fatal Python error: Aborted" in r.stderr
    assert "finishing_the_run" in r.stderr


def test_one_rank_env_sets_only_what_a_launcher_did_not_and_removes_it(monkeypatch):
    for key in RENDEZVOUS:
        monkeypatch.delenv(key, raising=False)
    with one_rank_env():
        assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("0", "1", "0")
        assert int(os.environ["MASTER_PORT"]) > 0
    assert not any(key in os.environ for key in RENDEZVOUS)
    monkeypatch.setenv("RANK", "3")
    with one_rank_env():
        assert os.environ["RANK"] == "3" and "MASTER_PORT" not in os.environ


def test_training_outside_a_launcher_names_the_missing_rank(monkeypatch):
    from dsprune.train.arguments import TrainArgs
    from dsprune.train.engine import start_process_group

    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(DsPruneError, match="no RANK in the environment"):
        start_process_group(TrainArgs(model="m"))
