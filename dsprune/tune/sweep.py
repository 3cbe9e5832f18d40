"""A Ray Tune sweep over a dsprune pipeline: find the best model under a cost budget.

The sweep file names a pipeline (a recipe, or its ``stages`` inline), the space (``slim.ratio``,
``slim.lambda``, ``dai.alpha``, …), the metric and its mode, optional constraints on measured cost
(``speedup: {min: 1.8}``) and optional extra objectives (multi-objective mode returns the Pareto front).
Everything is checked before Ray starts. Trials run the real stages (DeepSpeed launchers included), a
searcher of Ray's proposes values (random/grid, or Optuna's TPE for continuous spaces), ASHA may stop
trials early on their in-training eval reports, and an interrupted sweep resumes with ``--resume``.
At the end: ``trials.md``/``summary.json`` (every trial with the node it ran on, failed ones with their
error), the front as a PNG and the best feasible trial's model path.

On a running Ray cluster (``--address`` or ``RAY_ADDRESS``) the sweep starts no Ray of its own: each trial is one
placement-group bundle of ``trial_cpus``/``trial_gpus`` (a DeepSpeed stage's ranks share one host, so a bundle,
never a spread), and its stages run on the GPUs Ray gave that bundle (``trial.on_trial_gpus``). ``--out`` and
``--storage_path`` must then be folders every node mounts: trials on any node share the stage cache there.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path

from .. import formats
from ..config import load_config_file
from ..errors import DsPruneError
from ..recipe import check_methods, load_recipe, stage_options
from ..settings import ray_tmp_dir
from . import outcome, space
from .trial import NODE

SUMMARY = "summary.json"
TABLE = "trials.md"
FRONT = "front.png"
SEARCHERS = ("random", "grid", "optuna")
STATUSES = ("done", "stopped early", "error", "not finished")
SCHEDULERS = ("fifo", "asha")


@dataclass
class Args:
    """Options of ``dsprune tune`` / ``tuning/sweep.py``; a sweep YAML fills the same names."""

    out: str = field(default="out/tune", metadata={"help": "sweep folder: stages/, trials/, ray/, summary"})
    pipeline: str | None = field(default=None, metadata={
        "help": "recipe YAML each trial runs (or give `stages:` inline in the sweep file)"})
    stages: str | None = field(default=None, metadata={"help": "the pipeline's stages, inline (YAML list)"})
    space: str | None = field(default=None, metadata={
        "help": "parameters: {slim.ratio: {grid: [0.2, 0.3]}, slim.lambda: {loguniform: [10, 1e4]}, ...}"})
    metric: str = field(default="ndcg_at_10", metadata={"help": "score to optimise: " + ", ".join(outcome.METRICS)})
    mode: str = field(default="max", metadata={"help": "max | min"})
    objectives: str | None = field(default=None, metadata={
        "help": "multi-objective mode: {ndcg_at_10: max, speedup: max} -> the Pareto front"})
    constraints: str | None = field(default=None, metadata={
        "help": "bounds on measured metrics, e.g. {speedup: {min: 1.8}}; infeasible trials are penalised"})
    penalty: float = field(default=1.0, metadata={
        "help": "an infeasible trial reports its metric worsened by this much to the searcher"})
    search: str = field(default="random", metadata={"help": "random | grid (Ray's variant generator) | optuna (TPE)"})
    scheduler: str = field(default="fifo", metadata={"help": "fifo | asha (stops trials on in-training evals)"})
    asha_grace: int = field(default=1, metadata={"help": "ASHA: reports a trial makes before it may be stopped"})
    asha_max_t: int = field(default=10, metadata={"help": "ASHA: most reports a trial makes"})
    asha_reduction: int = field(default=2, metadata={"help": "ASHA: reduction factor"})
    num_samples: int = field(default=4, metadata={"help": "trials (grid spaces: repeats of the grid)"})
    max_concurrent: int = field(default=1, metadata={"help": "trials at once (each takes trial_cpus)"})
    cpus: int = field(default=0, metadata={"help": "CPUs Ray may use (0 = all of this machine)"})
    trial_cpus: float = field(default=0, metadata={"help": "CPUs a trial reserves (0 = cpus / max_concurrent)"})
    trial_gpus: float = field(default=0, metadata={"help": "GPUs a trial reserves"})
    seed: int = 0
    resume: bool = field(default=False, metadata={"help": "continue the sweep in --out after an interruption"})
    overwrite: bool = field(default=False, metadata={"help": "start over in an existing --out"})
    name: str = field(default="sweep", metadata={"help": "experiment name (Ray's folder under storage_path)"})
    address: str | None = field(default=None, metadata={
        "help": "a running Ray cluster to use: auto | HOST:PORT (default: RAY_ADDRESS; unset = start a local Ray)"})
    storage_path: str | None = field(default=None, metadata={
        "help": "where Ray keeps the experiment (results, state for --resume): a folder every node mounts, or a "
                "URI Ray supports; default OUT/ray"})
    stage_cache: str | None = field(default=None, metadata={
        "help": "folder of the stages trials build and reuse (default OUT/stages); sweeps that name the same "
                "folder build each stage once, and one outside OUT outlives --overwrite"})


@dataclass
class Sweep:
    """A checked sweep: what trials run and how they are judged (picklable, sent to every trial)."""

    out: str
    cache: str
    cwd: str
    pipeline: dict
    params: list
    metric: str
    mode: str
    objectives: dict
    constraints: list
    penalty: float

    def judge(self, metrics: dict) -> dict:
        """Feasibility and the single objective the searcher and scheduler see."""
        ok = outcome.feasible(metrics, self.constraints)
        score = metrics.get(self.metric)
        if score is None:
            return {"feasible": ok, "objective": None}
        worse = -self.penalty if self.mode == "max" else self.penalty
        return {"feasible": ok, "objective": score if ok else score + worse}


def _mapping(value, what: str):
    """A YAML mapping/list from a sweep file, or the same given as JSON/YAML text on the command line."""
    if value is None or isinstance(value, (dict, list)):
        return value
    import yaml
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError as e:
        raise DsPruneError(f"{what}: cannot parse {value!r}: {e}") from None


def build(args: Args) -> Sweep:
    """Check everything that can be checked without Ray: pipeline, space, metric, objectives, constraints."""
    if bool(args.pipeline) == bool(args.stages):
        raise DsPruneError("give exactly one of `pipeline: RECIPE.yaml` or inline `stages:`")
    if args.pipeline:
        doc = load_config_file(args.pipeline)
        doc["path"] = str(args.pipeline)
    else:
        doc = {"stages": _mapping(args.stages, "stages"), "path": "sweep stages"}
    _, stages = load_recipe(doc)
    options = {s.name: stage_options(s.command, s.launcher) or set() for s in stages}
    params = space.parse_space(_mapping(args.space, "space"), options)
    command = {s.name: s.command for s in stages}
    for p in params:                      # e.g. `prune.method: {choice: [dai, wanda]}` names registered methods
        for value in p.values if p.kind in ("choice", "grid") else ():
            check_methods(command[p.stage], {p.option: value}, f"space.{p.name}")
    commands = [s.command for s in stages if s.command]
    for what, metric in [("metric", args.metric)]:
        if metric not in outcome.METRICS:
            raise DsPruneError(f"{what}: unknown metric {metric!r} (known: {', '.join(outcome.METRICS)})")
        if outcome.SOURCE[metric] not in commands:
            raise DsPruneError(f"{what}: {metric} needs a `{outcome.SOURCE[metric]}` stage in the pipeline")
    if args.mode not in ("max", "min"):
        raise DsPruneError(f"mode must be max or min, not {args.mode!r}")
    objectives = _mapping(args.objectives, "objectives") or {}
    if not isinstance(objectives, dict):
        raise DsPruneError(f"objectives: expected {{metric: max|min}}, got {objectives!r}")
    for m, mode in objectives.items():
        if m not in outcome.METRICS or mode not in ("max", "min"):
            raise DsPruneError(f"objectives.{m}: expected a known metric with max or min, got {mode!r}")
        if outcome.SOURCE[m] not in commands:
            raise DsPruneError(f"objectives.{m}: needs a `{outcome.SOURCE[m]}` stage in the pipeline")
    if objectives and args.metric not in objectives:
        objectives = {args.metric: args.mode, **objectives}
    constraints = outcome.parse_constraints(_mapping(args.constraints, "constraints"), commands)
    if args.search not in SEARCHERS:
        raise DsPruneError(f"search must be one of {', '.join(SEARCHERS)}, not {args.search!r}")
    if args.scheduler not in SCHEDULERS:
        raise DsPruneError(f"scheduler must be one of {', '.join(SCHEDULERS)}, not {args.scheduler!r}")
    grid = [p.name for p in params if p.kind == "grid"]
    if args.search == "optuna" and grid:
        raise DsPruneError(f"search optuna samples its own points: use choice instead of grid for {', '.join(grid)}")
    if args.search == "grid" and len(grid) != len(params):
        raise DsPruneError("search grid: every parameter needs a grid (or use search random)")
    # a fraction of a GPU is still one device id: trials may share a GPU, a stage's ranks may not
    short = [f"{s.name} ({s.num_gpus})" for s in stages if s.launcher and s.num_gpus > math.ceil(args.trial_gpus)]
    if args.trial_gpus and short:
        raise DsPruneError(f"trial_gpus {args.trial_gpus:g}: fewer GPUs than the ranks of stage(s) "
                           f"{', '.join(short)}; a stage runs on its trial's GPUs only")
    if args.cpus and cluster_address(args):
        raise DsPruneError("cpus sizes a local Ray; a cluster (--address / RAY_ADDRESS) has its own CPUs")
    if args.num_samples < 1 or args.max_concurrent < 1:
        raise DsPruneError("num_samples and max_concurrent must be at least 1")
    if args.scheduler == "asha" and not (1 <= args.asha_grace <= args.asha_max_t and args.asha_reduction >= 2):
        raise DsPruneError("asha: need 1 <= asha_grace <= asha_max_t and asha_reduction >= 2")
    cache = Path(args.stage_cache) if args.stage_cache else Path(args.out) / "stages"
    return Sweep(out=str(Path(args.out).resolve()), cache=str(cache.resolve()), cwd=os.getcwd(), pipeline=doc,
                 params=params, metric=args.metric, mode=args.mode, objectives=objectives, constraints=constraints,
                 penalty=args.penalty)


def _searcher(args: Args, sweep: Sweep):
    if args.search != "optuna":
        return None  # Ray's BasicVariantGenerator: random samples and grid_search
    from ray.tune.search.optuna import OptunaSearch

    if sweep.objectives:
        return OptunaSearch(metric=list(sweep.objectives), mode=list(sweep.objectives.values()), seed=args.seed)
    return OptunaSearch(metric="objective", mode=sweep.mode, seed=args.seed)


STOPPED = "asha_stopped.txt"


def _scheduler(args: Args, sweep: Sweep):
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    class RecordingASHA(ASHAScheduler):
        """ASHA that notes the trials it stops: after an interruption, Ray's in-memory status cannot tell
        a trial ASHA ended from one the interruption cut short."""

        def on_trial_result(self, tune_controller, trial, result):
            decision = super().on_trial_result(tune_controller, trial, result)
            if decision == self.STOP:
                with open(Path(sweep.out) / STOPPED, "a") as f:
                    f.write(trial.trial_id + "\n")
            return decision

    if args.scheduler == "asha":
        return RecordingASHA(metric="objective", mode=sweep.mode, time_attr="training_iteration",
                             grace_period=args.asha_grace, max_t=args.asha_max_t,
                             reduction_factor=args.asha_reduction)
    return FIFOScheduler()


def run(args: Args) -> dict:
    """Run (or resume) the sweep; returns the summary also written to ``out/summary.json``."""
    sweep = build(args)
    out = Path(sweep.out)
    storage = args.storage_path or str(out / "ray")
    if "://" not in storage:
        storage = str(Path(storage).resolve())  # Ray's workers start elsewhere: a relative path would move
    exp = f"{storage.rstrip('/')}/{args.name}"
    if args.resume and args.overwrite:
        raise DsPruneError("--resume and --overwrite exclude each other")
    import ray
    from ray import tune

    if args.resume and not tune.Tuner.can_restore(exp):
        raise DsPruneError(f"--resume: no sweep in {exp} (start without --resume)")
    if not args.resume and out.exists() and any(out.iterdir()):
        if not args.overwrite:
            raise DsPruneError(f"output folder exists: {out} (pass --resume to continue it or --overwrite)")
        import shutil
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)

    from .trial import run_trial

    cpus = start_ray(args)
    try:
        bundle = {"CPU": args.trial_cpus or cpus / args.max_concurrent, "GPU": args.trial_gpus}
        trainable = tune.with_resources(tune.with_parameters(run_trial, spec=sweep),
                                        tune.PlacementGroupFactory([bundle]))
        if args.resume:
            # Errored trials too: Ray's default skips them for good, a trial whose node went away included. A trial
            # saves no Ray checkpoint (its built stages are its checkpoint), so it reruns from its first unbuilt
            # stage; one that fails again keeps its new error in the table.
            tuner = tune.Tuner.restore(exp, trainable, resume_unfinished=True, resume_errored=True)
        else:
            tuner = tune.Tuner(
                trainable,
                param_space={p.name: p.domain() for p in sweep.params},
                tune_config=tune.TuneConfig(num_samples=args.num_samples, search_alg=_searcher(args, sweep),
                                            scheduler=_scheduler(args, sweep),
                                            max_concurrent_trials=args.max_concurrent),
                # No retry within the sweep: a stage that failed on its inputs fails again, and a trial whose node
                # was lost is recorded as failed on that node, for --resume once the node is back. Ray counts a lost
                # actor as a failure unless the autoscaler drained its node as preempted: that trial it retries
                # whatever max_failures says.
                run_config=tune.RunConfig(name=args.name, storage_path=storage,
                                          failure_config=tune.FailureConfig(max_failures=0), verbose=1))
        grid = tuner.fit()
        trials = grid._experiment_analysis.trials  # same order as the results; they carry Ray's status
        stopped_file = out / STOPPED
        stopped = set(stopped_file.read_text().split()) if stopped_file.is_file() else set()
        rows = [_row(r, t.trial_id, t.trial_id in stopped, sweep, failed_before(t)) for r, t in zip(grid, trials)]
    finally:
        ray.shutdown()
    return summarise(rows, sweep, args)


def cluster_address(args: Args) -> str | None:
    return args.address or os.environ.get("RAY_ADDRESS") or None


def start_ray(args: Args) -> float:
    """Join the cluster at ``--address`` (or ``RAY_ADDRESS``), else start a local Ray of ``--cpus``; returns the
    CPUs trials may share. A cluster's size is its own: sizing options would contradict it."""
    import ray

    address = cluster_address(args)
    if address:
        ray.init(address=address, log_to_driver=True, ignore_reinit_error=True)
        return ray.cluster_resources().get("CPU", 1.0)
    cpus = args.cpus or os.cpu_count() or 1
    ray.init(address="local", num_cpus=cpus, num_gpus=None if args.trial_gpus else 0, include_dashboard=False,
             _temp_dir=str(ray_tmp_dir()), log_to_driver=True, ignore_reinit_error=True)
    return cpus


