"""The sub-layer timer must put each sub-layer's time under its own part (a dropped one under "dropped"), never
count more time in the parts than the pass took, and find subnormal inputs where they are: its explanation of a
slimmed model's speed rests on these."""
import pytest
import torch

from benchmarks import sublayer_time as st
from dsprune.errors import DsPruneError
from dsprune.surgery.prune import drop_sublayers, slice_neurons
from dsprune.tiny import tiny_encoder


def _batches(enc, n=2):
    ids = torch.randint(5, 100, (4, 12))
    return [{"input_ids": ids, "attention_mask": torch.ones_like(ids)} for _ in range(n)]


def test_parts_name_every_kept_and_dropped_sublayer():
    enc = tiny_encoder("gemma3_text").eval()
    drop_sublayers(enc, attn=[1], mlp=[2, 3])
    parts = st.part_modules(enc)
    kinds = sorted((p, i) for p, i in parts.values() if p in ("attention", "MLP", "dropped"))
    assert kinds == sorted([("attention", 0), ("attention", 2), ("attention", 3), ("dropped", 1),
                            ("MLP", 0), ("MLP", 1), ("dropped", 2), ("dropped", 3)])
    timed = st.hooked_pass(enc, _batches(enc), rounds=2)
    assert set(timed["mlp_s"]) == {"0", "1"}
    assert sum(v for p, v in timed["parts_s"].items() if p != "rest") <= timed["total_s"]
    assert all(v > 0 for p, v in timed["parts_s"].items() if p in ("attention", "MLP", "dropped"))


def test_subnormal_inputs_are_found_in_their_layer():
    enc = tiny_encoder("gemma3_text").eval()
    slice_neurons(enc, {0: torch.arange(16)})
    assert st.subnormal_share(enc, _batches(enc))["all"] == 0.0
    assert st.subnormal_weights(enc) == 0
    # the gate of layer 1 outputs a subnormal for every token: its neuron 0 then feeds a subnormal to down_proj
    with torch.no_grad():
        gate, up, _ = enc.arch.mlp_projections(enc.arch.layers_of(enc.backbone)[1])
        up.weight[0].zero_()
        up.bias = torch.nn.Parameter(torch.zeros(up.out_features))
        up.bias[0] = 1e-39
        gate.weight[0].zero_()
        gate.bias = torch.nn.Parameter(torch.zeros(gate.out_features))
        gate.bias[0] = 10.0
    share = st.subnormal_share(enc, _batches(enc))
    assert share["by_layer"]["1"] == pytest.approx(1 / up.out_features)
    assert share["by_layer"]["0"] == 0.0 and 0 < share["all"] < share["by_layer"]["1"]
    assert st.subnormal_weights(enc) == 1


def test_fit_and_width_proportional_time():
    fit = st.fit_line([100, 200, 400], [0.003, 0.005, 0.009])
    assert fit["a"] == pytest.approx(0.001) and fit["b"] == pytest.approx(2e-5) and fit["r2"] == pytest.approx(1.0)
    full = {"mlp_s": {"0": 0.010, "1": 0.012, "2": 0.011}}
    model = {"widths": [64, None, 128], "total_s": 0.1, "parts_s": {"MLP": 0.02}}
    # 0.1 - 0.02 + 0.011 * (64 + 128) / 128
    assert st.width_proportional(model, full, 128) == pytest.approx(0.0965)


def test_a_missing_or_planless_result_is_named(tmp_path):
    with pytest.raises(DsPruneError, match="compress_embedder_nope.json: no such compress-embedder result"):
        st.plan_of(tmp_path, "nope")
    (tmp_path / "compress_embedder_x.json").write_text('{"plan": {"attn": [1], "num_layers": 4}}')
    with pytest.raises(DsPruneError, match="its plan has no field 'mlp'"):
        st.plan_of(tmp_path, "x")


def _row(speed, flops, sub=0.0, weights=0, flush=1.0, mlp=(0.01, 0.012)):
    sp = {"median": speed, "min": speed - 0.05, "max": speed + 0.05} if speed else None
    return {"speedup_pairs": sp, "flop_ratio": flops, "width_proportional_speedup": flops,
            "flush_pairs": {"median": flush, "min": flush, "max": flush},
            "subnormal_down_inputs": {"all": sub}, "subnormal_weights": weights, "attention_kept": 16,
            "source": "x", "parts_s": dict.fromkeys(st.PARTS, 0.001), "mlp_s": dict(enumerate(mlp))}


def test_the_section_sets_a_saved_model_against_its_own_shape():
    from benchmarks.grid.render_sublayer_time import fit_sentence, kind_table, pair_sentences

    k = {"mlp_fit": {"a": 0.002, "b": 8e-6, "r2": 0.98, "n": 40},
         "models": {"unpruned": _row(None, 1.0), "slim": _row(1.62, 2.0, sub=3e-4, weights=2, flush=0.8),
                    "slim, shape only": _row(1.98, 2.0)}}
    (line,) = pair_sentences("document", k)
    assert line.startswith("- Documents: *slim* runs at 1.62× and its shape on the unpruned weights at 1.98×")
    assert "3.0e-04 of its down projections' inputs are subnormal (its shape's: 0.0e+00), 2 of its weights" in line
    assert "by a factor of 0.80" in line
    k["models"]["slim"] = _row(1.62, 2.0)
    assert "none of its down projections' inputs and none of its weights" in pair_sentences("query", k)[0]
    assert "2.00 ms + 8.00 µs per neuron (R² 0.980); the fixed part is 18% of a full-width MLP's 11.0 ms" in (
        fit_sentence("document", k))
    assert len(kind_table(k)) == 2 + 3


def test_two_pruned_models_are_set_against_each_other_round_by_round():
    from benchmarks.grid.render_sublayer_time import versus_sentences

    # the unpruned pass drifts (10, 14, 10 s) while the slimmed arm stays 1.2× slower than the dropped one
    times = {"unpruned": [10.0, 14.0, 10.0], "slim": [6.0, 6.0, 4.8], "drop": [5.0, 5.0, 4.8]}
    res = {n: {"total_s": s[0]} for n, s in times.items()}
    (v,) = st.versus(times, res)
    assert (v["first"], v["second"]) == ("slim", "drop")
    assert v["pairs"]["ratios"] == pytest.approx([1.2, 1.2, 1.0]) and v["hooked"] == pytest.approx(1.2)
    (line,) = versus_sentences("document", {"versus": [v]})
    assert line == ("- Documents: *drop* runs 1.20× as fast as *slim* (rounds 1.00–1.20×; faster in 2 of 3 "
                    "rounds), 1.20× in the hooked passes.")
    assert versus_sentences("query", {}) == []


def test_a_fit_through_or_below_zero_has_no_fixed_part():
    from benchmarks.grid.render_sublayer_time import fit_sentence

    k = {"mlp_fit": {"a": -0.001, "b": 1e-5, "r2": 0.9, "n": 3}, "models": {"unpruned": {"mlp_s": {"0": 0.01}}}}
    assert fit_sentence("query", k).endswith("no fixed part (a full-width MLP takes 10.0 ms), as a FLOP count has it.")
