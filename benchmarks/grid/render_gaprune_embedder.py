"""RESULTS.md's section for GAPrune's Tables 1 and 2 on a trained embedder (``benchmarks/gaprune_embedder.py``):
every mask against the unpruned model one-shot, and against the unpruned model retrained alike, with how far each
mask's decisions are from magnitude's; every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from dsprune.report import compare

from .render_dai_modes import NEGLIGIBLE, tail_table, tail_words
from .render_seeds import verdict
from .section import section_result

KEYS = {"report", "retrained", "dai", "masks", "against_magnitude", "stages", "command"}
# newer results add "dai_against" and "tails"; an older JSON renders without them

WHAT = {"dai": "DAI as the paper writes it: per-sample Fisher (Eq. 3), Eq. 4's alignment, Eq. 5",
        "dai-ref": "DAI as the authors' released code computes it: Fisher from batches with in-batch negatives, "
                   "their element-wise alignment and score",
        "fisher": "domain Fisher·|θ| from the same statistics", "magnitude": "|θ|", "wanda": "Wanda, |θ|·‖x‖",
        "random": "random", "neurons": "DAI summed per MLP neuron, whole neurons removed",
        "dai-balanced": "DAI as the paper writes it, its Fisher term scaled to the mean size of γ√|θ| (one-shot "
                        "only: not retrained)",
        "dai-sign": "DAI as the paper writes it with Eq. 4's ε at 1e-30, below every product of mean gradients, so "
                    "s is their sign, ±1 (one-shot only: not retrained)"}
LABEL = {"dai": "DAI (paper)", "dai-ref": "DAI (authors' code)", "dai-balanced": "DAI (paper), Fisher balanced",
         "dai-sign": "DAI (paper), ε = 1e-30",
         "magnitude": "magnitude", "fisher": "domain Fisher·|θ|", "wanda": "Wanda", "random": "random",
         "neurons": "structured DAI", "full": "unpruned"}
DOMAIN = "financebench"
DRAWS = ("calibration draw", "calibration draws")
FEW = 0.05              # below this share of weights with |s| > 0.5, the alignment factor is ~1 almost everywhere


def pair_words(x: dict) -> str:
    """One paired difference: the mean over the tasks, and the domain task's."""
    dom = x["tasks"].get(DOMAIN)
    return (f"mean {compare.interval(x['mean_delta'])}" if x.get("mean_delta") else "mean –") + \
        (f", {DOMAIN} {compare.interval(dom)}" if dom else "")


def mean_and_domain(pairs: list[dict], names: tuple[str, str], lead: str, after: str = "",
                    unit: tuple[str, str] = ("training seed", "seeds")) -> str:
    """The verdict of repeated DAI − baseline ``pairs`` on the mean and on the domain task: the two GAPrune
    targets can disagree, so each gets its own. ``after`` qualifies the mean's verdict only. Means over different
    tasks are not one quantity: then every task all the pairs share gets a verdict instead."""
    shared = [t for t in pairs[0]["tasks"] if all(t in y["tasks"] for y in pairs)]
    if all(set(y["tasks"]) == set(shared) for y in pairs):
        words = f"{lead} the mean: " + verdict([y["mean_delta"] for y in pairs], len(pairs),
                                               f"{names[0]} keeps more{after}", f"{names[1]} keeps more{after}", unit)
        each = [DOMAIN] if DOMAIN in shared else []
    else:
        words = f"{lead} the mean: none, the {unit[1]} average over different tasks."
        each = sorted(shared, key=lambda t: t != DOMAIN)
    for task in each:          # the domain's intervals are on the line already; another task's are not
        shown = "" if task == DOMAIN else f" ({'; '.join(compare.interval(y['tasks'][task]) for y in pairs)})"
        words += f" {lead} {task}{shown}: " + verdict([y["tasks"][task] for y in pairs], len(pairs),
                                               f"{names[0]} keeps more", f"{names[1]} keeps more", unit)
    return words


