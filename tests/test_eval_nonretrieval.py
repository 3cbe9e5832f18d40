"""dsprune eval on Classification and STS tasks: local folders and mteb registry tasks (only the hub mocked).

Scores equal hand computations with the same Encoder and the task's instruction as query prompt; bad data
fails before the model loads, naming file and line; results.json and the report handle tasks without nDCG.
"""
import dataclasses
import json
import re

import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr

from dsprune.cli import main
from dsprune.encoder import Encoder
from dsprune.errors import DsPruneError
from dsprune.eval import evaluate, tasks
from dsprune.eval.mteb_model import MtebEncoder

from test_eval_retrieval import write_beir

TEMPLATE = "Instruct: {instruction}\nQuery: "
POS = ["revenue profit income", "profit revenue growth", "income revenue profit rose", "revenue and profit"]
NEG = ["cell membrane protein", "gene embryo cell", "protein gene expression", "embryo membrane cell"]
TRAIN = [(t, "positive") for t in POS[:3]] + [(t, "negative") for t in NEG[:3]]
TEST = [(POS[3], "positive"), (NEG[3], "negative"), (POS[0], "positive"), (NEG[1], "negative")]
PAIRS = [("revenue grew by ten percent", "revenue rose ten percent", 4.8),
         ("the company reported net income", "the firm reported income", 4.1),
         ("interest rates affect bond prices", "bond prices move with rates", 3.9),
         ("dense retrieval encodes queries", "queries are encoded for retrieval", 3.2),
         ("pruning removes redundant layers", "gene expression in the embryo", 0.4),
         ("aspirin reduces heart attack risk", "the bank cut its dividend", 0.2),
         ("cash flow turned negative", "operating cash flow fell", 3.5),
         ("the cell membrane regulates transport", "revenue grew in the fiscal year", 1.1)]


@pytest.fixture(scope="module")
def model_dir(tiny_dirs, tmp_path_factory):
    """The tiny llama with an instruction template as query prompt (long enough not to cut the text off),
    so a task instruction that did not reach the encoder changes the embeddings."""
    enc = Encoder.load(tiny_dirs["llama"])
    enc.config = dataclasses.replace(enc.config, query_prompt=TEMPLATE, max_length=512)
    path = tmp_path_factory.mktemp("instruct") / "llama"
    enc.save(path)
    return path


def with_instruction(enc: Encoder, instruction: str | None) -> Encoder:
    return Encoder(enc.model, enc.tokenizer,
                   dataclasses.replace(enc.config, query_prompt=TEMPLATE.replace("{instruction}", instruction or "")))


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def write_cls(folder, train=TRAIN, test=TEST):
    write_jsonl(folder / "train.jsonl", [{"text": t, "label": y} for t, y in train])
    write_jsonl(folder / "test.jsonl", [{"text": t, "label": y} for t, y in test])
    return folder


def write_sts(folder, pairs=PAIRS):
    write_jsonl(folder / "test.jsonl", [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in pairs])
    return folder


def hand_accuracy(enc: Encoder, train, test) -> float:
    """mteb's classification by hand: logistic regression (max_iter=100, seed 42) on train embeddings.
    With at most 8 rows per label, each of mteb's 10 draws takes every train row, so one fit stands for all."""
    from sklearn.linear_model import LogisticRegression
    names = sorted({y for _, y in train})
    x_train = enc.encode([t for t, _ in train], "query", show_progress=False).numpy()
    x_test = enc.encode([t for t, _ in test], "query", show_progress=False).numpy()
    clf = LogisticRegression(max_iter=100, random_state=42).fit(x_train, [names.index(y) for _, y in train])
    return float(np.mean(clf.predict(x_test) == np.array([names.index(y) for _, y in test])))


def hand_correlations(enc: Encoder, pairs) -> tuple[float, float]:
    """(Spearman, Pearson) of the pairs' cosine similarities with the gold scores."""
    a = enc.encode([p[0] for p in pairs], "query", show_progress=False).double().numpy()
    b = enc.encode([p[1] for p in pairs], "query", show_progress=False).double().numpy()
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    gold = [p[2] for p in pairs]
    return float(spearmanr(gold, cos)[0]), float(pearsonr(gold, cos)[0])


