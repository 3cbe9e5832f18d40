"""A trained embedder made k× faster and recovered by self-distillation: how much quality does it keep?

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/compress_embedder.py > out/ce.log 2>&1 &

Runs ``recipes/compress-embedder.yaml`` (score → plan → drop → distill → eval → bench → report) on
EmbeddingGemma-300M (``$DSPRUNE_MODELS/embeddinggemma-300m``; ``../shared/models/get-embeddinggemma.sh``
fetches it) into ``out/recipes/compress-embedder``, where finished stages are reused, so an interrupted run
resumes. Keeps the recipe's report (every model against the unpruned one, paired bootstrap intervals), the
plan, the distillation's settings and losses, the stage times and the command as
``benchmarks/results/compress_embedder.json``, prints the table and re-renders RESULTS.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (REPO, collect_recipe, keep_results, kept_scores, link_finished_stage,  # noqa: E402
                                machine_bench, recipe_command, recipe_parser, rerender, run_recipe_command,
                                tensorboard_scalars)
from benchmarks.grid import render  # noqa: E402
from benchmarks.grid.render_seeds import TARGET  # noqa: E402
from dsprune import formats  # noqa: E402
from dsprune.recipe import load_recipe  # noqa: E402
from dsprune.report import compare  # noqa: E402

RECIPE = REPO / "recipes" / "compress-embedder.yaml"
OUT = REPO / "out" / "recipes" / "compress-embedder"
NAME = "compress_embedder"


def plan_rows(plan: str, suffix: str = "", untrained: bool = True) -> dict:
    """A milder plan's row labels (its distillation through LoRA, and that model in int8 and bfloat16); a run
    that shares its untrained model with another names no ``drop only`` row."""
    rows = {"drop + distill": f"{plan} plan: drop + distill (LoRA){suffix}", "drop only": f"{plan} plan: drop only",
            "drop + distill + int8": f"{plan} plan: drop + distill (LoRA) + int8{suffix}",
            "drop + distill + bf16": f"{plan} plan: drop + distill (LoRA) + bf16{suffix}"}
    return rows if untrained else {k: v for k, v in rows.items() if k != "drop only"}


# the same recipe with one stage option changed; its model rows join the main table in RESULTS.md
VARIANTS = {"last": {"label": "drop-last-k", "set": {"plan.order": "last"},
                     "rows": {"drop + distill": "drop-last-k + distill", "drop only": "drop-last-k only"}},
            "1.5x": {"label": "1.5× plan", "set": {"plan.target_speedup": 1.5},
                     "rows": {"drop + distill": "1.5× plan: drop + distill", "drop only": "1.5× plan: drop only"}},
            # EffiR Table 3's pair at the same target: fewer drops + self-slimming against the main run's deeper drop
            "slim": {"label": "coarse drop + slim", "recipe": "recipes/compress-embedder-slim.yaml", "set": {},
                     "rows": {"drop + distill": "drop + slim + distill", "drop only": "drop + slim only"}},
            # the same plan and drop, another distillation seed: only the trained row is new
            "seed2": {"label": "second training seed", "base": "", "set": {"distill.seed": 43},
                      "rows": {"drop + distill": "drop + distill, seed 43"}, "share": ("plan", "drop", "eval-drop")},
            # EffiR's and the grid's recovery instead of the distillation: InfoNCE on the labelled groups the
            # distillation also reads (1 judged passage + 1 mined negative), LoRA r=32 alpha=64, 8 queries per rank;
            # 150 steps (the grid's budget is one epoch of 400 groups, 25 steps of 16), about the distillation's
            # length, with FinanceBench test scored every 25 steps (the learning curve against the distillation's)
            "infonce": {"label": "InfoNCE LoRA recovery", "recovery": "InfoNCE LoRA",
                        "set": {"distill.mode": "train", "distill.teacher": None, "distill.distill_data": None,
                                "distill.train_data": ["${mine}/groups.jsonl", "${mine-fin}/groups.jsonl"],
                                "distill.group_size": 2, "distill.per_device_batch_size": 8, "distill.lora": True,
                                "distill.lora_r": 32, "distill.lora_alpha": 64, "distill.freeze": None,
                                "distill.gradient_checkpointing": True, "distill.max_steps": 150,
                                "distill.eval_steps": 25, "distill.save_steps": 100},
                        "rows": {"drop + distill": "drop + InfoNCE LoRA"}, "share": ("plan", "drop", "eval-drop")},
            # the distillation with the InfoNCE run's LoRA (r=32, alpha=64) instead of full parameters: of the ways
            # the two recoveries differ, this isolates the parameters trained; ``versus`` pairs it with the InfoNCE run
            "distill-lora": {"label": "distillation through LoRA", "set": {
                                 "distill.lora": True, "distill.lora_r": 32, "distill.lora_alpha": 64,
                                 "distill.freeze": None, "distill.gradient_checkpointing": True},
                             "rows": {"drop + distill": "drop + distill (LoRA)"},
                             "share": ("plan", "drop", "eval-drop"), "versus": ("infonce",)},
            # the main plan's distillation run longer (its curve still rises at 140 steps) over more unlabelled text:
            # every SciFact abstract besides the recipe's texts, so about 4 passes over the data instead of 12;
            # checkpoints every 50 steps, so the ~6 h run can go in pieces (the recipe resumes it); its monitor
            # truncates as the evaluation does, so its curve reads on the tables' scale
            "long": {"label": "longer distillation", "set": {
                         "distill.max_steps": 1000, "distill.eval_steps": 100, "distill.save_steps": 50,
                         "distill.eval_max_length": 128,
                         "distill.distill_data": ["${mine}/groups.jsonl", "${mine-fin}/groups.jsonl",
                                                  "passages=financebench/corpus.jsonl", "passages=scifact/corpus.jsonl"]},
                     "rows": {"drop + distill": "drop + distill, 1000 steps"}, "share": ("plan", "drop", "eval-drop")},
            # a milder plan, recovered as the best 2x run was (distillation through LoRA), so that int8 Linear layers
            # on top (the recipe's eval-int8 / bench-int8) can make up the rest of 2x on a CPU; its plan differs from
            # the main run's, so its models are not paired with the main run's
            "1.6x-lora": {"label": "1.6× plan, distillation through LoRA", "pair_main": False, "set": {
                              "plan.target_speedup": 1.6, "distill.lora": True, "distill.lora_r": 32,
                              "distill.lora_alpha": 64, "distill.freeze": None, "distill.gradient_checkpointing": True},
                          "rows": plan_rows("1.6×")},
            # milder still, so that bfloat16 on a CPU with bfloat16 units (the recipe's eval-bf16 / bench-bf16) makes
            # up the rest of 2x at less cost to quality: the 1.6x run's LoRA distillation and data, with no gradient
            # checkpointing (it recomputes every forward; batches of 16 short texts fit without it), which changes
            # the step's speed, not its arithmetic
            "1.15x-lora": {"label": "1.15× plan, distillation through LoRA", "pair_main": False, "set": {
                               "plan.target_speedup": 1.15, "distill.lora": True, "distill.lora_r": 32,
                               "distill.lora_alpha": 64, "distill.freeze": None,
                               "distill.gradient_checkpointing": False},
                           "rows": plan_rows("1.15×")},
            # the 1.6x run's plan and LoRA distillation, longer (its curve flattens at 140 steps only as the learning
            # rate decays) and over more unlabelled text: every SciFact abstract and the MS MARCO subset's passages,
            # the corpus the table's MS MARCO column retrieves from, which the recipe's text lacks; checkpoints every
            # 50 steps for a run in pieces, the monitor truncated as the evaluation is; no gradient checkpointing
            # (batches of 16 short texts fit without it, and it recomputes every forward); ``versus`` pairs it with
            # the 140-step run at the same seed
            "1.6x-lora-long": {"label": "1.6× plan, distillation through LoRA, 600 steps", "pair_main": False,
                               "share_from": "1.6x-lora", "share": ("plan", "drop", "eval-drop"),
                               "versus": ("1.6x-lora",),
                               "rows": plan_rows("1.6×", ", 600 steps", untrained=False)},
            # the 1.15x run's plan and LoRA distillation at the same step count and seed over wider unlabelled text
            # (the 1.6x-lora-long run's: every SciFact abstract and the MS MARCO subset's passages, the corpus
            # where the 1.15x run lost most), so that the text is the one change and ``versus`` pairs the two;
            # the monitor truncated as the evaluation is
            "1.15x-lora-wide": {"label": "1.15× plan, distillation through LoRA, wider text", "pair_main": False,
                                "share_from": "1.15x-lora", "share": ("plan", "drop", "eval-drop"),
                                "versus": ("1.15x-lora",),
                                "rows": plan_rows("1.15×", ", wider text", untrained=False)},
            # milder again (the four last attention sub-layers and the last MLP), so that bfloat16 carries more of
            # 2x at a smaller loss: the 1.15x run's LoRA distillation, data and seed, whose untrained stages outside
            # the plan it shares; ``versus`` pairs the two plans' distilled models per query
            "1.1x-lora": {"label": "1.1× plan, distillation through LoRA", "pair_main": False,
                          "share_from": "1.15x-lora", "versus": ("1.15x-lora",), "rows": plan_rows("1.1×")},
            # the 1.1x run's distillation four times as long (its cosine loss still falls at 140 steps, under a
            # learning rate decayed to 0): the same plan, text, LoRA and seed; checkpoints every 35 steps, so the
            # ~3 h run can go in pieces; ``versus`` pairs it with the 140-step run, same seed
            "1.1x-lora-long": {"label": "1.1× plan, distillation through LoRA, 560 steps", "pair_main": False,
                               "share_from": "1.1x-lora", "share": ("plan", "drop", "eval-drop"),
                               "versus": ("1.1x-lora",), "rows": plan_rows("1.1×", ", 560 steps", untrained=False)},
            # the same three-fold longer distillation trained in bfloat16: ~1.6x the steps per hour on a CPU with
            # bfloat16 matrix units, so 420 steps fit where 560 float32 ones do not; its float32 rows score the
            # bfloat16 weights it exports, so against the 140-step run both length and training precision differ
            "1.1x-lora-long-bf16": {"label": "1.1× plan, distillation through LoRA in bfloat16, 420 steps",
                                    "pair_main": False, "share_from": "1.1x-lora", "share": ("plan", "drop", "eval-drop"),
                                    "versus": ("1.1x-lora",),
                                    "rows": plan_rows("1.1×", ", bf16-trained, 420 steps", untrained=False)},
            # the bfloat16 420-step run twice as long (its monitor still rose at step 420 in both seeds): the same
            # plan, text, LoRA and seed, a learning rate that decays over 840 steps; checkpoints every 35 steps, so
            # the run can go in pieces; nothing pairs it with the 420-step run, whose models are no longer on disk
            "1.1x-lora-longer-bf16": {"label": "1.1× plan, distillation through LoRA in bfloat16, 840 steps",
                                      "pair_main": False, "share_from": "1.1x-lora",
                                      "share": ("plan", "drop", "eval-drop"),
                                      "rows": plan_rows("1.1×", ", bf16-trained, 840 steps", untrained=False)},
            # a variant's second seed: its ``base`` run's recipe and options, and its untrained stages; ``versus``
            # pairs its trained model with other runs' at the same seed (the comparisons its base makes at 42)
            "last-seed2": {"label": "drop-last-k, second training seed", "base": "last", "set": {"distill.seed": 43},
                           "rows": {"drop + distill": "drop-last-k + distill, seed 43"},
                           "share": ("plan", "drop", "eval-drop"), "versus": ("seed2",)},
            "slim-seed2": {"label": "coarse drop + slim, second training seed", "base": "slim",
                           "set": {"distill.seed": 43}, "rows": {"drop + distill": "drop + slim + distill, seed 43"},
                           "share": ("plan", "drop", "slim", "mask", "export-mask", "eval-drop"), "versus": ("seed2",)},
            "infonce-seed2": {"label": "InfoNCE LoRA recovery, second training seed", "base": "infonce",
                              "set": {"distill.seed": 43}, "rows": {"drop + distill": "drop + InfoNCE LoRA, seed 43"},
                              "share": ("plan", "drop", "eval-drop"), "versus": ("seed2",)},
            "1.6x-lora-seed2": {"label": "1.6× plan, distillation through LoRA, second training seed",
                                "base": "1.6x-lora", "set": {"distill.seed": 43},
                                "rows": plan_rows("1.6×", ", seed 43", untrained=False),
                                "share": ("plan", "drop", "eval-drop")},
            "1.15x-lora-seed2": {"label": "1.15× plan, distillation through LoRA, second training seed",
                                 "base": "1.15x-lora", "set": {"distill.seed": 43},
                                 "rows": plan_rows("1.15×", ", seed 43", untrained=False),
                                 "share": ("plan", "drop", "eval-drop")},
            "1.1x-lora-seed2": {"label": "1.1× plan, distillation through LoRA, second training seed",
                                "base": "1.1x-lora", "set": {"distill.seed": 43},
                                "rows": plan_rows("1.1×", ", seed 43", untrained=False),
                                "share": ("plan", "drop", "eval-drop"), "versus": ("1.15x-lora-seed2",)},
            "1.1x-lora-long-seed2": {"label": "1.1× plan, distillation through LoRA, 560 steps, second training seed",
                                     "base": "1.1x-lora-long", "set": {"distill.seed": 43},
                                     "rows": plan_rows("1.1×", ", 560 steps, seed 43", untrained=False),
                                     "share": ("plan", "drop", "eval-drop"), "versus": ("1.1x-lora-seed2",)},
            "1.1x-lora-long-bf16-seed2": {"label": "1.1× plan, distillation through LoRA in bfloat16, 420 steps, "
                                                   "second training seed",
                                          "base": "1.1x-lora-long-bf16", "set": {"distill.seed": 43},
                                          "rows": plan_rows("1.1×", ", bf16-trained, 420 steps, seed 43",
                                                            untrained=False),
                                          "share": ("plan", "drop", "eval-drop"), "versus": ("1.1x-lora-seed2",)},
            "1.1x-lora-longer-bf16-seed2": {"label": "1.1× plan, distillation through LoRA in bfloat16, 840 steps, "
                                                     "second training seed",
                                            "base": "1.1x-lora-longer-bf16", "set": {"distill.seed": 43},
                                            "rows": plan_rows("1.1×", ", bf16-trained, 840 steps, seed 43",
                                                              untrained=False),
                                            "share": ("plan", "drop", "eval-drop")},
            "1.15x-lora-wide-seed2": {"label": "1.15× plan, distillation through LoRA, wider text, "
                                               "second training seed",
                                      "base": "1.15x-lora-wide", "set": {"distill.seed": 43},
                                      "rows": plan_rows("1.15×", ", wider text, seed 43", untrained=False),
                                      "share": ("plan", "drop", "eval-drop"), "versus": ("1.15x-lora-seed2",)},
            # EffiR Table 3's pair with the better recovery on both sides: the coarse drop + slim recovered by the
            # distillation through LoRA, ``versus`` the deeper drop recovered the same way at the same seed (the
            # runs whose models they pair must be on disk, or their results keep per-query scores)
            # its base shares the untrained stages; it trains another way, so it is its own family, no seed of it
            "slim-lora": {"label": "coarse drop + slim, distillation through LoRA", "base": "slim", "family": "slim-lora",
                          "pair_main": False,
                          "set": {},           # the distillation through LoRA's options, set below
                          "rows": {"drop + distill": "drop + slim + distill (LoRA)", "drop only": "drop + slim only"},
                          "share": ("plan", "drop", "slim", "mask", "export-mask", "eval-drop"),
                          "versus": ("distill-lora-rerun",)},
            "slim-lora-seed2": {"label": "coarse drop + slim, distillation through LoRA, second training seed",
                                "base": "slim-lora", "pair_main": False, "set": {"distill.seed": 43},
                                "rows": {"drop + distill": "drop + slim + distill (LoRA), seed 43"},
                                "share": ("plan", "drop", "slim", "mask", "export-mask", "eval-drop"),
                                "versus": ("distill-lora-seed2-rerun",)},
            "distill-lora-seed2": {"label": "distillation through LoRA, second training seed", "base": "distill-lora",
                                   "set": {"distill.seed": 43},
                                   "rows": {"drop + distill": "drop + distill (LoRA), seed 43"},
                                   "share": ("plan", "drop", "eval-drop"), "versus": ("seed2", "infonce-seed2")}}
VARIANTS["1.6x-lora-long"]["set"] = {
    **VARIANTS["1.6x-lora"]["set"], "distill.gradient_checkpointing": False, "distill.max_steps": 600,
    "distill.eval_steps": 100, "distill.save_steps": 50, "distill.eval_max_length": 128,
    "distill.distill_data": [*VARIANTS["long"]["set"]["distill.distill_data"],
                             "passages=msmarco_trecdl_subset/corpus.jsonl"]}
VARIANTS["slim-lora"]["set"] = VARIANTS["distill-lora"]["set"]


# the distilled model in another number format: results key -> its eval and bench stages
PRECISIONS = {"int8": ("eval-int8", "bench-int8"), "bf16": ("eval-bf16", "bench-bf16")}


def rerun(variant: str) -> dict:
    """``variant`` again, same options and seed, for the per-query scores its results did not keep (its folder is
    gone); training on another CPU need not repeat to the bit, so it is a run of its own, paired with no run made
    before per-query scores were kept."""
    v = VARIANTS[variant]
    trained = v["rows"]["drop + distill"]
    model, comma, rest = trained.partition(", ")          # "drop + distill (LoRA)", ", ", "seed 43"
    formats_ = {f"drop + distill + {key}": f"{model} + {key}{comma}{rest}, run again" for key in PRECISIONS}
    # its seeds group with each other (slim-lora's pairs with them span two seeds), not with the runs they repeat
    return {"label": f"{v['label']}, run again", "base": variant, "pair_main": False, "set": {},
            "family": f"{v.get('base') or variant}-rerun",
            "rows": {"drop + distill": f"{trained}, run again", **formats_}, "share": v.get("share", ())}


# slim-lora and slim-lora-seed2 pair with these
VARIANTS.update({f"{v}-rerun": rerun(v) for v in ("distill-lora", "distill-lora-seed2")})
# a deeper drop whose measured speed is about the slimmed model's (slim-lora at its seed), paired with it per
# query: EffiR's Table 3 asks whether slimming beats dropping at equal speed, not only at equal FLOPs. Its seed-43
# run has the same plan, so it lends the untrained stages.
VARIANTS["1.6x-lora-rerun"] = {**rerun("1.6x-lora"), "share_from": "1.6x-lora-seed2",
                               "share": ("plan", "drop", "eval-drop"), "versus": ("slim-lora",)}
VARIANTS["1.6x-lora-seed2"]["versus"] = ("slim-lora-seed2",)
VARIANTS["1.15x-lora-wide"]["set"] = {
    **VARIANTS["1.15x-lora"]["set"], "distill.eval_max_length": 128,
    "distill.distill_data": VARIANTS["1.6x-lora-long"]["set"]["distill.distill_data"]}
VARIANTS["1.1x-lora"]["set"] = {**VARIANTS["1.15x-lora"]["set"], "plan.target_speedup": 1.1}
VARIANTS["1.1x-lora-long"]["set"] = {**VARIANTS["1.1x-lora"]["set"], "distill.max_steps": 560, "distill.eval_steps": 70,
                                     "distill.eval_max_length": 128}
VARIANTS["1.1x-lora-long-bf16"]["set"] = {**VARIANTS["1.1x-lora"]["set"], "distill.dtype": "bfloat16",
                                          "distill.max_steps": 420, "distill.eval_steps": 140,
                                          "distill.eval_max_length": 128}
VARIANTS["1.1x-lora-longer-bf16"]["set"] = {**VARIANTS["1.1x-lora-long-bf16"]["set"], "distill.max_steps": 840}
# stages a variant can take from the main run as they are: they read no stage the variant changes
SHARED_STAGES = ("score", "mine", "mine-fin", "eval-full", "eval-minilm", "bench-minilm")
# the pair that says whether the distillation recovers anything, paired per query within one run
RECOVERY = ("eval", "eval-drop")
# the evaluation stages whose models a variant's ``rows`` may name, by the main run's label of each
ROW_STAGES = (("eval", "drop + distill"), ("eval-drop", "drop only"), ("eval-int8", "drop + distill + int8"),
              ("eval-bf16", "drop + distill + bf16"))
# the evaluations another run pairs its models with: their per-query scores are kept in the results
KEPT = ("eval", "eval-drop")
# the pruned model timed against the unpruned one with both in that number format: results key -> its bench stage
# (a recipe run before the stage existed lacks it, so its results leave it out)
BOTH = {"bf16": "bench-bf16-both"}


def base_of(variant: str) -> str:
    return VARIANTS[variant].get("base", "") if variant else ""


def sets_of(variant: str) -> dict:
    return {**sets_of(base_of(variant)), **VARIANTS[variant]["set"]} if variant else {}


def labels_of(variant: str) -> dict:
    """The main recipe's row labels -> this run's."""
    return VARIANTS[variant]["rows"] if variant else {"drop + distill": "drop + distill", "drop only": "drop only"}


def out_of(variant: str) -> Path:
    return OUT.with_name(f"{OUT.name}-{variant}") if variant else OUT


def name_of(variant: str) -> str:
    return f"{NAME}_{variant}" if variant else NAME


def recipe_of(variant: str) -> Path:
    if variant and "recipe" in VARIANTS[variant]:
        return REPO / VARIANTS[variant]["recipe"]
    return recipe_of(base_of(variant)) if base_of(variant) else RECIPE


def left_out(without: tuple[str, ...] | list[str]) -> list[str]:
    """The stages of the number formats ``without`` names (keys of ``PRECISIONS``)."""
    return [s for key in without for s in (*PRECISIONS[key], *([BOTH[key]] if key in BOTH else []))]


def stages_run(variant: str, without: tuple[str, ...] | list[str], stages=None) -> list[str] | None:
    """The stages a run that leaves ``without``'s number formats out runs (None: every stage); ``stages``: the
    variant's recipe stages, where the caller has loaded them already."""
    if not without:
        return None
    stages = stages if stages is not None else load_recipe(recipe_of(variant))[1]
    return [s.name for s in stages if s.name not in left_out(without)]