def against_lines(d: dict, runs: list[dict], draws: list[dict] = ()) -> list[str]:
    """GAPrune's comparison itself: each DAI mask − each baseline, paired per query, one-shot per calibration draw
    and retrained per seed (a verdict only where two draws, or two seeds, agree)."""
    oneshot = (d.get("dai_against") or {}).get("oneshot") or {}
    if not oneshot:
        return []
    seeds = seed_count(runs)
    many = len(draws) > 1
    out = ["", "**DAI against the baselines** (each DAI mask − each baseline mask, paired per query: the mean over "
               f"the tasks, and {DOMAIN}, the domain; "
               + (f"one-shot, a verdict where the {len(draws)} calibration draws agree; retrained, where two "
                  "training seeds agree" + ("" if seeds > 1 else ": none here") if many else
                  "a verdict only after retraining, where two training seeds agree"
                  + ("" if seeds > 1 else ": none here")) + ")", ""]
    for dai, bases in oneshot.items():
        for base, x in bases.items():
            names = LABEL.get(dai, dai), LABEL.get(base, base)
            line = f"- {names[0]} − {names[1]}: one-shot {pair_words(x)}"
            shots = [(r.get("calibration", 0), ((r.get("dai_against") or {}).get("oneshot") or {})
                      .get(dai, {}).get(base)) for r in draws]
            shots = [(n, y) for n, y in shots if y and y.get("mean_delta")]
            if len(shots) > 1:
                line = (f"- {names[0]} − {names[1]}: one-shot, " + "; ".join(
                    f"calibration draw {n}: {pair_words(y)}" for n, y in shots) + ". "
                    + mean_and_domain([y for _, y in shots], names, "One-shot on", unit=DRAWS))
            elif many and shots:     # a draw that left this DAI run out: no second draw to agree with
                line = f"- {names[0]} − {names[1]}: one-shot, calibration draw {shots[0][0]} only: {pair_words(x)}"
            retrained = [(r["retraining"]["seed"], ((r.get("dai_against") or {}).get("retrained") or {})
                          .get(dai, {}).get(base)) for r in runs]
            retrained = [(seed, y) for seed, y in retrained if y and y.get("mean_delta")]
            if retrained:
                line += (" Retrained, " if len(shots) > 1 else "; retrained, ") + "; ".join(
                    f"seed {seed}: {pair_words(y)}" for seed, y in retrained) + "."
                if seeds > 1:
                    line += " " + mean_and_domain([y for _, y in retrained], names, "On", " after retraining")
            out.append(line + ("" if retrained or len(shots) > 1 else "."))
    return out


def fisher_lines(d: dict) -> list[str]:
    """Where β·F_gen outweighs F_dom on this model, and what the size of the Fisher term leaves of Eq. 5."""
    tails = d.get("tails")
    if not tails:
        return []
    cfg = d["dai"]["dai"]["config"]
    ratios = {run: x.get("mean_abs_fisher_term_over_magnitude_term") for run, x in d["dai"].items()}
    out = [""] + tail_table(tails, cfg.get("beta"), cfg.get("gamma"))
    if all(r is not None and r < NEGLIGIBLE for r in ratios.values()):
        diff = d["against_magnitude"].get("dai")
        out += ["", "As written, the Fisher term is "
                + " and ".join(f"{r:.2g} of γ√|θ| on average (`{run}`)" for run, r in ratios.items())
                + f", and {tail_words(tails)}: on this trained embedder Eq. 5 orders nearly all weights by "
                "γ√|θ|·(1 + α·s), magnitude reweighted by the alignment"
                + (f" (the paper-mode mask differs from magnitude's in {diff['share']:.2%} of its decisions)"
                   if diff else "") + "; an inference from the averages and the tail, not measured weight by "
                "weight."
                + (" The balanced mask shows what the Fisher term changes once it counts." if "dai-balanced" in
                   d["masks"] else "")]
    a = d.get("alignment")
    if a:
        out += ["", f"The alignment the paper-mode mask used (`{a['run']}`, Eq. 4 as `{a['alignment']}`, ε = "
                f"{a['eps']:g}): the median |ḡ_gen·ḡ_dom| is {a['median_abs_product']:.2g}, above ε for "
                f"{a['share_product_over_eps']:.2%} of the weights, and |s| > 0.5 for "
                f"{a['share_abs_s_over_half']:.2%}"
                + ("; elsewhere s is near 0: the paper leaves ε's value open, and at this one Eq. 4 moves few "
                   "weights' scores" if a["share_abs_s_over_half"] < FEW else "") + "."
                + (" The ε = 1e-30 mask gives every weight its sign, s = ±1." if "dai-sign" in d["masks"] else "")]
    return out


