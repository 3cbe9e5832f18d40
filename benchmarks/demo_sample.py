"""Cut the small BEIR sample that ships inside the package for ``dsprune demo`` from the shared data.

The demo must run where no shared folder exists, so its evaluation and calibration text travel with the code.
The cut is deterministic (one seeded ``random.Random``, inputs read in file order, lines copied unchanged), and
PROVENANCE.md records the sha256 of every source file, so anyone holding the shared data can rebuild the
sample byte for byte:

    python benchmarks/demo_sample.py                  # rewrite dsprune/demo_data from $DSPRUNE_SHARED/data
    python benchmarks/demo_sample.py --check          # rebuild into a temporary folder and compare
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
import tempfile
from pathlib import Path

from dsprune import formats
from dsprune.data import read_qrels
from dsprune.settings import data_dir

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "dsprune" / "demo_data"
FILES = ("corpus.jsonl", "queries.jsonl", "qrels/test.tsv", "calibration.jsonl", "PROVENANCE.md")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _lines(path: Path) -> dict[str, str]:
    """id -> the file's own line (kept byte for byte), in file order."""
    out = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                out[str(formats.json_object(line, f"{path}: line {n}")["_id"])] = line.rstrip("\n")
    return out


def cut(shared_data: Path, out: Path, queries: int, distractors: int, calib: int, seed: int) -> dict:
    """Write the sample into ``out``; returns its counts."""
    scifact, msmarco = shared_data / "scifact", shared_data / "msmarco_trecdl_subset"
    sources = [scifact / "corpus.jsonl", scifact / "queries.jsonl", scifact / "qrels" / "test.tsv",
               msmarco / "corpus.jsonl"]
    corpus, all_queries = _lines(sources[0]), _lines(sources[1])
    qrels = read_qrels(sources[2], corpus, all_queries)
    rng = random.Random(seed)
    picked = set(rng.sample(sorted(qrels), queries))
    judged = {d for q in picked for d in qrels[q]}
    others = sorted(set(corpus) - judged)
    kept = judged | set(rng.sample(others, distractors))
    # Calibration text never overlaps the evaluation corpus: half MS MARCO passages (general web text), half
    # SciFact abstracts (science), as the default calibration of `dsprune score` mixes them.
    half = calib // 2
    marco = _lines(sources[3])
    calib_marco = set(rng.sample(sorted(marco), half))
    calib_sci = set(rng.sample(sorted(set(corpus) - kept), calib - half))

    with formats.output_dir(out, overwrite=True) as tmp:
        (tmp / "qrels").mkdir()
        (tmp / "corpus.jsonl").write_text("".join(corpus[d] + "\n" for d in corpus if d in kept))
        (tmp / "queries.jsonl").write_text("".join(all_queries[q] + "\n" for q in all_queries if q in picked))
        rows = [f"{q}\t{d}\t{g}\n" for q in all_queries if q in picked for d, g in qrels[q].items()]
        (tmp / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(rows))
        calib_rows = [json.dumps({"_id": f"msmarco_trecdl_subset/{i}", **_text(marco[i])}, ensure_ascii=False)
                      for i in marco if i in calib_marco]
        calib_rows += [json.dumps({"_id": f"scifact/{i}", **_text(corpus[i])}, ensure_ascii=False)
                       for i in corpus if i in calib_sci]
        (tmp / "calibration.jsonl").write_text("".join(r + "\n" for r in calib_rows))
        counts = {"queries": len(picked), "judgements": len(rows), "documents": len(kept),
                  "judged_documents": len(judged), "calibration": len(calib_rows)}
        (tmp / "PROVENANCE.md").write_text(_provenance(sources, shared_data, counts, queries, distractors,
                                                       calib, seed))
    return counts


def _text(line: str) -> dict:
    row = json.loads(line)
    return {"title": row.get("title", ""), "text": row["text"]}


def _provenance(sources: list[Path], shared_data: Path, counts: dict, queries: int, distractors: int,
                calib: int, seed: int) -> str:
    hashes = "\n".join(f"- `{p.relative_to(shared_data)}`: sha256 `{_sha256(p)}`" for p in sources)
    return f"""# The demo's embedded sample

A small BEIR folder (`corpus.jsonl`, `queries.jsonl`, `qrels/test.tsv`) and `calibration.jsonl`, so that
`dsprune demo` runs with no shared data folder. Scores on it are not comparable with published SciFact
figures: it is a {counts['documents']}-document corpus for a quick before/after comparison.

## Source files (the shared data, `data/` of the shared folder)
{hashes}

## How it was cut
`python benchmarks/demo_sample.py --queries {queries} --distractors {distractors} --calib {calib} --seed {seed}`
(one `random.Random({seed})`, ids sorted before each draw, lines copied unchanged in their source order):
- queries: {counts['queries']} of SciFact's 300 test queries (`qrels/test.tsv`), drawn at random; their
  {counts['judgements']} judgements unchanged.
- corpus: the {counts['judged_documents']} documents those judgements name plus {distractors} other SciFact
  documents drawn at random: {counts['documents']} documents.
- calibration.jsonl: {calib // 2} MS MARCO passages (`msmarco_trecdl_subset/corpus.jsonl`) and {calib - calib // 2}
  SciFact abstracts outside the sample's corpus, drawn at random; `_id` names the source file's folder and id.

`python benchmarks/demo_sample.py --check` rebuilds the sample from the shared data and compares it byte for byte.

## Licences
- SciFact (corpus, queries, judgements; allenai): CC BY-NC 2.0.
- MS MARCO passages: MS MARCO terms, non-commercial research use.

Research use only, as the shared data's own PROVENANCE.md states for both sources.
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared_data", type=Path, default=None, help="default: $DSPRUNE_SHARED/data")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--queries", type=int, default=64)
    p.add_argument("--distractors", type=int, default=96)
    p.add_argument("--calib", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--check", action="store_true", help="rebuild into a temporary folder and compare with --out")
    a = p.parse_args(argv)
    shared = a.shared_data or data_dir()
    if not a.check:
        counts = cut(shared, a.out, a.queries, a.distractors, a.calib, a.seed)
        size = sum((a.out / f).stat().st_size for f in FILES)
        print(f"{a.out}: {counts}, {size / 1e3:.0f} kB")
        return 0
    with tempfile.TemporaryDirectory() as d:
        fresh = Path(d) / "sample"
        cut(shared, fresh, a.queries, a.distractors, a.calib, a.seed)
        differ = [f for f in FILES if not (a.out / f).is_file() or (fresh / f).read_bytes() != (a.out / f).read_bytes()]
    if differ:
        print(f"{a.out} differs from a fresh cut: {', '.join(differ)}", file=sys.stderr)
        return 1
    print(f"{a.out} equals a fresh cut of {shared}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
