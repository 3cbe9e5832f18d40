"""What the grid's stages read from outside it: the base model, the dense retriever and the options it was
trained with. In ``symbolic`` mode they are placeholders, so a row's config fingerprint does not depend on
where ``out`` is; otherwise they are content-addressed links, so a retrained dense model never reuses stages
made from the old one."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from dsprune.config import load_config_file
from dsprune.errors import DsPruneError
from dsprune.packaged import PACKAGED

from .._common import REPO, sh

DEFAULT_DENSE = str(REPO / "out" / "train_dense" / "run" / "model")


class Ctx:
    """The inputs stages read. ``symbolic``: placeholders (for the config fingerprint and ``--list``);
    otherwise real paths, with the dense model made on first use and outside inputs linked by content."""

    def __init__(self, a: argparse.Namespace, symbolic: bool):
        self.a, self.symbolic = a, symbolic
        self.out = Path(a.out).resolve()
        self.tasks, self.max_length, self.headline = list(a.tasks), a.max_length, a.headline_scifact
        self.inputs: dict[str, dict] = {}
        self._dense: str | None = None
        self._train: dict | None = None

    @property
    def model(self) -> str:
        if is_packaged(self.a.model):
            return self.a.model
        return "<model>" if self.symbolic else self._link(Path(self.a.model), "model")

    @property
    def dense(self) -> str:
        if self.symbolic:
            return "<dense>"
        if self._dense is None:
            ensure_dense(self.a)
            self._dense = self._link(Path(self.a.dense), "dense")
        return self._dense

    @property
    def train(self) -> dict:
        """The launcher options the dense row was trained with (its train.yaml), training data linked."""
        if self.symbolic:
            return {"config": "<train>"}
        if self._train is None:
            path = train_config_path(self.a)
            if default_dense(self.a):   # train_dense.py rewrites the groups too: link them once it has
                ensure_dense(self.a)
            if not path.is_file():
                raise DsPruneError(f"training options not found: {path} (benchmarks/train_dense.py writes it "
                                   "beside the dense run; pass --train-config FILE)")
            opts = {k: v for k, v in load_config_file(path).items()
                    if k not in ("model", "output_dir", "overwrite", "resume")}
            if not opts.get("train_data"):
                raise DsPruneError(f"{path}: no train_data")
            data = opts["train_data"] if isinstance(opts["train_data"], list) else [opts["train_data"]]
            opts["train_data"] = [self._link(Path(p), Path(p).stem) if Path(p).is_file() else p for p in data]
            self._train = {k: json.dumps(v) if isinstance(v, dict) else v for k, v in opts.items()}
        return dict(self._train)

    def _link(self, src: Path, stem: str) -> str:
        """``${out}/inputs/STEM-<content hash>``: a symlink to ``src`` whose name changes with its content."""
        if not src.exists():
            raise DsPruneError(f"{stem} not found: {src}")
        fp = content_id(src)
        name = f"{stem}-{fp[:12]}{src.suffix if src.is_file() else ''}"
        link = self.out / "inputs" / name
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink() and link.resolve() != src.resolve():
            link.unlink()
        if not link.is_symlink():
            link.symlink_to(src.resolve())
        self.inputs[stem] = {"path": str(src.resolve()), "fingerprint": fp}
        return "${out}/inputs/" + name

    def identities(self, placeholders: set[str]) -> dict:
        """What the symbolic placeholders stand for, in the config fingerprint: the producing script for
        the grid's own products, the content for a model the user passed."""
        ids = {}
        if "<model>" in placeholders:
            ids["model"] = content_id(Path(self.a.model))
        if "<dense>" in placeholders:
            ids["dense"] = "benchmarks/train_dense.py" if default_dense(self.a) else content_id(Path(self.a.dense))
        if "<train>" in placeholders:
            ids["train"] = ("benchmarks/train_dense.py" if self.a.train_config is None and default_dense(self.a)
                            else content_id(train_config_path(self.a)))
        return ids


def default_dense(a) -> bool:
    return Path(a.dense).resolve() == Path(DEFAULT_DENSE).resolve()


def is_packaged(model: str) -> bool:
    return model in PACKAGED and not Path(model).exists()


def content_id(path: Path) -> str:
    if not path.exists():
        raise DsPruneError(f"not found: {path}")
    if path.is_dir():
        from dsprune.eval.mteb_model import fingerprint
        return fingerprint(path)
    h = hashlib.sha1()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def train_config_path(a) -> Path:
    return Path(a.train_config) if a.train_config else Path(a.dense).parent.parent / "train.yaml"


def ensure_dense(a) -> None:
    """Make the dense retriever with benchmarks/train_dense.py when it is missing (resuming its training)."""
    dense = Path(a.dense)
    if (dense / "config.json").is_file():
        return
    if dense.name != "model" or dense.parent.name != "run":
        raise DsPruneError(f"dense model not found: {dense} (benchmarks/train_dense.py makes one at "
                           f"{DEFAULT_DENSE}; pass --dense FOLDER)")
    root = dense.parent.parent
    cmd = [sys.executable, str(REPO / "benchmarks" / "train_dense.py"), "--out", str(root), "--skip-eval"]
    if (root / "run" / "checkpoints" / "latest").is_file():
        cmd.append("--resume")
    print(f"dense retriever missing: training it with benchmarks/train_dense.py (~45 min) -> {dense}", flush=True)
    (root / "logs").mkdir(parents=True, exist_ok=True)
    sh(cmd, root / "logs" / "train_dense.log", dict(os.environ))
    if not (dense / "config.json").is_file():
        raise DsPruneError(f"benchmarks/train_dense.py finished but wrote no model at {dense}")
