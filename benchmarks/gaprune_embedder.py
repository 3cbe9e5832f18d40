"""GAPrune's Tables 1 and 2 on a trained embedder: which 50 % of EmbeddingGemma's MLP weights can go, as is and
after retraining on the domain?

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/gaprune_embedder.py > out/gae.log 2>&1 &

Runs ``recipes/gaprune-embedder.yaml`` (sample → DAI statistics, per sample and as the authors' code → one
mask per method → eval → the same LoRA retraining of every mask and of the unpruned model → eval → two
reports) into ``out/recipes/gaprune-embedder``. About 6 hours on 2 CPU cores; finished stages are reused, so
it can run in pieces (a retraining stage resumes from its last checkpoint), and ``--part oneshot`` runs and keeps
Table 1 alone, the stages up to ``report-oneshot``, so the one-shot half lands before the retraining is done.
``--param 'tasks=[scifact_small, financebench]'`` leaves the MS MARCO subset out of every evaluation, most of their
time. Keeps both reports (paired bootstrap intervals against the unpruned model, and against the unpruned model
retrained alike), each DAI mask − each baseline paired per query (GAPrune's own comparison), what the retraining
does to the unpruned model by itself, the retraining's settings, the structured mask's measured speed-up, each DAI
run's figures and where its β·F_gen outweighs F_dom, the share of each mask's keep/prune decisions that differ
from magnitude's, the stage times and the command as
``benchmarks/results/gaprune_embedder.json``, and re-renders RESULTS.md. ``--seed 43`` retrains every mask and
the control with a second training seed in ``out/recipes/gaprune-embedder-seed43`` (the one-shot stages, which
read no seed, hard-linked from the first run) and keeps ``gaprune_embedder_seed43.json``: a Table 2 verdict
needs both seeds. ``--calibration 1`` draws the calibration triplets again (seed 1 of the sample, dai and
dai-ref stages) into ``out/recipes/gaprune-embedder-calib1`` and keeps Table 1 of that draw as
``gaprune_embedder_calib1.json``: the masks that read no triplets (magnitude, Wanda, random) and the unpruned
model's evaluation are the first run's stages where its folder is still there, and a one-shot verdict needs both
draws; ``--without dai-ref`` leaves the authors'-code DAI run (statistics, mask, evaluation, row) out of a draw
that must fit in less time. ``--only STAGE ...`` runs those stages and collects nothing, to split a long run over
sittings.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (REPO, collect_recipe, keep_results, kept_scores, link_finished_stage,  # noqa: E402
                               recipe_command, recipe_parser, rerender, run_recipe_command)
from dsprune import formats  # noqa: E402
from dsprune.report import compare  # noqa: E402

RECIPE = REPO / "recipes" / "gaprune-embedder.yaml"
OUT = REPO / "out" / "recipes" / "gaprune-embedder"
NAME = "gaprune_embedder"
DAI_RUNS = ("dai", "dai-ref")
# GAPrune's claim is DAI against these: each DAI mask is compared with each, paired per query
DAI_MASKS = ("dai", "dai-ref", "dai-balanced", "dai-sign")
BASELINES = ("magnitude", "fisher", "wanda", "random")
# the stages that draw calibration triplets; their seed picks the draw
CALIBRATION = ("sample", "dai", "dai-ref")
DAI_FIGURES = ("n_general", "n_domain", "loss_general", "loss_domain", "mean_abs_fisher_term_over_magnitude_term")


RETRAINING = ("max_steps", "per_device_batch_size", "group_size", "lora_r", "lora_alpha", "learning_rate", "dtype",
              "seed", "passage_max_length", "query_max_length")


def oneshot_stages() -> list[str]:
    """Table 1's stages: everything the recipe runs before any retraining."""
    from dsprune.recipe import load_recipe

    _, stages = load_recipe(RECIPE)
    return [s.name for s in stages if "retrain" not in s.name]


