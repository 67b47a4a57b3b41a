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

import torch
from torch import Tensor

from linmem.ops.lmn_fills import (
    backward_buffers,
    loop_backward,
    loop_forward,
    scan_backward,
    scan_buffers,
)
from linmem.ops.paths import fills_for
from linmem.ops.toolkit import activate, activation_grad, eager_function

__all__ = ["lmn_scan", "lmn_scan_backward", "lmn_scan_backward_ref", "lmn_scan_onnx",
           "lmn_scan_ref", "scan"]


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


# --------------------------------------------------------------------------------- operators


def _scan_loop(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity):
    hs, ms, _ = scan_buffers(x_proj, m0.shape[1])
    if x_proj.shape[0] and x_proj.shape[1]:
        loop_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms)
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
    hs, ms, _ = scan_buffers(x_proj, m0.shape[1])
    if x_proj.shape[0] and x_proj.shape[1]:
        forward, _ = fills_for(x_proj, m0.shape[1])
        forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms)
    return hs, ms


@lmn_scan.register_fake
def _lmn_scan_fake(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity):
    hs, ms, _ = scan_buffers(x_proj, m0.shape[1])
    return hs, ms


@torch.library.custom_op("linmem::lmn_scan_backward", mutates_args=())
def lmn_scan_backward(grad_hs: Tensor | None, grad_ms: Tensor | None, m0: Tensor, hs: Tensor,
                      ms: Tensor, weight_mh: Tensor, weight_hm: Tensor, weight_mm: Tensor,
                      nonlinearity: str
                      ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`lmn_scan` with respect to ``(x_proj, m0, weight_mh, weight_hm,
    weight_mm, bias_m)`` given those of ``(hs, ms)`` (None: zero): the PyTorch loop (any
    device); the CPU runs the compiled kernel, CUDA the fused Triton kernel where it is faster."""
    return scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                          nonlinearity, loop_backward)


@lmn_scan_backward.register_kernel(("cpu", "cuda"))
def _lmn_scan_backward_kernel(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                              nonlinearity):
    return scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                          nonlinearity, fills_for(hs, ms.shape[2])[1])


@lmn_scan_backward.register_fake
def _lmn_scan_backward_fake(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                            nonlinearity):
    grads, grad_m0, _ = backward_buffers(hs, ms.shape[2])
    return (grads[..., :hs.shape[2]], grad_m0, torch.empty_like(weight_mh),
            torch.empty_like(weight_hm), torch.empty_like(weight_mm),
            weight_mm.new_empty(weight_mm.shape[0]))


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
