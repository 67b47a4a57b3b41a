"""Thread defaults of the ``linmem`` command (linmem._threads, linmem.cli.launch)."""

import os
import subprocess
import sys

from linmem import _threads


def test_defaults_fill_only_what_the_user_left_unset(monkeypatch):
    monkeypatch.setattr(_threads, "usable_cpus", lambda: 3)
    env = {}
    assert _threads.configure_threads(env) == {"GOMP_SPINCOUNT": "2000", "OMP_NUM_THREADS": "3"}
    assert env == {"GOMP_SPINCOUNT": "2000", "OMP_NUM_THREADS": "3"}
    for user in ({"OMP_WAIT_POLICY": "active"}, {"GOMP_SPINCOUNT": "9"}, {"KMP_BLOCKTIME": "0"}):
        env = dict(user, MKL_NUM_THREADS="1")
        assert _threads.configure_threads(env) == {}
        assert env == dict(user, MKL_NUM_THREADS="1")


def test_usable_cpus_respects_affinity_and_container_quota(tmp_path):
    affinity = len(os.sched_getaffinity(0))
    missing = tmp_path / "none"
    assert _threads.usable_cpus(str(missing)) == affinity
    quota = tmp_path / "cpu.max"
    quota.write_text("max 100000\n")
    assert _threads.usable_cpus(str(quota)) == affinity
    quota.write_text("50000 100000\n")  # half a CPU: one thread
    assert _threads.usable_cpus(str(quota)) == 1
    quota.write_text(f"{100000 * (affinity + 5)} 100000\n")  # more than the mask allows
    assert _threads.usable_cpus(str(quota)) == affinity
    quota.write_text("garbage")
    assert _threads.usable_cpus(str(quota)) == affinity


def test_the_command_sets_them_before_torch_loads():
    """``import linmem`` loads no torch (the names are lazy), so the launcher's settings reach
    torch's OpenMP runtime; the command's child processes see them."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY", "KMP_BLOCKTIME", "OMP_NUM_THREADS",
                        "MKL_NUM_THREADS")}
    code = ("import sys, os, linmem, linmem.cli.launch\n"
            "assert 'torch' not in sys.modules, 'torch imported early'\n"
            "linmem._threads.configure_threads()\n"
            "import torch\n"
            "print(os.environ['GOMP_SPINCOUNT'], torch.get_num_threads(),"
            " linmem._threads.usable_cpus(), linmem.LMN.__name__)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out[0] == "2000" and out[1] == out[2] and out[3] == "LMN"


def test_a_batch_1_training_runs_one_thread_unless_the_user_chose(tmp_path, data_dir):
    """``linmem train`` at batch 1 (the paper's protocol) trains with one thread where the thread
    count is the command's choice, and records it; at batch 32, or with OMP_NUM_THREADS set by
    the user, the count is left as it was."""
    import json

    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    cpus = _threads.usable_cpus()

    def trained_with(batch, extra_env=None):
        out = tmp_path / f"b{batch}-{bool(extra_env)}"
        subprocess.run([sys.executable, "-m", "linmem", "train", "--data", "jsb", "--data-dir",
                        str(data_dir), "--hidden", "6", "--memory", "5", "--epochs", "1",
                        "--batch-size", str(batch), "--out", str(out), "--quiet"],
                       env={**env, **(extra_env or {})}, check=True, capture_output=True)
        return json.loads((out / "metrics.json").read_text())["machine"]["threads"]

    assert trained_with(1) == 1
    assert trained_with(32) == cpus
    assert trained_with(1, {"OMP_NUM_THREADS": str(cpus)}) == cpus


def test_the_training_threads_are_the_commands_while_it_trains(monkeypatch):
    """One thread while a batch-1 training runs, the count before it after; nothing where the
    user chose the count, or at another batch size."""
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(_threads, "CHOSEN", {"OMP_NUM_THREADS": str(before)})
    with _threads.training_threads(1) as set_to:
        assert set_to == 1 and torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    for batch in (32, None):
        with _threads.training_threads(batch) as set_to:
            assert set_to is None and torch.get_num_threads() == before
    monkeypatch.setattr(_threads, "CHOSEN", {})  # the user's OMP_NUM_THREADS
    with _threads.training_threads(1) as set_to:
        assert set_to is None and torch.get_num_threads() == before
