"""Self-distillation in one process: the data mix, the teacher cache (miss, hit, corrupted and truncated
files, fingerprints), the loss terms, option checks, and a chunked distillation step equal to a plain one."""
import json
from types import SimpleNamespace

import pytest
import torch

from dsprune.config import parse_args
from dsprune.encoder import Encoder, EncoderConfig
from dsprune.errors import DsPruneError
from dsprune.tiny import tiny_encoder, tiny_tokenizer
from dsprune.train import distill as D
from dsprune.train import gradcache
from dsprune.train.loop import Hooks
from dsprune.train.slim import StageArgs, stage_hooks
from train_helpers import write_beir

LOSS = SimpleNamespace(distill_loss="cosine", distill_embed_weight=1.0, distill_kl_weight=1.0, infonce_weight=1.0,
                       temperature=0.05, teacher_temperature=1.0, cross_rank_negatives=True)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DSPRUNE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / D.CACHE


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# ---- data -----------------------------------------------------------------------------------------------------
def test_items_from_a_mix_of_sources(tmp_path):
    beir = write_beir(tmp_path / "beir", split="train")  # 8 judged pairs, 12 unjudged docs
    test_only = write_beir(tmp_path / "test_only", split="test")
    jl = _write(tmp_path / "mix.jsonl", [{"query": "q pair", "pos": ["p1", "p2"]}, {"query": "q alone"},
                                         {"title": "T", "text": "body"}, {"query": "q3", "positive": "p3", "negative": "n3"}])
    txt = tmp_path / "lines.txt"
    txt.write_text("first line\n\nsecond line\n")
    qfile = _write(tmp_path / "queries.jsonl", [{"_id": "1", "text": "just a query"}])
    items = D.load_items([str(beir), str(test_only), str(jl), str(txt), f"queries={qfile}"], split="train")
    pairs = [i for i in items if i.query and i.passage]
    assert len(pairs) == 8 + 3 and D.Item("q pair", "p2") in pairs and D.Item("q3", "p3") in pairs
    assert D.Item(None, "T body") in items and D.Item(None, "n3") in items and D.Item("q alone", None) in items
    assert D.Item("just a query", None) in items and D.Item(None, "second line") in items
    # test judgements never pair: the test-only folder gives its 8 queries and 20 docs as single texts
    assert D.Item("cell membrane transport", None) in items
    assert len(items) == len(set(items))
    assert len(D.load_items([str(beir)], max_items=5, seed=1)) == 5
    assert D.load_items([str(beir)], max_items=5, seed=1) == D.load_items([str(beir)], max_items=5, seed=1)


def test_crops_pair_each_passage_with_a_span_of_its_own_words(tmp_path):
    long = " ".join(f"w{i}" for i in range(40))
    src = _write(tmp_path / "corpus.jsonl", [{"_id": "1", "title": "T", "text": long}, {"_id": "2", "text": "two words"}])
    items = D.load_items([f"crops={src}"])
    assert [i.passage for i in items] == [f"T {long}", "two words"]
    q = items[0].query.split()
    lo, hi = D.CROP_WORDS
    assert lo <= len(q) <= hi and " ".join(q) in f"T {long}"
    assert items[1].query == "two words"              # shorter than a crop: the whole text
    # the same cut in every run and at every seed: the teacher's cached table stays valid
    assert D.load_items([f"crops={src}"], seed=7) == items
    spans = {D.crop(" ".join(f"{k}{i}" for i in range(40))) for k in "abcdefgh"}
    assert len({len(c.split()) for c in spans}) > 1   # lengths and places vary from text to text


@pytest.mark.parametrize("row, message", [
    ({"title": "no text"}, "needs a 'query'"),
    ({"query": ""}, "'query' must be a non-empty string"),
    ({"query": "q", "pos": "p"}, "'pos'/'positive' must hold non-empty strings"),
    ({"query": "q", "pos": ["p"], "neg": [""]}, "'neg'/'negative' must hold non-empty strings"),
])
def test_bad_rows_name_file_and_line(tmp_path, row, message):
    path = _write(tmp_path / "d.jsonl", [{"text": "fine"}, row])
    with pytest.raises(DsPruneError, match=message) as e:
        D.load_items([str(path)])
    assert f"{path}:2:" in str(e.value)


