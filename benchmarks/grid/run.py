"""Running the grid: a row's config fingerprint, the row as a recipe (``dsprune.recipe.run_recipe``, resumed stage
by stage), its results JSON collected from the stage folders, and the listing of rows.

A row's recipe is written to ``OUT/rows/ROW.yaml`` and its stage folders ``OUT/STAGE`` are reused while their
inputs are unchanged, so an interrupted row resumes. ``OUT`` is not committed: ``benchmarks/results/ROW.json``
keeps what RESULTS.md needs (per-query nDCG@10 for paired intervals, parameters, speed-ups, commands, times,
code version, scaled settings), and a row whose JSON carries the same config fingerprint is skipped, so the
grid also resumes across sessions without ``OUT``.
"""
from __future__ import annotations

import hashlib
import json
import os
import shlex
import sys
import time
from pathlib import Path

from dsprune import formats
from dsprune.errors import DsPruneError
from dsprune.recipe import _REF, Stage, downstream
from dsprune.recipe import _argv as recipe_argv
from dsprune.recipe import run_recipe

from .._common import REPO, copy_file, launch_env, scoped_environ
from .inputs import DEFAULT_DENSE, Ctx, default_dense, train_config_path
from .rows import DEFAULT_TASKS, GAP_RETRAIN, GRID_VERSION, MODEL_NOTE, SCALED, TABLE_OF, Row

DROP_ORDER = "drop_order.png"           # the heat map dsprune score writes beside scores.json
ROUGH_MINUTES = {"score": 4, "drop": 1, "eval": 7, "eval-scifact": 25, "train": 35, "slim": 12, "mask": 1,
                 "export": 1, "bench": 4, "sample": 3, "dai": 20, "prune": 1, "gap-train": 10}


def reseed(stages: list[dict], seed: int | None) -> tuple[list[dict], dict[str, str]]:
    """A row's stages with its training at ``seed`` (None: as the row defines it). Every training stage, and every
    stage that reads one directly or through another, is renamed NAME-seedN, so the first seed's folders stay and
    the untrained stages before the training are shared. Returns the stages and the renames."""
    if seed is None:
        return stages, {}
    trained = downstream([Stage(s["name"], s["args"]) for s in stages],
                         {s["name"] for s in stages if s.get("launcher") == "train"})
    renamed = {s["name"]: f"{s['name']}-seed{seed}" for s in stages if s["name"] in trained}
    out = []
    for s in stages:
        args = json.loads(_REF.sub(lambda m: "${" + renamed.get(m.group(1), m.group(1)) + "}", json.dumps(s["args"])))
        if s.get("launcher") == "train":
            args["seed"] = seed
        out.append({**s, "name": renamed.get(s["name"], s["name"]), "args": args})
    return out, renamed


def suffix(seed: int | None) -> str:
    """The seed's part of a row's results and recipe names ("" for the row's own seed)."""
    return "" if seed is None else f"-seed{seed}"


def fingerprint(row: Row, ctx: Ctx, seed: int | None = None) -> tuple[str, dict]:
    """The row's config fingerprint: its stages with inputs as placeholders, and what they stand for."""
    stages, _ = reseed(row.stages(ctx), seed)
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
    if getattr(a, "seed", None) is not None:
        cmd += ["--seed", str(a.seed)]
    return shlex.join(cmd)


def recorded_fingerprint(dest: Path) -> str | None:
    """The config fingerprint a row's results JSON was made with ("" when it has none); None when the file is not
    JSON, which neither skipping nor ``--list`` may take for a finished row."""
    try:
        return json.loads(dest.read_text()).get("config_fingerprint") or ""
    except json.JSONDecodeError:
        return None


