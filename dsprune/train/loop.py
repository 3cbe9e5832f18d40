"""The DeepSpeed engine loop for contrastive training, reused by self-slimming and retraining.

Stages that build on it do not fork it; they pass ``Hooks``: ``prepare_model`` (e.g. insert neuron gates
before DeepSpeed wraps the model), ``param_groups`` (groups with their own learning rate), ``extra_loss``
(e.g. the gate sparsity penalty), ``after_step`` (e.g. re-apply a held mask) and ``before_export`` (e.g.
slice masked neurons). Device, dtype and process-group backend come from the arguments; the same code
runs on CPU ranks with gloo and on GPUs with nccl.

Stages that bring their own data and loss (self-distillation, ``train/distill.py``) also pass ``load_data``
(their examples instead of training groups), ``after_set_up`` (work that needs the process group but no
model, e.g. a teacher's embeddings) and ``micro_batch`` (inputs to embed and the loss on their embeddings).
With ``--grad_cache_chunk`` every stage's in-batch loss is backpropagated chunk by chunk (``gradcache``).

``train`` runs named phases, in an order chosen so that bad input never costs a DeepSpeed start-up:
``check_before_start`` (options, model paths, DeepSpeed config), ``load_data`` (every group read and
validated), ``set_up`` (process group, schedule, run folder), ``build_engine`` (models, optimizer, DeepSpeed,
resumed state), then ``train_step`` per optimizer step with ``evaluate`` and ``engine.save_checkpoint``
when due (``fit``), and last ``export_model`` and ``save_manifest``. The process itself (allocator, rendezvous
variables of a plain ``python`` start) is the entry point's to set up: see ``launchers/train.py``.
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from .. import formats
from ..distributed import check_shared_folder
from ..encoder import Encoder, config_overrides
from ..errors import DsPruneError
from ..losses import info_nce, kl_distill
from ..memory import peak_rss_bytes
from . import breakdown
from . import engine as ds
from . import gradcache
from . import lora as lora_mod
from .arguments import TrainArgs, as_mapping, resolve_path, validate
from .data import Collator, Schedule, load_groups, padded_tokens
from .runlog import RunLog

CKPT = "checkpoints"
ARGS_FILE = "train_args.json"
# options that may change between a run and its resumption (they do not change what is computed)
RESUMABLE = {"resume", "overwrite", "save_steps", "save_total_limit", "logging_steps", "eval_task", "eval_steps",
             "eval_split", "eval_max_queries", "eval_max_docs", "eval_batch_size", "export", "scaled_settings",
             "output_dir", "grad_cache_chunk", "step_breakdown"}


@dataclass
class Hooks:
    """Extension points for stages built on this loop (all optional)."""

    prepare_model: Callable[[Encoder], None] | None = None
    param_groups: Callable[[Encoder], list[dict]] | None = None
    extra_loss: Callable[[Encoder, int], "torch.Tensor | tuple[torch.Tensor, dict]"] | None = None
    after_step: Callable[[object, int, dict], None] | None = None
    before_export: Callable[[Encoder], None] | None = None
    load_data: Callable[[TrainArgs], list] | None = None
    after_set_up: Callable[["Run"], None] | None = None
    micro_batch: Callable[["Run", "Models", int, int], "MicroBatch"] | None = None
    stage: str = "train"
    manifest_extra: dict = field(default_factory=dict)
    export_extra: dict = field(default_factory=dict)     # entries of the exported model's manifest (e.g. its mask)


@dataclass
class Run:
    """What the phases after ``set_up`` share: the options, this rank's place, the data and its schedule."""

    args: TrainArgs
    hooks: Hooks
    rank: int
    world: int
    device: str
    groups: list            # training groups, or a stage's own examples (``Hooks.load_data``)
    schedule: Schedule
    max_steps: int
    out: Path

    @property
    def ckdir(self) -> Path:
        return self.out / CKPT


@dataclass
class Models:
    """What ``build_engine`` makes: the engine and the Encoder it trains, the teacher, and set-up figures."""

    engine: object
    model: Encoder
    teacher: Encoder | None
    collator: Collator
    ds_cfg: dict
    params_total: int
    params_trainable: int
    start: int              # the step a resumed run continues from (0 for a new run)
    setup_peak: int         # peak RSS after loading (a GGUF is dequantised) and the engine, before any step