def test_cli_classification_folder_accuracy(model_dir, tmp_path, capsys):
    folder = write_cls(tmp_path / "finsent")
    flipped = write_cls(tmp_path / "flipped", test=[(t, "negative" if y == "positive" else "positive")
                                                    for t, y in TEST])
    out = tmp_path / "eval"
    rc = main(["eval", "--model", str(model_dir), "--task", f"FinSentClassification={folder}",
               f"control={flipped}", "--out", str(out), "--quiet"])
    assert rc == 0
    res = json.loads((out / "results.json").read_text())["tasks"]
    fin, control = res["FinSentClassification"], res["control"]
    instruction = tasks.FINMTEB["FinSentClassification"].instruction
    enc = with_instruction(Encoder.load(model_dir), instruction)
    expect = hand_accuracy(enc, TRAIN, TEST)
    assert expect == 1.0                                   # separable toy data: the pipeline must get it all
    assert fin["main_score"] == pytest.approx(expect, abs=1e-9) and fin["main_metric"] == "accuracy"
    assert fin["scores"]["accuracy"] == fin["main_score"] and fin["type"] == "Classification"
    assert fin["query_prompt"] == TEMPLATE.replace("{instruction}", instruction)
    assert "per_query" not in fin and "ndcg_at_10" not in fin
    assert control["main_score"] == pytest.approx(0.0)     # the same texts with every test label swapped
    assert control["type"] == "Classification"             # told by the folder's layout (unknown name)
    text = capsys.readouterr().out
    assert "FinSentClassification" in text and "accuracy" in text
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["figures"]["FinSentClassification"]["main_metric"] == "accuracy"


def test_sts_folder_matches_hand_spearman(model_dir, tmp_path):
    folder = write_sts(tmp_path / "finsts")
    specs = tasks.resolve(f"FinSTS={folder}")
    assert specs[0].type == "STS" and specs[0].instruction == tasks.FINMTEB["FinSTS"].instruction
    enc = Encoder.load(model_dir)
    model = MtebEncoder(enc, "llama", "rev", {s.name: s.instruction for s in specs}, show_progress=False)
    r = evaluate.run(model, specs)["FinSTS"]
    spearman, pearson = hand_correlations(with_instruction(enc, specs[0].instruction), PAIRS)
    assert r["main_metric"] == "cosine_spearman" and r["main_score"] == pytest.approx(spearman, abs=1e-6)
    # cosines of this tiny model sit close together, so float32 rounding moves Pearson by ~1e-5
    assert r["scores"]["cosine_pearson"] == pytest.approx(pearson, abs=1e-3)
    # the instruction reached the encoder: without it the cosines (and Pearson) are other ones
    assert abs(hand_correlations(with_instruction(enc, None), PAIRS)[1] - pearson) > 0.02
    assert "per_query" not in r


