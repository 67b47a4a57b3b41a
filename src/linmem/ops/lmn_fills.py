"""The LMN's recurrence by each path, in one signature: ``forward(x_proj, m0, weight_mh,
weight_hm, weight_mm, bias_m, nonlinearity, hs, ms)`` fills the states eqs. (6)-(7) give, and
``backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
grad_m0)`` their gradients: the PyTorch loops (any device), the compiled CPU kernel's variants
(:func:`cpu_fills`) and the fused GPU kernels. :func:`scan_backward` turns the state gradients
into the weight gradients. The operator (:mod:`linmem.ops.lmn`) runs the path
:mod:`linmem.ops.paths` chooses, and the choice times these same calls."""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from linmem.ops import gpu as ops_gpu
from linmem.ops.toolkit import (
    KERNEL_CODES,
    SELU_ALPHA,
    SELU_SCALE,
    flat,
    is_batch_major,
    lagged_product,
    new_steps,
    rows,
)

__all__ = ["backward_buffers", "cpu_fills", "gpu_backward", "gpu_forward", "loop_backward",
           "loop_forward", "scan_backward", "scan_buffers"]


@functools.cache
def cpu_fills(module, variant):
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


def gpu_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms):
    ops_gpu.forward(rows(x_proj), rows(m0), weight_mh, weight_hm, weight_mm, bias_m,
                    nonlinearity, hs, ms)


def gpu_backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
                  grad_m0):
    ops_gpu.backward_states(rows(grad_hs), rows(grad_ms), hs, weight_mh, weight_hm,
                            weight_mm, nonlinearity, grads, grad_m0)


def loop_forward(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity, hs, ms):
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


def loop_backward(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads,
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


def scan_buffers(x_proj: Tensor, memory: int) -> tuple[Tensor, Tensor, bool]:
    """``hs`` and ``ms``, uninitialised, laid out like ``x_proj``; and that layout."""
    batch_major = is_batch_major(x_proj)
    return (new_steps(x_proj, x_proj.shape[2], batch_major),
            new_steps(x_proj, memory, batch_major), batch_major)


def backward_buffers(hs: Tensor, memory: int) -> tuple[Tensor, Tensor, bool]:
    """``grads`` (``[dL/da_t, dL/dm_t]`` per step, laid out like ``hs``) and ``grad_m0``."""
    batch_major = is_batch_major(hs)
    return (new_steps(hs, hs.shape[2] + memory, batch_major),
            hs.new_empty(hs.shape[1], memory), batch_major)


def scan_backward(grad_hs, grad_ms, m0, hs, ms, weight_mh, weight_hm, weight_mm,
                   nonlinearity, fill):
    """The backward of :func:`lmn_scan`: the state gradients by ``fill`` (the PyTorch loop's
    signature: :func:`_lmn_fills`), then the weight gradients as large products."""
    steps, batch, hidden = hs.shape
    memory = ms.shape[2]
    grads, grad_m0, batch_major = backward_buffers(hs, memory)
    if batch == 0 or steps == 0:  # nothing flows back; torch.nn.RNN allows an empty batch too
        grads.zero_()
        return (grads[..., :hidden], m0.new_zeros(m0.shape) if steps == 0 else grad_m0.zero_(),
                torch.zeros_like(weight_mh), torch.zeros_like(weight_hm),
                torch.zeros_like(weight_mm), weight_mm.new_zeros(memory))
    fill(grad_hs, grad_ms, hs, weight_mh, weight_hm, weight_mm, nonlinearity, grads, grad_m0)
    d_m = flat(grads, batch_major)[:, hidden:]
    d_cat = lagged_product(grads, ms, m0, batch_major)
    return (grads[..., :hidden], grad_m0, d_cat[:hidden].clone(),
            d_m.t() @ flat(hs, batch_major), d_cat[hidden:].clone(), d_m.sum(0))

