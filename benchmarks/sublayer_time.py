"""Where a pruned EmbeddingGemma's encoding time goes, sub-layer by sub-layer: whether a slimmed model's shape runs
below its FLOP ratio, and below a model with whole sub-layers dropped at about the same ratio.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/sublayer_time.py

The FLOP count (``dsprune.eval.speed.count_flops``) holds an MLP's cost proportional to its width and counts
neither norms nor anything outside the sub-layers. This times what it leaves out. Each pruned shape is rebuilt
from a committed compress-embedder run's plan (``plan.attn``, ``plan.mlp``, ``plan.intermediate_sizes``) on the
unpruned model, keeping each MLP's first neurons: the time of a pass depends on the shapes, not on which neurons
are kept. Then, on the bench's texts and shapes (SciFact documents at 256 tokens in batches of 16, queries at 32
in batches of 64, ``dsprune bench``'s defaults as the recipe runs it):

1. every model's passes alternate with the others' in one process (``time_pairs``), and each pruned model's
   speed-up is the median of its per-round ratios to the unpruned pass, with their min–max: every arm on one CPU,
   in one run; every two pruned models are also set against each other round by round (``versus``), since
   the unpruned pass drifts between rounds;
2. hooked passes time each attention and MLP sub-layer and their norms; what is left (embedding lookup, rotary
   tables, masks, pooling, the Dense head) is the pass minus those;
3. a least-squares line ms = a + b · width over every kept MLP of every model says what an MLP costs beyond its
   width (``a``), which a FLOP count sets to 0; the "width-proportional" speed-up is what the model would run at
   if each of its MLPs cost a full-width MLP's time × width / full width, everything else as measured;
4. ``--real NAME=FOLDER`` adds trained models as they were saved (e.g. a slimmed run's ``distill/model``), each
   beside its own shape rebuilt on the unpruned weights ("NAME, shape only"): the same shape with other weights. Weights can slow a float32 pass that the shape does not: subnormal numbers (below
   1.2e-38) take a slow path on x86 unless the CPU flushes them to zero. So every model is also timed with
   ``torch.set_flush_denormal(True)`` in the same alternating rounds (the flag reaches the calling thread only,
   not OpenMP's workers: with 2 threads it flushes part of the work), and the subnormal weights and the share of
   subnormal inputs to each down projection are counted.

Writes ``benchmarks/results/sublayer_time.json`` (with its command) and ``sublayer_time.png``, prints the table and
re-renders RESULTS.md.
"""
from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, write_and_render  # noqa: E402

NAME = "sublayer_time"
MODEL = "embeddinggemma-300m"
REFERENCE = "unpruned"
# coarse + slim, the deeper drop at about its FLOP ratio, and the milder drop at about its measured speed
VARIANTS = ("slim-lora-seed2", "distill-lora-seed2", "1.6x-lora-seed2")
PARTS = ("attention", "attention norms", "MLP", "MLP norms", "dropped", "rest")
PLURAL = {"document": "documents", "query": "queries"}


def plan_of(results: Path, variant: str) -> dict:
    """A committed compress-embedder run's drops and MLP widths (its ``plan``)."""
    from dsprune import formats
    from dsprune.errors import DsPruneError

    p = results / f"compress_embedder_{variant}.json"
    if not p.is_file():
        raise DsPruneError(f"{p}: no such compress-embedder result (benchmarks/compress_embedder.py --variant "
                           f"{variant} writes it)")
    plan = formats.read_json(p, "compress-embedder results").get("plan") or {}
    for key in ("attn", "mlp", "num_layers"):
        if key not in plan:
            raise DsPruneError(f"{p}: its plan has no field {key!r}")
    return {"source": p.name, "attn": plan["attn"], "mlp": plan["mlp"],
            "intermediate_sizes": plan.get("intermediate_sizes"), "flop_ratio_planned": plan.get("flop_ratio")}


