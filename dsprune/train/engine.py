"""What the trainer asks of DeepSpeed: the process group, the config with its "auto" entries filled, the
engine around the model, its checkpoints, and the full weights gathered back for the export.

The optimizer (torch.optim.AdamW) and its learning-rate schedule are built here and handed to DeepSpeed, so
a config file carries no optimizer or scheduler block: DeepSpeed's own optimizer would compile fused_adam.
DeepSpeed is imported only inside these functions: importing it is slow, and every check before a run
starts must stay fast.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from .. import distributed, formats
from . import checkpoints
from ..errors import DsPruneError
from .arguments import TrainArgs, as_mapping, resolve_path


def deepspeed_config(args: TrainArgs, world: int, hidden: int) -> dict:
    """The DeepSpeed config file with its "auto" entries filled from the training arguments."""
    path = resolve_path(args.deepspeed)
    cfg = formats.read_json(path, "DeepSpeed config")
    _merge(cfg, as_mapping(args.deepspeed_overrides, "deepspeed_overrides"))
    for block in ("optimizer", "scheduler"):
        if block in cfg:
            raise DsPruneError(f"{path}: remove the '{block}' block: dsprune passes torch.optim.AdamW and its "
                               "schedule itself (a DeepSpeed optimizer block compiles fused_adam)")
    mb, ga = args.per_device_batch_size, args.gradient_accumulation_steps
    auto = {"train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": ga,
            "train_batch_size": mb * ga * world, "gradient_clipping": args.max_grad_norm,
            "bf16.enabled": args.dtype == "bfloat16", "fp16.enabled": args.dtype == "float16",
            "zero_optimization.reduce_bucket_size": hidden * hidden,
            "zero_optimization.stage3_prefetch_bucket_size": int(0.9 * hidden * hidden),
            "zero_optimization.stage3_param_persistence_threshold": 10 * hidden}

    def fill(node: dict, prefix: str) -> None:
        for k, v in node.items():
            key = f"{prefix}{k}"
            if isinstance(v, dict):
                fill(v, key + ".")
            elif v == "auto":
                if key not in auto:
                    raise DsPruneError(f"{path}: no value for \"auto\" at {key}")
                node[k] = auto[key]
            elif key in auto and key.split(".")[0] in ("train_micro_batch_size_per_gpu",
                                                        "gradient_accumulation_steps") and v != auto[key]:
                raise DsPruneError(f"{path}: {key} = {v} contradicts the training arguments ({auto[key]}); "
                                   "use \"auto\"")
    fill(cfg, "")
    return cfg


def _merge(base: dict, over: dict) -> None:
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            _merge(base[k], v)
        else:
            base[k] = v


def start_process_group(args: TrainArgs) -> tuple[int, int, str]:
    """Join the group DeepSpeed's launcher or torchrun describes in the environment (a plain ``python``
    start gets its one-rank variables from the entry point: ``distributed.one_rank_env``). Returns this
    rank, the number of ranks and the device this rank trains on."""
    if "RANK" not in os.environ:
        raise DsPruneError("no RANK in the environment: start training through launchers/train.py (deepspeed, "
                           "torchrun or python), or inside dsprune.distributed.one_rank_env()")
    import deepspeed

    distributed.warn_stale_build_locks()
    deepspeed.init_distributed(dist_backend=None if args.backend == "auto" else args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", 0))
    if args.device == "auto":
        from deepspeed.accelerator import get_accelerator
        device = get_accelerator().device_name(local)
    elif args.device in ("cuda", "xpu", "npu", "mps"):
        device = f"{args.device}:{local}"
    else:
        device = args.device
    if device.startswith("cuda"):
        torch.cuda.set_device(device)
    return rank, world, device


def remove_orphan_shm_buffers() -> list[str]:
    """Unlink this user's DeepSpeed CPU allreduce buffers that no live process holds: what a launch killed
    with -9 leaves in /dev/shm, which is RAM (its ranks never reach ``close_process_group``). A rank keeps
    its own buffer open and mapped, and its peers map it, from creation until they exit, so a buffer that
    no process has open or mapped belongs to no running launch. Listed before the processes are read: a
    buffer created after the listing is not looked at. One rank per host looks (the first); says what it
    removed."""
    from ..distributed import shm_buffers

    found = shm_buffers("*") if os.environ.get("LOCAL_RANK", "0") == "0" else []   # any address, port, rank
    if not found:
        return []
    held: set[str] = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            for fd in (proc / "fd").iterdir():
                with contextlib.suppress(OSError):
                    held.add(os.readlink(fd))
            with open(proc / "maps") as maps:
                held.update(line.split(None, 5)[-1].strip() for line in maps if "/dev/shm/" in line)
        except OSError:                            # the process ended meanwhile, or is not ours to read
            continue
    gone = [p for p in found if str(p) not in held]
    for path in gone:
        path.unlink(missing_ok=True)
    if gone:
        print(f"removed {len(gone)} DeepSpeed shm buffer(s) of killed launches from /dev/shm: "
              f"{', '.join(p.name for p in gone)}", flush=True)
    return [p.name for p in gone]


def optimizer_groups(model: torch.nn.Module, args: TrainArgs, groups: list[dict]) -> list[dict]:
    """``groups`` (a stage's own, e.g. gates with their learning rate) plus every other trainable parameter
    as the group "model"; the training arguments fill what a group leaves unset."""
    groups = list(groups)
    taken = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in taken]
    if rest:
        groups.append({"params": rest, "name": "model"})
    for g in groups:
        g.setdefault("weight_decay", args.weight_decay)
        g.setdefault("lr", args.learning_rate)
    if not any(g["params"] for g in groups):
        raise DsPruneError("no trainable parameters")
    return groups


def lr_factor(args: TrainArgs, max_steps: int) -> Callable[[int], float]:
    """The learning-rate multiplier of each step: linear warm-up, then constant or a linear decay to 0."""
    def f(step: int) -> float:
        if args.warmup_steps and step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        if args.lr_scheduler == "constant":
            return 1.0
        return max(0.0, (max_steps - step) / max(1, max_steps - args.warmup_steps))
    return f


def wrap(model: torch.nn.Module, args: TrainArgs, groups: list[dict], world: int, hidden: int,
         max_steps: int) -> tuple[object, dict]:
    """The DeepSpeed engine around ``model`` with AdamW over ``groups`` and its schedule; and the config."""
    import deepspeed

    optimizer = torch.optim.AdamW(optimizer_groups(model, args, groups), lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor(args, max_steps))
    cfg = deepspeed_config(args, world, hidden)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=cfg, dist_init_required=False)
    return engine, cfg


def load_checkpoint(engine, ckdir: Path, world: int, args: TrainArgs) -> int:
    """Restore the newest complete checkpoint in ``ckdir``; returns the step it was written at."""
    _, state = engine.load_checkpoint(str(ckdir), tag=checkpoints.complete_checkpoint(ckdir),
                                      load_module_strict=not args.lora)
    if state is None:
        raise DsPruneError(f"--resume: could not load a checkpoint from {ckdir}")
    if state.get("world_size") != world:
        raise DsPruneError(f"--resume: checkpoint was written by {state.get('world_size')} ranks, this run "
                           f"has {world} (the data order depends on it)")
    return int(state["step"])


def save_checkpoint(engine, ckdir: Path, step: int, world: int, args: TrainArgs, rank: int) -> None:
    """Checkpoint ``step`` (every rank writes its shards, then rank 0 its commit mark), then keep the newest
    ``save_total_limit``."""
    tag = ckdir / f"step{step}"
    engine.save_checkpoint(str(ckdir), tag=tag.name, client_state={"step": step, "world_size": world},
                           exclude_frozen_parameters=args.lora)
    dist.barrier()      # every rank's shards are on disk
    if rank == 0:
        formats.write_json(tag / checkpoints.COMMIT, {"step": step, "files": checkpoints.files(tag)})
        if args.save_total_limit > 0:
            for old in checkpoints.tags(ckdir)[args.save_total_limit:]:
                shutil.rmtree(old, ignore_errors=True)


def gathered_state(engine, rank: int) -> dict[str, torch.Tensor]:
    """Full fp32 parameters on rank 0 (ZeRO-3 shards gathered one tensor at a time; no-op otherwise)."""
    import deepspeed

    sd = {}
    for name, p in engine.module.named_parameters():
        with deepspeed.zero.GatheredParameters([p], modifier_rank=None):
            if rank == 0:
                sd[name] = p.detach().to("cpu", torch.float32).clone()
    return sd
