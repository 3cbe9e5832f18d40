"""Recipes: YAML pipelines of dsprune stages that resume where they stopped.

A stage is a ``dsprune`` command (``command: drop``) or a DeepSpeed launcher (``launcher: train``) with its
arguments. ``${name}`` in an argument is the output folder of an earlier stage, ``${out}`` the recipe's folder,
``${shared}`` the shared data folder. A recipe's ``params`` (e.g. ``model: smollm2``) name the values a user
changes between runs; ``${model}`` in an argument is replaced by that value, and ``dsprune run --param
model=gemma3-270m`` sets it, so one recipe serves another model without an edited copy. A stage whose folder
holds a ``stage.json`` with the same fingerprint (its arguments plus the fingerprints of the stages it reads) is
reused; anything else reruns it. Same inputs need not mean the same output (a timing, a sampled batch), so a
stamp also names its own run (``made``) and the runs of the stages it read (``read``): a stage that read an
output since remade is rerun even though its fingerprint matches. The fingerprint leaves out where the run lives
(``${out}`` and the other stages' folders enter as names and fingerprints), so a stage copied into another run's
folder is reused there.

Sweeps run one recipe many times: with ``cache`` a stage lives in ``cache/<name>-<fingerprint>`` instead of
``out/<name>``, so trials that agree on a stage's inputs share it (under a file lock), and ``execute`` lets the
caller run each stage's command itself (to watch its progress, or to stop it).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import formats
from .config import load_config_file
from .distributed import free_port, remove_shm_buffers
from .errors import DsPruneError
from .settings import REPO_ROOT, shared_dir
from .train import checkpoints

STAMP = "stage.json"
_REF = re.compile(r"\$\{([A-Za-z0-9_\-]+)\}")


def reads(args: dict) -> list[str]:
    """The names a stage's arguments refer to as ``${name}``: earlier stages, ``out``, ``shared``, ``repo``."""
    return _REF.findall(json.dumps(args))


def downstream(stages: list["Stage"], roots: set[str]) -> set[str]:
    """``roots`` and every stage that reads one of them, directly or through another: what changes when they do."""
    out = set(roots)
    for s in stages:            # in order, so a stage's readers come after it
        if out & set(reads(s.args)):
            out.add(s.name)
    return out


@dataclass
class Stage:
    name: str
    args: dict
    command: str | None = None
    launcher: str | None = None
    num_gpus: int = 1
    deepspeed_args: list = field(default_factory=list)


def load_recipe(path: str | Path | dict, overrides: dict | None = None,
                params: dict | None = None) -> tuple[dict, list[Stage]]:
    """Read and check a recipe (a YAML/JSON file, or its mapping with ``path`` naming where it came from)."""
    if isinstance(path, dict):
        doc, path = path, path.get("path", "recipe")
    else:
        doc = load_config_file(path)
    if "stages" not in doc or not isinstance(doc["stages"], list) or not doc["stages"]:
        raise DsPruneError(f"{path}: a recipe needs a non-empty 'stages' list")
    from .cli import COMMANDS   # here, not at the top: the `run` command imports this module

    params = recipe_params(doc, path, params)
    stages, names = [], set()
    for i, s in enumerate(doc["stages"], 1):
        if not isinstance(s, dict) or "name" not in s:
            raise DsPruneError(f"{path}: stage {i} needs a 'name'")
        if s["name"] in names:
            raise DsPruneError(f"{path}: stage name {s['name']!r} used twice")
        if bool(s.get("command")) == bool(s.get("launcher")):
            raise DsPruneError(f"{path}: stage {s['name']!r} needs exactly one of 'command' or 'launcher'")
        if s.get("command") and s["command"] not in COMMANDS:
            raise DsPruneError(f"{path}: stage {s['name']!r}: unknown command {s['command']!r}")
        if s.get("launcher") and not (REPO_ROOT / "launchers" / f"{s['launcher']}.py").is_file():
            raise DsPruneError(f"{path}: stage {s['name']!r}: no launcher launchers/{s['launcher']}.py")
        args = dict(s.get("args") or {})
        args.update((overrides or {}).get(s["name"], {}))
        args = _resolve(args, params, whole=True)
        known = stage_options(s.get("command"), s.get("launcher"))
        unknown = sorted(set(args) - known) if known is not None else []
        if unknown:
            raise DsPruneError(f"{path}: stage {s['name']!r}: unknown option(s) {', '.join(unknown)}")
        check_methods(s.get("command"), args, f"{path}: stage {s['name']!r}")
        for ref in reads(args):
            if ref not in names and ref not in ("out", "shared", "repo"):
                raise DsPruneError(f"{path}: stage {s['name']!r} refers to ${{{ref}}}, not an earlier stage")
        names.add(s["name"])
        stages.append(Stage(s["name"], args, s.get("command"), s.get("launcher"), int(s.get("num_gpus", 1)),
                            list(s.get("deepspeed_args", []))))
    stray = sorted(set(overrides or {}) - names)
    if stray:
        raise DsPruneError(f"{path}: --set names no stage {', '.join(stray)}; the stages: {', '.join(sorted(names))}")
    return doc, stages


