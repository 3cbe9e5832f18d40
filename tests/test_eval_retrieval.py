"""dsprune eval on a tiny local BEIR folder: mteb's nDCG@10 equals a hand computation; bad data fails early."""
import json
import math

import pytest
import torch

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.eval import tasks
from dsprune.eval.mteb_model import query_prompt

DOCS = {
    "d0": ("Membranes", "the cell membrane regulates transport of ions and proteins"),
    "d1": ("", "aspirin reduces the risk of heart attack in some patients"),
    "d2": ("Revenue", "revenue grew by ten percent in the fiscal year"),
    "d3": ("", "the company reported net income and operating cash flow"),
    "d4": ("Retrieval", "dense retrieval encodes queries and passages into vectors"),
    "d5": ("", "pruning removes redundant layers from large language models"),
    "d6": ("", "gene expression changes during development of the embryo"),
    "d7": ("Rates", "interest rates affect bond prices and bank margins"),
}
QUERIES = {"q1": "how does the cell transport ions", "q2": "company revenue and income",
           "q3": "removing layers of language models", "q4": "bond prices"}
QRELS = [("q1", "d0", 1), ("q2", "d2", 2), ("q2", "d3", 1), ("q3", "d5", 1), ("q3", "d4", 1), ("q4", "d7", 1)]


def write_beir(folder, docs=DOCS, queries=QUERIES, qrels=QRELS, corpus_extra=""):
    (folder / "qrels").mkdir(parents=True)
    lines = [json.dumps({"_id": k, "title": t, "text": x}) for k, (t, x) in docs.items()]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n" + corpus_extra)
    (folder / "queries.jsonl").write_text("\n".join(json.dumps({"_id": k, "text": v}) for k, v in queries.items()))
    (folder / "qrels" / "test.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"{q}\t{d}\t{s}\n" for q, d, s in qrels))
    return folder


def hand_ndcg10(scores: dict[str, float], rels: dict[str, int]) -> float:
    """nDCG@10 with linear gains (as trec_eval/pytrec_eval): sum rel_i / log2(i + 1)."""
    ranked = sorted(scores, key=lambda d: -scores[d])[:10]
    dcg = sum(rels.get(d, 0) / math.log2(i + 2) for i, d in enumerate(ranked))
    ideal = sorted(rels.values(), reverse=True)[:10]
    return dcg / sum(g / math.log2(i + 2) for i, g in enumerate(ideal))


def test_eval_matches_hand_ndcg(tiny_dirs, tmp_path, capsys):
    folder = write_beir(tmp_path / "beir")
    out = tmp_path / "eval"
    rc = main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"tiny={folder}", "--out", str(out),
               "--quiet", "--batch_size", "3"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())
    task = res["tasks"]["tiny"]
    # By hand: the same Encoder, cosine (normalised dot), linear-gain nDCG@10.
    enc = Encoder.load(tiny_dirs["llama"])
    ids = list(DOCS)
    d = enc.encode([f"{t} {x}".strip() for t, x in DOCS.values()], "passage", show_progress=False)
    qids = list(QUERIES)
    q = enc.encode([QUERIES[k] for k in qids], "query", show_progress=False)
    sims = q @ d.T
    rels = {}
    for qid, did, s in QRELS:
        rels.setdefault(qid, {})[did] = s
    per_q = {qid: hand_ndcg10({ids[j]: float(sims[i, j]) for j in range(len(ids))}, rels[qid])
             for i, qid in enumerate(qids)}
    assert task["per_query"]["ndcg_at_10"] == pytest.approx(per_q, abs=1e-5)
    assert task["ndcg_at_10"] == pytest.approx(sum(per_q.values()) / len(per_q), abs=1e-4)
    assert task["recall_at_100"] == pytest.approx(1.0)
    assert res["fingerprint"] and res["encoder"]["max_length"] == enc.config.max_length
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stage"] == "eval" and manifest["inputs"]["fingerprint"] == res["fingerprint"]
    assert "nDCG@10" in capsys.readouterr().out


def test_second_checkpoint_never_gets_first_score(tiny_dirs, tmp_path):
    """Same folder name, different weights: a fresh score and a different fingerprint (no stale cache)."""
    folder = write_beir(tmp_path / "beir")
    enc = Encoder.load(tiny_dirs["llama"])
    scores = []
    for seed in (0, 1):
        model = tmp_path / f"run{seed}" / "model"
        with torch.no_grad():
            for p in enc.model.parameters():
                p.add_(torch.randn_like(p) * 0.5 * seed)
        enc.save(model)
        out = tmp_path / f"eval{seed}"
        assert main(["eval", "--model", str(model), "--task", f"tiny={folder}", "--out", str(out), "--quiet"]) == 0
        scores.append(json.loads((out / "results.json").read_text()))
    assert scores[0]["fingerprint"] != scores[1]["fingerprint"]
    assert scores[0]["tasks"]["tiny"]["per_query"] != scores[1]["tasks"]["tiny"]["per_query"]


