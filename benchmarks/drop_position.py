"""Which MLPs a drop takes: two early MLPs against two middle ones, and Drop-15M with the first k layers kept.

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/drop_position.py                 # the dense retriever
    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/drop_position.py --model smollm2 \\
        --scores benchmarks/results/drop_order/base-score.json                                # SmolLM2 as it ships

Why: every MLP row of the grid that failed to train (Drop-15M, -19M, -15M+8A, EffiR) drops MLPs 2 and 3, the rows
that trained drop only MLPs from 12 on. Whether position matters is a question of its own, answered here without
training: each variant is a `dsprune drop` of one model with the importance scores its grid rows used, the
candidates fixed by `--protect` (for the pairs: every layer but the two), then `dsprune eval` on scifact_small.
Each variant is compared with the model itself and the pairs with each other by the paired bootstrap over
queries (`dsprune.eval.bootstrap`). Stages go to ``out/drop_position/<model>/NAME`` and are reused while their
command is unchanged. Writes ``benchmarks/results/drop_position[_<model>].json`` (``results_name``) with every
command and prints the table.
"""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import REPO, results_name, slug, stage  # noqa: E402
from dsprune import formats  # noqa: E402
from dsprune.commands.common import weights_of  # noqa: E402

NAME = "drop_position"
REFERENCE = "no drop"
# the scores each grid model's rows were dropped by (benchmarks/reproduce.py copies them there)
GRID_SCORES = {"out/train_dense/run/model": "benchmarks/results/drop_order/dense-score.json",
               "smollm2": "benchmarks/results/drop_order/base-score.json"}


def variants(n_layers: int, early: list[int], late: list[int], drop: int, protect: list[int]) -> dict:
    """label -> (drop_mlp count, --protect value or None): the pairs (every other layer protected, so exactly
    those two MLPs go) and Drop-N without and with the first k layers protected."""
    def only(layers: list[int]) -> str:
        return ",".join(str(i) for i in range(n_layers) if i not in layers)

    out = {f"MLPs {', '.join(map(str, early))}": (len(early), only(early)),
           f"MLPs {', '.join(map(str, late))}": (len(late), only(late)),
           f"Drop-{drop}M": (drop, None)}
    out.update({f"Drop-{drop}M, first {k} protected": (drop, str(k)) for k in protect})
    return out


def contrasts(labels: list[str], drop: int, protect: list[int]) -> list[tuple[str, str]]:
    """(a, b) pairs whose difference a − b answers the question directly: early − late, protected − not."""
    return [(labels[0], labels[1])] + [(f"Drop-{drop}M, first {k} protected", f"Drop-{drop}M") for k in protect]


def grid_scores(model: str, results: Path, ap: argparse.ArgumentParser) -> str:
    """The scores the grid's rows of ``model`` were dropped by, and only for the weights they dropped from: the
    dense retriever's path may hold another training run, whose own scores pick other MLPs."""
    from benchmarks.grid.section import grid_dense_fingerprint

    scores = GRID_SCORES.get(model)
    if scores is None:
        ap.error(f"--scores: no grid scores for {model}; pass the model's scores.json (`dsprune score`)")
    grid = grid_dense_fingerprint(results) if model != "smollm2" else None
    mine = weights_of(model) if grid else None
    if grid and mine != grid:
        ap.error(f"--scores: {scores} scored the grid's dense row (weights {grid[:12]}), but {model} holds "
                 f"weights {mine[:12]}, another training run; score it (`dsprune score --model {model} "
                 "--n_samples 256 --calib_max_length 128 --out out/score_dense`) and pass --scores")
    return scores


