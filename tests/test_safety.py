"""Issue 46: every path a user takes is safe. Run directories that cannot be mixed, arguments
checked before anything is made, faults of the machine in one line with no temporary file left,
outputs never overwritten silently. Each test goes through the real command line."""

import errno
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from test_faults import run_cli  # (exit code, stdout, stderr) of linmem ARGS in this process

from linmem.cli.commands import main

TINY = ("--data", "jsb", "--model", "lmn-b", "--hidden", "6", "--memory", "5", "--batch-size",
        "64", "--quiet")


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
    assert str(run) in err and "--resume" not in err  # nothing left to resume
    assert f"{run} had finished no epoch and was removed: start the run again" in err
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


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, data_dir):
    """A tiny finished run on JSB Chorales."""
    run = tmp_path_factory.mktemp("finished") / "run"
    main(["train", *TINY, "--epochs", "2", "--data-dir", str(data_dir), "--out", str(run)])
    return run


def test_generated_outputs_are_never_overwritten_silently(tmp_path, finished_run, capsys):
    """Row 6: --out and --png naming one file is refused before anything runs; an existing
    output (or the record beside it) is kept unless --force."""
    out = tmp_path / "same.mid"
    base = ("generate", finished_run, "--prime", "test:0", "--prime-steps", "4", "--steps", "3")
    code, _, err = run_cli(*base, "--out", out, "--png", out, capsys=capsys)
    one_line(code, err, 2, "--out", "--png", "same file")
    assert not out.exists()
    code, _, err = run_cli(*base, "--out", out, capsys=capsys)
    assert code == 0, err
    before = out.read_bytes(), out.with_suffix(".json").read_text()
    code, _, err = run_cli(*base, "--seed", "9", "--out", out, capsys=capsys)
    one_line(code, err, 2, str(out), "already exists", "--force")
    assert (out.read_bytes(), out.with_suffix(".json").read_text()) == before
    code, _, err = run_cli(*base, "--seed", "9", "--out", out, "--force", capsys=capsys)
    assert code == 0, err
    assert '"seed": 9' in out.with_suffix(".json").read_text()
    # the record beside --out is an output too
    other = tmp_path / "other.mid"
    other.with_suffix(".json").write_text("mine")
    code, _, err = run_cli(*base, "--out", other, capsys=capsys)
    one_line(code, err, 2, "other.json", "already exists")
    assert other.with_suffix(".json").read_text() == "mine" and not other.exists()


def test_an_output_in_a_missing_folder_is_refused_and_no_folder_is_made(tmp_path, finished_run,
                                                                        capsys):
    """generate and plot write into folders that exist, as train --out does: a mistyped path is
    one line and exit 2, and no folder appears anywhere."""
    missing = tmp_path / "no" / "such" / "dir"
    base = ("generate", finished_run, "--prime", "test:0", "--prime-steps", "4", "--steps", "3")
    for args in ((*base, "--out", missing / "x.mid"),
                 (*base, "--out", tmp_path / "x.mid", "--png", missing / "x.png"),
                 ("plot", finished_run, "--out", missing / "curves.png")):
        code, _, err = run_cli(*args, capsys=capsys)
        one_line(code, err, 2, str(missing), "does not exist")
        assert not (tmp_path / "no").exists() and not (tmp_path / "x.mid").exists()
    code, out, _ = run_cli("generate", "--help", capsys=capsys)
    assert code == 0 and "--out a.mid writes a.json" in " ".join(out.split())


def test_the_help_says_what_the_commands_take(capsys):
    """Issue 91 item 7: plot --prediction names every form it takes; --memory-bound's help
    gives its default once."""
    code, out, _ = run_cli("plot", "--help", capsys=capsys)
    text = " ".join(out.split())
    assert code == 0 and "[DATA:]SPLIT:INDEX|FILE.mid" in text and "jsb:test:0" in text
    code, out, _ = run_cli("train", "--help", capsys=capsys)
    bound = " ".join(out.split()).split("--memory-bound", 1)[1].split(" --", 1)[0]
    assert bound.count("[default: 0.99]") == 1, bound


def _midi_folder(folder: Path, rolls) -> Path:
    from linmem.midi import roll_to_midi

    folder.mkdir()
    for i, roll in enumerate(rolls):
        roll_to_midi(roll, 0.25).write(str(folder / f"s{i}.mid"))
    return folder