def command(params: dict, variant: str = "", without: tuple[str, ...] | list[str] = ()) -> list[str]:
    """The variant's ``dsprune run``; ``without`` leaves number formats out: their stages are not run (``--only``
    the others) and the report stage reads the rest only."""
    if not without:
        return recipe_command(recipe_of(variant), out_of(variant), params, sets_of(variant))
    _, stages = load_recipe(recipe_of(variant))
    report = next(s for s in stages if s.name == "report").args
    gone = {f"${{{s}}}" for s in left_out(without)}
    kept = [(r, label) for r, label in zip(report["results"], report["labels"]) if r not in gone]
    sets = {**sets_of(variant), "report.results": [r for r, _ in kept], "report.labels": [label for _, label in kept],
            "report.bench": [b for b in report.get("bench", []) if b not in gone]}
    return recipe_command(recipe_of(variant), out_of(variant), params, sets) + [
        "--only", *stages_run(variant, without, stages)]


def share_finished_stages(variant: str) -> None:
    """Hard-link the finished stages that the variant would compute identically, from its base run, or the run
    its ``share_from`` names (the recipe then finds their stamps and reuses them). The untrained stages every run
    shares come from the main run (or another variant) only where the base run lacks them: the base's later
    stages (plan, drop) name the copies they read, and a stage that read another run's copy is rerun."""
    base = out_of(VARIANTS[variant].get("share_from", base_of(variant)))
    for name, src in ([(n, shared_copy(n, base)) for n in SHARED_STAGES]
                      + [(n, base / n) for n in VARIANTS[variant].get("share", ())]):
        link_finished_stage(src, out_of(variant) / name)


