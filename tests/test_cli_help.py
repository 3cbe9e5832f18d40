"""`--help` of every command and launcher prints its options: help texts are prose, and argparse formats them."""
import pytest

from dsprune.cli import COMMANDS, main
from dsprune.commands.dai import Args as DaiArgs
from dsprune.config import parse_args
from dsprune.train.slim import StageArgs


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_prints_its_help(name, capsys):
    with pytest.raises(SystemExit) as e:
        main([name, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    fields = COMMANDS[name].module.Args.__dataclass_fields__
    assert out.startswith(f"usage: dsprune {name}") and all(f"--{f}" in out for f in fields)


@pytest.mark.parametrize("cls,prog", [(StageArgs, "launchers/train.py"), (DaiArgs, "launchers/dai.py")])
def test_launchers_print_their_help(cls, prog, capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(cls, ["--help"], prog=prog)
    assert e.value.code == 0
    out = " ".join(capsys.readouterr().out.split())  # unwrapped
    assert "~30% more compute" in out if cls is StageArgs else "--domain" in out  # a '%' survives formatting


def test_the_runner_imports_only_the_command_it_runs():
    """A recipe runs every stage as a new `dsprune` process: the runner itself must not load torch, mteb, Ray or
    the other commands' modules, or each stage pays seconds for code it never runs (transformers' light
    argument parser reads the options)."""
    import subprocess
    import sys

    code = "from dsprune.cli import main; main(['report', '--help'])"
    probe = ("import sys, contextlib, io\n"
             "with contextlib.redirect_stdout(io.StringIO()):\n"
             "    try:\n"
             f"        exec({code!r})\n"
             "    except SystemExit:\n"
             "        pass\n"
             "print(sorted(m for m in sys.modules if m in ('torch', 'datasets', 'mteb', 'ray', 'deepspeed')\n"
             "             or m.startswith('dsprune.commands.')))\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "['dsprune.commands.report']", r.stdout


def test_a_dsprune_process_keeps_its_output_exit_code_and_exit_handlers(tmp_path):
    """`python -m dsprune.cli` leaves by os._exit, past the interpreter's finalization: what a normal exit does
    first must still happen. Piped (block-buffered) output arrives, the exit code is the command's, an atexit
    handler registered during the command runs, and a non-daemon thread finishes before the process ends."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "dsprune.cli", "--version"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("dsprune 0."), (r.returncode, r.stdout, r.stderr)
    r = subprocess.run([sys.executable, "-m", "dsprune.cli", "no-such-command"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "unknown command 'no-such-command'" in r.stderr
    mark, done = tmp_path / "atexit", tmp_path / "thread"
    probe = ("import atexit, sys, threading, time\n"
             "from pathlib import Path\n"
             "import dsprune.cli as cli\n"
             "def command(argv):\n"
             f"    atexit.register(Path({str(mark)!r}).write_text, 'ran')\n"
             f"    threading.Thread(target=lambda: (time.sleep(0.5), Path({str(done)!r}).write_text('ran'))).start()\n"
             "    print('piped line')\n"
             "    return 3\n"
             "cli.main = command\n"
             "cli.entry([])\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert r.returncode == 3 and r.stdout == "piped line\n", (r.returncode, r.stdout, r.stderr)
    assert mark.read_text() == "ran" and done.read_text() == "ran"
