"""RESULTS.md's section for training throughput (``benchmarks/train_throughput.py``): the set-ups side by side,
where each rank's step time goes, what limits 2 ranks on 2 cores, and the GPU case projected from the measured
bytes per step, every sentence computed from the committed JSON."""
from __future__ import annotations

from pathlib import Path

from .section import section_result

FILE = Path("training") / "throughput.json"
TITLE = "Training throughput on 2 CPU cores"
LABELS = {"zero2_2ranks": "ZeRO-2, 2 ranks", "one_process_2threads": "1 process", "one_process_1thread":
          "1 process (control)", "zero2_2ranks_bucketed": "ZeRO-2, 2 ranks, length buckets"}
CONTROL = "one_process_1thread"


def _x(r: dict) -> str:
    return f"{r['median']:.2f}× [{r['min']:.2f}–{r['max']:.2f}]"


def _mb(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n < 1e9 else f"{n / 1e9:.2f} GB"


def _ms(s: float) -> str:
    return f"{s * 1e3:.2g} ms" if s < 1 else f"{s:.1f} s"


def setup_table(d: dict) -> list[str]:
    ratios = d["sequences_per_s_ratios"]
    out = ["| set-up | ranks × threads | queries per step | sequences/s | vs control | rank | forward | loss | "
           "backward | optimizer step | in collectives | compute, ms per padded token | padded tokens |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, s in d["setups"].items():
        q = s["sequences_per_s"]
        vs = "1" if name == CONTROL else _x(ratios[f"{name} / {CONTROL}"]) if f"{name} / {CONTROL}" in ratios else "–"
        for k, r in enumerate(s["per_rank"]):
            head = (f"| {LABELS.get(name, name)} | {s['ranks']} × {s['threads_per_rank']} | {s['global_batch']} | "
                    f"{q['median']:.3f} [{q['min']:.3f}–{q['max']:.3f}] | {vs} |") if k == 0 else "| | | | | |"
            out.append(f"{head} {k} | {r['forward']:.2f} | {r['loss']:.2f} | {r['backward']:.2f} | {r['step']:.2f} | "
                       f"{r['comm']:.2f} | {r['compute_ms_per_padded_token']:.2f} | {r['padded_tokens']} |")
    return out


def limits(d: dict) -> str:
    """What limits 2 ranks, in words: the seconds per step each cause costs against ranks that computed at the
    control's speed, sent nothing and never waited; and against 1 process with both threads."""
    f, c, r = d["findings"], d["communication"], d["sequences_per_s_ratios"]
    two = d["setups"]["zero2_2ranks"]
    per_tok = f["compute_ms_per_padded_token"]
    tokens = sum(x["padded_tokens"] for x in two["per_rank"]) / len(two["per_rank"])
    lost = {"compute slowed by sharing the machine": (per_tok["zero2_2ranks"] - per_tok[CONTROL]) * tokens / 1e3,
            "communication itself": c["transfer_seconds"],
            "waiting for the other rank": two["wait_gap_seconds"]}
    step = two["step_seconds"]["median"]
    parts = "; ".join(f"{k} {v:+.2f} s ({v / step:+.0%})" for k, v in lost.items())
    vs_ctl, vs_two = r[f"zero2_2ranks / {CONTROL}"]["median"], r["zero2_2ranks / one_process_2threads"]["median"]
    threads = r[f"one_process_2threads / {CONTROL}"]["median"]
    if sum(max(v, 0) for v in lost.values()) < 0.1 * step:
        head = (f"**2 ranks are close to perfect data parallelism here ({vs_ctl:.2f}× the control, 2× perfect): "
                f"what keeps them at {vs_two:.2f}× of 1 process is that process, whose second thread already gives "
                f"{threads:.2f}× the control.**")
    else:
        head = f"**What limits 2 ranks here: {max(lost, key=lost.get)}.**"
    shared = ("two ranks share the memory bandwidth and caches of one machine, which a second GPU or node does not"
              if f["contention_factor"] > 1.1 else "at this batch the two ranks do not slow each other's compute")
    return (f"{head} Of the {step:.1f} s 2-rank step, against ranks that would compute at the control's speed, "
            f"send nothing and never wait: {parts}. A rank's compute per padded token is "
            f"{f['contention_factor']:.2f}× the control's with both cores busy ({shared}); 1 process with 2 threads "
            f"takes {per_tok['one_process_2threads'] / per_tok[CONTROL]:.2f}× the control's time per token.")


def projection(d: dict) -> str:
    p, c = d["projection"], d["communication"]
    a, lora, full = p["assumptions"], p["cases"]["lora"], p["cases"]["full_parameters"]
    comp = lora["gpu_compute_seconds"]
    even = d["per_device_batch"] * lora["net_100gbps_seconds"] / comp
    how = (": DeepSpeed all-reduces the gradients and all-gathers the updated partitions"
           if {"all_reduce", "all_gather_into_tensor"} <= set(c["message_bytes_per_op"]) else "")
    return (f"**GPU case (a projection, not a measurement).** Measured: each rank sends {_mb(lora['wire_bytes_per_rank'])} "
            f"per step ({c['wire_bytes_per_trainable_param']:.1f} bytes per trainable parameter{how}; messages per op "
            f"{', '.join(f'{k} {_mb(v)}' for k, v in c['message_bytes_per_op'].items())}). Assumed: one GPU per rank "
            f"at {a['utilisation']:.0%} of {a['bf16_flops'] / 1e12:.0f} TFLOP/s, NVLink {a['nvlink_bytes_per_s'] / 1e9:.0f} GB/s, "
            f"a {a['net_bytes_per_s'] * 8 / 1e9:.0f} Gb/s network between nodes. A rank's {p['padded_tokens_per_rank']} "
            f"padded tokens then compute in {_ms(comp)} ({lora['flops_per_param_token']} FLOPs per parameter and token: "
            f"forward, its recomputation under gradient checkpointing, activation gradients); the LoRA step's bytes take {_ms(lora['nvlink_seconds'])} "
            f"over NVLink and {_ms(lora['net_100gbps_seconds'])} over the network, "
            f"{d['findings']['projected_lora_comm_over_compute']['nvlink']:.2g}× and "
            f"{d['findings']['projected_lora_comm_over_compute']['net_100gbps']:.2g}× the compute; the network time "
            f"equals the compute at ~{even:.1f} queries per rank and shrinks in share as the batch grows. Full-parameter training "
            f"at the same bytes per parameter sends {_mb(full['wire_bytes_per_rank'])} per step: {_ms(full['nvlink_seconds'])} "
            f"over NVLink, {_ms(full['net_100gbps_seconds'])} over the network "
            f"({d['findings']['projected_full_parameters_comm_over_compute']['net_100gbps']:.2g}× its "
            f"{_ms(full['gpu_compute_seconds'])} of compute, {full['flops_per_param_token']} FLOPs per parameter and "
            f"token with the weight gradients)"
            + (", so across nodes it needs ZeRO's overlap of communication with the backward pass, or gradient "
               "accumulation." if d['findings']['projected_full_parameters_comm_over_compute']['net_100gbps'] > 1
               else ", so the network keeps up with the compute across nodes."))


def bucketing(d: dict) -> str | None:
    b = d["findings"].get("bucketing")
    if not b:
        return None
    tokens = sum(x["padded_tokens"] for x in d["setups"]["zero2_2ranks"]["per_rank"]) / 2
    why = (f" The ranks already padded alike without them ({b['padded_gap_tokens'][0] / tokens:.1%} of a rank's "
           f"{tokens:.0f} padded tokens apart: passages cut at {d['passage_max_length']} tokens mostly fill the cut), "
           f"so there was little to balance." if b["padded_gap_tokens"][0] < 0.05 * tokens else "")
    return (f"**Length buckets** (`--length_buckets 1`: each step's groups sorted by padded length and dealt to the "
            f"ranks in turn): the ranks' padded tokens per step differ by {b['padded_gap_tokens'][1]} instead of "
            f"{b['padded_gap_tokens'][0]}, their time in collectives and the loss's gather by "
            f"{b['wait_gap_seconds'][1]:.2f} s instead of {b['wait_gap_seconds'][0]:.2f} s; sequences/s against "
            f"2 ranks without buckets: {_x(d['sequences_per_s_ratios']['zero2_2ranks_bucketed / zero2_2ranks'])}.{why}")


def render_throughput(results: Path) -> list[str]:
    d = section_result(results / FILE, {"setups", "repeats", "findings", "projection", "command"},
                       "benchmarks/train_throughput.py (with repeats)")
    if d is None:
        return []
    r, c = d["sequences_per_s_ratios"], d["communication"]
    out = [f"## {TITLE}", "",
           f"The dense baseline's training configuration (`{d['model']}`, {c['params_total'] / 1e6:.1f}M parameters, "
           f"LoRA r = {d['lora_r']}: {c['params_trainable'] / 1e6:.2f}M trainable, {d['group_size']} passages per "
           f"query cut at {d['passage_max_length']} tokens, gradient checkpointing "
           f"{'on' if d['gradient_checkpointing'] else 'off'}, `{d['deepspeed']}`) at "
           f"{d['per_device_batch']} queries per rank, {d['steps']} steps per launch, the first "
           f"{d['warmup_steps']} of them not timed. Set-ups alternate over {d['repeats']} launches each "
           f"(A B C D, D C B A, …); sequences/s is the median over launches [min–max], a ratio the median of the "
           f"ratios within a launch round [min–max]. Per rank, seconds per step (`--step_breakdown`): the loss "
           f"phase holds the cross-rank gather of passages, where a rank waits for the other's forward; *in "
           f"collectives* is the time inside DeepSpeed's collectives during backward and step (waiting included); "
           f"*compute* is forward + backward + optimizer step less that time. Made by `{d['command']}` "
           f"({d['code_version']}).", ""]
    out += setup_table(d) + [""]
    out += [f"2 ranks reach {_x(r[f'zero2_2ranks / {CONTROL}'])} the control's sequences/s (perfect data "
            f"parallelism: 2×) and {_x(r['zero2_2ranks / one_process_2threads'])} those of 1 process with both "
            f"threads, which itself reaches {_x(r[f'one_process_2threads / {CONTROL}'])} the control's.", "",
            limits(d), ""]
    b = bucketing(d)
    if b:
        out += [b, ""]
    out += [projection(d), ""]
    peaks = "; ".join(f"{LABELS.get(k, k)} {'/'.join(f'{g:.1f}' for g in s['peak_rss_gb_per_rank'] or [])} GB"
                      for k, s in d["setups"].items())
    held = {s.get("malloc_mmap_threshold") for s in d["setups"].values()}
    how = (f"glibc's mmap threshold held at {held.pop() / 2**20:g} MiB" if len(held) == 1 and None not in held
           and 0 not in held else "glibc's mmap threshold as each launch set it")
    out += [f"Peak resident memory per rank ({how}, `dsprune.memory`): {peaks}.", ""]
    return out
