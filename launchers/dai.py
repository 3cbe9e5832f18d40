"""DeepSpeed entry point for GAPrune's parameter analysis (``dsprune dai`` under ZeRO-3).

    deepspeed --num_gpus 2 launchers/dai.py --config recipe.yaml --deepspeed ds_configs/dai_zero3.json

Every rank runs the same triplets (see ``dsprune.importance.fisher``): ZeRO-3 shards the parameters, the
gradient partitions and the Fisher / mean-gradient accumulators, so memory per rank falls with the
number of ranks; rank 0 writes the output. Takes the options of ``dsprune dai`` (``--output_dir`` is
accepted for ``--out``, so a recipe's launcher stage works unchanged), the batched statistics of the authors'
code too (``--fisher_batch 4 --grad_batch 2``: every rank runs the same batch); only ``--alignment reference``,
which smooths over whole matrices, needs the one-process command.
"""
from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from dsprune import log
    from dsprune.cli import level_flags
    from dsprune.commands import dai
    from dsprune.config import parse_args
    from dsprune.distributed import close_process_group, report_aborts
    from dsprune.errors import DsPruneError
    from dsprune.train.engine import remove_orphan_shm_buffers

    report_aborts()
    remove_orphan_shm_buffers()  # a launch killed with -9 leaves its ranks' buffers in RAM
    argv = list(sys.argv[1:] if argv is None else argv)
    # The deepspeed launcher appends --local_rank=N; the rank comes from the environment instead.
    argv = [a for a in argv if not a.startswith("--local_rank")]
    # Launcher stages of a recipe name their folder --output_dir (as launchers/train.py does).
    argv = ["--out" if a == "--output_dir" else a for a in argv]
    level, argv = level_flags(argv, set())     # -q/-v as on every dsprune command
    try:
        with log.configured(level):
            args = parse_args(dai.Args, argv, prog="launchers/dai.py")
            if not args.deepspeed:
                raise DsPruneError("launchers/dai.py needs --deepspeed CONFIG (a ZeRO-3 config, e.g. "
                                   "ds_configs/dai_zero3.json); for one process run `dsprune dai`")
            code = int(dai.run(args) or 0)
            close_process_group()
            return code
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from dsprune.distributed import exit_rank

    exit_rank(main())
