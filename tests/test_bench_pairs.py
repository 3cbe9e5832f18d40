"""Speed-ups as the median of alternating timed pairs with their min–max, warnings for figures that cannot be
trusted, refusal of models whose tokenizers differ, and the same paired timing in ``score --compare_forward``."""
import json
import statistics

import pytest

from dsprune.cli import main
from dsprune.eval.speed import pair_ratios, speed_warning, time_pairs
from dsprune.surgery.prune import drop_sublayers, export
from dsprune.tiny import tiny_encoder, tiny_tokenizer

from test_eval_retrieval import write_beir

SMALL = ["--docs", "6", "--doc_batch", "3", "--doc_len", "16", "--queries", "4", "--query_batch", "2",
         "--query_len", "8"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("bench_pairs")
    tiny_encoder("llama").save(root / "full")
    enc = tiny_encoder("llama")
    drop_sublayers(enc, mlp=[0, 1, 2])
    export(enc, root / "pruned", stage="drop")
    return root, write_beir(root / "beir")


def test_time_pairs_alternates_and_warms_up():
    calls = []
    times, last = time_pairs({"a": lambda: calls.append("a") or 1, "b": lambda: calls.append("b") or 2},
                             pairs=3, warmup=1)
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert len(times["a"]) == len(times["b"]) == 3 and last == {"a": 1, "b": 2}


def test_speedup_is_the_median_pairwise_ratio_not_a_ratio_of_medians():
    base, model = [1.0, 2.0, 10.0], [1.0, 1.0, 9.0]      # the load rose in the middle pair's baseline pass
    r = pair_ratios(base, model)
    assert r["ratios"] == pytest.approx([1.0, 2.0, 10 / 9])
    assert r["median"] == pytest.approx(10 / 9) and (r["min"], r["max"]) == (1.0, 2.0)
    assert statistics.median(base) / statistics.median(model) == 2.0      # what a ratio of medians would say


@pytest.mark.parametrize("pairs, flop_ratio, bound, warned", [
    ((1.50, 1.55, 1.60), 2.0, True, None),                       # tight, below its FLOP ratio
    ((1.20, 1.55, 1.90), 2.0, True, "spread 1.20–1.90x"),         # the load changed during the run
    ((2.30, 2.40, 2.45), 2.0, True, "exceeds the FLOP ratio 2.00x"),
    ((2.30, 2.40, 2.45), 1.0, False, None),                      # int8 against float: FLOPs do not bound it
])
def test_speed_warning(pairs, flop_ratio, bound, warned):
    sp = pair_ratios(list(pairs), [1.0] * len(pairs))
    w = speed_warning("query", {"speedup_pairs": sp, "speedup": sp["median"], "flop_ratio": flop_ratio,
                                "flop_bound": bound})
    if warned is None:
        assert w is None
    else:
        assert w.startswith("query speed-up") and warned in w and "\n" not in w


def test_bench_times_five_alternating_pairs_and_int8_with_a_layer_kept_float(models, tmp_path, capsys):
    root, data = models
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(root / "pruned"), "--baseline", str(root / "full"), "--out", str(out),
                 "--data", str(data), *SMALL, "--quantize", "int8", "--quantize_skip", "down_proj"]) == 0
    doc = json.loads((out / "bench.json").read_text())
    for kind in ("document", "query"):
        r = doc[kind]
        assert r["pairs"] == 5 and len(r["model"]["seconds"]) == len(r["baseline"]["seconds"]) == 5
        ratios = [b / m for b, m in zip(r["baseline"]["seconds"], r["model"]["seconds"])]
        assert r["speedup"] == pytest.approx(statistics.median(ratios))
        assert (r["speedup_pairs"]["min"], r["speedup_pairs"]["max"]) == pytest.approx((min(ratios), max(ratios)))
        assert r["model"]["quantize"] == "int8-skip:down_proj" and r["baseline"]["quantize"] is None
        assert not r["flop_bound"]
    assert doc["fingerprint"]["model"].endswith("+int8-skip:down_proj")
    assert "+" not in doc["fingerprint"]["baseline"]
    assert doc["params"]["non_embedding"]["ratio"] > 1            # the dropped MLPs, not the int8 packing
    printed = capsys.readouterr()
    assert "median of 5 alternating model/baseline pairs" in printed.out and "does not bound" in printed.out
    assert "model quantised: int8-skip:down_proj" in printed.out
    assert printed.err.count("warning:") == len(doc["warnings"])


