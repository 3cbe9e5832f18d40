"""EffiR Table 1 on a trained embedder: is it attention or the MLPs that a trained embedder loses first without harm?

    flock /tmp/dsprune-heavy.lock nohup .venv/bin/python benchmarks/table1_embedder.py > out/t1e.log 2>&1 &

Runs ``recipes/effir-table1.yaml`` (score → drop k / k2 attention layers, MLPs, blocks → eval → report, no
training) on EmbeddingGemma-300M into ``out/recipes/effir-table1``; finished stages are reused, and the
``score`` stage is taken from ``benchmarks/compress_embedder.py``'s run when that exists with the same
arguments (the recipe then finds its stamp). Keeps the report (each drop against the unpruned model, paired
bootstrap intervals), each drop's FLOP ratio at 256 tokens and what it removed, the stage times and the command
as ``benchmarks/results/table1_embedder.json``, prints the table and re-renders RESULTS.md.

The same table on another model, e.g. EffiR's own pooling (the last token, EOS appended) against mean pooling on
two SmolLM2 retrievers trained alike by ``benchmarks/train_dense.py``::

    .venv/bin/python benchmarks/train_dense.py --pooling last --out out/train_dense_last
    .venv/bin/python benchmarks/table1_embedder.py --tag smollm2-last --label "..." \
        --param model=out/train_dense_last/run/model

``--tag`` keeps each model's run and results apart (``out/recipes/effir-table1-TAG``,
``results/table1_embedder_TAG.json``). A model that ``train_dense.py`` made is also checked against its untrained
start (the trained dense baseline must clearly beat it), from the two evaluations ``train_dense.py`` left.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import (REPO, collect_recipe, keep_results, recipe_command, recipe_parser,  # noqa: E402
                               rerender, run_recipe_command)
from dsprune import formats  # noqa: E402
from dsprune.report import compare  # noqa: E402

RECIPE = REPO / "recipes" / "effir-table1.yaml"
OUT = REPO / "out" / "recipes" / "effir-table1"
NAME = "table1_embedder"
SCORE_FROM = REPO / "out" / "recipes" / "compress-embedder" / "score"
SEQ_LEN = 256       # the length dsprune bench and the planner count FLOPs at


def command(params: dict, out: Path = OUT) -> list[str]:
    return recipe_command(RECIPE, out, params)


def out_of(tag: str) -> Path:
    return OUT.with_name(f"{OUT.name}-{tag}") if tag else OUT


def name_of(tag: str) -> str:
    return f"{NAME}_{tag}" if tag else NAME


def flop_ratios(model: str, drops: list[Path]) -> dict[str, float]:
    """Forward FLOPs per token of the unpruned model over each dropped one, counted the way the planner and
    ``dsprune bench`` count them, from each drop's recorded structure."""
    import dataclasses

    from dsprune.encoder import Encoder
    from dsprune.eval.speed import count_flops, shape_of
    from dsprune.packaged import model_path

    full = shape_of(Encoder.load(model_path(model)))
    before = count_flops(full, SEQ_LEN)["total"]
    out = {}
    for d in drops:
        st = formats.read_json(d / "manifest.json", "drop manifest")["structure"]
        cut = dataclasses.replace(full, drop_attn=tuple(st["drop_attn"]), widths=tuple(st["intermediate_sizes"]))
        out[d.name] = round(before / count_flops(cut, SEQ_LEN)["total"], 3)
    return out


def collect(params: dict, out: Path, results: Path, tag: str = "", label: str = "") -> Path:
    model = params.get("model", "embeddinggemma-300m")
    made_by = "benchmarks/table1_embedder.py" + (f" --tag {tag}" if tag else "")
    doc = {"title": f"EffiR Table 1 on {label or f'a trained embedder ({model})'}: drop attention, MLPs or blocks, "
                    "no training",
           **collect_recipe(RECIPE, params, out, command(params, out), made_by), "tag": tag}
    enc = formats.read_json(out / "eval-full" / formats.RESULTS, "eval-full results")["encoder"]
    doc["encoder"] = {"pooling": enc["pooling"], "append_eos": enc.get("append_eos", False),
                      "dense_head": bool(enc.get("dense"))}
    doc["untrained_check"] = untrained_check(Path(model))
    folders = sorted(out.glob("drop-*"))
    ratios = flop_ratios(model, folders)
    drops = {}
    for d in folders:
        man = formats.read_json(d / "manifest.json", "drop manifest")
        drops[d.name] = {"drop": man.get("drop"), "drop_attn": man["structure"]["drop_attn"],
                         "drop_mlp": man["structure"]["drop_mlp"], "param_ratio": man["figures"]["param_ratio"],
                         "flop_ratio": ratios[d.name]}
    doc["drops"], doc["flop_seq_len"] = drops, SEQ_LEN
    doc["pairs"] = head_to_head(out)
    return keep_results(doc, out, results, name_of(tag))


def untrained_check(model: Path) -> dict | None:
    """For a retriever ``benchmarks/train_dense.py`` trained (``DIR/run/model``): trained against untrained on the
    evaluation it left, paired per query, both with the encoder config the model was trained with."""
    root = model.parent.parent if model.name == "model" and model.parent.name == "run" else None
    if root is None or not all((root / f"eval_{n}" / formats.RESULTS).is_file() for n in ("untrained", "trained")):
        return None
    from benchmarks.train_dense import trained_vs_untrained

    made = formats.read_json(root / formats.MANIFEST, "train_dense manifest")
    return {"command": made.get("command"), **trained_vs_untrained(root)}


def head_to_head(out: Path) -> dict:
    """At each drop count, attention against MLPs and MLPs against blocks directly (paired per query), so the
    question "which goes first" is answered by an interval of its own, not by two intervals to the unpruned."""
    pairs = {}
    for k in ("k", "k2"):
        for a, b in (("attn", "mlp"), ("mlp", "blocks")):
            entries = compare.load_entries([str(out / f"eval-{b}-{k}"), str(out / f"eval-{a}-{k}")], [],
                                           [f"{b}-{k}", f"{a}-{k}"])
            pairs[f"{a}-{k} vs {b}-{k}"] = compare.compare(entries)["rows"][1]
    return pairs


def share_score(params: dict) -> None:
    """Hard-link compress_embedder's finished ``score`` stage (same model and arguments): the recipe reuses a
    stage only when its stamp's fingerprint matches, so a different model or setting is scored anew."""
    dst = OUT / "score"
    if not params and (SCORE_FROM / "stage.json").is_file() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(SCORE_FROM, dst, copy_function=os.link)


def main(argv: list[str] | None = None) -> int:
    ap = recipe_parser(__doc__, "model, k, k2, tasks")
    ap.add_argument("--tag", default="", help="a name for this model's run and results (default: EmbeddingGemma's)")
    ap.add_argument("--label", default="", help="the model as RESULTS.md names it")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    out = out_of(a.tag)
    if not a.collect:
        share_score(params)
        run_recipe_command(command(params, out), out, "~20 min on 2 CPU cores; ")
    dest = collect(params, out, Path(a.results), a.tag, a.label)
    print(compare.markdown(formats.read_json(dest, "results")["report"]))
    rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
