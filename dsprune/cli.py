"""The thin ``dsprune`` runner: each subcommand lives in its own module and registers here by name.

A command module defines ``Args`` (a dataclass, see ``config.parse_args``) and ``run(args)``; bad input
surfaces as one ``error:`` line and exit status 2, never a half-written output.
"""
from __future__ import annotations

import importlib
import sys

from .errors import DsPruneError

# name -> (module, one-line help). Modules are imported only when their command runs.
COMMANDS = {
    "demo": ("dsprune.commands.demo", "score, drop, export and reload a real small model in minutes"),
    "run": ("dsprune.commands.run", "run a recipe (YAML pipeline), resuming finished stages"),
    "score": ("dsprune.commands.score", "EffiR layer importance (1 - cos) on calibration text"),
    "drop": ("dsprune.commands.drop", "drop attention/MLP sub-layers or blocks and export the smaller model"),
    "sample": ("dsprune.commands.sample", "GAPrune representative sampling: k-means over query embeddings"),
    "dai": ("dsprune.commands.dai", "GAPrune per-sample Fisher, gradient alignment and DAI scores"),
    "prune": ("dsprune.commands.prune", "build a mask: dai|magnitude|fisher|random|wanda, unstructured or neurons"),
    "export": ("dsprune.commands.export", "apply a mask (zeros or removed neurons) and export the model"),
    "eval": ("dsprune.commands.eval", "mteb retrieval, classification, STS (NAME or NAME=FOLDER), geometry"),
    "bench": ("dsprune.commands.bench", "encoding speed-up vs a baseline, FLOP ratio, retrieval latency"),
    "report": ("dsprune.commands.report", "compare results with paired bootstrap CIs; quality-vs-speed plot"),
    "mine": ("dsprune.commands.mine", "hard negatives for a BEIR train split -> training groups (JSONL)"),
    "mask": ("dsprune.commands.mask", "self-slimming: rank gates globally -> structured neuron mask, width plot"),
    "tune": ("dsprune.commands.tune", "Ray Tune sweep over a pipeline: score vs measured cost, Pareto front"),
}


def usage() -> str:
    lines = ["usage: dsprune COMMAND [--config FILE] [options]", "", "commands:"]
    lines += [f"  {name:<8} {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "dsprune COMMAND --help lists a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        print(f"error: unknown command {name!r}\n\n{usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(COMMANDS[name][0])
    positional = getattr(module, "POSITIONAL", None)  # e.g. `dsprune run RECIPE` == `--recipe RECIPE`
    if positional and rest and not rest[0].startswith("-"):
        rest = [f"--{positional}", *rest]
    from .config import parse_args
    try:
        args = parse_args(module.Args, rest, prog=f"dsprune {name}")
        result = module.run(args)
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
