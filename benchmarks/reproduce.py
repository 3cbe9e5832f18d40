"""Reproduce EffiR's and GAPrune's findings at small scale: the grid of issue 8, row by row, on 2 CPU cores.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/reproduce.py > out/reproduce.log 2>&1 &
    .venv/bin/python benchmarks/reproduce.py --list                  # rows, their stages, estimated time
    .venv/bin/python benchmarks/reproduce.py --rows t1-15m effir     # some rows, or whole tables: --rows effir-t2
    .venv/bin/python benchmarks/reproduce.py --render                # only re-render benchmarks/RESULTS.md

Each row is a recipe (``dsprune.recipe.run_recipe``) written to ``OUT/rows/ROW.yaml``: every stage a real
``dsprune`` command or DeepSpeed launcher, its folder ``OUT/STAGE`` reused while its inputs are unchanged, so an
interrupted row resumes stage by stage. Rows share stages by name (one ``dense-score`` for all of Table 1, one
``base-drop15m`` for Table 2's 15M row and EffiR). Inputs the grid does not make itself (the dense retriever,
its training groups) enter through content-addressed links ``OUT/inputs/NAME-<hash>``, so a retrained dense
model never reuses stale stages.

When a row finishes, ``benchmarks/results/ROW.json`` holds its scores (per task nDCG@10, recall@100 and the
per-query nDCG@10 that paired bootstrap intervals need), parameters, speed-ups, the commands run, wall time,
code version and scaled settings. A row whose JSON carries the same config fingerprint is skipped, so the
grid resumes across sessions even without ``OUT``. Every invocation ends by rendering ``benchmarks/RESULTS.md``
(one table per paper table, CIs against the table's reference row, pending rows marked) and, when speed-ups
exist, ``benchmarks/results/quality_vs_speed.png``.

The dense retriever (``--dense``, default out/train_dense/run/model) is made by ``benchmarks/train_dense.py``
when missing; Table 2 and EffiR rows train with exactly its options (``train.yaml`` beside it): same data,
same steps. SmolLM2 has 30 blocks: the papers' counts for Mistral-7B's 32 are scaled by 30/32 (16 -> 15,
20 -> 19). SmolLM2 here is the Instruct model, Q4_1 GGUF dequantised to fp32, standing in for a base model.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import REPO, copy_file, sh  # noqa: E402

sys.path.insert(0, str(REPO))

from dsprune import formats  # noqa: E402
from dsprune.config import load_config_file  # noqa: E402
from dsprune.errors import DsPruneError  # noqa: E402
from dsprune.packaged import PACKAGED  # noqa: E402
from dsprune.recipe import _argv as recipe_argv  # noqa: E402
from dsprune.recipe import run_recipe  # noqa: E402

GRID_VERSION = 1          # bump to invalidate every row's results when the grid's meaning changes
DEFAULT_DENSE = str(REPO / "out" / "train_dense" / "run" / "model")
DOMAIN_TASK = "financebench"      # GAPrune's domain side
DEFAULT_TASKS = ["scifact_small", DOMAIN_TASK]
EFFIR_PAIRS = [("effir", "t2-19m"), ("effir-4m", "t2-8m")]   # (drop + slim, deeper drop) of about equal size
# what to drop, (row, rival, question): EffiR finds MLPs the most redundant sub-layers, so dropping MLPs beats
# dropping blocks even with fewer parameters left (its Drop-16M vs Drop-8B); and its importance scores should
# choose blocks at least as well as cutting the last ones
DROP_PAIRS = [("t1-15m", "t1-8b", "MLPs vs blocks, no recovery training"),
              ("t2-8m", "t2-8b", "MLPs vs blocks, then the dense budget"),
              ("t2-15b", "t2-last15b", "blocks by importance vs the last blocks, then the dense budget")]
HEADLINE_TASK = "scifact"
DROP_ORDER = "drop_order.png"           # the heat map dsprune score writes beside scores.json
SCORED = {"base-score": "SmolLM2 as shipped: these scores pick Table 2's drops",
          "dense-score": "the dense retriever: these scores pick Table 1's drops"}
MODEL_NOTE = ("SmolLM2-135M here is SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF dequantised to fp32: it stands in "
              "for a base model (no base SmolLM2 is available on these machines).")
SCALED = {
    "model": "SmolLM2-135M-Instruct Q4_1 dequantised (stand-in for a base LM), 30 blocks, 134.5M parameters",
    "layer counts": "the papers' Mistral-7B counts x 30/32: 16 -> 15, 20 -> 19; 4 and 8 kept",
    "calibration": "256 MS MARCO + SciFact texts <= 128 tokens (EffiR: C4)",
    "training": "benchmarks/train_dense.py's budget for the dense row and every Table 2 / EffiR row: LoRA r=32, "
                "1 positive + 3 negatives, passages <= 128 tokens, 512 groups (SciFact mined + MS MARCO), one "
                "epoch on 2 CPU ranks (EffiR: MS MARCO, 1 + 7, BGE-reranker teacher)",
    "slimming": "gates only, 40 steps x 4 queries, gate lr 0.05, mean-normalised penalty (EffiR: 500 "
                "full-parameter steps), then the training budget above with the mask held (30% of the neurons after "
                "15M, 15% after 4M; global ranking; each MLP keeps at least its 32 strongest neurons)",
    "gaprune": "120 general triplets (k-means over SciFact train + MS MARCO) and FinanceBench train (75 "
               "questions) for DAI (GAPrune: 5,000 each); retraining 40 steps x 4 queries on FinanceBench train "
               "(GAPrune: 100 steps)",
    "evaluation": "scifact_small (300 queries, 1,000 docs) and FinanceBench test (75 questions), max length 128 "
                  "(EffiR: BEIR-13; GAPrune: FinMTEB); headline rows optionally on full SciFact",
    "bench": "64 SciFact documents x 128 tokens, 128 queries, 2 threads, one run (+-0.1 between runs)",
}
ROUGH_MINUTES = {"score": 4, "drop": 1, "eval": 7, "eval-scifact": 25, "train": 35, "slim": 12, "mask": 1,
                 "export": 1, "bench": 4, "sample": 3, "dai": 20, "prune": 1, "gap-train": 10}


# ---- stages ------------------------------------------------------------------------------------------

def command(name: str, cmd: str, **args) -> dict:
    return {"name": name, "command": cmd, "args": args}


def launcher(name: str, which: str, args: dict, num_gpus: int = 2) -> dict:
    return {"name": name, "launcher": which, "num_gpus": num_gpus, "args": args}


def ref(stage: str, sub: str = "") -> str:
    return "${" + stage + "}" + sub


class Ctx:
    """The inputs stages read. ``symbolic``: placeholders (for the config fingerprint and ``--list``);
    otherwise real paths, with the dense model made on first use and outside inputs linked by content."""

    def __init__(self, a: argparse.Namespace, symbolic: bool):
        self.a, self.symbolic = a, symbolic
        self.out = Path(a.out).resolve()
        self.tasks, self.max_length, self.headline = list(a.tasks), a.max_length, a.headline_scifact
        self.inputs: dict[str, dict] = {}
        self._dense: str | None = None
        self._train: dict | None = None

    @property
    def model(self) -> str:
        if is_packaged(self.a.model):
            return self.a.model
        return "<model>" if self.symbolic else self._link(Path(self.a.model), "model")

    @property
    def dense(self) -> str:
        if self.symbolic:
            return "<dense>"
        if self._dense is None:
            ensure_dense(self.a)
            self._dense = self._link(Path(self.a.dense), "dense")
        return self._dense

    @property
    def train(self) -> dict:
        """The launcher options the dense row was trained with (its train.yaml), training data linked."""
        if self.symbolic:
            return {"config": "<train>"}
        if self._train is None:
            path = train_config_path(self.a)
            if not path.is_file() and default_dense(self.a):
                ensure_dense(self.a)
            if not path.is_file():
                raise DsPruneError(f"training options not found: {path} (benchmarks/train_dense.py writes it "
                                   "beside the dense run; pass --train-config FILE)")
            opts = {k: v for k, v in load_config_file(path).items()
                    if k not in ("model", "output_dir", "overwrite", "resume")}
            if not opts.get("train_data"):
                raise DsPruneError(f"{path}: no train_data")
            data = opts["train_data"] if isinstance(opts["train_data"], list) else [opts["train_data"]]
            opts["train_data"] = [self._link(Path(p), Path(p).stem) if Path(p).is_file() else p for p in data]
            self._train = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in opts.items()}
        return dict(self._train)

    def _link(self, src: Path, stem: str) -> str:
        """``${out}/inputs/STEM-<content hash>``: a symlink to ``src`` whose name changes with its content."""
        if not src.exists():
            raise DsPruneError(f"{stem} not found: {src}")
        fp = content_id(src)
        name = f"{stem}-{fp[:12]}{src.suffix if src.is_file() else ''}"
        link = self.out / "inputs" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() != src.resolve():
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(src.resolve())
        self.inputs[stem] = {"path": str(src.resolve()), "fingerprint": fp}
        return "${out}/inputs/" + name

    def identities(self, placeholders: set[str]) -> dict:
        """What the symbolic placeholders stand for, in the config fingerprint: the producing script for
        the grid's own products, the content for a model the user passed."""
        ids = {}
        if "<model>" in placeholders:
            ids["model"] = content_id(Path(self.a.model))
        if "<dense>" in placeholders:
            ids["dense"] = "benchmarks/train_dense.py" if default_dense(self.a) else content_id(Path(self.a.dense))
        if "<train>" in placeholders:
            ids["train"] = ("benchmarks/train_dense.py" if self.a.train_config is None and default_dense(self.a)
                            else content_id(train_config_path(self.a)))
        return ids