def default_seed() -> int:
    """The recipe's own retraining seed (its ``seed`` param): the run with it keeps the plain names."""
    from dsprune.recipe import load_recipe

    doc, _ = load_recipe(RECIPE)
    return int(doc["params"]["seed"])


def run_of(seed: int, draw: int = 0) -> tuple[Path, str]:
    """Where the run with retraining ``seed`` or calibration ``draw`` lives and the name its results keep."""
    if draw:
        return OUT.with_name(f"{OUT.name}-calib{draw}"), f"{NAME}_calib{draw}"
    return ((OUT, NAME) if seed == default_seed() else
            (OUT.with_name(f"{OUT.name}-seed{seed}"), f"{NAME}_seed{seed}"))


def calibration_sets(draw: int) -> dict:
    """``--set`` values for calibration ``draw``: the seed of every stage that draws triplets (k-means seeding,
    random negatives). Draw 0 is the recipe's own (their default seed), so it sets nothing."""
    return {f"{name}.seed": draw for name in CALIBRATION} if draw else {}


def reads_calibration() -> set[str]:
    """The stages whose output depends on the calibration draw: the drawing stages and every stage reading one."""
    from dsprune.recipe import downstream, load_recipe

    return downstream(load_recipe(RECIPE)[1], set(CALIBRATION))


def left_out(without: tuple[str, ...]) -> set[str]:
    """The stages a draw run ``without`` some DAI statistics runs skips: those runs and what reads them, except
    Table 1's report, which is told to leave their rows out (``without_sets``)."""
    from dsprune.recipe import downstream, load_recipe

    return downstream(load_recipe(RECIPE)[1], set(without)) - {"report-oneshot"} if without else set()


def without_sets(without: tuple[str, ...]) -> dict:
    """``--set`` values for Table 1's report with the rows of the left-out stages removed."""
    if not without:
        return {}
    from dsprune.recipe import load_recipe, reads

    doc, _ = load_recipe(RECIPE)
    args = next(s for s in doc["stages"] if s["name"] == "report-oneshot")["args"]
    gone = left_out(without)
    kept = [(r, label) for r, label in zip(args["results"], args["labels"]) if not set(reads(r)) & gone]
    return {"report-oneshot.results": [r for r, _ in kept], "report-oneshot.labels": [label for _, label in kept]}


def command(params: dict, part: str = "all", out: Path = OUT, draw: int = 0,
            without: tuple[str, ...] = ()) -> list[str]:
    cmd = recipe_command(RECIPE, out, params, {**calibration_sets(draw), **without_sets(without)})
    gone = left_out(without)
    return cmd + ["--only", *(s for s in oneshot_stages() if s not in gone)] if part == "oneshot" else cmd


def share_oneshot(out: Path, draw: int = 0) -> None:
    """Another seed's run reuses the first run's finished one-shot stages: they read no training seed. Another
    calibration draw reuses only those that read no calibration triplets (magnitude, Wanda, random, the unpruned
    model)."""
    drawn = reads_calibration() if draw else set()
    for name in oneshot_stages():
        if name not in drawn:
            link_finished_stage(OUT / name, out / name)


def share_unpruned_eval(out: Path) -> None:
    """The unpruned model's evaluation is the same stage in recipes/compress-embedder.yaml: hard-link a finished one
    (the recipe reuses it only if its fingerprint, the same model, tasks and lengths, matches)."""
    for src in sorted(OUT.parent.glob("compress-embedder*/eval-full")):
        link_finished_stage(src, out / "eval-full")


def shared_with_first(out: Path) -> list[str]:
    """The stages ``out`` took from the first run (hard links of its finished folders) rather than ran: what a
    draw's table may call the first draw's rows."""
    from dsprune.recipe import STAMP

    return sorted(n for n in oneshot_stages() if out != OUT and (out / n / STAMP).is_file()
                  and (OUT / n / STAMP).is_file() and os.path.samefile(out / n / STAMP, OUT / n / STAMP))


