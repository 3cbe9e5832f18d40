"""What every benchmark script shares: the checkout's location and running one logged command."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def launch_env(**overrides: str) -> dict:
    """The environment every launched stage gets: CPU DeepSpeed, one thread per rank, no hub, this checkout."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", HF_HUB_OFFLINE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(REPO))
    env.update(overrides)
    return env


@contextmanager
def scoped_environ(env: dict) -> Iterator[None]:
    """``env`` as this process's environment while the block runs (for what launches children with
    ``os.environ``, such as ``dsprune.recipe.run_recipe``), the previous one restored after it, so a caller
    that goes on (a test, a later render) sees its own environment unchanged."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def sh(cmd: list[str], log: Path, env: dict) -> float:
    """Run a command with its output in ``log``; stop on failure. Returns seconds."""
    print("$", " ".join(cmd), flush=True)
    t0 = time.time()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n" + log.read_text()[-3000:])
    dt = time.time() - t0
    print(f"  done in {dt:.0f} s", flush=True)
    return dt


def copy_file(src: Path, dest: Path) -> None:
    """Copy a figure into benchmarks/results through a temporary name, so a reader never sees half a file."""
    from dsprune.formats import atomic_file

    with atomic_file(dest) as tmp:
        shutil.copyfile(src, tmp)


def collect_recipe(recipe: Path, params: dict, out: Path, command: list[str], rerun: str,
                   report: str = "report", only: list[str] | None = None) -> dict:
    """A finished recipe run as a results document: its ``report`` stage's report, each stage's command and
    time, the code version. ``rerun`` is the command to name when a stage has not finished; ``only``: the stages
    a partial run (``dsprune run --only``) was asked for, the others need not have run."""
    import shlex

    from dsprune import formats
    from dsprune.recipe import STAMP, load_recipe

    _, stages = load_recipe(recipe, params=params)
    done = []
    for s in stages:
        if only is not None and s.name not in only:
            continue
        stamp = out / s.name / STAMP
        if not stamp.is_file():
            raise SystemExit(f"{stamp}: stage {s.name!r} has not finished; rerun {rerun}")
        info = formats.read_json(stamp, "stage stamp")
        done.append({"name": s.name, "seconds": info.get("seconds"), "launcher": info.get("launcher"),
                     "command": info.get("command")})
    return {"params": params, "recipe": str(recipe.relative_to(REPO)), "command": shlex.join(command),
            "code_version": formats.code_version(), "stages": done,
            "report": formats.read_json(out / report / "report.json", "recipe report")}


def bench_speed(bench: dict) -> dict:
    """A bench.json's document and query speed-ups as the results files keep them: the median of the pairs, their
    min–max, the FLOP ratio and the benched shapes."""
    return {k: {"speedup": bench[k]["speedup"], "min": bench[k]["speedup_pairs"]["min"],
                "max": bench[k]["speedup_pairs"]["max"], "pairs": bench[k]["pairs"],
                "flop_ratio": bench[k]["flop_ratio"], "flop_bound": bench[k]["flop_bound"],
                "batch_size": bench[k]["batch_size"], "length": bench[k]["length"], "texts": bench[k]["texts"]}
            for k in ("document", "query")}


def machine_bench(folder: Path) -> dict:
    """A bench folder of a model in another number format (int8, bfloat16) as the results files keep it: the CPU
    it ran on (the speed-up is that CPU's kernels'), the threads, each side's number format, the layers kept
    float32, the speed-ups and the bench's warnings."""
    from dsprune import formats

    bench = formats.read_json(folder / formats.BENCH, "bench")
    if "machine" not in bench:
        raise SystemExit(f"{folder}: this bench predates the machine record; remove that folder and rerun, so the "
                         "speed-up carries the CPU it was measured on")
    st = bench["settings"]
    return {"machine": bench["machine"], "speed": bench_speed(bench), "threads": bench["threads"],
            "warnings": bench.get("warnings", []), "quantize_skip": st.get("quantize_skip") or [],
            "dtype": {"model": st.get("dtype", "float32"),
                      "baseline": st.get("baseline_dtype") or st.get("dtype", "float32")}}


def link_finished_stage(src: Path, dst: Path) -> None:
    """Hard-link a finished recipe stage's folder (``src``) into another run (``dst``) that lacks it; that run's
    recipe then reuses it only if the stage's fingerprint there is the same (the same inputs)."""
    from dsprune.recipe import STAMP

    if (src / STAMP).is_file() and not dst.exists():
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(src, dst, copy_function=os.link)


def tensorboard_scalars(folder: Path) -> dict:
    """Every scalar tag of a run's TensorBoard events (a folder, or one events file) -> its events (step, value,
    wall time), in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: events.Scalars(tag) for tag in events.Tags()["scalars"]}


def recipe_command(recipe: Path, out: Path, params: dict | None = None, sets: dict | None = None) -> list[str]:
    """``dsprune run`` of ``recipe`` with its params and stage options (``--set`` values as ``dsprune run``
    reads them back: YAML, so lists and ``null`` go as JSON), paths relative to the checkout when inside it."""
    import json

    def rel(p: Path) -> str:
        return str(p.relative_to(REPO) if p.is_relative_to(REPO) else p)

    def value(v) -> str:
        return v if isinstance(v, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)

    return ["dsprune", "run", "--recipe", rel(recipe),
            *(["--param", *[f"{k}={v}" for k, v in params.items()]] if params else []),
            *(["--set", *[f"{k}={value(v)}" for k, v in sets.items()]] if sets else []),
            "--out", rel(out)]


def recipe_parser(doc: str, params: str) -> argparse.ArgumentParser:
    """The options every recipe benchmark takes: recipe params, collect only, where the results go."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--param", nargs="*", default=[], help=f"NAME=VALUE recipe params ({params})")
    ap.add_argument("--collect", action="store_true", help="only collect the finished recipe's report")
    ap.add_argument("--results", default=str(REPO / "benchmarks" / "results"))
    return ap