def default_dense(a) -> bool:
    return Path(a.dense).resolve() == Path(DEFAULT_DENSE).resolve()


def is_packaged(model: str) -> bool:
    return model in PACKAGED and not Path(model).exists()


def content_id(path: Path) -> str:
    if not path.exists():
        raise DsPruneError(f"not found: {path}")
    if path.is_dir():
        from dsprune.eval.mteb_model import fingerprint
        return fingerprint(path)
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def train_config_path(a) -> Path:
    return Path(a.train_config) if a.train_config else Path(a.dense).parent.parent / "train.yaml"


def ensure_dense(a) -> None:
    """Make the dense retriever with benchmarks/train_dense.py when it is missing (resuming its training)."""
    dense = Path(a.dense)
    if (dense / "config.json").is_file():
        return
    if dense.name != "model" or dense.parent.name != "run":
        raise DsPruneError(f"dense model not found: {dense} (benchmarks/train_dense.py makes one at "
                           f"{DEFAULT_DENSE}; pass --dense FOLDER)")
    root = dense.parent.parent
    cmd = [sys.executable, str(REPO / "benchmarks" / "train_dense.py"), "--out", str(root), "--skip-eval"]
    if (root / "run" / "checkpoints" / "latest").is_file():
        cmd.append("--resume")
    print(f"dense retriever missing: training it with benchmarks/train_dense.py (~45 min) -> {dense}", flush=True)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    sh(cmd, root / "logs" / "train_dense.log", dict(os.environ))
    if not (dense / "config.json").is_file():
        raise DsPruneError(f"benchmarks/train_dense.py finished but wrote no model at {dense}")


def score(name: str, model: str) -> dict:
    return command(name, "score", model=model, n_samples=256, calib_max_length=128)


def drop(name: str, model: str, scores: str | None, **counts) -> dict:
    args = {"model": model, **({"scores": ref(scores)} if scores else {}), **counts}
    return command(name, "drop", **args)


def evaluate(name: str, model: str, tasks: list[str], ctx: Ctx) -> dict:
    return command(name, "eval", model=model, task=list(tasks), split="test", max_length=ctx.max_length,
                   threads=2, quiet=True)


def bench(name: str, model: str, baseline: str) -> dict:
    return command(name, "bench", model=model, baseline=baseline, docs=64, queries=128, doc_len=128, threads=2)


def train(name: str, model: str, ctx: Ctx, **over) -> dict:
    return launcher(name, "train", {"model": model, **ctx.train, **over, "overwrite": True})


GAP_RETRAIN = {"train_data": ["${shared}/data/financebench"], "group_size": 4, "per_device_batch_size": 2,
               "passage_max_length": 128, "query_max_length": 64, "lora": True, "lora_r": 32, "lora_alpha": 64,
               "learning_rate": 0.0002, "max_steps": 40, "save_steps": 20, "seed": 42,
               "gradient_checkpointing": True, "deepspeed": "ds_configs/zero2.json",
               "scaled_settings": json.dumps({"retraining": "40 steps x 4 queries on FinanceBench train, LoRA "
                                                            "(GAPrune: 100 steps, domain data, InfoNCE)"})}
GAP_METHODS = {"dai": "dai", "magnitude": "magnitude", "fisher": "fisher_dom", "random": "random"}
GAP_LABELS = {"dai": "GAPrune (DAI)", "magnitude": "Magnitude", "fisher": "Domain Fisher", "random": "Random",
              "daibal": "DAI, Fisher balanced"}
# Beyond the paper: with Eq. 5 as written the Fisher term is ~1e-6 of gamma*sqrt|theta| on SmolLM2 (the dai
# manifest's mean_abs_fisher_term_over_magnitude_term), so DAI ranks like magnitude. "daibal" recomputes DAI from
# the same saved statistics with F rescaled until both terms have equal mean size (dsprune dai --fisher_scale).
GAP_VARIANTS = {"daibal": ("dai", {"dai_recompute": True, "dai_fisher_scale": "balanced"})}


def gap_source(ctx: Ctx, source: str) -> tuple[str, str, list[dict]]:
    """The model GAPrune prunes: the dense retriever, or ("ft") that retriever after the control's retraining on
    FinanceBench train, so the domain side has something domain-specific to keep. Returns (stage prefix, model,
    the stages that make it)."""
    if source == "dense":
        return "dense-gap", ctx.dense, []
    return "ft-gap", ref("gap-dense-retrain-train", "/model"), [gap_retrain_stage("gap-dense-retrain", ctx, None)]


def gap_prune(ctx: Ctx, method: str, pct: int, structured: bool = False, source: str = "dense") -> list[dict]:
    """The shared GAPrune stages up to the mask: sampling and DAI only for the methods that read them."""
    prefix, model, stages = gap_source(ctx, source)
    name = f"{prefix}-prune-{method}-{'neurons-' if structured else ''}{pct}"
    base, extra = GAP_VARIANTS.get(method, (method, {}))
    args = {"model": model, "method": GAP_METHODS[base], "sparsity": pct / 100, "seed": 0, **extra}
    if base in ("dai", "fisher"):
        stages = stages + [
            command(f"{prefix}-sample", "sample", model=model,
                    input=["${shared}/data/scifact:train", "${shared}/data/msmarco_trecdl_subset/triplets.jsonl"],
                    k=120, max_length=64, seed=0),
            launcher(f"{prefix}-dai", "dai", {"model": model, "general": [ref(f"{prefix}-sample", "/triplets.jsonl")],
                                              "domain": ["${shared}/data/financebench:train"],
                                              "deepspeed": "${repo}/ds_configs/dai_zero3.json",
                                              "max_length": 128, "seed": 0})]
        args["scores"] = ref(f"{prefix}-dai")
    if structured:
        args["structured"] = True
    return stages + [command(name, "prune", **args)]