def retraining_line(r: dict | None, others: list[dict] = ()) -> str:
    """The retraining's settings as the collected stage stamp holds them; None before the retraining has run.
    ``others``: the other seeds' settings, said to match but for the seed, or where they do not."""
    if r is None:
        return "retraining: not run yet (`--part oneshot`)"
    more = ""
    for o in others:
        differ = sorted(k for k in set(r) | set(o) if k not in ("seed", "command") and r.get(k) != o.get(k))
        more += (f" and {o['seed']} in another run, " + (f"which also differs in {', '.join(differ)}" if differ
                                                         else "which otherwise has the same settings"))
    return (f"retraining {r['max_steps']} LoRA steps (r={r['lora_r']}, α={r['lora_alpha']}, learning rate "
            f"{r['learning_rate']}) of {r['per_device_batch_size']} queries per rank × {r['ranks']} ranks, groups of "
            f"{r['group_size']} passages, in {r.get('dtype') or 'float32'}, seed {r['seed']}{more} "
            "(GAPrune: 100 steps); "
            "every retrained mask and the unpruned control alike")


def seed_count(runs: list[dict]) -> int:
    """How many distinct retraining seeds ``runs`` hold: a verdict needs two."""
    return len({r["retraining"]["seed"] for r in runs})


def retrained_runs(d: dict, results: Path) -> list[dict]:
    """The run ``d`` and every other retraining seed's run (``gaprune_embedder_seed*.json``) whose retraining has
    run, in seed order."""
    others = [section_result(p, KEYS | {"retraining"}, "benchmarks/gaprune_embedder.py --seed")
              for p in sorted(results.glob("gaprune_embedder_seed*.json"))]
    runs = [r for r in (d, *others) if r and r.get("retrained") is not None and r.get("retraining")]
    return sorted(runs, key=lambda r: r["retraining"]["seed"])


def calibration_runs(d: dict, results: Path) -> list[dict]:
    """The run ``d`` and every other calibration draw's one-shot run (``gaprune_embedder_calib*.json``), in draw
    order: ``d``'s draw is the recipe's own, 0."""
    others = [section_result(p, KEYS | {"calibration"}, "benchmarks/gaprune_embedder.py --calibration")
              for p in sorted(results.glob("gaprune_embedder_calib*.json"))]
    return sorted((r for r in (d, *others) if r), key=lambda r: r.get("calibration") or 0)


def draw_tables(draws: list[dict]) -> list[str]:
    """Table 1 of every calibration draw after the first, with the stages it drew anew and where its other rows
    came from: the first run's folders, or run again beside them (then whether they are the first draw's models)."""
    out = []
    for r in draws[1:]:
        anew = ", ".join(f"`{n}`" for n in r.get("calibration_stages") or [])
        shared = ", ".join(f"`{n}`" for n in r.get("shared_stages") or [])
        origin = ("the other rows read no triplets; " + (f"taken from the first run's folders: {shared}" if shared
                                                         else "all run again in this draw's folder")
                  + "; " + as_draw_0(draws[0]["report"], r["report"]))
        if r["report"]["tasks"] != draws[0]["report"]["tasks"]:
            origin += (f"; evaluated on {', '.join(r['report']['tasks'])} only (the recipe's `tasks` param), so its "
                       "mean is over other tasks than draw 0's")
        if r.get("without"):
            origin += ("; left out of this draw, to fit it in less time: " + ", ".join(
                f"`{n}` ({LABEL.get(n, n)}: its statistics, mask, evaluation and row)" for n in r["without"]))
        out += ["", f"**One-shot, calibration draw {r['calibration']}** (the triplets drawn again with seed "
                    f"{r['calibration']}; `{r['command']}`, {r['code_version']}; drawn anew: {anew or '?'}; "
                    f"{origin})", "", compare.markdown(r["report"])]
    return out