def node_of(sweep: Sweep, trial_id: str) -> str | None:
    """Where a trial ran, as it wrote it down: the host's address and Ray's node id (shortened), which tells
    apart nodes that share a host."""
    path = Path(sweep.out) / "trials" / trial_id / NODE
    if not path.is_file():
        return None
    node = formats.read_json(path, "trial node")
    return f"{node['ip']} {node['id'][:8]}"


def failed_before(trial) -> str | None:
    """The last failure Ray wrote down for a trial that has since run again (a preempted node's trial Ray retried,
    or one ``--resume`` reran): Ray's result forgets it once the trial finishes, its error file in the trial's
    folder keeps it."""
    from ray.air.constants import EXPR_ERROR_FILE

    path = f"{trial.storage.trial_fs_path}/{EXPR_ERROR_FILE}"
    try:
        with trial.storage.storage_filesystem.open_input_stream(path) as f:
            text = f.readall().decode(errors="replace")
    except (FileNotFoundError, OSError):
        return None
    return _last_line(text.rsplit("Failure # ", 1)[-1].split("\n", 1)[-1])


def _last_line(error: str) -> str | None:
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    return lines[-1][:400] if lines else None


def _row(result, trial_id: str, stopped: bool, sweep: Sweep, earlier: str | None = None) -> dict:
    m = dict(result.metrics or {})
    final = bool(m.get("final"))
    row = {"trial": trial_id, **{p.name: (result.config or {}).get(p.name) for p in sweep.params}}
    keep = [sweep.metric, *sweep.objectives, *(c.metric for c in sweep.constraints),
            "ndcg_at_10", "speedup", "query_speedup", "param_ratio", "params"]
    for k in dict.fromkeys(keep):
        row[k] = m.get(k) if final else None
    row["reports"] = m.get("training_iteration")
    row["minutes"] = round(m["time_total_s"] / 60, 1) if m.get("time_total_s") is not None else None
    row["feasible"] = bool(m.get("feasible")) if final else None
    row["model"] = m.get("model") if final else None
    row["node"] = node_of(sweep, trial_id)
    if result.error is None and earlier:
        row["failed_before"] = earlier  # a retry or --resume ran it again: its status is that run's
    if result.error is not None:
        row["status"] = "error"
        row["error"] = _last_line(str(result.error)) or "failed (see the trial's logs)"
    elif final:
        row["status"] = "done"
    elif stopped:
        row["status"] = "stopped early"  # ASHA ended it on an intermediate report
    else:
        row["status"] = "not finished"  # the sweep was interrupted: --resume continues it
    return row