def test_import_midi_refuses_to_overwrite_and_checks_its_split(tmp_path, jsb, capsys):
    """Rows 6 and 11: import-midi keeps an existing OUT unless --force; --split 1,0,0 (a split
    with no sequence) and --split a,b,c name the option."""
    folder = _midi_folder(tmp_path / "mine", jsb["train"][:5])
    out = tmp_path / "mine.pickle"
    out.write_bytes(b"mine")
    code, _, err = run_cli("data", "import-midi", folder, "--out", out, capsys=capsys)
    one_line(code, err, 2, str(out), "already exists", "--force")
    assert out.read_bytes() == b"mine"
    code, _, err = run_cli("data", "import-midi", folder, "--out", out, "--force", capsys=capsys)
    assert code == 0, err
    for split in ("1,0,0", "0.5,0.5", "a,b,c"):
        code, _, err = run_cli("data", "import-midi", folder, "--out", tmp_path / "x.pickle",
                               "--split", split, capsys=capsys)
        one_line(code, err, 2, "--split")
        assert not (tmp_path / "x.pickle").exists()


def test_a_damaged_midi_file_is_named_in_one_line(tmp_path, jsb, finished_run, capsys):
    """Row 11: a truncated or empty .mid given to generate --prime is one line naming the file
    (not Ctrl-C's 'aborted', exit 130); import-midi skips it saying why; notes outside A0-C8
    are counted, not dropped without a word."""
    import pretty_midi

    from linmem.midi import roll_to_midi

    good = tmp_path / "good.mid"
    roll_to_midi(jsb["test"][0][:16], 0.5).write(str(good))
    truncated, empty = tmp_path / "truncated.mid", tmp_path / "empty.mid"
    truncated.write_bytes(good.read_bytes()[:40])
    empty.write_bytes(b"")
    for bad in (truncated, empty):
        code, _, err = run_cli("generate", finished_run, "--prime", bad, "--steps", "2", "--out",
                               tmp_path / "o.mid", capsys=capsys)
        one_line(code, err, 2, str(bad), "not a readable MIDI file")
    folder = _midi_folder(tmp_path / "mine", jsb["train"][:4])
    (folder / "truncated.mid").write_bytes(truncated.read_bytes())
    wide = pretty_midi.PrettyMIDI()
    piano = pretty_midi.Instrument(0)
    piano.notes += [pretty_midi.Note(80, 60, 0, 1), pretty_midi.Note(80, 110, 0, 1),
                    pretty_midi.Note(80, 15, 1, 2)]  # two notes above C8 and below A0
    wide.instruments.append(piano)
    wide.write(str(folder / "wide.mid"))
    code, out, err = run_cli("data", "import-midi", folder, "--out", tmp_path / "m.pickle",
                             capsys=capsys)
    assert code == 0, err
    assert "from 6 MIDI files (1 skipped)" in out
    assert f"skipped {folder / 'truncated.mid'}: not a readable MIDI file" in err
    assert not any(line.rstrip().endswith(":") for line in err.splitlines())  # a reason each
    assert f"{folder / 'wide.mid'}: 2 notes outside the piano's A0-C8 left out" in err


