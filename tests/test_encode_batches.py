"""``Encoder.encode`` batches texts by token count and runs its forward under ``torch.inference_mode``, yet
returns an ordinary tensor in the caller's order."""
import pytest
import torch

from dsprune.eval.speed import padding_fraction
from dsprune.tiny import tiny_encoder

# Character length and token count disagree: digits and symbols take a token per character or two, words the
# tokenizer was trained on take one token for several characters.
TEXTS = ["7 3 9 1 % 4 $ 8 @ 2", "the cell membrane regulates transport of ions", "x", "5 ~ 6 # 0 &",
         "dense retrieval encodes queries and passages into vectors", "gene expression", "1 ^ 2 * 3 !", "bond"]


@pytest.fixture(scope="module")
def enc():
    return tiny_encoder("llama")


def _seen(enc, monkeypatch):
    """The batches (and whether inference mode was on) each forward of ``enc`` receives."""
    seen = []
    forward = type(enc).forward

    def spy(self, input_ids, attention_mask):
        seen.append({"attention_mask": attention_mask.clone(), "inference": torch.is_inference_mode_enabled()})
        return forward(self, input_ids, attention_mask)

    monkeypatch.setattr(type(enc), "forward", spy)
    return seen


def test_encode_batches_by_token_count(enc, monkeypatch):
    lengths = [len(x) for x in enc.token_ids(TEXTS)]
    by_chars = sorted(range(len(TEXTS)), key=lambda i: -len(TEXTS[i]))
    assert sorted(lengths, reverse=True) != [lengths[i] for i in by_chars]      # the texts tell the sorts apart
    char_batches = [enc.tokenize([TEXTS[i] for i in by_chars[s:s + 2]]) for s in range(0, len(TEXTS), 2)]
    seen = _seen(enc, monkeypatch)
    enc.encode(TEXTS, batch_size=2, show_progress=False)
    got = [b["attention_mask"].sum(1).tolist() for b in seen]
    assert got == [sorted(lengths, reverse=True)[s:s + 2] for s in range(0, len(TEXTS), 2)]
    assert padding_fraction(seen) < padding_fraction(char_batches)


def test_encode_runs_under_inference_mode_and_returns_a_plain_tensor(enc, monkeypatch):
    seen = _seen(enc, monkeypatch)
    out = enc.encode(TEXTS, batch_size=3, show_progress=False)
    assert seen and all(b["inference"] for b in seen)
    # usable as a training target (a distillation teacher's embeddings): not an inference tensor
    assert not out.is_inference()
    w = torch.ones(out.shape[1], requires_grad=True)
    (out * w).sum().backward()
    assert w.grad is not None
    # and in the order given, whatever order the batches ran in
    one_by_one = torch.cat([enc.encode([t], show_progress=False) for t in TEXTS])
    assert torch.allclose(out, one_by_one, atol=1e-5)
