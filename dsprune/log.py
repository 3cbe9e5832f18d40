"""The one ``dsprune`` logger, and the CLI's say over what the libraries print while a command runs.

Status lines (what a step is doing, where its outputs went) go to stderr through ``logging.getLogger("dsprune")``;
stdout keeps the results a script may read. The library never configures logging: only ``dsprune.cli`` does, once
per run, and puts everything back when the command returns, so that a caller that imports dsprune keeps its own
settings.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Iterator

logger = logging.getLogger("dsprune")

QUIET, DEFAULT, VERBOSE = logging.WARNING, logging.INFO, logging.DEBUG
# the level a run hands to the processes it starts (recipe stages, launcher ranks, tuning trials), whose
# command lines do not carry the flag
ENV = "DSPRUNE_LOG_LEVEL"


def inherited() -> int:
    """The level the process that started this one ran at, or the default."""
    value = os.environ.get(ENV, "")
    return int(value) if value in (str(QUIET), str(DEFAULT), str(VERBOSE)) else DEFAULT


class _Format(logging.Formatter):
    """A status line as it is; a warning or error led by its level, as the CLI's own ``error:`` lines are."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return text if record.levelno < logging.WARNING else f"{record.levelname.lower()}: {text}"


def progress() -> bool:
    """Whether a long step shows a progress bar: not under ``--quiet``."""
    return logger.isEnabledFor(logging.INFO)


@contextlib.contextmanager
def configured(level: int = DEFAULT) -> Iterator[None]:
    """``level`` for the dsprune logger on stderr. Below ``--verbose``, transformers', datasets' and the hub's
    load reports and download/loading bars are silenced through their public switches (they bury the one line
    that matters); under ``--quiet`` every tqdm bar stays off too, whatever its caller asked for."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format("%(message)s"))
    saved = logger.level, logger.propagate, os.environ.get(ENV)
    os.environ[ENV] = str(level)
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False                 # no second copy through a root handler an embedding app set up
    with contextlib.ExitStack() as stack:
        stack.callback(_restore, handler, saved)
        if level > VERBOSE:
            stack.enter_context(_libraries_silenced())
        if level >= QUIET:
            stack.enter_context(_bars_off())
        yield


def _restore(handler: logging.Handler, saved: tuple) -> None:
    logger.removeHandler(handler)
    logger.setLevel(saved[0])
    logger.propagate = saved[1]
    if saved[2] is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = saved[2]


@contextlib.contextmanager
def _libraries_silenced() -> Iterator[None]:
    import datasets.utils as ds_utils
    from datasets.utils import logging as ds_logging
    from transformers.utils import logging as tf_logging

    saved = (tf_logging.get_verbosity(), tf_logging.is_progress_bar_enabled(), ds_logging.get_verbosity(),
             not ds_utils.are_progress_bars_disabled())
    tf_logging.set_verbosity_error()
    tf_logging.disable_progress_bar()        # the hub's bars too
    ds_logging.set_verbosity_error()
    ds_utils.disable_progress_bars()
    try:
        yield
    finally:
        tf_logging.set_verbosity(saved[0])
        if saved[1]:
            tf_logging.enable_progress_bar()
        ds_logging.set_verbosity(saved[2])
        if saved[3]:
            ds_utils.enable_progress_bars()


@contextlib.contextmanager
def _bars_off() -> Iterator[None]:
    """tqdm has no global switch, and dsprune's steps pass ``disable=`` of their own: override it for the run."""
    from tqdm import std

    init = std.tqdm.__init__

    def quiet_init(self, *args, **kwargs):
        kwargs["disable"] = True
        init(self, *args, **kwargs)

    std.tqdm.__init__ = quiet_init
    try:
        yield
    finally:
        std.tqdm.__init__ = init