def test_damaged_run_files_are_named_without_unsafe_advice(tmp_path, finished_run, capsys):
    """Row 12: a checkpoint that is not ours never suggests weights_only=False; a truncated one
    says so; a bad line of log.jsonl names the file and the line."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    torch.save({"model": Path("x")}, run / "best.pt")  # an object, not tensors: refused
    code, _, err = run_cli("evaluate", run, capsys=capsys)
    one_line(code, err, 1, "best.pt", "not written by linmem")  # a fault of the files: 1
    assert "weights_only" not in err
    data = (finished_run / "best.pt").read_bytes()
    (run / "best.pt").write_bytes(data[: len(data) // 2])
    code, _, err = run_cli("evaluate", run, capsys=capsys)
    one_line(code, err, 1, "best.pt", "truncated or damaged")
    assert "Errno 22" not in err
    lines = (run / "log.jsonl").read_text().splitlines()
    (run / "log.jsonl").write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    code, _, err = run_cli("memory", run, capsys=capsys)
    one_line(code, err, 2, "log.jsonl", "line 2")


def test_a_missing_matplotlib_is_one_line_before_anything_is_written(tmp_path, finished_run,
                                                                      monkeypatch, capsys):
    """Row 13: plot, generate --png and report without the plot extra: one line naming the
    extra, exit 1, and no output written."""
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    before = sorted(p.name for p in finished_run.iterdir())
    for args in (("plot", finished_run),
                 ("generate", finished_run, "--prime", "test:0", "--steps", "2", "--out",
                  tmp_path / "a.mid", "--png", tmp_path / "a.png"),
                 ("report", "--storage", f"sqlite:///{tmp_path / 'none.db'}", "--run",
                  finished_run, "--out", tmp_path / "results")):
        code, _, err = run_cli(*args, capsys=capsys)
        one_line(code, err, 1, "matplotlib", "linear-memory-networks[plot]")
    assert sorted(p.name for p in finished_run.iterdir()) == before
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["report", "progress", "search-export", "search"])
def test_a_damaged_or_unknown_storage_is_one_line(tmp_path, data_dir, command, capsys):
    """Row 9: a corrupt SQLite file is a fault of the machine (exit 1), a URL no database
    answers to a usage error (exit 2); one line each, no traceback."""
    bad = tmp_path / "bad.db"
    bad.write_text("not a database at all, " * 20)
    extra = {"search-export": [tmp_path / "x.jsonl"],
             "search": ["--grid", "tiny", "--subset", "3", "--data-dir", data_dir]}.get(command, [])
    code, _, err = run_cli(command, *extra, "--storage", f"sqlite:///{bad}", capsys=capsys)
    one_line(code, err, 1, str(bad), "cannot open it")
    code, _, err = run_cli(command, *extra, "--storage", "foo://bar", capsys=capsys)
    one_line(code, err, 2, "foo://bar", "sqlite:///FILE")


def test_a_search_without_its_data_leaves_no_storage(tmp_path, capsys, monkeypatch):
    """Row 9: `search` with no data is one usage line and makes no search.db."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("LINMEM_DATA", raising=False)
    import dataclasses

    from linmem import data as D

    for name, info in list(D.DATASETS.items()):
        monkeypatch.setitem(D.DATASETS, name,
                            dataclasses.replace(info, urls=("http://127.0.0.1:9/x.pickle",)))
    (tmp_path / "nodata").mkdir()  # a data folder without the data
    code, _, err = run_cli("search", "--grid", "tiny", "--out", tmp_path / "s", "--data-dir",
                           tmp_path / "nodata", capsys=capsys)
    one_line(code, err, 2, "JSB")
    assert not (tmp_path / "s").exists()


def test_the_documented_postgresql_url_opens_with_the_extra_we_ship():
    """Row 10: SQLAlchemy 2 reads postgresql:// as psycopg (3); the postgres extra installs
    psycopg2, so the URL is given its driver (the server itself: tests/test_search.py)."""
    import importlib.util

    from linmem.experiments.storage import storage_url

    url = storage_url("postgresql://me@127.0.0.1:5432/db")
    if importlib.util.find_spec("psycopg") is None:
        assert url == "postgresql+psycopg2://me@127.0.0.1:5432/db"
    else:
        assert url == "postgresql://me@127.0.0.1:5432/db"
    assert storage_url("postgresql+psycopg2://x@h/d") == "postgresql+psycopg2://x@h/d"
    assert storage_url("sqlite:///a.db") == "sqlite:///a.db"


