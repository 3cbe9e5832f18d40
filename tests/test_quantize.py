"""Dynamic int8 quantisation and bfloat16 inference: every Linear becomes int8, embeddings stay close, a model in
another number format is never saved or matched to its float twin, and an unknown scheme is refused before
anything loads."""
import json

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.eval.speed import count_weights
from dsprune.surgery.prune import count_params

from test_eval_retrieval import write_beir


@pytest.fixture(scope="module")
def loaded(tiny_dirs):
    path = tiny_dirs["gemma3_text"]
    return path, Encoder.load(path), Encoder.load(path, quantize="int8")


def test_int8_replaces_every_linear_and_keeps_the_embeddings(loaded, texts):
    _, fp32, int8 = loaded
    assert int8.quantized == "int8" and fp32.quantized is None
    assert not any(type(m) is torch.nn.Linear for m in int8.modules())
    assert sum(isinstance(m, torch.ao.nn.quantized.Linear) for m in int8.modules()) == \
        sum(type(m) is torch.nn.Linear for m in fp32.modules())
    assert count_weights(int8.model) == count_params(fp32.model)      # int8 weights are still weights
    a = fp32.encode(texts, show_progress=False)
    b = int8.encode(texts, show_progress=False)
    assert not torch.equal(a, b)
    assert torch.nn.functional.cosine_similarity(a, b).min() > 0.99


def test_a_quantised_encoder_is_not_saved(loaded, tmp_path):
    _, _, int8 = loaded
    with pytest.raises(DsPruneError, match="int8-quantised encoder cannot be saved"):
        int8.save(tmp_path / "q")
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("kw, message", [
    ({"quantize": "int4"}, "quantize must be one of int8, not 'int4'"),
    ({"quantize": "int8", "device": "cuda"}, "CPU kernels only: use --device cpu, not 'cuda'"),
    ({"quantize": "int8", "dtype": "bfloat16"}, "starts from float32 weights"),
])
def test_load_refuses_what_it_cannot_quantise(tmp_path, kw, message):
    with pytest.raises(DsPruneError, match=message):
        Encoder.load(tmp_path / "not-even-there", **kw)      # refused before the path is looked at


@pytest.mark.parametrize("command", ["bench", "eval"])
def test_cli_refuses_an_unknown_scheme_in_one_line(tiny_dirs, tmp_path, capsys, command):
    out = tmp_path / "out"
    model = str(tiny_dirs["llama"])
    extra = (["--baseline", model, "--data", str(write_beir(tmp_path / "beir"))] if command == "bench"
             else ["--task", f"tiny={write_beir(tmp_path / 'beir')}"])
    assert main([command, "--model", model, *extra, "--quantize", "fp4", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: quantize must be one of int8, not 'fp4'"]
    assert not out.exists()


def test_eval_int8_scores_the_quantised_model_under_its_own_fingerprint(tiny_dirs, tmp_path):
    folder = write_beir(tmp_path / "beir")
    docs = {}
    for q in (None, "int8"):
        out = tmp_path / f"eval-{q}"
        assert main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"tiny={folder}", "--out", str(out),
                     "--quiet", *(["--quantize", q] if q else [])]) == 0
        docs[q] = json.loads((out / "results.json").read_text())
    assert docs["int8"]["fingerprint"] == docs[None]["fingerprint"] + "+int8"
    assert docs["int8"]["tasks"]["tiny"]["ndcg_at_10"] == pytest.approx(docs[None]["tasks"]["tiny"]["ndcg_at_10"],
                                                                         abs=0.35)


def test_skip_keeps_the_named_linears_float_and_names_itself(tiny_dirs, texts):
    path = tiny_dirs["gemma3_text"]
    fp32 = Encoder.load(path)
    part = Encoder.load(path, quantize="int8", quantize_skip=["down_proj"])
    assert part.quantized == "int8-skip:down_proj"
    kinds = {n: type(m) for n, m in part.named_modules()}
    downs = [n for n in kinds if n.endswith("down_proj")]
    assert downs and all(kinds[n] is torch.nn.Linear for n in downs)
    assert all(kinds[n] is torch.ao.nn.quantized.dynamic.Linear for n, m in fp32.named_modules()
               if type(m) is torch.nn.Linear and not n.endswith("down_proj"))
    whole = Encoder.load(path, quantize="int8")
    a, b, c = (e.encode(texts, show_progress=False) for e in (fp32, part, whole))
    assert not torch.equal(b, a) and not torch.equal(b, c)