def measure(a, out: Path) -> dict:
    from dsprune.eval.bootstrap import paired_bootstrap
    from dsprune.report import compare

    scores = formats.read_scores(a.scores)
    n = int(scores.get("num_layers") or len(scores["scores"]["mlp"]))
    log: list = []
    plan = variants(n, a.early, a.late, a.drop_mlp, a.protect)
    models = {REFERENCE: a.model}
    for label, (count, protect) in plan.items():
        models[label] = str(stage(f"drop-{slug(label)}", ["drop", "--model", a.model, "--scores", a.scores, "--drop_mlp",
                                                   str(count), *(["--protect", protect] if protect else [])],
                                  out, log))
    results = {REFERENCE: a.reference_results} if a.reference_results else {}
    for label, model in models.items():
        if label in results:
            continue
        results[label] = str(stage(f"eval-{slug(label)}", ["eval", "--model", model, "--task", *a.task, "--split", "test",
                                                    "--max_length", str(a.max_length), "--threads", str(a.threads),
                                                    "--quiet"], out, log))
    entries = compare.load_entries(list(results.values()), [], list(results))
    for e in entries:   # a reused reference may hold more tasks than were asked for here
        e.results["tasks"] = {t: r for t, r in e.results["tasks"].items() if t in [x.split("=")[0] for x in a.task]}
    report = compare.compare(entries)
    docs = {e.label: e.results for e in entries}
    pairs = []
    for x, y in contrasts(list(plan), a.drop_mlp, a.protect):
        for t in report["tasks"]:
            px, py = (docs[v]["tasks"][t]["per_query"][compare.METRIC] for v in (x, y))
            pairs.append({"a": x, "b": y, "task": t, **paired_bootstrap(px, py, 2000, 0)})
    dropped = {}
    for label in plan:
        man = formats.read_manifest(models[label])
        dropped[label] = {"drop_mlp": man["structure"]["drop_mlp"], "protect": plan[label][1],
                          "params": man.get("params", {}).get("after")}
    return {"num_layers": n, "variants": dropped, "stages": log, "report": report, "contrasts": pairs}


def main(argv: list[str] | None = None) -> int:
    from benchmarks._common import keep_results, rerender
    from benchmarks.grid import render
    from benchmarks.grid.inputs import DEFAULT_DENSE
    from benchmarks.grid.render_drop_position import drop_position_section

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(Path(DEFAULT_DENSE).relative_to(REPO)),
                    help="the model to drop from (default: the grid's dense retriever; smollm2: the base model)")
    ap.add_argument("--scores", default=None, help="its scores.json (default for the grid's two models: the "
                                                   "scores their rows were dropped by)")
    ap.add_argument("--early", type=int, nargs="+", default=[2, 3], help="the early MLPs of the pair")
    ap.add_argument("--late", type=int, nargs="+", default=[12, 13], help="the later MLPs of the pair")
    ap.add_argument("--drop_mlp", type=int, default=15, help="MLPs the drop by importance takes")
    ap.add_argument("--protect", type=int, nargs="*", default=[4], help="k: Drop-N with the first k protected")
    ap.add_argument("--task", nargs="+", default=["scifact_small"], help="eval task(s), NAME or NAME=FOLDER")
    ap.add_argument("--reference_results", default=None, help="results of the undropped model made before with "
                    "the same eval settings (a results.json or a grid row's JSON, e.g. benchmarks/results/"
                    "untrained.json for smollm2), instead of evaluating it again")
    ap.add_argument("--max_length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="stage folders (default: out/drop_position/<model name>)")
    ap.add_argument("--results", default=str(render.RESULTS))
    ap.add_argument("--name", default=None, help="results file name (default: drop_position for smollm2, "
                    "drop_position_dense for the grid's dense retriever, else drop_position_<model folder>)")
    ap.add_argument("--no_render", action="store_true", help="leave RESULTS.md alone")
    a = ap.parse_args(argv)
    if len(a.early) != len(a.late):
        ap.error("--early and --late must name as many MLPs each")
    if not Path(a.model).exists() and a.model != "smollm2":
        raise SystemExit(f"{a.model} not found: make the dense retriever (benchmarks/train_dense.py) or pass "
                         f"--model smollm2 (the base model)")
    a.scores = a.scores or grid_scores(a.model, Path(a.results), ap)
    out = Path(a.out or REPO / "out" / NAME / Path(a.model).name).resolve()
    out.mkdir(parents=True, exist_ok=True)
    doc = {"title": "Which MLPs a drop takes: position against importance, no training",
           "command": shlex.join([".venv/bin/python", "benchmarks/drop_position.py",
                                  *(argv if argv is not None else sys.argv[1:])]),
           "code_version": formats.code_version(), "model": a.model, "model_fingerprint": weights_of(a.model),
           "scores": a.scores, "reference": REFERENCE,
           "reference_results": a.reference_results,
           "tasks": a.task, "max_length": a.max_length, **measure(a, out)}
    print("\n".join(drop_position_section(doc)))
    keep_results(doc, out, Path(a.results), a.name or results_name(NAME, a.model))
    if not a.no_render:
        rerender()
    return 0


if __name__ == "__main__":
    sys.exit(main())
