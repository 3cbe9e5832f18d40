"""Training entry point (contrastive, self-slimming, self-distillation): ``deepspeed --num_gpus N launchers/train.py --config FILE.yaml [--opt v]``.

Also runs under ``torchrun --nproc_per_node N``, across nodes with a DeepSpeed hostfile, or as a plain
``python launchers/train.py`` (one rank). Thin on purpose: parse the arguments, set up the process (the
allocator, the rendezvous variables of a plain ``python`` start), run ``dsprune.train.loop``.
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout, when not pip-installed


def main(argv: list[str] | None = None) -> int:
    from dsprune import log
    from dsprune.cli import level_flags
    from dsprune.config import parse_args
    from dsprune.distributed import report_aborts
    from dsprune.errors import DsPruneError
    from dsprune.train.engine import remove_orphan_shm_buffers
    from dsprune.train.slim import StageArgs  # --mode train|slim|distill, --mask

    report_aborts()
    remove_orphan_shm_buffers()  # a launch killed with -9 leaves its ranks' buffers in RAM
    argv = list(sys.argv[1:] if argv is None else argv)
    # the DeepSpeed launcher appends --local_rank=N; the rank is read from the environment instead
    argv = [a for a in argv if not a.startswith("--local_rank")]
    level, argv = level_flags(argv, set())     # -q/-v as on every dsprune command
    try:
        with log.configured(level):
            return _run(parse_args(StageArgs, argv, prog="launchers/train.py"))
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _run(args) -> int:
    """Check what can be checked before any rank starts, then train."""
    from dsprune.commands.common import check_model_files
    from dsprune.distributed import close_process_group, one_rank_env
    from dsprune.formats import check_creatable, check_replaceable
    from dsprune.memory import hold_mmap_threshold
    from dsprune.train.loop import ARGS_FILE, train
    from dsprune.train.slim import stage_hooks

    check_creatable(args.output_dir, "--output_dir")   # now, not at the first save after set-up
    if args.overwrite and Path(args.output_dir).exists():
        check_replaceable(args.output_dir, "--output_dir", marks=(ARGS_FILE,))
    for what, model in (("model", args.model), ("teacher", args.teacher)):
        if model and model != "self":      # a damaged GGUF or another family: refused before any rank starts
            check_model_files(model, what)
    hooks = stage_hooks(args)
    threshold = hold_mmap_threshold()  # else freed activations stay resident (dsprune.memory)
    with one_rank_env():
        train(args, hooks, malloc_mmap_threshold=threshold)
        close_process_group()
    return 0


if __name__ == "__main__":
    from dsprune.distributed import exit_rank

    exit_rank(main())
