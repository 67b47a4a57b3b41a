"""The LMN's recurrence as a registered PyTorch operator, its implementations and references.

Eqs. (6)-(7) over all steps, given the input term ``x_proj_t = W^xh x_t + b^h``::

    h_t = sigma(x_proj_t + m_{t-1} W^mh^T)                (6)
    m_t = b^m + m_{t-1} W^mm^T + h_t W^hm^T                (7)

``linmem::lmn_scan`` (:func:`lmn_scan`) and its backward ``linmem::lmn_scan_backward`` are
operators of ``torch.library``: a schema, a fake implementation for shapes (symbolic batch and
time), the backward tied with ``register_autograd``, and one implementation per device, the
compiled kernel on the CPU (:mod:`linmem.ops.cpu`, the variant :func:`cpu_kernel_path` names) and
the PyTorch loop elsewhere. So ``torch.compile(fullgraph=True)``, ``torch.export`` and
``torch.func`` see one opaque operator where they saw a Python autograd function.

Forward, per step, in-place products into buffers laid out like ``x_proj`` (time- or
batch-major), so that nothing is copied before the readout. Backward, per step: ``dm_t`` (from
the output and from step ``t + 1``), ``da_t = (dm_t W^hm + dh_t) * sigma'``, ``dm_{t-1} = [da_t,
dm_t] [W^mh; W^mm]``; the weight gradients are then large products over all steps at once.
When a graph of the gradient is asked for (``create_graph``: double backward, ``torch.func``)
the backward is :func:`lmn_scan_backward_ref`, the same equations in differentiable PyTorch ops.
The ONNX exporter sees :func:`lmn_scan_onnx` instead (PyTorch's ``scan``, an ONNX ``Scan``).

:func:`lmn_scan_ref` and :func:`lmn_scan_backward_ref` are the references every path is tested
against (mamba's ``*_ref`` beside each op).
"""

from __future__ import annotations

import functools
import math
import time

import torch
from torch import Tensor

from linmem.ops import gpu as ops_gpu
from linmem.ops.cpu import LOOP
from linmem.ops.paths import (
    FUSED,
    cpu_kernel_path,
    fused_on_cpu,
    gpu_kernel_path,
    gpu_paths_taken,
    kernel_for,
    register_measures,
    take_gpu_path,
    use_cpu_kernel,
    use_gpu_kernel,
)

__all__ = [
    "FUSED",
    "KERNEL_CODES",
    "NONLINEARITIES",
    "activate",
    "activation_grad",
    "by_device",
    "check_nonlinearity",
    "cpu_kernel_path",
    "eager_function",
    "gpu_kernel_path",
    "gpu_paths_taken",
    "lagged_product",
    "lmn_scan",
    "lmn_scan_backward",
    "lmn_scan_backward_ref",
    "lmn_scan_onnx",
    "lmn_scan_ref",
    "measure_cpu_paths",
    "measure_gpu_paths",
    "rows",
    "scan",
    "through_reference",
    "use_cpu_kernel",
    "use_gpu_kernel",
]

NONLINEARITIES = ("tanh", "relu", "selu")


def check_nonlinearity(name: str) -> None:
    """A ``ValueError`` naming the choices unless ``name`` is one of :data:`NONLINEARITIES`."""
    if name not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {list(NONLINEARITIES)}, got {name!r}")


SELU_SCALE, SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717

KERNEL_CODES = {"tanh": 0, "relu": 1, "selu": 2}  # csrc/lmn_kernel_api.h's Nonlinearity


# ------------------------------------------------------------- timing the paths (ops.paths)


