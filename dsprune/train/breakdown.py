"""Where a rank's step time goes (``--step_breakdown``): each phase of the step timed on every rank, and the
collectives DeepSpeed ran in it, from DeepSpeed's comms logger.

Why: a throughput figure cannot say whether ranks lose time to compute, to communication or to waiting for each
other. DeepSpeed's own ``wall_clock_breakdown`` timers cannot be used here: the trainer embeds queries and
passages in two engine calls, each registers DeepSpeed's backward prologue, and the second start of its
backward timer fails. So the trainer times its own phases; each reading waits for the device through the
accelerator, so queued kernels count in the phase that queued them. A collective's time includes waiting for
the slowest rank to arrive: the rank that arrives last shows the transfer itself, the others transfer plus wait.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator


def start() -> None:
    """Log every DeepSpeed collective from now on (after ``deepspeed.initialize``, which sets the logger from
    the config)."""
    import deepspeed.comm as dsc

    dsc.configure(enabled=True, prof_all=True, verbose=False)
    comm_ops()     # the set-up's collectives belong to no step


class Clock:
    """Seconds per phase of one optimizer step on this rank (summed over its micro-batches); off, it only runs
    the phases."""

    def __init__(self, on: bool):
        self.on = on
        self.seconds: dict[str, float] = {}
        if on:
            from deepspeed.accelerator import get_accelerator
            self._sync = get_accelerator().synchronize

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if not self.on:
            yield
            return
        self._sync()
        t0 = time.perf_counter()
        yield
        self._sync()
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0

    def read(self) -> dict:
        """The phases' seconds, and the step's DeepSpeed collectives (their total seconds and bytes, and per op)."""
        ops = comm_ops()
        return {**{k: round(v, 4) for k, v in self.seconds.items()},
                "comm": round(sum(o["seconds"] for o in ops.values()), 4),
                "comm_bytes": sum(o["bytes"] for o in ops.values()), "comm_ops": ops}


def comm_ops() -> dict[str, dict]:
    """The collectives DeepSpeed ran since the last call: per op, calls, bytes (the message sizes the logger
    records) and seconds; then forgotten, so the next call covers the next step."""
    import deepspeed.comm as dsc

    ops: dict[str, dict] = {}
    for name, sizes in dsc.comms_logger.comms_dict.items():
        calls = sum(v[0] for v in sizes.values())
        nbytes = sum(size * v[0] for size, v in sizes.items())
        # the logger's own latencies are running totals per op name: the op's timer, reset here, is the step's
        seconds = dsc.timers(name).elapsed(reset=True) / 1000
        ops[name] = {"calls": calls, "bytes": int(nbytes), "seconds": round(seconds, 4)}
    dsc.reset_log()
    return ops