# ---- teacher cache --------------------------------------------------------------------------------------------
def test_cache_miss_then_hit_and_keys(tiny_dirs, cache):
    loads = []

    def load():
        loads.append(1)
        return Encoder.load(tiny_dirs["llama"])
    fp = D.fingerprint(tiny_dirs["llama"])
    texts = ["b text", "a text", "b text"]
    t1 = D.teacher_table(fp, "passage", texts, 16, "float32", load)
    assert len(loads) == 1 and t1.path.parent == cache and t1.emb.shape == (2, 64)
    ref = Encoder.load(tiny_dirs["llama"]).encode(["a text", "b text"], "passage", show_progress=False,
                                                  max_length=16)
    assert torch.allclose(t1.rows(["b text", None], 64), torch.cat([ref[1:], torch.zeros(1, 64)]), atol=1e-6)

    def must_not_load():
        raise AssertionError("cache hit expected")
    t2 = D.teacher_table(fp, "passage", ["a text", "b text"], 16, "float32", must_not_load)
    assert t2.key == t1.key and torch.equal(t2.emb, t1.emb)
    # another kind, length or text set is another file
    keys = {D.teacher_table(fp, k, ts, ml, "float32", load).key
            for k, ts, ml in [("query", texts, 16), ("passage", texts, 8), ("passage", ["c"], 16)]}
    assert len(keys | {t1.key}) == 4 and len(loads) == 4  # one teacher load per miss
    assert len(list(cache.glob("*.safetensors"))) == 4 and not list(cache.glob(".*.safetensors"))


@pytest.mark.parametrize("damage", ["truncate", "garbage", "metadata"])
def test_damaged_cache_file_is_one_error_naming_it(tiny_dirs, cache, damage):
    fp = D.fingerprint(tiny_dirs["llama"])
    t = D.teacher_table(fp, "query", ["x", "y"], None, "float32", lambda: Encoder.load(tiny_dirs["llama"]))
    data = t.path.read_bytes()
    if damage == "truncate":
        t.path.write_bytes(data[: len(data) - 40])
    elif damage == "garbage":
        t.path.write_bytes(b"\x00" * len(data))
    else:  # a well-formed file under another key's name
        other = D.teacher_table(fp, "query", ["z"], None, "float32", lambda: Encoder.load(tiny_dirs["llama"]))
        t.path.write_bytes(other.path.read_bytes())
    with pytest.raises(DsPruneError) as e:
        D.teacher_table(fp, "query", ["x", "y"], None, "float32", lambda: pytest.fail("must not recompute"))
    assert str(t.path) in str(e.value) and "delete it to recompute" in str(e.value)


def test_fingerprint_follows_weights_and_encoder_options(tmp_path):
    from dsprune.tiny import save_tiny
    a = save_tiny(tmp_path / "a", "llama")
    b = save_tiny(tmp_path / "b", "llama")
    assert D.fingerprint(a) == D.fingerprint(b)  # same files, other folder: the same teacher
    assert D.fingerprint(a, {"pooling": "last"}) != D.fingerprint(a)
    (a / "manifest.json").write_text("{}")  # a run record is not the model
    assert D.fingerprint(a) == D.fingerprint(b)
    c = save_tiny(tmp_path / "c", "llama", seed=1)
    assert D.fingerprint(c) != D.fingerprint(a)
    with pytest.raises(DsPruneError, match="teacher not found"):
        D.fingerprint(tmp_path / "nope")


# ---- loss -----------------------------------------------------------------------------------------------------
def _slots(seed=0, b=6, d=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(b, d, generator=g), dim=-1)
    p = torch.nn.functional.normalize(torch.randn(b, d, generator=g), dim=-1)
    has_q = torch.tensor([True, True, False, False, True, False])
    has_p = torch.tensor([True, True, True, True, False, True])
    return q, p, has_q, has_p


def test_student_equal_to_teacher_has_zero_distillation_loss():
    q, p, has_q, has_p = _slots()
    total, parts = D.distill_loss(q, p, q.clone(), p.clone(), has_q, has_p, LOSS, infonce=True)
    assert set(parts) == {"cosine", "kl", "infonce"}
    assert abs(parts["cosine"].item()) < 1e-6 and abs(parts["kl"].item()) < 1e-6 and parts["infonce"] > 0
    mse = SimpleNamespace(**{**vars(LOSS), "distill_loss": "mse"})
    _, parts = D.distill_loss(q, p, q + 0.1, p + 0.1, has_q, has_p, mse, infonce=False)
    assert set(parts) == {"mse", "kl"} and parts["mse"].item() == pytest.approx(0.01, rel=1e-4)


def test_kl_rows_and_columns():
    """A passage row leaves out its own column; placeholder slots get no gradient."""
    q, p, has_q, has_p = _slots(1)
    tq, tp = _slots(2)[:2]
    q.requires_grad_(), p.requires_grad_()
    kl_only = SimpleNamespace(**{**vars(LOSS), "distill_embed_weight": 0})
    _, parts = D.distill_loss(q, p, tq, tp, has_q, has_p, kl_only, infonce=False)
    parts["kl"].backward()
    assert q.grad[~has_q].abs().max() == 0 and p.grad[~has_p].abs().max() == 0
    # plain text only: each passage against the others, by hand
    n = 4
    s, t = p.detach()[:n], tp[:n]
    rows = []
    for i in range(n):
        cols = [j for j in range(n) if j != i]
        ls = torch.log_softmax(s[i] @ s[cols].T / LOSS.temperature, -1)
        lt = torch.log_softmax(t[i] @ t[cols].T / LOSS.temperature, -1)
        rows.append((lt.exp() * (lt - ls)).sum())
    none, every = torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)
    _, got = D.distill_loss(q.detach()[:n], s, tq[:n], t, none, every, kl_only, infonce=False)
    assert got["kl"].item() == pytest.approx(torch.stack(rows).mean().item(), rel=1e-5)
    _, alone = D.distill_loss(q.detach()[:1], s[:1], tq[:1], t[:1], none[:1], every[:1], kl_only, infonce=False)
    assert alone["kl"].item() == 0  # a passage alone in its batch has no neighbourhood to distil


