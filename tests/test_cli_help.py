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