def shared_copy(name: str, base: Path) -> Path:
    """The finished copy of an untrained stage every run shares: the base run's, else the main run's, else any
    other variant's (a new machine has only the runs made on it, and these stages take the better part of an
    hour); the recipe reuses it only where its fingerprint matches."""
    for run in (base, OUT, *sorted(OUT.parent.glob(f"{OUT.name}-*"))):
        if (run / name / "stage.json").is_file():
            return run / name
    return OUT / name


def distill_summary(run: Path) -> dict:
    """What the distillation did: its settings, step count, first/last losses and the in-training scores
    (``eval_ndcg_at_10`` rows: the learning curve) from its own log."""
    man = formats.read_json(run / "manifest.json", "distill manifest")
    log = formats.read_jsonl(run / "log.jsonl")
    rows = [r for r in log if "loss" in r]
    spans = pieces(run)
    keep = ("loss", "loss_cosine", "loss_kl", "loss_infonce")
    cfg = man.get("config", {})
    return {"config": {k: cfg.get(k) for k in
                       ("mode", "distill_data", "train_data", "group_size", "per_device_batch_size", "num_epochs",
                        "max_steps", "learning_rate", "warmup_steps", "lora", "lora_r", "lora_alpha", "freeze",
                        "passage_max_length", "query_max_length", "temperature", "distill_embed_weight",
                        "distill_kl_weight", "infonce_weight", "eval_task", "eval_split", "eval_max_length", "seed")},
            "distill": man.get("distill"), "steps": len(rows),
            "first": {k: rows[0].get(k) for k in keep} if rows else None,
            "last": {k: rows[-1].get(k) for k in keep} if rows else None,
            "curve": curve(log, spans),
            # a stage resumed in a later process has its last process's seconds only in the recipe's stamp;
            # the processes' own spans (start-up and the pauses between them left out) say what it cost
            "processes": [round(end - start, 1) for _, start, end in spans]}


