"""RESULTS.md's section for ``benchmarks/sublayer_time.py``: where a pruned EmbeddingGemma's encoding time goes, so
that a speed-up below the FLOP ratio is read from its parts, every sentence computed from the committed JSON."""
from __future__ import annotations

import os
import statistics
from pathlib import Path

from .section import section_result

FILE = "sublayer_time.json"
PARTS = ("attention", "attention norms", "MLP", "MLP norms", "dropped", "rest")
PLURAL = {"document": "documents", "query": "queries"}
SHAPE = ", shape only"


def _x(sp: dict | None) -> str:
    return f"{sp['median']:.2f}× [{sp['min']:.2f}–{sp['max']:.2f}]" if sp else "1"


def kind_table(k: dict) -> list[str]:
    out = ["| model | from | speed-up [min–max] | FLOP ratio | speed-up / FLOP ratio | width-proportional | "
           "flushed / not | subnormal down inputs | subnormal weights | attention kept | "
           + " | ".join(f"{p} ms" for p in PARTS) + " |",
           "|" + "---|" * (10 + len(PARTS))]
    for n, r in k["models"].items():
        sp = r.get("speedup_pairs")
        ratio = f"{sp['median'] / r['flop_ratio']:.2f}" if sp else "–"
        wp = f"{r['width_proportional_speedup']:.2f}×" if sp else "–"
        fl = r["flush_pairs"]
        out.append(f"| {n} | {r['source']} | {_x(sp)} | {r['flop_ratio']:.2f}× | {ratio} | {wp} | "
                   f"{fl['median']:.2f} [{fl['min']:.2f}–{fl['max']:.2f}] | {r['subnormal_down_inputs']['all']:.1e} | "
                   f"{r['subnormal_weights']} | {r['attention_kept']} | "
                   + " | ".join(f"{r['parts_s'][p] * 1e3:.0f}" for p in PARTS) + " |")
    return out


def fit_sentence(kind: str, k: dict) -> str:
    fit, full = k["mlp_fit"], k["models"]["unpruned"]
    per_mlp = statistics.median(full["mlp_s"].values())
    return (f"- {PLURAL[kind].capitalize()}: one MLP's time against its width, over the {fit['n']} kept MLPs of "
            f"every model: {fit['a'] * 1e3:.2f} ms + {fit['b'] * 1e6:.2f} µs per neuron (R² {fit['r2']:.3f}); "
            + (f"the fixed part is {fit['a'] / per_mlp:.0%} of a full-width MLP's {per_mlp * 1e3:.1f} ms, where a "
               "FLOP count has none." if fit["a"] > 0 else
               f"no fixed part (a full-width MLP takes {per_mlp * 1e3:.1f} ms), as a FLOP count has it."))


def versus_sentences(kind: str, k: dict) -> list[str]:
    """Two pruned models timed side by side: their own ratio, free of the unpruned pass's drift."""
    out = []
    for v in k.get("versus", []):
        sp = v["pairs"]
        out.append(f"- {PLURAL[kind].capitalize()}: *{v['second']}* runs {sp['median']:.2f}× as fast as "
                   f"*{v['first']}* (rounds {sp['min']:.2f}–{sp['max']:.2f}×; faster in "
                   f"{sum(r > 1 for r in sp['ratios'])} of {len(sp['ratios'])} rounds), "
                   f"{v['hooked']:.2f}× in the hooked passes.")
    return out


def pair_sentences(kind: str, k: dict) -> list[str]:
    """A saved model against its own shape on the unpruned weights: what its weights, not its shape, cost."""
    out = []
    for n, r in k["models"].items():
        shape = k["models"].get(n + SHAPE)
        if shape is None or not r.get("speedup_pairs"):
            continue
        a, b = r["speedup_pairs"]["median"], shape["speedup_pairs"]["median"]
        sub = r["subnormal_down_inputs"]["all"]
        out.append(f"- {PLURAL[kind].capitalize()}: *{n}* runs at {a:.2f}× and its shape on the unpruned weights at "
                   f"{b:.2f}× (FLOP ratio {r['flop_ratio']:.2f}×), in the same rounds; "
                   + (f"{sub:.1e} of its down projections' inputs are subnormal (its shape's: "
                      f"{shape['subnormal_down_inputs']['all']:.1e}), {r['subnormal_weights']} of its weights"
                      if sub or r["subnormal_weights"] else
                      "none of its down projections' inputs and none of its weights are subnormal")
                   + f"; flushing subnormals on the calling thread changes its pass time by a factor of "
                   f"{r['flush_pairs']['median']:.2f}.")
    return out


def render_sublayer_time(results: Path) -> list[str]:
    p = results / FILE
    d = section_result(p, {"kinds", "machine", "command", "plans"}, "benchmarks/sublayer_time.py")
    if d is None:
        return []
    m = d["machine"]
    out = ["## Where a pruned model's encoding time goes", "",
           f"`benchmarks/sublayer_time.py` on {m['cpu']} (torch kernels {m['cpu_capability']}), {d['threads']} "
           "threads: the unpruned model and pruned shapes rebuilt from committed runs' plans on its weights (each "
           "MLP keeping its first neurons), plus saved models as trained, every one timed in the same alternating "
           "rounds (*speed-up*: median of the per-round ratios to the unpruned pass). Part times come from hooked "
           "passes, one model after another (*rest*: embedding lookup, masks, rotary tables, pooling, the Dense "
           "head); *width-proportional*: the speed-up if every MLP cost a full-width MLP's time × its width "
           "share, the rest as measured; *flushed / not*: pass time with `torch.set_flush_denormal(True)` over "
           "without (the flag reaches the calling thread only).", ""]
    for kind, k in d["kinds"].items():
        out += [f"**{PLURAL[kind].capitalize()}** ({k['texts']} at {k['length']} tokens, batches of "
                f"{k['batch_size']}):", ""] + kind_table(k) + [""]
    out += [fit_sentence(kind, k) for kind, k in d["kinds"].items()]
    for kind, k in d["kinds"].items():
        out += versus_sentences(kind, k)
    for kind, k in d["kinds"].items():
        out += pair_sentences(kind, k)
    png = results / d["plot"]
    out += ["", f"![sub-layer times]({os.path.relpath(png, results.parent)})" if png.is_file() else "",
            f"`{d['command']}` ({d.get('code_version')}); source: [{FILE}]({os.path.relpath(p, results.parent)}).",
            ""]
    return out