@pytest.mark.parametrize("kw, message", [
    ({"quantize": "int8", "quantize_skip": ["no_such_proj"]}, "quantize_skip 'no_such_proj' matches no Linear"),
    ({"quantize_skip": ["down_proj"]}, "nothing is quantised: add --quantize int8"),
])
def test_a_skip_that_keeps_nothing_float_is_refused(tiny_dirs, kw, message):
    with pytest.raises(DsPruneError, match=message):
        Encoder.load(tiny_dirs["gemma3_text"], **kw)


def test_eval_with_skip_carries_the_skip_in_its_fingerprint(tiny_dirs, tmp_path):
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"tiny={write_beir(tmp_path / 'beir')}",
                 "--out", str(out), "--quiet", "--quantize", "int8", "--quantize_skip", "down_proj", "o_proj"]) == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["fingerprint"].endswith("+int8-skip:down_proj,o_proj")


def run_in_process(recipe: str, out, params: list[str], sets: list[str]) -> None:
    """A recipe run as ``dsprune run`` does it, each stage's command called in this process instead of a fresh
    one (the stage processes themselves are tested in test_recipe)."""
    from pathlib import Path

    from dsprune.recipe import parse_params, parse_sets, run_recipe

    path = Path(__file__).resolve().parents[1] / "recipes" / recipe

    def execute(cmd, folder):
        assert cmd[1:4] == ["-m", "dsprune.cli", cmd[3]]
        return main(cmd[3:])
    run_recipe(path, str(out), params=parse_params(params), overrides=parse_sets(sets), execute=execute)


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("beir") / "beir")


@pytest.mark.parametrize("fmt", ["int8", "bf16"])
def test_a_precision_recipe_scores_and_times_the_format_against_float32(tiny_dirs, tmp_path, beir, fmt):
    """recipes/int8-embedder.yaml (down projections float) and recipes/bf16-embedder.yaml as a user runs them
    on their model: the report pairs the format with float32 per query and carries the bench's speed-up,
    matched by the format's own fingerprint; benchmarks/precision_machine.py keeps the run under the CPU that
    timed it, and RESULTS.md shows it as its row."""
    from benchmarks import precision_machine
    from benchmarks.grid.render_precision_machines import render_precision_machines
    from dsprune.recipe import parse_params

    out = tmp_path / "run"
    params = [f"model={tiny_dirs['gemma3_text']}", f"tasks=[tiny={beir}]"]
    run_in_process(precision_machine.RECIPES[fmt].name, out, params,
                   ["bench.docs=8", "bench.queries=4", "bench.doc_len=32", f"bench.data={beir}"])
    suffix = {"int8": "+int8-skip:down_proj", "bf16": "+bfloat16"}[fmt]
    label = {"int8": "int8", "bf16": "bfloat16"}[fmt]
    full = json.loads((out / "eval-full" / "results.json").read_text())
    other = json.loads((out / f"eval-{fmt}" / "results.json").read_text())
    assert other["fingerprint"] == full["fingerprint"] + suffix
    bench = json.loads((out / "bench" / "bench.json").read_text())
    assert bench["fingerprint"] == {"model": other["fingerprint"], "baseline": full["fingerprint"]}
    assert bench["document"]["model"]["number_format"] == ("int8-skip:down_proj" if fmt == "int8" else "bfloat16")
    assert bench["document"]["baseline"]["number_format"] == "float32" and not bench["document"]["flop_bound"]
    report = json.loads((out / "report" / "report.json").read_text())
    rows = {r["label"]: r for r in report["rows"]}
    assert set(rows) == {"float32", label} and "delta" in rows[label]["tasks"]["tiny"]
    assert rows[label]["speed"]["document"] > 0 and rows[label]["speed"]["baseline_fp"] == full["fingerprint"]

    doc = precision_machine.collect(fmt, out, parse_params(params), ["dsprune", "run", "..."])
    assert doc["speed"]["document"]["speedup"] == pytest.approx(rows[label]["speed"]["document"])
    assert doc["machine"]["cpu"] and doc["format"] == fmt
    assert doc["quantize_skip"] == (["down_proj"] if fmt == "int8" else [])
    assert doc["dtype"] == {"model": "float32" if fmt == "int8" else "bfloat16", "baseline": "float32"}
    name = precision_machine.results_name(fmt, doc["machine"])
    assert name.startswith(f"{fmt}_machine_")
    precision_machine.keep_results(doc, out, tmp_path / "results", name)
    lines = render_precision_machines(tmp_path / "results")
    row = next(line for line in lines if line.startswith(f"| {doc['machine']['cpu']} |"))
    assert f"| {rows['float32']['mean']:.4f} |" in row and f"{doc['speed']['query']['speedup']:.2f}×" in row
    assert ("| int8 (down_proj float32) |" if fmt == "int8" else "| bfloat16 |") in row