def masks(out: Path) -> list[str]:
    return sorted(p.name[len("prune-"):] for p in out.glob("prune-*") if (p / formats.MASK).is_file())


def against_magnitude(out: Path) -> dict:
    """Per mask: the share of the scored weights whose keep/prune decision differs from magnitude's mask at the
    same sparsity (a mask that differs little cannot score far from magnitude), overall and per matrix kind."""
    from benchmarks.dai_modes import differs

    ref, _ = formats.read_mask(out / "prune-magnitude")
    found = {}
    for name in masks(out):
        tensors, meta = formats.read_mask(out / f"prune-{name}")
        if name == "magnitude" or meta.get("kind") == "structured":
            continue                  # a neuron mask removes whole rows: another budget, not comparable
        share, kinds = differs({k: v for k, v in tensors.items() if k in ref}, ref)
        found[name] = {"share": share, "kinds": kinds}
    return found


def paired(base: compare.Entry, other: compare.Entry) -> dict:
    """``other`` − ``base``, paired per query: the mean over the tasks and each task's."""
    row = compare.compare([base, other])["rows"][1]
    return {"mean_delta": row.get("mean_delta"), "tasks": {t: c["delta"] for t, c in row["tasks"].items() if c}}


def dai_against(out: Path, prefix: str) -> dict:
    """Each DAI mask − each baseline mask, both evaluated as ``out/<prefix><mask>``, paired per query: overall and
    per task. Masks not evaluated (a one-shot-only mask has no retrained evaluation) are left out."""
    names = [n for n in DAI_MASKS + BASELINES if (out / f"{prefix}{n}" / formats.RESULTS).is_file()]
    entries = dict(zip(names, compare.load_entries([str(out / f"{prefix}{n}") for n in names], [], names)))
    found = {}
    for dai in (d for d in DAI_MASKS if d in entries):
        for base in (b for b in BASELINES if b in entries):
            found.setdefault(dai, {})[base] = paired(entries[base], entries[dai])
    return found


def retraining_alone(out: Path) -> dict:
    """The unpruned model retrained − the unpruned model, paired per query: what the retraining on the domain does
    by itself, which moves the control every retrained mask is measured against."""
    base, retrained = compare.load_entries([str(out / "eval-full"), str(out / "eval-retrain-full")], [],
                                           ["unpruned", "unpruned, retrained"])
    return paired(base, retrained)


def fisher_tails(out: Path, model: str, runs: dict) -> dict:
    """Per DAI statistics run (``runs``: collect's figures of each): where β·F_gen outweighs F_dom, and how far
    (``dai_modes.tails``), with the balanced scale the run's own Fisher ratio gives."""
    from benchmarks.dai_modes import tails
    from dsprune.encoder import Encoder
    from dsprune.importance import dai as D
    from dsprune.surgery.mask import target_weights

    enc = Encoder.load(model)
    theta = {n: w.detach().float().cpu() for n, w in target_weights(enc).items()}
    del enc
    found = {}
    for run, figures in runs.items():
        scale = D.balanced_scale(figures.get("mean_abs_fisher_term_over_magnitude_term"))
        stats = {s: D.read_stat(out / run, s) for s in ("fisher_gen", "fisher_dom")}
        found[run] = {"balanced_scale": scale, "kinds": tails(theta, stats["fisher_gen"], stats["fisher_dom"], scale)}
    return found


