"""The compiled CPU kernel of the LMN recurrence (``csrc/``; the GRU, RNN and ULM recurrences too),
built on first use, and the choice of the path the CPU runs (measured on the LMN, taken by all).

The build is PyTorch's JIT C++ extension (a C++ compiler and the ``ninja`` of the ``ninja``
wheel; about 15 s once per machine and installed copy, cached under ``TORCH_EXTENSIONS_DIR``
or ``~/.cache/torch_extensions``; a build killed half-way is started again by the next use,
never waited on: :func:`_build_lock`). One build holds the kernel's loops compiled for every
instruction set of the architecture (on x86-64: AVX-512, AVX2 + FMA and the SSE2 baseline;
elsewhere the baseline), each with a register tile that fits that instruction set; the CPU says
at run time which it can execute (:func:`kernel_variants`).

Which path runs (:func:`cpu_path`): the first use on a machine measures the recurrence's
forward and backward through every variant the CPU runs and through the PyTorch loop, on a small
and a large layer, and picks the fastest path that is not slower than the loop at either size;
the measurement is recorded beside the build (``choice-<cpu>.json``) and read back afterwards.
One vocabulary names a path everywhere (:data:`CPU_KERNELS`: ``TrainConfig.cpu_kernel``,
``--cpu-kernel``, :func:`linmem.ops.paths.use_cpu_kernel` and ``LINMEM_CPU_KERNEL``): ``auto`` the
measured choice, ``best`` the best variant the CPU runs, ``loop`` the PyTorch loop, or a
variant's name (``avx512``, ``avx2``, ``generic``); :func:`resolve_cpu_kernel` says what a name
means on this CPU. ``LINMEM_CPU_KERNEL`` forces a path for the whole process (``0`` and ``1``
are short for ``loop`` and ``best``). If the build fails (no compiler, say), one warning line
says why and the PyTorch loop is used; the failure is remembered beside the build, so that
later processes do not try again until the compiler or ninja changes (or the file is deleted).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import torch

from linmem._io import cpu_description, machine, write_json

try:
    import fcntl
except ImportError:  # Windows: torch's own lock alone
    fcntl = None

__all__ = ["CPU_KERNELS", "KERNEL_ENV", "VARIANTS", "cpu_path", "kernel_variants",
           "load_cpu_kernel", "resolve_cpu_kernel"]

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("lmn_cpu.cpp", "lmn_kernel_avx512.cpp", "lmn_kernel_avx2.cpp", "lmn_kernel_generic.cpp")
HEADERS = ("lmn_kernel.h", "lmn_kernel_api.h")
CFLAGS = ("-O3", "-fopenmp")
KERNEL_ENV = "LINMEM_CPU_KERNEL"
LOOP = "loop"
VARIANTS = ("avx512", "avx2", "generic")  # the kernel's builds, best first
CPU_KERNELS = ("auto", "best", LOOP, *VARIANTS)  # the names of a CPU path
_ENV_SHORT = {"0": LOOP, "1": "best"}
FAILED_MARKER = "build-failed.json"  # beside the build: the error and the toolchain it had


@functools.cache
def _build_name() -> str:
    """The extension's name: a hash of its sources, their folder, the flags and the torch
    version. The build is the same on every CPU of an architecture (no ``-march=native``), so
    the CPU is not part of it. Its commands name the sources by path: two checkouts sharing one
    build folder would rebuild it from each other's at each process's first use (20 s each), and
    a process of one could load the library while the other rewrites it; so each folder of
    sources has a build of its own."""
    digest = hashlib.sha256(str(CSRC.resolve()).encode())
    for name in (*SOURCES, *HEADERS):
        digest.update((CSRC / name).read_bytes())
    digest.update(" ".join(CFLAGS).encode() + torch.__version__.encode()
                  + platform.machine().encode())
    return f"linmem_lmn_cpu_{digest.hexdigest()[:12]}"


def _wheel_ninja_first() -> None:
    """Put the ``ninja`` wheel's binary first on ``PATH``: a build directory made by one ninja
    version is rebuilt from scratch by another, so the same one must run every time."""
    try:
        import ninja  # a dependency, but the kernel also builds with a system ninja
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if not path.startswith(ninja.BIN_DIR + os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path


def _build_directory(name: str) -> Path | None:
    try:  # a private helper of torch; if it moves, the build message is printed every time
        from torch.utils.cpp_extension import _get_build_directory

        return Path(_get_build_directory(name, verbose=False))
    except Exception:
        return None


@contextlib.contextmanager
def _build_lock(directory: Path | None) -> Iterator[None]:
    """Held around torch's build: an ``flock`` on ``linmem-build.lock``, which the system drops
    when its holder dies. torch's own lock (the file ``lock``) survives a SIGKILL, and every
    later load would wait on it forever, silently; under this lock that file can only be left by
    a build that was killed, so it is removed. A process that finds another building says so
    once and waits for it."""
    if directory is None or fcntl is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "linmem-build.lock", "a") as handle:
        started, told = time.monotonic(), False
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not told and time.monotonic() - started > 2:
                    print(f"linmem: waiting for another process that is building the LMN's CPU "
                          f"kernel in {directory}", file=sys.stderr, flush=True)
                    told = True
                time.sleep(0.1)
        try:
            stale = directory / "lock"
            if stale.exists():
                print(f"linmem: {stale} was left by a build that was killed; removed",
                      file=sys.stderr, flush=True)
                stale.unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _toolchain() -> dict[str, list | None]:
    """What a build needs besides the sources: the C++ compiler torch calls (``CXX``, else
    ``c++``) and ``ninja``, each as its path and modification time (None: not found)."""
    tools = {}
    for tool in (os.environ.get("CXX", "c++"), "ninja"):
        path = shutil.which(tool)
        tools[tool] = None if path is None else [path, os.stat(path).st_mtime]
    return tools


def _remembered_failure(marker: Path | None, tools: dict) -> str | None:
    """The error of the last build that failed with this very toolchain (``marker``, written
    beside the build), or None: a build is tried once per installed copy and toolchain."""
    if marker is None or not marker.is_file():
        return None
    try:
        failed = json.loads(marker.read_text())
    except (OSError, ValueError):
        return None
    return failed.get("error") if failed.get("toolchain") == tools else None


def _kernel_warning(why: str, marker: Path | None) -> None:
    retry = f"; to try again, delete {marker}" if marker is not None else ""
    warnings.warn(f"linmem: the compiled LMN kernel is not built here ({why}): the slower "
                  f"PyTorch loop runs{retry}", RuntimeWarning, stacklevel=3)


@functools.cache
def load_cpu_kernel() -> ModuleType | None:
    """The compiled module (``forward``, ``backward``, ``variants``), or ``None`` when
    ``LINMEM_CPU_KERNEL=0`` or the build fails: one warning line says why, and the failure is
    remembered beside the build (:data:`FAILED_MARKER`), so that later processes do not try
    again with the same compiler and ninja (a new or changed one, or the file deleted, does)."""
    if _forced() == LOOP:
        return None
    name = _build_name()
    _wheel_ninja_first()
    directory = _build_directory(name)
    marker = None if directory is None else directory / FAILED_MARKER
    tools = _toolchain()
    remembered = _remembered_failure(marker, tools)
    if remembered is not None:
        _kernel_warning(f"it failed before with this compiler: {remembered}", marker)
        return None
    compiler = os.environ.get("CXX", "c++")
    try:
        if tools[compiler] is None:
            raise FileNotFoundError(f"no C++ compiler: {compiler!r} is not on PATH")
        if directory is None or not any(directory.glob(f"{name}*.so")):
            print("linmem: building the LMN's CPU kernel (once per machine and installed copy, "
                  "about 15 s)", file=sys.stderr, flush=True)
        from torch.utils import cpp_extension  # here: it imports setuptools (0.2 s)

        with _build_lock(directory), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            module = cpp_extension.load(
                name=name, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=list(CFLAGS),
                extra_ldflags=["-fopenmp"], verbose=False)
        for w in caught:  # a build that worked: torch's warnings as they were
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        return module
    except Exception as err:  # no compiler, no ninja: fall back, say why, remember it
        why = f"{type(err).__name__}: {' '.join(str(err).split())[-300:]}"
        if marker is not None:
            with contextlib.suppress(OSError):
                marker.parent.mkdir(parents=True, exist_ok=True)
                write_json(marker, {"error": why, "toolchain": tools,
                                    "when": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
        _kernel_warning(why, marker)
        return None


def _forced() -> str:
    """``LINMEM_CPU_KERNEL``'s name of a path (``auto`` when unset), short forms expanded."""
    value = os.environ.get(KERNEL_ENV, "").strip().lower() or "auto"
    return _ENV_SHORT.get(value, value)