@pytest.mark.parametrize("case,expect", [
    ("malformed", r"train\.jsonl: line 7: malformed JSON"),
    ("no_label", r"test\.jsonl: line 2: missing field label"),
    ("no_text", r"train\.jsonl: line 1: missing field text"),
    ("empty", r"test\.jsonl: empty split"),
    ("unseen", r"test\.jsonl: line 4: label 'neutral' never occurs in .*train\.jsonl"),
    ("no_split", r"split file not found: .*test\.jsonl"),
    ("sts_score", r"test\.jsonl: line 2: missing field score"),
    ("sts_text", r"test\.jsonl: line 1: field sentence2 must be a non-empty string"),
    ("sts_empty", r"test\.jsonl: empty split"),
])
def test_bad_folder_fails_with_file_and_line(model_dir, tmp_path, capsys, case, expect):
    folder, name = tmp_path / "data", "FinSentClassification"
    if case.startswith("sts"):
        name = "FinSTS"
        rows = [{"sentence1": a, "sentence2": b, "score": s} for a, b, s in PAIRS]
        if case == "sts_score":
            del rows[1]["score"]
        elif case == "sts_text":
            rows[0]["sentence2"] = ""
        else:
            rows = []
        write_jsonl(folder / "test.jsonl", rows)
    else:
        write_cls(folder)
        if case == "malformed":
            with open(folder / "train.jsonl", "a") as f:
                f.write('{"text": "no closing brace", "label": "positive"\n')
        elif case == "no_label":
            write_jsonl(folder / "test.jsonl", [{"text": "a", "label": "positive"}, {"text": "b"}])
        elif case == "no_text":
            write_jsonl(folder / "train.jsonl", [{"label": "positive"}] + [{"text": t, "label": y} for t, y in TRAIN])
        elif case == "empty":
            (folder / "test.jsonl").write_text("\n")
        elif case == "unseen":
            write_cls(folder, test=TEST[:3] + [("rates were unchanged", "neutral")])
        else:
            (folder / "test.jsonl").unlink()
    out = tmp_path / "eval"
    assert main(["eval", "--model", str(model_dir), "--task", f"{name}={folder}", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert re.search(expect, err), err
    assert not out.exists()


def test_task_type_from_name_or_layout(tmp_path):
    cls, sts, beir = write_cls(tmp_path / "cls"), write_sts(tmp_path / "sts"), write_beir(tmp_path / "beir")
    assert [s.type for s in tasks.resolve(f"x={cls}") + tasks.resolve(f"y={sts}") + tasks.resolve(f"z={beir}")] \
        == ["Classification", "STS", "Retrieval"]
    (spec,) = tasks.resolve(f"WikipediaChemFieldsClassification={cls}")     # ChemTEB: mteb's metadata says so
    assert spec.type == "Classification" and spec.instruction == tasks.CHEMTEB["WikipediaChemFieldsClassification"]
    with pytest.raises(DsPruneError, match=r"FinSentClassification is a Classification task, but .* Retrieval"):
        tasks.resolve(f"FinSentClassification={beir}")
    with pytest.raises(DsPruneError, match="FinSTS is a STS task, but .* Classification"):
        tasks.resolve(f"FinSTS={cls}")
    (tmp_path / "odd").mkdir()
    with pytest.raises(DsPruneError, match="cannot tell the task type"):
        tasks.resolve(f"x={tmp_path / 'odd'}")
    with pytest.raises(DsPruneError, match=r"FinSentClassification=FOLDER .*train\.jsonl"):
        tasks.resolve("FinSentClassification")


# ---- registry tasks: the real mteb task classes, with only the hub download replaced -----------------

def mock_hub(monkeypatch, mteb_name: str, dataset: dict):
    """Replace one mteb task class's hub download by an in-memory DatasetDict in mteb's layout."""
    import mteb
    from datasets import Dataset, DatasetDict

    def load_data(self, num_proc=None, **kwargs):
        self.dataset = DatasetDict({split: Dataset.from_dict(cols) for split, cols in dataset.items()})
        self.data_loaded = True

    monkeypatch.setattr(type(mteb.get_task(mteb_name)), "load_data", load_data)


def test_registry_classification_and_sts(model_dir, monkeypatch):
    names = sorted({y for _, y in TRAIN})
    # FinancialPhrasebankClassification trains and evaluates on its "train" split
    mock_hub(monkeypatch, "FinancialPhrasebankClassification",
             {"train": {"text": [t for t, _ in TRAIN], "label": [names.index(y) for _, y in TRAIN]}})
    mock_hub(monkeypatch, "STSBenchmark", {"test": {"sentence1": [p[0] for p in PAIRS],
                                                    "sentence2": [p[1] for p in PAIRS],
                                                    "score": [p[2] for p in PAIRS]}})
    specs = tasks.resolve("FinancialPhraseBankClassification") + tasks.resolve("STSBenchmark")
    assert [(s.mteb_name, s.type, s.split) for s in specs] == [
        ("FinancialPhrasebankClassification", "Classification", "train"), ("STSBenchmark", "STS", "test")]
    enc = Encoder.load(model_dir)
    model = MtebEncoder(enc, "llama", "rev", {s.name: s.instruction for s in specs}, show_progress=False)
    res = evaluate.run(model, specs)
    fin, sts = res["FinancialPhraseBankClassification"], res["STSBenchmark"]
    instruction = tasks.FINMTEB["FinancialPhraseBankClassification"].instruction
    # dsprune's FinMTEB name differs from mteb's; the instruction must still reach the encoder
    assert fin["query_prompt"] == TEMPLATE.replace("{instruction}", instruction)
    assert fin["main_metric"] == "accuracy" and fin["source"] == "mteb:FinancialPhrasebankClassification"
    assert fin["main_score"] == pytest.approx(hand_accuracy(with_instruction(enc, instruction), TRAIN, TRAIN))
    assert sts["main_metric"] == "cosine_spearman"
    spearman, pearson = hand_correlations(with_instruction(enc, specs[1].instruction), PAIRS)
    assert sts["main_score"] == pytest.approx(spearman, abs=1e-6)
    assert sts["scores"]["cosine_pearson"] == pytest.approx(pearson, abs=1e-3)


# ---- report over results with classification / STS tasks -----------------------------------------------

def results_doc(path, fp, ndcg, accuracy):
    path.mkdir(parents=True)
    t = {"cls": {"type": "Classification", "main_score": accuracy, "main_metric": "accuracy"}}
    if ndcg is not None:
        t["ret"] = {"ndcg_at_10": float(np.mean(ndcg)), "main_score": float(np.mean(ndcg)),
                    "main_metric": "ndcg_at_10", "per_query": {"ndcg_at_10": {f"q{i}": v for i, v in enumerate(ndcg)}}}
    (path / "results.json").write_text(json.dumps({"model": f"/m/{fp}", "fingerprint": fp, "params": 10, "tasks": t}))
    return path


def test_report_lists_tasks_without_per_query(tmp_path):
    a = results_doc(tmp_path / "a", "fa", [0.5, 0.6, 0.7], 0.75)
    b = results_doc(tmp_path / "b", "fb", [0.4, 0.6, 0.6], 0.5)
    assert main(["report", "--results", str(a), str(b), "--out", str(tmp_path / "r"), "--samples", "100"]) == 0
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["tasks"] == ["ret"] and rep["other"] == ["cls"]
    assert [r["other"]["cls"]["score"] for r in rep["rows"]] == [0.75, 0.5]
    assert "cls (accuracy)" in (tmp_path / "r" / "report.md").read_text()
    only = [results_doc(tmp_path / f"o{i}", f"o{i}", None, acc) for i, acc in enumerate((0.9, 0.8))]
    assert main(["report", "--results", *map(str, only), "--out", str(tmp_path / "r2")]) == 0
    rep2 = json.loads((tmp_path / "r2" / "report.json").read_text())
    assert rep2["tasks"] == [] and [r["mean"] for r in rep2["rows"]] == [None, None]
