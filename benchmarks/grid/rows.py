"""What each row of the grid is: its stages (recipe stage dicts, every one a real ``dsprune`` command or DeepSpeed
launcher) and the paper table it fills.

Rows share stages by name (one ``dense-score`` for all of Table 1, one ``base-drop15m`` for Table 2's 15M row
and EffiR), so a name must mean one definition everywhere. SmolLM2 has 30 blocks: the papers' counts for
Mistral-7B's 32 are scaled by 30/32 (16 -> 15, 20 -> 19).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, NamedTuple

from dsprune.errors import DsPruneError

from .inputs import Ctx

GRID_VERSION = 1          # bump to invalidate every row's results when the grid's meaning changes
DOMAIN_TASK = "financebench"      # GAPrune's domain side
DEFAULT_TASKS = ["scifact_small", DOMAIN_TASK]
EFFIR_PAIRS = [("effir", "t2-19m"), ("effir-4m", "t2-8m")]   # (drop + slim, deeper drop) of about equal size
# what to drop, (row, rival, question): EffiR finds MLPs the most redundant sub-layers, so dropping MLPs beats
# dropping blocks even with fewer parameters left (its Drop-16M vs Drop-8B); and its importance scores should
# choose blocks at least as well as cutting the last ones
DROP_PAIRS = [("t1-15m", "t1-8b", "MLPs vs blocks, no recovery training"),
              ("t2-8m", "t2-8b", "MLPs vs blocks, then the dense budget"),
              ("t2-15b", "t2-last15b", "blocks by importance vs the last blocks, then the dense budget"),
              ("t2-15m-p4", "t2-15m", "the first 4 layers kept out of the drop or not, then the dense budget")]
# the recovery alone changes, (row, rival, question): the same dropped (and slimmed) SmolLM2 after the dense
# budget's InfoNCE training or after self-distillation from the dense retriever in about its training time
RECOVERY_PAIRS = [("sd-15m", "t2-15m", "self-distillation vs InfoNCE, Drop-15M"),
                  ("sd-effir", "effir", "self-distillation vs InfoNCE, EffiR 15M + slim 30%")]
HEADLINE_TASK = "scifact"
MODEL_NOTE = ("SmolLM2-135M here is SmolLM2-135M-Instruct, 4-bit (Q4_1) GGUF dequantised to fp32: it stands in "
              "for a base model (no base SmolLM2 is available on these machines).")
SD_STEPS = 60     # chosen so the distillation takes about the time t2-15m's and effir's training took
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
    "distillation": "the collapsed rows' recovery replaced by self-distillation from the dense retriever (cosine "
                    "to its embeddings + in-batch KL + InfoNCE on the pairs) over the texts of 512 groups mined "
                    "as the dense budget's are (mined again: *Checks* names where a pair's groups differ), "
                    "unlabelled except their pairs: 2 ranks x 16 items, queries of at most 64 and passages of at "
                    f"most 128 tokens, full parameters but the token embeddings, lr 2e-4, {SD_STEPS} steps (each "
                    "row's seconds of training in *Checks*) (EffiR: LoRA, MS MARCO, a BGE-reranker teacher's "
                    "scores)",
    "bench": "64 SciFact documents x 128 tokens, 128 queries, 2 threads, one run (+-0.1 between runs)",
}


def command(name: str, cmd: str, **args) -> dict:
    return {"name": name, "command": cmd, "args": args}


def launcher(name: str, which: str, args: dict, num_gpus: int = 2) -> dict:
    return {"name": name, "launcher": which, "num_gpus": num_gpus, "args": args}


def ref(stage: str, sub: str = "") -> str:
    return "${" + stage + "}" + sub


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
# Beyond the paper: with Eq. 5 as written the Fisher term is small beside gamma*sqrt|theta| on SmolLM2 (the dai
# manifest's mean_abs_fisher_term_over_magnitude_term; benchmarks/dai_modes.py). "daibal" recomputes DAI from the
# same saved statistics with F rescaled until both terms have equal mean size (dsprune dai --fisher_scale), to
# see what the domain term alone changes.
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
         "15m8a": {"drop_mlp": 15, "drop_attn": 8}, "15m-p4": {"drop_mlp": 15, "protect": "4"}}


def drop_label(tag: str) -> str:
    head, _, protect = tag.partition("-p")
    return "Drop-" + head.upper().replace("LAST", "Last") + (f", first {protect} protected" if protect else "")


def drop_what(tag: str) -> str:
    parts = {"drop_attn": "{} attention", "drop_blocks": "{} blocks", "drop_mlp": "{} MLPs",
             "drop_last": "the last {} blocks"}
    counts = " + ".join(parts[k].format(n) for k, n in DROPS[tag].items() if k in parts)
    protect = DROPS[tag].get("protect")
    return counts + (f" by importance, layers 0 to {int(protect) - 1} kept" if protect else "")


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


def effir_slim(ctx: Ctx, prefix: str, tag: str, ratio: float) -> list[dict]:
    """Drop TAG from SmolLM2, self-slim the kept MLPs' gates, mask RATIO of their neurons."""
    slim = train(f"{prefix}-slim", ref(f"base-drop{tag}"), ctx, mode="slim", slim_train="gates", slim_lr=0.05,
                 max_steps=40, per_device_batch_size=2, save_steps=20)
    return base_drop(ctx, tag) + [
        slim,
        command(f"{prefix}-mask", "mask", gates=ref(f"{prefix}-slim"), ratio=ratio, min_per_layer=32,
                model=ref(f"{prefix}-slim", "/model"))]