def expected_trials(args: Args, sweep: Sweep) -> int:
    """Trials a complete sweep has: num_samples, times the grid's size."""
    n = args.num_samples
    for p in sweep.params:
        n *= p.size() or 1
    return n


def summarise(rows: list[dict], sweep: Sweep, args: Args) -> dict:
    """The table, the front and the best trial; written atomically beside the sweep's trials."""
    done = [r for r in rows if r["status"] == "done"]
    feasible = [r for r in done if r["feasible"]]
    # the front: over the sweep's objectives, else over (metric, the cost it is traded against)
    x = next((m for m in sweep.objectives if m != sweep.metric), None) or \
        next((c.metric for c in sweep.constraints), None) or "speedup"
    objectives = sweep.objectives or {sweep.metric: sweep.mode, x: "min" if x == "params" else "max"}
    sign = {m: 1 if mode == "max" else -1 for m, mode in objectives.items()}
    # best: the metric; among equal scores, the cheaper model
    best = max(feasible, key=lambda r: (sign[sweep.metric] * r[sweep.metric], sign[x] * (r.get(x) or 0)),
               default=None)
    front_ids = [feasible[i]["trial"] for i in outcome.pareto_front(feasible, objectives)]
    for r in rows:
        r["on_front"] = r["trial"] in front_ids
    summary = {"metric": sweep.metric, "mode": sweep.mode, "objectives": sweep.objectives,
               "constraints": [str(c) for c in sweep.constraints], "search": args.search,
               "scheduler": args.scheduler, "num_trials": len(rows),
               "interrupted": any(r["status"] == "not finished" for r in rows) or len(rows) < expected_trials(args, sweep),
               "counts": {s: sum(r["status"] == s for r in rows) for s in STATUSES},
               "best": best, "best_model": best["model"] if best else None, "front": front_ids, "trials": rows}
    out = Path(sweep.out)
    formats.write_json(out / SUMMARY, summary)
    formats.write_text(out / TABLE, table(rows, sweep, best))
    if any(r.get(x) is not None and r.get(sweep.metric) is not None for r in done):
        names = [p.name for p in sweep.params]
        plot_front(rows, sweep.metric, x, best, out / FRONT,
                   label=lambda r: " ".join(f"{n.split('.')[-1]}={_fmt(r.get(n))}" for n in names))
        summary["plot"] = str(out / FRONT)
    return summary


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def table(rows: list[dict], sweep: Sweep, best: dict | None) -> str:
    """A Markdown table of every trial, the best scores first among the finished ones, errors last."""
    cols = ["trial", *(p.name for p in sweep.params), sweep.metric,
            *[c for c in ("speedup", "param_ratio", "params") if any(r.get(c) is not None for r in rows)],
            "feasible", "on_front", "reports", "minutes", "node", "status"]
    cols = list(dict.fromkeys(cols))
    sign = 1 if sweep.mode == "max" else -1
    order = {s: i for i, s in enumerate(STATUSES)}
    rows = sorted(rows, key=lambda r: (order[r["status"]], -sign * (r.get(sweep.metric) or 0)))
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        mark = " **best**" if best and r["trial"] == best["trial"] else ""
        lines.append("| " + " | ".join(_fmt(r.get(c)) + (mark if c == "trial" else "") for c in cols) + " |")
    errors = [r for r in rows if r["status"] == "error"]
    text = "\n".join(lines) + "\n"
    if errors:
        text += "\nFailed trials:\n" + "".join(f"- {r['trial']}: {r['error']}\n" for r in errors)
    again = [r for r in rows if r.get("failed_before")]
    if again:
        text += "\nFailed, then run again:\n" + "".join(f"- {r['trial']}: {r['failed_before']}\n" for r in again)
    if sweep.constraints:
        text += "\nConstraints: " + "; ".join(map(str, sweep.constraints)) + "\n"
    text += f"\nBest feasible trial: {best['trial'] + ' -> ' + str(best['model']) if best else 'none'}\n"
    return text