def pieces(run: Path) -> list[tuple[dict, float, float]]:
    """The processes a training stage ran in (one TensorBoard events file each, more when it resumed from a
    checkpoint): each one's scalars and its first and last event's wall time."""
    tb = run / "tensorboard"
    found = []
    for piece in sorted(tb.glob("events.out.tfevents.*")) if tb.is_dir() else []:
        scalars = {tag: events for tag, events in tensorboard_scalars(piece).items() if events}
        if scalars:
            found.append((scalars, min(e[0].wall_time for e in scalars.values()),
                          max(e[-1].wall_time for e in scalars.values())))
    return found


def curve(log: list[dict], spans: list[tuple[dict, float, float]]) -> list[dict]:
    """The trainer's in-run scores, each with the seconds of training since the run's first TensorBoard event
    (its step-0 evaluation, before any training), so that recoveries of different step costs meet at equal
    time. A run resumed in another process wrote another events file; the pause between the two is not
    training time, so each piece counts from its own first event, after the whole of the pieces before it."""
    points = [{"step": r["step"], "ndcg_at_10": r["eval_ndcg_at_10"]} for r in log if "eval_ndcg_at_10" in r]
    at: dict[int, float] = {}
    before = 0.0
    for scalars, start, end in spans:
        at.update({e.step: before + e.wall_time - start for e in scalars.get("eval/ndcg_at_10", [])})
        before += end - start
    return [{**p, **({"seconds": round(at[p["step"]], 1)} if p["step"] in at else {})} for p in points]