def measure_cpu_paths(variants: list[str], repeats: int = 5) -> dict:
    """Time the recurrence's forward and backward (float32, this process's thread count)
    through every kernel variant and the PyTorch loop on a small and a large layer, best of
    ``repeats`` taken in turns (each round times every path once, after a round that warms them
    up: a burst of load from other processes slows the paths alike rather than the one timed
    then); with one thread the time is the process's CPU time, which the other processes'
    share of the cores does not count, else the wall time. The choice is the fastest variant
    that beats the loop at both sizes, else the loop. Used once per machine and build by
    :func:`linmem.ops.cpu.cpu_path`; takes about a second."""
    with torch.inference_mode(False), torch.enable_grad():  # whatever context asked first
        return _measure_cpu_paths(variants, repeats)


_PATH_PROBLEMS = {"small": (32, 8, 50, 50), "large": (32, 32, 250, 250)}  # steps, batch, H, M


def _path_problem(steps: int, batch: int, hidden: int, memory: int) -> list[Tensor]:
    """The arguments of :func:`lmn_scan` that :func:`measure_cpu_paths` and
    :func:`measure_gpu_paths` time: float32 whatever the default dtype (the paths measured take
    float32), seeded, requiring gradients."""
    g = torch.Generator().manual_seed(0)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g, dtype=torch.float32)

    ops = [randn(steps, batch, hidden), torch.zeros(batch, memory, dtype=torch.float32),
           randn(hidden, memory) * memory ** -0.5, randn(memory, hidden) * 0.5 * hidden ** -0.5,
           randn(memory, memory) * 0.5 * memory ** -0.5, torch.zeros(memory, dtype=torch.float32)]
    return [t.requires_grad_() for t in ops]


def _measure_cpu_paths(variants: list[str], repeats: int) -> dict:
    problems = _PATH_PROBLEMS
    seconds: dict[str, dict[str, float]] = {}
    threads = torch.get_num_threads()
    clock = time.process_time if threads == 1 else time.perf_counter
    for size, shape in problems.items():
        ops = _path_problem(*shape)
        best = dict.fromkeys((*variants, LOOP), math.inf)
        for round_ in range(repeats + 1):  # round 0 warms the buffers up
            for path in best:
                with use_cpu_kernel(path if path != LOOP else False):
                    start = clock()
                    hs, ms = lmn_scan(*ops, "tanh")
                    torch.autograd.grad((hs.sum(), ms.sum()), ops)
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
    with torch.inference_mode(False), torch.enable_grad():
        ops = [t.detach().to(device).requires_grad_()
               for t in _path_problem(steps, batch, hidden, memory)]
        best = {FUSED: math.inf, LOOP: math.inf}
        for round_ in range(repeats + 1):
            for path in best:
                with use_gpu_kernel(path == FUSED):
                    torch.cuda.synchronize(device)
                    start = time.perf_counter()
                    hs, ms = lmn_scan(*ops, "tanh")
                    torch.autograd.grad((hs.sum(), ms.sum()), ops)
                    torch.cuda.synchronize(device)
                    elapsed = time.perf_counter() - start
                if round_:
                    best[path] = min(best[path], elapsed)
    return {"choice": FUSED if best[FUSED] <= best[LOOP] else LOOP, "seconds": best,
            "problem": {"steps": steps, "batch": batch, "hidden": hidden, "memory": memory},
            "torch": torch.__version__}


register_measures(measure_cpu_paths, measure_gpu_paths)


@functools.cache
def _cpu_fills(module, variant):
    """The compiled CPU kernel's forward and backward in the loops' signatures (made once per
    variant: the path is chosen at every call)."""

    def forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms):
        module.forward(rows(x_proj), rows(m0), weight_mh, weight_hm, weight_mm,
                       bias_m.contiguous(), KERNEL_CODES[nonlinearity], hs, ms, variant)

    def backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
                 grad_m0):
        module.backward(rows(grad_hs), rows(grad_ms), hs, weight_mh, weight_hm, weight_mm,
                        KERNEL_CODES[nonlinearity], grads, grad_m0, variant)

    return forward, backward


def _gpu_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms):
    ops_gpu.forward(rows(x_proj), rows(m0), weight_mh, weight_hm, weight_mm, bias_m,
                    nonlinearity, hs, ms)