def recipe_params(doc: dict, path, given: dict | None) -> dict:
    """The recipe's ``params`` with ``given`` (from ``--param``) applied; a name the recipe does not declare, or
    one that is also a stage's, is an error."""
    declared = doc.get("params") or {}
    if not isinstance(declared, dict):
        raise DsPruneError(f"{path}: 'params' must be a mapping of names to values")
    unknown = sorted(set(given or {}) - set(declared))
    if unknown:
        raise DsPruneError(f"{path}: unknown param(s) {', '.join(unknown)}; the recipe declares: "
                           f"{', '.join(declared) or 'none'}")
    clash = sorted(set(declared) & ({s.get("name") for s in doc["stages"] if isinstance(s, dict)}
                                    | {"out", "shared", "repo"}))
    if clash:
        raise DsPruneError(f"{path}: param(s) {', '.join(clash)} share a name with a stage or a built-in folder")
    return {**declared, **(given or {})}


def parse_params(items: list[str], flag: str = "--param") -> dict:
    """``NAME=VALUE`` pairs from the command line; VALUE is read as YAML (``9`` an int, ``true`` a bool)."""
    import yaml

    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise DsPruneError(f"{flag} {item!r}: expected NAME=VALUE")
        out[name] = yaml.safe_load(value)
    return out


def parse_sets(items: list[str]) -> dict:
    """``STAGE.OPTION=VALUE`` pairs: one stage's option changed for this run, the recipe file untouched."""
    out: dict[str, dict] = {}
    for name, value in parse_params(items, "--set").items():
        stage, dot, option = name.partition(".")
        if not dot or not stage or not option:
            raise DsPruneError(f"--set {name}=...: expected STAGE.OPTION=VALUE")
        out.setdefault(stage, {})[option] = value
    return out


def _train_args():
    from .train.slim import StageArgs
    return StageArgs


def _dai_args():
    from .commands.dai import Args
    return Args


# launcher -> the dataclass its options fill (a command's is its module's ``Args``); imported when asked for,
# the training arguments pull in the trainer
LAUNCHER_ARGS = {"train": _train_args, "dai": _dai_args}


def stage_options(command: str | None, launcher: str | None) -> set[str] | None:
    """The option names a stage accepts (its arguments dataclass; launchers also take ``output_dir``);
    ``None`` for a launcher dsprune does not describe."""
    import dataclasses

    from .cli import COMMANDS

    if command:
        cls = COMMANDS[command].module.Args
        extra = set()
    elif launcher in LAUNCHER_ARGS:
        cls = LAUNCHER_ARGS[launcher]()
        extra = {"output_dir"}
    else:
        return None
    return {f.name for f in dataclasses.fields(cls)} | extra


def check_methods(command: str | None, args: dict, where: str) -> None:
    """A stage option that names an importance method (a command's ``METHOD_OPTIONS``) must name a
    registered one; ``${...}`` values are checked when the stage runs."""
    from .cli import COMMANDS
    from .importance import methods

    if not command:
        return
    for option, unit in getattr(COMMANDS[command].module, "METHOD_OPTIONS", {}).items():
        value = args.get(option)
        if isinstance(value, str) and not _REF.search(value):
            methods.get(value, unit, f"{where}: {option}")