def plot_front(rows: list[dict], y: str, x: str, best: dict | None, path: Path, label=None) -> Path:
    """Every finished trial as a point (x = cost, y = score, labelled by its values); the front joined,
    infeasible ones hollow."""
    from ..report.figure import pyplot, save_png

    plt = pyplot()

    pts = [r for r in rows if r["status"] == "done" and r.get(x) is not None and r.get(y) is not None]
    fig, ax = plt.subplots(figsize=(6, 4))
    ok = [r for r in pts if r["feasible"]]
    bad = [r for r in pts if not r["feasible"]]
    ax.scatter([r[x] for r in ok], [r[y] for r in ok], color="#4477aa", label="feasible trial", zorder=3)
    if bad:
        ax.scatter([r[x] for r in bad], [r[y] for r in bad], facecolors="none", edgecolors="#999999",
                   label="infeasible trial", zorder=3)
    front = sorted((r for r in pts if r.get("on_front")), key=lambda r: r[x])
    if front:
        ax.plot([r[x] for r in front], [r[y] for r in front], color="#cc6677", lw=1.5, label="Pareto front")
    if best:
        ax.scatter([best[x]], [best[y]], marker="*", s=180, color="#ddaa33", label="best", zorder=4)
    for r in pts:
        ax.annotate(label(r) if label else r["trial"], (r[x], r[y]), fontsize=6, xytext=(3, 3),
                    textcoords="offset points")
    ax.set_xlabel(f"{x} — {outcome.METRICS[x][0]}" if x in outcome.METRICS else x, fontsize=8)
    ax.set_ylabel(y)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return save_png(fig, path, dpi=120)