def effir_core(prefix: str, tag: str, ratio: float):
    """Coarse-to-fine: effir_slim, then the dense budget with the mask held."""
    def core(ctx: Ctx):
        return effir_slim(ctx, prefix, tag, ratio) + [
            train(f"{prefix}-train", ref(f"{prefix}-slim", "/model"), ctx, mask=ref(f"{prefix}-mask")),
        ], ref(f"{prefix}-train", "/model")
    return core


def distill(name: str, model: str, ctx: Ctx, mask: str | None = None) -> dict:
    """Self-distillation from the dense retriever over the dense budget's texts: the student keeps the dense
    row's encoder (pooling, normalisation), the teacher is the model the student should have become."""
    opts = ctx.train
    return launcher(name, "train", {
        "mode": "distill", "model": model, "teacher": ctx.dense,
        "distill_data": opts.get("train_data", "<train>"), "encoder": opts.get("encoder", "<train>"),
        **({"mask": mask} if mask else {}),
        "per_device_batch_size": 16, "query_max_length": 64, "passage_max_length": 128, "max_steps": SD_STEPS,
        "learning_rate": 0.0002, "warmup_steps": 6, "lora": False, "freeze": "embed_tokens",
        "gradient_checkpointing": True, "save_steps": 20, "seed": 42, "deepspeed": "ds_configs/zero2.json",
        "scaled_settings": json.dumps({"distillation": SCALED["distillation"]}), "overwrite": True})


