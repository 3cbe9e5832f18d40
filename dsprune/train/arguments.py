"""Training arguments: one dataclass per concern, combined into ``TrainArgs`` and filled from YAML + CLI.

The sections (model, data, training, LoRA, loss) stay separate so that self-slimming and retraining can
reuse them and add their own; ``validate`` checks everything that can be checked before a process group
or a model exists, so a bad config fails in a second, not after DeepSpeed has started.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DsPruneError
from ..formats import json_object
from ..settings import REPO_ROOT
from . import checkpoints

DTYPES = ("float32", "bfloat16", "float16")
LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass
class ModelArgs:
    model: str = field(metadata={"help": "model to train: HF folder, sentence-transformers folder, dsprune "
                                         "export or .gguf file"})
    encoder: str | None = field(default=None, metadata={
        "help": "encoder config overrides as JSON or a YAML mapping (pooling, query_prompt, append_eos, ...); "
                "the model's own dsprune_encoder.json is the default"})
    teacher: str | None = field(default=None, metadata={
        "help": "teacher Encoder for on-the-fly KL distillation (e.g. the unpruned model); 'self' = the "
                "starting model itself"})
    dtype: str = field(default="float32", metadata={"help": "training precision: float32 | bfloat16 | float16"})
    device: str = field(default="auto", metadata={"help": "auto (DeepSpeed's accelerator), cpu, cuda"})
    backend: str = field(default="auto", metadata={"help": "process-group backend: auto, gloo, nccl, ccl"})


@dataclass
class DataArgs:
    train_data: list[str] = field(default_factory=list, metadata={
        "help": "training data: JSONL groups {query, pos[], neg[], pos_scores?, neg_scores?}, triplet JSONL "
                "{query, positive, negative}, or BEIR folders (train qrels, random negatives)"})
    beir_split: str = field(default="train", metadata={"help": "qrels split read from BEIR folders"})
    beir_random_negatives: int = field(default=32, metadata={
        "help": "random corpus negatives per query drawn for BEIR folders (mine hard ones with `dsprune mine`)"})
    group_size: int = field(default=8, metadata={"help": "passages per query: 1 positive + group_size-1 negatives"})
    max_examples: int = field(default=0, metadata={"help": "use at most this many groups (0 = all)"})
    query_max_length: int | None = field(default=None, metadata={"help": "override the encoder's query length"})
    passage_max_length: int | None = field(default=None, metadata={"help": "override the encoder's passage length"})


@dataclass
class TrainingArgs:
    output_dir: str = field(default="out/train", metadata={"help": "run folder: checkpoints, tensorboard, model"})
    overwrite: bool = field(default=False, metadata={"help": "replace an existing run folder"})
    resume: bool = field(default=False, metadata={"help": "continue the run in output_dir from its last checkpoint"})
    deepspeed: str = field(default="ds_configs/zero2.json", metadata={
        "help": "DeepSpeed config (relative paths also looked up in the dsprune checkout)"})
    deepspeed_overrides: str | None = field(default=None, metadata={
        "help": "JSON merged into the DeepSpeed config, e.g. '{\"zero_optimization\": {...}}'"})
    per_device_batch_size: int = field(default=8, metadata={"help": "queries per rank per micro-batch"})
    length_buckets: int = field(default=0, metadata={
        "help": "0 = off; N: sort each run of N global batches by padded token length and deal every step's "
                "groups to the ranks in turn, so ranks pad alike and wait less for each other (1 keeps each "
                "step's groups; larger N also saves padding)"})
    gradient_accumulation_steps: int = 1
    learning_rate: float = 1e-4
    weight_decay: float = 0.0
    warmup_steps: int = 0
    lr_scheduler: str = field(default="linear", metadata={"help": "linear (decay to 0) | constant"})
    max_grad_norm: float = 1.0
    gradient_checkpointing: bool = field(default=False, metadata={
        "help": "recompute layer activations in backward: far less memory for ~30% more compute"})
    grad_cache_chunk: int = field(default=0, metadata={
        "help": "gradient cache: embed the micro-batch N texts at a time, so in-batch losses over large batches "
                "need one chunk's activations (a second forward pass per chunk; 0 = off)"})
    max_steps: int = field(default=0, metadata={"help": "optimizer steps (0 = num_epochs over the data)"})
    num_epochs: float = 1.0
    seed: int = 42
    save_steps: int = field(default=100, metadata={"help": "checkpoint every N steps (0 = only at the end)"})
    save_total_limit: int = field(default=2, metadata={"help": "keep this many newest checkpoints"})
    logging_steps: int = 1
    step_breakdown: bool = field(default=False, metadata={
        "help": "log each rank's seconds per phase of every step (batch, forward, loss, backward, optimizer "
                "step), its tokens and the bytes and seconds of DeepSpeed's collectives (log.jsonl "
                "'breakdown'); each phase waits for the device"})
    eval_task: str | None = field(default=None, metadata={
        "help": "BEIR folder (or name under the shared data) scored periodically with nDCG@10"})
    eval_split: str = "test"
    eval_steps: int = field(default=0, metadata={"help": "evaluate every N steps (0 = only at the end)"})
    eval_max_queries: int = field(default=0, metadata={"help": "subsample eval queries (0 = all)"})
    eval_max_docs: int = field(default=0, metadata={"help": "subsample the eval corpus, judged docs kept (0 = all)"})
    eval_batch_size: int = 32
    eval_max_length: int = field(default=0, metadata={
        "help": "truncate eval queries and documents to this many tokens, as `dsprune eval --max_length` does "
                "(0 = the encoder's own lengths)"})
    scaled_settings: str | None = field(default=None, metadata={
        "help": "what was scaled down for this machine and why (JSON or a YAML mapping), kept in the manifest"})
    export: bool = field(default=True, metadata={"help": "write the trained model as a dsprune export to "
                                                         "output_dir/model"})


@dataclass
class LoraArgs:
    lora: bool = field(default=True, metadata={"help": "train LoRA adapters (merged at export); false = full"})
    lora_r: int = 32
    lora_alpha: int = 64
    lora_dropout: float = 0.0
    lora_targets: str = field(default=LORA_TARGETS, metadata={"help": "comma-separated module names"})
    freeze: str = field(default="", metadata={
        "help": "full-parameter training: comma-separated parameter-name parts kept frozen, e.g. embed_tokens "
                "(a 262k-token embedding table is most of a small embedder's optimizer state and gradient "
                "traffic, and pruning never touches it)"})


@dataclass
class LossArgs:
    temperature: float = field(default=0.02, metadata={"help": "InfoNCE temperature"})
    cross_rank_negatives: bool = field(default=True, metadata={
        "help": "gather passages across ranks (with gradients) as extra negatives"})
    infonce_weight: float = 1.0
    kl_weight: float = field(default=0.0, metadata={
        "help": "KL distillation weight; teacher scores from the data (pos_scores/neg_scores) or --teacher"})
    teacher_temperature: float = field(default=1.0, metadata={
        "help": "softmax temperature on teacher scores (model teachers give cos/temperature)"})


@dataclass
class TrainArgs(LossArgs, LoraArgs, TrainingArgs, DataArgs, ModelArgs):
    """All options of ``launchers/train.py`` (flat, so a YAML file and CLI flags fill the same names)."""


def as_mapping(value, what: str) -> dict:
    """A YAML mapping or a JSON string (from the command line) as a dict."""
    if value is None or value == "":
        return {}
    if isinstance(value, dict):
        return value
    return json_object(value, f"{what} ({value!r})")


def resolve_path(path: str) -> Path:
    """A config path as given, else relative to the dsprune checkout (ds_configs/ ships there)."""
    p = Path(path)
    if p.exists() or p.is_absolute():
        return p
    return REPO_ROOT / p


def validate(args: TrainArgs) -> None:
    """Every check that needs no model and no data: raises ``DsPruneError`` naming the option."""
    def need(cond: bool, msg: str) -> None:
        if not cond:
            raise DsPruneError(msg)

    need(bool(args.train_data) or bool(getattr(args, "distill_data", None)),
         "train_data: give at least one training file or BEIR folder")
    need(args.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}, not {args.dtype!r}")
    need(args.group_size >= 2, f"group_size must be at least 2 (a positive and a negative), not {args.group_size}")
    need(args.per_device_batch_size >= 1, "per_device_batch_size must be at least 1")
    need(args.gradient_accumulation_steps >= 1, "gradient_accumulation_steps must be at least 1")
    need(args.length_buckets >= 0, f"length_buckets must be >= 0 (0 = off), not {args.length_buckets}")
    need(args.grad_cache_chunk >= 0, f"grad_cache_chunk must be >= 0 (0 = off), not {args.grad_cache_chunk}")
    need(args.learning_rate > 0, f"learning_rate must be positive, not {args.learning_rate}")
    need(args.temperature > 0, f"temperature must be positive, not {args.temperature}")
    need(args.teacher_temperature > 0, f"teacher_temperature must be positive, not {args.teacher_temperature}")
    need(args.infonce_weight >= 0 and args.kl_weight >= 0, "loss weights must be non-negative")
    need(args.infonce_weight > 0 or args.kl_weight > 0 or bool(getattr(args, "distill_data", None)),
         "all loss weights are 0: nothing to train")  # distillation checks its own weights
    need(args.lr_scheduler in ("linear", "constant"), f"lr_scheduler must be linear or constant, "
                                                       f"not {args.lr_scheduler!r}")
    need(args.max_steps >= 0 and args.num_epochs > 0, "max_steps must be >= 0 and num_epochs > 0")
    need(args.save_steps >= 0 and args.eval_steps >= 0, "save_steps and eval_steps must be >= 0")
    need(args.eval_max_length == 0 or args.eval_max_length >= 2,
         f"eval_max_length must be 0 (the encoder's own lengths) or at least 2, not {args.eval_max_length}")
    need(not (args.resume and args.overwrite), "resume and overwrite exclude each other")
    if args.lora:
        need(args.lora_r >= 1, f"lora_r must be at least 1, not {args.lora_r}")
        need(bool([t for t in args.lora_targets.split(",") if t.strip()]), "lora_targets is empty")
        need(not args.freeze.strip(), "freeze applies to full-parameter training (lora: false); LoRA already "
                                      "freezes every base weight")
    ds = resolve_path(args.deepspeed)
    need(ds.is_file(), f"deepspeed config not found: {args.deepspeed}")
    as_mapping(args.deepspeed_overrides, "deepspeed_overrides")
    as_mapping(args.encoder, "encoder")
    out = Path(args.output_dir)
    if args.resume:
        need(checkpoints.resumable(out / "checkpoints"),
             f"--resume: no complete checkpoint in {out / 'checkpoints'} (a save cut short does not count; start "
             "without --resume, with --overwrite)")
    elif out.exists() and any(out.iterdir()) and not args.overwrite:
        raise DsPruneError(f"output folder exists: {out} (pass --resume to continue it or --overwrite)")
