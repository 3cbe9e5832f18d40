"""GAPrune inputs: triplet files (bad ones fail cleanly), BEIR-built triplets, k-means representative sampling."""
import json

import pytest
import torch

from dsprune.cli import main
from dsprune.errors import DsPruneError
from dsprune.importance.sampling import representative_indices
from dsprune.importance.triplets import load_triplets, read_triplets_jsonl
from train_helpers import shared_data


def _write(path, lines):
    path.write_text("".join((l if isinstance(l, str) else json.dumps(l)) + "\n" for l in lines))
    return path


def test_triplet_formats(tmp_path):
    p = _write(tmp_path / "t.jsonl", [{"query": "q1", "positive": "p1", "negative": "n1"}, "",
                                     {"query": "q2", "pos": ["a", "b", "c"], "neg": ["x", "y"]}])
    t = read_triplets_jsonl(p)
    assert [(x.query, x.positive, x.negative) for x in t] == [
        ("q1", "p1", "n1"), ("q2", "a", "x"), ("q2", "b", "y"), ("q2", "c", "x")]


@pytest.mark.parametrize("lines,msg", [
    ([], "empty"),
    ([{"query": "q", "positive": "p"}], "line 1: missing field.*negative"),
    ([{"query": "q", "positive": "p", "negative": "n"}, {"positive": "p", "negative": "n"}], "line 2: missing field query"),
    ([{"query": "q", "positive": "", "negative": "n"}], "line 1: field 'positive'"),
    ([{"query": "q", "pos": [], "neg": ["n"]}], "line 1: field 'pos'"),
    ([{"query": "q", "text": "x"}], "line 1: expected fields"),
    (["{not json"], "line 1: malformed JSON"),
])
def test_bad_triplet_files_fail_cleanly(tmp_path, lines, msg):
    p = _write(tmp_path / "bad.jsonl", lines) if lines else (tmp_path / "bad.jsonl")
    if not lines:
        p.write_text("")
    with pytest.raises(DsPruneError, match=msg):
        load_triplets([str(p)])


def test_dai_command_refuses_bad_inputs_before_loading_a_model(tmp_path):
    good = _write(tmp_path / "g.jsonl", [{"query": "q", "positive": "p", "negative": "n"}])
    empty = tmp_path / "e.jsonl"
    empty.write_text("\n")
    mismatched = _write(tmp_path / "m.jsonl", [{"query": "q", "positive": "p"}])
    for dom in (empty, mismatched, tmp_path / "missing.jsonl"):
        out = tmp_path / "out"
        # the model path does not exist: the data error must come first
        assert main(["dai", "--model", str(tmp_path / "no-model"), "--general", str(good), "--domain", str(dom),
                     "--out", str(out)]) == 2
        assert not out.exists()


def test_financebench_train_triplets():
    folder = shared_data("financebench")
    t1 = load_triplets([f"{folder}:train"], seed=0)
    t2 = load_triplets([f"{folder}:train"], seed=0)
    t3 = load_triplets([f"{folder}:train"], seed=1)
    assert t1 == t2 and t1 != t3
    from dsprune.data import load_beir
    sp = load_beir(folder, "train")
    assert len({t.query for t in t1}) == len(sp.qrels) == 75
    rel = {(sp.queries[q], sp.corpus[d]) for q, ds in sp.qrels.items() for d in ds}
    assert all((t.query, t.positive) in rel for t in t1)
    assert not any((t.query, t.negative) in rel for t in t1)
    test_queries = set(load_beir(folder, "test").queries.values())
    assert not ({t.query for t in t1} & test_queries)  # train only: no leak into evaluation


def test_kmeans_picks_one_real_item_per_cluster():
    g = torch.Generator().manual_seed(0)
    centers = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]])
    x = torch.cat([c + 0.1 * torch.randn(20, 2, generator=g) for c in centers])
    idx = representative_indices(x, k=3, seed=0, show_progress=False)
    assert sorted(i // 20 for i in idx) == [0, 1, 2]
    assert idx == representative_indices(x, k=3, seed=0, show_progress=False)  # seeded
    # each pick is the real item nearest its cluster's mean
    for i in idx:
        c = i // 20
        mean = x[c * 20:(c + 1) * 20].mean(0)
        assert i == c * 20 + int(((x[c * 20:(c + 1) * 20] - mean) ** 2).sum(1).argmin())
    assert representative_indices(x, k=500, show_progress=False) == list(range(60))  # k capped at n
    # duplicates collapse: two identical points, k = 2 centroids may share the nearest item
    dup = torch.zeros(4, 2)
    assert representative_indices(dup, k=2, show_progress=False) == [0]  # both centroids -> item 0, kept once


def test_sample_command(tmp_path, tiny_dirs):
    rows = [{"query": f"question {i} about {w}", "positive": f"p{i}", "negative": f"n{i}"}
            for i, w in enumerate(["revenue", "cells", "bonds", "genes", "aspirin", "income", "vectors", "rates"])]
    src = _write(tmp_path / "in.jsonl", rows)
    out = tmp_path / "s"
    assert main(["sample", "--model", str(tiny_dirs["llama"]), "--input", str(src), "--k", "3",
                 "--out", str(out)]) == 0
    got = read_triplets_jsonl(out / "triplets.jsonl")
    assert 1 <= len(got) <= 3
    assert all({"query": t.query, "positive": t.positive, "negative": t.negative} in rows for t in got)
    from dsprune import formats
    assert formats.read_manifest(out)["figures"]["triplets_in"] == 8
