"""Which implementation runs the recurrences (the LMN's, the ULM's, the baselines') on this
device: on the CPU a variant of the compiled kernel or the PyTorch loop (:func:`cpu_kernel_path`:
the fastest measured once per machine and build, :func:`measure_cpu_paths`; :func:`use_cpu_kernel`
chooses one inside a ``with`` block), on a CUDA device the fused Triton kernels or the loop
(:func:`gpu_kernel_path`, measured per size class). The choice is held here, process-wide, and
measured here: each path's forward and backward of the LMN's recurrence
(:mod:`linmem.ops.lmn_fills`, the calls the operator makes) timed side by side."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from linmem.ops import gpu as ops_gpu
from linmem.ops.cpu import LOOP, cpu_path, load_cpu_kernel, resolve_cpu_kernel
from linmem.ops.lmn_fills import (
    cpu_fills,
    gpu_backward,
    gpu_forward,
    loop_backward,
    loop_forward,
    scan_backward,
    scan_buffers,
)

__all__ = [
    "FUSED",
    "cpu_kernel_path",
    "fills_for",
    "fused_on_cpu",
    "gpu_kernel_path",
    "gpu_paths_taken",
    "kernel_for",
    "measure_cpu_paths",
    "measure_gpu_paths",
    "take_gpu_path",
    "use_cpu_kernel",
    "use_gpu_kernel",
]

_path_override: str | None = None  # set by use_cpu_kernel
FUSED = "fused"  # the GPU path of ops_gpu's Triton kernels
_gpu_override: bool | None = None  # set by use_gpu_kernel
_gpu_choices: dict[tuple, dict] = {}  # size class -> measured record
_gpu_taken: set[str] = set()  # the GPU paths the LMN's recurrence took in this process


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
    path = _path_override or cpu_path(measure_cpu_paths)
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
        _gpu_choices[key] = measure_gpu_paths(x_proj.device, batch, hidden, memory)
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


def fills_for(x: Tensor, memory: int):
    """``(forward, backward)`` that fill the LMN's states and state gradients for ``x`` here
    (:mod:`linmem.ops.lmn_fills`): the compiled CPU kernel, the fused GPU kernels, or the
    PyTorch loops, as the paths' choice says."""
    if x.device.type == "cuda":
        fused = take_gpu_path(x, memory) == FUSED
        return (gpu_forward, gpu_backward) if fused else (loop_forward, loop_backward)
    if x.device.type == "cpu":
        if fused_on_cpu(x):
            return gpu_forward, gpu_backward  # Triton's interpreter (tests)
        kernel = kernel_for(x)
        if kernel is not None:
            return cpu_fills(*kernel)
    return loop_forward, loop_backward


# ---------------------------------------------------------------------- timing the paths


def measure_cpu_paths(variants: list[str], repeats: int = 5) -> dict:
    """Time the recurrence's forward and backward (float32, this process's thread count)
    through every kernel variant and the PyTorch loop on a small and a large layer, best of
    ``repeats`` taken in turns (each round times every path once, after a round that warms them
    up: a burst of load from other processes slows the paths alike rather than the one timed
    then); with one thread the time is the process's CPU time, which the other processes'
    share of the cores does not count, else the wall time. The choice is the fastest variant
    that beats the loop at both sizes, else the loop. Used once per machine and build by
    :func:`linmem.ops.cpu.cpu_path`; takes about a second."""
    with torch.inference_mode(False), torch.no_grad():  # whatever context asked first
        return _measure_cpu_paths(variants, repeats)


_PATH_PROBLEMS = {"small": (32, 8, 50, 50), "large": (32, 32, 250, 250)}  # steps, batch, H, M


