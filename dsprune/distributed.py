"""The process group's two ends. Its start needs a rendezvous port no concurrent run holds (sweep trials
launch side by side); its end must be torn down: leaving a gloo/shm group can abort a rank at exit
("terminate called without an active exception", exit 250) after all its work is done and written."""
from __future__ import annotations

import socket


def free_port() -> int:
    """A local port free right now, for a rendezvous (``MASTER_PORT`` / ``--master_port``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def close_process_group() -> None:
    """Wait for every rank, then destroy the default process group (a no-op when none was started)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()