def resolve_cpu_kernel(name: str) -> str | None:
    """The path that ``name`` (one of :data:`CPU_KERNELS`) asks for on this CPU: a variant's
    name or ``"loop"``; None for ``"auto"`` (:func:`cpu_path`'s choice). ``best`` without a
    kernel is the loop; a name outside :data:`CPU_KERNELS`, or a variant this CPU cannot run,
    is a ``ValueError``."""
    if name not in CPU_KERNELS:
        raise ValueError(f"unknown CPU kernel {name!r}: expected one of {', '.join(CPU_KERNELS)}")
    if name in ("auto", LOOP):
        return None if name == "auto" else LOOP
    variants = kernel_variants()
    if name == "best":
        return variants[0] if variants else LOOP
    if name not in variants:
        raise ValueError(f"the kernel variant {name!r} does not run here; this CPU runs "
                         f"{variants or 'none (no kernel)'}")
    return name


def kernel_variants() -> list[str]:
    """The kernel's variants this CPU can run, best first (empty without a kernel)."""
    module = load_cpu_kernel()
    return list(module.variants()) if module is not None else []


def _choice_file() -> Path | None:
    directory = _build_directory(_build_name())
    if directory is None:
        return None
    cpu = hashlib.sha256(cpu_description().encode()).hexdigest()[:12]
    return directory / f"choice-{cpu}.json"


