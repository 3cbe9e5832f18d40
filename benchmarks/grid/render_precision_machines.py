"""int8 and bfloat16 against float32 on each machine that ran ``recipes/int8-embedder.yaml`` or
``recipes/bf16-embedder.yaml`` (benchmarks/precision_machine.py): one row per CPU and format, since a format's
speed-up is the CPU's kernels' for it and differs between instruction sets."""
from __future__ import annotations

from pathlib import Path

from dsprune.report.compare import scored

from .section import section_result

MADE_BY = "benchmarks/precision_machine.py"
KEYS = {"command", "machine", "speed", "report", "threads"}
FORMATS = ("int8", "bf16")      # the results files' prefixes, <format>_machine_<cpu>.json


def format_label(d: dict, fmt: str) -> str:
    """``int8 (down_proj float32)`` or ``bfloat16``: what the row's model computed in."""
    if fmt == "bf16":
        return d["dtype"]["model"]
    kept = ", ".join(d.get("quantize_skip") or [])
    return f"int8 ({kept} float32)" if kept else "int8"


def isa_families(flags: list[str]) -> str:
    """``AVX-512 (VNNI, BF16), AMX (BF16, INT8)``: the instruction families that int8 and bfloat16 kernels use,
    from the CPU's flags; ``none`` for AVX2 at most."""
    def having(prefix: str, features: tuple[str, ...]) -> list[str]:
        return [f.upper() for f in features if f"{prefix}{f}" in flags]
    parts = []
    if any(f.startswith("avx512") for f in flags):
        sub = having("avx512_", ("vnni", "bf16", "fp16"))
        parts.append("AVX-512" + (f" ({', '.join(sub)})" if sub else ""))
    elif "avx_vnni" in flags:
        parts.append("AVX-VNNI")
    if any(f.startswith("amx") for f in flags):
        sub = having("amx_", ("bf16", "int8", "fp16"))
        parts.append("AMX" + (f" ({', '.join(sub)})" if sub else ""))
    return ", ".join(parts) or "none"


def render_precision_machines(results: Path,
                              heading: str = "### int8 and bfloat16 per machine") -> list[str]:
    runs = [(fmt, d) for fmt in FORMATS for p in sorted(results.glob(f"{fmt}_machine_*.json"))
            if (d := section_result(p, KEYS, MADE_BY))]
    if not runs:
        return []
    out = [heading, "",
           f"`{MADE_BY}` keeps each machine's run of `recipes/int8-embedder.yaml` (dynamic int8 Linear layers, those "
           "`quantize_skip` names kept float32) and of `recipes/bf16-embedder.yaml` (the whole model in bfloat16): "
           "the same model scored in float32 and in that format, and `dsprune bench` of the format against float32 "
           "in one run. nDCG@10 is the mean over the tasks, the format's in brackets as the difference to float32 "
           "with its 95 % paired bootstrap interval over queries; *kept* is its share of float32's mean; a speed-up "
           "is the median of alternating pairs, min–max in brackets.", "",
           "| CPU | torch kernels | AVX-512 / VNNI / AMX | threads | model | format | float32 | format's | kept "
           "| document speed-up | query speed-up |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for fmt, d in runs:
        rep, m = d["report"], d["machine"]
        ref = next(r for r in rep["rows"] if r["label"] == rep["reference"])
        q = next(r for r in rep["rows"] if r["label"] != rep["reference"])

        def speed(k: str) -> str:
            s = d["speed"][k]
            return f"{s['speedup']:.2f}× ({s['min']:.2f}–{s['max']:.2f}, {s['pairs']} pairs)"
        isa = isa_families(m.get("cpu_isa", []))
        out.append(f"| {m['cpu']} | {m['cpu_capability']} | {isa} | {d['threads']} | {Path(ref['model']).name} | "
                   f"{format_label(d, fmt)} | {ref['mean']:.4f} | {scored(q['mean'], q.get('mean_delta'))} | "
                   f"{q['mean'] / ref['mean']:.3f} | {speed('document')} | {speed('query')} |")
    tasks = sorted({t for _, d in runs for t in d["report"]["tasks"]})
    shapes = runs[0][1]["speed"]
    out += ["", f"Tasks: {', '.join(tasks)}. Bench shapes (first row): documents {shapes['document']['texts']} × "
            f"{shapes['document']['length']} tokens in batches of {shapes['document']['batch_size']}, queries "
            f"{shapes['query']['texts']} × {shapes['query']['length']} in batches of {shapes['query']['batch_size']}. "
            "*AVX-512 / VNNI / AMX*: the CPU's instruction families that int8 and bfloat16 kernels use, from its "
            "flags (none: AVX2 at most). Commands: "
            + "; ".join(f"`{d['command']}` ({d['code_version']})" for _, d in runs) + "."]
    warned = [f"{d['machine']['cpu']}, {format_label(d, fmt)}: {w}" for fmt, d in runs for w in d.get("warnings", [])]
    return out + ([""] + [f"- warning from the bench, {w}" for w in warned] if warned else []) + [""]