def load_real(path: str):
    from dsprune.encoder import Encoder
    from dsprune.errors import DsPruneError

    if not Path(path).is_dir():
        raise DsPruneError(f"--real: no model folder {path}")
    return Encoder.load(path).eval()


def build(model: str, plan: dict | None):
    """The unpruned encoder, or its pruned shape under ``plan`` (each MLP keeping its first neurons)."""
    import torch

    from dsprune.encoder import Encoder
    from dsprune.surgery.prune import drop_sublayers, slice_neurons

    enc = Encoder.load(model)
    if plan:
        drop_sublayers(enc, plan["attn"], plan["mlp"])
        widths = plan.get("intermediate_sizes") or []
        keep = {i: torch.arange(int(w)) for i, w in enumerate(widths) if w is not None}
        current = enc.arch.mlp_projections
        keep = {i: k for i, k in keep.items()
                if current(enc.arch.layers_of(enc.backbone)[i])[1].out_features != len(k)}
        if keep:
            slice_neurons(enc, keep)
    return enc.eval()


def part_modules(enc) -> dict:
    """module -> (part, layer) for every sub-layer and norm the hooks time."""
    from dsprune.surgery import modeling_dsprune as md

    layout = enc.arch.layout
    out = {}
    for i, block in enumerate(enc.arch.layers_of(enc.backbone)):
        for name, part in ((layout["attn"], "attention"), (layout["mlp"], "MLP")):
            m = md.get_module(block, name)
            out[m] = ("dropped" if isinstance(m, (md.DroppedAttention, md.DroppedMLP)) else part, i)
        for names, part in ((layout["attn_norms"], "attention norms"), (layout["mlp_norms"], "MLP norms")):
            for name in names:
                out[md.get_module(block, name)] = (part, i)
    return out


def hooked_pass(enc, batches: list[dict], rounds: int) -> dict:
    """Median seconds per pass over ``batches``: the whole pass, each part, and each kept MLP by layer."""
    import torch

    spans = part_modules(enc)
    acc: dict = {}
    starts: dict = {}

    def pre(m, *_):
        starts[m] = time.perf_counter()

    def post(m, *_):
        acc[spans[m]] = acc.get(spans[m], 0.0) + time.perf_counter() - starts.pop(m)

    handles = [h for m in spans for h in (m.register_forward_pre_hook(pre), m.register_forward_hook(post))]
    per_round = []
    try:
        with torch.inference_mode():
            for r in range(rounds + 1):            # the first round warms up
                acc.clear()
                t0 = time.perf_counter()
                for b in batches:
                    enc(b["input_ids"], b["attention_mask"])
                total = time.perf_counter() - t0
                if r:
                    per_round.append((total, dict(acc)))
    finally:
        for h in handles:
            h.remove()
    med = lambda xs: statistics.median(xs)  # noqa: E731
    keys = set().union(*(a for _, a in per_round))
    by_key = {k: med([a.get(k, 0.0) for _, a in per_round]) for k in keys}
    parts = {p: sum(v for (q, _), v in by_key.items() if q == p) for p in PARTS if p != "rest"}
    total = med([t for t, _ in per_round])
    parts["rest"] = max(total - sum(parts.values()), 0.0)
    mlps = {i: v for (q, i), v in by_key.items() if q == "MLP"}
    return {"total_s": total, "parts_s": parts, "mlp_s": {str(i): mlps[i] for i in sorted(mlps)}}


def subnormal_share(enc, batches: list[dict]) -> dict:
    """Share of the values entering all down projections (and each one's, by layer) that are subnormal."""
    import torch

    from dsprune.surgery import modeling_dsprune as md

    tiny = torch.finfo(torch.float32).tiny
    counts: dict = {}
    handles = []
    for i, block in enumerate(enc.arch.layers_of(enc.backbone)):
        try:
            down = md.get_module(block, enc.arch.layout["down"])
        except AttributeError:
            continue

        def pre(m, args, i=i):
            x = args[0]
            sub = int(((x != 0) & (x.abs() < tiny)).sum())
            n, k = counts.get(i, (0, 0))
            counts[i] = (n + sub, k + x.numel())
        handles.append(down.register_forward_pre_hook(pre))
    try:
        with torch.inference_mode():
            for b in batches:
                enc(b["input_ids"], b["attention_mask"])
    finally:
        for h in handles:
            h.remove()
    total = sum(n for n, _ in counts.values()), sum(k for _, k in counts.values())
    return {"all": total[0] / total[1] if total[1] else 0.0,
            "by_layer": {str(i): n / k for i, (n, k) in sorted(counts.items())}}