def sd_core(row: str, tag: str, slim: tuple[str, float] | None = None):
    """A collapsed row with its recovery replaced by self-distillation: the same drop (and slimming) of
    SmolLM2, then ``distill`` (mask held)."""
    def core(ctx: Ctx):
        if slim:
            prefix = slim[0]
            stages = effir_slim(ctx, prefix, tag, slim[1])
            stages.append(distill(f"{row}-distill", ref(f"{prefix}-slim", "/model"), ctx, ref(f"{prefix}-mask")))
        else:
            stages = base_drop(ctx, tag) + [distill(f"{row}-distill", ref(f"base-drop{tag}"), ctx)]
        return stages, ref(f"{row}-distill", "/model")
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
    for tag in ("8a", "15a", "8b", "15b", "last15b", "8m", "15m", "15m-p4", "19m", "15m8a"):
        rows.append(Row(f"t2-{tag}", drop_label(tag), f"SmolLM2, drop {drop_what(tag)}, then the dense budget",
                        t2_core(f"t2-{tag}", tag), bench="model" if tag in ("8m", "15m", "19m") else None,
                        headline=tag == "15m"))
    rows.append(Row("effir", "EffiR (15M + slim 30%)", "drop 15 MLPs, self-slim 40 steps, mask 30% of the "
                    "neurons, then the dense budget", effir_core("effir", "15m", 0.3), bench="model", headline=True))
    rows.append(Row("effir-4m", "EffiR (4M + slim 15%)", "drop 4 MLPs, self-slim 40 steps, mask 15% of the "
                    "neurons (about 4 MLPs' worth, so the size of Drop-8M), then the dense budget",
                    effir_core("effir4m", "4m", 0.15), bench="model"))
    rows.append(Row("sd-15m", "Drop-15M, self-distilled", "SmolLM2, drop 15 MLPs (as Drop-15M), then "
                    "self-distillation from the dense retriever", sd_core("sd-15m", "15m")))
    rows.append(Row("sd-effir", "EffiR (15M + slim 30%), self-distilled", "drop 15 MLPs, self-slim and mask 30% "
                    "(EffiR's own stages), then self-distillation from the dense retriever with the mask held",
                    sd_core("sd-effir", "15m", ("effir", 0.3))))
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
          ["dense"] + [f"t2-{t}" for t in ("8a", "15a", "8b", "15b", "last15b", "8m", "15m", "15m-p4", "19m",
                                           "15m8a")],
          "Layers scored once on SmolLM2 (`base-score`); every variant then trains with exactly the dense row's "
          "options (train.yaml of benchmarks/train_dense.py). *full* is the dense row: SmolLM2 trained with that "
          "same budget. *Drop-15M, first 4 protected* is the same drop by importance with layers 0 to 3 kept out "
          "of it (`--protect 4`; *Which MLPs a drop takes* lists the MLPs each drop takes).",
          {"dense": "full (= dense)"}),
    Table("effir-t3", "EffiR Table 3: coarse-to-fine (15M + 30% slimming) vs deeper dropping (19M)", "dense",
          ["dense", "t2-15m", "t2-19m", "effir"],
          "Speed-ups: `dsprune bench` of each model against the full SmolLM2 in one process.",
          {"dense": "full (= dense)", "t2-15m": "EffiR-15M", "t2-19m": "EffiR-19M"}),
    Table("effir-t3-mild", "EffiR Table 3 at a milder point: 4M + 15% slimming vs 8M", "dense",
          ["dense", "t2-8m", "effir-4m"],
          "The same comparison where SmolLM2 still trains under the dense budget (the rows with 15 MLPs dropped do "
          "not, with or without the first 4 layers protected: Table 2). Slimming 15% of "
          "the 26 kept MLPs' neurons removes about 4 MLPs' worth, so EffiR-4M and Drop-8M have about the same "
          "size; EffiR-4M's training starts from neurons its slimming gates chose by training on the task, so "
          "this is no verdict (*Checks*).",
          {"dense": "full (= dense)"}),
    Table("effir-distill", "The collapsed rows again, recovered by self-distillation from the dense retriever",
          "dense", ["dense", "untrained", "t2-15m", "sd-15m", "effir", "sd-effir"],
          "Drop-15M and EffiR (15M + slim 30%) drop the same MLPs of SmolLM2 as in Table 2 / Table 3, then recover "
          "by the dense budget's InfoNCE LoRA training or by distillation from a dense retriever (*Scaled "
          "settings*: distillation). The self-distilled rows ran as rows of their own: their mined groups and, "
          "for the slimmed row, its slimming gates and mask were made again, and their teacher is the dense model "
          "the grid's inputs held then, whose fingerprint the row file keeps (*Checks* compares the pairs' "
          "structure and warns when a teacher is not the dense row). The InfoNCE rows never see a teacher; that "
          "is the point of the comparison and also its confound: the distilled rows learn from a model trained "
          "on the same texts. *untrained* shows where a collapse lies.",
          {"t2-15m": "Drop-15M, InfoNCE",
           "effir": "EffiR (15M + slim 30%), InfoNCE"}),
    Table("gaprune-t1", "GAPrune Table 1: one-shot MLP pruning of the dense retriever", "dense",
          ["dense"] + [f"gap-{m}-{p}" for p in (30, 50) for m in GAP_METHODS] + ["gap-daibal-50"],
          "Unstructured masks over the MLP weights (global budget), written as zeros: no size or speed change. "
          "FinanceBench is the domain, SciFact the general side (an in-domain one here: see *SciFact is an "
          "in-domain evaluation here*); DAI sees FinanceBench *train* questions only. Each DAI label names its "
          "alignment, read from the row's commands: *consistency* is this project's reading, not the paper's "
          "Eq. 4 (*DAI modes against magnitude* compares them). *DAI, Fisher balanced* (beyond the paper): Eq. 5 "
          "with both Fisher terms rescaled so that the Fisher term's mean size equals γ·√|θ|'s."),
    Table("gaprune-t2", "GAPrune Table 2: 50% masks, then retraining on FinanceBench train", "gap-dense-retrain",
          ["dense", "gap-dense-retrain"] + [f"gap-{m}-50-retrain" for m in ("dai", "magnitude", "fisher")],
          "Reference: the dense retriever given the same retraining without a mask, so every retrained row has "
          "the same training budget (the paper compares with the un-retrained dense model, also shown)."),
    Table("gaprune-t1-ft", "GAPrune Table 1 on the finance-aware retriever: one-shot 50% MLP pruning",
          "gap-dense-retrain", ["dense", "gap-dense-retrain"] + [f"gapft-{m}-50" for m in
                                                                 ("dai", "daibal", "magnitude", "fisher", "random")],
          "The same one-shot masks, computed on and applied to `gap-dense-retrain` (the dense retriever after 40 LoRA "
          "steps on FinanceBench train, one seed), which scores far above the dense one on FinanceBench; on the dense "
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