def _path_problem(steps: int, batch: int, hidden: int, memory: int) -> list[Tensor]:
    """The arguments of the LMN's recurrence (``x_proj, m0, weight_mh, weight_hm, weight_mm,
    bias_m``) that :func:`measure_cpu_paths` and :func:`measure_gpu_paths` time: float32
    whatever the default dtype (the paths measured take float32), seeded."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    return [randn(steps, batch, hidden), torch.zeros(batch, memory, dtype=torch.float32),
            randn(hidden, memory) * memory ** -0.5, randn(memory, hidden) * 0.5 * hidden ** -0.5,
            randn(memory, memory) * 0.5 * memory ** -0.5, torch.zeros(memory, dtype=torch.float32)]


def _cpu_path_fills(path: str):
    """The forward and backward fills of the CPU path ``path`` (a variant, or the loop)."""
    module = load_cpu_kernel() if path != LOOP else None
    return (loop_forward, loop_backward) if module is None else cpu_fills(module, path)


def _forward_backward(ops: list[Tensor], forward, backward) -> None:
    """The recurrence's forward and backward on ``ops`` by one path's fills: what the operator
    computes for ``(hs.sum() + ms.sum())``'s gradients with respect to every argument."""
    x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m = ops
    hs, ms, _ = scan_buffers(x_proj, m0.shape[1])
    forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, "tanh", hs, ms)
    scan_backward(torch.ones_like(hs), torch.ones_like(ms), m0, hs, ms, weight_mh, weight_hm,
                  weight_mm, "tanh", backward)


def _measure_cpu_paths(variants: list[str], repeats: int) -> dict:
    problems = _PATH_PROBLEMS
    seconds: dict[str, dict[str, float]] = {}
    threads = torch.get_num_threads()
    clock = time.process_time if threads == 1 else time.perf_counter
    for size, shape in problems.items():
        ops = _path_problem(*shape)
        best = dict.fromkeys((*variants, LOOP), math.inf)
        fills = {path: _cpu_path_fills(path) for path in best}
        for round_ in range(repeats + 1):  # round 0 warms the buffers up
            for path in best:
                start = clock()
                _forward_backward(ops, *fills[path])
                elapsed = clock() - start
                if round_:
                    best[path] = min(best[path], elapsed)
        for path, value in best.items():
            seconds.setdefault(path, {})[size] = value
    speedup = {v: min(seconds[LOOP][s] / seconds[v][s] for s in problems) for v in variants}
    fastest = max(variants, key=speedup.get, default=LOOP)  # no variant (no kernel): the loop
    return {"choice": fastest if speedup.get(fastest, 0.0) >= 1.0 else LOOP,
            "speedup_over_loop": speedup, "seconds": seconds,
            "problems": {k: dict(zip(("steps", "batch", "hidden", "memory"), v, strict=True))
                         for k, v in problems.items()},
            "threads": threads, "clock": "cpu" if threads == 1 else "wall",
            "torch": torch.__version__}


def measure_gpu_paths(device: torch.device, batch: int, hidden: int, memory: int,
                      steps: int = 64, repeats: int = 5) -> dict:
    """Time the recurrence's forward and backward (float32) through the fused kernels and the
    PyTorch loop at one size on ``device``, best of ``repeats`` taken in turns after a round
    that compiles and warms up: ``{"choice", "seconds", "problem"}``, the choice the faster."""
    with torch.inference_mode(False), torch.no_grad():
        ops = [t.to(device) for t in _path_problem(steps, batch, hidden, memory)]
        best = {FUSED: math.inf, LOOP: math.inf}
        fills = {FUSED: (gpu_forward, gpu_backward), LOOP: (loop_forward, loop_backward)}
        for round_ in range(repeats + 1):
            for path in best:
                torch.cuda.synchronize(device)
                start = time.perf_counter()
                _forward_backward(ops, *fills[path])
                torch.cuda.synchronize(device)
                elapsed = time.perf_counter() - start
                if round_:
                    best[path] = min(best[path], elapsed)
    return {"choice": FUSED if best[FUSED] <= best[LOOP] else LOOP, "seconds": best,
            "problem": {"steps": steps, "batch": batch, "hidden": hidden, "memory": memory},
            "torch": torch.__version__}
