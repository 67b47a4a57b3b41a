"""The LMN's recurrence on the GPU as two fused Triton kernels: the time loop runs inside them.

One launch computes eqs. (6)-(7) over all steps, one the state gradients of the backward over
all steps (the weight gradients stay large products over all steps, as on the CPU:
:func:`linmem.ops.lmn.lmn_scan_backward`). A program owns a tile of ``BLOCK_B`` batch rows for the
whole sequence; per step it reads the three recurrent matrices in ``BLOCK_N x BLOCK_K`` tiles
(from L2: they are the same for every step and every program) and the previous state from the
output buffer it wrote one step before, with a barrier between the phases of a step (the rows
of ``h_t`` that other threads of the program computed are read after it)::

    h_t = sigma(x_proj_t + m_{t-1} W^mh^T)                                   (6)
    m_t = b^m + m_{t-1} W^mm^T + h_t W^hm^T                                  (7)

    da_t = (dL/dh_t + dm_t W^hm) * sigma'(h_t)
    dm_{t-1} = dL/dm_{t-1} + da_t W^mh + dm_t W^mm

Products are IEEE float32 (``input_precision="ieee"``; TF32 only when
``torch.backends.cuda.matmul.allow_tf32`` asks for it): the memory is linear and compounds
rounding over thousands of steps. Sizes that are not multiples of a block are masked; the
buffers are time- or batch-major (strides are arguments), as :mod:`linmem.ops.lmn` lays them out.

Triton is optional (the ``gpu`` extra): :func:`available` says whether the kernels can run.
The same kernels run on CPU tensors under Triton's interpreter when ``TRITON_INTERPRET=1`` is set
before Triton is first imported (:func:`interpreting`), which is how they are tested without a
GPU. Which path a layer takes on a GPU (these kernels or the PyTorch loop) is measured on first
use: :func:`linmem.ops.paths.gpu_kernel_path`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor

__all__ = ["GPU_KERNEL_ENV", "available", "backward_states", "forward", "interpreting",
           "kernels", "read_choices", "tiles", "write_choices"]

GPU_KERNEL_ENV = "LINMEM_GPU_KERNEL"
_ACT = {"tanh": 0, "relu": 1, "selu": 2}


@functools.cache
def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


def available() -> bool:
    """Whether Triton is installed and ``LINMEM_GPU_KERNEL`` does not turn the kernels off."""
    if os.environ.get(GPU_KERNEL_ENV, "").strip().lower() in ("0", "loop"):
        return False
    return _triton() is not None


def interpreting() -> bool:
    """Whether Triton runs kernels by its interpreter in this process (``TRITON_INTERPRET=1``
    when Triton was first imported: its own library is made one way or the other then)."""
    found = _triton()
    return found is not None and bool(found[0].knobs.runtime.interpret)


def kernels() -> ModuleType:
    """The module of jitted kernels (``forward``, ``backward``; :mod:`linmem.ops.triton_lmn`)."""
    if _triton() is None:
        raise RuntimeError("the fused GPU kernels need Triton: pip install "
                           "'linear-memory-networks[gpu]'")
    from linmem.ops import triton_lmn as _lmn_triton

    return _lmn_triton


def _choice_file(gpu: str) -> Path:
    """Where the measured choices of a GPU model are recorded: beside Triton's cache of
    compiled kernels (``TRITON_CACHE_DIR``, else ``~/.triton/cache``)."""
    cache = os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache"
    digest = hashlib.sha256(gpu.encode()).hexdigest()[:12]
    return Path(cache) / f"linmem-gpu-choice-{digest}.json"


def read_choices(gpu: str) -> dict[tuple, dict]:
    """The recorded choices of ``gpu`` (its name), keyed ``(gpu, batch, hidden, memory)`` by
    size class; empty when none or unreadable (then they are measured again)."""
    try:
        records = json.loads(_choice_file(gpu).read_text())
        return {tuple(r["key"]): r for r in records if r.get("triton") == _triton_version()}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def write_choices(gpu: str, choices: dict[tuple, dict]) -> None:
    """Record ``choices`` of ``gpu``; a read-only cache keeps them for this process only."""
    from linmem._io import write_json

    records = [{**record, "key": list(key), "triton": _triton_version()}
               for key, record in choices.items() if key[0] == gpu]
    try:
        _choice_file(gpu).parent.mkdir(parents=True, exist_ok=True)
        write_json(_choice_file(gpu), records)
    except OSError:
        pass


def _triton_version() -> str | None:
    found = _triton()
    return None if found is None else found[0].__version__


def tiles(batch: int, hidden: int, memory: int, sms: int = 132) -> dict:
    """The kernels' tile sizes and form for a layer on a GPU of ``sms`` multiprocessors (132: an
    H100): one batch row per program while the programs fit the multiprocessors, else the
    fewest rows (2 or 4) that keep them within; the rows' products summed over k (``tl.dot``
    pads to 16 rows) up to there, 16 or 32 rows through ``tl.dot`` beyond. Measured on an H100
    at LMN-B(250, 250) (``results/cuda/tiles.txt``): one row per program trained 1.3x (batch 4)
    to 2.7x (batch 128) faster than tiles of 4 or 16 rows, 4 rows best at batch 512, the
    ``tl.dot`` tiles of 16 and 32 rows 2-3x slower at every batch to 512. 64-wide weight tiles
    (32 for small layers), Triton's default 4 warps. ``LINMEM_GPU_TILES`` (``B,N,K,dot`` or
    ``B,N,K,dot,warps``, e.g. ``16,64,64,1`` or ``1,64,128,0,8``) overrides them (benchmarks:
    at batch 4 a step costs about 100 us where the L2's bandwidth allows under 20, which points
    at the latency of the many small tile loads; larger tiles over more warps are the next
    sweep)."""
    forced = os.environ.get("LINMEM_GPU_TILES", "").strip()
    if forced:
        block_b, block_n, block_k, dot, *warps = (int(v) for v in forced.split(","))
        return {"BLOCK_B": block_b, "BLOCK_N": block_n, "BLOCK_K": block_k, "USE_DOT": bool(dot),
                "num_warps": warps[0] if warps else 4}
    width = 32 if max(hidden, memory) <= 64 else 64
    if batch <= 4 * sms:
        rows = 1
        while -(-batch // rows) > sms:
            rows *= 2
        return {"BLOCK_B": rows, "BLOCK_N": width, "BLOCK_K": 32, "USE_DOT": False,
                "num_warps": 4}
    return {"BLOCK_B": 16 if batch <= 16 * sms else 32, "BLOCK_N": width, "BLOCK_K": width,
            "USE_DOT": True, "num_warps": 4}


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """The multiprocessors of a CUDA device (132 elsewhere: the interpreter's CPU tensors)."""
    if device.type != "cuda":
        return 132
    return torch.cuda.get_device_properties(device).multi_processor_count


def _precision() -> str:
    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def _check(*tensors: Tensor) -> None:
    for t in tensors:
        if t.dtype != torch.float32:
            raise TypeError(f"the fused kernel takes float32, not {t.dtype}")
        if t.dim() and t.stride(-1) != 1:
            raise ValueError("the fused kernel needs a contiguous last dimension")


def forward(x_proj: Tensor, m0: Tensor, weight_mh: Tensor, weight_hm: Tensor,
            weight_mm: Tensor, bias_m: Tensor, nonlinearity: str, hs: Tensor, ms: Tensor) -> None:
    """Fill ``hs`` ``(T, B, H)`` and ``ms`` ``(T, B, M)`` (any time/batch strides, contiguous
    rows) with eqs. (6)-(7) in one launch."""
    steps, batch, hidden = x_proj.shape
    memory = m0.shape[1]
    if not steps or not batch:
        return
    weights = [w.contiguous() for w in (weight_mh, weight_hm, weight_mm, bias_m)]
    _check(x_proj, m0, *weights, hs, ms)
    blocks = tiles(batch, hidden, memory, _multiprocessors(hs.device))
    grid = (-(-batch // blocks["BLOCK_B"]),)
    kernels().forward[grid](
        x_proj, m0, *weights, hs, ms, steps, batch, hidden, memory,
        x_proj.stride(0), x_proj.stride(1), m0.stride(0), hs.stride(0), hs.stride(1),
        ms.stride(0), ms.stride(1), ACT=_ACT[nonlinearity], PRECISION=_precision(),
        enable_fp_fusion=True, **blocks)


def backward_states(grad_hs: Tensor | None, grad_ms: Tensor | None, hs: Tensor,
                    weight_mh: Tensor, weight_hm: Tensor, weight_mm: Tensor, nonlinearity: str,
                    grads: Tensor, grad_m0: Tensor) -> None:
    """Fill ``grads`` ``(T, B, H + M)`` with ``[dL/da_t, dL/dm_t]`` per step and ``grad_m0``
    with ``dL/dm_0``, in one launch (``grad_hs``/``grad_ms`` None: zero)."""
    steps, batch, hidden = hs.shape
    memory = grad_m0.shape[1]
    if grad_ms is None:
        grads[-1, :, hidden:] = 0
    else:
        grads[-1, :, hidden:] = grad_ms[-1]
    weights = [w.contiguous() for w in (weight_mh, weight_hm, weight_mm)]
    present = [t for t in (grad_hs, grad_ms) if t is not None]
    _check(hs, *weights, grads, grad_m0, *present)
    blocks = tiles(batch, hidden, memory, _multiprocessors(hs.device))
    grid = (-(-batch // blocks["BLOCK_B"]),)
    gh = grad_hs if grad_hs is not None else hs  # a pointer never read
    gm = grad_ms if grad_ms is not None else hs
    kernels().backward[grid](
        gh, gm, hs, *weights, grads, grad_m0, steps, batch, hidden, memory,
        gh.stride(0), gh.stride(1), gm.stride(0), gm.stride(1), hs.stride(0), hs.stride(1),
        grads.stride(0), grads.stride(1), grad_m0.stride(0),
        HAS_GH=grad_hs is not None, HAS_GM=grad_ms is not None, ACT=_ACT[nonlinearity],
        PRECISION=_precision(), enable_fp_fusion=True, **blocks)
