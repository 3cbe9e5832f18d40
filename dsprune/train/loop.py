"""The DeepSpeed engine loop for contrastive training, reused by self-slimming and retraining.

Stages that build on it do not fork it; they pass ``Hooks``: ``prepare_model`` (e.g. insert neuron gates
before DeepSpeed wraps the model), ``param_groups`` (groups with their own learning rate), ``extra_loss``
(e.g. the gate sparsity penalty), ``after_step`` (e.g. re-apply a held mask) and ``before_export`` (e.g.
slice masked neurons). Device, dtype and process-group backend come from the arguments; the same code
runs on CPU ranks with gloo and on GPUs with nccl.

Order of work: validate options, read and validate all data, and only then start the process group,
load models and build the engine, so bad input never costs a DeepSpeed start-up.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from .. import formats
from ..distributed import free_port
from ..encoder import Encoder, EncoderConfig
from ..errors import DsPruneError
from ..losses import info_nce, kl_distill
from ..memory import hold_mmap_threshold, peak_rss_bytes
from . import lora as lora_mod
from .arguments import TrainArgs, as_mapping, resolve_path, validate
from .data import Collator, Schedule, load_groups

CKPT = "checkpoints"
LOG = "log.jsonl"
ARGS_FILE = "train_args.json"
# options that may change between a run and its resumption (they do not change what is computed)
RESUMABLE = {"resume", "overwrite", "save_steps", "save_total_limit", "logging_steps", "eval_task", "eval_steps",
             "eval_split", "eval_max_queries", "eval_max_docs", "eval_batch_size", "export", "scaled_settings",
             "output_dir"}


@dataclass
class Hooks:
    """Extension points for stages built on this loop (all optional)."""

    prepare_model: Callable[[Encoder], None] | None = None
    param_groups: Callable[[Encoder], list[dict]] | None = None
    extra_loss: Callable[[Encoder, int], "torch.Tensor | tuple[torch.Tensor, dict]"] | None = None
    after_step: Callable[[object, int, dict], None] | None = None
    before_export: Callable[[Encoder], None] | None = None
    stage: str = "train"
    manifest_extra: dict = field(default_factory=dict)
    export_extra: dict = field(default_factory=dict)     # entries of the exported model's manifest (e.g. its mask)


# ---- set-up -----------------------------------------------------------------------------------------------
def encoder_overrides(args: TrainArgs) -> dict:
    over = as_mapping(args.encoder, "encoder")
    names = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(over) - names)
    if unknown:
        raise DsPruneError(f"encoder: unknown option(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    return over


def load_student(args: TrainArgs, device: str, hooks: Hooks, attach_lora: bool = True) -> Encoder:
    """The model to train, exactly as every rank (and the export) builds it."""
    enc = Encoder.load(args.model, dtype="float32", device=device)  # DeepSpeed casts for bf16/fp16
    over = encoder_overrides(args)
    if over:
        enc.config = EncoderConfig.from_dict({**dataclasses.asdict(enc.config), **over})
        enc._setup_tokenizer()
    if hooks.prepare_model:
        hooks.prepare_model(enc)
    if args.lora and attach_lora:
        torch.manual_seed(args.seed)  # identical adapter init on every rank
        lora_mod.attach(enc, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets)
    elif not args.lora:
        for p in enc.parameters():
            p.requires_grad_(True)
    return enc


def check_before_start(args: TrainArgs) -> None:
    """Everything that can fail on input, before a process group exists."""
    validate(args)
    encoder_overrides(args)
    from ..packaged import model_path
    if not Path(model_path(args.model)).exists():          # `smollm2` works here as anywhere a path does
        raise DsPruneError(f"model not found: {args.model}")
    if args.teacher and args.teacher != "self" and not Path(model_path(args.teacher)).exists():
        raise DsPruneError(f"teacher not found: {args.teacher}")
    deepspeed_config(args, 1, 64)  # its "auto" entries and forbidden blocks, checked now
    out = Path(args.output_dir)
    if args.resume and (out / ARGS_FILE).is_file():
        before = formats.read_json(out / ARGS_FILE, "training arguments")
        now = dataclasses.asdict(args)
        diff = sorted(k for k in now if k not in RESUMABLE and before.get(k) != now[k])
        if diff:
            raise DsPruneError(f"--resume with changed option(s) {', '.join(diff)}: a resumed run must repeat "
                               f"the original's settings (see {out / ARGS_FILE})")


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


def _init_process_group(args: TrainArgs):
    """DeepSpeed's launcher, torchrun or a plain ``python`` (one rank) all work."""
    import deepspeed

    if "RANK" not in os.environ:  # plain python: a one-rank group
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                          MASTER_PORT=str(free_port()))
    deepspeed.init_distributed(dist_backend=None if args.backend == "auto" else args.backend)
    import torch.distributed as dist
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


