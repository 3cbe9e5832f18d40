"""The one ``dsprune`` logger, and the CLI's say over what the libraries print while a command runs.

Status lines (what a step is doing, where its outputs went) go to stderr through ``logging.getLogger("dsprune")``;
stdout keeps the results a script may read. The library never configures logging: only the entry points
(``dsprune.cli``, ``launchers/*.py``) do, once per run, and put everything back when the command returns, so that
a caller that imports dsprune keeps its own settings (library code may only quiet a third-party logger for the
span of a call).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import warnings
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


# What each library reads at import time to start silent: a command that never imports it should not pay
# seconds to import it only to silence it.
_QUIET_ENV = {"transformers": {"TRANSFORMERS_VERBOSITY": "error", "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
                               "HF_HUB_DISABLE_PROGRESS_BARS": "1"},
              "datasets": {"DATASETS_VERBOSITY": "error", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}}


@contextlib.contextmanager
def _libraries_silenced() -> Iterator[None]:
    """Hugging Face libraries at error level without progress bars: through their API once imported, through
    the variables they read at import otherwise (a library first imported here stays silent in this process;
    dsprune's commands end with it)."""
    with contextlib.ExitStack() as stack:
        for lib, env in _QUIET_ENV.items():
            if lib in sys.modules:
                stack.enter_context(_imported_silenced(lib))
            else:
                stack.enter_context(_environ(env))
        yield


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _imported_silenced(lib: str) -> Iterator[None]:
    if lib == "transformers":
        from transformers.utils import logging as lib_logging
        bars_on, disable, enable = lib_logging.is_progress_bar_enabled, lib_logging.disable_progress_bar, \
            lib_logging.enable_progress_bar
    else:
        import datasets.utils as ds_utils
        from datasets.utils import logging as lib_logging
        bars_on = lambda: not ds_utils.are_progress_bars_disabled()  # noqa: E731
        disable, enable = ds_utils.disable_progress_bars, ds_utils.enable_progress_bars
    saved = (lib_logging.get_verbosity(), bars_on())
    lib_logging.set_verbosity_error()
    disable()                                # for transformers, the hub's bars too
    try:
        yield
    finally:
        lib_logging.set_verbosity(saved[0])
        if saved[1]:
            with warnings.catch_warnings():  # refused, with a warning, if the library was imported silenced
                warnings.simplefilter("ignore")
                enable()


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