def _gpu_backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
                  grad_m0):
    ops_gpu.backward_states(rows(grad_hs), rows(grad_ms), hs, weight_mh, weight_hm,
                            weight_mm, nonlinearity, grads, grad_m0)


def _lmn_fills(x: Tensor, memory: int):
    """``(forward, backward)`` that fill the LMN's states and state gradients for ``x`` here:
    the compiled CPU kernel, the fused GPU kernels, or the PyTorch loops."""
    if x.device.type == "cuda":
        fused = take_gpu_path(x, memory) == FUSED
        return (_gpu_forward, _gpu_backward) if fused else (_loop_forward, _loop_backward)
    if x.device.type == "cpu":
        if fused_on_cpu(x):
            return _gpu_forward, _gpu_backward  # Triton's interpreter (tests)
        kernel = kernel_for(x)
        if kernel is not None:
            return _cpu_fills(*kernel)
    return _loop_forward, _loop_backward


def rows(t: Tensor | None) -> Tensor | None:
    """``t`` with a contiguous last dimension (the kernel's only layout requirement)."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()



def _batch_major(steps: Tensor) -> bool:
    """Whether a ``(T, B, n)`` tensor is a view of ``(B, T, n)`` memory (``batch_first``)."""
    return steps.shape[1] > 1 and steps.transpose(0, 1).is_contiguous()


def _new_steps(like: Tensor, width: int, batch_major: bool) -> Tensor:
    """An uninitialised ``(T, B, width)`` buffer, stored ``(B, T, width)`` when ``batch_major``."""
    steps, batch = like.shape[:2]
    if batch_major:
        return like.new_empty(batch, steps, width).transpose(0, 1)
    return like.new_empty(steps, batch, width)


def _flat(steps: Tensor, batch_major: bool) -> Tensor:
    """``(T, B, n)`` -> ``(T * B, n)`` in memory order, a view for buffers of :func:`_new_steps`."""
    return (steps.transpose(0, 1) if batch_major else steps).reshape(-1, steps.shape[2])


def lagged_product(g: Tensor, ms: Tensor, m0: Tensor, batch_major: bool) -> Tensor:
    """``sum_t g_t^T m_{t-1}`` with ``m_{-1} = m0``: large products over all steps at once.

    In memory order the row before ``(t, b)`` is ``(t - 1, b)`` for time-major buffers (shift by
    ``B`` rows); for batch-major ones it is ``(t - 1, b)`` except at ``t = 0``, where it is the
    last step of sequence ``b - 1``: those ``B - 1`` pairs are subtracted again.
    """
    steps, batch = g.shape[:2]
    out = g[0].t() @ m0
    if steps == 1:
        return out
    gf, mf = _flat(g, batch_major), _flat(ms, batch_major)
    if batch_major:
        out += gf[1:].t() @ mf[:-1]
        out -= g[0, 1:].t() @ ms[-1, :-1]
    else:
        out += gf[batch:].t() @ mf[:-batch]
    return out


def _loop_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms):
    """The forward loop of :func:`lmn_scan` in PyTorch ops (CUDA, other dtypes): fills ``hs``
    and ``ms``."""
    w_mh_t, w_mm_t, w_hm_t = (w.t().contiguous() for w in (weight_mh, weight_mm, weight_hm))
    m = m0
    for x_t, h_t, m_t in zip(x_proj.unbind(0), hs.unbind(0), ms.unbind(0), strict=True):
        torch.addmm(x_t, m, w_mh_t, out=h_t)
        if nonlinearity == "tanh":
            h_t.tanh_()                                                   # (6)
        elif nonlinearity == "relu":
            h_t.clamp_min_(0.0)
        else:
            torch.selu_(h_t)
        torch.addmm(bias_m, m, w_mm_t, out=m_t).addmm_(h_t, w_hm_t)       # (7)
        m = m_t


def _loop_backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
                   grad_m0):
    """The backward loop of :func:`lmn_scan` in PyTorch ops: fills ``grads`` (``[dL/da_t,
    dL/dm_t]`` per step) and ``grad_m0``."""
    steps, hidden = hs.shape[0], hs.shape[2]
    w_bwd = torch.cat([weight_mh, weight_mm], 0)  # (H + M, M)
    if grad_ms is None:
        grads[-1, :, hidden:] = 0
    else:
        grads[-1, :, hidden:] = grad_ms[-1]
    g_t, h_t = grads.unbind(0), hs.unbind(0)
    for t in range(steps - 1, -1, -1):
        da, dm = g_t[t][:, :hidden], g_t[t][:, hidden:]
        if grad_hs is None:
            torch.mm(dm, weight_hm, out=da)
        else:
            torch.addmm(grad_hs[t], dm, weight_hm, out=da)
        if nonlinearity == "tanh":  # da *= 1 - h_t^2, in one kernel
            torch.ops.aten.tanh_backward.grad_input(da, h_t[t], grad_input=da)
        elif nonlinearity == "relu":
            da.masked_fill_(h_t[t] <= 0, 0.0)
        else:  # selu' = scale for h > 0, h + scale * alpha below
            da.mul_(torch.where(h_t[t] > 0, SELU_SCALE, h_t[t] + SELU_SCALE * SELU_ALPHA))
        if t == 0:
            torch.mm(g_t[0], w_bwd, out=grad_m0)
        elif grad_ms is None:
            torch.mm(g_t[t], w_bwd, out=g_t[t - 1][:, hidden:])
        else:
            torch.addmm(grad_ms[t - 1], g_t[t], w_bwd, out=g_t[t - 1][:, hidden:])




def activation_grad(h: Tensor, nonlinearity: str) -> Tensor:
    """``sigma'(a)`` of ``h = sigma(a)``, from ``h`` (differentiable)."""
    if nonlinearity == "tanh":
        return 1 - h * h
    if nonlinearity == "relu":
        return (h > 0).to(h.dtype)
    return torch.where(h > 0, torch.full_like(h, SELU_SCALE), h + SELU_SCALE * SELU_ALPHA)