class GapSetting(NamedTuple):
    """Where GAPrune's claim is checked: masks of one sparsity on one model, against that setting's unpruned
    reference (for retraining: the control with the same retraining)."""
    what: str
    title: str                       # its label in the methods figure
    row_of: Callable[[str], str]     # method -> row
    reference: str


GAP_CLAIM_SETS = [GapSetting("one-shot 30%", "one-shot 30%", lambda m: f"gap-{m}-30", "dense"),
                  GapSetting("one-shot 50%", "one-shot 50%", lambda m: f"gap-{m}-50", "dense"),
                  GapSetting("one-shot 50% of the finance-aware retriever", "one-shot 50%,\nfinance-aware",
                             lambda m: f"gapft-{m}-50", "gap-dense-retrain"),
                  GapSetting("50% + retrain", "50% + retrain", lambda m: f"gap-{m}-50-retrain", "gap-dense-retrain")]


# ---- rows ----------------------------------------------------------------------------------------------

@dataclass
class Row:
    name: str
    label: str
    what: str
    core: Callable[[Ctx], tuple[list[dict], str]]   # stages up to the model to score, and that model
    bench: str | None = None                         # bench baseline: "model" (full SmolLM2) | "dense"
    headline: bool = False                           # also full SciFact with --headline-scifact
    trained_last: bool = True                        # False: its training came before a one-shot prune

    def stages(self, ctx: Ctx) -> list[dict]:
        stages, target = self.core(ctx)
        stages = stages + [evaluate(f"{self.name}-eval", target, ctx.tasks, ctx)]
        if self.headline and ctx.headline:
            stages.append(evaluate(f"{self.name}-eval-scifact", target, [HEADLINE_TASK], ctx))
        if self.bench:
            stages.append(bench(f"{self.name}-bench", target, ctx.model if self.bench == "model" else ctx.dense))
        return stages


DROPS = {"4a": {"drop_attn": 4}, "8a": {"drop_attn": 8}, "15a": {"drop_attn": 15}, "4b": {"drop_blocks": 4},
         "8b": {"drop_blocks": 8}, "15b": {"drop_blocks": 15}, "last15b": {"drop_last": 15},
         "4m": {"drop_mlp": 4}, "8m": {"drop_mlp": 8}, "15m": {"drop_mlp": 15}, "19m": {"drop_mlp": 19},
         "15m8a": {"drop_mlp": 15, "drop_attn": 8}}


def drop_label(tag: str) -> str:
    return "Drop-" + tag.upper().replace("LAST", "Last")


def drop_what(tag: str) -> str:
    parts = {"drop_attn": "{} attention", "drop_blocks": "{} blocks", "drop_mlp": "{} MLPs",
             "drop_last": "the last {} blocks"}
    return " + ".join(parts[k].format(n) for k, n in DROPS[tag].items())


def t1_core(tag: str):
    def core(ctx: Ctx):
        return [score("dense-score", ctx.dense), drop(f"dense-drop{tag}", ctx.dense, "dense-score", **DROPS[tag])], \
            ref(f"dense-drop{tag}")
    return core


def base_drop(ctx: Ctx, tag: str) -> list[dict]:
    if set(DROPS[tag]) == {"drop_last"}:            # needs no scores
        return [drop(f"base-drop{tag}", ctx.model, None, **DROPS[tag])]
    return [score("base-score", ctx.model), drop(f"base-drop{tag}", ctx.model, "base-score", **DROPS[tag])]


def t2_core(row: str, tag: str):
    def core(ctx: Ctx):
        return base_drop(ctx, tag) + [train(f"{row}-train", ref(f"base-drop{tag}"), ctx)], ref(f"{row}-train", "/model")
    return core


def effir_core(prefix: str, tag: str, ratio: float):
    """Coarse-to-fine: drop TAG from SmolLM2, self-slim the kept MLPs, mask RATIO of their neurons, train."""
    def core(ctx: Ctx):
        slim = train(f"{prefix}-slim", ref(f"base-drop{tag}"), ctx, mode="slim", slim_train="gates", slim_lr=0.05,
                     max_steps=40, per_device_batch_size=2, save_steps=20)
        return base_drop(ctx, tag) + [
            slim,
            command(f"{prefix}-mask", "mask", gates=ref(f"{prefix}-slim"), ratio=ratio, min_per_layer=32,
                    model=ref(f"{prefix}-slim", "/model")),
            train(f"{prefix}-train", ref(f"{prefix}-slim", "/model"), ctx, mask=ref(f"{prefix}-mask")),
        ], ref(f"{prefix}-train", "/model")
    return core


def gap_oneshot_core(row: str, method: str, pct: int, structured: bool = False, source: str = "dense"):
    def core(ctx: Ctx):
        stages = gap_prune(ctx, method, pct, structured, source)
        model = gap_source(ctx, source)[1]
        return stages + [command(f"{row}-export", "export", model=model, mask=ref(stages[-1]["name"]))], \
            ref(f"{row}-export")
    return core


def gap_retrain_stage(row: str, ctx: Ctx, mask: str | None) -> dict:
    """GAPrune's prune-then-retrain: the dense retriever (mask held, if any) trained on FinanceBench train."""
    return launcher(f"{row}-train", "train", {"model": ctx.dense, **({"mask": mask} if mask else {}), **GAP_RETRAIN,
                                              "overwrite": True})


def gap_retrain_core(row: str, method: str | None):
    def core(ctx: Ctx):
        stages = gap_prune(ctx, method, 50) if method else []
        mask = ref(stages[-1]["name"]) if method else None
        return stages + [gap_retrain_stage(row, ctx, mask)], ref(f"{row}-train", "/model")
    return core


def _rows() -> dict[str, Row]:
    rows = [Row("untrained", "untrained", "SmolLM2 as it ships, mean pooling, no retrieval training",
                lambda ctx: ([], ctx.model)),
            Row("dense", "dense", "SmolLM2 trained into a retriever by benchmarks/train_dense.py",
                lambda ctx: ([], ctx.dense), headline=True)]
    for tag in ("4a", "8a", "4b", "8b", "4m", "8m", "15m"):
        rows.append(Row(f"t1-{tag}", drop_label(tag), f"dense retriever, drop {drop_what(tag)}, no training",
                        t1_core(tag)))
    for tag in ("8a", "15a", "8b", "15b", "last15b", "8m", "15m", "19m", "15m8a"):
        rows.append(Row(f"t2-{tag}", drop_label(tag), f"SmolLM2, drop {drop_what(tag)}, then the dense budget",
                        t2_core(f"t2-{tag}", tag), bench="model" if tag in ("8m", "15m", "19m") else None,
                        headline=tag == "15m"))
    rows.append(Row("effir", "EffiR (15M + slim 30%)", "drop 15 MLPs, self-slim 40 steps, mask 30% of the "
                    "neurons, then the dense budget", effir_core("effir", "15m", 0.3), bench="model", headline=True))
    rows.append(Row("effir-4m", "EffiR (4M + slim 15%)", "drop 4 MLPs, self-slim 40 steps, mask 15% of the "
                    "neurons (about 4 MLPs' worth, so the size of Drop-8M), then the dense budget",
                    effir_core("effir4m", "4m", 0.15), bench="model"))
    for pct in (30, 50):
        for m in GAP_METHODS:
            rows.append(Row(f"gap-{m}-{pct}", f"{GAP_LABELS[m]} {pct}%", f"one-shot {GAP_METHODS[m]} mask, {pct}% of the MLP "
                            "weights, no training", gap_oneshot_core(f"gap-{m}-{pct}", m, pct)))
    rows.append(Row("gap-daibal-50", f"{GAP_LABELS['daibal']} 50%", "one-shot DAI mask, 50% of the MLP weights, "
                    "Fisher rescaled to the magnitude term's size (beyond the paper)",
                    gap_oneshot_core("gap-daibal-50", "daibal", 50)))
    rows.append(Row("gap-dense-retrain", "dense + retrain", "the dense retriever, the same retraining without a "
                    "mask (control)", gap_retrain_core("gap-dense-retrain", None)))
    for m in ("dai", "magnitude", "fisher"):
        rows.append(Row(f"gap-{m}-50-retrain", f"{GAP_LABELS[m]} 50% + retrain", f"{GAP_METHODS[m]} mask at 50%, held while "
                        "retraining on FinanceBench train", gap_retrain_core(f"gap-{m}-50-retrain", m)))
    for m in ("dai", "daibal", "magnitude", "fisher", "random"):
        what = GAP_METHODS.get(m, "dai, Fisher balanced,")
        rows.append(Row(f"gapft-{m}-50", f"{GAP_LABELS[m]} 50%", f"one-shot {what} mask, 50% "
                        "of the MLP weights of the finance-aware retriever (gap-dense-retrain), no training",
                        gap_oneshot_core(f"gapft-{m}-50", m, 50, source="ft"), trained_last=False))
    for pct in (30, 50):
        rows.append(Row(f"gap-dai-neurons-{pct}", f"DAI neurons {pct}%", f"structured DAI: {pct}% of the MLP "
                        "neurons removed, no training", gap_oneshot_core(f"gap-dai-neurons-{pct}", "dai", pct, True),
                        bench="dense"))
    return {r.name: r for r in rows}