def test_bench_refuses_models_whose_tokenizers_differ(models, tmp_path, capsys):
    root, data = models
    other = tmp_path / "other-tokenizer"
    enc = tiny_encoder("llama")
    enc.tokenizer = tiny_tokenizer(300)
    enc.save(other)
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(other), "--baseline", str(root / "full"), "--out", str(out),
                 "--data", str(data), *SMALL, "--repeats", "1"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]   # beside load progress bars
    assert len(err) == 1 and err[0].startswith("error: the model's and the baseline's tokenizers differ (vocab")
    assert "--same_texts" in err[0]
    assert not out.exists()


def test_same_texts_times_models_with_different_tokenizers_on_their_own_tokens(models, tmp_path, capsys):
    """A small model a user would pick instead: each model tokenises the same texts itself, and the FLOP ratio
    counts each one's own padded positions at its batch lengths."""
    from dsprune.encoder import Encoder
    from dsprune.eval.speed import flops_per_token, own_batches, sample_texts

    root, data = models
    other = tmp_path / "bert"
    tiny_encoder("bert").save(other)
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(other), "--baseline", str(root / "full"), "--out", str(out),
                 "--data", str(data), *SMALL, "--repeats", "1", "--same_texts"]) == 0
    doc = json.loads((out / "bench.json").read_text())
    docs, _ = sample_texts(data, 6, 4, 0)
    per_text = {}
    for role, path in (("model", other), ("baseline", root / "full")):
        enc = Encoder.load(path)
        batches = own_batches(enc, docs, "passage", 3, 16)
        assert doc["document"][role]["positions"] == sum(b["input_ids"].numel() for b in batches)
        per_text[role] = sum(b["input_ids"].shape[0] * b["input_ids"].shape[1]
                             * flops_per_token(enc, b["input_ids"].shape[1])["total"] for b in batches) / len(docs)
    assert doc["document"]["same_texts"] is True
    assert doc["document"]["flop_ratio"] == pytest.approx(per_text["baseline"] / per_text["model"])
    assert "same texts, each model with its own tokenizer" in capsys.readouterr().out


def test_fixed_length_flop_ratio_is_the_per_token_ratio(models, tmp_path):
    from dsprune.encoder import Encoder
    from dsprune.eval.speed import flops_per_token

    root, data = models
    out = tmp_path / "bench"
    assert main(["bench", "--model", str(root / "pruned"), "--baseline", str(root / "full"), "--out", str(out),
                 "--data", str(data), *SMALL, "--repeats", "1"]) == 0
    doc = json.loads((out / "bench.json").read_text())
    fpt = {r: flops_per_token(Encoder.load(root / n), 16)["total"] for r, n in (("model", "pruned"), ("baseline", "full"))}
    assert doc["document"]["flop_ratio"] == pytest.approx(fpt["baseline"] / fpt["model"])
    assert doc["document"]["same_texts"] is False
    assert doc["document"]["model"]["positions"] == 6 * 16


def test_score_compare_forward_times_alternating_pairs(models, tmp_path, texts):
    root, _ = models
    calib = tmp_path / "calib.jsonl"
    calib.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 2))
    out = tmp_path / "score"
    assert main(["score", "--model", str(root / "full"), "--calib", str(calib), "--out", str(out),
                 "--compare_forward", "--compare_pairs", "3"]) == 0
    fig = json.loads((out / "manifest.json").read_text())["figures"]
    low, high = fig["scoring_over_forward_min_max"]
    assert fig["compare_pairs"] == 3 and low <= fig["scoring_over_forward"] <= high
    assert fig["plain_forward_seconds"] > 0 and fig["scoring_seconds"] > 0