def subnormal_weights(enc) -> int:
    import torch

    tiny = torch.finfo(torch.float32).tiny
    return int(sum(((p != 0) & (p.abs() < tiny)).sum() for p in enc.parameters() if p.is_floating_point()))


def fit_line(xs: list[float], ys: list[float]) -> dict:
    """Least squares y = a + b x, with R²."""
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss = sum((y - my) ** 2 for y in ys)
    res = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys))
    return {"a": a, "b": b, "r2": 1 - res / ss if ss else 1.0, "n": n}


def width_proportional(model: dict, full: dict, full_width: int) -> float:
    """The model's pass time if each of its MLPs cost the unpruned model's median MLP time × width / full width,
    every other part as measured."""
    per_mlp = statistics.median(full["mlp_s"].values())
    mlp = sum(per_mlp * w / full_width for w in model["widths"] if w is not None)
    return model["total_s"] - model["parts_s"]["MLP"] + mlp


def versus(times: dict, res: dict) -> list[dict]:
    """Every two pruned models against each other, round by round: each one's ratio to the unpruned pass carries
    that pass's drift between rounds, which a direct ratio of two arms timed side by side does not."""
    from dsprune.eval import speed

    names = [n for n in res if n != REFERENCE]
    return [{"first": a, "second": b, "pairs": speed.pair_ratios(times[a], times[b]),
             "hooked": res[a]["total_s"] / res[b]["total_s"]}
            for i, a in enumerate(names) for b in names[i + 1:]]


FLUSH = " (flush)"
SHAPE = ", shape only"


def measure(model: str, plans: dict, real: dict, docs: list[str], queries: list[str], shapes: dict, pairs: int,
            rounds: int) -> dict:
    import torch

    from dsprune.eval import speed
    from dsprune.surgery.prune import intermediate_sizes, structure

    encs = {REFERENCE: build(model, None)}
    for name, plan in plans.items():
        encs[name] = build(model, plan)
    for name, path in real.items():
        encs[name] = load_real(path)
        # the control: the same shape on the unpruned weights
        shape = structure(encs[name])
        encs[name + SHAPE] = build(model, {"attn": shape["drop_attn"], "mlp": shape["drop_mlp"],
                                           "intermediate_sizes": shape["intermediate_sizes"]})
    out: dict = {}
    for kind, texts in (("document", docs), ("query", queries)):
        bs, length = shapes[kind]
        side = "passage" if kind == "document" else "query"
        batches = {n: speed.fixed_batches(e, texts, side, bs, length) for n, e in encs.items()}

        def run(n, flush):
            torch.set_flush_denormal(flush)      # torch's default is off; it is put back after every pass
            try:
                with torch.inference_mode():
                    for b in batches[n]:
                        encs[n](b["input_ids"], b["attention_mask"])
            finally:
                torch.set_flush_denormal(False)

        runs = {n + f: (lambda n=n, f=f: run(n, bool(f))) for n in encs for f in ("", FLUSH)}
        times, _ = speed.time_pairs(runs, pairs, 1, desc=f"timed {kind} rounds")
        res = {}
        for n, enc in encs.items():
            flops = speed.flops_per_token(enc, length)
            hooked = hooked_pass(enc, batches[n], rounds)
            res[n] = {"seconds": times[n], "median_s": statistics.median(times[n]),
                      "flush_seconds": times[n + FLUSH], "flush_pairs": speed.pair_ratios(times[n], times[n + FLUSH]),
                      "subnormal_down_inputs": subnormal_share(enc, batches[n]),
                      "subnormal_weights": subnormal_weights(enc), "flops_per_token": flops,
                      "widths": intermediate_sizes(enc), "drop_attn": structure(enc)["drop_attn"],
                      "attention_kept": sum(
                          1 for (p, _) in part_modules(enc).values() if p == "attention"),
                      "source": real.get(n) or (plans[n]["source"] if n in plans else
                                                (f"{real[n[:-len(SHAPE)]]}'s shape" if n.endswith(SHAPE) else
                                                 Path(model).name)), **hooked}
        full = res[REFERENCE]
        full_width = max(w for w in full["widths"] if w is not None)
        xs = [w for r in res.values() for i, s in r["mlp_s"].items() for w in [r["widths"][int(i)]]]
        ys = [s for r in res.values() for s in r["mlp_s"].values()]
        fit = fit_line(xs, ys)
        for n, r in res.items():
            r["flop_ratio"] = full["flops_per_token"]["total"] / r["flops_per_token"]["total"]
            if n != REFERENCE:
                r["speedup_pairs"] = speed.pair_ratios(times[REFERENCE], times[n])
                r["hooked_speedup"] = full["total_s"] / r["total_s"]
                r["width_proportional_speedup"] = full["total_s"] / width_proportional(r, full, full_width)
        out[kind] = {"batch_size": bs, "length": length, "texts": len(texts), "mlp_fit": fit,
                     "full_width": full_width, "models": res, "versus": versus(times, res)}
    return out