ROWS = _rows()


@dataclass
class Table:
    id: str
    title: str
    reference: str
    rows: list[str]
    note: str = ""
    labels: dict | None = None      # row -> label in this table


TABLES = [
    Table("baselines", "Baselines: is the dense retriever properly trained?", "dense", ["untrained", "dense"],
          "A finding that does not reproduce counts only if the dense model clearly beats the untrained one."),
    Table("effir-t1", "EffiR Table 1: coarse dropping of the dense retriever, no recovery training", "dense",
          ["dense"] + [f"t1-{t}" for t in ("4a", "8a", "4b", "8b", "4m", "8m", "15m")],
          "Layers scored once on the dense retriever (`dense-score`); the same scores pick every drop."),
    Table("effir-t2", "EffiR Table 2: dropping, then the same training budget", "dense",
          ["dense"] + [f"t2-{t}" for t in ("8a", "15a", "8b", "15b", "last15b", "8m", "15m", "19m", "15m8a")],
          "Layers scored once on SmolLM2 (`base-score`); every variant then trains with exactly the dense row's "
          "options (train.yaml of benchmarks/train_dense.py). *full* is the dense row: SmolLM2 trained with that "
          "same budget.", {"dense": "full (= dense)"}),
    Table("effir-t3", "EffiR Table 3: coarse-to-fine (15M + 30% slimming) vs deeper dropping (19M)", "dense",
          ["dense", "t2-15m", "t2-19m", "effir"],
          "Speed-ups: `dsprune bench` of each model against the full SmolLM2 in one process.",
          {"dense": "full (= dense)", "t2-15m": "EffiR-15M", "t2-19m": "EffiR-19M"}),
    Table("effir-t3-mild", "EffiR Table 3 at a milder point: 4M + 15% slimming vs 8M", "dense",
          ["dense", "t2-8m", "effir-4m"],
          "The same comparison where SmolLM2 still trains under the dense budget: half of its 30 MLPs (15M) is far "
          "more of a 135M model than 16 of Mistral-7B's 32 (compare Drop-4M and Drop-15M in Table 1). Slimming "
          "15% of the 26 kept MLPs' neurons removes about 4 MLPs' worth, so EffiR-4M and Drop-8M have about the "
          "same size.",
          {"dense": "full (= dense)"}),
    Table("gaprune-t1", "GAPrune Table 1: one-shot MLP pruning of the dense retriever", "dense",
          ["dense"] + [f"gap-{m}-{p}" for p in (30, 50) for m in GAP_METHODS] + ["gap-daibal-50"],
          "Unstructured masks over the MLP weights (global budget), written as zeros: no size or speed change. "
          "FinanceBench is the domain, SciFact the general side; DAI sees FinanceBench *train* questions only. "
          "*DAI, Fisher balanced* (beyond the paper): Eq. 5 with both Fisher terms rescaled so that the Fisher "
          "term's mean size equals γ·√|θ|'s; as written, the Fisher term is ~10⁻⁶ of it here and DAI ranks "
          "like magnitude."),
    Table("gaprune-t2", "GAPrune Table 2: 50% masks, then retraining on FinanceBench train", "gap-dense-retrain",
          ["dense", "gap-dense-retrain"] + [f"gap-{m}-50-retrain" for m in ("dai", "magnitude", "fisher")],
          "Reference: the dense retriever given the same retraining without a mask, so every row has the same "
          "training budget (the paper compares with the un-retrained dense model, also shown)."),
    Table("gaprune-t1-ft", "GAPrune Table 1 on the finance-aware retriever: one-shot 50% MLP pruning",
          "gap-dense-retrain", ["dense", "gap-dense-retrain"] + [f"gapft-{m}-50" for m in
                                                                 ("dai", "daibal", "magnitude", "fisher", "random")],
          "The same one-shot masks, computed on and applied to `gap-dense-retrain` (the dense retriever after 40 LoRA "
          "steps on FinanceBench train), which is clearly better than the dense one on FinanceBench; on the dense "
          "retriever the domain side had little to keep. Sampling and DAI are recomputed on this model."),
    Table("gaprune-neurons", "GAPrune structured (beyond the paper): DAI summed per MLP neuron", "dense",
          ["dense", "gap-dai-neurons-30", "gap-dai-neurons-50"],
          "Neurons really removed, so the model is smaller and faster; benched against the dense retriever."),
]
TABLE_OF = {}
for _t in TABLES:
    for _r in _t.rows:
        TABLE_OF.setdefault(_r, _t.id)


def select(names: list[str] | None) -> list[Row]:
    if not names:
        return list(ROWS.values())
    tables = {t.id: t for t in TABLES}
    bad = [n for n in names if n not in ROWS and n not in tables]
    if bad:
        raise DsPruneError(f"unknown row(s) {', '.join(bad)}; rows: {', '.join(ROWS)}; tables: {', '.join(tables)}")
    picked: list[str] = []
    for n in names:
        for r in (tables[n].rows if n in tables else [n]):
            if r not in picked:
                picked.append(r)
    return [ROWS[r] for r in ROWS if r in picked]   # grid order: prerequisites (dense) first


def fingerprint(row: Row, ctx: Ctx) -> tuple[str, dict]:
    """The row's config fingerprint: its stages with inputs as placeholders, and what they stand for."""
    stages = row.stages(ctx)
    blob = json.dumps(stages, sort_keys=True)
    config = {"grid_version": GRID_VERSION, "row": row.name, "stages": stages,
              "inputs": ctx.identities({p for p in ("<model>", "<dense>", "<train>") if p in blob})}
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16], config


def estimate(stages: list[dict]) -> int:
    total = 0
    for s in stages:
        kind = s.get("command") or s.get("launcher")
        if s["name"].endswith("-eval-scifact"):
            kind = "eval-scifact"
        elif kind == "train" and s["args"].get("mode") == "slim":
            kind = "slim"
        elif kind == "train" and s["args"].get("train_data") == GAP_RETRAIN["train_data"]:
            kind = "gap-train"
        total += ROUGH_MINUTES.get(kind, 1)
    return total