# ---- options ------------------------------------------------------------------------------------------------
def encoder_overrides(args: TrainArgs) -> dict:
    return config_overrides(as_mapping(args.encoder, "encoder"))


def check_before_start(args: TrainArgs) -> None:
    """Everything that can fail on input, before a process group exists."""
    validate(args)
    encoder_overrides(args)
    from ..packaged import model_path
    if not Path(model_path(args.model)).exists():          # `smollm2` works here as anywhere a path does
        raise DsPruneError(f"model not found: {args.model}")
    if args.teacher and args.teacher != "self" and not Path(model_path(args.teacher)).exists():
        raise DsPruneError(f"teacher not found: {args.teacher}")
    ds.deepspeed_config(args, 1, 64)  # its "auto" entries and forbidden blocks, checked now
    out = Path(args.output_dir)
    if args.resume and (out / ARGS_FILE).is_file():
        before = formats.read_json(out / ARGS_FILE, "training arguments")
        now = dataclasses.asdict(args)
        diff = sorted(k for k in now if k not in RESUMABLE and before.get(k) != now[k])
        if diff:
            raise DsPruneError(f"--resume with changed option(s) {', '.join(diff)}: a resumed run must repeat "
                               f"the original's settings (see {out / ARGS_FILE})")


# ---- data and set-up -----------------------------------------------------------------------------------------
def load_data(args: TrainArgs, hooks: Hooks | None = None) -> list:
    """Every training group, validated (with teacher scores where KL has no teacher model)."""
    if hooks is not None and hooks.load_data:
        return hooks.load_data(args)
    need_scores = args.kl_weight > 0 and not args.teacher
    return load_groups(args.train_data, args.beir_split, args.beir_random_negatives, args.seed,
                       args.max_examples, need_scores)


def set_up(args: TrainArgs, hooks: Hooks, groups: list) -> Run:
    """Join the process group, fix the schedule, and make the run folder (rank 0) with its arguments."""
    rank, world, device = ds.start_process_group(args)
    schedule = Schedule(len(groups), args.per_device_batch_size, world, args.gradient_accumulation_steps,
                        args.seed)
    max_steps = args.max_steps or max(1, int(args.num_epochs * schedule.steps_per_epoch))
    out = Path(args.output_dir)
    if rank == 0:
        if out.exists() and args.overwrite:
            shutil.rmtree(out)
        out.mkdir(parents=True, exist_ok=True)
    check_shared_folder(out, rank)  # across nodes, checkpoints need one folder every rank sees
    if rank == 0:
        formats.write_json(out / ARGS_FILE, dataclasses.asdict(args))
    dist.barrier()
    return Run(args, hooks, rank, world, device, groups, schedule, max_steps, out)


# ---- models and engine -----------------------------------------------------------------------------------
def load_student(args: TrainArgs, device: str, hooks: Hooks, attach_lora: bool = True) -> Encoder:
    """The model to train, exactly as every rank (and the export) builds it."""
    enc = Encoder.load(args.model, dtype="float32", device=device)  # DeepSpeed casts for bf16/fp16
    enc.configure(**encoder_overrides(args))
    if hooks.prepare_model:
        hooks.prepare_model(enc)
    if args.lora and attach_lora:
        torch.manual_seed(args.seed)  # identical adapter init on every rank
        lora_mod.attach(enc, args.lora_r, args.lora_alpha, args.lora_dropout, args.lora_targets)
    elif not args.lora:
        for p in enc.parameters():
            p.requires_grad_(True)
        freeze(enc, args.freeze)
    return enc


def freeze(enc: Encoder, parts: str) -> None:
    """Keep the parameters whose names contain one of ``parts`` (comma-separated) out of training."""
    for part in (t.strip() for t in parts.split(",") if t.strip()):
        hit = [p for n, p in enc.named_parameters() if part in n]
        if not hit:
            raise DsPruneError(f"freeze: no parameter name contains {part!r} "
                               f"(e.g. {next(n for n, _ in enc.named_parameters())})")
        for p in hit:
            p.requires_grad_(False)


