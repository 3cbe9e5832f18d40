"""One sweep trial: the pipeline run with the trial's values, stage by stage, through the recipe runner.

Stages live in the sweep's shared stage cache, keyed by their inputs, so two trials that differ only in the
mask ratio share the (expensive) slimming run. While a training stage runs, its periodic eval rows
(``eval_ndcg_at_10`` in the launcher's ``log.jsonl``) are reported to Ray as intermediate results: that is
what ASHA prunes on. Each stage runs in its own process group, so a trial the scheduler stops takes its
DeepSpeed ranks down with it. Every report also goes to the trial's own TensorBoard run.

A trial's DeepSpeed stages run on the GPUs Ray assigned to the trial: ``deepspeed --num_gpus N`` would take
devices 0..N-1 of its node whatever Ray reserved, so trials side by side on one node would share GPUs.
The node the trial ran on is written beside its config for the sweep's table.
"""
from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from ..recipe import run_recipe
from . import outcome, space

POLL_SECONDS = 0.5
NODE = "node.json"


class Reporter:
    """Sends a trial's results to Ray and to its TensorBoard run, numbering them as iterations."""

    def __init__(self, trial_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(trial_dir / "tensorboard"))
        self.iteration = 0

    def report(self, metrics: dict, final: bool) -> None:
        from ray import tune

        self.iteration += 1
        row = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, bool)) or v is None}
        row["final"] = final
        for k, v in row.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.writer.add_scalar(f"tune/{k}", v, self.iteration)
        self.writer.flush()
        tune.report(row)

    def close(self) -> None:
        self.writer.close()


class Watcher:
    """Runs a stage command in its own process group; reports new in-training eval scores while it runs."""

    def __init__(self, reporter: Reporter, logs: Path, metric: str, gpus: list[str] = ()):
        self.reporter, self.logs, self.metric, self.gpus = reporter, logs, metric, list(gpus)
        self.last_error = ""  # the failing stage's own error line, for the sweep's table
        logs.mkdir(parents=True, exist_ok=True)

    def __call__(self, cmd: list[str], folder: Path) -> int:
        seen = 0
        cmd = on_trial_gpus(cmd, self.gpus)
        with open(self.logs / f"{folder.name}.log", "w") as log:
            log.write("$ " + shlex.join(cmd) + "\n")
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
            try:
                while proc.poll() is None:
                    time.sleep(POLL_SECONDS)
                    seen = self._report_new(folder, seen)
                self._report_new(folder, seen)
                if proc.returncode != 0:
                    self.last_error = _error_line(self.logs / f"{folder.name}.log")
                return proc.returncode
            finally:  # stopped by the scheduler (or an error here): end the stage's whole process tree
                if proc.poll() is None:
                    kill_group(proc)

    def replay(self, folder: Path) -> None:
        """A stage another trial already ran: report its eval rows too, so every trial reaches ASHA's
        rungs through the same reports."""
        self._report_new(folder, 0)

    def _report_new(self, folder: Path, seen: int) -> int:
        log = folder / "log.jsonl"
        if not log.is_file():
            return seen
        rows = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        for r in rows[seen:]:
            if "eval_ndcg_at_10" in r:
                score = r["eval_ndcg_at_10"]
                self.reporter.report({self.metric: score, "objective": score, "stage": folder.name,
                                      "step": r["step"]}, final=False)
        return len(rows)


def on_trial_gpus(cmd: list[str], gpus: list[str]) -> list[str]:
    """A stage's ``deepspeed --num_gpus N`` command on the first N of the trial's GPUs (``--include
    localhost:IDS``: the launcher then sets each rank's CUDA_VISIBLE_DEVICES to those ids); other commands, and
    trials without GPUs, unchanged."""
    if not gpus or "--num_gpus" not in cmd:
        return cmd
    i = cmd.index("--num_gpus")
    n = int(cmd[i + 1])
    if n > len(gpus):
        raise DsPruneError(f"a stage asks for {n} GPUs, its trial holds {len(gpus)} (raise trial_gpus)")
    return [*cmd[:i], "--include", "localhost:" + ",".join(map(str, gpus[:n])), *cmd[i + 2:]]


def write_node(trial_dir: Path) -> None:
    """The Ray node this trial runs on, for the sweep's table, and the worker process on it (its logs name it)."""
    import ray

    formats.write_json(trial_dir / NODE, {"id": ray.get_runtime_context().get_node_id(),
                                          "ip": ray.util.get_node_ip_address(), "gpus": ray.get_gpu_ids(),
                                          "pid": os.getpid()})


def _die_with_parent() -> None:
    """In the child: SIGTERM it if the trial's thread dies (Ray killing the trial's worker, say); the
    DeepSpeed launcher passes SIGTERM on to its ranks."""
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _error_line(log: Path) -> str:
    lines = [l.strip() for l in log.read_text(errors="replace").splitlines() if l.strip()]
    errors = [l for l in lines if l.startswith("error:") or "Error" in l]
    return (errors or lines or ["(no output)"])[-1][:300]


def kill_group(proc: subprocess.Popen, grace: float = 10) -> None:
    """End ``proc``'s process group: SIGTERM, then SIGKILL if its leader is still there after ``grace`` s."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def run_trial(config: dict, spec) -> None:
    """The Ray Tune function trainable (``spec`` is the sweep's ``Sweep``, bound with ``tune.with_parameters``)."""
    import ray
    from ray import tune

    trial_dir = Path(spec.out) / "trials" / tune.get_context().get_trial_id()
    trial_dir.mkdir(parents=True, exist_ok=True)
    write_node(trial_dir)
    # Ray starts trials in their own folder; the pipeline's relative paths mean the user's
    with contextlib.chdir(spec.cwd):
        _run(config, spec, trial_dir, [str(g) for g in ray.get_gpu_ids()])


def _run(config: dict, spec, trial_dir: Path, gpus: list[str] = ()) -> None:
    formats.write_text(trial_dir / "config.json", json.dumps(config, indent=1, default=str))
    reporter = Reporter(trial_dir)
    watcher = Watcher(reporter, trial_dir / "logs", spec.metric, gpus)
    try:
        try:
            report = run_recipe(spec.pipeline, out=str(trial_dir), overrides=space.overrides(spec.params, config),
                                cache=spec.cache, execute=watcher, on_reuse=watcher.replay)
        except DsPruneError as e:
            raise DsPruneError(f"{e} -- {watcher.last_error}" if watcher.last_error else str(e)) from None
        formats.write_text(trial_dir / "stages.json", json.dumps(report, indent=1, default=str))
        metrics = outcome.pipeline_metrics(report)
        metrics["model"] = _evaluated_model(report)
        metrics.update(spec.judge(metrics))
        reporter.report(metrics, final=True)
    finally:
        reporter.close()


def _evaluated_model(report: dict[str, dict]) -> str | None:
    """The model folder the last eval stage scored (the trial's export)."""
    model = None
    for info in report.values():
        if info.get("command") == "eval":
            model = info["args"].get("model")
    return model