def stage_command(stage: dict, args: dict) -> str:
    if stage.get("command"):
        return shlex.join(["dsprune", stage["command"], *recipe_argv(args)])
    return shlex.join(["deepspeed", "--num_gpus", str(stage.get("num_gpus", 1)),
                       f"launchers/{stage['launcher']}.py", *recipe_argv(args)])


# ---- running -------------------------------------------------------------------------------------------

def row_command(a, row: str) -> str:
    """The command that (re)makes one row with this invocation's settings."""
    cmd = [".venv/bin/python", "benchmarks/reproduce.py", "--rows", row]
    for opt, default in (("model", "smollm2"), ("dense", DEFAULT_DENSE), ("train_config", None),
                         ("tasks", DEFAULT_TASKS), ("max_length", 128)):
        v = getattr(a, opt)
        if v != default and not (opt == "dense" and default_dense(a)):
            cmd += [f"--{opt.replace('_', '-')}", *(map(str, v) if isinstance(v, list) else [str(v)])]
    if a.headline_scifact:
        cmd.append("--headline-scifact")
    return shlex.join(cmd)


def run_row(row: Row, a, results: Path) -> str:
    """Run one row unless its results are current. Returns 'skipped' or 'ran'."""
    symbolic = Ctx(a, symbolic=True)
    fp, config = fingerprint(row, symbolic)
    dest = results / f"{row.name}.json"
    if dest.is_file() and not a.force:
        try:
            old = json.loads(dest.read_text()).get("config_fingerprint")
        except json.JSONDecodeError:
            old = None
        if old == fp:
            copy_figures(row.name, row.stages(symbolic), {}, symbolic.out, results)
            print(f"= {row.name}: results current ({dest}), skipped", flush=True)
            return "skipped"
    ctx = Ctx(a, symbolic=False)
    out = ctx.out
    stages = row.stages(ctx)
    recipe = out / "rows" / f"{row.name}.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    import yaml
    formats.write_text(recipe, f"# {row.name}: {row.what}\n# written by benchmarks/reproduce.py; "
                      f"dsprune run {recipe} reruns it\n"
                      + yaml.safe_dump({"out": str(out), "stages": stages}, sort_keys=False, width=120))
    t0 = time.time()
    report = run_recipe(recipe, out=str(out))
    wall = time.time() - t0
    doc = collect(row, stages, report, out, fp, config, ctx, a, wall)
    copy_figures(row.name, stages, report, out, results)
    formats.write_json(dest, doc)
    print(f"wrote {dest}", flush=True)
    return "ran"


def copy_figures(name: str, stages: list[dict], report: dict, out: Path, results: Path) -> None:
    """Figures RESULTS.md shows from stage folders (``out`` is not committed): a mask stage's per-layer widths
    (EffiR Figure 2b) as NAME-widths.png; a score stage's drop-order heat map (Figure 2a) and its scores as
    drop_order/STAGE.png and .json, one per score stage however many rows share it."""
    for s in stages:
        folder = Path((report.get(s["name"]) or {}).get("folder") or out / s["name"])
        if s.get("command") == "mask" and (folder / "widths.png").is_file():
            copy_file(folder / "widths.png", results / f"{name}-widths.png")
        if s.get("command") == "score" and (folder / formats.SCORES).is_file() and (folder / DROP_ORDER).is_file():
            copy_file(folder / DROP_ORDER, results / "drop_order" / f"{s['name']}.png")
            copy_file(folder / formats.SCORES, results / "drop_order" / f"{s['name']}.json")


def collect(row: Row, stages: list[dict], report: dict, out: Path, fp: str, config: dict, ctx: Ctx, a,
            wall: float) -> dict:
    """Everything the results JSON of one row holds, read from the stage folders."""
    def folder(name: str) -> Path:
        return Path(report[name].get("folder") or out / name)

    res = formats.read_json(folder(f"{row.name}-eval") / formats.RESULTS, "results file")
    tasks = {}
    for extra in (f"{row.name}-eval", f"{row.name}-eval-scifact"):
        if extra not in report:
            continue
        doc = res if extra.endswith("-eval") else formats.read_json(folder(extra) / formats.RESULTS, "results file")
        for t, r in doc["tasks"].items():
            tasks[t] = {"ndcg_at_10": r.get("ndcg_at_10"), "recall_at_100": r.get("recall_at_100"),
                        "split": r.get("split"), "num_queries": r.get("num_queries"), "source": r.get("source"),
                        "per_query": {"ndcg_at_10": r.get("per_query", {}).get("ndcg_at_10", {})}}
    model_manifest = folder(f"{row.name}-eval") / "model_manifest.json"
    model_info = formats.read_json(model_manifest) if model_manifest.is_file() else {}
    speed = None
    if f"{row.name}-bench" in report:
        b = formats.read_json(folder(f"{row.name}-bench") / formats.BENCH, "bench file")
        speed = {"document": b["document"]["speedup"], "query": b["query"]["speedup"],
                 "flop_ratio": b["document"]["flop_ratio"], "param_ratio": b["params"]["ratio"],
                 "params": b["params"]["model"], "baseline_params": b["params"]["baseline"],
                 "baseline": b["baseline"], "threads": b.get("threads")}
    training = {}
    if row.name == "dense":       # trained outside the grid by benchmarks/train_dense.py
        man = Path(ctx.a.dense).parent / formats.MANIFEST
        figs = formats.read_json(man).get("figures", {}) if man.is_file() else {}
        if figs:
            training["train_dense.py"] = {k: figs.get(k) for k in ("steps", "train_seconds", "first_loss", "final_loss")}
    mask = model_info.get("mask")
    for s in stages:
        if s.get("launcher") == "train":
            man = folder(s["name"]) / formats.MANIFEST
            run_info = formats.read_json(man) if man.is_file() else {}
            figs = run_info.get("figures", {})
            training[s["name"]] = {k: figs.get(k) for k in ("steps", "train_seconds", "first_loss", "final_loss",
                                                            "resumed_from")}
            mask = mask or run_info.get("mask")   # models retrained before their manifest named the held mask
    stage_info = [{"name": s["name"], "status": report[s["name"]]["status"],
                   "seconds": report[s["name"]].get("seconds"),
                   "command": stage_command(s, {**report[s["name"]]["args"],
                                                **({"out": str(folder(s["name"]))} if s.get("command")
                                                   else {"output_dir": str(folder(s["name"]))})})}
                  for s in stages]
    return {
        "row": row.name, "table": TABLE_OF.get(row.name), "label": row.label, "what": row.what,
        "config_fingerprint": fp, "config": config,
        "command": row_command(a, row.name), "invocation": shlex.join([sys.executable, *sys.argv]),
        "stages": stage_info, "tasks": tasks, "params": res.get("params"), "model": res.get("model"),
        "model_fingerprint": res.get("fingerprint"),
        "structure": model_info.get("structure"), "mask": mask,
        "speed": speed, "training": training, "inputs": ctx.inputs,
        "wall_seconds": round(wall, 1),
        "compute_seconds": round(sum(s["seconds"] or 0 for s in stage_info), 1),
        "code_version": formats.code_version(), "scaled_settings": SCALED, "model_note": MODEL_NOTE,
        "eval": {"tasks": ctx.tasks, "split": "test", "max_length": ctx.max_length},
    }


# ---- rendering -----------------------------------------------------------------------------------------

def load_results(results: Path) -> dict[str, dict]:
    docs = {}
    for p in sorted(results.glob("*.json")):
        doc = formats.read_json(p, "results file")
        if not isinstance(doc, dict) or doc.get("row") not in ROWS or "tasks" not in doc:
            print(f"note: {p} is not a row of this grid, ignored", file=sys.stderr)
            continue
        docs[doc["row"]] = doc
    return docs