def build_engine(run: Run) -> Models:
    """Student (and teacher), optimizer and DeepSpeed engine; with ``--resume``, the checkpoint's state."""
    args, hooks = run.args, run.hooks
    enc = load_student(args, run.device, hooks)
    if args.gradient_checkpointing:
        enc.backbone.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    teacher = None
    if args.kl_weight > 0 and args.teacher:
        teacher = (load_student(args, run.device, hooks, attach_lora=False) if args.teacher == "self"
                   else Encoder.load(args.teacher, dtype=args.dtype, device=run.device))
        teacher.eval().requires_grad_(False)
    params_total = sum(p.numel() for n, p in enc.named_parameters() if "lora_" not in n)
    params_trainable = sum(p.numel() for p in enc.parameters() if p.requires_grad)
    groups = hooks.param_groups(enc) if hooks.param_groups else []
    engine, ds_cfg = ds.wrap(enc, args, groups, run.world, enc.embedding_dim, run.max_steps)
    model: Encoder = engine.module
    collator = Collator(model, args.query_max_length, args.passage_max_length)
    if args.length_buckets:
        def length(epoch: int, i: int) -> int:
            return padded_tokens(run.schedule.example(run.groups, args.group_size, epoch, i), collator.token_counts)
        run.schedule.bucket_by_length(args.length_buckets, length)
    setup_peak = peak_rss_bytes()
    start = ds.load_checkpoint(engine, run.ckdir, run.world, args) if args.resume else 0
    return Models(engine, model, teacher, collator, ds_cfg, params_total, params_trainable, start, setup_peak)


# ---- one step ---------------------------------------------------------------------------------------------
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


@dataclass
class MicroBatch:
    """What one micro-batch asks of the model: inputs to embed, in order (None where a micro-batch has none of
    a kind), the loss on their embeddings (the loss and its parts), and its token count."""

    inputs: list
    loss: Callable[[list], tuple[torch.Tensor, dict]]
    tokens: int


def contrastive_batch(run: Run, m: Models, step: int, micro: int) -> MicroBatch:
    """Queries and their groups of passages, with InfoNCE (+ KL) on their embeddings."""
    args = run.args
    batch = m.collator(run.schedule.examples(run.groups, args.group_size, step, micro, run.rank))
    ts = teacher_scores(m.teacher, batch, args) if m.teacher is not None else batch["teacher_scores"]
    qb, pb = batch["query"], batch["passage"]
    return MicroBatch([qb, pb], lambda e: contrastive_loss(e[0], e[1], ts, args),
                      int(qb["attention_mask"].sum() + pb["attention_mask"].sum()))


def micro_step(run: Run, m: Models, step: int, micro: int, clock: breakdown.Clock) -> tuple[dict, int, int]:
    """Forward and backward of one micro-batch: the loss's parts (``total`` the loss), its tokens and its
    padded tokens (what the model computes on). ``clock`` times the phases."""
    args, engine, device, hooks = run.args, m.engine, run.device, run.hooks
    with clock.phase("batch"):
        mb = (hooks.micro_batch or contrastive_batch)(run, m, step, micro)
    # dropout (if any) depends only on (seed, step, micro, rank): resumed runs repeat it
    seed = args.seed * 1_000_003 + step * 1009 + micro * 31 + run.rank
    logs: dict = {}

    def extra() -> torch.Tensor:
        out = hooks.extra_loss(m.model, step)
        out, extra_logs = out if isinstance(out, tuple) else (out, {})
        logs["extra"] = out
        logs.update({k: torch.as_tensor(v) for k, v in extra_logs.items()})
        return out

    if args.grad_cache_chunk:
        with clock.phase("forward_backward"):
            loss, parts = gradcache.step(engine, mb.inputs, mb.loss, args.grad_cache_chunk, device, seed,
                                         extra if hooks.extra_loss else None)
    else:
        torch.manual_seed(seed)
        with clock.phase("forward"):
            embs = [None if x is None else engine(x["input_ids"].to(device), x["attention_mask"].to(device))
                    for x in mb.inputs]
        with clock.phase("loss"):
            loss, parts = mb.loss(embs)
            if hooks.extra_loss:
                loss = loss + extra()
        with clock.phase("backward"):
            engine.backward(loss)
    with clock.phase("step"):
        engine.step()
    parts.update(logs)
    parts["total"] = loss
    return parts, mb.tokens, sum(int(x["input_ids"].numel()) for x in mb.inputs if x is not None)