def run_rows(rows: list[Row], a, results: Path) -> list[str]:
    """Run rows in grid order (prerequisites first); a failed row is reported and the next one runs. Stages get
    the environment of every benchmark launch, with this checkout ahead of any PYTHONPATH already set, for as
    long as the rows run. Returns the failed rows."""
    failed = []
    env = launch_env(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    with scoped_environ(env):
        t0 = time.time()
        for i, row in enumerate(rows, 1):
            print(f"\n== [{i}/{len(rows)}] {row.name}: {row.what} ({(time.time() - t0) / 60:.0f} min so far)",
                  flush=True)
            try:
                run_row(row, a, results)
            except DsPruneError as e:
                print(f"!! {row.name} failed: {e}", file=sys.stderr, flush=True)
                failed.append(row.name)
    return failed


def run_row(row: Row, a, results: Path) -> str:
    """Run one row unless its results are current. Returns 'skipped' or 'ran'."""
    seed = getattr(a, "seed", None)
    symbolic = Ctx(a, symbolic=True)
    placeholders, renamed = reseed(row.stages(symbolic), seed)
    if seed is not None and not renamed:
        print(f"= {row.name}: no training stage, so no seed to repeat; skipped", flush=True)
        return "skipped"
    fp, config = fingerprint(row, symbolic, seed)
    name = row.name + suffix(seed)
    dest = results / f"{name}.json"
    if dest.is_file() and not a.force:
        if recorded_fingerprint(dest) == fp:
            copy_figures(name, placeholders, {}, symbolic.out, results)
            print(f"= {name}: results current ({dest}), skipped", flush=True)
            return "skipped"
    ctx = Ctx(a, symbolic=False)
    out = ctx.out
    stages, renamed = reseed(row.stages(ctx), seed)
    recipe = out / "rows" / f"{name}.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    import yaml
    formats.write_text(recipe, f"# {row.name}: {row.what}\n# written by benchmarks/reproduce.py; "
                      f"dsprune run {recipe} reruns it\n"
                      + yaml.safe_dump({"out": str(out), "stages": stages}, sort_keys=False, width=120))
    t0 = time.time()
    report = run_recipe(recipe, out=str(out))
    wall = time.time() - t0
    doc = collect(row, stages, report, out, fp, config, ctx, a, wall, renamed)
    copy_figures(name, stages, report, out, results)
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
            wall: float, renamed: dict | None = None) -> dict:
    """Everything the results JSON of one row holds, read from the stage folders (``renamed``: the row's stage
    names -> this seed's)."""
    from dsprune.eval.speed import machine     # torch: not for --list and --render, which never collect

    renamed = renamed or {}

    def folder(name: str) -> Path:
        name = renamed.get(name, name)
        return Path(report[name].get("folder") or out / name)

    res = formats.read_json(folder(f"{row.name}-eval") / formats.RESULTS, "results file")
    tasks = {}
    for extra in (f"{row.name}-eval", f"{row.name}-eval-scifact"):
        if renamed.get(extra, extra) not in report:
            continue
        doc = res if extra.endswith("-eval") else formats.read_json(folder(extra) / formats.RESULTS, "results file")
        for t, r in doc["tasks"].items():
            tasks[t] = {"ndcg_at_10": r.get("ndcg_at_10"), "recall_at_100": r.get("recall_at_100"),
                        "split": r.get("split"), "num_queries": r.get("num_queries"), "source": r.get("source"),
                        "per_query": {"ndcg_at_10": r.get("per_query", {}).get("ndcg_at_10", {})}}
    model_manifest = folder(f"{row.name}-eval") / "model_manifest.json"
    model_info = formats.read_json(model_manifest) if model_manifest.is_file() else {}
    speed = None
    if renamed.get(f"{row.name}-bench", f"{row.name}-bench") in report:
        b = formats.read_json(folder(f"{row.name}-bench") / formats.BENCH, "bench file")
        speed = {"document": b["document"]["speedup"], "query": b["query"]["speedup"],
                 "flop_ratio": b["document"]["flop_ratio"], "param_ratio": b["params"]["ratio"],
                 "params": b["params"]["model"], "baseline_params": b["params"]["baseline"],
                 "baseline": b["baseline"], "threads": b.get("threads")}
    training = {}
    if row.name == "dense":       # trained outside the grid by benchmarks/train_dense.py
        man = Path(ctx.a.dense).parent / formats.MANIFEST
        info = formats.read_json(man) if man.is_file() else {}
        figs = info.get("figures", {})
        if figs:
            training["train_dense.py"] = {**{k: figs.get(k) for k in ("steps", "train_seconds", "first_loss",
                                                                      "final_loss")},
                                          "seed": (info.get("config") or {}).get("seed")}
    mask = model_info.get("mask")
    for s in stages:
        if s.get("launcher") == "train":
            man = Path(report[s["name"]].get("folder") or out / s["name"]) / formats.MANIFEST
            run_info = formats.read_json(man) if man.is_file() else {}
            figs = run_info.get("figures", {})
            training[s["name"]] = {**{k: figs.get(k) for k in ("steps", "train_seconds", "first_loss", "final_loss",
                                                               "resumed_from")},
                                   "seed": (run_info.get("config") or {}).get("seed")}
            mask = mask or run_info.get("mask")   # models retrained before their manifest named the held mask
    def own(name: str) -> Path:               # ``stages`` already carry this seed's names
        return Path(report[name].get("folder") or out / name)
    mask = with_mask_ties(mask, stages, own)

    stage_info = [{"name": s["name"], "status": report[s["name"]]["status"],
                   "seconds": report[s["name"]].get("seconds"),
                   "command": stage_command(s, {**report[s["name"]]["args"],
                                                **({"out": str(own(s["name"]))} if s.get("command")
                                                   else {"output_dir": str(own(s["name"]))})})}
                  for s in stages]
    return {
        "row": row.name, "seed": getattr(a, "seed", None), "table": TABLE_OF.get(row.name), "label": row.label,
        "what": row.what,
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
        # the CPU of the run that collected the row (a stage reused from an earlier run may have run elsewhere):
        # float kernels differ between CPUs, so two rows' training can differ by machine as well as by seed
        "collected_on": machine(),
    }


