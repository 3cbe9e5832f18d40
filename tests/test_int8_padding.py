"""benchmarks/int8_padding.py end to end on tiny models: padding per sort, the four variants against the
float32 unpruned model with paired intervals and paired speed-ups, reuse of finished stages, the RESULTS.md
section."""
import json

from benchmarks import int8_padding as bench
from benchmarks.grid import render
from dsprune.surgery.prune import drop_sublayers, export
from dsprune.tiny import tiny_encoder

from test_eval_retrieval import write_beir


def test_int8_padding_runs_and_renders(tmp_path, capsys):
    tiny_encoder("llama").save(tmp_path / "full")
    enc = tiny_encoder("llama")
    drop_sublayers(enc, mlp=[1, 2])
    export(enc, tmp_path / "pruned", stage="drop")
    data = write_beir(tmp_path / "beir")
    argv = ["--model", str(tmp_path / "full"), "--pruned", str(tmp_path / "pruned"), "--task", f"tiny={data}",
            "--data", str(data), "--batch_size", "3", "--padding_batch_sizes", "2", "--pairs", "5", "--docs", "4",
            "--doc_len", "16", "--queries", "4", "--query_len", "8", "--threads", "1", "--out", str(tmp_path / "out"),
            "--results", str(tmp_path / "results"), "--no_render"]
    assert bench.main(argv) == 0
    doc = json.loads((tmp_path / "results" / "int8_padding.json").read_text())
    rows = doc["padding"]["rows"]
    assert [(r["kind"], r["batch_size"]) for r in rows] == [("query", 3), ("query", 2), ("document", 3),
                                                            ("document", 2)]
    for r in rows:
        assert 0 <= r["by_tokens"] <= r["by_chars"] < 1 and r["texts"] == (4 if r["kind"] == "query" else 8)
    assert [r["label"] for r in doc["report"]["rows"]] == ["unpruned", "pruned", "int8", "int8, down_proj float",
                                                           "pruned + int8"]
    assert all("mean_delta" in r for r in doc["report"]["rows"][1:])
    assert doc["variants"]["int8"]["fingerprint"] == doc["variants"]["unpruned"]["fingerprint"] + "+int8"
    assert doc["variants"]["int8, down_proj float"]["fingerprint"] == \
        doc["variants"]["unpruned"]["fingerprint"] + "+int8-skip:down_proj"
    for label in ("pruned", "int8", "int8, down_proj float", "pruned + int8"):
        sp = doc["speed"][label]["query"]
        assert sp["pairs"] == 5 and sp["min"] <= sp["speedup"] <= sp["max"]
        assert sp["flop_bound"] == (label == "pruned")
    assert doc["speed"]["int8"]["document"]["flop_ratio"] == 1.0
    assert doc["speed"]["pruned"]["document"]["flop_ratio"] > 1
    printed = capsys.readouterr().out
    assert "| pruned + int8 |" in printed and "sorted by token count" in printed
    # a second run reuses every finished stage
    assert bench.main(argv) == 0
    again = json.loads((tmp_path / "results" / "int8_padding.json").read_text())
    assert all(s["reused"] for s in again["stages"]) and len(again["stages"]) == 9
    text = render.render(tmp_path / "results", tmp_path / "RESULTS.md")
    section = text[text.index("## Inference without retraining"):text.index("## Provenance")]
    assert "| int8 |" in section and "pairs)" in section and "paired bootstrap" in section
    assert "| int8, down_proj float |" in section and "int8, down_proj float: every Linear layer whose name holds " \
        "`down_proj`" in section
    assert "| model | nDCG@10 | kept |" in section and "| unpruned | " in section and " | 1.000 | " in section