def test_ctrl_c_to_search_is_one_line(tmp_path, data_dir):
    """Row 9: SIGINT to `linmem search` ends it with its own line, not Optuna's traceback."""
    out = tmp_path / "s"
    # Python leaves SIGINT ignored when it starts with it ignored, as every command started in
    # the background (`cmd &`) by a shell without job control is: then no Ctrl-C reaches it,
    # rightly. The test runs linmem as a terminal would, with Python's own handler.
    # SIGUSR1 dumps its threads' stacks (faulthandler): what it was doing if it outlives the
    # Ctrl-C (once seen on a loaded machine, five busy processes on two cores)
    as_in_a_terminal = ("import faulthandler, runpy, signal, sys; "
                        "signal.signal(signal.SIGINT, signal.default_int_handler); "
                        "faulthandler.register(signal.SIGUSR1, all_threads=True); "
                        "sys.argv[0] = 'linmem'; runpy.run_module('linmem', run_name='__main__')")
    proc = subprocess.Popen(
        [sys.executable, "-c", as_in_a_terminal, "search", "--grid", "tiny", "--subset", "3",
         "--epochs", "100000", "--patience", "100000", "--data-dir", str(data_dir), "--out",
         str(out), "--quiet"],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(out.rglob("last.pt")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
        proc.kill()
        _, err = proc.communicate()
        pytest.fail(f"still running 120 s after SIGINT; its stacks:\n{err}")
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[-1] == "linmem: interrupted; run the same command again to continue"
    assert len(lines) <= 2, err  # the storage line the search starts with, and that one


def test_a_ctrl_c_in_a_storage_query_logs_nothing(tmp_path, caplog):
    """Row 9: a Ctrl-C that lands in a query makes SQLAlchemy close the connection, then log
    "Error closing cursor" with a traceback through its pool's logger (seen once in CI: the
    test above failed on it). The storage hushes that record, and only that: a pool error with no
    Ctrl-C behind it is still logged. make_storage (the search's storage) adds the filter."""
    import logging

    from linmem.experiments.storage import default_storage, make_storage

    pool_logger = make_storage(default_storage(tmp_path)).engine.pool.logger

    def close_cursor_after(err: BaseException) -> None:  # SQLAlchemy's _safe_close_cursor
        try:
            try:
                raise err
            finally:
                raise RuntimeError("Cannot operate on a closed database.")
        except Exception:
            pool_logger.error("Error closing cursor", exc_info=True)

    with caplog.at_level(logging.WARNING):
        close_cursor_after(KeyboardInterrupt())
        assert caplog.records == []
        close_cursor_after(OSError("disk I/O error"))
        assert [r.getMessage() for r in caplog.records] == ["Error closing cursor"]


@pytest.fixture
def sigint_as_in_a_terminal():
    """Python's own SIGINT handler for the test, as in a terminal (a process started in the
    background has SIGINT ignored), and the one before it put back afterwards."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def _second_storage(folder: Path):
    """Another ``RDBStorage`` on the search storage in ``folder`` that waits at most 1 s for
    SQLite's lock: a write through it fails when a cut call left the lock held."""
    import optuna

    from linmem.experiments.storage import default_storage

    return optuna.storages.RDBStorage(default_storage(folder),
                                      engine_kwargs={"connect_args": {"timeout": 1}})


def test_a_ctrl_c_during_a_storage_call_lets_it_end(tmp_path, sigint_as_in_a_terminal):
    """Row 9: a Ctrl-C that comes while a search writes to its storage is raised once the write
    has committed: cut, the write's transaction kept SQLite's lock, and the trial's "failed"
    write waited out the busy timeout (120 s) and failed with a traceback (seen in the test
    above on a loaded machine). A second storage writes at once afterwards."""
    import optuna
    import sqlalchemy

    from linmem.experiments.storage import (
        default_storage,
        interrupts_between_storage_calls,
        make_storage,
    )

    storage = make_storage(default_storage(tmp_path))
    sent = []

    def ctrl_c_once(*_):
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler before returning here

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", ctrl_c_once)
    with interrupts_between_storage_calls(), pytest.raises(KeyboardInterrupt):
        storage.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "s")
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back
    assert sent
    other = _second_storage(tmp_path)
    assert [s.study_name for s in other.get_all_studies()] == ["s"]
    other.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "t")


