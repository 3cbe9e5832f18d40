"""The process group's two ends. Its start needs a rendezvous port no concurrent run holds (sweep trials
launch side by side), and a plain ``python`` launch needs the rendezvous variables a launcher would set.
Its end must be torn down: leaving a gloo/shm group can abort a rank at exit ("terminate called without an
active exception") after all its work is done and written, and DeepSpeed's shared-memory allreduce (ranks on
one host) never unlinks its per-rank buffer in /dev/shm, which is RAM and outlives the process, so every launch
would leave memory behind. Destroying the group is not always enough: a thread torch left in C++ can
still wake during interpreter finalization and abort the rank, so a launcher's rank leaves through
``exit_rank`` instead.

Across nodes, every rank writes its own checkpoint shards into the run folder and reads the others' back on
resume, so that folder must be storage every node shares; ``check_shared_folder`` proves it at start-up rather
than letting a run on node-local disks train and leave checkpoints no node can load."""
from __future__ import annotations

import faulthandler
import logging
import os
import secrets
import socket
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, NoReturn

SHM = Path("/dev/shm")


EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")


def free_port() -> int:
    """A local port free right now, for a rendezvous (``MASTER_PORT`` / ``--master_port``), drawn below the
    kernel's ephemeral range: a port from that range (what binding port 0 gives) can go to another process's
    outgoing connection, and a running gloo group opens many, between this check and the rendezvous's bind; the
    launcher's store then talks to a stranger ("Ping failed, invalid value returned from server")."""
    try:
        low = int(EPHEMERAL.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768     # Linux's default range starts here
    start = max(1024, low - 12000)
    for port in [start + secrets.randbelow(low - start) for _ in range(64)] if low > start else []:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:     # nothing free below the range (or no room): any port the kernel gives
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def one_rank_env() -> Iterator[None]:
    """The rendezvous variables of a one-rank group, for a launcher started as plain ``python`` (DeepSpeed's
    launcher and torchrun set them): set only where ``RANK`` is missing, and removed again on leaving.
    ``close_process_group`` belongs inside: it names the shm buffer from ``MASTER_ADDR`` and ``MASTER_PORT``."""
    if "RANK" in os.environ:
        yield
        return
    added = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


def check_shared_folder(folder: Path, rank: int) -> None:
    """Every rank reads back the file rank 0 has just written into ``folder`` (made by rank 0), or every rank
    raises one error naming the hosts that cannot: their shards would land on a disk rank 0 never reads."""
    import torch.distributed as dist

    from .errors import DsPruneError

    token = [secrets.token_hex(8) if rank == 0 else None]
    dist.broadcast_object_list(token, src=0)
    probe = folder / f".shared-{token[0]}"
    if rank == 0:
        probe.write_text(token[0])
    dist.barrier()
    try:
        seen = probe.read_text() == token[0]
    except OSError:
        seen = False
    views: list = [None] * dist.get_world_size()
    dist.all_gather_object(views, (socket.gethostname(), seen))
    if rank == 0:
        probe.unlink()
    blind = [f"{host} (rank {r})" for r, (host, ok) in enumerate(views) if not ok]
    if blind:
        if rank == 0 and not any(folder.iterdir()):
            folder.rmdir()  # made for this run only: leave nothing behind
        raise DsPruneError(f"{folder}: not shared by every node: {', '.join(blind)} cannot read what rank 0 "
                           "writes there; put the output on storage every node mounts (checkpoints hold every "
                           "rank's shards)")


# a lock this old is no build in progress (DeepSpeed's CPU ops compile in about a minute)
STALE_LOCK_S = 900


def stale_build_locks(root: Path | None = None) -> list[Path]:
    """Lock files in torch's extension cache that no build has touched for ``STALE_LOCK_S``. A launch killed
    while DeepSpeed compiles its CPU op leaves one behind, and every later launch then waits on it forever
    without a word, so a rank names it before the process group starts the build."""
    import time

    from torch.utils.cpp_extension import get_default_build_root

    root = Path(root or os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())
    now = time.time()
    # torch builds in <TORCH_EXTENSIONS_DIR>/<op>, or in <default root>/<python>_<accelerator>/<op>
    locks = [*root.glob("*/lock"), *root.glob("*/*/lock")]
    return sorted(p for p in locks if now - p.stat().st_mtime > STALE_LOCK_S)


def warn_stale_build_locks() -> None:
    for lock in stale_build_locks():
        logging.getLogger("dsprune").warning(
            f"{lock} is {STALE_LOCK_S // 60}+ minutes old: left by a launch killed while it compiled? DeepSpeed "
            "waits on it without end; delete it if no compiler is running")


def close_process_group() -> None:
    """Wait for every rank, then destroy the default process group (a no-op when none was started)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        rank = dist.get_rank()
        dist.barrier()  # every rank has mapped every buffer long ago: unlinking names frees nothing in use
        dist.destroy_process_group()
        shm_buffer(rank).unlink(missing_ok=True)


def exit_rank(code: int) -> NoReturn:
    """End a launcher's rank with ``code`` and no interpreter finalization, once its work is written and
    ``close_process_group`` has run: outputs are complete and renamed into place by then, so finalization
    only adds the chance of the abort above (which turns a finished run into a failed launch)."""
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    logging.shutdown()
    os._exit(code)


def report_aborts() -> None:
    """Print every thread's Python stack if the rank aborts (SIGABRT, SIGSEGV), so a crash names its place."""
    if not faulthandler.is_enabled():
        faulthandler.enable(all_threads=True)


def shm_buffer(rank: int) -> Path:
    """This rank's buffer, named as DeepSpeed's CPU shm allreduce names it (ops/csrc/cpu/comm/shm.cpp)."""
    return SHM / _shm_name(os.environ.get("MASTER_ADDR", ""), os.environ.get("MASTER_PORT", ""), rank)


def shm_buffers(port: int | str) -> list[Path]:
    """Every rank's buffer of the launch whose rendezvous was on ``port``."""
    return sorted(SHM.glob(_shm_name("*", port, "*")))


def remove_shm_buffers(port: int | str) -> list[str]:
    """Unlink the shm buffers of every rank of a finished or killed launch on ``port`` (a killed rank never
    reaches ``close_process_group``). Only for launches whose processes are all gone."""
    gone = shm_buffers(port)
    for path in gone:
        path.unlink(missing_ok=True)
    return [p.name for p in gone]


def _shm_name(addr: str, port: int | str, rank: int | str) -> str:
    return f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_{rank}"