Measure = Callable[[list[str]], dict]


@functools.cache
def cpu_path(measure: Measure | None = None) -> str:
    """The path the LMN recurrence takes on this CPU: a kernel variant's name or ``"loop"``.

    ``LINMEM_CPU_KERNEL`` decides when set (see the module's docstring); otherwise the choice
    recorded beside the build, or, on the first use, ``measure(variants)`` (a record whose
    ``"choice"`` is the path; :func:`linmem.ops.paths.measure_cpu_paths`), which is then recorded.
    """
    forced = _forced()
    if forced not in CPU_KERNELS:
        raise ValueError(f"{KERNEL_ENV}={forced!r}: expected one of {', '.join(CPU_KERNELS)} "
                         f"(or 0, 1)")
    variants = kernel_variants()
    if not variants:
        return LOOP
    if forced != "auto":
        try:
            return resolve_cpu_kernel(forced)
        except ValueError as err:
            raise ValueError(f"{KERNEL_ENV}={forced!r}: {err}") from None
    path = _choice_file()
    if path is not None and path.is_file():
        try:
            record = json.loads(path.read_text())
            if record.get("choice") in (*variants, LOOP):
                return record["choice"]
        except (OSError, ValueError):
            pass  # unreadable: measure again
    if measure is None:
        return variants[0]
    record = measure(variants)
    record["cpu"] = machine()["cpu"]
    if path is not None:
        try:
            write_json(path, record)
        except OSError:
            pass  # a read-only cache: the choice holds for this process
    return record["choice"]