@pytest.mark.parametrize("call", ["ask", "get_trials", "fail_stale_trials"])
def test_a_ctrl_c_during_a_study_call_lets_it_end(tmp_path, call, sigint_as_in_a_terminal):
    """Row 9: the same for the calls a search makes through its studies, whose storage (Optuna's
    ``_CachedStorage``) calls private methods of the ``RDBStorage`` itself: ``_create_new_trial``
    (in ``ask``, here cut at its write), ``_get_trials``, ``_get_stale_trial_ids`` (here cut at
    their first read). A Ctrl-C that cut one of those made CI's Ctrl-C test above wait out the
    busy timeout. Every statement begun runs to its end, the storage call too, and then the
    Ctrl-C is raised (before the next storage call of ``ask`` or ``fail_stale_trials``)."""
    import optuna
    import sqlalchemy

    from linmem.experiments.storage import (
        default_storage,
        interrupts_between_storage_calls,
        make_storage,
    )

    storage = make_storage(default_storage(tmp_path), heartbeat_interval=1)
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1})
    with pytest.warns(UserWarning, match="Heartbeat"):
        study.ask()  # a running trial, stale after a second without heartbeat
    time.sleep(2.1)
    log: list[str] = []

    def ctrl_c_once(conn, cursor, statement, *_):
        if "sent" not in log and (call != "ask" or statement.startswith("INSERT")):
            log.append("sent")
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler before returning here
        log.append("begun")

    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", ctrl_c_once)
    sqlalchemy.event.listen(storage.engine, "after_cursor_execute", lambda *_: log.append("ran"))
    with (interrupts_between_storage_calls(), pytest.raises(KeyboardInterrupt),
          warnings.catch_warnings()):
        warnings.simplefilter("ignore")  # heartbeats: experimental, meant for optimize
        if call == "ask":
            study.ask()
        elif call == "get_trials":
            study.get_trials(deepcopy=False)
        else:
            optuna.storages.fail_stale_trials(study)
    sent = log.index("sent")
    assert log[sent + 1:sent + 3] == ["begun", "ran"], log
    assert log.count("begun") == log.count("ran"), log
    other = _second_storage(tmp_path)
    other.create_new_study([optuna.study.StudyDirection.MAXIMIZE], "t")  # no lock is left
    trials = other.get_all_trials(other.get_study_id_from_name("s"))
    assert len(trials) == (2 if call == "ask" else 1)  # the ask's new trial was made


def test_a_ctrl_c_that_lands_in_a_finalizer_is_not_lost(sigint_as_in_a_terminal):
    """Row 9: a Ctrl-C whose handler runs inside a finalizer (a ``__del__``, or SQLAlchemy's
    weakref callback that a dropped ORM state runs, as CI once caught it) raises its
    ``KeyboardInterrupt`` there, where Python prints "Exception ignored" and drops it, so that
    the search went on for good. It is delivered again once the finalizer has returned."""
    import time

    from linmem.experiments.storage import interrupts_between_storage_calls

    ran = []

    class Finalized:
        def __del__(self):
            # Python runs the handler before raise_signal returns, here in __del__; the loop's
            # backward jumps would run it too if it had not
            signal.raise_signal(signal.SIGINT)
            for _ in range(100):
                ran.append(True)

    with interrupts_between_storage_calls(), pytest.raises(KeyboardInterrupt):
        Finalized()  # no reference kept: finalized at once
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            time.sleep(0.01)
    assert len(ran) < 100  # the handler did run inside the finalizer
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # put back


def test_the_kernel_path_is_recorded_and_can_be_pinned(tmp_path, data_dir, capsys):
    """Row 14: metrics.json names the recurrences' CPU path; --cpu-kernel best pins it without
    a timing race, so the same seed gives the same numbers; loop is the PyTorch loop."""
    import json

    from linmem.ops import cpu as _ext

    best = (_ext.kernel_variants() or ["loop"])[0]
    scores = []
    for name in ("a", "b", "c"):
        kernel = "loop" if name == "c" else "best"
        code, _, err = run_cli("train", *TINY, "--epochs", "3", "--cpu-kernel", kernel,
                               "--data-dir", data_dir, "--out", tmp_path / name, capsys=capsys)
        assert code == 0, err
        metrics = json.loads((tmp_path / name / "metrics.json").read_text())
        assert metrics["recurrence_path"] == (best if kernel == "best" else "loop")
        scores.append((metrics["valid_acc"], metrics["test_acc"], metrics["test_nll"]))
    assert scores[0] == scores[1]  # bit for bit
    assert scores[2] == pytest.approx(scores[0], rel=1e-3)  # another order: rounding apart
    code, _, err = run_cli("train", *TINY, "--cpu-kernel", "neon", "--out", tmp_path / "d",
                           capsys=capsys)
    one_line(code, err, 2, "--cpu-kernel")
    assert not (tmp_path / "d").exists()


