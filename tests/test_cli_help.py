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
