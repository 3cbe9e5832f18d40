"""`dsprune mine`: hard negatives from a BEIR train split, in the training group format."""
import json


from dsprune.cli import main
from dsprune.train.data import load_groups
from train_helpers import write_beir


def test_mine_writes_loadable_groups(tmp_path, tiny_dirs, capsys):
    folder = write_beir(tmp_path / "b", split="train")
    out = tmp_path / "mined"
    rc = main(["mine", "--model", str(tiny_dirs["llama"]), "--data", str(folder), "--out", str(out),
               "--n_negatives", "4", "--rank_start", "0", "--rank_end", "10", "--with_scores"])
    assert rc == 0
    rows = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(rows) == 8
    qrels = {f"q{i}": f"d{i}" for i in range(8)}
    for r in rows:
        assert r["pos_ids"] == [qrels[r["qid"]]] and len(r["neg_ids"]) == 4
        assert qrels[r["qid"]] not in r["neg_ids"]
        assert len(r["pos_scores"]) == 1 and len(r["neg_scores"]) == 4
    groups = load_groups([str(out / "groups.jsonl")], need_scores=True)
    assert len(groups) == 8
    man = json.loads((out / "manifest.json").read_text())
    assert man["stage"] == "mine" and man["figures"]["queries"] == 8
    # the negatives are the miner's top-ranked non-relevant documents, not random ones
    from dsprune.encoder import Encoder
    enc = Encoder.load(tiny_dirs["llama"])
    r = rows[0]
    corpus = {json.loads(line)["_id"]: json.loads(line)["text"] for line in
              (folder / "corpus.jsonl").read_text().splitlines()}
    ids = sorted(corpus)
    sims = (enc.encode([r["query"]], "query", show_progress=False)
            @ enc.encode([corpus[i] for i in ids], show_progress=False).T)[0]
    ranked = [ids[j] for j in sims.argsort(descending=True).tolist() if ids[j] != r["pos_ids"][0]]
    assert set(r["neg_ids"]) <= set(ranked[:10])
    assert main(["mine", "--model", str(tiny_dirs["llama"]), "--data", str(folder), "--out", str(out)]) == 2
    assert "output folder exists" in capsys.readouterr().err


def test_mine_needs_the_split(tmp_path, tiny_dirs, capsys):
    folder = write_beir(tmp_path / "b", split="test")
    assert main(["mine", "--model", str(tiny_dirs["llama"]), "--data", str(folder),
                 "--out", str(tmp_path / "o")]) == 2
    assert "qrels not found" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