def _entry(row: str, doc: dict, tasks: list[str], results: Path, speed: dict | None = None):
    from dsprune.report.compare import Entry
    t = {k: v for k, v in doc["tasks"].items() if k in tasks and v.get("per_query", {}).get("ndcg_at_10")}
    return Entry(row, results / f"{row}.json", {"tasks": t, "params": doc.get("params"), "model": doc.get("model"),
                                                "fingerprint": doc.get("model_fingerprint") or row},
                 dict(speed or {}))


def compare_rows(ref: str, rows: list[str], docs: dict, tasks: list[str], results: Path,
                 speeds: dict | None = None) -> dict:
    """Scores per row and task, with the paired bootstrap CI of the difference to ``ref`` when it exists."""
    from dsprune.report import compare
    speeds = speeds or {}
    present = [r for r in rows if r in docs]
    if ref not in docs or not any(docs[ref]["tasks"].get(t, {}).get("per_query", {}).get("ndcg_at_10")
                                  for t in tasks):
        rows = {}
        for r in present:
            cells = {t: {"score": docs[r]["tasks"][t]["ndcg_at_10"]} if t in docs[r]["tasks"] else None for t in tasks}
            done = all(cells.values())
            rows[r] = {"tasks": cells, "mean": sum(c["score"] for c in cells.values()) / len(tasks) if done else None}
        return {"rows": rows, "tasks": tasks}
    order = [ref] + [r for r in present if r != ref]
    entries = [_entry(r, docs[r], tasks, results, speeds.get(r)) for r in order]
    table = compare.compare(entries, 0, samples=2000, seed=0)
    return {"rows": {r["label"]: r for r in table["rows"]}, "tasks": table["tasks"], "table": table}


def fmt_cell(c: dict | None) -> str:
    if c is None:
        return "–"
    s = f"{c['score']:.4f}"
    d = c.get("delta")
    if d:
        s += f" ({d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}])"
    return s


def fmt_params(doc: dict) -> str:
    if not doc.get("params"):
        return "–"
    s = f"{doc['params'] / 1e6:.1f}M"
    mask = doc.get("mask") or {}
    if mask.get("kind") == "unstructured":
        s += f" ({mask.get('sparsity', 0):.0%} of MLP weights zero)"
    return s


def fmt_minutes(doc: dict) -> str:
    """Minutes of the row's stages; ``+`` when a training stage resumed from a checkpoint, whose earlier run's
    time is not known."""
    resumed = any((t or {}).get("resumed_from") for t in (doc.get("training") or {}).values())
    return f"{doc.get('compute_seconds', 0) / 60:.0f}" + ("+" if resumed else "")


def training_steps(doc: dict) -> str:
    steps = [str(v.get("steps")) for v in (doc.get("training") or {}).values() if v.get("steps") is not None]
    return " + ".join(steps) if steps else "–"


def under_trained(docs: dict) -> dict[str, dict]:
    """Trained rows that score clearly *below the untrained model* on the bar task (scifact_small): their
    training failed (issue 8: a finding counts only from properly trained models). Row -> paired interval."""
    from dsprune.eval.bootstrap import paired_bootstrap

    task = DEFAULT_TASKS[0]
    base = ((docs.get("untrained") or {}).get("tasks", {}).get(task) or {}).get("per_query", {}).get("ndcg_at_10")
    out = {}
    for r, d in docs.items():
        pq = (d["tasks"].get(task) or {}).get("per_query", {}).get("ndcg_at_10")
        if base and pq and d.get("training") and r != "dense" and ROWS[r].trained_last:
            ci = paired_bootstrap(pq, base, 2000, 0)
            if ci["high"] < 0:
                out[r] = ci
    return out


def main_tasks(docs: dict) -> list[str]:
    seen = {t for d in docs.values() for t in d["tasks"] if t != HEADLINE_TASK}
    return [t for t in DEFAULT_TASKS if t in seen] + sorted(seen - set(DEFAULT_TASKS)) or list(DEFAULT_TASKS)


