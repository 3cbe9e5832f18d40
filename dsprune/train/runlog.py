"""A run's record of its steps: ``log.jsonl`` (one row per optimizer step) and TensorBoard scalars (with
``--step_breakdown``, each rank's phases as ``breakdown/rank<r>/<phase>``).

Only rank 0 writes; the other ranks hold a ``RunLog`` that writes nothing, so the phases need not ask.
A resumed run keeps the rows and scalars up to the checkpoint it resumes from and drops the later ones,
which the interrupted run wrote after its last checkpoint and this run repeats.
"""
from __future__ import annotations

import json
from pathlib import Path

from .. import formats
from ..errors import DsPruneError

LOG = "log.jsonl"
TENSORBOARD = "tensorboard"


class RunLog:
    def __init__(self, out: Path, start: int, active: bool):
        self.path = out / LOG
        self.rows: list[dict] = []
        self.writer = None
        if not active:
            return
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(out / TENSORBOARD), purge_step=start + 1 if start else None)
        self.rows = [r for r in _read(self.path) if r["step"] <= start] if start else []
        formats.write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.rows))

    def add_eval(self, scores: dict, step: int) -> None:
        """Evaluation scores as ``eval/<name>`` scalars."""
        if self.writer:
            for k, v in scores.items():
                self.writer.add_scalar(f"eval/{k}", v, step)
            self.writer.flush()

    def add_row(self, row: dict, scalars: bool) -> None:
        """One step's row in log.jsonl and, with ``scalars``, in TensorBoard (``loss/*``, ``train/*``)."""
        if not self.writer:
            return
        self.rows.append(row)
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if scalars:
            for k, v in row.items():
                if v is None or k in ("step", "epoch", "breakdown") or k.startswith("eval_"):  # eval: add_eval's
                    continue
                tag = "loss/" + k[5:] if k.startswith("loss_") else "loss/total" if k == "loss" else "train/" + k
                self.writer.add_scalar(tag, v, row["step"])
            for rank, phases in enumerate(row.get("breakdown") or []):
                for k, v in phases.items():
                    if isinstance(v, (int, float)):
                        self.writer.add_scalar(f"breakdown/rank{rank}/{k}", v, row["step"])
            self.writer.flush()

    def close(self) -> None:
        if self.writer:
            self.writer.close()


def _read(path: Path) -> list[dict]:
    """The rows written so far. A last row cut short is what a killed run leaves when it dies mid-write: it is
    dropped (the resumed run repeats that step); a malformed row before it is damage, named by line."""
    if not path.is_file():
        return []
    lines = [(n, line) for n, line in enumerate(path.read_text().splitlines(), 1) if line.strip()]
    rows = []
    for n, line in lines:
        try:
            rows.append(formats.json_object(line, f"{path}: line {n}"))
        except DsPruneError:
            if n != lines[-1][0]:
                raise
    return rows