def _param_groups(enc: Encoder, args: TrainArgs, hooks: Hooks) -> list[dict]:
    groups = list(hooks.param_groups(enc)) if hooks.param_groups else []
    taken = {id(p) for g in groups for p in g["params"]}
    rest = [p for p in enc.parameters() if p.requires_grad and id(p) not in taken]
    if rest:
        groups.append({"params": rest, "name": "model"})
    for g in groups:
        g.setdefault("weight_decay", args.weight_decay)
        g.setdefault("lr", args.learning_rate)
    if not any(g["params"] for g in groups):
        raise DsPruneError("no trainable parameters")
    return groups


def _schedule_fn(args: TrainArgs, max_steps: int):
    def f(step: int) -> float:
        if args.warmup_steps and step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        if args.lr_scheduler == "constant":
            return 1.0
        return max(0.0, (max_steps - step) / max(1, max_steps - args.warmup_steps))
    return f


# ---- the loss -----------------------------------------------------------------------------------------------
def contrastive_loss(q: torch.Tensor, p: torch.Tensor, teacher_scores: torch.Tensor | None,
                     args: TrainArgs) -> tuple[torch.Tensor, dict]:
    """InfoNCE (in-batch + hard + cross-rank negatives) plus KL distillation, weighted as configured."""
    parts, total = {}, 0.0
    if args.infonce_weight > 0:
        parts["infonce"] = info_nce(q, p, args.group_size, args.temperature, args.cross_rank_negatives)
        total = total + args.infonce_weight * parts["infonce"]
    if args.kl_weight > 0:
        parts["kl"] = kl_distill(q, p, teacher_scores.to(q.device), args.group_size, args.temperature,
                                 args.teacher_temperature)
        total = total + args.kl_weight * parts["kl"]
    return total, parts


@torch.no_grad()
def teacher_scores(teacher: Encoder, batch: dict, args: TrainArgs) -> torch.Tensor:
    """Teacher similarities (cos / temperature) of each query with its own group, teacher tokenisation."""
    dev = teacher.device
    tq = teacher.tokenize(batch["queries"], "query", max_length=args.query_max_length)
    tp = teacher.tokenize(batch["passages"], "passage", max_length=args.passage_max_length)
    q = teacher(tq["input_ids"].to(dev), tq["attention_mask"].to(dev)).float()
    p = teacher(tp["input_ids"].to(dev), tp["attention_mask"].to(dev)).float()
    p = p.view(q.shape[0], args.group_size, -1)
    return torch.einsum("bd,bgd->bg", q, p) / args.temperature