def alignment_figures(out: Path, config: dict) -> dict:
    """The paper-mode run's stored alignment, the one its mask used (``config``: that run's kept settings): how many
    weights Eq. 4 gives a clear sign (|s| > 0.5), and how the products of the two mean gradients compare with the ε
    of its denominator."""
    import torch

    from dsprune.importance import dai as D

    s = torch.cat([v.flatten().abs() for v in D.read_stat(out / "dai", "alignment").values()])
    g_gen, g_dom = D.read_stat(out / "dai", "grad_gen"), D.read_stat(out / "dai", "grad_dom")
    prod = torch.cat([(g_gen[n] * g_dom[n]).flatten().abs() for n in g_gen])
    return {"run": "dai", "alignment": config.get("alignment"), "eps": config.get("eps"),
            "share_abs_s_over_half": float((s > 0.5).double().mean()),
            "median_abs_product": float(prod.median()),
            "share_product_over_eps": float((prod > config.get("eps", 1e-8)).double().mean())}


LAST = 10      # steps averaged for a retraining's end loss: single steps swing with their batch


def retrain_losses(out: Path) -> dict:
    """stage -> the first loss and the mean of the last ``LAST``, per retraining stage: whether a mask's training
    left the starting plateau, which a retrained row far below another seed's may come down to."""
    found = {}
    for stage in sorted(out.glob("retrain-*")):
        log = stage / "log.jsonl"
        if not log.is_file():
            continue
        losses = [r["loss"] for r in formats.read_jsonl(log) if "loss" in r]
        if losses:
            tail = losses[-LAST:]
            found[stage.name.removeprefix("retrain-")] = {"steps": len(losses), "first": losses[0],
                                                          "last_mean": sum(tail) / len(tail), "last_steps": len(tail)}
    return found


def collect(params: dict, out: Path, results: Path, part: str = "all", keep_as: str = NAME, draw: int = 0,
            without: tuple[str, ...] = ()) -> Path:
    """``part`` oneshot keeps Table 1 with ``retrained`` None: the retraining stages need not have run. ``draw``:
    the calibration draw the run's masks came from; ``without``: the DAI statistics runs it left out."""
    model = params.get("model", "embeddinggemma-300m")
    gone = left_out(without)
    doc = {"title": f"GAPrune Tables 1 and 2 on a trained embedder ({model}): 50 % of the MLP weights, one-shot "
                    "and retrained on FinanceBench train",
           **collect_recipe(RECIPE, params, out, command(params, part, out, draw, without),
                            "benchmarks/gaprune_embedder.py", report="report-oneshot",
                            only=[s for s in oneshot_stages() if s not in gone] if part == "oneshot" else None)}
    doc["part"] = part
    doc["calibration"] = draw
    if draw:
        doc["calibration_stages"] = sorted(reads_calibration() & set(oneshot_stages()) - gone)
        doc["shared_stages"] = shared_with_first(out)
        doc["without"] = sorted(without)
    doc["retrained"] = (None if part == "oneshot" else
                        formats.read_json(out / "report-retrain" / "report.json", "retraining report"))
    doc["retraining"] = None
    if part == "all":
        from dsprune.recipe import STAMP, load_recipe

        control = formats.read_json(out / "retrain-full" / STAMP, "stage stamp")["args"]
        ranks = {s.name: s.num_gpus for s in load_recipe(RECIPE, params=params)[1]}["retrain-full"]
        doc["retraining"] = {**{k: control.get(k) for k in RETRAINING}, "ranks": ranks}
    doc["dai"] = {}
    for run in (r for r in DAI_RUNS if r not in gone):
        man = formats.read_json(out / run / "manifest.json", "dai manifest")
        doc["dai"][run] = {"config": {k: man["config"].get(k) for k in
                                      ("alignment", "variant", "fisher_batch", "grad_batch", "temperature",
                                       "alpha", "beta", "gamma", "eps", "max_length")},
                           **{k: man["figures"].get(k) for k in DAI_FIGURES}}
    doc["masks"] = {}
    for name in masks(out):
        _, meta = formats.read_mask(out / f"prune-{name}")
        args = formats.read_json(out / f"prune-{name}" / "stage.json", "stage stamp").get("args", {})
        doc["masks"][name] = {**{k: meta.get(k) for k in ("kind", "method", "sparsity", "scope")},
                              **{k: v for k, v in args.items() if k.startswith("dai_")}}
    doc["against_magnitude"] = against_magnitude(out)
    doc["dai_against"] = {"oneshot": dai_against(out, "eval-"),
                          "retrained": None if part == "oneshot" else dai_against(out, "eval-retrain-")}
    doc["retraining_alone"] = None if part == "oneshot" else retraining_alone(out)
    doc["retrain_losses"] = None if part == "oneshot" else retrain_losses(out)
    doc["tails"] = fisher_tails(out, model, doc["dai"])
    doc["alignment"] = alignment_figures(out, doc["dai"]["dai"]["config"])
    # per-query scores outlive out/: a later run can still be paired with this one
    doc["per_query"] = {p.name: kept_scores(p) for p in sorted(out.glob("eval-*")) if (p / formats.RESULTS).is_file()}
    return keep_results(doc, out, results, keep_as)