def _resolve(value, folders: dict, whole: bool = False):
    """Replace the ``${name}`` found in ``folders`` (others stay for a later pass); with ``whole``, an argument
    that is just ``${name}`` takes the value itself, so a param keeps its type."""
    if isinstance(value, str):
        m = _REF.fullmatch(value)
        if whole and m and m.group(1) in folders:
            return folders[m.group(1)]
        return _REF.sub(lambda m: str(folders[m.group(1)]) if m.group(1) in folders else m.group(0), value)
    if isinstance(value, list):
        return [_resolve(v, folders, whole) for v in value]
    if isinstance(value, dict):
        return {k: _resolve(v, folders, whole) for k, v in value.items()}
    return value


def _argv(args: dict) -> list[str]:
    argv = []
    for k, v in args.items():
        if isinstance(v, bool):
            argv += [f"--{k}", str(v).lower()]
        elif isinstance(v, list):
            argv += [f"--{k}", *map(str, v)]
        elif v is not None:
            argv += [f"--{k}", str(v)]
    return argv


def fingerprint(stage: Stage, args: dict, upstream: list[str]) -> str:
    blob = json.dumps({"command": stage.command, "launcher": stage.launcher, "num_gpus": stage.num_gpus,
                       "args": args, "upstream": upstream}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def stage_lock(folder: Path) -> Path:
    """The lock file a stage's builder holds while it checks, runs and stamps ``folder``."""
    return folder.parent / f".{folder.name}.lock"


# (command, stage folder) -> exit status; the default runs the command to its end
Execute = Callable[[list[str], Path], int]
Reused = Callable[[Path], None]


def run_recipe(path: str | Path | dict, out: str | None = None, only: list[str] | None = None,
               force: bool = False, overrides: dict | None = None, cache: str | Path | None = None,
               execute: Execute | None = None, on_reuse: Reused | None = None,
               params: dict | None = None) -> dict[str, dict]:
    """Run every stage in order, reusing finished stages whose inputs did not change (``on_reuse`` is
    told of each reused stage's folder, in order). With ``only``, a stage outside it that is not up to date
    is skipped rather than run, as ``make TARGET`` leaves other targets alone; a selected stage that reads a
    skipped one is refused, since it would read stale or missing output.

    Returns, per stage, its status (ran | reused | skipped), folder, fingerprint, arguments and seconds.
    """
    doc, stages = load_recipe(path, overrides, params)
    unknown = sorted(set(only or ()) - {s.name for s in stages})
    if unknown:
        raise DsPruneError(f"--only names no stage of the recipe: {', '.join(unknown)} "
                           f"(its stages: {', '.join(s.name for s in stages)})")
    skipped: list[str] = []
    stem = Path(path).stem if not isinstance(path, dict) else "recipe"
    root = Path(out or doc.get("out") or f"out/{stem}")
    root.mkdir(parents=True, exist_ok=True)
    folders = {"out": str(root), "shared": str(shared_dir()), "repo": str(REPO_ROOT)}
    places = {k: folders[k] for k in ("shared", "repo")}   # data, not the run's own location
    prints: dict[str, str] = {}
    legacy_prints: dict[str, str] = {}
    made: dict[str, str | None] = {}       # stage -> the id of the run whose output its folder holds
    report: dict[str, dict] = {}
    for stage in stages:
        args = _resolve(stage.args, folders)
        refs = reads(stage.args)
        fp = fingerprint(stage, _resolve(stage.args, places), sorted(prints[r] for r in refs if r in prints))
        # what stamps written before the fingerprint left the run's folders out hold; upgraded on reuse
        legacy = fingerprint(stage, args, sorted(legacy_prints[r] for r in refs if r in legacy_prints))
        prints[stage.name], legacy_prints[stage.name] = fp, legacy
        folder = Path(cache) / f"{stage.name}-{fp}" if cache else root / stage.name
        folders[stage.name] = str(folder)
        with formats.exclusive(stage_lock(folder)):   # one builder per stage
            stamp = folder / STAMP
            done = json.loads(stamp.read_text()) if not force and stamp.is_file() else {}
            read = {r: made[r] for r in dict.fromkeys(refs) if r in made}
            if done.get("fingerprint") in (fp, legacy) and read_the_same(done, read):
                if done["fingerprint"] != fp:
                    done["fingerprint"] = fp
                    formats.write_json(stamp, done)
                print(f"[{stage.name}] reused ({folder})")
                made[stage.name] = done.get("made")
                report[stage.name] = {"status": "reused", "folder": str(folder), **done}
                if on_reuse:
                    on_reuse(folder)
                continue
            if only and stage.name not in only:
                print(f"[{stage.name}] skipped: not up to date, not selected")
                skipped.append(stage.name)
                report[stage.name] = {"status": "skipped", "folder": str(folder), "fingerprint": fp}
                continue
            stale = [r for r in dict.fromkeys(refs) if r in skipped]
            if stale:
                raise DsPruneError(f"stage {stage.name!r} reads {', '.join(stale)}, which "
                                   f"{'is' if len(stale) == 1 else 'are'} not up to date and not selected "
                                   "with --only: select them too")
            print(f"[{stage.name}] running -> {folder}")
            t0 = time.perf_counter()
            _run_stage(stage, args, folder, execute or _execute, fp)
            made[stage.name] = uuid.uuid4().hex
            info = {"fingerprint": fp, "args": args, "seconds": round(time.perf_counter() - t0, 1),
                    "command": stage.command, "launcher": stage.launcher, "made": made[stage.name],
                    "read": read}
            formats.write_json(stamp, info)
            report[stage.name] = {"status": "ran", "folder": str(folder), **info}
    return report


def read_the_same(done: dict, read: dict) -> bool:
    """Whether a finished stage read the outputs its upstream folders hold now. A stamp from before runs were
    named records none: it stands while its upstream stamps name none either (nothing was remade since)."""
    if "read" not in done:
        return all(v is None for v in read.values())
    return all(done["read"].get(r) == v for r, v in read.items())


def _execute(cmd: list[str], folder: Path) -> int:
    return subprocess.run(cmd, env=dict(os.environ)).returncode


def _run_stage(stage: Stage, args: dict, folder: Path, execute: Execute, fp: str) -> None:
    args = dict(args)
    if stage.command:
        args.setdefault("out", str(folder))
        args.setdefault("overwrite", True)
        cmd = [sys.executable, "-m", "dsprune.cli", stage.command, *_argv(args)]
    else:
        args.setdefault("output_dir", str(folder))
        # the run folder is the trainer's to replace, so the fingerprint of the run it holds lives beside it
        started = folder.parent / f".{folder.name}.started"
        same_run = started.is_file() and started.read_text().strip() == fp
        if stage.launcher == "train" and same_run and checkpoints.resumable(folder / "checkpoints"):
            args.pop("overwrite", None)  # an interrupted run of this very stage: continue it
            args["resume"] = True
        elif stage.launcher == "train" and folder.exists() and not args.get("resume"):
            args["overwrite"] = True  # a stale folder: unfinished, or finished with other inputs
        started.parent.mkdir(parents=True, exist_ok=True)
        formats.write_text(started, fp)
        port = [] if "--master_port" in stage.deepspeed_args else ["--master_port", str(free_port())]
        cmd = ["deepspeed", "--num_gpus", str(stage.num_gpus), *port, *stage.deepspeed_args,
               str(REPO_ROOT / "launchers" / f"{stage.launcher}.py"), *_argv(args)]
        bindir = Path(sys.executable).parent
        if (bindir / "deepspeed").exists():
            cmd[0] = str(bindir / "deepspeed")
    print("  $ " + " ".join(shlex.quote(c) for c in cmd), flush=True)
    try:
        code = execute(cmd, folder)
    finally:
        if "--master_port" in cmd:  # the launch is over, finished or killed: its shm buffers are garbage
            remove_shm_buffers(cmd[cmd.index("--master_port") + 1])
    if code != 0:
        raise DsPruneError(f"stage {stage.name!r} failed (exit {code}); finished stages are kept, "
                           "rerun the recipe to resume")