def test_precision_machine_takes_the_float32_evaluation_from_the_other_formats_run(tmp_path):
    from benchmarks._common import link_finished_stage

    done, unfinished = tmp_path / "int8" / "eval-full", tmp_path / "int8" / "eval-int8"
    for f in (done, unfinished):
        f.mkdir(parents=True)
        (f / "results.json").write_text("{}")
    (done / "stage.json").write_text("{}")
    link_finished_stage(done, tmp_path / "bf16" / "eval-full")
    link_finished_stage(unfinished, tmp_path / "bf16" / "eval-int8")
    assert (tmp_path / "bf16" / "eval-full" / "results.json").samefile(done / "results.json")
    assert not (tmp_path / "bf16" / "eval-int8").exists()       # not finished: nothing to share
    (tmp_path / "mine").mkdir()
    link_finished_stage(done, tmp_path / "mine")                 # a folder already there is left alone
    assert list((tmp_path / "mine").iterdir()) == []


def test_bench_times_a_bfloat16_model_against_its_float32_self(tiny_dirs, tmp_path, beir, capsys):
    out = tmp_path / "bench"
    model = str(tiny_dirs["llama"])
    assert main(["bench", "--model", model, "--baseline", model, "--data", str(beir), "--dtype", "bfloat16",
                 "--baseline_dtype", "float32", "--docs", "4", "--queries", "4", "--doc_len", "16",
                 "--repeats", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "dtype: model bfloat16, baseline float32" in printed
    assert "the model computes in bfloat16, the baseline in float32" in printed
    doc = json.loads((out / "bench.json").read_text())
    assert doc["fingerprint"]["model"] == doc["fingerprint"]["baseline"] + "+bfloat16"
    assert doc["document"]["flop_ratio"] == pytest.approx(1.0)


def test_bench_refuses_an_unknown_baseline_dtype_in_one_line(tiny_dirs, tmp_path, beir, capsys):
    out = tmp_path / "bench"
    model = str(tiny_dirs["llama"])
    assert main(["bench", "--model", model, "--baseline", model, "--data", str(beir), "--baseline_dtype", "fp8",
                 "--out", str(out)]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: --baseline_dtype 'fp8': choose one of float32, bfloat16, float16"]
    assert not out.exists()


@pytest.mark.parametrize("flags, words", [
    (["avx", "avx2", "fma"], "none"),
    (["avx2", "avx_vnni"], "AVX-VNNI"),
    (["avx512f", "avx512bw", "avx512_vnni"], "AVX-512 (VNNI)"),
    (["avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8"],
     "AVX-512 (VNNI, BF16), AMX (BF16, INT8)"),
])
def test_the_machine_table_names_the_instruction_families_a_format_uses(flags, words):
    from benchmarks.grid.render_precision_machines import isa_families
    assert isa_families(flags) == words
