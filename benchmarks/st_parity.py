"""Does dsprune embed a sentence-transformers model exactly as sentence-transformers does?

    flock /tmp/dsprune-heavy.lock .venv/bin/python benchmarks/st_parity.py --model embeddinggemma-300m

One model is loaded twice: by dsprune (``load_encoder`` + ``MtebEncoder``, the pieces ``dsprune eval`` runs)
and by ``SentenceTransformer`` (its own ``encode`` with ``prompt_name="query"`` / ``"document"``). Both use the
same max length and are scored by the same mteb tasks (``dsprune.eval.evaluate.run`` over the shared data's
local BEIR folders), so a difference in nDCG@10 is a difference in the embeddings, and the cosine between the
two embeddings of each query (and passage) shows where it comes from. Writes a table and
``benchmarks/results/st_parity.json`` (with the command that made it).
"""
from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import numpy as np

if __name__ == "__main__" and not __package__:   # run as a file: the checkout's root makes `benchmarks` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dsprune import formats  # noqa: E402
from dsprune.commands.common import ModelArgs, load_encoder, torch_threads  # noqa: E402
from dsprune.eval import evaluate, tasks  # noqa: E402
from dsprune.eval.mteb_model import MtebEncoder  # noqa: E402
from dsprune.packaged import model_path  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TASKS = ("scifact_small", "financebench")


def _texts(inputs) -> list[str]:
    return [t for batch in inputs for t in batch["text"]]


def _side(prompt_type) -> str:
    return "document" if str(getattr(prompt_type, "value", prompt_type)) == "document" else "query"


class Captured(MtebEncoder):
    """dsprune's mteb adapter, keeping what it embedded: (task, side) -> {text: embedding}."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen: dict = {}

    def encode(self, inputs, *, task_metadata, prompt_type=None, **kwargs):
        inputs = list(inputs)
        emb = super().encode(inputs, task_metadata=task_metadata, prompt_type=prompt_type, **kwargs)
        self.seen.setdefault((task_metadata.name, _side(prompt_type)), {}).update(zip(_texts(inputs), emb))
        return emb


class StModel:
    """mteb's encoder protocol over ``SentenceTransformer.encode`` with the named prompt of each side."""

    def __init__(self, st, name: str, batch_size: int):
        from mteb.models import ModelMeta

        self.st, self.batch_size, self.seen, self.instructions = st, batch_size, {}, {}
        self.mteb_model_meta = ModelMeta.create_empty(overwrites=dict(
            name=f"sentence-transformers/{name}", revision="st", n_parameters=sum(p.numel() for p in st.parameters()),
            embed_dim=getattr(st, "get_embedding_dimension", st.get_sentence_embedding_dimension)(),
            max_tokens=st.max_seq_length,
            similarity_fn_name="cosine", framework=["PyTorch", "Sentence Transformers"], open_weights=True,
            use_instructions=False))

    def encode(self, inputs, *, task_metadata, hf_split, hf_subset, prompt_type=None, **kwargs):
        texts, side = _texts(inputs), _side(prompt_type)
        emb = self.st.encode(texts, prompt_name=side, batch_size=self.batch_size, convert_to_numpy=True,
                             show_progress_bar=False)
        self.seen.setdefault((task_metadata.name, side), {}).update(zip(texts, emb))
        return emb

    def similarity(self, a, b):
        from mteb.similarity_functions import cos_sim
        return cos_sim(a, b)

    def similarity_pairwise(self, a, b):
        from mteb.similarity_functions import pairwise_cos_sim
        return pairwise_cos_sim(a, b)


def cosines(a: dict, b: dict) -> dict:
    texts = sorted(set(a) & set(b))
    x, y = np.stack([a[t] for t in texts]).astype(np.float64), np.stack([b[t] for t in texts]).astype(np.float64)
    cos = (x * y).sum(1) / (np.linalg.norm(x, axis=1) * np.linalg.norm(y, axis=1))
    return {"n": len(texts), "mean": float(cos.mean()), "min": float(cos.min())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="embeddinggemma-300m")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "st_parity.json"))
    args = p.parse_args(argv)
    from sentence_transformers import SentenceTransformer
    import mteb
    import sentence_transformers
    import transformers

    start = time.time()
    folder = Path(model_path(args.model))
    specs = tasks.resolve(TASKS[0]) + tasks.resolve(TASKS[1], "test")
    with torch_threads(args.threads):
        loaded = evaluate.load_tasks(specs)
        enc = load_encoder(ModelArgs(model=str(folder)), max_length=args.max_length)
        ours = Captured(enc, folder.name, "dsprune", {s.name: s.instruction for s in specs},
                        batch_size=args.batch_size, show_progress=False)
        got = evaluate.run(ours, specs, loaded, batch_size=args.batch_size)
        st = SentenceTransformer(str(folder), device="cpu")
        st.max_seq_length = args.max_length
        theirs = StModel(st, folder.name, args.batch_size)
        ref = evaluate.run(theirs, specs, evaluate.load_tasks(specs), batch_size=args.batch_size)
    rows = {}
    for s in specs:
        a, b = got[s.name], ref[s.name]
        diffs = [abs(a["per_query"]["ndcg_at_10"][q] - b["per_query"]["ndcg_at_10"][q])
                 for q in a["per_query"]["ndcg_at_10"]]
        rows[s.name] = {"split": s.split, "num_queries": a.get("num_queries"),
                        "ndcg_at_10": {"dsprune": a["ndcg_at_10"], "sentence_transformers": b["ndcg_at_10"],
                                       "difference": a["ndcg_at_10"] - b["ndcg_at_10"]},
                        "queries_with_other_ndcg": sum(d > 1e-9 for d in diffs),
                        "query_prompt": a["query_prompt"],
                        "cosine_query": cosines(ours.seen[(s.name, "query")], theirs.seen[(s.name, "query")]),
                        "cosine_document": cosines(ours.seen[(s.name, "document")],
                                                   theirs.seen[(s.name, "document")])}
    doc = {"command": " ".join(shlex.quote(x) for x in [sys.executable.split("/")[-1], "benchmarks/st_parity.py",
                                                        *(sys.argv[1:] if argv is None else argv)]),
           "model": str(folder), "max_length": args.max_length, "prompts": ["query", "document"],
           "versions": {"sentence_transformers": sentence_transformers.__version__,
                        "transformers": transformers.__version__, "mteb": mteb.__version__},
           "seconds": round(time.time() - start, 1), "tasks": rows}
    formats.write_json(args.out, doc)
    print(table(doc))
    print(f"wrote {args.out}")
    return 0


def table(doc: dict) -> str:
    lines = [f"{doc['model']} at {doc['max_length']} tokens",
             f"{'task':<16} {'split':<6} {'queries':>7} {'dsprune':>8} {'ST':>8} {'diff':>8} "
             f"{'cos q mean':>10} {'cos q min':>9} {'cos d mean':>10}"]
    for name, r in doc["tasks"].items():
        n = r["ndcg_at_10"]
        lines.append(f"{name:<16} {r['split']:<6} {r['num_queries']:>7} {n['dsprune']:>8.4f} "
                     f"{n['sentence_transformers']:>8.4f} {n['difference']:>+8.4f} {r['cosine_query']['mean']:>10.6f} "
                     f"{r['cosine_query']['min']:>9.6f} {r['cosine_document']['mean']:>10.6f}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