def activate(a: Tensor, nonlinearity: str) -> Tensor:
    return {"tanh": torch.tanh, "relu": torch.relu, "selu": torch.selu}[nonlinearity](a)


# ---------------------------------------------------------------------------------- references


def lmn_scan_ref(x_proj: Tensor, m0: Tensor, weight_mh: Tensor, weight_hm: Tensor,
                 weight_mm: Tensor, bias_m: Tensor, nonlinearity: str = "tanh"
                 ) -> tuple[Tensor, Tensor]:
    """Eqs. (6)-(7), one step at a time in differentiable PyTorch ops: ``(hs, ms)``,
    ``(T, B, H)`` and ``(T, B, M)``."""
    m, hs, ms = m0, [], []
    for x_t in x_proj.unbind(0):
        h = activate(x_t + m @ weight_mh.t(), nonlinearity)          # (6)
        m = bias_m + m @ weight_mm.t() + h @ weight_hm.t()              # (7)
        hs.append(h)
        ms.append(m)
    if not hs:
        return x_proj.new_zeros(x_proj.shape), x_proj.new_zeros(*x_proj.shape[:2], m0.shape[1])
    return torch.stack(hs), torch.stack(ms)


def lmn_scan_backward_ref(grad_hs: Tensor | None, grad_ms: Tensor | None, m0: Tensor,
                          hs: Tensor, ms: Tensor, weight_mh: Tensor, weight_hm: Tensor,
                          weight_mm: Tensor, nonlinearity: str = "tanh"
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`lmn_scan` with respect to ``(x_proj, m0, weight_mh, weight_hm,
    weight_mm, bias_m)``, in differentiable PyTorch ops (backpropagation through time as a
    loop of per-step products)."""
    steps, batch, _ = hs.shape
    grad_hs = torch.zeros_like(hs) if grad_hs is None else grad_hs
    grad_ms = torch.zeros_like(ms) if grad_ms is None else grad_ms
    carry = m0.new_zeros(batch, m0.shape[1])  # dL/dm_t from step t + 1
    das, dms = [], []
    for t in range(steps - 1, -1, -1):
        dm = grad_ms[t] + carry
        da = (grad_hs[t] + dm @ weight_hm) * activation_grad(hs[t], nonlinearity)
        carry = da @ weight_mh + dm @ weight_mm
        das.append(da)
        dms.append(dm)
    if steps == 0:
        zero = hs.new_zeros
        return (zero(hs.shape), carry, zero(weight_mh.shape), zero(weight_hm.shape),
                zero(weight_mm.shape), zero(weight_mm.shape[0]))
    da, dm = torch.stack(das[::-1]), torch.stack(dms[::-1])
    m_prev = torch.cat([m0[None], ms[:-1]])
    return (da, carry, torch.einsum("tbh,tbm->hm", da, m_prev),
            torch.einsum("tbm,tbh->mh", dm, hs), torch.einsum("tbm,tbn->mn", dm, m_prev),
            dm.sum((0, 1)))


def lmn_scan_onnx(x_proj: Tensor, m0: Tensor, weight_mh: Tensor, weight_hm: Tensor,
                  weight_mm: Tensor, bias_m: Tensor, nonlinearity: str = "tanh"
                  ) -> tuple[Tensor, Tensor]:
    """Eqs. (6)-(7) as PyTorch's ``scan`` higher-order operator, which the ONNX exporter
    (``torch.onnx.export(..., dynamo=True)``) writes as one ONNX ``Scan`` over the time
    dimension, whatever the length: what the recurrence is decomposed into for ONNX."""
    from torch._higher_order_ops.scan import scan

    def step(m: Tensor, x_t: Tensor):
        h = activate(x_t + m @ weight_mh.t(), nonlinearity)           # (6)
        m = bias_m + m @ weight_mm.t() + h @ weight_hm.t()               # (7)
        return m, (h, m.clone())

    _, (hs, ms) = scan(step, m0, x_proj)
    return hs, ms


# ----------------------------------------------------------- eager calls without dispatch


def through_reference(reference, inputs, grads):
    """The gradients of ``reference(*inputs)`` with respect to its tensor inputs, given those of
    its outputs ``grads`` (None: zero), as a differentiable graph: the backward of an operator
    when a graph of the gradient is asked for (double backward)."""
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    with torch.enable_grad():
        out = reference(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    grads = [torch.zeros_like(o) if g is None else g for o, g in zip(out, grads, strict=False)]
    return torch.autograd.grad(out, tensors, grads, create_graph=True, allow_unused=True,
                               materialize_grads=True)


def by_device(cpu_impl, other_impl):
    """An implementation that runs ``cpu_impl`` (the compiled kernel's) when its first tensor
    argument is on the CPU, else ``other_impl`` (the PyTorch loop)."""

    def call(*args):
        first = next(a for a in args if isinstance(a, Tensor))
        return (cpu_impl if first.device.type == "cpu" else other_impl)(*args)

    return call


def eager_function(name: str, forward, setup_context, backward, backward_impl):
    """An ``autograd.Function`` that runs a registered operator's implementations in eager mode
    without the operator's dispatch (its Python wrappers cost 50-200 us a call, a tenth of a
    small layer's training step): ``forward``, the operator's ``setup_context``, and its
    ``backward`` with ``backward_impl`` in place of the backward operator. Old-style
    ``forward(ctx, ...)``: ``Function.apply`` then binds no signature per call (about 40 us);
    torch.func's transforms take the references instead."""

    def fwd(ctx, *args):
        out = forward(*args)
        setup_context(ctx, args, out)
        ctx.set_materialize_grads(False)  # an output not used (LMN-B's hs): no zeros to read
        return out

    def bwd(ctx, *grads):
        return backward(ctx, *grads, backward_op=backward_impl)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(fwd), "backward": staticmethod(bwd),
        "__doc__": f"The eager path of an operator ({name}; :func:`eager_function`)."})