def table(doc: dict) -> str:
    lines = []
    for kind, k in doc["kinds"].items():
        fit = k["mlp_fit"]
        lines.append(f"{PLURAL[kind]} ({k['texts']} at {k['length']} tokens, batches of {k['batch_size']}); MLP ms = "
                     f"{fit['a'] * 1e3:.2f} + {fit['b'] * 1e3 * k['full_width']:.2f} × width/{k['full_width']} "
                     f"(R² {fit['r2']:.3f}, {fit['n']} MLPs)")
        lines.append(f"{'model':<24} {'speed-up':>18} {'FLOPs':>6} {'width-prop.':>11} {'flush':>6} "
                     f"{'subnormal':>9} {'attn':>4} " + " ".join(f"{p[:12]:>12}" for p in PARTS))
        for n, r in k["models"].items():
            sp = r.get("speedup_pairs")
            s = f"{sp['median']:.2f} [{sp['min']:.2f}–{sp['max']:.2f}]" if sp else "1"
            wp = f"{r['width_proportional_speedup']:.2f}" if sp else "–"
            lines.append(f"{n:<24} {s:>18} {r['flop_ratio']:>6.2f} {wp:>11} {r['flush_pairs']['median']:>6.2f} "
                         f"{r['subnormal_down_inputs']['all']:>9.1e} {r['attention_kept']:>4} "
                         + " ".join(f"{r['parts_s'][p] * 1e3:>10.0f}ms" for p in PARTS))
        for v in k["versus"]:
            sp = v["pairs"]
            lines.append(f"{v['second']} over {v['first']}: {sp['median']:.2f} [{sp['min']:.2f}–{sp['max']:.2f}], "
                         f"hooked {v['hooked']:.2f}")
        lines.append("")
    return "\n".join(lines)


