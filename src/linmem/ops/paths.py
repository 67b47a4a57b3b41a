"""Which implementation runs the recurrences (the LMN's, the ULM's, the baselines') on this
device: on the CPU a variant of the compiled kernel or the PyTorch loop (:func:`cpu_kernel_path`:
the fastest measured once per machine and build, :func:`measure_cpu_paths`; :func:`use_cpu_kernel`
chooses one inside a ``with`` block), on a CUDA device the fused Triton kernels or the loop
(:func:`gpu_kernel_path`, measured per size class). The choice is held here, process-wide."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from linmem.ops import gpu as ops_gpu
from linmem.ops.cpu import LOOP, cpu_path, load_cpu_kernel, resolve_cpu_kernel

__all__ = ["FUSED", "cpu_kernel_path", "fused_on_cpu", "gpu_kernel_path", "gpu_paths_taken",
           "kernel_for", "register_measures", "take_gpu_path", "use_cpu_kernel", "use_gpu_kernel"]

_path_override: str | None = None  # set by use_cpu_kernel
FUSED = "fused"  # the GPU path of ops_gpu's Triton kernels
_gpu_override: bool | None = None  # set by use_gpu_kernel
_gpu_choices: dict[tuple, dict] = {}  # size class -> measured record
_gpu_taken: set[str] = set()  # the GPU paths the LMN's recurrence took in this process
# how the paths are timed: the operator's module hands its measurements in (register_measures)
_measures: dict[str, Callable[..., dict]] = {}


def register_measures(cpu: Callable[[list[str]], dict], gpu: Callable[..., dict]) -> None:
    """How the paths are chosen: ``cpu(variants)`` times the CPU's (its record's ``"choice"``,
    :func:`linmem.ops.cpu.cpu_path`), ``gpu(device, batch, hidden, memory)`` a CUDA device's.
    :mod:`linmem.ops.lmn` registers its own on import (they run its operator, which is above
    this module); until then the CPU takes its best variant, untimed."""
    _measures.update(cpu=cpu, gpu=gpu)


@contextlib.contextmanager
def use_cpu_kernel(kernel: str | bool | None = "best") -> Iterator[None]:
    """Take the CPU path ``kernel`` names inside the ``with`` block: one of
    :data:`linmem.ops.cpu.CPU_KERNELS` (``"best"`` the best variant this CPU runs, ``"loop"``
    the PyTorch loop, a variant's name, ``"auto"`` the measured choice,
    :func:`linmem.ops.cpu.resolve_cpu_kernel`); ``True``, ``False`` and ``None`` are short for
    ``"best"``, ``"loop"`` and ``"auto"``. All compute the same function (tested); the switch is
    process-wide, for comparisons and benchmarks."""
    global _path_override
    name = {True: "best", False: LOOP, None: "auto"}.get(kernel, kernel)
    path = resolve_cpu_kernel(name)
    previous, _path_override = _path_override, path
    try:
        yield
    finally:
        _path_override = previous


def _cpu_choice() -> tuple[str, Any]:
    """``(path, module)``: the CPU path now (:func:`use_cpu_kernel`'s choice inside its block,
    else :func:`linmem.ops.cpu.cpu_path`'s) and the compiled kernel that runs it, or ``("loop",
    None)`` where the choice is the loop or the kernel did not build."""
    path = _path_override or cpu_path(_measures.get("cpu"))
    module = load_cpu_kernel() if path != LOOP else None
    return (LOOP, None) if module is None else (path, module)


def cpu_kernel_path() -> str:
    """The path the recurrences take on the CPU now: a kernel variant's name or ``"loop"``."""
    return _cpu_choice()[0]


def kernel_for(x: Tensor):
    """``(module, variant)`` when the compiled kernel runs ``x`` (CPU, float32/float64), else
    ``None`` (the PyTorch loop)."""
    if x.device.type != "cpu" or x.dtype not in (torch.float32, torch.float64):
        return None
    path, module = _cpu_choice()
    return None if module is None else (module, path)


# ------------------------------------------------------------------------- the GPU's path


@contextlib.contextmanager
def use_gpu_kernel(enabled: bool | None = True) -> Iterator[None]:
    """Choose the LMN's GPU path inside the ``with`` block: ``True`` the fused Triton kernels
    (:mod:`linmem.ops.gpu`), ``False`` the PyTorch loop, ``None`` the measured choice
    (:func:`gpu_kernel_path`). Under Triton's interpreter (``TRITON_INTERPRET=1``), ``True`` also
    runs the fused kernels on CPU tensors: how they are tested without a GPU. The fused kernels
    take float32: ``True`` with another dtype is a ``TypeError`` (``None`` runs the loop)."""
    global _gpu_override
    if enabled and not ops_gpu.available():
        raise RuntimeError("the fused GPU kernels need Triton (pip install "
                           "'linear-memory-networks[gpu]') and LINMEM_GPU_KERNEL not 0")
    previous, _gpu_override = _gpu_override, enabled
    try:
        yield
    finally:
        _gpu_override = previous


def _size_class(n: int) -> int:
    """The power of two at or above ``n``: one measured choice per class of sizes."""
    return 1 << max(0, n - 1).bit_length()


def gpu_kernel_path(x_proj: Tensor, memory: int) -> str:
    """The path the LMN's recurrence takes for ``x_proj`` ``(T, B, H)`` on a CUDA device:
    :data:`FUSED` or ``"loop"``. :func:`use_gpu_kernel`'s choice inside its block; else the
    loop for anything but float32 or without Triton (``LINMEM_GPU_KERNEL=0`` too); else the
    faster path measured on the first use of each size class (batch, hidden and memory sizes
    rounded up to powers of two) on this device, recorded beside Triton's cache
    (``gpu-choice-<gpu>.json``) and read back afterwards."""
    if _gpu_override is not None:
        return FUSED if _gpu_override else LOOP
    if x_proj.dtype != torch.float32 or not ops_gpu.available():
        return LOOP
    batch, hidden = x_proj.shape[1:]
    key = (torch.cuda.get_device_name(x_proj.device), _size_class(batch),
           _size_class(hidden), _size_class(memory))
    if key not in _gpu_choices:
        _gpu_choices.update(ops_gpu.read_choices(key[0]))
    if key not in _gpu_choices:
        _gpu_choices[key] = _measures["gpu"](x_proj.device, batch, hidden, memory)
        ops_gpu.write_choices(key[0], _gpu_choices)
    return _gpu_choices[key]["choice"]


def take_gpu_path(x_proj: Tensor, memory: int) -> str:
    """:func:`gpu_kernel_path` of ``x_proj``, recorded as taken (:func:`gpu_paths_taken`)."""
    path = gpu_kernel_path(x_proj, memory)
    _gpu_taken.add(path)
    return path


def fused_on_cpu(x: Tensor) -> bool:
    """Whether the fused GPU kernels run ``x``, a CPU tensor, under Triton's interpreter
    (``TRITON_INTERPRET=1`` inside ``use_gpu_kernel(True)``): how the tests run them without a
    GPU."""
    return bool(_gpu_override) and ops_gpu.interpreting() and x.dtype == torch.float32


def gpu_paths_taken(clear: bool = False) -> list[str]:
    """The GPU paths the LMN's recurrence took in this process since the last ``clear``
    (``metrics.json`` records those of its run)."""
    taken = sorted(_gpu_taken)
    if clear:
        _gpu_taken.clear()
    return taken
