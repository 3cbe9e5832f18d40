"""The thin ``dsprune`` runner: each subcommand lives in its own module, listed here with its one-line help.

A command module defines ``Args`` (a dataclass, see ``config.parse_args``) and ``run(args)``; bad input
surfaces as one ``error:`` line and exit status 2, never a half-written output. Only the chosen command's module
is imported, and it keeps its heavy imports (models, plots, Ray) inside ``run``: a recipe runs each stage as a
fresh process, so start-up time is paid once per stage.
"""
from __future__ import annotations

import atexit
import dataclasses
import importlib
import os
import sys
import threading
from types import ModuleType
from typing import NamedTuple

from .errors import DsPruneError
from .formats import claims_released


class Command(NamedTuple):
    name: str
    help: str

    @property
    def module(self) -> ModuleType:
        """Imported on use: every recipe stage is a fresh process, and importing all commands' modules would
        cost each of them seconds for code it never runs."""
        return importlib.import_module(f"dsprune.commands.{self.name}")


COMMANDS = {
    "demo": Command("demo", "score, drop, export and reload a real small model in minutes"),
    "run": Command("run", "run a recipe (YAML pipeline), resuming finished stages"),
    "score": Command("score", "EffiR layer importance (1 - cos) on calibration text"),
    "plan": Command("plan", "ask for a FLOP speed-up: drop counts and slimming ratio that reach it"),
    "drop": Command("drop", "drop attention/MLP sub-layers or blocks and export the smaller model"),
    "sample": Command("sample", "GAPrune representative sampling: k-means over query embeddings"),
    "dai": Command("dai", "GAPrune per-sample Fisher, gradient alignment and DAI scores"),
    "prune": Command("prune", "build a mask: dai|magnitude|fisher_dom|fisher_gen|random|wanda, unstructured or "
                              "neurons"),
    "export": Command("export", "apply a mask (zeros or removed neurons) and export the model"),
    "eval": Command("eval", "mteb retrieval, classification, STS (NAME or NAME=FOLDER), geometry"),
    "bench": Command("bench", "encoding speed-up vs a baseline, FLOP ratio, retrieval latency"),
    "report": Command("report", "compare results with paired bootstrap CIs; quality-vs-speed plot"),
    "mine": Command("mine", "hard negatives for a BEIR train split -> training groups (JSONL)"),
    "mask": Command("mask", "self-slimming: rank gates globally -> structured neuron mask, width plot"),
    "tune": Command("tune", "Ray Tune sweep over a pipeline: score vs measured cost, Pareto front"),
}


def usage() -> str:
    lines = ["usage: dsprune [-q|-v] COMMAND [--config FILE] [options] | dsprune --version", "", "commands:"]
    lines += [f"  {name:<8} {c.help}" for name, c in COMMANDS.items()]
    lines += ["", "dsprune COMMAND --help lists a command's options.",
              "-q/--quiet: warnings and errors only, no progress bars; -v/--verbose: debug lines and the libraries' "
              "load reports. Either goes before or after COMMAND."]
    return "\n".join(lines)


LEVEL_FLAGS = {"-q": "quiet", "--quiet": "quiet", "-v": "verbose", "--verbose": "verbose"}


def level_flags(argv: list[str], own: set[str]) -> tuple[int, list[str]]:
    """The log level ``-q``/``-v`` ask for, and ``argv`` without them. A command whose options have a field of
    the same name (``eval --quiet``: the result table only) keeps the flag too, given before or after its name."""
    from . import log

    level, rest = log.inherited(), []
    for a in argv:
        name = LEVEL_FLAGS.get(a)
        if name is None:
            rest.append(a)
            continue
        level = log.QUIET if name == "quiet" else log.VERBOSE
        if name in own:
            rest.append(f"--{name}")
    return level, rest


def main(argv: list[str] | None = None) -> int:
    from . import log
    from .config import parse_args

    argv = list(sys.argv[1:] if argv is None else argv)
    lead = 0                                     # global flags before the command name
    while lead < len(argv) and argv[lead] in LEVEL_FLAGS:
        lead += 1
    flags, argv = argv[:lead], argv[lead:]
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from . import __version__
        from .formats import code_version
        print(f"dsprune {__version__} ({code_version()})")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = COMMANDS[name].module
    level, rest = level_flags(flags + rest, {f.name for f in dataclasses.fields(module.Args)})
    positional = getattr(module, "POSITIONAL", None)  # e.g. `dsprune run RECIPE` == `--recipe RECIPE`
    if positional and rest and not rest[0].startswith("-"):
        rest = [f"--{positional}", *rest]
    try:
        with log.configured(level), claims_released():
            args = parse_args(module.Args, rest, prog=f"dsprune {name}")
            result = module.run(args)
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(result or 0)


def entry(argv: list[str] | None = None) -> None:
    """The ``dsprune`` command and ``python -m dsprune.cli``. A process that ran a command ends without the
    interpreter's finalization: tearing down the module graph of torch and transformers takes seconds, and a recipe
    or a sweep runs one process per stage. What a normal exit does first is done here: non-daemon threads are
    joined, the atexit handlers (logging, Ray, TensorBoard writers) run and the streams are flushed. An exception
    or ``sys.exit`` (argparse) takes the normal way out. A launcher's rank leaves by ``distributed.exit_rank``
    instead, which runs no atexit handlers: there, finalization is what may abort a finished run."""
    code = main(argv)
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


if __name__ == "__main__":
    entry()