def collect(params: dict, out: Path, results: Path, variant: str = "", main: Path | None = None,
            without: tuple[str, ...] | list[str] = ()) -> Path:
    gone = left_out(without)
    rerun = "benchmarks/compress_embedder.py" + (f" --variant {variant}" if variant else "") + (
        f" --without {' '.join(without)}" if without else "")
    doc = {"title": "EmbeddingGemma-300M compressed to a target speed-up, recovered by self-distillation",
           **collect_recipe(recipe_of(variant), params, out, command(params, variant, without), rerun,
                            only=stages_run(variant, without)),
           "variant": variant_entry(variant) if variant else None,
           **({"left_out": {"formats": list(without), "stages": gone}} if gone else {})}
    plan = formats.read_json(out / "plan" / "plan.json", "plan")
    doc["plan"] = {k: plan.get(k) for k in ("target_speedup", "seq_len", "attn", "mlp", "slim_ratio",
                                            "flop_ratio", "num_layers")}
    slimmed = out / "export-mask" / "manifest.json"
    if slimmed.is_file():      # which neurons the slimming kept: seeds and CPUs may rank the gates apart
        doc["plan"]["intermediate_sizes"] = formats.read_json(slimmed, "export manifest")["structure"][
            "intermediate_sizes"]
    doc["distill"] = distill_summary(out / "distill")
    bench = out / "bench" / "bench.json"
    bench = formats.read_json(bench, "bench") if bench.is_file() else {}
    doc["bench_pairs"] = {k: bench[k]["speedup_pairs"] for k in ("document", "query")
                          if "speedup_pairs" in bench.get(k, {})}
    if "machine" in bench:
        doc["bench_machine"] = bench["machine"]
    for key, (evaluated, benched) in PRECISIONS.items():
        doc[key] = None
        if (out / benched / formats.BENCH).is_file():
            doc[key] = {**machine_bench(out / benched), "against_float": paired(out / "eval", out / evaluated)}
            if key in BOTH and (out / BOTH[key] / formats.BENCH).is_file():
                doc[key]["both"] = {**machine_bench(out / BOTH[key]), "stage": BOTH[key]}
    doc["recovery"] = recovery(out)
    dest = results / f"{name_of(variant)}.json"
    kept = formats.read_json(dest, "compress-embedder results") if dest.is_file() else {}
    before = kept if same_models(kept, doc) else {}
    if variant and VARIANTS[variant].get("pair_main", True):
        main = main or out_of(base_of(variant))
        found = {stage: main_results(main, base_of(variant), stage, results) for stage, _ in main_pairs(variant)}
        if all(x is not None for x in found.values()):
            doc["against_main"] = against_main(found, out, variant)
        elif "against_main" in before:
            doc["against_main"] = before["against_main"]
            doc.setdefault("paired_before", {})["against_main"] = before.get("code_version")
        else:   # the run's own models still stand; only this pairing waits for the other run again
            base = base_of(variant)
            doc["against_main"] = None
            doc.setdefault("unpaired", {})["against_main"] = (
                f"its run folder {main.name} is gone and {name_of(base)}.json keeps no per-query scores of "
                f"{', '.join(s for s, x in found.items() if x is None)}; run `benchmarks/compress_embedder.py"
                f"{' --variant ' + base if base else ''}` again to pair")
            print(f"note: not paired with {base or 'the main run'}: {doc['unpaired']['against_main']}",
                  file=sys.stderr)
    if variant and "versus" in VARIANTS[variant]:
        kept_versus = before.get("versus") or {}
        doc["versus"] = versus(out, variant, results, kept_versus)
        carried = [run for run, x in doc["versus"].items() if x is kept_versus.get(run)]
        if carried:
            doc.setdefault("paired_before", {})["versus"] = {"runs": carried,
                                                             "code_version": before.get("code_version")}
    doc["per_query"] = {stage: kept_scores(out / stage) for stage in KEPT if (out / stage / formats.RESULTS).is_file()}
    keep_version(doc, kept)
    return keep_results(doc, out, results, name_of(variant))