def test_encoder_options_score_the_same_weights_otherwise_under_their_own_fingerprint(tiny_dirs, tmp_path, capsys):
    """``--encoder`` pools as asked (last token, EOS appended: the hand encoding with that config), and the results
    carry a fingerprint of their own, so a report or a cache never takes them for the folder's own pooling."""
    import dataclasses

    folder = write_beir(tmp_path / "beir")
    docs = {}
    for name, over in (("own", []), ("last", ["--encoder", '{"pooling": "last", "append_eos": true}'])):
        out = tmp_path / name
        assert main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"tiny={folder}", "--out", str(out),
                     "--quiet", *over]) == 0
        docs[name] = json.loads((out / "results.json").read_text())
    own, last = docs["own"], docs["last"]
    assert last["encoder"]["pooling"] == "last" and last["encoder"]["append_eos"] is True
    assert own["encoder"]["pooling"] == "mean"
    assert last["fingerprint"].startswith(own["fingerprint"] + "+encoder:")
    enc = Encoder.load(tiny_dirs["llama"])
    enc.config = dataclasses.replace(enc.config, pooling="last", append_eos=True)
    d = enc.encode([f"{t} {x}".strip() for t, x in DOCS.values()], "passage", show_progress=False)
    q = enc.encode(list(QUERIES.values()), "query", show_progress=False)
    sims = q @ d.T
    rels = {}
    for qid, did, s in QRELS:
        rels.setdefault(qid, {})[did] = s
    per_q = {qid: hand_ndcg10({k: float(sims[i, j]) for j, k in enumerate(DOCS)}, rels[qid])
             for i, qid in enumerate(QUERIES)}
    assert last["tasks"]["tiny"]["per_query"]["ndcg_at_10"] == pytest.approx(per_q, abs=1e-5)
    assert last["tasks"]["tiny"]["per_query"] != own["tasks"]["tiny"]["per_query"]
    capsys.readouterr()
    assert main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"tiny={folder}", "--out",
                 str(tmp_path / "typo"), "--encoder", '{"poolng": "last"}']) != 0
    assert "encoder: unknown option(s) poolng" in capsys.readouterr().err
    assert not (tmp_path / "typo").exists()


def test_run_leaves_task_and_mteb_logger_as_it_found_them(tiny_dirs, tmp_path):
    """Per-query capture and the quieter mteb logger last only while a task runs: a second run of the same
    task objects scores the same, and nothing of either is left behind."""
    import logging

    from dsprune.eval.evaluate import load_tasks, run
    from dsprune.eval.mteb_model import MtebEncoder

    specs = tasks.resolve(f"tiny={write_beir(tmp_path / 'beir')}")
    loaded = load_tasks(specs)
    model = MtebEncoder(Encoder.load(tiny_dirs["llama"]), "tiny", "r0", show_progress=False)
    level = logging.getLogger("mteb").level
    first = run(model, specs, loaded)["tiny"]["per_query"]
    assert "task_specific_scores" not in vars(loaded[0]) and logging.getLogger("mteb").level == level
    assert run(model, specs, loaded)["tiny"]["per_query"] == first


@pytest.mark.parametrize("case,expect", [
    ("malformed", r"corpus\.jsonl: line 9: malformed JSON"),
    ("unknown_doc", r"test\.tsv: line 3: unknown corpus id 'd99'"),
    ("unknown_query", r"test\.tsv: line 2: unknown query id 'q9'"),
    ("empty", r"test\.tsv: empty split"),
])
def test_bad_beir_fails_with_file_and_line(tiny_dirs, tmp_path, capsys, case, expect):
    import re
    kw = {}
    if case == "malformed":
        kw["corpus_extra"] = '{"_id": "d8", "text": "no closing brace"\n'
    elif case == "unknown_doc":
        kw["qrels"] = [("q1", "d0", 1), ("q2", "d99", 1)]
    elif case == "unknown_query":
        kw["qrels"] = [("q9", "d0", 1)]
    else:
        kw["qrels"] = []
    folder = write_beir(tmp_path / "beir", **kw)
    out = tmp_path / "eval"
    rc = main(["eval", "--model", str(tiny_dirs["llama"]), "--task", f"bad={folder}", "--out", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert re.search(expect, err), err
    assert not out.exists()


def test_task_names_resolve(tmp_path):
    folder = write_beir(tmp_path / "beir")
    (spec,) = tasks.resolve(f"FinanceBenchRetrieval={folder}")
    assert spec.folder == folder and spec.instruction == "Given a financial question, retrieve the related context."
    with pytest.raises(DsPruneError, match="TATQARetrieval=FOLDER"):
        tasks.resolve("TATQARetrieval")
    with pytest.raises(DsPruneError, match="unknown task 'no_such_task'"):
        tasks.resolve("no_such_task")
    with pytest.raises(DsPruneError, match="BEIR folder not found"):
        tasks.resolve(f"x={tmp_path / 'missing'}")
    assert len(tasks.SUITES["beir13"]) == 13 and len(tasks.FINMTEB) == 18 and len(tasks.CHEMTEB) == 19
    # GAPrune Table 4 lists 8 retrieval + 8 classification + 2 STS = 18 (its text says 20)
    fin = tasks.resolve("FiQA2018Retrieval")[0]
    assert fin.mteb_name == "FiQA2018" and fin.folder is None and fin.instruction.startswith("Given a financial")


def test_query_prompt_from_encoder_config():
    from dsprune.encoder import EncoderConfig
    plain = EncoderConfig(query_prompt="query: ")
    assert query_prompt(plain, "T", "Find it.") == "query: "          # no template: instruction not used
    tmpl = EncoderConfig(query_prompt="Instruct: {instruction}\nQuery: ", task_prompts={"U": "u: "})
    assert query_prompt(tmpl, "T", "Find it.") == "Instruct: Find it.\nQuery: "
    assert query_prompt(tmpl, "U", "Find it.") == "u: "                 # explicit per-task prompt wins
