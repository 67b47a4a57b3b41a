"""Newcomer and fault paths (issue 19): every bad input is one clear line with exit code 2, no
run is lost or overwritten, and a failed start leaves nothing behind."""

import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linmem import LMN, LMNCell
from linmem import data as D
from linmem.cli.commands import main
from linmem.data import DataError, load_polyphonic
from linmem.metrics import frame_accuracy
from linmem.ops import cpu as _ext


def run_cli(*args, capsys):
    """(exit code, stdout, stderr) of ``linmem ARGS`` run in this process."""
    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *words, exit_code=2):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == exit_code, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("linmem: error: ")
    for word in words:
        assert word in lines[0], (word, lines[0])


TINY = ("--data", "jsb", "--model", "lmn-b", "--hidden", "6", "--memory", "5", "--batch-size",
        "64", "--quiet")


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No LINMEM_DATA, an empty user cache and no reachable download address."""
    monkeypatch.delenv("LINMEM_DATA", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name, info in list(D.DATASETS.items()):
        monkeypatch.setitem(D.DATASETS, name,
                            dataclasses.replace(info, urls=("http://127.0.0.1:9/x.pickle",)))


def test_a_run_is_rescored_anywhere_and_missing_data_says_what_to_do(tmp_path, data_dir,
                                                                       offline, capsys):
    run = tmp_path / "run"
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out", run,
                           capsys=capsys)
    assert code == 0, err
    assert json.loads((run / "config.json").read_text())["data_dir"] == str(data_dir.resolve())
    code, out, err = run_cli("evaluate", run, "--split", "test", capsys=capsys)  # no data flag
    assert code == 0, err
    assert json.loads(out)["test"]["acc"] == pytest.approx(
        json.loads((run / "metrics.json").read_text())["test_acc"], rel=1e-9)
    code, _, err = run_cli("data", "jsb", capsys=capsys)
    assert_one_line_error(code, err, "could not download JSB Chorales", "LINMEM_DATA",
                          "--data-dir")


def test_a_failed_start_leaves_nothing_and_the_corrected_command_runs(tmp_path, data_dir,
                                                                       offline, capsys):
    run = tmp_path / "run"
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--out", run, capsys=capsys)
    assert_one_line_error(code, err, "could not download")  # the data is not where expected
    assert not run.exists()
    for bad, words in ((("--hidden", "1000000000"), ("parameters", "GiB")),
                       (("--hidden", "99999999999999999999"), ("cannot be built",)),
                       (("--device", "tpu"), ("device must be cpu, cuda",))):
        code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out",
                               run, *bad, capsys=capsys)
        assert_one_line_error(code, err, *words)
        assert not run.exists()
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out", run,
                           capsys=capsys)
    assert code == 0, err


@pytest.fixture(scope="module")
def finished(tmp_path_factory, data_dir):
    """A finished 3-epoch run, and the same run interrupted after epoch 2 (its last.pt and
    last.prev.pt hold epochs 2 and 1)."""
    root = tmp_path_factory.mktemp("runs")
    common = [*TINY, "--epochs", "3", "--data-dir", str(data_dir)]
    main(["train", *common, "--out", str(root / "full")])
    main(["train", *common[:-4], "--epochs", "2", "--data-dir", str(data_dir), "--out",
          str(root / "part")])
    return root, common


def damaged(path, how):
    data = path.read_bytes()
    path.write_bytes({"truncated": data[: len(data) // 2], "empty": b"",
                      "random": os.urandom(len(data))}[how])


@pytest.mark.parametrize("how", ["truncated", "empty", "random"])
def test_a_damaged_best_checkpoint_is_one_line(tmp_path, finished, how, capsys):
    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "full", run)
    damaged(run / "best.pt", how)
    code, _, err = run_cli("evaluate", run, capsys=capsys)
    # a fault of the files, not of the command line: exit 1, as the quick start promises
    assert_one_line_error(code, err, "best.pt", "unreadable checkpoint", exit_code=1)
    if how == "random":  # random bytes are no checkpoint, not a file that "could run code"
        assert "not a PyTorch checkpoint at all" in err and "could run code" not in err
    # and the run's other checkpoint: readable here (how to score it), or damaged too
    assert "last.pt reads (linmem evaluate --which last scores it)" in err
    damaged(run / "last.pt", how)
    code, _, err = run_cli("evaluate", run, capsys=capsys)
    assert_one_line_error(code, err, "best.pt", "last.pt is unreadable too", exit_code=1)


def test_a_checkpoint_that_does_not_fit_its_config_is_one_line(tmp_path, finished, capsys):
    """evaluate of a run whose config.json describes another model than its checkpoint holds
    (hidden 7 against a checkpoint of 6): one line naming both files, exit 1, no traceback."""
    import json

    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "full", run)
    config = json.loads((run / "config.json").read_text())
    config["hidden"] += 1
    (run / "config.json").write_text(json.dumps(config))
    code, _, err = run_cli("evaluate", run, capsys=capsys)
    assert_one_line_error(code, err, "best.pt", "config.json", "does not fit", "size mismatch",
                          exit_code=1)


@pytest.mark.parametrize("how", ["truncated", "empty", "random", "missing"])
def test_a_damaged_last_checkpoint_resumes_from_the_one_before(tmp_path, finished, how, capsys):
    """``--resume`` continues from ``last.prev.pt`` and ends with the uninterrupted run's
    numbers."""
    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    if how == "missing":
        (run / "last.pt").unlink()
    else:
        damaged(run / "last.pt", how)
    code, _, err = run_cli("train", "--resume", "--out", run, "--epochs", "3", capsys=capsys)
    assert code == 0, err
    assert "resuming from last.prev.pt (epoch 1)" in err
    full = json.loads((root / "full" / "metrics.json").read_text())
    resumed = json.loads((run / "metrics.json").read_text())
    for key in ("valid_acc", "test_acc", "test_nll", "best_epoch", "epochs"):
        assert resumed[key] == full[key], key


def test_a_damaged_checkpoint_without_a_previous_one_is_one_line(tmp_path, finished, capsys):
    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "part", run)
    (run / "last.prev.pt").unlink()
    damaged(run / "last.pt", "truncated")
    code, _, err = run_cli("train", "--resume", "--out", run, "--epochs", "3", capsys=capsys)
    assert_one_line_error(code, err, "last.pt", "no earlier checkpoint", exit_code=1)


def test_a_malformed_config_names_its_file(tmp_path, finished, capsys):
    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "full", run)
    (run / "config.json").write_text('{"data": "jsb"\n"model": 1}')
    for args in (("evaluate", run), ("train", "--resume", "--out", run)):
        code, _, err = run_cli(*args, capsys=capsys)
        assert_one_line_error(code, err, "config.json", "not valid JSON")


def test_a_finished_run_is_never_rewritten(tmp_path, finished, capsys):
    root, _ = finished
    run = tmp_path / "run"
    shutil.copytree(root / "full", run)
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    code, out, err = run_cli("train", "--resume", "--out", run, capsys=capsys)
    assert code == 0, err
    assert "valid acc" in out
    assert {p.name: p.read_bytes() for p in run.iterdir()} == before


def test_run_files_are_readable_by_others(finished):
    root, _ = finished
    mask = os.umask(0)
    os.umask(mask)
    for name in ("config.json", "metrics.json", "log.jsonl", "best.pt", "last.pt"):
        assert (root / "full" / name).stat().st_mode & 0o777 == 0o666 & ~mask, name


def test_data_folder_errors(tmp_path, data_dir, capsys):
    missing = tmp_path / "missing"
    code, _, err = run_cli("data", "jsb", "--data-dir", missing, capsys=capsys)
    assert_one_line_error(code, err, "no such directory")
    assert not missing.exists()
    with pytest.raises(DataError, match="is a file; the data root must be the folder"):
        load_polyphonic("jsb", root=data_dir / "JSB_Chorales.mat")


def test_plain_command_prints_the_usage(capsys):
    code, out, err = run_cli(capsys=capsys)
    assert code == 0 and out.startswith("Usage: linmem") and err == ""


def test_the_kernel_is_built_by_the_same_ninja_whatever_is_on_path(monkeypatch, tmp_path):
    """A build directory made by one ninja is rebuilt from scratch by another: the wheel's
    ninja always goes first."""
    ninja = pytest.importorskip("ninja")
    other = tmp_path / "bin"
    other.mkdir()
    (other / "ninja").write_text("#!/bin/sh\nexit 1\n")
    monkeypatch.setenv("PATH", f"{other}{os.pathsep}{os.environ['PATH']}")
    _ext._wheel_ninja_first()
    assert shutil.which("ninja") == str(Path(ninja.BIN_DIR) / "ninja")


_KERNEL_FORWARD = ("import torch; from linmem import LMN; from linmem.ops import cpu; "
                   "assert cpu.load_cpu_kernel() is not None; "
                   "print(float(LMN(3, 4, 5)(torch.rand(6, 2, 3))[0].sum().detach()))")


def _kernel_run(extensions: Path, timeout: float) -> subprocess.CompletedProcess:
    """A fresh process's first LMN forward on the compiled kernel, its builds under
    ``extensions`` (TORCH_EXTENSIONS_DIR)."""
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(extensions), "LINMEM_CPU_KERNEL": "1",
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-c", _KERNEL_FORWARD], env=env, timeout=timeout,
                          capture_output=True, text=True)


def test_a_lock_left_by_a_killed_build_is_removed_not_waited_on(tmp_path):
    """torch's build lock survives a SIGKILL and made every later run wait forever, silently
    (issue 78): a build folder holding such a lock (the built kernel copied beside it, so that
    nothing needs compiling) loads at once, and says what it removed."""
    assert _ext.load_cpu_kernel() is not None  # this process's build, copied
    name = _ext._build_name()
    folder = tmp_path / "ext" / name
    shutil.copytree(_ext._build_directory(name), folder)
    (folder / "lock").write_text("")  # as a process killed during the build leaves it
    done = _kernel_run(tmp_path / "ext", timeout=60)
    assert done.returncode == 0, done.stderr
    assert "was left by a build that was killed; removed" in done.stderr
    assert not (folder / "lock").exists()
    again = _kernel_run(tmp_path / "ext", timeout=60)  # and nothing is said when nothing is left
    assert again.returncode == 0 and "removed" not in again.stderr, again.stderr
    if _ext.fcntl is None:
        return
    import time

    # a build under way elsewhere (its flock held here): waited for, said so once, and the
    # process goes on once the lock is let go
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "LINMEM_CPU_KERNEL": "1",
           "OMP_NUM_THREADS": "1"}
    log = tmp_path / "waited.err"
    with open(folder / "linmem-build.lock", "a") as handle, open(log, "w") as err:
        _ext.fcntl.flock(handle, _ext.fcntl.LOCK_EX)
        waiting = subprocess.Popen([sys.executable, "-c", _KERNEL_FORWARD], env=env, stderr=err)
        deadline = time.monotonic() + 60
        while "waiting for another process" not in log.read_text():
            assert waiting.poll() is None, log.read_text()  # it must not go on while held
            assert time.monotonic() < deadline, "it never said that it waits"
            time.sleep(0.1)
        _ext.fcntl.flock(handle, _ext.fcntl.LOCK_UN)
        assert waiting.wait(timeout=60) == 0, log.read_text()
    assert log.read_text().count("waiting for another process that is building") == 1


@pytest.mark.slow
@pytest.mark.skipif(_ext.fcntl is None, reason="the flock lock is POSIX's; Windows has torch's")
def test_a_run_after_a_kill_during_the_first_build_finishes(tmp_path):
    """kill -9 of a first run during its kernel build (its own extension folder, so nothing
    else's build is touched), then a second run: it builds and finishes within the minute."""
    import signal
    import time

    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path / "ext"), "LINMEM_CPU_KERNEL": "1",
           "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen([sys.executable, "-c", _KERNEL_FORWARD], env=env,
                             stderr=subprocess.PIPE, start_new_session=True)
    lock = tmp_path / "ext" / _ext._build_name() / "lock"
    deadline = time.monotonic() + 60
    while not lock.exists() and time.monotonic() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert lock.exists(), "the first run never started its build"
    os.killpg(first.pid, signal.SIGKILL)  # the run and its compilers
    first.wait()
    assert lock.exists()  # what torch leaves
    started = time.monotonic()
    done = _kernel_run(tmp_path / "ext", timeout=120)
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 60 * 2  # 2 busy cores build in 20-60 s
    assert "was left by a build that was killed; removed" in done.stderr