def same_models(kept: dict, doc: dict) -> bool:
    """Whether the results kept earlier describe this very run's models: the same training (steps, losses,
    in-run scores) and every report row scoring alike on every task. Then a pairing computed then still holds
    once the run it paired with is gone from out/."""
    def scores(d: dict) -> dict:
        return {r["label"]: {t: c.get("score") for t, c in r["tasks"].items()} for r in d["report"]["rows"]}

    return bool(kept.get("report")) and trained(kept.get("distill")) == trained(doc["distill"]) \
        and scores(kept) == scores(doc)


def variant_entry(variant: str) -> dict:
    """The variant as its results describe it; a second seed trains as its base does, so it names the base's
    recovery."""
    base = VARIANTS.get(base_of(variant), {})
    return {"name": variant, **({"recovery": base["recovery"]} if "recovery" in base else {}), **VARIANTS[variant],
            "report_rows": report_rows(variant)}


def plot_runs(results: Path) -> None:
    """Every run's models on one quality-vs-speed front, and every run's learning curve against minutes."""
    from dsprune.report import figure, front
    runs = render.compress_runs(results)
    if runs is None:
        return
    main_doc, variants, table = runs
    if any("document" in (r.get("speed") or {}) for r in table["rows"]):
        front.plot(table, results / f"{NAME}_front.png", target=TARGET)
    plt = figure.pyplot()
    fig, (by_step, by_time) = plt.subplots(1, 2, figsize=(10, 4.2), sharey=True)
    cfg = main_doc["distill"]["config"]
    for doc in (main_doc, *variants):
        points = doc["distill"].get("curve") or []
        label = doc["variant"]["label"] if doc.get("variant") else "main run"
        # a monitor that truncates texts scores on another scale than one that does not
        length = doc["distill"]["config"].get("eval_max_length") or 0     # older runs do not record it: untruncated
        if length != (cfg.get("eval_max_length") or 0):
            label += f" (scored at {length} tokens)" if length else " (scored untruncated)"
        if points:
            line, = by_step.plot([c["step"] for c in points], [c["ndcg_at_10"] for c in points], "o-", label=label)
            timed = [c for c in points if "seconds" in c]
            by_time.plot([c["seconds"] / 60 for c in timed], [c["ndcg_at_10"] for c in timed], "o-",
                         color=line.get_color())
    by_step.set_xlabel("training step")
    by_time.set_xlabel("wall-clock minutes since the run's step-0 score")
    by_step.set_ylabel(f"nDCG@10, {cfg.get('eval_task')} {cfg.get('eval_split')}"
                       + (f", {cfg['eval_max_length']} tokens" if cfg.get("eval_max_length") else ""))
    fig.suptitle("recovery learning curves (2 CPU ranks; wall clock includes any other load on the machine)",
                 fontsize=9)
    for ax in (by_step, by_time):
        ax.grid(alpha=0.3)
    if by_step.get_legend_handles_labels()[0]:
        by_step.legend(fontsize=7)
        fig.tight_layout()
        figure.save_png(fig, results / f"{NAME}_curves.png")
    else:
        plt.close(fig)


