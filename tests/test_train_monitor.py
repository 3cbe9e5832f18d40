"""The trainer's in-training score (``--eval_task``) can truncate like ``dsprune eval --max_length``, so a learning
curve is read on the same scale as the final table."""
from dsprune.encoder import Encoder
from dsprune.train.evaluate import EvalSet, evaluate, ndcg_at_k
from test_eval_retrieval import write_beir


def test_monitor_truncates_queries_and_documents_when_asked(tmp_path, tiny_dirs):
    data = EvalSet(write_beir(tmp_path / "beir"))
    enc = Encoder.load(str(tiny_dirs["llama"]))
    asked = []
    encode = enc.encode

    def spy(texts, kind="passage", **kw):
        asked.append((kind, kw.get("max_length")))
        return encode(texts, kind, **kw)

    enc.encode = spy
    short = evaluate(enc, data, batch_size=4, max_length=3)
    assert asked == [("query", 3), ("passage", 3)]
    q, d = encode(data.queries, "query", max_length=3), encode(data.docs, "passage", max_length=3)
    assert short["ndcg_at_10"] == ndcg_at_k(q @ d.T, data.doc_ids, data.qids, data.qrels)
    asked.clear()
    evaluate(enc, data, batch_size=4)
    assert asked == [("query", None), ("passage", None)]          # the encoder's own lengths