@contextlib.contextmanager
def _small_disk(path: Path, size: str):
    """A tmpfs of ``size`` mounted at ``path`` (None where this machine may not mount one)."""
    path.mkdir()
    mounted = shutil.which("mount") is not None and subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
        capture_output=True).returncode == 0
    try:
        yield path if mounted else None
    finally:
        if mounted:
            subprocess.run(["umount", str(path)], check=True)


def _linmem(*args, limit_file_size: int | None = None) -> subprocess.CompletedProcess:
    """``linmem ARGS`` in a process of its own (one thread), files it writes capped at
    ``limit_file_size`` bytes (RLIMIT_FSIZE: a write past it fails with EFBIG) if given."""
    def cap():
        import resource

        resource.setrlimit(resource.RLIMIT_FSIZE, (limit_file_size, limit_file_size))

    return subprocess.run([sys.executable, "-m", "linmem", *map(str, args)],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=300, preexec_fn=cap if limit_file_size else None)


def test_a_disk_that_fills_during_training_is_one_line_and_loses_no_epoch(tmp_path, data_dir):
    """Epoch 1 written, then the disk fills (a small tmpfs, filled; where the machine may not
    mount one, a cap on the size of the files written): the resumed run ends in one line, exit
    1, its last good checkpoint kept, and --resume finishes a copy of it on another disk."""
    train = ["train", "--data", "jsb", "--model", "lmn-b", "--hidden", "8", "--memory", "6",
             "--batch-size", "8", "--data-dir", data_dir, "--quiet"]
    with _small_disk(tmp_path / "disk", "4m") as disk:
        run = (disk or tmp_path) / "run"
        first = _linmem(*train, "--epochs", "1", "--out", run)
        assert first.returncode == 0, first.stderr
        if disk is not None:
            with open(disk / "filler", "wb", buffering=0) as f:  # every page the tmpfs has left
                for chunk in (1 << 16, 1 << 12):
                    with contextlib.suppress(OSError):
                        while True:
                            f.write(b"\0" * chunk)
                # pages for the lock and config.json (rewritten by the resume), none for a
                # checkpoint
                assert (run / "last.pt").stat().st_size > 6 * 4096
                f.truncate(f.seek(0, os.SEEK_END) // 4096 * 4096 - 3 * 4096)
        failed = _linmem(*train, "--epochs", "3", "--resume", "--out", run,
                         limit_file_size=None if disk is not None else 1024)
        lines = [line for line in failed.stderr.splitlines() if line.strip()]
        assert failed.returncode == 1 and len(lines) == 1, failed.stderr
        assert "Traceback" not in failed.stderr
        why = "No space left on device" if disk is not None else "File too large"
        assert lines[0].startswith("linmem: error: ") and why in lines[0], lines[0]
        assert str(run) in lines[0]  # the file it could not write, named
        if disk is not None:
            assert "--resume continues a run" in lines[0]
        if disk is not None:  # epoch 2 trained, its checkpoint was what did not fit
            assert "last.pt" in lines[0] or "best.pt" in lines[0] or "log.jsonl" in lines[0]
        kept = torch.load(run / "last.pt", weights_only=False)
        assert kept["state"]["epoch"] == 1  # the last good checkpoint, whole
        assert not list(run.glob(".*.part"))  # no temporary file left on the full disk
        elsewhere = tmp_path / "elsewhere"
        shutil.copytree(run, elsewhere)
    done = _linmem(*train, "--epochs", "3", "--resume", "--out", elsewhere)
    assert done.returncode == 0, done.stderr
    assert json.loads((elsewhere / "metrics.json").read_text())["epochs"] == 3


def test_layer_input_errors():
    lmn = LMN(4, 5, 6)
    x = torch.rand(7, 0, 4, requires_grad=True)  # an empty batch, as torch.nn.RNN allows
    out, (h_n, _) = lmn(x)
    (out.sum() + h_n.sum()).backward()
    assert out.shape == (7, 0, 6) and x.grad.shape == x.shape
    assert all(p.grad is not None and not p.grad.any() for p in lmn.parameters())
    with pytest.raises(ValueError, match=r"h_0 must have shape \(1, 2, 5\)"):
        lmn(torch.rand(7, 2, 4), (torch.zeros(1, 2, 3), torch.zeros(1, 2, 6)))
    with pytest.raises(ValueError, match=r"h_\(t-1\) must have shape \(2, 5\)"):
        LMNCell(4, 5, 6)(torch.rand(2, 4), (torch.zeros(2, 3), torch.zeros(2, 6)))
    for dtype in (torch.float64, torch.uint8):
        with pytest.raises(TypeError, match=re.escape(f"input is {dtype}, the LMN's parameters "
                                                      "are torch.float32: convert")):
            lmn(torch.zeros(3, 2, 4, dtype=dtype))
    with pytest.raises(TypeError, match=re.escape("convert one of them (input.to(torch.float32)"
                                                  " or lmn.to(torch.float64))")):
        lmn(torch.zeros(3, 2, 4, dtype=torch.float64))
    with pytest.raises(TypeError, match=re.escape(  # an LMN of integers is no choice
            "convert it to a floating dtype (input.to(torch.float32))")):
        lmn(torch.zeros(3, 2, 4, dtype=torch.uint8))
    with pytest.raises(TypeError, match=re.escape(
            "memory state is torch.float64, the LMN's parameters are torch.float32: convert one "
            "of them (state.to(torch.float32) or lmn.to(torch.float64))")):
        lmn(torch.zeros(3, 2, 4), torch.zeros(1, 2, 6, dtype=torch.float64))


def test_metric_input_errors():
    probs, targets = torch.full((3, 4), 0.7), torch.ones(3, 4)
    with pytest.raises(ValueError, match="no valid frame"):
        frame_accuracy(probs[:0], targets[:0])
    with pytest.raises(ValueError, match="no valid frame"):
        frame_accuracy(probs, targets, mask=torch.zeros(3, dtype=torch.bool))
    with pytest.raises(ValueError, match="targets must be binary"):
        frame_accuracy(probs, torch.full((3, 4), 0.5))
    with pytest.raises(ValueError, match=r"threshold must be in \(0, 1\]"):
        frame_accuracy(probs, targets, threshold=2)
    assert frame_accuracy(probs, targets) == 1.0


@pytest.mark.slow
def test_the_installed_command_gives_one_line(tmp_path):
    """The same through the console script in its own process (no in-process shortcut)."""
    cmd = [sys.executable, "-m", "linmem", "train", *TINY, "--epochs", "1", "--device", "tpu",
           "--out", str(tmp_path / "run")]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines() == [
        "linmem: error: --device must be cpu, cuda or cuda:N, got 'tpu'"]
    assert not (tmp_path / "run").exists()


def test_devices_this_machine_lacks_are_one_line_before_anything_runs(tmp_path, data_dir,
                                                                      capsys):
    """A device this machine does not have (CUDA where there is none, or a GPU number past its
    last) is refused in one line by every command that takes --device, before any run, study or
    output exists; the forms torch accepts but the library does not run on are refused too."""
    from linmem._check import check_device, device_form

    missing = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    assert device_form("cpu:0") == torch.device("cpu") == check_device("cpu")
    assert device_form("cuda:3") == torch.device("cuda", 3)  # a config for another machine
    for bad in ("meta", "mps", "tpu", "cuda:x", 3):
        with pytest.raises(ValueError, match="device must be cpu, cuda or cuda:N"):
            check_device(bad)
    with pytest.raises(ValueError, match="was asked for"):
        check_device(missing)
    run = tmp_path / "run"
    code, _, err = run_cli("train", *TINY, "--epochs", "1", "--data-dir", data_dir, "--out", run,
                           capsys=capsys)
    assert code == 0, err
    for command in (("evaluate", run), ("first-updates", run, "--start", "random")):
        code, _, err = run_cli(*command, "--device", missing, capsys=capsys)
        assert_one_line_error(code, err, f"device '{missing}' was asked for")
    code, _, err = run_cli("evaluate", run, "--split", "test", "--device", "cpu:0", capsys=capsys)
    assert code == 0, err
    search = tmp_path / "search"
    code, _, err = run_cli("search", "--grid", "tiny", "--out", search, "--data-dir", data_dir,
                           "--device", missing, "--quiet", capsys=capsys)
    assert_one_line_error(code, err, f"device '{missing}' was asked for")
    assert not search.exists()  # no study was opened, no point failed for want of the device