def keep_version(doc: dict, old: dict) -> None:
    """Collecting a run again whose training is the one already kept (``old``: the results kept before, or {};
    new fields or stages added around the same distillation) keeps the code version that trained it, and names
    the one that collected it."""
    if old and trained(old.get("distill")) == trained(doc["distill"]) \
            and old.get("code_version") != doc["code_version"]:
        doc["recollected_by"] = doc["code_version"]
        doc["code_version"] = old.get("code_version")


def trained(summary: dict | None) -> tuple | None:
    """What identifies one training run in its summary (its losses and scores, not the fields kept of it)."""
    if not summary:
        return None
    return (summary.get("steps"), summary.get("first"), summary.get("last"),
            [(c["step"], c["ndcg_at_10"]) for c in summary.get("curve") or []])


def recovery(out: Path) -> dict:
    """The distilled model − the same pruned model without recovery, paired per query: the training's own
    effect in this run, at its seed."""
    return {"stages": list(RECOVERY), **paired(out / RECOVERY[1], out / RECOVERY[0])}


def paired(base: Path | dict, other: Path | dict) -> dict:
    """``other`` − ``base`` (eval folders, or results as ``eval_results`` gives them), paired per query: the mean
    over the tasks and each task."""
    docs = [x if isinstance(x, dict) else compare.read_results(x) for x in (base, other)]
    entries = [compare.Entry(label, Path(label), doc) for label, doc in zip(("base", "other"), docs)]
    row = compare.compare(entries)["rows"][1]
    return {"mean_delta": row.get("mean_delta"), "tasks": {t: c.get("delta") for t, c in row["tasks"].items() if c}}