def train_step(run: Run, m: Models, step: int) -> tuple[dict, float]:
    """One optimizer step (0-based ``step``) over its micro-batches. Returns the log row, its figures
    averaged over ranks (losses differ per rank without cross-rank negatives), and the step's tokens. With
    ``--step_breakdown`` the row also holds each rank's phases, tokens and collectives (``breakdown``)."""
    args, engine = run.args, m.engine
    clock = breakdown.Clock(args.step_breakdown)
    t0 = time.time()
    lrs = [(g.get("name"), g["lr"]) for g in engine.optimizer.param_groups]  # the lr this step uses
    sums: dict[str, float] = {}
    tokens = padded = 0
    for micro in range(args.gradient_accumulation_steps):
        parts, n, n_padded = micro_step(run, m, step, micro, clock)
        for k, v in parts.items():
            sums[k] = sums.get(k, 0.0) + float(v.detach()) / args.gradient_accumulation_steps
        tokens += n
        padded += n_padded
    ranks = None
    if clock.on:   # this rank's own time, before the all-reduce below waits for the others
        mine = {"seconds": round(time.time() - t0, 4), "tokens": tokens, "padded_tokens": padded, **clock.read()}
        ranks = [None] * run.world
        dist.all_gather_object(ranks, mine)
    keys = sorted(sums)
    vec = torch.tensor([sums[k] for k in keys] + [float(tokens)], dtype=torch.float64)
    dist.all_reduce(vec)
    logs = {k: vec[i].item() / run.world for i, k in enumerate(keys)}
    tokens_all = vec[-1].item()
    dt = time.time() - t0
    gn = engine.get_global_grad_norm()
    row = {"step": step + 1, "loss": logs.pop("total"), **{f"loss_{k}": v for k, v in logs.items()},
           "lr": lrs[0][1],
           "grad_norm": float(gn) if gn is not None else None,
           "queries_per_s": run.schedule.global_batch / dt, "tokens_per_s": tokens_all / dt,
           "epoch": run.schedule.epoch_of(step)}
    if ranks:
        row["breakdown"] = ranks
    for name, lr in lrs[1:]:
        if name:
            row[f"lr_{name}"] = lr
    return row, tokens_all


# ---- evaluation -------------------------------------------------------------------------------------------
def eval_set(args: TrainArgs):
    """The in-training evaluation data (``--eval_task``), or None."""
    if not args.eval_task:
        return None
    from .data import resolve_source
    from .evaluate import EvalSet
    return EvalSet(resolve_source(args.eval_task), args.eval_split, args.eval_max_queries, args.eval_max_docs,
                   args.seed)


def evaluate(run: Run, m: Models, data, log: RunLog, step: int) -> dict:
    """nDCG@10 of the model being trained (all ranks together), logged at ``step``."""
    from .evaluate import evaluate as score
    res = score(m.model, data, run.args.eval_batch_size, run.args.eval_max_length or None)
    log.add_eval(res, step)
    return {**res, "step": step}


# ---- the loop ---------------------------------------------------------------------------------------------
def fit(run: Run, m: Models, log: RunLog) -> dict:
    """Steps from ``m.start`` to ``max_steps``, each logged, evaluated and checkpointed when due. Returns
    the loop's own figures and the last evaluation."""
    args, hooks = run.args, run.hooks
    data = eval_set(args)
    last_eval: dict = {}
    if data is not None and m.start == 0:
        last_eval = evaluate(run, m, data, log, 0)

    from tqdm.auto import tqdm
    bar = tqdm(total=run.max_steps, initial=m.start, desc=hooks.stage, disable=run.rank != 0, dynamic_ncols=True)
    m.engine.train()
    if args.step_breakdown:
        breakdown.start()
    t_loop, steps_done, tokens_done = time.time(), 0, 0.0
    for step in range(m.start, run.max_steps):
        row, tokens = train_step(run, m, step)
        steps_done += 1
        tokens_done += tokens
        done = step + 1
        if hooks.after_step:
            hooks.after_step(m.engine, done, row)
        if data is not None and ((args.eval_steps and done % args.eval_steps == 0) or done == run.max_steps):
            last_eval = evaluate(run, m, data, log, done)
            row["eval_ndcg_at_10"] = last_eval["ndcg_at_10"]
        if run.rank == 0:
            log.add_row(row, done % max(1, args.logging_steps) == 0 or done == run.max_steps)
            bar.set_postfix(loss=f"{row['loss']:.4f}", lr=f"{row['lr']:.2e}")
            bar.update(1)
        if (args.save_steps and done % args.save_steps == 0) or done == run.max_steps:
            ds.save_checkpoint(m.engine, run.ckdir, done, run.world, args, run.rank)
    bar.close()
    return {"seconds": time.time() - t_loop, "steps": steps_done, "tokens": tokens_done, "eval": last_eval}


