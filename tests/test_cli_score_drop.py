"""`dsprune score` and `dsprune drop` as a user runs them, including the ways input goes wrong."""
import json

import pytest

from dsprune.cli import main
from dsprune.commands.common import weights_of
from dsprune.encoder import Encoder


@pytest.fixture
def calib(tmp_path, texts):
    p = tmp_path / "calib.jsonl"
    p.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts * 3))
    return p


def test_score_then_drop(tiny_dirs, calib, tmp_path, capsys):
    model = str(tiny_dirs["qwen2"])
    assert main(["score", "--model", model, "--calib", str(calib), "--out", str(tmp_path / "s")]) == 0
    doc = json.loads((tmp_path / "s" / "scores.json").read_text())
    assert sorted(doc["order"]["mlp"]) == [0, 1, 2, 3] and (tmp_path / "s" / "drop_order.png").stat().st_size > 0
    assert doc["weights"] == weights_of(model)
    assert main(["drop", "--model", model, "--scores", str(tmp_path / "s"), "--drop-mlp", "2", "--drop_attn", "1",
                 "--out", str(tmp_path / "d")]) == 0
    man = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert man["structure"]["drop_mlp"] == sorted(doc["order"]["mlp"][:2])
    assert man["structure"]["drop_attn"] == doc["order"]["attn"][:1]
    assert man["params"]["after"] < man["params"]["before"]
    enc = Encoder.load(tmp_path / "d")
    assert enc.model.config.drop_mlp == man["structure"]["drop_mlp"]
    # a dropped model can be dropped further; numbering stays the original one
    assert main(["drop", "--model", str(tmp_path / "d"), "--drop-last", "1", "--out", str(tmp_path / "d2")]) == 0
    man2 = json.loads((tmp_path / "d2" / "manifest.json").read_text())
    assert 3 in man2["structure"]["drop_attn"] and 3 in man2["structure"]["drop_mlp"]


def test_iterative_drop_via_config_file(tiny_dirs, calib, tmp_path):
    cfg = tmp_path / "drop.yaml"
    cfg.write_text(f"model: {tiny_dirs['llama']}\ncalib: {calib}\ndrop_mlp: 2\niterative: true\n")
    assert main(["drop", "--config", str(cfg), "--out", str(tmp_path / "d")]) == 0
    man = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert len(man["structure"]["drop_mlp"]) == 2 and man["config"]["iterative"] is True


def _err(capsys):
    return capsys.readouterr().err


def test_too_many_drops(tiny_dirs, tmp_path, capsys):
    assert main(["drop", "--model", str(tiny_dirs["llama"]), "--drop-last", "5", "--out", str(tmp_path / "d")]) == 2
    assert "drop_blocks/drop_last 5 is larger than the 4 blocks" in _err(capsys)
    assert not (tmp_path / "d").exists()


def test_malformed_calibration_names_file_and_line(tiny_dirs, tmp_path, capsys):
    bad = tmp_path / "calib.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": broken\n')
    assert main(["score", "--model", str(tiny_dirs["llama"]), "--calib", str(bad), "--out", str(tmp_path / "s")]) == 2
    err = _err(capsys)
    assert "calib.jsonl: line 2: malformed JSON" in err and not (tmp_path / "s").exists()


def test_unknown_family(tmp_path, capsys, texts):
    from transformers import GPT2Config, GPT2Model

    from dsprune.tiny import tiny_tokenizer
    GPT2Model(GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=600)).save_pretrained(tmp_path / "gpt2")
    tiny_tokenizer().save_pretrained(tmp_path / "gpt2")
    assert main(["score", "--model", str(tmp_path / "gpt2"), "--calib", str(_calib_txt(tmp_path, texts)),
                 "--out", str(tmp_path / "s")]) == 2
    err = _err(capsys)
    assert "unsupported model_type 'gpt2'" in err and "llama" in err and "bert" in err


def _calib_txt(tmp_path, texts):
    p = tmp_path / "c.txt"
    p.write_text("\n".join(texts))
    return p


def test_existing_output_without_overwrite(tiny_dirs, tmp_path, capsys, texts):
    (tmp_path / "s").mkdir()
    args = ["score", "--model", str(tiny_dirs["llama"]), "--calib", str(_calib_txt(tmp_path, texts)),
            "--out", str(tmp_path / "s")]
    assert main(args) == 2
    assert "output folder exists" in _err(capsys)
    assert main(args + ["--overwrite"]) == 0
    assert (tmp_path / "s" / "scores.json").is_file()


def test_scores_for_another_model_are_refused(tiny_dirs, tmp_path, capsys):
    s = tmp_path / "scores.json"
    s.write_text(json.dumps({"scores": {"attn": {}, "mlp": {}, "block": {}}, "order": {}, "num_layers": 30}))
    assert main(["drop", "--model", str(tiny_dirs["llama"]), "--scores", str(s), "--drop-mlp", "1",
                 "--out", str(tmp_path / "d")]) == 2
    assert "30-layer model" in _err(capsys)


def test_scores_of_other_weights_are_refused(tiny_dirs, calib, tmp_path, capsys):
    """Same family and layer count, another checkpoint: scores.json names the weights it scored."""
    from dsprune.tiny import save_tiny

    other = save_tiny(tmp_path / "other", "qwen2", seed=1)
    assert main(["score", "--model", str(tiny_dirs["qwen2"]), "--calib", str(calib), "--out", str(tmp_path / "s")]) == 0
    for cmd in (["drop", "--drop-mlp", "1"], ["plan", "--target_speedup", "1.1"]):
        assert main([*cmd, "--model", str(other), "--scores", str(tmp_path / "s"), "--out", str(tmp_path / "d")]) == 2
        err = _err(capsys)
        assert f"{tmp_path / 's'}: scores were computed on weights" in err and str(other) in err, err
        assert not (tmp_path / "d").exists()


def test_protect_on_the_command_line(tiny_dirs, tmp_path, capsys):
    s = tmp_path / "scores.json"
    s.write_text(json.dumps({"scores": {"attn": {}, "mlp": {"0": 0.0, "1": 0.1, "2": 0.5, "3": 0.2}, "block": {}},
                             "order": {}, "num_layers": 4}))
    base = ["drop", "--model", str(tiny_dirs["llama"]), "--scores", str(s), "--drop-mlp", "2"]
    assert main(base + ["--protect", "1", "--out", str(tmp_path / "d")]) == 0
    man = json.loads((tmp_path / "d" / "manifest.json").read_text())
    assert man["structure"]["drop_mlp"] == [1, 3]
    assert main(base + ["--protect", "3", "--out", str(tmp_path / "x")]) == 2
    assert "after protecting the first 3" in _err(capsys) and not (tmp_path / "x").exists()
    assert main(base + ["--protect", "0,3", "--out", str(tmp_path / "l")]) == 0
    man = json.loads((tmp_path / "l" / "manifest.json").read_text())
    assert man["structure"]["drop_mlp"] == [1, 2]
    assert main(base + ["--protect", "1,9", "--out", str(tmp_path / "x")]) == 2
    assert "protect: layer 9 is out of range for the 4-layer model" in _err(capsys) and not (tmp_path / "x").exists()