# --------------------------------------------------------------------------------- operators


def _scan_buffers(x_proj: Tensor, memory: int) -> tuple[Tensor, Tensor, bool]:
    """``hs`` and ``ms``, uninitialised, laid out like ``x_proj``; and that layout."""
    batch_major = _batch_major(x_proj)
    return (_new_steps(x_proj, x_proj.shape[2], batch_major),
            _new_steps(x_proj, memory, batch_major), batch_major)


def _scan_loop(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity):
    hs, ms, _ = _scan_buffers(x_proj, m0.shape[1])
    if x_proj.shape[0] and x_proj.shape[1]:
        _loop_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms)
    return hs, ms


@torch.library.custom_op("linmem::lmn_scan", mutates_args=())
def lmn_scan(x_proj: Tensor, m0: Tensor, weight_mh: Tensor, weight_hm: Tensor,
             weight_mm: Tensor, bias_m: Tensor, nonlinearity: str) -> tuple[Tensor, Tensor]:
    """Eqs. (6)-(7) over all steps: ``(hs, ms)``, ``(T, B, H)`` and ``(T, B, M)``, laid out
    like ``x_proj`` ``(T, B, H)``; ``m0`` ``(B, M)``; ``nonlinearity`` one of
    :data:`NONLINEARITIES`. This is the PyTorch loop (any device); the CPU runs the compiled
    kernel, CUDA the fused Triton kernel where it is faster."""
    return _scan_loop(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)


