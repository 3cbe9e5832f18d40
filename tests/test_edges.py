"""The edges a new user finds. Bad input gets one `error:` line naming it, exit 2 and nothing written, before
any model loads where the input alone can tell; an output is claimed while it is written, replaced only when
dsprune wrote it, and leaves no temporary behind a signal; eval says its max length and cost before encoding;
shm buffers of killed launches are removed, and only those."""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dsprune import formats
from dsprune.cli import main
from dsprune.commands.demo import SAMPLE
from dsprune.config import parse_args
from dsprune.eval.speed import shape_of
from dsprune.importance.plan import SpeedRequest, plan_speedup
from dsprune.tiny import tiny_encoder
from dsprune.train.slim import StageArgs

REPO = Path(__file__).resolve().parents[1]


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


def refused(capsys, argv: list[str], *named: str) -> str:
    """The command exits 2 with one `error:` line (its last), which names ``named``; no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and err.rstrip().endswith(errors[0]) and "Traceback" not in err, err
    assert all(n in errors[0] for n in named), errors[0]
    return errors[0]


@pytest.fixture
def llama(tiny_dirs):
    return str(tiny_dirs["llama"])


def write_gguf(path: Path) -> Path:
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tensor("w", np.zeros((64, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("damage", ["random", "cut_header", "cut_tensors"])
def test_a_damaged_gguf_is_refused_before_any_loader_or_lock(tmp_path, capsys, monkeypatch, damage):
    monkeypatch.setenv("DSPRUNE_CACHE", str(tmp_path / "cache"))
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    bad = tmp_path / "m.gguf"
    bad.write_bytes({"random": os.urandom(1000), "cut_header": whole[:15], "cut_tensors": whole[:-4000]}[damage])
    before = files(tmp_path)
    refused(capsys, ["drop", "--model", str(bad), "--drop-last", "1", "--out", str(tmp_path / "o")],
            str(bad), "GGUF")
    assert files(tmp_path) == before            # no lock file in the cache, no output


def test_an_output_that_cannot_be_created_is_refused_before_the_model_loads(llama, tmp_path, capsys):
    (tmp_path / "f").write_text("a file")
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", str(tmp_path / "f" / "o")],
            "--out", "is a file")
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", "/proc/dsprune-out"],
            "--out /proc/dsprune-out", "cannot write")
    assert files(tmp_path) == {"f"}


@pytest.mark.parametrize("flag,value", [("--dtype", "float8"), ("--device", "cuda"), ("--device", "cpu:3"),
                                        ("--device", "gpu")])
def test_dtype_and_device_the_machine_cannot_give(llama, tmp_path, capsys, flag, value):
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", str(tmp_path / "o"), flag, value],
            flag, value)
    assert files(tmp_path) == set()


def test_mask_gates_that_are_no_safetensors(llama, tmp_path, capsys):
    gates = Path(llama) / "config.json"
    refused(capsys, ["mask", "--gates", str(gates), "--ratio", "0.5", "--out", str(tmp_path / "o")], str(gates))
    assert files(tmp_path) == set()


@pytest.mark.parametrize("family,config", [("gpt2", {"model_type": "gpt2", "n_layer": 2}),
                                           ("t5", {"model_type": "t5", "num_layers": 2})])
def test_an_unsupported_family_is_refused_from_its_config(tmp_path, capsys, family, config):
    model = tmp_path / family
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))   # no weights at all: config.json alone decides
    refused(capsys, ["drop", "--model", str(model), "--drop-last", "1", "--out", str(tmp_path / "o")],
            str(model / "config.json"), repr(family))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("argv,what", [(["--drop-last", "4"], "every layer"),
                                       (["--drop-mlp", "2", "--drop-blocks", "2", "--calib",
                                         str(SAMPLE / "calibration.jsonl")], "every MLP")])
def test_a_drop_that_leaves_no_layer_or_no_mlp_is_refused(llama, tmp_path, capsys, argv, what):
    refused(capsys, ["drop", "--model", llama, *argv, "--out", str(tmp_path / "o")], what, "4-layer")
    assert files(tmp_path) == set()


def test_a_plan_without_mlps_is_neither_made_nor_followed(llama, tmp_path, capsys):
    scores = {"attn": {i: 1.0 for i in range(4)}, "mlp": {i: 0.01 for i in range(4)}, "block": {}}
    plan = plan_speedup(scores, shape_of(tiny_encoder("llama")), SpeedRequest(target=1.2, max_slim=0.0))
    assert all(c.mlp < 4 for c in plan.front) and len(plan.drop.mlp) < 4
    doc = {"num_layers": 4, "attn": [], "mlp": [0, 1, 2, 3], "slim_ratio": 0.0}
    (tmp_path / "plan.json").write_text(json.dumps(doc))
    refused(capsys, ["drop", "--model", llama, "--plan", str(tmp_path / "plan.json"), "--out", str(tmp_path / "o")],
            "plan.json", "every MLP")


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dsprune 0.")


def test_the_launcher_help_lists_config(capsys):
    with pytest.raises(SystemExit):
        parse_args(StageArgs, ["--help"], prog="launchers/train.py")    # what launchers/train.py parses with
    assert "--config FILE" in capsys.readouterr().out


@pytest.fixture
def beir(tmp_path):
    folder = tmp_path / "beir"
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "text": f"doc {i}"}) + "\n"
                                                 for i in range(4)))
    (folder / "queries.jsonl").write_text(json.dumps({"_id": "q0", "text": "doc 1"}) + "\n")
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq0\td1\t1\n")
    return folder


def test_quiet_eval_without_out_prints_only_the_table_into_a_fresh_folder(llama, beir, tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--model", llama, "--task", f"tiny={beir}", "--quiet"]) == 0
    (made,) = (tmp_path / "out").iterdir()
    assert made.name.startswith(f"eval-{Path(llama).name}-") and (made / "results.json").is_file()
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("task ") and [line.split()[0] for line in out[1:]] == ["tiny"], out


def test_eval_says_its_max_length_and_an_estimate_before_encoding(llama, beir, tmp_path, capsys):
    assert main(["eval", "--model", llama, "--task", f"tiny={beir}", "--out", str(tmp_path / "e")]) == 0
    out = capsys.readouterr().out
    said = next(line for line in out.splitlines() if line.startswith("max length "))
    assert said.startswith("max length 64 tokens") and "5 texts" in said and "to encode" in said
    assert out.index(said) < out.index("task ")


def test_two_runs_writing_one_output_at_once(llama, tmp_path, capsys):
    out = tmp_path / "o"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from dsprune import formats; formats.check_output(sys.argv[1]); "
        "print('claimed', flush=True); time.sleep(60)"), str(out)], stdout=subprocess.PIPE, text=True,
        cwd=REPO)
    try:
        assert holder.stdout.readline().strip() == "claimed"
        refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", str(out)],
                f"--out {out}", "another run is writing it", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    assert files(tmp_path) == set()
    assert main(["drop", "--model", llama, "--drop-last", "1", "--out", str(out)]) == 0   # its lock died with it


def test_overwrite_replaces_only_a_dsprune_output(llama, tmp_path, capsys, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", str(mine), "--overwrite"],
            str(mine), "manifest.json")
    monkeypatch.chdir(mine)
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", ".", "--overwrite"], "--out .")
    refused(capsys, ["drop", "--model", llama, "--drop-last", "1", "--out", "..", "--overwrite"], "--out ..")
    assert files(tmp_path) == {"mine", "mine/notes.txt"}
    out = tmp_path / "d"
    assert main(["drop", "--model", llama, "--drop-last", "1", "--out", str(out)]) == 0
    assert main(["drop", "--model", llama, "--drop-last", "2", "--out", str(out), "--overwrite"]) == 0
    assert formats.read_manifest(out)["drop"] == "last2B"


def test_output_folders_have_the_umask_permissions(llama, tmp_path):
    umask = os.umask(0o022)
    try:
        assert main(["drop", "--model", llama, "--drop-last", "1", "--out", str(tmp_path / "o")]) == 0
    finally:
        os.umask(umask)
    assert (tmp_path / "o").stat().st_mode & 0o777 == 0o755


def test_a_terminated_write_leaves_no_temporary_folder(tmp_path):
    """SIGTERM while an output is being written (drop and export write through output_dir) removes the
    temporary folder; the exit status says the process was terminated."""
    proc = subprocess.Popen([sys.executable, "-c", (
        "import sys, time; from dsprune import formats\n"
        "with formats.output_dir(sys.argv[1]) as tmp:\n"
        "    (tmp / 'model.safetensors').write_bytes(b'0' * 4096)\n"
        "    print('writing', flush=True); time.sleep(60)"), str(tmp_path / "o")],
        stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert proc.stdout.readline().strip() == "writing"
    assert any(p.name.startswith(".o.tmp-") for p in tmp_path.iterdir())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert files(tmp_path) == set()


def test_the_next_run_removes_stale_temporaries_of_its_output_only(llama, tmp_path):
    for stale in (".o.tmp-123-abcd", ".o.old-456", ".other.tmp-789-ef01"):
        (tmp_path / stale).mkdir()
        (tmp_path / stale / "model.safetensors").write_bytes(b"partial")
    assert main(["drop", "--model", llama, "--drop-last", "1", "--out", str(tmp_path / "o")]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"o", ".other.tmp-789-ef01"}


def test_only_our_shm_buffers_that_no_process_holds_are_removed(monkeypatch, capsys):
    from dsprune.distributed import SHM
    from dsprune.train.engine import remove_orphan_shm_buffers

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    name = "deepspeed_allreduce_buffer_{}_127.0.0.9_{}_{}"
    orphan, held, others = (SHM / name.format(os.getuid(), os.getpid(), 0),
                            SHM / name.format(os.getuid(), os.getpid(), 1),
                            SHM / name.format(os.getuid() + 1, os.getpid(), 0))
    for p in (orphan, held, others):
        p.write_bytes(b"\0" * 64)
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; f = open(sys.argv[1], 'rb'); "
                               "print('open', flush=True); time.sleep(60)", str(held)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "open"
        gone = remove_orphan_shm_buffers()
        assert orphan.name in gone and not orphan.exists()
        assert orphan.name in capsys.readouterr().out            # a launch says what it removed
        assert held.exists() and others.exists() and held.name not in gone
    finally:
        holder.kill()
        holder.wait()
        for p in (orphan, held, others):
            p.unlink(missing_ok=True)


@pytest.mark.parametrize("bad", ["output_dir", "overwrite", "model", "teacher"])
def test_the_train_launcher_refuses_before_anything_starts(llama, tmp_path, capsys, monkeypatch, bad):
    import runpy

    monkeypatch.setenv("DSPRUNE_CACHE", str(tmp_path / "cache"))
    (tmp_path / "f").write_text("a file")
    (tmp_path / "m.gguf").write_bytes(b"GGUF" + os.urandom(100))
    argv = {"output_dir": ["--model", llama, "--output_dir", str(tmp_path / "f" / "run")],
            "overwrite": ["--model", llama, "--output_dir", str(tmp_path), "--overwrite", "true"],
            "model": ["--model", str(tmp_path / "m.gguf"), "--output_dir", str(tmp_path / "run")],
            "teacher": ["--model", llama, "--teacher", str(tmp_path / "m.gguf"), "--mode", "distill",
                        "--output_dir", str(tmp_path / "run")]}[bad]
    launcher = runpy.run_path(str(REPO / "launchers" / "train.py"))      # its main, not its __main__ exit
    assert launcher["main"](argv) == 2
    err = capsys.readouterr().err
    named = {"output_dir": f"--output_dir {tmp_path / 'f' / 'run'}: cannot be created",
             "overwrite": f"--output_dir {tmp_path}: no dsprune manifest.json inside"}.get(
        bad, f"{tmp_path / 'm.gguf'}: not a usable GGUF file")
    assert err.startswith(f"error: {named}") and err.count("\n") == 1, err
    assert files(tmp_path) == {"f", "m.gguf"}


def test_resume_takes_the_newest_checkpoint_whose_commit_mark_matches(tmp_path, capsys):
    """The rule the launcher test exercises on a real torn ZeRO-3 checkpoint, on every way a save can be torn."""
    from dsprune.errors import DsPruneError
    from dsprune.train import checkpoints
    from dsprune.train.runlog import _read

    for step in (4, 8, 12, 16):
        tag = tmp_path / f"step{step}"
        (tag / "sub").mkdir(parents=True)
        (tag / "shard.pt").write_bytes(b"x" * 100)
        (tag / "sub" / "state.pt").write_bytes(b"y" * 10)
    # no marks at all, as a run killed while writing its first checkpoint leaves it (DeepSpeed's `latest` may
    # already name it): nothing to resume
    assert not checkpoints.resumable(tmp_path)
    with pytest.raises(DsPruneError, match="no complete checkpoint .* step4 is incomplete \\(no commit mark"):
        checkpoints.complete_checkpoint(tmp_path)
    for step in (4, 8, 12):
        formats.write_json(tmp_path / f"step{step}" / checkpoints.COMMIT,
                           {"step": step, "files": checkpoints.files(tmp_path / f"step{step}")})
    (tmp_path / "step12" / "shard.pt").write_bytes(b"x" * 50)     # cut short
    (tmp_path / "step8" / "sub" / "state.pt").unlink()            # lost
    assert checkpoints.resumable(tmp_path)
    capsys.readouterr()
    assert checkpoints.complete_checkpoint(tmp_path) == "step4"
    said = capsys.readouterr().out.strip().splitlines()
    assert said == ["--resume: checkpoint step16 is incomplete (no commit mark: the save did not finish); "
                    "step12 is incomplete (shard.pt has 50 bytes, 100 when written); step8 is incomplete "
                    "(sub/state.pt is missing); resuming from step4"]
    (tmp_path / "step4" / "extra.pt").write_bytes(b"z")
    assert not checkpoints.resumable(tmp_path)
    with pytest.raises(DsPruneError, match="no complete checkpoint .* step4 is incomplete \\(extra.pt was not"):
        checkpoints.complete_checkpoint(tmp_path)
    log = tmp_path / "log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "lo')   # a row cut short by the kill
    assert _read(log) == [{"step": 1}, {"step": 2}]
    log.write_text('{"step": 1}\n{"ste\n{"step": 3}\n')
    with pytest.raises(DsPruneError, match="log.jsonl: line 2"):
        _read(log)
