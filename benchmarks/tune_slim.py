"""A real sweep: slimming ratio x λ on the dense SmolLM2 retriever, scored on scifact_small, costed by measured
encoding speed-up; prints the trial table and keeps it with the front in ``benchmarks/results/``.

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/tune_slim.py > out/tune_slim.log 2>&1 &

Runs ``dsprune tune --config tuning/slim_smollm2.yaml`` (8 trials: 4 ratios x 2 λ; each a real DeepSpeed
slimming stage shared by the trials with its λ, a global mask, an export, ``dsprune eval`` and ``dsprune
bench``). Rerun it after an interruption: it continues the sweep with ``--resume`` (finished trials and
stages are kept). The dense retriever comes from ``benchmarks/train_dense.py``, run first if missing.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, sh  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "tuning" / "slim_smollm2.yaml"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "tune_slim_smollm2"),
                    help="where the table, summary and front are kept (committed)")
    a = ap.parse_args()

    from dsprune import formats
    from dsprune.config import load_config_file
    from dsprune.tune.sweep import FRONT, SUMMARY, TABLE, Args

    env = launch_env(RAY_AUTH_MODE="disabled")
    cfg = Args(**load_config_file(a.config))
    out = REPO / cfg.out
    logs = REPO / "out" / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    if not (REPO / "out" / "train_dense" / "run" / "model").is_dir():
        sh([sys.executable, str(REPO / "benchmarks" / "train_dense.py")], logs / "train_dense.log", env)
    cmd = [str(BIN / "dsprune"), "tune", "--config", a.config]
    if (out / "ray" / cfg.name).is_dir():
        cmd.append("--resume")
    seconds = sh(cmd, logs / "tune_slim.log", env)

    summary = formats.read_json(out / SUMMARY)
    dest = Path(a.results)
    table = (out / TABLE).read_text()
    command = " ".join([sys.executable, *sys.argv])
    note = ("SmolLM2-135M-Instruct (Q4_1 dequantised, standing in for a base model) trained into a dense retriever "
            "by benchmarks/train_dense.py; scaled for 2 CPU cores as tuning/slim_smollm2.yaml says.")
    trial_minutes = sum(r.get("minutes") or 0 for r in summary["trials"])
    with formats.output_dir(dest, overwrite=True) as tmp:
        shutil.copy(out / FRONT, tmp / FRONT)
        (tmp / TABLE).write_text(f"# Sweep: {Path(a.config).name}\n\nMade by `{command}`: trials took "
                                 f"{trial_minutes:.0f} min in all, one at a time (this invocation, which may have "
                                 f"only resumed or collected them: {seconds / 60:.1f} min).\n{note}\n\n{table}")
        (tmp / SUMMARY).write_text(json.dumps({**summary, "command": command, "config": a.config}, indent=1,
                                              default=str))
    print(table)
    print(f"kept in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