@lmn_scan.register_kernel(("cpu", "cuda"))
def _lmn_scan_kernel(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity):
    hs, ms, _ = _scan_buffers(x_proj, m0.shape[1])
    if x_proj.shape[0] and x_proj.shape[1]:
        forward, _ = _lmn_fills(x_proj, m0.shape[1])
        forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms)
    return hs, ms


@lmn_scan.register_fake
def _lmn_scan_fake(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity):
    hs, ms, _ = _scan_buffers(x_proj, m0.shape[1])
    return hs, ms


@torch.library.custom_op("linmem::lmn_scan_backward", mutates_args=())
def lmn_scan_backward(grad_hs: Tensor | None, grad_ms: Tensor | None, m0: Tensor, hs: Tensor,
                      ms: Tensor, weight_mh: Tensor, weight_hm: Tensor, weight_mm: Tensor,
                      nonlinearity: str
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`lmn_scan` with respect to ``(x_proj, m0, weight_mh, weight_hm,
    weight_mm, bias_m)`` given those of ``(hs, ms)`` (None: zero): the PyTorch loop (any
    device); the CPU runs the compiled kernel, CUDA the fused Triton kernel where it is faster."""
    return _scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                          nonlinearity, _loop_backward)


@lmn_scan_backward.register_kernel(("cpu", "cuda"))
def _lmn_scan_backward_kernel(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                              nonlinearity):
    return _scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                          nonlinearity, _lmn_fills(hs, ms.shape[2])[1])


def _backward_buffers(hs: Tensor, memory: int) -> tuple[Tensor, Tensor, bool]:
    """``grads`` (``[dL/da_t, dL/dm_t]`` per step, laid out like ``hs``) and ``grad_m0``."""
    batch_major = _batch_major(hs)
    return (_new_steps(hs, hs.shape[2] + memory, batch_major),
            hs.new_empty(hs.shape[1], memory), batch_major)


@lmn_scan_backward.register_fake
def _lmn_scan_backward_fake(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                            nonlinearity):
    grads, grad_m0, _ = _backward_buffers(hs, ms.shape[2])
    return (grads[..., :hs.shape[2]], grad_m0, torch.empty_like(weight_mh),
            torch.empty_like(weight_hm), torch.empty_like(weight_mm),
            weight_mm.new_empty(weight_mm.shape[0]))


def _scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                   nonlinearity, fill):
    """The backward of :func:`lmn_scan`: the state gradients by ``fill`` (the PyTorch loop's
    signature: :func:`_lmn_fills`), then the weight gradients as large products."""
    steps, batch, hidden = hs.shape
    memory = ms.shape[2]
    grads, grad_m0, batch_major = _backward_buffers(hs, memory)
    if batch == 0 or steps == 0:  # nothing flows back; torch.nn.RNN allows an empty batch too
        grads.zero_()
        return (grads[..., :hidden], m0.new_zeros(m0.shape) if steps == 0 else grad_m0.zero_(),
                torch.zeros_like(weight_mh), torch.zeros_like(weight_hm),
                torch.zeros_like(weight_mm), weight_mm.new_zeros(memory))
    fill(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads, grad_m0)
    d_m = _flat(grads, batch_major)[:, hidden:]
    d_cat = lagged_product(grads, ms, m0, batch_major)
    return (grads[..., :hidden], grad_m0, d_cat[:hidden].clone(),
            d_m.t() @ _flat(hs, batch_major), d_cat[hidden:].clone(), d_m.sum(0))


def _setup_context(ctx, inputs, output) -> None:
    _, m0, weight_mh, weight_hm, weight_mm, _, nonlinearity = inputs
    hs, ms = output
    ctx.nonlinearity = nonlinearity
    ctx.save_for_backward(m0, hs, ms, weight_mh, weight_hm, weight_mm)


def _backward(ctx, grad_hs, grad_ms, backward_op=None):
    m0, hs, ms, weight_mh, weight_hm, weight_mm = ctx.saved_tensors
    if torch.is_grad_enabled():  # a graph of the gradient is asked for: differentiable ops
        grads = lmn_scan_backward_ref(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm,
                                      weight_mm, ctx.nonlinearity)
    else:
        grads = (backward_op or lmn_scan_backward)(grad_hs, grad_ms, m0, hs, ms, weight_mh,
                                                   weight_hm, weight_mm, ctx.nonlinearity)
    return (*grads, None)


lmn_scan.register_autograd(_backward, setup_context=_setup_context)


_EagerScan = eager_function(
    "_EagerScan", _lmn_scan_kernel, _setup_context, _backward, _lmn_scan_backward_kernel)


def scan(x_proj: Tensor, m0: Tensor, weight_mh: Tensor, weight_hm: Tensor, weight_mm: Tensor,
         bias_m: Tensor, nonlinearity: str = "tanh") -> tuple[Tensor, Tensor]:
    """Eqs. (6)-(7) over all steps, by what runs them best here: the registered operator
    :func:`lmn_scan` where PyTorch traces (torch.compile, torch.export), :func:`lmn_scan_onnx`
    for the ONNX exporter, the reference :func:`lmn_scan_ref` under torch.func's transforms (an
    operator's registered autograd is not theirs), and in eager mode the operator's
    implementations without its dispatch."""
    if torch._C._are_functorch_transforms_active():
        return lmn_scan_ref(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)
    if torch.onnx.is_in_onnx_export():
        return lmn_scan_onnx(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)
    if torch.compiler.is_compiling():
        return lmn_scan(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)
    return _EagerScan.apply(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)


def _unbatched_calls(op, info, in_dims, *args):
    """A vmap rule: ``op`` once per entry of the mapped dimension, the outputs stacked (an
    ensemble of parameter sets, ``torch.func.vmap``)."""
    outs = []
    for i in range(info.batch_size):
        call = [a if d is None or a is None else a.select(d, i) for a, d in zip(args, in_dims,
                                                                             strict=True)]
        outs.append(op(*call))
    stacked = tuple(torch.stack(parts) for parts in zip(*outs, strict=True))
    return stacked, tuple(0 for _ in stacked)


torch.library.register_vmap(lmn_scan, functools.partial(_unbatched_calls, lmn_scan))
torch.library.register_vmap(lmn_scan_backward,
                            functools.partial(_unbatched_calls, lmn_scan_backward))