def as_draw_0(first: dict, report: dict) -> str:
    """Which rows of ``report`` hold the very model of the first draw's table (the same fingerprint) and score as
    it did on every task both evaluate: a row that reads no triplets must."""
    before = {x["label"]: x for x in first["rows"]}
    same, other = [], []
    for row in report["rows"]:
        was = before.get(row["label"])
        if was is None or not row.get("fingerprint"):
            continue
        tasks = [t for t in row["tasks"] if t in was["tasks"]]
        alike = row["fingerprint"] == was["fingerprint"] and all(
            row["tasks"][t]["score"] == was["tasks"][t]["score"] for t in tasks)
        (same if alike else other).append(row["label"])

    def names(labels: list[str]) -> str:      # labels hold commas themselves
        return ", ".join(f"*{x}*" for x in labels) or "none"

    return (f"the same models as draw 0's, scoring alike on every task both evaluate: {names(same)}"
            + (f"; other models or scores: {names(other)}" if other else ""))


def alone_lines(runs: list[dict]) -> list[str]:
    """What retraining does to the unpruned model by itself, per seed: the control of Table 2 is not the unpruned
    model of Table 1."""
    found = [(r["retraining"]["seed"], r["retraining_alone"]) for r in runs if r.get("retraining_alone")]
    if not found:
        return []
    each = "; ".join(f"seed {s}: {pair_words(x)}, " + ", ".join(
        f"{t} {compare.interval(dd)}" for t, dd in x["tasks"].items() if t != DOMAIN) for s, x in found)
    return ["", "**The retraining alone** (the unpruned model retrained − the unpruned model, paired per query; "
                f"the retrained rows above are measured against the former): {each}."]


def loss_lines(runs: list[dict]) -> list[str]:
    """Each retraining's InfoNCE loss at its first step and over its last steps, per seed: a mask whose loss stays
    where it started has not been recovered, whatever its seed's other rows did."""
    found = [(r["retraining"]["seed"], r["retrain_losses"]) for r in runs if r.get("retrain_losses")]
    if not found:
        return []
    last = next(iter(found[0][1].values()))["last_steps"]
    each = "; ".join(f"seed {s}: " + ", ".join(
        f"{LABEL.get(name, name)} {x['first']:.2f} → {x['last_mean']:.2f}"
        for name, x in sorted(losses.items(), key=lambda kv: kv[0] != "full")) for s, losses in found)
    return ["", f"**The retraining's loss** (InfoNCE at the first step → the mean of the last {last} steps): "
                f"{each}."]


def seed_lines(runs: list[dict]) -> list[str]:
    """Table 2 per mask over the retraining seeds: each retrained mask − the unpruned model retrained alike, paired
    per query, and the verdict the seeds allow."""
    if not runs:
        return []
    seeds = seed_count(runs)
    out = ["", f"**Seeds** (Table 2: retrained mask − the unpruned model retrained alike, paired per query, mean "
               f"over the tasks; {seeds} training seed{'s' if seeds > 1 else ''}; a verdict needs two seeds "
               "with both intervals on the same side of 0" + ("" if seeds > 1 else ": none here") + ")", ""]
    for row in runs[0]["retrained"]["rows"]:
        entries = [(r["retraining"]["seed"], next((x for x in r["retrained"]["rows"] if x["label"] == row["label"]),
                                                 None)) for r in runs]
        deltas = [(s, x["mean_delta"]) for s, x in entries if x and x.get("mean_delta")]
        if not deltas:
            continue            # the reference row
        each = "; ".join(f"seed {s}: {compare.interval(dd)}" for s, dd in deltas)
        out.append(f"- {row['label']}: {each}." + ("" if seeds < 2 else " " + verdict(
            [dd for _, dd in deltas], len(deltas), "the retrained mask scores above the retrained control",
            "the retrained mask scores below the retrained control")))
    return out