def main(argv: list[str] | None = None) -> int:
    ap = recipe_parser(__doc__, "model, sparsity, tasks")
    ap.add_argument("--part", choices=("all", "oneshot"), default=None,
                    help="oneshot: only Table 1's stages (no retraining), kept with the retrained table pending "
                         "(default: all; oneshot with --calibration)")
    first = default_seed()
    ap.add_argument("--seed", type=int, default=first,
                    help=f"the retraining's seed; another than {first} runs beside the first run, sharing its "
                         "one-shot stages")
    ap.add_argument("--calibration", type=int, default=0, metavar="N",
                    help="another draw of the calibration triplets (seed N of the sample, dai and dai-ref stages; "
                         "0 is the recipe's): Table 1 only, beside the first run, sharing its stages that read no "
                         "calibration")
    ap.add_argument("--without", nargs="+", default=(), choices=[r for r in DAI_RUNS if r != "dai"],
                    metavar="RUN", help="with --calibration: leave these DAI statistics runs out of the draw (their "
                                        "masks, evaluations and Table 1 rows), to fit a draw in less time")
    ap.add_argument("--only", nargs="+", default=None, metavar="STAGE",
                    help="run only these stages now and collect nothing: a long run in pieces (finished stages "
                         "are reused by the next run)")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    if "seed" in params:
        ap.error("the retraining's seed is --seed, which also names the run's folder and results")
    another = a.seed != first
    if a.calibration < 0:
        ap.error("--calibration: a draw is a seed, 0 or more")
    if a.calibration and (another or a.part == "all"):
        ap.error("--calibration draws the one-shot masks again: Table 1 only, with no --seed or --part all")
    part = a.part or ("oneshot" if a.calibration else "all")
    if another and part == "oneshot":
        ap.error("--part oneshot reads no training seed: the one-shot table is the first run's")
    if a.without and not a.calibration:
        ap.error("--without leaves DAI runs out of a calibration draw: it needs --calibration N")
    without = tuple(a.without)
    if a.only and a.collect:
        ap.error("--only runs stages and collects nothing; --collect collects and runs nothing")
    out, name = run_of(a.seed, a.calibration)
    if another:
        params["seed"] = str(a.seed)
    if not a.collect:
        if another or a.calibration:
            share_oneshot(out, a.calibration)
        share_unpruned_eval(out)
        cmd = command(params, part, out, a.calibration, without)
        if a.only:
            cmd = cmd[:cmd.index("--only")] if "--only" in cmd else cmd
            cmd += ["--only", *a.only]
        run_recipe_command(cmd, out, "the retraining only; " if another else
                           "some stages; " if a.only else
                           "about 6 h on 2 CPU cores; " if part == "all" else "Table 1 only; ")
        if a.only:
            return 0
    dest = collect(params, out, Path(a.results), part, name, a.calibration, without)
    doc = formats.read_json(dest, "results")
    print(compare.markdown(doc["report"]))
    if doc["retrained"] is not None:
        print(compare.markdown(doc["retrained"]))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
