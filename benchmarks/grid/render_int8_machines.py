"""int8 against float32 on each machine that ran ``recipes/int8-embedder.yaml`` (benchmarks/int8_machine.py): one
row per CPU, since int8's speed-up is the CPU's int8 kernels' and differs between instruction sets."""
from __future__ import annotations

from pathlib import Path

from dsprune.report.compare import scored

from .section import section_result

MADE_BY = "benchmarks/int8_machine.py"
KEYS = {"command", "machine", "speed", "report", "threads"}


def render_int8_machines(results: Path, heading: str = "### int8 per machine") -> list[str]:
    runs = [d for p in sorted(results.glob("int8_machine_*.json")) if (d := section_result(p, KEYS, MADE_BY))]
    if not runs:
        return []
    out = [heading, "",
           f"`{MADE_BY}` keeps each machine's run of `recipes/int8-embedder.yaml`: the same model scored in float32 "
           "and with dynamic int8 Linear layers (those `quantize_skip` names kept float32), and `dsprune bench` of "
           "int8 against float32 in one run. nDCG@10 is the mean over the tasks, int8's in brackets as the "
           "difference to float32 with its 95 % paired bootstrap interval over queries; a speed-up is the median "
           "of alternating pairs, min–max in brackets.", "",
           "| CPU | torch kernels | int8 instructions | threads | model | kept float32 | float32 | int8 | kept "
           "| document speed-up | query speed-up |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for d in runs:
        rep, m = d["report"], d["machine"]
        ref = next(r for r in rep["rows"] if r["label"] == rep["reference"])
        q = next(r for r in rep["rows"] if r["label"] != rep["reference"])

        def speed(k: str) -> str:
            s = d["speed"][k]
            return f"{s['speedup']:.2f}× ({s['min']:.2f}–{s['max']:.2f}, {s['pairs']} pairs)"
        isa = ", ".join(f for f in m.get("cpu_isa", []) if "vnni" in f or f.startswith(("avx512", "amx"))) or "none"
        out.append(f"| {m['cpu']} | {m['cpu_capability']} | {isa} | {d['threads']} | {Path(ref['model']).name} | "
                   f"{', '.join(d.get('quantize_skip') or []) or 'none'} | {ref['mean']:.4f} | "
                   f"{scored(q['mean'], q.get('mean_delta'))} | {q['mean'] / ref['mean']:.3f} | {speed('document')} "
                   f"| {speed('query')} |")
    tasks = sorted({t for d in runs for t in d["report"]["tasks"]})
    shapes = runs[0]["speed"]
    out += ["", f"Tasks: {', '.join(tasks)}. Bench shapes (first row): documents {shapes['document']['texts']} × "
            f"{shapes['document']['length']} tokens in batches of {shapes['document']['batch_size']}, queries "
            f"{shapes['query']['texts']} × {shapes['query']['length']} in batches of {shapes['query']['batch_size']}. "
            "*int8 instructions*: the CPU's AVX-512, VNNI and AMX flags (none: AVX2 at most). Commands: "
            + "; ".join(f"`{d['command']}` ({d['code_version']})" for d in runs) + "."]
    warned = [f"{d['machine']['cpu']}: {w}" for d in runs for w in d.get("warnings", [])]
    return out + ([""] + [f"- warning from the bench, {w}" for w in warned] if warned else []) + [""]
