"""Training throughput of ZeRO-2 on 2 ranks against 1 process, in one run, on the same cores and data.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/train_throughput.py

Why: on 2 CPU cores two ranks with one thread each compete with one process using both threads; only a
measurement in one run on one machine state says whether data parallelism pays here. Both runs train the
dense baseline's exact configuration (``out/train_dense/train.yaml`` from ``benchmarks/train_dense.py``) for
the same number of steps with the same per-rank batch, so the 2-rank run sees twice the sequences per step.
The first ``--warmup`` steps are excluded (thread pools, allocator, DeepSpeed's first step). Also reported:
each rank's peak resident memory as a multiple of the model's fp32 bytes (the trainer's manifest).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, sh  # noqa: E402


def measured(run: Path, warmup: int, group_size: int) -> dict:
    """Throughput over the steps after the warm-up, from the trainer's per-step log."""
    from dsprune import formats

    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    timed = rows[warmup:]
    if not timed:
        raise SystemExit(f"{run}: only {len(rows)} steps logged, none after the {warmup} warm-up steps")
    man = formats.read_manifest(run)
    batch = man["global_batch"]
    seconds = sum(batch / r["queries_per_s"] for r in timed)
    queries = batch * len(timed)
    return {"world_size": man["world_size"], "global_batch": batch, "timed_steps": len(timed),
            "seconds": round(seconds, 1), "queries_per_s": round(queries / seconds, 4),
            "sequences_per_s": round(queries * (1 + group_size) / seconds, 3),
            "tokens_per_s": round(sum(r["tokens_per_s"] * batch / r["queries_per_s"] for r in timed) / seconds, 1),
            "setup_peak_rss_gb_per_rank": man["figures"].get("setup_peak_rss_gb_per_rank"),
            "peak_rss_gb_per_rank": man["figures"].get("peak_rss_gb_per_rank"),
            "params": man["params"]["total"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "out" / "train_dense" / "train.yaml"),
                    help="a launchers/train.py config (default: the dense baseline's)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2, help="cores shared by both set-ups")
    ap.add_argument("--out", default=str(REPO / "out" / "train_throughput"))
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "training" / "throughput.json"))
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    config = Path(a.config)
    if not config.is_file():
        ap.error(f"--config {config}: not found (make it with benchmarks/train_dense.py)")

    import yaml

    from dsprune import formats
    from dsprune.distributed import free_port

    group_size = int(yaml.safe_load(config.read_text()).get("group_size", 8))
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    setups = {"zero2_2ranks": (2, a.threads // 2), "one_process": (1, a.threads)}
    results, commands = {}, {}
    for name, (ranks, threads) in setups.items():
        run = out / name
        cmd = [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()),
               "launchers/train.py", "--config", str(config), "--max_steps", str(a.steps), "--save_steps", "0",
               "--export", "false", "--output_dir", str(run), "--overwrite", "true"]
        commands[name] = f"OMP_NUM_THREADS={threads} " + " ".join(cmd)
        sh(cmd, out / "logs" / f"{name}.log", launch_env(OMP_NUM_THREADS=str(threads)))
        results[name] = {"threads_per_rank": threads, **measured(run, a.warmup, group_size)}

    two, one = results["zero2_2ranks"], results["one_process"]
    fp32_gb = two["params"] * 4 / 2**30
    summary = {"config": str(config), "steps": a.steps, "warmup_steps": a.warmup, "group_size": group_size,
               "setups": results, "speedup_sequences_per_s": round(two["sequences_per_s"] / one["sequences_per_s"], 3),
               "model_fp32_gb": round(fp32_gb, 3),
               "peak_rss_over_model_fp32": {k: [round(g / fp32_gb, 1) for g in (r["peak_rss_gb_per_rank"] or [])]
                                            for k, r in results.items()},
               "commands": commands, "command": " ".join([sys.executable, *sys.argv])}
    formats.write_json(Path(a.results), summary)
    print(f"\n{'setup':<14} {'ranks':>5} {'thr/rank':>8} {'batch':>5} {'seq/s':>8} {'tok/s':>7} "
          f"{'GB/rank set-up':>14} {'GB/rank peak':>12}")
    for k, r in results.items():
        setup, peaks = ("/".join(f"{g:.1f}" for g in r[f] or []) for f in ("setup_peak_rss_gb_per_rank",
                                                                           "peak_rss_gb_per_rank"))
        print(f"{k:<14} {r['world_size']:>5} {r['threads_per_rank']:>8} {r['global_batch']:>5} "
              f"{r['sequences_per_s']:>8.3f} {r['tokens_per_s']:>7.1f} {setup:>14} {peaks:>12}")
    print(f"2 ranks vs 1 process: {summary['speedup_sequences_per_s']:.3f}x sequences/s; "
          f"model fp32 {fp32_gb:.2f} GB; peak/rank over fp32 model: {summary['peak_rss_over_model_fp32']}")
    print(f"wrote {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
