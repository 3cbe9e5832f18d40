"""`dsprune run RECIPE`: execute a YAML pipeline stage by stage, reusing stages whose inputs are unchanged."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..log import logger
from ..recipe import parse_params, parse_sets, run_recipe

POSITIONAL = "recipe"


@dataclass
class Args:
    recipe: str = field(metadata={"help": "recipe YAML (see recipes/)"})
    out: str | None = field(default=None, metadata={"help": "output root (default: the recipe's `out`)"})
    force: bool = field(default=False, metadata={"help": "rerun every stage"})
    only: list[str] = field(default_factory=list, metadata={
        "help": "run only these stages (and reuse finished ones); others not up to date are skipped, and a "
                "selected stage that reads a skipped one is an error"})
    param: list[str] = field(default_factory=list, metadata={
        "help": "NAME=VALUE for the recipe's params, e.g. model=gemma3-270m drop_mlp=9"})
    set: list[str] = field(default_factory=list, metadata={
        "help": "STAGE.OPTION=VALUE: change one stage's option for this run, e.g. plan.order=last"})


def run(args: Args) -> int:
    report = run_recipe(args.recipe, args.out, only=args.only or None, force=args.force,
                        params=parse_params(args.param), overrides=parse_sets(args.set))
    w = max(len(n) for n in report)
    print("\n" + "\n".join(f"{n:<{w}}  {r['status']:<7} {r.get('seconds', '')} s" for n, r in report.items()))
    for n, r in report.items():
        if r.get("folder"):
            logger.info(f"{n}: {r['folder']}")
    return 0