def test_chunked_distillation_step_equals_plain_step():
    # float64: in float32 the chunks' matrix products round in another order than the whole batch's, and how far
    # apart that leaves the two steps depends on the CPU's kernels (AVX-512 blocks differently from AVX2), not
    # on the gradient cache; in float64 any difference left is the algorithm's
    student = tiny_encoder("llama", seed=1).train().double()
    teacher = tiny_encoder("llama", seed=0)
    qs = ["cell membrane", None, "aspirin heart", None, "bond prices"]
    ps = ["membranes regulate transport", "revenue grew", None, "net income", "interest rates"]
    has_q = torch.tensor([t is not None for t in qs])
    has_p = torch.tensor([t is not None for t in ps])
    inputs = [student.tokenize([t or D.PLACEHOLDER for t in qs], "query"),
              student.tokenize([t or D.PLACEHOLDER for t in ps], "passage")]
    tq = teacher.encode([t or "" for t in qs], "query", show_progress=False).double()
    tp = teacher.encode([t or "" for t in ps], "passage", show_progress=False).double()

    def loss_fn(e):
        return D.distill_loss(e[0], e[1], tq, tp, has_q, has_p, LOSS, infonce=True)
    embs = [student(x["input_ids"], x["attention_mask"]) for x in inputs]
    ref, _ = loss_fn(embs)
    ref.backward()
    ref_grads = {n: p.grad.clone() for n, p in student.named_parameters()}
    student.zero_grad(set_to_none=True)
    loss, parts = gradcache.step(student, inputs, loss_fn, 2, "cpu", seed=0)
    assert abs(loss.item() - ref.item()) < 1e-5 and set(parts) == {"cosine", "kl", "infonce"}
    worst = max((p.grad - ref_grads[n]).abs().max().item() for n, p in student.named_parameters())
    assert worst < 1e-5


# ---- options and the stage's set-up ----------------------------------------------------------------------------
def _args(tmp_path, tiny_dirs, *extra):
    data = write_beir(tmp_path / "beir", split="train")
    return parse_args(StageArgs, ["--model", str(tiny_dirs["llama"]), "--mode", "distill", "--distill_data",
                                  str(data), "--teacher", str(tiny_dirs["llama"]), "--output_dir",
                                  str(tmp_path / "out"), *extra])


@pytest.mark.parametrize("extra, message", [
    (["--teacher", ""], "needs --teacher"),
    (["--kl_weight", "0.5"], "use distill_kl_weight"),
    (["--train_data", "x.jsonl"], "reads --distill_data, not train_data"),
    (["--distill_loss", "l1"], "distill_loss must be one of cosine, mse"),
    (["--distill_embed_weight", "0", "--distill_kl_weight", "0", "--infonce_weight", "0"], "not all 0"),
    (["--mode", "train"], "distill_data is read in --mode distill only"),
])
def test_bad_distill_options(tmp_path, tiny_dirs, extra, message):
    with pytest.raises(DsPruneError, match=message):
        stage_hooks(_args(tmp_path, tiny_dirs, *extra))


def _teacher_of_dim(path, hidden):
    from transformers import AutoModel
    from dsprune import arch
    tok = tiny_tokenizer()
    model = AutoModel.from_config(arch.get("llama").tiny_config(len(tok), layers=2, hidden=hidden))
    Encoder(model, tok, EncoderConfig(max_length=32)).save(path)
    return path


def test_set_up_fills_the_manifest_and_refuses_another_dimension(tmp_path, tiny_dirs, cache):
    args = _args(tmp_path, tiny_dirs, "--teacher", str(_teacher_of_dim(tmp_path / "t32", 32)))
    hooks = stage_hooks(args)
    assert isinstance(hooks, Hooks) and hooks.stage == "distill"
    items = hooks.load_data(args)
    run = SimpleNamespace(args=args, groups=items, rank=0, device="cpu")
    hooks.after_set_up(run)
    info = hooks.manifest_extra["distill"]
    assert info["items"] == len(items) and info["pairs"] == 8 and info["dim"] == 32
    assert set(info["cache"]) == {"query", "passage"} and info["fingerprint"] == D.fingerprint(args.teacher)
    assert all(c["key"] in c["file"] for c in info["cache"].values())
    with pytest.raises(DsPruneError, match="student embeds in 64 dimensions, the teacher .* in 32"):
        hooks.prepare_model(Encoder.load(tiny_dirs["llama"]))
