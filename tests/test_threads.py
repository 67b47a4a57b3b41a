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