def train(args: TrainArgs, hooks: Hooks | None = None, malloc_mmap_threshold: int = 0) -> dict | None:
    """Train, checkpoint, export. Returns the run manifest on rank 0 (None elsewhere).
    ``malloc_mmap_threshold`` is the allocator threshold the entry point holds (``dsprune.memory``), which
    the manifest records."""
    hooks = hooks or Hooks()
    check_before_start(args)
    if args.length_buckets and hooks.micro_batch:
        raise DsPruneError(f"length_buckets: --mode {hooks.stage} brings its own items; buckets sort "
                           "training groups")
    groups = load_data(args, hooks)
    t_start = time.time()
    run = set_up(args, hooks, groups)
    if hooks.after_set_up:
        hooks.after_set_up(run)
    m = build_engine(run)
    log = RunLog(run.out, m.start, run.rank == 0)
    loop = fit(run, m, log)
    train_peak = peak_rss_bytes()  # before the export, which rebuilds the model on rank 0
    export_dir = export_model(run, m) if args.export else None
    peaks = [None] * run.world
    dist.all_gather_object(peaks, (round(m.setup_peak / 2**30, 2), round(train_peak / 2**30, 2)))
    if run.rank != 0:
        return None
    log.close()
    seconds = loop["seconds"]
    figures = {"steps": run.max_steps, "steps_this_run": loop["steps"], "resumed_from": m.start,
               "train_seconds": round(seconds, 1), "total_seconds": round(time.time() - t_start, 1),
               "queries_per_s": round(loop["steps"] * run.schedule.global_batch / max(seconds, 1e-9), 3),
               "tokens_per_s": round(loop["tokens"] / max(seconds, 1e-9), 1),
               "first_loss": log.rows[0]["loss"] if log.rows else None,
               "final_loss": log.rows[-1]["loss"] if log.rows else None,
               "setup_peak_rss_gb_per_rank": [a for a, _ in peaks],
               "peak_rss_gb_per_rank": [b for _, b in peaks], "malloc_mmap_threshold": malloc_mmap_threshold}
    if loop["eval"]:
        figures["eval"] = {**loop["eval"], "task": str(args.eval_task), "split": args.eval_split}
    return save_manifest(run, m, figures, export_dir)


# ---- save ---------------------------------------------------------------------------------------------------
def export_model(run: Run, m: Models) -> Path | None:
    """Rebuild the model on rank 0, load the trained weights, merge LoRA, write a dsprune export."""
    from ..surgery.prune import export

    args, hooks, out = run.args, run.hooks, run.out
    sd = ds.gathered_state(m.engine, run.rank)
    if run.rank != 0:
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
           config=dataclasses.asdict(args), params_before=m.params_total, **hooks.export_extra)
    return target


def save_manifest(run: Run, m: Models, figures: dict, export_dir: Path | None) -> dict:
    """The run folder's manifest.json (rank 0)."""
    args = run.args
    inputs = {"model": args.model, "train_data": list(args.train_data), "teacher": args.teacher,
              "deepspeed": str(resolve_path(args.deepspeed))}
    return formats.write_manifest(
        run.out, run.hooks.stage, inputs, dataclasses.asdict(args), figures,
        deepspeed_config=m.ds_cfg, world_size=run.world, n_groups=len(run.groups),
        global_batch=run.schedule.global_batch, steps_per_epoch=run.schedule.steps_per_epoch,
        params={"total": m.params_total, "trainable": m.params_trainable},
        scaled_settings=as_mapping(getattr(args, "scaled_settings", None), "scaled_settings"),
        export=str(export_dir) if export_dir else None, **run.hooks.manifest_extra)