def with_mask_ties(mask: dict | None, stages: list[dict], folder_of) -> dict | None:
    """The held mask's summary with how its ``dsprune mask`` stage broke ties: models retrained before their
    manifest carried it lack it, while the stage's own mask.json has it."""
    if not mask or mask.get("ties"):
        return mask
    for s in stages:
        made = folder_of(s["name"]) / "mask.json" if s.get("command") == "mask" else None
        ties = formats.read_json(made, "mask summary").get("ties") if made and made.is_file() else None
        if ties:
            return {**mask, "ties": ties}
    return mask


def list_rows(rows: list[Row], a, results: Path) -> None:
    ctx = Ctx(a, symbolic=True)
    print(f"<model> = {a.model}; <dense> = {a.dense}; <train> = the launcher options in {train_config_path(a)} "
          f"(written by benchmarks/train_dense.py); ${{out}} = {Path(a.out).resolve()}")
    seen: dict[str, dict] = {}
    seed = getattr(a, "seed", None)
    for row in rows:
        stages, renamed = reseed(row.stages(ctx), seed)
        if seed is not None and not renamed:
            continue
        fp, _ = fingerprint(row, ctx, seed)
        dest = results / f"{row.name}{suffix(seed)}.json"
        status = "pending"
        if dest.is_file():
            old = recorded_fingerprint(dest)
            status = "unreadable" if old is None else "done" if old == fp else "stale"
        minutes = estimate(stages)
        seen.update((s["name"], s) for s in stages)
        print(f"\n{row.name}  [{TABLE_OF.get(row.name)}]  {row.label}: {row.what}  "
              f"(~{minutes} min from scratch; {status})")
        for s in stages:
            print(f"  {s['name']:<28} {stage_command(s, s['args'])}")
    print(f"\n{len(rows)} rows, {len(seen)} stages: ~{estimate(list(seen.values())) / 60:.1f} h from scratch on 2 "
          "CPU cores (rough; each shared stage once; the dense model adds ~45 min when missing)")
