"""Training throughput on 2 CPU cores: ZeRO-2 on 2 ranks against 1 process with 2 threads and the control,
1 process with 1 thread, set-ups interleaved in one run on the same data, with each rank's step broken down.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/train_throughput.py

Why: 2 ranks with one thread each compete with 1 process using both threads, and only the control (1 process,
1 thread) says what one core does alone: 2 ranks at twice the control is perfect data parallelism, and a rank's
compute per token against the control's says what sharing the machine costs. Every set-up trains the dense
baseline's configuration (``out/train_dense/train.yaml`` from ``benchmarks/train_dense.py``) with the same
per-rank batch, so 2 ranks see twice the sequences per step. Set-ups alternate (A B C D, D C B A, ...) over
``--repeats`` launches each, so drift in the machine hits all; a ratio is the median of the ratios within a
repeat, with their min–max. The first ``--warmup`` steps of a launch are excluded. Each step logs, per rank
(``--step_breakdown``): seconds of batch making, forward, loss (with the cross-rank gather of passages, where a
rank waits for the other's forward), backward and optimizer step, its padded tokens, and DeepSpeed's collectives
(bytes and seconds). A further set-up deals each step's groups to the ranks by length (``--length_buckets``).
The GPU case is projected on paper from the measured bytes per step (labelled a projection).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import BIN, REPO, launch_env, sh  # noqa: E402

# name: (ranks, threads per rank, length buckets)
SETUPS = {"zero2_2ranks": (2, 1, 0), "one_process_2threads": (1, 2, 0), "one_process_1thread": (1, 1, 0),
          "zero2_2ranks_bucketed": (2, 1, 1)}
CONTROL = "one_process_1thread"
# the ratios reported: each set-up against the control, 2 ranks against 1 process with both threads, and
# bucketing's own effect
PAIRS = [("zero2_2ranks", CONTROL), ("one_process_2threads", CONTROL), ("zero2_2ranks_bucketed", CONTROL),
         ("zero2_2ranks", "one_process_2threads"), ("zero2_2ranks_bucketed", "zero2_2ranks")]
PHASES = ("batch", "forward", "loss", "backward", "step")
# bytes a rank sends per byte of a collective's message (ring algorithms; the logger records the message each
# rank passes: the whole tensor for all-reduce, the rank's own part for all-gather)
WIRE = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather_into_tensor": lambda n: n - 1,
        "all_gather": lambda n: n - 1, "reduce_scatter_tensor": lambda n: (n - 1) / n,
        "reduce_scatter": lambda n: (n - 1) / n}
# the projection's assumptions (one A100-class GPU per rank)
GPU = {"bf16_flops": 312e12, "utilisation": 0.4, "nvlink_bytes_per_s": 300e9, "net_bytes_per_s": 100e9 / 8}


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def sig(x: float) -> float:
    """Three significant digits (the projection's times span microseconds to seconds)."""
    return float(f"{x:.3g}")


def spread(xs: list[float], digits: int = 3) -> dict:
    return {"median": round(med(xs), digits), "min": round(min(xs), digits), "max": round(max(xs), digits)}


def launch_figures(run: Path, warmup: int, group_size: int) -> dict:
    """One launch's throughput over the steps after the warm-up, and each rank's breakdown averaged over them."""
    from dsprune import formats

    rows = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    timed = rows[warmup:]
    if not timed:
        raise SystemExit(f"{run}: only {len(rows)} steps logged, none after the {warmup} warm-up steps")
    man = formats.read_manifest(run)
    batch, world = man["global_batch"], man["world_size"]
    seconds = sum(batch / r["queries_per_s"] for r in timed)
    ranks = []
    for rank in range(world):
        steps = [r["breakdown"][rank] for r in timed]
        avg = {k: sum(s.get(k, 0.0) for s in steps) / len(steps)
               for k in ("seconds", "tokens", "padded_tokens", *PHASES, "comm", "comm_bytes")}
        ops: dict = {}
        for s in steps:
            for op, o in s["comm_ops"].items():
                ops.setdefault(op, 0)
                ops[op] += o["bytes"] / len(steps)
        avg["comm_ops_bytes"] = ops
        ranks.append(avg)
    # per step: how far apart the ranks' padded work and their time in collectives were
    pad_gap = [max(b["padded_tokens"] for b in r["breakdown"]) - min(b["padded_tokens"] for b in r["breakdown"])
               for r in timed]
    comm_gap = [max(b["comm"] + b["loss"] for b in r["breakdown"]) - min(b["comm"] + b["loss"] for b in r["breakdown"])
                for r in timed]
    return {"world_size": world, "global_batch": batch, "timed_steps": len(timed), "seconds": seconds,
            "step_seconds": seconds / len(timed), "sequences_per_s": batch * (1 + group_size) * len(timed) / seconds,
            "padded_tokens_per_s": sum(sum(b["padded_tokens"] for b in r["breakdown"]) for r in timed) / seconds,
            "ranks": ranks, "padded_gap": sum(pad_gap) / len(pad_gap), "wait_gap_seconds": sum(comm_gap) / len(comm_gap),
            "params": man["params"], "peak_rss_gb_per_rank": man["figures"].get("peak_rss_gb_per_rank"),
            "malloc_mmap_threshold": man["figures"].get("malloc_mmap_threshold")}


def compute_seconds(r: dict) -> float:
    """A rank's own compute in a step: its phases less the time spent inside DeepSpeed's collectives and the
    loss phase (which holds the cross-rank gather and the wait for the other rank's forward)."""
    return r["forward"] + r["backward"] + r["step"] - r["comm"]


def summarise(runs: dict[str, list[dict]]) -> dict:
    """Per set-up: median and min–max over repeats; ratios against the control and 1 process x 2 threads as
    medians of within-repeat ratios."""
    from dsprune.eval.speed import pair_ratios

    out = {}
    for name, rs in runs.items():
        world = rs[0]["world_size"]
        per_rank = []
        for rank in range(world):
            rows = [r["ranks"][rank] for r in rs]
            per_rank.append({**{k: round(med([x[k] for x in rows]), 4) for k in (*PHASES, "comm", "seconds")},
                             "padded_tokens": round(med([x["padded_tokens"] for x in rows])),
                             "compute_seconds": round(med([compute_seconds(x) for x in rows]), 4),
                             "compute_ms_per_padded_token": round(med([1e3 * compute_seconds(x) /
                                                                       x["padded_tokens"] for x in rows]), 3),
                             "comm_bytes": round(med([x["comm_bytes"] for x in rows])),
                             "comm_ops_bytes": {op: round(med([x["comm_ops_bytes"].get(op, 0) for x in rows]))
                                                for op in rows[0]["comm_ops_bytes"]}})
        out[name] = {"ranks": world, "threads_per_rank": SETUPS[name][1], "length_buckets": SETUPS[name][2],
                     "global_batch": rs[0]["global_batch"], "repeats": len(rs), "timed_steps": rs[0]["timed_steps"],
                     "sequences_per_s": spread([r["sequences_per_s"] for r in rs]),
                     "padded_tokens_per_s": spread([r["padded_tokens_per_s"] for r in rs], 1),
                     "step_seconds": spread([r["step_seconds"] for r in rs], 2),
                     "padded_gap_tokens": round(med([r["padded_gap"] for r in rs])),
                     "wait_gap_seconds": round(med([r["wait_gap_seconds"] for r in rs]), 3),
                     "per_rank": per_rank, "peak_rss_gb_per_rank": rs[-1]["peak_rss_gb_per_rank"],
                     "malloc_mmap_threshold": rs[-1].get("malloc_mmap_threshold")}
    ratios = {}
    for name, ref in PAIRS:
        if name in runs and ref in runs:
            p = pair_ratios([r["sequences_per_s"] for r in runs[name]], [r["sequences_per_s"] for r in runs[ref]])
            ratios[f"{name} / {ref}"] = {k: round(p[k], 3) for k in ("median", "min", "max")}
    return {"setups": out, "sequences_per_s_ratios": ratios}


def communication(runs: dict[str, list[dict]]) -> dict:
    """Bytes each rank of the 2-rank set-up passes to DeepSpeed's collectives per step (measured), the bytes it
    sends on the wire (ring algorithms), and both per trainable parameter."""
    rs = runs["zero2_2ranks"]
    world, trainable = rs[0]["world_size"], rs[0]["params"]["trainable"]
    ops = {op: med([r["ranks"][0]["comm_ops_bytes"][op] for r in rs]) for op in rs[0]["ranks"][0]["comm_ops_bytes"]}
    message = sum(ops.values())
    wire = sum(WIRE.get(op, lambda n: 1.0)(world) * b for op, b in ops.items())
    return {"world_size": world, "params_trainable": trainable, "params_total": rs[0]["params"]["total"],
            "message_bytes_per_step": round(message), "message_bytes_per_op": {k: round(v) for k, v in ops.items()},
            "wire_bytes_per_rank_per_step": round(wire), "wire_bytes_per_trainable_param": round(wire / trainable, 2),
            "transfer_seconds": round(med([min(x["comm"] for x in r["ranks"]) for r in rs]), 4)}


def projection(summary: dict, comm: dict) -> dict:
    """The GPU case on paper: the measured bytes per step over NVLink and over a 100 Gb/s network, against the
    step's compute at an assumed GPU throughput, for this LoRA run and for full-parameter training (the same
    bytes per trainable parameter)."""
    two = summary["setups"]["zero2_2ranks"]["per_rank"]
    tokens = max(r["padded_tokens"] for r in two)
    full = comm["wire_bytes_per_trainable_param"] * comm["params_total"]
    cases = {}
    # FLOPs per parameter and token: forward (2), the forward again under gradient checkpointing (2) and the
    # activation gradients (2); full-parameter training also computes every weight's gradient (2)
    for what, nbytes, per in (("lora", comm["wire_bytes_per_rank_per_step"], 6), ("full_parameters", full, 8)):
        flops = per * comm["params_total"] * tokens
        compute_s = flops / (GPU["bf16_flops"] * GPU["utilisation"])
        cases[what] = {"flops_per_param_token": per, "flops_per_rank_per_step": flops, "gpu_compute_seconds":
                       sig(compute_s), "wire_bytes_per_rank": round(nbytes),
                       "nvlink_seconds": sig(nbytes / GPU["nvlink_bytes_per_s"]),
                       "net_100gbps_seconds": sig(nbytes / GPU["net_bytes_per_s"])}
    return {"label": "projection, not a measurement", "assumptions": GPU, "padded_tokens_per_rank": tokens,
            "cases": cases}


def findings(s: dict, comm: dict, proj: dict) -> dict:
    """The figures the verdict is read from: a rank's compute per token beside the control's (contention),
    communication's and waiting's share of the 2-rank step, and bucketing's effect."""
    st = s["setups"]
    two, ctl = st["zero2_2ranks"], st[CONTROL]
    per_tok = med([r["compute_ms_per_padded_token"] for r in two["per_rank"]])
    ctl_tok = ctl["per_rank"][0]["compute_ms_per_padded_token"]
    step = two["step_seconds"]["median"]
    out = {"compute_ms_per_padded_token": {"zero2_2ranks": per_tok, CONTROL: ctl_tok,
                                               "one_process_2threads":
                                                   st["one_process_2threads"]["per_rank"][0]["compute_ms_per_padded_token"]},
           "contention_factor": round(per_tok / ctl_tok, 2),
           "transfer_share_of_step": round(comm["transfer_seconds"] / step, 3),
           "wait_share_of_step": round(two["wait_gap_seconds"] / step, 3)}
    if "zero2_2ranks_bucketed" in st:
        b = st["zero2_2ranks_bucketed"]
        out["bucketing"] = {"padded_gap_tokens": [two["padded_gap_tokens"], b["padded_gap_tokens"]],
                            "wait_gap_seconds": [two["wait_gap_seconds"], b["wait_gap_seconds"]],
                            "ratio": s["sequences_per_s_ratios"].get("zero2_2ranks_bucketed / " + CONTROL, {})}
    for what, c in proj["cases"].items():
        out[f"projected_{what}_comm_over_compute"] = {
            "nvlink": sig(c["nvlink_seconds"] / c["gpu_compute_seconds"]),
            "net_100gbps": sig(c["net_100gbps_seconds"] / c["gpu_compute_seconds"])}
    return out


def table(s: dict) -> str:
    lines = [f"{'setup':<22} {'ranks':>5} {'thr':>3} {'batch':>5} {'seq/s [min-max]':>22} "
             f"{'rank':>4} {'fwd':>6} {'loss':>6} {'bwd':>6} {'step':>6} {'comm':>6} {'ms/token':>9} {'pad tok':>7}"]
    for name, r in s["setups"].items():
        q = r["sequences_per_s"]
        for k, pr in enumerate(r["per_rank"]):
            head = (f"{name:<22} {r['ranks']:>5} {r['threads_per_rank']:>3} {r['global_batch']:>5} "
                    f"{q['median']:>8.3f} [{q['min']:.3f}-{q['max']:.3f}]") if k == 0 else " " * 62
            lines.append(f"{head} {k:>4} {pr['forward']:>6.2f} {pr['loss']:>6.2f} {pr['backward']:>6.2f} "
                         f"{pr['step']:>6.2f} {pr['comm']:>6.2f} {pr['compute_ms_per_padded_token']:>9.2f} "
                         f"{pr['padded_tokens']:>7}")
    lines.append("")
    lines += [f"{k}: {v['median']:.3f}x [{v['min']:.3f}-{v['max']:.3f}]" for k, v in s["sequences_per_s_ratios"].items()]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=str(REPO / "out" / "train_dense" / "train.yaml"),
                    help="a launchers/train.py config (default: the dense baseline's)")
    ap.add_argument("--steps", type=int, default=2, help="optimizer steps per launch, warm-up included")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3, help="launches per set-up, interleaved")
    ap.add_argument("--per-device-batch", type=int, default=2,
                    help="queries per rank per step, instead of the config's (0 = keep it): small, so that 12 "
                         "launches fit in ~15 min on 2 cores")
    ap.add_argument("--setups", nargs="+", default=list(SETUPS), choices=list(SETUPS))
    ap.add_argument("--until", default="", help="UTC time HH:MM: start no round of launches that would end after "
                                                "it (the last round's duration as the guide); at least 2 rounds run")
    ap.add_argument("--out", default=str(REPO / "out" / "train_throughput"))
    ap.add_argument("--reuse", action="store_true", help="summarise the launches an earlier run left in --out "
                                                         "(launches.json) instead of launching")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results" / "training" / "throughput.json"))
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    if not {"zero2_2ranks", CONTROL, "one_process_2threads"} <= set(a.setups):
        ap.error(f"--setups must include zero2_2ranks, one_process_2threads and {CONTROL}")
    config = Path(a.config)
    if not config.is_file():
        ap.error(f"--config {config}: not found (make it with benchmarks/train_dense.py --prepare-only)")

    import yaml

    from dsprune import formats
    from dsprune.distributed import free_port

    cfg = yaml.safe_load(config.read_text())
    group_size = int(cfg.get("group_size", 8))
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[dict]] = {n: [] for n in a.setups}
    commands, command, version = {}, " ".join([sys.executable, *sys.argv]), formats.code_version()
    if a.reuse:
        done = formats.read_json(out / "launches.json", "earlier launches")
        runs, commands, command = done["runs"], done["commands"], done["command"]
        version = done.get("code_version", version)
    import datetime
    import time
    t_round = None
    for rep in range(0 if a.reuse else a.repeats):
        if a.until and rep >= 2 and t_round:
            now = datetime.datetime.now(datetime.timezone.utc)
            end = now.replace(hour=int(a.until[:2]), minute=int(a.until[3:5]), second=0)
            if now + datetime.timedelta(seconds=t_round) > end:
                print(f"stopping after {rep} rounds: another would end after {a.until} UTC", flush=True)
                break
        t0 = time.time()
        for name in (a.setups if rep % 2 == 0 else a.setups[::-1]):   # alternating order
            ranks, threads, buckets = SETUPS[name]
            run = out / name / f"repeat{rep}"
            cmd = [str(BIN / "deepspeed"), "--num_gpus", str(ranks), "--master_port", str(free_port()),
                   "launchers/train.py", "--config", str(config), "--max_steps", str(a.steps), "--save_steps", "0",
                   "--export", "false", "--output_dir", str(run), "--overwrite", "true", "--step_breakdown", "true",
                   "--length_buckets", str(buckets)]
            if a.per_device_batch:
                cmd += ["--per_device_batch_size", str(a.per_device_batch)]
            commands[name] = f"OMP_NUM_THREADS={threads} " + " ".join(cmd)
            sh(cmd, out / "logs" / f"{name}-{rep}.log", launch_env(OMP_NUM_THREADS=str(threads)))
            runs[name].append(launch_figures(run, a.warmup, group_size))
            # what is done so far, should the run be cut short
            formats.write_json(out / "launches.json", {"runs": runs, "commands": commands, "command": command,
                                                        "code_version": version})
        t_round = time.time() - t0

    s = summarise(runs)
    comm = communication(runs)
    proj = projection(s, comm)
    doc = {"config": str(config), "model": Path(str(cfg.get("model"))).name, "lora_r": cfg.get("lora_r"),
           "per_device_batch": a.per_device_batch or cfg.get("per_device_batch_size"),
           "group_size": group_size, "passage_max_length": cfg.get("passage_max_length"),
           "query_max_length": cfg.get("query_max_length"), "lora": cfg.get("lora"),
           "gradient_checkpointing": cfg.get("gradient_checkpointing"), "deepspeed": cfg.get("deepspeed"),
           "steps": a.steps, "warmup_steps": a.warmup, "repeats": len(next(iter(runs.values()))),
           "order": "alternating",
           **s, "communication": comm, "projection": proj, "findings": findings(s, comm, proj),
           "code_version": version, "commands": commands, "command": command}
    if a.reuse:
        doc["summarised_by"] = " ".join([sys.executable, *sys.argv])
    formats.write_json(Path(a.results), doc)
    print()
    print(table(s))
    f = doc["findings"]
    print(f"compute per padded token (ms): {f['compute_ms_per_padded_token']}; contention "
          f"{f['contention_factor']}x; transfer {f['transfer_share_of_step']:.1%} and waiting "
          f"{f['wait_share_of_step']:.1%} of the 2-rank step; {comm['wire_bytes_per_rank_per_step'] / 1e6:.1f} MB "
          f"sent per rank per step")
    print(f"wrote {a.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
