"""Thread defaults for the command-line tool, set before torch starts its thread pool.

torch's OpenMP threads spin at every barrier (GNU OpenMP's default active wait). On a quiet
machine that saves a wake-up; beside another busy process it is a disaster: a thread spins
while the partner it waits for has been descheduled, and a training epoch takes 20-100x longer
where a fair share of the machine would cost 2x (``benchmarks/contention.py`` measures both).
The ``linmem`` command therefore lets a waiting thread spin only briefly before it sleeps
(``GOMP_SPINCOUNT=2000``, about 50 us, where GNU OpenMP's default spins 300000 times), and runs
one thread per CPU it may use (its affinity mask, capped by a container's CPU quota).

Measured with ``benchmarks/contention.py`` on the project's 2-core machine (LMN-B(250,250) and
LSTM(500) training, batch 32; results/speed/): beside one busy process torch's default keeps
17-31% of the quiet throughput, sleeping at once (``OMP_WAIT_POLICY=PASSIVE``) 60-70% but costs
15-20% on a quiet machine (a wake-up per parallel region), spin counts of 1000 / 2000 / 3000 keep
47-49% / 47% / 45% for the LMN at 2-7% / 0-3% / 0-10% quiet cost; 2000 is the choice.

A training at batch 1 (the paper's protocol) runs one thread where the user set no thread count
(:func:`training_threads`): a step's products are too small to share between threads, so a
second one only costs CPU, and beside another busy process time too (a JSB Chorales epoch of
LMN-B(250, 250) under the paper's protocol took 0.39-0.63 s with two threads against 0.33-0.44 s
with one on a quiet AMD EPYC Zen 5, and 1.03-1.21 s against 0.36-0.57 s beside a competing
process on the project's 2-core machine). The run records the count it trained with
(``metrics.json``'s ``machine.threads``).

A variable the user has set is never changed; the library itself (``import linmem``) changes
nothing, only the ``linmem`` command and the processes it starts.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
from collections.abc import Iterator, MutableMapping

__all__ = ["compute_threads", "configure_threads", "training_threads", "usable_cpus"]

# any of these means the user chose how OpenMP threads wait
_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
SPIN_COUNT = "2000"  # GNU OpenMP spin iterations before a waiting thread sleeps


def _cgroup_quota(path: str = "/sys/fs/cgroup/cpu.max") -> float | None:
    """The CPU quota of this process's cgroup (v2), in CPUs, or None when there is none."""
    try:
        quota, period = open(path).read().split()[:2]
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        return None


def usable_cpus(quota_file: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may use, at least 1: its affinity mask (``taskset``), capped by a
    container's CPU quota (``docker --cpus``), which OpenMP alone does not see."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    quota = _cgroup_quota(quota_file)
    if quota is not None:
        cpus = min(cpus, math.ceil(quota))
    return max(1, cpus)


def configure_threads(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set the command-line tool's OpenMP defaults in ``environ`` (default ``os.environ``) where
    the user set none: a short spin before a waiting thread sleeps, one thread per usable CPU.
    Must run before torch is imported to take effect in this process; child processes inherit
    it. Returns what it set."""
    env = os.environ if environ is None else environ
    chosen = {}
    if not any(name in env for name in _WAIT_VARIABLES):
        chosen["GOMP_SPINCOUNT"] = SPIN_COUNT
    if not any(name in env for name in _THREAD_VARIABLES):
        chosen["OMP_NUM_THREADS"] = str(usable_cpus())
    env.update(chosen)
    if environ is None:
        CHOSEN.update(chosen)
    return chosen


# what configure_threads set in this process's environment (the user set the rest)
CHOSEN: dict[str, str] = {}


@contextlib.contextmanager
def training_threads(batch_size: int | None) -> Iterator[int | None]:
    """While a ``linmem`` command trains at ``batch_size``: torch runs 1 thread at batch 1 where
    the thread count is the command's own choice (:func:`configure_threads`, not the user's),
    the count it had after; yields the count set, or None (nothing changed)."""
    if batch_size != 1 or "OMP_NUM_THREADS" not in CHOSEN:
        yield None
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield 1
    finally:
        torch.set_num_threads(before)


def compute_threads() -> int:
    """Threads for ``scipy.fft``, by the thread policy the rest of linmem follows: torch's
    thread count where torch runs in the process (a search worker's share of the CPUs), else
    ``OMP_NUM_THREADS``, else the CPUs this process may use."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return max(1, torch.get_num_threads())
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cpus()