def render_table(table: Table, docs: dict, tasks: list[str], results: Path, md: Path) -> list[str]:
    labels = table.labels or {}
    cmp = compare_rows(table.reference, table.rows, docs, tasks, results)
    speed_cols = any(ROWS[r].bench or (docs.get(r) or {}).get("speed") for r in table.rows)
    means = len(tasks) > 1                    # one task: its mean would repeat its cell
    head = ["row", *[f"{t} nDCG@10" for t in tasks], *(["mean"] if means else []), "params"]
    head += ["doc speed-up", "query speed-up"] if speed_cols else []
    head += ["train steps", "min", "run"]
    lines = [f"### {table.title}", "", table.note, "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    failed = under_trained(docs)
    for r in table.rows:
        name = labels.get(r, ROWS[r].label) + (" *(ref)*" if r == table.reference else "")
        name += " †" if r in failed else ""
        run = f"`--rows {r}`"
        if r not in docs:
            cells = [name, *["pending"] * len(tasks), *(["pending"] if means else []), "–"]
            cells += ["–", "–"] if speed_cols else []
            lines.append("| " + " | ".join(cells + ["–", "–", run]) + " |")
            continue
        doc, c = docs[r], cmp["rows"].get(r, {})
        mean = "–" if c.get("mean") is None else f"{c['mean']:.4f}"
        if c.get("mean_delta"):
            d = c["mean_delta"]
            mean += f" ({d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}])"
        cells = [name, *[fmt_cell((c.get("tasks") or {}).get(t)) for t in tasks], *([mean] if means else []),
                 fmt_params(doc)]
        if speed_cols:
            sp = doc.get("speed") or {}
            one = "1.00× (baseline)" if r == "dense" and not sp else "–"
            cells += [f"{sp['document']:.2f}×" if sp else one, f"{sp['query']:.2f}×" if sp else one]
        cells += [training_steps(doc), fmt_minutes(doc), run]
        lines.append("| " + " | ".join(cells) + " |")
    if table.reference not in docs:
        lines += ["", f"No intervals yet: the reference row `{table.reference}` is pending."]
    plots = {r: results / f"{r}-widths.png" for r in table.rows}
    widths = [f"[{labels.get(r, ROWS[r].label)}]({os.path.relpath(p, md.parent)})" for r, p in plots.items() if p.is_file()]
    if widths:
        lines += ["", "Per-layer MLP widths after slimming (EffiR Figure 2b, from each row's `dsprune mask` stage): "
                  + ", ".join(widths) + "."]
    return lines + [""]


def render_checks(docs: dict, tasks: list[str], results: Path) -> list[str]:
    from dsprune.eval.bootstrap import paired_bootstrap

    def pq(row: str, t: str) -> dict:
        return docs[row]["tasks"].get(t, {}).get("per_query", {}).get("ndcg_at_10") or {}

    lines = ["## Checks", ""]
    if "dense" in docs and "untrained" in docs:
        for t in tasks:
            if pq("dense", t) and pq("untrained", t):
                d = paired_bootstrap(pq("dense", t), pq("untrained", t), 2000, 0)
                verdict = "clearly better (interval above 0)" if d["low"] > 0 else "NOT clearly better"
                lines.append(f"- dense − untrained on {t}: {d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]: "
                             f"{verdict}.")
    else:
        lines.append("- dense vs untrained: pending.")
    def compare(pairs, sizes: bool):
        """row − rival per task; a pair's optional third item names the question it answers."""
        for a, b, *question in pairs:
            if a not in docs or b not in docs:
                continue
            lead = f"{question[0]}: " if question else ""
            names = [ROWS[r].label + (f" ({fmt_params(docs[r])})" if sizes else "") for r in (a, b)]
            for t in tasks:
                if pq(a, t) and pq(b, t):
                    d = paired_bootstrap(pq(a, t), pq(b, t), 2000, 0)
                    lines.append(f"- {lead}{names[0]} − {names[1]} on {t}: {d['diff']:+.4f} "
                                 f"[{d['low']:+.4f}, {d['high']:+.4f}] (p = {d['p']:.3f}).")

    compare(EFFIR_PAIRS, sizes=False)   # EffiR's claim: slimming beats deeper dropping at equal size
    compare(DROP_PAIRS, sizes=True)     # EffiR's claims on what to drop
    for what, _, row_of, _ in GAP_CLAIM_SETS:   # GAPrune's claim: DAI keeps domain quality best
        dai = row_of("dai")
        if dai not in docs or not pq(dai, DOMAIN_TASK):
            continue
        rivals = {m: pq(row_of(m), DOMAIN_TASK) for m in GAP_METHODS if m != "dai" and row_of(m) in docs}
        diffs = {m: paired_bootstrap(pq(dai, DOMAIN_TASK), scores, 2000, 0) for m, scores in rivals.items() if scores}
        if diffs:
            lines.append(f"- DAI − other masks, {what}, on {DOMAIN_TASK} (the domain): " + "; ".join(
                f"{GAP_LABELS[m].lower()} {d['diff']:+.4f} [{d['low']:+.4f}, {d['high']:+.4f}]"
                for m, d in diffs.items()) + ".")
    failed = under_trained(docs)
    if failed:
        lines.append(f"- **† not properly trained**: {', '.join(failed)} score below the *untrained* model on "
                     f"{DEFAULT_TASKS[0]} (row − untrained: " + "; ".join(
                         f"{r} {c['diff']:+.4f} [{c['low']:+.4f}, {c['high']:+.4f}]" for r, c in failed.items())
                     + "). Their training failed, so they test no claim of the papers; "
                     "`benchmarks/train_collapse.py` shows how (loss against ln N, passage cosine).")
    budgets = {r: training_steps(docs[r]) for r in docs if r.startswith(("t2-", "effir"))}
    if budgets:
        lines.append("- training steps (Table 2 / EffiR rows; EffiR's are slimming + training): "
                     + ", ".join(f"{r} {s}" for r, s in budgets.items()) + ".")
    dense_fp = (docs.get("dense") or {}).get("model_fingerprint")
    stale = [r for r, d in docs.items() if dense_fp and (d.get("inputs") or {}).get("dense", {}).get("fingerprint")
             not in (None, dense_fp)]
    if stale:
        lines.append(f"- **warning**: {', '.join(stale)} used a different dense model than the dense row "
                     "(rerun them with --force).")
    return lines + [""]


def render(results: Path, md: Path) -> str:
    docs = load_results(results) if results.is_dir() else {}
    tasks = main_tasks(docs)
    png = results / "quality_vs_speed.png"
    out = ["# Reproducing EffiR and GAPrune at small scale", "",
           f"Rendered by `benchmarks/reproduce.py` from `{os.path.relpath(results, md.parent)}/*.json`: "
           f"{len(docs)} of {len(ROWS)} rows done. Every number below comes from a row's results JSON, made by "
           "the command shown (code version per row under *Provenance*); rows not yet run say *pending*.", "",
           "**Run.** `.venv/bin/python benchmarks/reproduce.py` runs every pending row (about 12 h on 2 CPU cores "
           "from scratch; `--list` shows rows, stages and rough minutes); `--rows ROW|TABLE ...` picks some. A row "
           "resumes stage by stage; a finished row is skipped while its configuration is unchanged.", "",
           f"**Model.** {MODEL_NOTE}", "",
           "**Reading the tables.** nDCG@10 per task; in brackets the difference to the table's reference row "
           "*(ref)* with its 95 % paired bootstrap interval over queries (2,000 resamples, "
           "`dsprune.eval.bootstrap`); *mean* is over the tasks, its interval resamples queries per task. "
           "Speed-ups are measured by `dsprune bench` in one run (±0.1 between runs). *min*: wall minutes of the "
           "row's stages on 2 CPU cores (a shared stage such as scoring counts in every row that uses it; *+*: a "
           "training stage resumed from a checkpoint and only its last run is counted). "
           "*run*: `.venv/bin/python benchmarks/reproduce.py --rows ROW`.", "",
           "**Scaled settings** (2 CPU cores; the papers' settings in brackets):", ""]
    out += [f"- {k}: {v}" for k, v in SCALED.items()] + [""]
    for table in TABLES:
        out += render_table(table, docs, tasks, results, md)
    heads = [r for r in docs if HEADLINE_TASK in docs[r]["tasks"]]
    if heads:
        rows = ["dense"] + [r for r in ROWS if r in heads and r != "dense"]
        out += render_table(Table("headline", "Headline rows on full SciFact (5,183 documents, 300 queries)",
                                  "dense", rows, "Only with `--headline-scifact`."), docs, [HEADLINE_TASK], results, md)
    out += render_checks(docs, tasks, results)
    out += render_drop_order(results, md)
    if plot_front(docs, tasks, results, png):
        out += ["## Quality vs speed", "", f"![quality vs speed]({os.path.relpath(png, md.parent)})", "",
                "Mean nDCG@10 against the measured document-encoding speed-up; bars: the paired interval of "
                "the difference to the dense retriever.", ""]
    gap_png = results / "gaprune_methods.png"
    if plot_gaprune(docs, tasks, results, gap_png):
        out += ["## GAPrune methods side by side", "", f"![GAPrune methods]({os.path.relpath(gap_png, md.parent)})",
                "", "nDCG@10 of each mask per setting; dashed: the setting's unpruned reference (dense, or the "
                "control retrained on FinanceBench train); bars: the paired interval of the difference to it.", ""]
    out += render_families(results, md)
    out += ["## Provenance", ""]
    for r in ROWS:
        if r in docs:
            d = docs[r]
            out.append(f"- **{r}** ({d.get('code_version')}, {fmt_minutes(d)} min of "
                       f"stages, {d.get('wall_seconds', 0) / 60:.0f} min in its last run): `{d.get('command')}`")
            out += [f"  - `{s['command']}`" for s in d.get("stages", [])]
    text = "\n".join(out).rstrip() + "\n"
    formats.write_text(md, text)
    return text


def render_drop_order(results: Path, md: Path) -> list[str]:
    """The score stages' heat maps, each with the median importance per kind of sub-layer read from its scores."""
    import statistics

    maps = sorted((results / "drop_order").glob("*.png"))
    if not maps:
        return []
    out = ["## Drop order (EffiR Figure 2a)", "",
           "Importance 1 − cos(x_in, x_out) of every sub-layer on the calibration text (`dsprune score`); a number "
           "is the place in the drop order (1 = dropped first), colours are on a log scale.", ""]
    names = formats.SCORE_GROUPS
    docs = {png.stem: formats.read_scores(png.with_suffix(".json")) for png in maps}
    for png in maps:
        doc = docs[png.stem]
        medians = ", ".join(f"{names.get(k, k)} {statistics.median(v.values()):.4f}"
                            for k, v in doc["scores"].items() if v)
        first = "; ".join(f"{names.get(k, k)} {', '.join(map(str, v[:5]))}" for k, v in doc["order"].items() if v)
        out += [f"**`{png.stem}`**: {SCORED.get(png.stem, Path(doc.get('model', png.stem)).name)}. Median importance: "
                f"{medians}. First five to drop: {first}.", "",
                f"![drop order of {png.stem}]({os.path.relpath(png, md.parent)})", ""]
    if {"base-score", "dense-score"} <= set(docs):
        out += [drop_order_shift(docs["base-score"], docs["dense-score"]), ""]
    return out


def drop_order_shift(base: dict, tuned: dict, k: int = 8) -> str:
    """EffiR Figure 2a's two observations, measured: retrieval training keeps the drop order (rank correlation of
    the scores, overlap of the first k), and later layers are the more prunable (mean index of the first k)."""
    from scipy.stats import spearmanr

    parts = []
    for kind, scores in tuned["scores"].items():
        layers = sorted(set(scores) & set(base["scores"].get(kind, {})), key=int)
        if len(layers) < 3:
            continue
        rho = spearmanr([base["scores"][kind][i] for i in layers], [scores[i] for i in layers]).statistic
        first = tuned["order"][kind][:k]
        shared = len(set(first) & set(base["order"][kind][:k]))
        parts.append(f"{formats.SCORE_GROUPS.get(kind, kind)} ρ = {rho:.2f}, {shared} of the first {k} shared, their mean layer "
                     f"{sum(first) / len(first):.1f}")
    n = tuned.get("num_layers") or len(next(iter(tuned["scores"].values())))
    return ("**After retrieval training** (`base-score` → `dense-score`; EffiR: the pattern stays, later layers "
            "are the more prunable): " + "; ".join(parts) + f" (the middle layer is {(n - 1) / 2:.1f}).")


def render_families(results: Path, md: Path) -> list[str]:
    """Another model family through recipes/effir-smollm2.yaml (benchmarks/family.py): the recipe's own report."""
    from dsprune.report.compare import markdown
    out = []
    for p in sorted((results / "families").glob("*.json")):
        d = formats.read_json(p, "model family results")
        if not isinstance(d, dict) or not {"title", "command", "report", "stages"} <= set(d):
            print(f"note: {p} is not a benchmarks/family.py result, ignored", file=sys.stderr)
            continue
        minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
        out += [f"## A second model family: {d['title']}", "",
                f"`{d['recipe']}`'s stages with only the model changed: `.venv/bin/python benchmarks/family.py "
                f"{d['family']}` runs `{d['command']}` ({d.get('code_version')}, {minutes:.0f} min of stages on 2 "
                "CPU cores) and keeps the recipe's `report` stage. The reference is the unpruned model given the "
                "same training budget (`train-full`); *as shipped* is the model before any retrieval training.", "",
                markdown(d["report"]), ""]
        png = results / "families" / d.get("plot", "")
        if d.get("plot") and png.is_file():
            out += [f"![{d['title']}: quality vs speed]({os.path.relpath(png, md.parent)})", ""]
        out += ["Stage minutes: " + ", ".join(f"{s['name']} {(s.get('seconds') or 0) / 60:.0f}"
                                              for s in d["stages"]) + ".", ""]
    return out


def plot_front(docs: dict, tasks: list[str], results: Path, png: Path) -> bool:
    """The quality-vs-speed figure (dsprune.report.front) over every benched row, the dense row at 1×."""
    benched = [r for r in ROWS if (docs.get(r) or {}).get("speed")]
    if not benched or "dense" not in docs:
        return False
    from dsprune.report import front
    speeds = {r: docs[r]["speed"] for r in benched}
    speeds["dense"] = {"document": 1.0, "query": 1.0}
    cmp = compare_rows("dense", ["dense", *benched], docs, tasks, results, speeds)
    if "table" not in cmp:
        return False
    try:
        front.plot(cmp["table"], png)
    except DsPruneError:
        return False
    return True


def plot_gaprune(docs: dict, tasks: list[str], results: Path, png: Path) -> bool:
    """GAPrune's settings as grouped bars (dsprune.report.methods), a bar per finished mask."""
    from dsprune.report import methods
    groups = []
    for _, title, row_of, ref in GAP_CLAIM_SETS:
        rows = {GAP_LABELS[m]: row_of(m) for m in GAP_LABELS if row_of(m) in docs}   # docs hold grid rows only
        if not rows or ref not in docs:
            continue
        cmp = compare_rows(ref, [ref, *rows.values()], docs, tasks, results)
        groups.append({"title": title, "reference": ROWS[ref].label,
                       "ref_scores": {t: (cmp["rows"][ref]["tasks"].get(t) or {}).get("score") for t in tasks},
                       "bars": {label: cmp["rows"][r]["tasks"] for label, r in rows.items()}})
    try:
        methods.plot_groups(groups, tasks, png, "GAPrune: masks of the MLP weights")
    except DsPruneError:
        return False
    return True


# ---- listing -------------------------------------------------------------------------------------------

def list_rows(rows: list[Row], a, results: Path) -> None:
    ctx = Ctx(a, symbolic=True)
    print(f"<model> = {a.model}; <dense> = {a.dense}; <train> = the launcher options in {train_config_path(a)} "
          f"(written by benchmarks/train_dense.py); ${{out}} = {Path(a.out).resolve()}")
    seen: dict[str, dict] = {}
    for row in rows:
        stages = row.stages(ctx)
        fp, _ = fingerprint(row, ctx)
        dest = results / f"{row.name}.json"
        status = "pending"
        if dest.is_file():
            try:
                status = "done" if json.loads(dest.read_text()).get("config_fingerprint") == fp else "stale"
            except json.JSONDecodeError:
                status = "unreadable"
        minutes = estimate(stages)
        seen.update((s["name"], s) for s in stages)
        print(f"\n{row.name}  [{TABLE_OF.get(row.name)}]  {row.label}: {row.what}  "
              f"(~{minutes} min from scratch; {status})")
        for s in stages:
            print(f"  {s['name']:<28} {stage_command(s, s['args'])}")
    print(f"\n{len(rows)} rows, {len(seen)} stages: ~{estimate(list(seen.values())) / 60:.1f} h from scratch on 2 "
          "CPU cores (rough; each shared stage once; the dense model adds ~45 min when missing)")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", nargs="+", metavar="NAME", help="rows or table ids to run (default: all)")
    ap.add_argument("--list", action="store_true", help="print the rows and their stages, run nothing")
    ap.add_argument("--render", action="store_true", help="only render RESULTS.md from the results JSON files")
    ap.add_argument("--out", default=str(REPO / "out" / "reproduce"), help="stage folders, row recipes and input links")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"), help="one JSON per finished row")
    ap.add_argument("--results-md", default=str(REPO / "benchmarks" / "RESULTS.md"))
    ap.add_argument("--model", default="smollm2", help="the base LM (packaged name, folder or .gguf)")
    ap.add_argument("--dense", default=DEFAULT_DENSE, help="the trained dense retriever (made by "
                    "benchmarks/train_dense.py when this default is missing)")
    ap.add_argument("--train-config", default=None, help="launcher options of the dense run, reused by every "
                    "trained row (default: train.yaml two folders above --dense)")
    ap.add_argument("--tasks", nargs="+", default=list(DEFAULT_TASKS), help="eval tasks: NAME or NAME=BEIR_FOLDER")
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--headline-scifact", action="store_true", help="also score the headline rows (dense, "
                    "t2-15m, effir) on full SciFact (~25 min each)")
    ap.add_argument("--force", action="store_true", help="rerun rows whose results are current (their stages are "
                    "still reused when unchanged)")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    results, md = Path(a.results), Path(a.results_md)
    try:
        rows = select(a.rows)
        if a.list:
            list_rows(rows, a, results)
            return 0
        failed = []
        if not a.render:
            os.environ.update(OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
                              TOKENIZERS_PARALLELISM="false",
                              PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
            os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
            t0 = time.time()
            for i, row in enumerate(rows, 1):
                print(f"\n== [{i}/{len(rows)}] {row.name}: {row.what} ({(time.time() - t0) / 60:.0f} min so far)",
                      flush=True)
                try:
                    run_row(row, a, results)
                except DsPruneError as e:
                    print(f"!! {row.name} failed: {e}", file=sys.stderr, flush=True)
                    failed.append(row.name)
        render(results, md)
        print(f"rendered {md}")
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if failed:
        print(f"failed rows: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