# ---- the run ------------------------------------------------------------------------------------------------
def train(args: TrainArgs, hooks: Hooks | None = None) -> dict | None:
    """Train, checkpoint, export. Returns the run manifest on rank 0 (None elsewhere)."""
    hooks = hooks or Hooks()
    check_before_start(args)
    need_scores = args.kl_weight > 0 and not args.teacher
    groups = load_groups(args.train_data, args.beir_split, args.beir_random_negatives, args.seed,
                         args.max_examples, need_scores)

    import deepspeed
    import torch.distributed as dist

    t_start = time.time()
    mmap_threshold = hold_mmap_threshold()  # else freed activations stay resident (dsprune.memory)
    rank, world, device = _init_process_group(args)
    schedule = Schedule(len(groups), args.per_device_batch_size, world, args.gradient_accumulation_steps,
                        args.seed)
    max_steps = args.max_steps or max(1, int(args.num_epochs * schedule.steps_per_epoch))
    out = Path(args.output_dir)
    ckdir = out / CKPT
    if rank == 0:
        if out.exists() and args.overwrite:
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
        formats.write_json(out / ARGS_FILE, dataclasses.asdict(args))
    dist.barrier()

    enc = load_student(args, device, hooks)
    if args.gradient_checkpointing:
        enc.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    teacher = None
    if args.kl_weight > 0 and args.teacher:
        teacher = (load_student(args, device, hooks, attach_lora=False) if args.teacher == "self"
                   else Encoder.load(args.teacher, dtype=args.dtype, device=device))
        teacher.eval().requires_grad_(False)
    params_total = sum(p.numel() for n, p in enc.named_parameters() if "lora_" not in n)
    params_trainable = sum(p.numel() for p in enc.parameters() if p.requires_grad)
    optimizer = torch.optim.AdamW(_param_groups(enc, args, hooks), lr=args.learning_rate,
                                  weight_decay=args.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule_fn(args, max_steps))
    ds_cfg = deepspeed_config(args, world, enc.embedding_dim)
    engine, _, _, _ = deepspeed.initialize(model=enc, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_cfg, dist_init_required=False)
    model: Encoder = engine.module
    collator = Collator(model, args.query_max_length, args.passage_max_length)
    setup_peak = peak_rss_bytes()  # loading (a GGUF is dequantised) and the engine, before any step

    start = 0
    if args.resume:
        _, state = engine.load_checkpoint(str(ckdir), load_module_strict=not args.lora)
        if state is None:
            raise DsPruneError(f"--resume: could not load a checkpoint from {ckdir}")
        if state.get("world_size") != world:
            raise DsPruneError(f"--resume: checkpoint was written by {state.get('world_size')} ranks, this run "
                               f"has {world} (the data order depends on it)")
        start = int(state["step"])

    writer = log_rows = None
    if rank == 0:
        from torch.utils.tensorboard import SummaryWriter
        writer = SummaryWriter(str(out / "tensorboard"), purge_step=start + 1 if start else None)
        log_rows = [r for r in _read_log(out / LOG) if r["step"] <= start] if start else []
        _write_log(out / LOG, log_rows)

    eval_set = None
    if args.eval_task:
        from .data import resolve_source
        from .evaluate import EvalSet
        eval_set = EvalSet(resolve_source(args.eval_task), args.eval_split, args.eval_max_queries,
                           args.eval_max_docs, args.seed)
    last_eval: dict = {}

    def run_eval(step: int) -> None:
        from .evaluate import evaluate
        res = evaluate(model, eval_set, args.eval_batch_size)
        last_eval.update(res, step=step)
        if writer:
            for k, v in res.items():
                writer.add_scalar(f"eval/{k}", v, step)
            writer.flush()

    if eval_set is not None and start == 0:
        run_eval(0)

    from tqdm.auto import tqdm
    bar = tqdm(total=max_steps, initial=start, desc=hooks.stage, disable=rank != 0, dynamic_ncols=True)
    engine.train()
    t_loop, steps_done, tokens_done = time.time(), 0, 0.0
    for step in range(start, max_steps):
        t0 = time.time()
        lrs = [(g.get("name"), g["lr"]) for g in engine.optimizer.param_groups]  # the lr this step uses
        sums: dict[str, float] = {}
        tokens = 0
        for micro in range(args.gradient_accumulation_steps):
            batch = collator(schedule.examples(groups, args.group_size, step, micro, rank))
            # dropout (if any) depends only on (seed, step, micro, rank): resumed runs repeat it
            torch.manual_seed(args.seed * 1_000_003 + step * 1009 + micro * 31 + rank)
            qb, pb = batch["query"], batch["passage"]
            q = engine(qb["input_ids"].to(device), qb["attention_mask"].to(device))
            p = engine(pb["input_ids"].to(device), pb["attention_mask"].to(device))
            ts = teacher_scores(teacher, batch, args) if teacher is not None else batch["teacher_scores"]
            loss, parts = contrastive_loss(q, p, ts, args)
            if hooks.extra_loss:
                extra = hooks.extra_loss(model, step)
                extra, extra_logs = extra if isinstance(extra, tuple) else (extra, {})
                loss = loss + extra
                parts["extra"] = extra
                parts.update({k: torch.as_tensor(v) for k, v in extra_logs.items()})
            engine.backward(loss)
            engine.step()
            parts["total"] = loss
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach()) / args.gradient_accumulation_steps
            tokens += int(qb["attention_mask"].sum() + pb["attention_mask"].sum())
        # average the logged figures over ranks (losses differ per rank without cross-rank negatives)
        keys = sorted(sums)
        vec = torch.tensor([sums[k] for k in keys] + [float(tokens)], dtype=torch.float64)
        dist.all_reduce(vec)
        logs = {k: vec[i].item() / world for i, k in enumerate(keys)}
        tokens_all = vec[-1].item()
        dt = time.time() - t0
        steps_done += 1
        tokens_done += tokens_all
        gn = engine.get_global_grad_norm()
        row = {"step": step + 1, "loss": logs.pop("total"), **{f"loss_{k}": v for k, v in logs.items()},
               "lr": lrs[0][1],
               "grad_norm": float(gn) if gn is not None else None,
               "queries_per_s": schedule.global_batch / dt, "tokens_per_s": tokens_all / dt,
               "epoch": schedule.epoch_of(step)}
        for name, lr in lrs[1:]:
            if name:
                row[f"lr_{name}"] = lr
        if hooks.after_step:
            hooks.after_step(engine, step + 1, row)
        done = step + 1
        if eval_set is not None and ((args.eval_steps and done % args.eval_steps == 0) or done == max_steps):
            run_eval(done)
            row["eval_ndcg_at_10"] = last_eval["ndcg_at_10"]
        if rank == 0:
            log_rows.append(row)
            with open(out / LOG, "a") as f:
                f.write(json.dumps(row) + "\n")
            if done % max(1, args.logging_steps) == 0 or done == max_steps:
                _scalars(writer, row, done)
            bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}")
            bar.update(1)
        if (args.save_steps and done % args.save_steps == 0) or done == max_steps:
            _save(engine, ckdir, done, world, args, rank)
    bar.close()
    train_seconds = time.time() - t_loop

    train_peak = peak_rss_bytes()  # before the export, which rebuilds the model on rank 0
    export_dir = None
    if args.export:
        export_dir = _export(engine, args, hooks, rank, device, out, params_total)
    peaks = [None] * world
    dist.all_gather_object(peaks, (round(setup_peak / 2**30, 2), round(train_peak / 2**30, 2)))
    if rank != 0:
        return None
    writer.close()
    figures = {"steps": max_steps, "steps_this_run": steps_done, "resumed_from": start,
               "train_seconds": round(train_seconds, 1), "total_seconds": round(time.time() - t_start, 1),
               "queries_per_s": round(steps_done * schedule.global_batch / max(train_seconds, 1e-9), 3),
               "tokens_per_s": round(tokens_done / max(train_seconds, 1e-9), 1),
               "first_loss": log_rows[0]["loss"] if log_rows else None,
               "final_loss": log_rows[-1]["loss"] if log_rows else None,
               "setup_peak_rss_gb_per_rank": [a for a, _ in peaks],
               "peak_rss_gb_per_rank": [b for _, b in peaks], "malloc_mmap_threshold": mmap_threshold}
    if last_eval:
        figures["eval"] = {**last_eval, "task": str(args.eval_task), "split": args.eval_split}
    inputs = {"model": args.model, "train_data": list(args.train_data), "teacher": args.teacher,
              "deepspeed": str(resolve_path(args.deepspeed))}
    return formats.write_manifest(
        out, hooks.stage, inputs, dataclasses.asdict(args), figures,
        deepspeed_config=ds_cfg, world_size=world, n_groups=len(groups), global_batch=schedule.global_batch,
        steps_per_epoch=schedule.steps_per_epoch,
        params={"total": params_total, "trainable": params_trainable},
        scaled_settings=as_mapping(getattr(args, "scaled_settings", None), "scaled_settings"),
        export=str(export_dir) if export_dir else None, **hooks.manifest_extra)