def run_recipe_command(cmd: list[str], out: Path, what: str) -> None:
    """Run ``dsprune run ...`` with this venv's dsprune, its log beside the recipe's output folder."""
    out.mkdir(parents=True, exist_ok=True)
    cmd = [str(BIN / "dsprune"), *cmd[1:]]
    print(f"running the recipe ({what}log {out}.log)", flush=True)
    sh(cmd, Path(f"{out}.log"), launch_env())


def kept_scores(folder: Path) -> dict:
    """An evaluation's per-query nDCG@10 per task, as results: what pairing another run with it needs once the
    run's folder under ``out/`` is gone."""
    from dsprune.report import compare

    doc = compare.read_results(folder)
    return {"fingerprint": doc.get("fingerprint"),
            "tasks": {t: {compare.METRIC: r.get(compare.METRIC),
                          "per_query": {compare.METRIC: r["per_query"][compare.METRIC]}}
                      for t, r in doc["tasks"].items() if compare.METRIC in r.get("per_query", {})}}


def keep_results(doc: dict, out: Path, results: Path, name: str) -> Path:
    """``doc`` as ``results/NAME.json``, with the recipe report's quality-vs-speed PNG beside it."""
    from dsprune import formats

    results.mkdir(parents=True, exist_ok=True)
    png = out / "report" / "quality_vs_speed.png"
    if png.is_file():
        copy_file(png, results / f"{name}_quality_vs_speed.png")
        doc["plot"] = f"{name}_quality_vs_speed.png"
    dest = results / f"{name}.json"
    formats.write_json(dest, doc)      # written to a temporary name and renamed
    print(f"wrote {dest}")
    return dest


def slug(label: str) -> str:
    """A label or folder name as a file or folder name part: lower case, spaces and ", " as "-"."""
    return label.lower().replace(", ", "-").replace(" ", "-")


def results_name(base: str, model: str) -> str:
    """One results file per model: ``BASE`` for SmolLM2 as it ships, ``BASE_dense`` for the grid's dense retriever's
    path, else ``BASE_<model folder>``, so a run on another model keeps the others."""
    from .grid.inputs import DEFAULT_DENSE

    if model == "smollm2":
        return base
    if Path(model).resolve() == Path(DEFAULT_DENSE).resolve():
        return f"{base}_dense"
    return f"{base}_{slug(Path(model).name)}"


def content_id(path: Path) -> str:
    """What a stage read from ``path``: a model folder's weights fingerprint, else a hash of the file or of every
    file under the folder."""
    import hashlib

    from dsprune.eval.mteb_model import fingerprint

    if (path.is_dir() and any(path.glob("*.safetensors"))) or path.suffix == ".gguf":
        return fingerprint(path)
    h = hashlib.sha1()
    for f in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
        h.update(str(f.relative_to(path) if f != path else f.name).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def stage(name: str, argv: list[str], out: Path, log: list) -> Path:
    """``dsprune ARGV --out OUT/NAME``, reused when the same command finished before on the same inputs: a model
    retrained at the same path (the dense retriever's) is a new input, so the stage runs again."""
    import json

    from dsprune import formats
    from dsprune.cli import main

    dest = out / name
    command = shlex.join(["dsprune", *argv, "--out", str(dest.relative_to(REPO) if dest.is_relative_to(REPO)
                                                          else dest)])
    inputs = {a: content_id(Path(a)) for a in argv if not a.startswith("-") and Path(a).exists()}
    key = command + "\n" + json.dumps(inputs, sort_keys=True)
    stamp = out / f"{name}.command"
    if stamp.is_file() and stamp.read_text() == key and (dest / formats.MANIFEST).is_file():
        log.append({"name": name, "command": command, "inputs": inputs, "seconds": None, "reused": True})
        return dest
    print(f"$ {command}", flush=True)
    t0 = time.perf_counter()
    if main([*argv, "--out", str(dest), "--overwrite", "true"]) != 0:
        raise SystemExit(f"stage {name} failed: {command}")
    log.append({"name": name, "command": command, "inputs": inputs, "seconds": round(time.perf_counter() - t0, 1),
                "reused": False})
    stamp.write_text(key)
    return dest


def rerender() -> None:
    """RESULTS.md from the committed results; a failed render leaves it as it was (the results are kept)."""
    from dsprune.errors import DsPruneError

    from .grid import render

    try:
        render.render(render.RESULTS, render.RESULTS_MD)
        print(f"rendered {render.RESULTS_MD}")
    except DsPruneError as e:
        print(f"error: {e}", file=sys.stderr)


def write_and_render(results: Path, name: str, doc: dict, text: str, render: bool = True) -> int:
    """A benchmark's last step: ``doc`` as ``results/NAME.json`` (written to a temporary name and renamed), its
    table printed, and RESULTS.md rendered again unless ``render`` is off."""
    from dsprune import formats

    results.mkdir(parents=True, exist_ok=True)
    dest = results / f"{name}.json"
    formats.write_json(dest, doc)
    print(text)
    print(f"wrote {dest}")
    if render:
        rerender()
    return 0
