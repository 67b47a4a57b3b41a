"""Issue 46: every path a user takes is safe. Run directories that cannot be mixed, arguments
checked before anything is made, faults of the machine in one line with no temporary file left,
outputs never overwritten silently. Each test goes through the real command line."""

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from linmem.cli import main

TINY = ("--data", "jsb", "--model", "lmn-b", "--hidden", "6", "--memory", "5", "--batch-size",
        "64", "--quiet")


def run_cli(*args, capsys):
    """(exit code, stdout, stderr) of ``linmem ARGS`` run in this process."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def one_line(code, err, expected_code, *words):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == expected_code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("linmem: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


def leftovers(folder: Path) -> list[str]:
    """Temporary files of the atomic writes under ``folder``."""
    return sorted(str(p) for p in folder.rglob("*.part"))


def test_a_second_process_on_the_same_run_fails_in_one_line(tmp_path, data_dir, capsys):
    """Row 3: the run directory is locked while a process trains in it; the second process
    (another OS process, as a user would start it) fails naming the holder, and the lock
    goes with the holder: after it is killed, --resume runs."""
    run = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "linmem", "train", *TINY, "--epochs", "1000", "--patience",
         "1000", "--data-dir", str(data_dir), "--out", str(run)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (run / "last.pt").is_file():  # it trains: an epoch is done
            assert first.poll() is None, first.stderr.read().decode()
            assert time.monotonic() < deadline
            time.sleep(0.2)
        second = subprocess.run(
            [sys.executable, "-m", "linmem", "train", *TINY, "--epochs", "3", "--resume",
             "--data-dir", str(data_dir), "--out", str(run)],
            env=env, capture_output=True, text=True, timeout=120)
        one_line(second.returncode, second.stderr, 1, str(run), "in use by",
                 f"process {first.pid}")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    # the lock died with its holder
    code, _, err = run_cli("train", *TINY, "--epochs", "3", "--resume", "--data-dir",
                             data_dir, "--out", run, capsys=capsys)
    assert code == 0, err
    assert (run / "metrics.json").is_file()


@pytest.mark.parametrize("files", [["thesis.tex"], ["metrics.json", "best.pt", "notes.md"]])
@pytest.mark.parametrize("resume", [False, True])
def test_out_refuses_a_folder_of_someone_elses_files(tmp_path, data_dir, files, resume, capsys):
    """Row 4: a non-empty folder that is not a run of ours is refused, its files untouched."""
    folder = tmp_path / "mine"
    folder.mkdir()
    for name in files:
        (folder / name).write_text("mine")
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out",
                           folder, *(["--resume"] if resume else []), capsys=capsys)
    one_line(code, err, 2, str(folder), "not a linmem run", files[0])
    assert sorted(p.name for p in folder.iterdir() if p.name != ".lock") == sorted(files)
    assert all((folder / name).read_text() == "mine" for name in files)


def test_an_empty_out_and_a_bad_seed_are_refused_before_anything_is_made(tmp_path, data_dir,
                                                                         capsys, monkeypatch):
    """Rows 4-5: `--out ""` is not the current folder, and `--seed -1` names the option; neither
    leaves a file behind, so the corrected command runs."""
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out", "",
                           capsys=capsys)
    one_line(code, err, 2, "must be named")
    assert list(tmp_path.iterdir()) == []
    run = tmp_path / "run"
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--seed", "-1", "--data-dir",
                           data_dir, "--out", run, capsys=capsys)
    one_line(code, err, 2, "seed")
    assert not run.exists()
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--seed", "1", "--data-dir",
                           data_dir, "--out", run, capsys=capsys)
    assert code == 0, err


def _fail_writes_after(monkeypatch, n_ok: int, error: int):
    """Every ``torch.save`` after the first ``n_ok`` raises ``OSError(error)`` part-way through
    the file, as a full disk or a read-only file system does."""
    calls = {"n": 0}
    save = torch.save

    def failing(obj, f, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] > n_ok:
            f.write(b"partial")
            name = getattr(f, "name", None)
            raise OSError(error, os.strerror(error), name)
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", failing)


@pytest.mark.parametrize("error,advice", [(errno.ENOSPC, "free some space"),
                                          (errno.EROFS, "read-only"),
                                          (errno.EACCES, "you may not write there")])
def test_a_fault_of_the_machine_at_the_first_checkpoint_is_one_line_and_leaves_nothing(
        tmp_path, data_dir, monkeypatch, capsys, error, advice):
    """Rows 7-8: the disk fills (or is read-only) at the first checkpoint: one line naming the
    file and what to do, exit 1, no temporary file, no half-made folder (the start failed)."""
    run = tmp_path / "run"
    _fail_writes_after(monkeypatch, 0, error)
    code, _, err = run_cli("train", *TINY, "--epochs", "2", "--data-dir", data_dir, "--out", run,
                           capsys=capsys)
    one_line(code, err, 1, os.strerror(error), advice)
    assert str(run) in err
    assert not run.exists() and leftovers(tmp_path) == []


def test_a_full_disk_later_keeps_the_run_and_resume_finishes_it_cleanly(tmp_path, data_dir,
                                                                       monkeypatch, capsys):
    """Row 7: the disk fills after some epochs: one line, exit 1, the run is kept with its
    last good epoch and no stray temporary file; --resume (space freed) finishes it, leaving
    none either."""
    run = tmp_path / "run"
    _fail_writes_after(monkeypatch, 4, errno.ENOSPC)  # best.pt and last.pt of two epochs
    code, _, err = run_cli("train", *TINY, "--epochs", "4", "--patience", "10", "--data-dir",
                           data_dir, "--out", run, capsys=capsys)
    one_line(code, err, 1, "No space left on device", "--resume")
    assert (run / "last.pt").is_file() and leftovers(tmp_path) == []
    monkeypatch.undo()
    code, _, err = run_cli("train", *TINY, "--epochs", "4", "--patience", "10", "--resume",
                           "--data-dir", data_dir, "--out", run, capsys=capsys)
    assert code == 0, err
    assert (run / "metrics.json").is_file() and leftovers(tmp_path) == []