def _scalars(writer, row: dict, step: int) -> None:
    for k, v in row.items():
        if v is None or k in ("step", "epoch") or k.startswith("eval_"):  # eval scalars: written by run_eval
            continue
        tag = "loss/" + k[5:] if k.startswith("loss_") else "loss/total" if k == "loss" else "train/" + k
        writer.add_scalar(tag, v, step)
    writer.flush()


def _read_log(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _write_log(path: Path, rows: list[dict]) -> None:
    formats.write_text(path, "".join(json.dumps(r) + "\n" for r in rows))


def _save(engine, ckdir: Path, step: int, world: int, args: TrainArgs, rank: int) -> None:
    import torch.distributed as dist

    engine.save_checkpoint(str(ckdir), tag=f"step{step}", client_state={"step": step, "world_size": world},
                           exclude_frozen_parameters=args.lora)
    dist.barrier()
    if rank == 0 and args.save_total_limit > 0:
        tags = sorted((p for p in ckdir.glob("step*") if p.is_dir()), key=lambda p: int(p.name[4:]))
        for old in tags[:-args.save_total_limit]:
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


def _export(engine, args: TrainArgs, hooks: Hooks, rank: int, device: str, out: Path, params_before: int):
    """Rebuild the model on rank 0, load the trained weights, merge LoRA, write a dsprune export."""
    from ..surgery.prune import export

    sd = gathered_state(engine, rank)
    if rank != 0:
        return None
    fresh = load_student(args, "cpu", hooks)
    missing = set(dict(fresh.named_parameters())) ^ set(sd)
    if missing:
        raise DsPruneError(f"export: parameter names differ from the trained model: {sorted(missing)[:5]}")
    with torch.no_grad():
        for name, p in fresh.named_parameters():
            p.copy_(sd[name])
    if args.lora:
        lora_mod.save_adapter(fresh, out / "adapter")
        lora_mod.merge(fresh)
    if hooks.before_export:
        hooks.before_export(fresh)
    if args.dtype != "float32":
        fresh.model.to(getattr(torch, args.dtype))
    target = out / "model"
    export(fresh, target, overwrite=True, stage=hooks.stage,
           inputs={"model": args.model, "train_data": list(args.train_data), "run": str(out)},
           config=dataclasses.asdict(args), params_before=params_before, **hooks.export_extra)
    return target