def test_a_silent_data_set_warns_that_its_accuracy_means_nothing(tmp_path, capsys):
    """Row 15: an all-silent split scores 100 % (mir_eval's convention, kept), with a warning
    naming the splits; the command line prints it as one line."""
    import numpy as np

    from linmem.data import write_pickle
    from linmem.training.trainer import SilentDataWarning

    rng = np.random.default_rng(0)
    music = [(rng.random((20, 88)) < 0.05).astype(np.uint8) for _ in range(4)]
    silence = [np.zeros((20, 88), np.uint8) for _ in range(2)]
    data = tmp_path / "silent.pickle"
    write_pickle({"train": music, "valid": silence, "test": silence}, data)
    with pytest.warns(SilentDataWarning, match="valid and test splits .* hold no note"):
        code, _, err = run_cli("train", "--data", data, "--model", "lstm", "--hidden", "4",
                               "--epochs", "1", "--out", tmp_path / "run", "--quiet",
                               capsys=capsys)
    assert code == 0, err
    run = subprocess.run(
        [sys.executable, "-m", "linmem", "train", "--data", str(data), "--model", "lstm",
         "--hidden", "4", "--epochs", "1", "--out", str(tmp_path / "run2"), "--quiet"],
        capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    warned = [line for line in run.stderr.splitlines() if "hold no note" in line]
    assert len(warned) == 1 and warned[0].startswith("linmem: warning: the valid and test")
    assert "warnings.warn" not in run.stderr


def test_a_reduced_search_is_marked_and_another_grid_is_suggested(tmp_path, data_dir, capsys):
    """Row 16: a search run on a subset, or with fewer epochs, is marked in Table 2 and never
    bold beside the paper's figures; `report` for a grid the storage lacks names the grids it
    holds."""
    out = tmp_path / "s"
    code, _, err = run_cli("search", "--grid", "tiny", "--model", "lmn-b", "--subset", "6",
                           "--epochs", "2", "--memory-bound", "none", "--data-dir", data_dir,
                           "--out", out, "--quiet", capsys=capsys)  # the row's label: unbounded
    assert code == 0, err
    storage = f"sqlite:///{out / 'search.db'}"
    code, _, err = run_cli("report", "--storage", storage, "--out", tmp_path / "r",
                           capsys=capsys)
    one_line(code, err, 2, "no study of grid 'paper'", "--grid tiny")
    code, _, err = run_cli("report", "--storage", storage, "--grid", "tiny", "--out",
                           tmp_path / "r", capsys=capsys)
    assert code == 0, err
    table = (tmp_path / "r" / "table2.md").read_text()
    row = next(line for line in table.splitlines() if line.startswith("| LMN-B |"))
    ours = row.split("|")[3]  # JSB (ours)
    assert "¶" in ours and "**" not in ours, row
    assert "¶: from a reduced search (lmn-b on jsb: the first 6 sequences of each split, " \
           "epochs 2)" in table


@pytest.mark.parametrize("command", ["plot", "generate", "import-midi", "train"])
def test_a_read_only_folder_is_one_line_for_every_command(tmp_path, finished_run, data_dir, jsb,
                                                          monkeypatch, command, capsys):
    """Row 8: where a file cannot be created (read-only, no permission; injected at the
    temporary file every write goes through, since root ignores permissions), each command
    ends in one line naming the file and what to do, exit 1."""
    import shutil
    import tempfile

    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    folder = _midi_folder(tmp_path / "mine", jsb["train"][:4]) if command == "import-midi" else None
    target = tmp_path / "ro"
    target.mkdir()  # there, but refusing writes (a missing folder is refused before: above)
    real = tempfile.mkstemp

    def refuse(*args, dir=None, **kwargs):
        if dir is not None and Path(dir).resolve() in (target.resolve(), run.resolve()):
            raise PermissionError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", refuse)
    args = {"plot": ("plot", run),
            "generate": ("generate", run, "--prime", "test:0", "--steps", "2", "--out",
                         target / "a.mid"),
            "import-midi": ("data", "import-midi", folder, "--out", target / "m.pickle"),
            "train": ("train", *TINY, "--epochs", "3", "--resume", "--data-dir", data_dir,
                      "--out", run)}[command]
    code, _, err = run_cli(*args, capsys=capsys)
    one_line(code, err, 1, "Read-only file system", "choose a folder you can write")
    assert (str(target) if command in ("generate", "import-midi") else str(run)) in err
    assert leftovers(tmp_path) == []


def test_a_newcomers_small_faults_are_one_clear_line(tmp_path, finished_run, data_dir, capsys,
                                                     monkeypatch):
    """Issue 78 item 5: plot keeps a file of the user's own unless --force; --resume of a folder
    with no run says it starts one; --prediction's errors name --prediction; --memory 0 does not
    offer "None"; corrupt data gives the command line's advice, not the library's; a text file
    as best.pt is called what it is; a bad LINMEM_CPU_KERNEL leaves no folder; evaluate's seed is
    the run's own."""
    pytest.importorskip("matplotlib")
    import json
    import shutil

    mine = tmp_path / "mine.png"
    mine.write_bytes(b"my own picture")
    code, _, err = run_cli("plot", finished_run, "--out", mine, capsys=capsys)
    one_line(code, err, 2, str(mine), "already exists", "--force")
    assert mine.read_bytes() == b"my own picture"
    code, _, err = run_cli("plot", finished_run, "--out", mine, "--force", capsys=capsys)
    assert code == 0 and mine.read_bytes().startswith(b"\x89PNG"), err
    code, _, err = run_cli("plot", finished_run, capsys=capsys)  # its own curves: drawn again
    code2, _, err2 = run_cli("plot", finished_run, capsys=capsys)
    assert code == code2 == 0, err + err2

    for bad, words in (("test:9999", ("--prediction", "has 77 sequences (0-76)")),
                       ("garbage", ("--prediction", "expected DATA:SPLIT:INDEX"))):
        code, _, err = run_cli("plot", finished_run, "--prediction", bad, "--out",
                               tmp_path / "p.png", capsys=capsys)
        one_line(code, err, 2, *words)
        assert "--prime" not in err

    new = tmp_path / "new"
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--resume",
                           "--out", new, capsys=capsys)
    assert code == 0 and f"{new} holds no run to resume: starting it" in err, err

    code, _, err = run_cli("train", *TINY, "--memory", "0", "--out", tmp_path / "m",
                           capsys=capsys)
    one_line(code, err, 2, "--memory must be a positive integer, got 0",
             "leave it out for its default")
    assert "None" not in err

    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    (corrupt / "JSB_Chorales.mat").write_bytes(b"not the data set")
    code, _, err = run_cli("data", "jsb", "--data-dir", corrupt, capsys=capsys)
    one_line(code, err, 2, "SHA-256 mismatch", "the next load downloads the data set again")
    assert "download=True" not in err

    fake = tmp_path / "fake"
    shutil.copytree(finished_run, fake)
    (fake / "best.pt").write_text("hello\n")
    code, _, err = run_cli("evaluate", fake, capsys=capsys)
    one_line(code, err, 1, "best.pt", "not a PyTorch checkpoint at all", "b'hello")
    assert "could run code" not in err

    monkeypatch.setenv("LINMEM_CPU_KERNEL", "bogus")  # read once per process: a new one
    code, _, err = run_cli_process("train", *TINY, "--epochs", "1", "--data-dir", data_dir,
                                   "--out", tmp_path / "bogus")
    one_line(code, err, 2, "LINMEM_CPU_KERNEL='bogus'", "expected one of")
    assert not (tmp_path / "bogus").exists()
    monkeypatch.delenv("LINMEM_CPU_KERNEL")

    trained_with = json.loads((finished_run / "config.json").read_text())["seed"]
    code, out, err = run_cli("evaluate", finished_run, "--split", "valid", capsys=capsys)
    assert code == 0 and json.loads(out)["seed"] == trained_with is not None, err


def test_sigterm_stops_training_in_one_line_and_resume_goes_on(tmp_path, data_dir):
    """Issue 78 item 5: a SIGTERM (kill, a batch system's stop) ends `linmem train` as a
    Ctrl-C does: one line saying so and how to go on, exit 143, the last checkpoint whole."""
    import json

    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "linmem", "train", *TINY, "--epochs", "100000", "--patience",
         "100000", "--data-dir", str(data_dir), "--out", str(run)],
        env={**os.environ, "OMP_NUM_THREADS": "1"}, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (run / "last.pt").is_file():
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() < deadline
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"linmem: terminated (SIGTERM); continue with: linmem train --resume "
                     f"--out {run}"]
    epoch = torch.load(run / "last.pt", weights_only=True)["state"]["epoch"]
    code, _, err = run_cli_process("train", "--resume", "--out", run, "--epochs", epoch + 1,
                                   "--data-dir", data_dir, "--quiet")
    assert code == 0, err
    assert json.loads((run / "metrics.json").read_text())["epochs"] == epoch + 1


def run_cli_process(*args):
    done = subprocess.run([sys.executable, "-m", "linmem", *map(str, args)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300)
    return done.returncode, done.stdout, done.stderr
