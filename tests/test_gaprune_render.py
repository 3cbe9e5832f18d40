"""RESULTS.md names each DAI row's alignment from the row's own commands, and benchmarks/dai_modes.py's measures
are what they say (hand-made tensors)."""
import pytest
import torch

from benchmarks.dai_modes import differs, tails
from benchmarks.grid.render_dai_modes import dai_mode, dai_tag, rows_used


def _doc(*commands):
    names = ["dense-gap-dai", "dense-gap-prune-dai-50"]
    return {"stages": [{"name": n, "command": c} for n, c in zip(names, commands)]}


def test_dai_mode_is_read_from_the_rows_commands():
    dai = "deepspeed --num_gpus 2 launchers/dai.py --model M --max_length 128 --output_dir O"
    prune = "dsprune prune --model M --method dai --sparsity 0.5 --scores O --out P"
    assert dai_mode(_doc(dai, prune)) == {"alignment": "consistency", "variant": "paper", "fisher_scale": "1"}
    assert dai_tag(_doc(dai, prune)) == " · consistency alignment"
    ref = dai.replace("--model M", "--model M --alignment reference --variant reference")
    assert dai_tag(_doc(ref, prune)) == " · reference alignment, reference scoring"
    recomputed = prune + " --dai_recompute true --dai_alignment eq4 --dai_fisher_scale balanced"
    assert dai_mode(_doc(dai, recomputed)) == {"alignment": "eq4", "variant": "paper", "fisher_scale": "balanced"}
    magnitude = "dsprune prune --model M --method magnitude --sparsity 0.5 --out P"
    assert dai_mode(_doc(dai, magnitude)) is None and dai_tag(None) == ""
    assert rows_used({"a": _doc(dai, prune), "b": _doc(ref, prune), "c": _doc(dai, magnitude)}) == \
        "alignment `consistency`, scoring `paper`: a; alignment `reference`, scoring `reference`: b"


def test_mask_difference_and_fisher_tail_by_hand():
    theta = {"l.0.mlp.up_proj.weight": torch.tensor([[0.04, 1.0], [0.25, 0.01]])}
    f_dom = {"l.0.mlp.up_proj.weight": torch.tensor([[1.0, 0.0], [0.0, 5.0]])}
    f_gen = {"l.0.mlp.up_proj.weight": torch.tensor([[0.0, 3.0], [1.0, 0.0]])}
    t = tails(theta, f_gen, f_dom, scale=4.0)["up_proj"]
    # r = (F_dom − F_gen)·|θ| / (0.5·√|θ|): weight 1.0 -> −3·1/0.5 = −6, weight 0.25 -> −0.25/0.25 = −1
    assert t["negative_fraction"] == 0.5
    assert t["r_min"] == pytest.approx(-6.0)
    assert t["r_median_of_negative"] == pytest.approx(-3.5)
    assert t["below_minus_one"] == 0.25 and t["below_minus_one_balanced"] == 0.5   # 4·(−1) < −1 too
    keep = {"l.0.mlp.up_proj.weight": torch.tensor([[True, False], [True, False]])}
    ref = {"l.0.mlp.up_proj.weight": torch.tensor([[True, True], [False, False]])}
    assert differs(keep, ref) == (0.5, {"up_proj": 0.5})


def test_dai_modes_keeps_one_results_file_per_model_and_names_a_retrained_dense_model(tiny_dirs, tmp_path):
    """benchmarks/dai_modes.py end to end on a tiny model: its own results file beside SmolLM2's, the weights
    fingerprint kept, and a section of its own that says its weights are not the grid's dense row's."""
    import json
    import shutil
    from pathlib import Path

    from benchmarks import dai_modes
    from benchmarks._common import results_name
    from benchmarks.grid.render_dai_modes import render_dai_modes

    trip = [{"query": f"question {i} about topic {i}", "positive": f"topic {i} is explained here",
             "negative": f"unrelated note {i}"} for i in range(4)]
    gen, dom = tmp_path / "gen.jsonl", tmp_path / "dom.jsonl"
    gen.write_text("".join(json.dumps(t) + "\n" for t in trip))
    dom.write_text("".join(json.dumps({**t, "query": "finance " + t["query"]}) + "\n" for t in trip))
    results = tmp_path / "results"
    model = str(tiny_dirs["llama"])
    name = results_name("dai_modes", model)
    assert name.startswith("dai_modes_") and results_name("dai_modes", "smollm2") == "dai_modes"
    assert dai_modes.main(["--model", model, "--general", str(gen), "--domain", str(dom), "--max_triplets", "4",
                           "--max_length", "32", "--out", str(tmp_path / "out"),
                           "--results", str(results / f"{name}.json")]) == 0
    doc = json.loads((results / f"{name}.json").read_text())
    assert len(doc["model_fingerprint"]) == 40 and {m["name"] for m in doc["modes"]} >= {"eq4", "reference"}
    committed = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    shutil.copy(committed / "dai_modes.json", results / "dai_modes.json")
    shutil.copy(committed / "dense.json", results / "dense.json")
    text = "\n".join(render_dai_modes(results, {}))
    grid = json.loads((committed / "dense.json").read_text())["model_fingerprint"]
    assert text.startswith("## DAI modes against magnitude") and f"### The same on `{model}`" in text
    assert (f"(weights {doc['model_fingerprint'][:12]}; not the grid's dense row, {grid[:12]}: another training run, "
            "whose masks are not the grid rows' masks)") in text
    assert f"[{name}.json](results/{name}.json)" in text and "[dai_modes.json](results/dai_modes.json)" in text
    worst = max(x["below_minus_one"] for t in doc["tails"].values() for x in t["kinds"].values())
    assert ("no weight has r < −1" if worst == 0 else f"at most {worst:.1e} of a matrix kind's weights") in \
        text.split("### The same on")[1]
