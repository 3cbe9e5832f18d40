"""benchmarks/table1_embedder.py: EffiR Table 1 on a trained embedder is kept with each drop's FLOP ratio and
the head-to-head intervals, and RESULTS.md states which kind of sub-layer goes first from those intervals."""
import json
import random

from benchmarks import table1_embedder as t1
from benchmarks.grid import render
from dsprune.recipe import load_recipe
from dsprune.report import compare
from dsprune.tiny import save_tiny

MEANS = {"full": 0.8, "attn-k": 0.78, "attn-k2": 0.5, "mlp-k": 0.79, "mlp-k2": 0.75, "blocks-k": 0.6,
         "blocks-k2": 0.3}
STRUCTURE = {"attn-k": ([3], [], [64] * 4), "attn-k2": ([2, 3], [], [64] * 4),
             "mlp-k": ([], [3], [64, 64, 64, None]), "mlp-k2": ([], [2, 3], [64, 64, None, None]),
             "blocks-k": ([3], [3], [64, 64, 64, None]), "blocks-k2": ([2, 3], [2, 3], [64, 64, None, None])}


def _eval(path, model, mean, seed, pooling="mean"):
    rng = random.Random(seed)
    tasks = {}
    for task, n in (("scifact_small", 300), ("financebench", 75)):
        pq = {f"q{i}": min(1.0, max(0.0, mean + rng.uniform(-0.1, 0.1))) for i in range(n)}
        tasks[task] = {"ndcg_at_10": sum(pq.values()) / n, "per_query": {"ndcg_at_10": pq}}
    path.mkdir(parents=True, exist_ok=True)
    enc = {"pooling": pooling, "append_eos": pooling == "last", "dense": []}
    (path / "results.json").write_text(json.dumps({"model": str(model), "fingerprint": path.name, "tasks": tasks,
                                                   "params": 1000, "encoder": enc}))


def _fake_run(tmp_path, model, out_name="out", pooling="mean"):
    out = tmp_path / out_name
    _, stages = load_recipe(t1.RECIPE, params={"model": str(model)})
    for s in stages:
        (out / s.name).mkdir(parents=True, exist_ok=True)
        (out / s.name / "stage.json").write_text(json.dumps({"fingerprint": "f", "seconds": 60.0,
                                                            "command": s.command, "launcher": s.launcher}))
    for name, (attn, mlp, widths) in STRUCTURE.items():
        (out / f"drop-{name}" / "manifest.json").write_text(json.dumps({
            "drop": f"{len(mlp)}M{len(attn)}A", "figures": {"param_ratio": 0.9},
            "structure": {"drop_attn": attn, "drop_mlp": mlp, "intermediate_sizes": widths}}))
    for i, (name, mean) in enumerate(MEANS.items()):
        model_of = model if name == "full" else out / f"drop-{name}"
        _eval(out / f"eval-{name}", model_of, mean, i, pooling)
    entries = compare.load_entries([str(out / f"eval-{n}") for n in MEANS], [], list(MEANS))
    (out / "report" / "report.json").write_text(json.dumps(compare.compare(entries)))
    return out


def test_collect_and_render(tmp_path):
    model = save_tiny(tmp_path / "tiny", "gemma3_text", layers=4)
    out, results = _fake_run(tmp_path, model), tmp_path / "results"
    doc = json.loads(t1.collect({"model": str(model)}, out, results).read_text())
    flops = {k: v["flop_ratio"] for k, v in doc["drops"].items()}
    assert 1 < flops["drop-attn-k"] < flops["drop-attn-k2"]
    assert flops["drop-blocks-k"] > max(flops["drop-attn-k"], flops["drop-mlp-k"])
    pair = doc["pairs"]["attn-k2 vs mlp-k2"]["mean_delta"]
    assert pair["high"] < 0          # attention at k2 (0.5) kept less than MLPs at k2 (0.75)
    text = render.render(results, tmp_path / "RESULTS.md")
    section = text[text.index("## EffiR Table 1 on a trained embedder"):text.index("## Provenance")]
    assert "2 attention layers against 2 MLPs: dropping these MLPs keeps more than dropping these attention layers" \
        in section
    line = next(x for x in section.splitlines() if x.startswith("- 2 attention layers against 2 MLPs"))
    per_task = doc["pairs"]["attn-k2 vs mlp-k2"]["tasks"]
    assert f"financebench {compare.interval(per_task['financebench']['delta'])}" in line.split("(per task: ")[1]
    assert f"{flops['drop-blocks-k2']:.2f}×" in section and "attention [2, 3]" in section


def test_a_tagged_run_on_a_trained_retriever_gets_its_own_section_with_its_pooling_and_untrained_check(tmp_path):
    """``--tag`` keeps a second model's table apart; a retriever that train_dense.py made is checked against its
    untrained start from the two evaluations train_dense.py left, and the section names the pooling."""
    dense = tmp_path / "train_dense_last"
    model = save_tiny(dense / "run" / "model", "llama", layers=4)
    _eval(dense / "eval_untrained", "smollm2", 0.2, 7, "last")
    _eval(dense / "eval_trained", model, 0.5, 8, "last")
    (dense / "manifest.json").write_text(json.dumps({"command": "python benchmarks/train_dense.py --pooling last"}))
    results = tmp_path / "results"
    t1.collect({"model": str(save_tiny(tmp_path / "tiny", "gemma3_text", layers=4))}, _fake_run(tmp_path, model),
               results)
    out = _fake_run(tmp_path, model, "out-last", "last")
    doc = json.loads(t1.collect({"model": str(model)}, out, results, "tiny-last", "a last-token retriever").read_text())
    assert (results / "table1_embedder_tiny-last.json").is_file() and (results / "table1_embedder.json").is_file()
    assert doc["encoder"] == {"pooling": "last", "append_eos": True, "dense_head": False}
    check = doc["untrained_check"]
    assert check["trained"]["tasks"]["scifact_small"]["delta"]["low"] > 0
    text = render.render(results, tmp_path / "RESULTS.md")
    first = text.index("## EffiR Table 1 on a trained embedder")
    tagged = text[text.index("## EffiR Table 1 on a last-token retriever"):text.index("## Provenance")]
    assert first < text.index("## EffiR Table 1 on a last-token retriever")
    assert "its encoder kept (the last token with EOS appended)" in tagged
    assert "benchmarks/table1_embedder.py --tag tiny-last" in tagged
    assert "python benchmarks/train_dense.py --pooling last" in tagged and "so it beats its untrained start" in tagged


def test_a_retriever_not_made_by_train_dense_has_no_untrained_check(tmp_path):
    assert t1.untrained_check(tmp_path / "some" / "model") is None
    assert t1.out_of("x").name == "effir-table1-x" and t1.name_of("") == "table1_embedder"