def eval_results(run: str, stage: str, results: Path) -> dict | None:
    """A run's evaluation stage: its folder while on disk, else the per-query scores its results JSON kept, else
    None."""
    folder = out_of(run) / stage
    if (folder / formats.RESULTS).is_file():
        return compare.read_results(folder)
    kept = results / f"{name_of(run)}.json"
    doc = formats.read_json(kept, "results") if kept.is_file() else {}
    return (doc.get("per_query") or {}).get(stage)


def gone_error(run: str, stage: str, results: Path) -> SystemExit:
    folder, kept = out_of(run) / stage, results / f"{name_of(run)}.json"
    return SystemExit(f"error: {folder} is gone and {kept} keeps no per-query scores of it; run "
                      f"`benchmarks/compress_embedder.py{' --variant ' + run if run else ''}` again")


def main_results(main: Path, run: str, stage: str, results: Path) -> dict | None:
    """The main run's evaluation stage: from its folder ``main`` while on disk, else the per-query scores its
    results JSON kept, else None."""
    if (main / stage / formats.RESULTS).is_file():
        return compare.read_results(main / stage)
    return eval_results(run, stage, results)


def against_main(found: dict, out: Path, variant: str) -> dict:
    """A variant's models paired per query with the main run's models of the same stage (``found``: stage ->
    its results; the question is the variant against the main run, which two intervals to the unpruned model
    do not answer)."""
    base = labels_of(base_of(variant))
    return {VARIANTS[variant]["rows"][main_label]: {"against": base[main_label], "trained": stage == "eval",
                                                    **paired(found[stage], out / stage)}
            for stage, main_label in main_pairs(variant)}


def main_pairs(variant: str) -> list[tuple[str, str]]:
    """(eval stage, the main run's row label) of each model the variant has its own of; a model it shares with
    the run it is compared to is left out."""
    return [(stage, label) for stage, label in (("eval", "drop + distill"), ("eval-drop", "drop only"))
            if VARIANTS[variant]["rows"].get(label) is not None]


def versus(out: Path, variant: str, results: Path, before: dict) -> dict:
    """The variant's trained model − each ``versus`` run's (trained at the same seed), paired per query; keyed
    by that run. A run with neither its folder nor kept scores keeps the pairing in ``before`` (results kept
    earlier of this very model), if any."""
    label = VARIANTS[variant]["rows"]["drop + distill"]
    found = {}
    for run in VARIANTS[variant]["versus"]:
        other = eval_results(run, "eval", results)
        if other is None and run not in before:
            raise gone_error(run, "eval", results)
        found[run] = before[run] if other is None else {
            "label": label, "against": labels_of(run)["drop + distill"], "run": run, **paired(other, out / "eval")}
    return found


def report_rows(variant: str) -> dict:
    """The variant's report labels (its recipe's own) -> the labels its rows take in the main table."""
    _, stages = load_recipe(recipe_of(variant))
    report = next(s for s in stages if s.name == "report").args
    own = dict(zip(report["results"], report["labels"]))
    return {own[f"${{{stage}}}"]: VARIANTS[variant]["rows"][main_label]
            for stage, main_label in ROW_STAGES
            if main_label in VARIANTS[variant]["rows"] and f"${{{stage}}}" in own}


def main(argv: list[str] | None = None) -> int:
    ap = recipe_parser(__doc__, "model, target_speedup")
    ap.add_argument("--variant", default="", choices=["", *VARIANTS],
                    help="run the recipe with a variant's stage options into its own folder (finished stages "
                         "of the main run that it shares are reused)")
    ap.add_argument("--without", nargs="+", default=[], choices=list(PRECISIONS), metavar="FORMAT",
                    help="leave these number formats' stages and report rows out (int8, bf16): a CPU without "
                         "bfloat16 instructions computes bfloat16 matmuls far slower than float32, so its bf16 "
                         "evaluation would take hours")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    out = out_of(a.variant)
    if not a.collect:
        if a.variant:
            share_finished_stages(a.variant)
        run_recipe_command(command(params, a.variant, a.without), out, "")
    dest = collect(params, out, Path(a.results), a.variant, without=a.without)
    plot_runs(Path(a.results))
    print(compare.markdown(formats.read_json(dest, "results")["report"]))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
