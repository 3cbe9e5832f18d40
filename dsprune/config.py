"""Arguments as dataclasses, filled from a YAML/JSON file and then from the command line.

Each stage owns one dataclass; a ``--config FILE`` gives defaults that explicit flags override, the way
Tevatron and Hugging Face scripts read arguments.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any, Sequence, TypeVar

from .errors import DsPruneError

T = TypeVar("T")


def load_config_file(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise DsPruneError(f"config file not found: {path}")
    text = path.read_text()
    try:
        if path.suffix in (".yaml", ".yml"):
            import yaml
            data = yaml.safe_load(text) or {}
        else:
            data = json.loads(text)
    except Exception as e:  # yaml and json raise different types; both mean the same to the user
        raise DsPruneError(f"{path}: cannot parse config: {e}") from None
    if not isinstance(data, dict):
        raise DsPruneError(f"{path}: config must be a mapping of option names to values")
    return data


def parse_args(cls: type[T], argv: Sequence[str] | None = None, prog: str | None = None,
               defaults: dict | None = None) -> T:
    """Parse ``argv`` into ``cls`` with ``HfArgumentParser``; ``--config FILE`` supplies defaults."""
    from transformers import HfArgumentParser

    argv = list(argv or [])
    file_defaults: dict[str, Any] = dict(defaults or {})
    if "--config" in argv:
        i = argv.index("--config")
        if i + 1 >= len(argv):
            raise DsPruneError("--config needs a file")
        file_defaults.update(load_config_file(argv[i + 1]))
        del argv[i:i + 2]
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(file_defaults) - names)
    if unknown:
        raise DsPruneError(f"unknown option(s) in config: {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    parser = HfArgumentParser(cls, prog=prog)
    # read above; declared here only so that --help lists it (SUPPRESS: it never reaches the dataclass)
    parser.add_argument("--config", metavar="FILE", default=argparse.SUPPRESS,
                        help="YAML/JSON file of option values; options given on the command line win")
    parser.set_defaults(**file_defaults)
    for action in parser._actions:
        if action.dest in file_defaults:  # given in the file: no longer required on the command line
            action.required = False
        if action.help:  # help texts are prose ("~30% more"), argparse would read % as a format directive
            action.help = action.help.replace("%", "%%").replace("%%(default)s", "%(default)s")
    try:
        (args,) = parser.parse_args_into_dataclasses(args=argv)
    except ValueError as e:  # unknown flags: one clear line, not a traceback
        raise DsPruneError(str(e).replace("HfArgumentParser", prog or "this command")) from None
    return args
