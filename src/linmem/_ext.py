"""The compiled CPU kernel of the LMN recurrence (``csrc/lmn_cpu.cpp``), built on first use.

The build is PyTorch's JIT C++ extension (a C++ compiler and ``ninja``; about 30 s once per
machine, cached under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``). It is compiled
for the CPU it runs on (``-march=native``), so the cache name carries the CPU's feature flags.
Set ``LINMEM_CPU_KERNEL=0`` to use the PyTorch loop instead; if the build fails, a warning says
why and the PyTorch loop is used.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("csrc") / "lmn_cpu.cpp"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _find_ninja() -> None:
    """Put the ``ninja`` of the ``ninja`` wheel on ``PATH`` when none is there."""
    if shutil.which("ninja") is None:
        try:
            import ninja
        except ImportError:
            return
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")


def _is_built(name: str) -> bool:
    try:  # a private helper of torch; if it moves, the message is merely printed every time
        from torch.utils.cpp_extension import _get_build_directory

        return any(Path(_get_build_directory(name, verbose=False)).glob(f"{name}*.so"))
    except Exception:
        return False


@functools.cache
def load_cpu_kernel() -> ModuleType | None:
    """The compiled module (``forward``, ``backward``), or ``None`` when disabled or unbuildable."""
    if os.environ.get("LINMEM_CPU_KERNEL", "1") == "0":
        return None
    import torch
    from torch.utils import cpp_extension

    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + _cpu_flags().encode() + torch.__version__.encode())
    name = f"linmem_lmn_cpu_{key.hexdigest()[:12]}"
    try:
        _find_ninja()
        if not _is_built(name):
            print("linmem: building the LMN's CPU kernel (once per machine, about 30 s)",
                  file=sys.stderr, flush=True)
        return cpp_extension.load(
            name=name, sources=[str(SOURCE)],
            extra_cflags=["-O3", "-march=native", "-fopenmp"], extra_ldflags=["-fopenmp"],
            verbose=False)
    except Exception as err:  # no compiler, no ninja, an unknown -march: fall back, say why
        warnings.warn(f"linmem: the compiled LMN kernel could not be built, the slower PyTorch "
                      f"loop is used ({type(err).__name__}: {str(err).strip()[-300:]})",
                      RuntimeWarning, stacklevel=2)
        return None