def plot(doc: dict, dest: Path) -> None:
    """Per model: stacked ms of each part (documents, queries); and every MLP's ms against its width, with
    the fitted line."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(doc["kinds"])
    fig, axes = plt.subplots(2, len(kinds), figsize=(6.5 * len(kinds), 9))
    colours = dict(zip(PARTS, plt.get_cmap("tab10").colors))
    for j, kind in enumerate(kinds):
        k = doc["kinds"][kind]
        names = list(k["models"])
        ax = axes[0][j]
        bottom = [0.0] * len(names)
        for p in PARTS:
            vals = [k["models"][n]["parts_s"][p] * 1e3 for n in names]
            ax.bar(names, vals, bottom=bottom, label=p, color=colours[p])
            bottom = [b + v for b, v in zip(bottom, vals)]
        for x, n in enumerate(names):
            r = k["models"][n]
            sp = r.get("speedup_pairs")
            ax.annotate(f"{sp['median']:.2f}× (FLOPs {r['flop_ratio']:.2f}×)" if sp else "1×",
                        (x, bottom[x]), ha="center", va="bottom", fontsize=8)
        ax.set_ylabel("ms per pass (hooked)")
        ax.set_title(f"{PLURAL[kind]}: where the time goes")
        ax.tick_params(axis="x", labelrotation=15, labelsize=8)
        if j == 0:
            ax.legend(fontsize=8)
        ax = axes[1][j]
        for n, r in k["models"].items():
            ws = [r["widths"][int(i)] for i in r["mlp_s"]]
            ax.scatter(ws, [s * 1e3 for s in r["mlp_s"].values()], label=n, s=18)
        fit = k["mlp_fit"]
        xs = [0, k["full_width"]]
        ax.plot(xs, [(fit["a"] + fit["b"] * x) * 1e3 for x in xs], "k--", lw=1,
                label=f"{fit['a'] * 1e3:.2f} ms + {fit['b'] * 1e6:.2f} µs × width")
        ax.set_xlabel("MLP width (neurons)")
        ax.set_ylabel("ms per pass")
        ax.set_title(f"{PLURAL[kind]}: one MLP's time against its width")
        ax.legend(fontsize=8)
    fig.suptitle(f"{doc['model']} on {doc['machine']['cpu']}, {doc['threads']} threads")
    fig.tight_layout()
    tmp = dest.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(dest)


def main(argv: list[str] | None = None) -> int:
    import torch

    from dsprune import formats
    from dsprune.eval import speed
    from dsprune.packaged import model_path
    from dsprune.settings import data_dir

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS),
                    help="compress-embedder runs whose plans are rebuilt (benchmarks/results/compress_embedder_V.json)")
    ap.add_argument("--real", nargs="*", default=[], metavar="NAME=FOLDER",
                    help="saved models to time beside the rebuilt shapes (e.g. a slimmed run's distill/model)")
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--queries", type=int, default=128)
    ap.add_argument("--pairs", type=int, default=8, help="alternating rounds of every model")
    ap.add_argument("--rounds", type=int, default=3, help="hooked passes per model (after one warm-up)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--no_render", action="store_true", help="leave RESULTS.md alone")
    a = ap.parse_args(argv)
    results = Path(a.results)
    plans = {v: plan_of(results, v) for v in a.variants}
    real = {}
    for item in a.real:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise SystemExit(f"error: --real {item!r}: expected NAME=FOLDER")
        real[name] = folder
    docs, queries = speed.sample_texts(data_dir("scifact"), a.docs, a.queries, 0)
    torch.set_num_threads(a.threads)
    kinds = measure(model_path(a.model), plans, real, docs, queries, {"document": (16, 256), "query": (64, 32)},
                    a.pairs, a.rounds)
    doc = {"model": a.model, "plans": plans, "real": real, "kinds": kinds, "machine": speed.machine(), "threads":
           torch.get_num_threads(), "torch": torch.__version__, "data": "${shared}/data/scifact",
           "command": shlex.join(["flock", "/tmp/dsprune-heavy.lock", ".venv/bin/python",
                                  "benchmarks/sublayer_time.py", *(argv if argv is not None else sys.argv[1:])]),
           "code_version": formats.code_version(), "plot": f"{NAME}.png"}
    results.mkdir(parents=True, exist_ok=True)
    plot(doc, results / f"{NAME}.png")
    return write_and_render(results, NAME, doc, table(doc), not a.no_render)


if __name__ == "__main__":
    sys.exit(main())