def render_gaprune_embedder(results: Path) -> list[str]:
    d = section_result(results / "gaprune_embedder.json", KEYS, "benchmarks/gaprune_embedder.py")
    if d is None:
        return []
    runs = retrained_runs(d, results)
    draws = calibration_runs(d, results)
    seeds = seed_count(runs)
    minutes = sum(s.get("seconds") or 0 for s in d["stages"]) / 60
    general = sorted({x.get("n_general") for x in d["dai"].values()} - {None})
    out = [f"## {d['title']}", "",
           f"`{d['command']}` ({d['code_version']}; via `.venv/bin/python benchmarks/gaprune_embedder.py`, "
           f"{minutes:.0f} min of stages on 2 CPU cores). Scaled: "
           f"{' / '.join(map(str, general)) or '?'} general triplets (GAPrune: 5,000); "
           + retraining_line(d.get("retraining"), [r["retraining"] for r in runs if r is not d])
           + ("" if "msmarco_trecdl_subset" in d["report"]["tasks"] else
              "; the MS MARCO subset, a general eval, is left out (the recipe's `tasks` param)")
           + ". SciFact train is in the general calibration set and shares judged documents with scifact_small, so "
           "scifact_small is an in-domain check here. "
           + (f"One-shot masks have no training seed; the masks that read calibration triplets were drawn from "
              f"{len(draws)} calibration samples (*DAI against the baselines* gives a one-shot verdict where they "
              "agree); " if len(draws) > 1 else
              "One-shot masks have no training seed: no one-shot row is called better or worse than another; ")
           + (f"the retraining ran with {seeds} seeds (*Seeds* below)." if seeds > 1 else
              "the retraining ran with one seed: no retrained row is called better or worse either." if seeds else
              "the retraining has not run."), "",
           "**The masks**", ""]
    for name, m in d["masks"].items():
        diff = d["against_magnitude"].get(name)
        share = f"; {diff['share']:.2%} of its keep/prune decisions differ from magnitude's" if diff else ""
        out.append(f"- `{name}`: {WHAT.get(name, m.get('method'))} ({m.get('kind')}, sparsity "
                   f"{m.get('sparsity')}){share}.")
    for run, x in d["dai"].items():
        cfg = ", ".join(f"{k} {v}" for k, v in x["config"].items() if v is not None)
        ratio = x.get("mean_abs_fisher_term_over_magnitude_term")
        # a mask may score the statistics again another way: the settings above are the statistics stage's
        mask = d["masks"].get(run) or {}
        again = (f"; the `{run}` mask scores them again with alignment {mask.get('dai_alignment')}, variant "
                 f"{mask.get('dai_variant')}" if mask.get("dai_recompute") else "")
        out.append(f"- DAI statistics `{run}` (the statistics stage's settings: {cfg}): {x.get('n_general')} general "
                   f"and {x.get('n_domain')} domain triplets"
                   + (f"; mean |Fisher term| / mean γ√|θ| = {ratio:.3g}" if ratio is not None else "") + again
                   + ".")
    out += fisher_lines(d)
    out += ["", "**One-shot** (GAPrune Table 1" + (", calibration draw 0" if len(draws) > 1 else "") + ")", "",
            compare.markdown(d["report"])] + draw_tables(draws)
    out += ["", "**Retrained on FinanceBench train** (GAPrune Table 2"
            + (f", seed {d['retraining']['seed']}" if seeds > 1 else "") + ")", ""]
    out.append(compare.markdown(d["retrained"]) if d["retrained"] is not None else
               "*pending*: the retraining stages have not run (`benchmarks/gaprune_embedder.py` without "
               "`--part oneshot` runs them and keeps both tables).")
    for r in runs:
        if r is not d:
            seed = r["retraining"]["seed"]
            out += ["", f"**Retrained on FinanceBench train, seed {seed}** (the same one-shot masks; "
                        f"`.venv/bin/python benchmarks/gaprune_embedder.py --seed {seed}`, {r['code_version']})", "",
                    compare.markdown(r["retrained"])]
    return out + alone_lines(runs) + loss_lines(runs) + seed_lines(runs) + against_lines(d, runs, draws) + [""]
