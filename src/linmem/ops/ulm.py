"""The unrolled network's recurrence (eq. 10) as a registered PyTorch operator,
``linmem::ulm_scan``, with its reference: the same structure as :mod:`linmem.ops.lmn` (a schema, a
fake implementation, the backward tied with ``register_autograd``, the compiled CPU kernel and the
PyTorch loop elsewhere, an eager path without dispatch)::

    h_t = sigma(x_proj_t + sum_{i=1..k} W^hh_i h_{t-i})                    (10)
"""

from __future__ import annotations

import torch
from torch import Tensor

from linmem.ops.paths import kernel_for
from linmem.ops.toolkit import (
    KERNEL_CODES,
    activate,
    activation_grad,
    by_device,
    eager_function,
    rows,
    through_reference,
)

__all__ = [
    "ulm_scan",
    "ulm_scan_backward",
    "ulm_scan_ref",
    "ulm_states",
]


def ulm_scan_ref(x_proj: Tensor, past: Tensor, weight_hh: Tensor, nonlinearity: str = "tanh"
                 ) -> Tensor:
    """Eq. (10), one step at a time in differentiable PyTorch ops: ``h_t = sigma(x_proj_t +
    sum_i W^hh_i h_{t-i})`` from the states before the start ``past`` ``(B, k H)``
    (``[h_0, h_{-1}, ...]``); ``(T, B, H)``."""
    hidden = x_proj.shape[2]
    window, hs = past, []
    for x_t in x_proj.unbind(0):
        h = activate(x_t + window @ weight_hh.t(), nonlinearity)
        window = torch.cat([h, window[:, :-hidden]], 1) if window.shape[1] > hidden else h
        hs.append(h)
    return torch.stack(hs) if hs else x_proj.new_zeros(x_proj.shape)


def _time_order(weight_hh: Tensor, hidden: int) -> Tensor:
    """``[W^hh_k ... W^hh_1]``: the lag blocks in time order."""
    return weight_hh.unflatten(1, (weight_hh.shape[1] // hidden, hidden)).flip(1).flatten(1)


def _ulm_forward(x_proj, past, weight_hh, nonlinearity, kernel):
    """The states ``(T, B, H)`` and the buffer ``(B, k + T, H)`` of the past and new states in
    time order, in which the ``k`` states before step ``t`` are one strided ``(B, k H)``
    matrix: each step is one product with :func:`_time_order`'s blocks."""
    steps, batch, hidden = x_proj.shape
    k = weight_hh.shape[1] // hidden
    buf = x_proj.new_empty(batch, k + steps, hidden)
    buf[:, :k] = past.unflatten(1, (k, hidden)).flip(1)
    w_time = _time_order(weight_hh, hidden)
    if steps and batch and kernel is not None:  # the compiled loop (csrc/lmn_kernel.h)
        module, variant = kernel
        module.ulm_forward(rows(x_proj), w_time, KERNEL_CODES[nonlinearity], buf, variant)
    elif steps and batch:
        w_t = w_time.t().contiguous()
        row = (k + steps) * hidden
        h_t = torch.empty_like(x_proj[0])
        for t in range(steps):
            window = buf.as_strided((batch, k * hidden), (row, 1), t * hidden)
            torch.addmm(x_proj[t], window, w_t, out=h_t)                      # (10)
            if nonlinearity == "tanh":
                h_t.tanh_()
            elif nonlinearity == "relu":
                h_t.clamp_min_(0.0)
            else:
                torch.selu_(h_t)
            buf[:, k + t] = h_t
    return buf[:, k:].transpose(0, 1).clone(memory_format=torch.contiguous_format), buf


@torch.library.custom_op("linmem::ulm_scan", mutates_args=())
def ulm_scan(x_proj: Tensor, past: Tensor, weight_hh: Tensor, nonlinearity: str
             ) -> tuple[Tensor, Tensor]:
    """Eq. (10) over all steps from ``x_proj = W^xh x_t + b^h`` ``(T, B, H)`` and the states
    before the start ``past`` ``(B, k H)``: the states ``(T, B, H)`` and the buffer of past and
    new states in time order ``(B, k + T, H)`` (what the backward reads). The PyTorch loop
    (any device); the CPU runs the compiled kernel."""
    return _ulm_forward(x_proj, past, weight_hh, nonlinearity, None)


@ulm_scan.register_kernel("cpu")
def _ulm_scan_cpu(x_proj, past, weight_hh, nonlinearity):
    return _ulm_forward(x_proj, past, weight_hh, nonlinearity, kernel_for(x_proj))


@ulm_scan.register_fake
def _ulm_scan_fake(x_proj, past, weight_hh, nonlinearity):
    steps, batch, hidden = x_proj.shape
    k = weight_hh.shape[1] // hidden
    return x_proj.new_empty(steps, batch, hidden), x_proj.new_empty(batch, k + steps, hidden)


@torch.library.custom_op("linmem::ulm_scan_backward", mutates_args=())
def ulm_scan_backward(grad_hs: Tensor | None, buf: Tensor, weight_hh: Tensor,
                      nonlinearity: str) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of :func:`ulm_scan`'s states with respect to ``(x_proj, past,
    weight_hh)`` given theirs (None: zero), from the buffer the forward returned: per step
    ``da_t = dh_t sigma'`` and the window's gradient ``+= da_t [W^hh_k ... W^hh_1]``; the weight
    gradient is a few large products over all steps. The PyTorch loop (any device); the CPU runs
    the compiled kernel."""
    return _ulm_backward(grad_hs, buf, weight_hh, nonlinearity, None)


@ulm_scan_backward.register_kernel("cpu")
def _ulm_scan_backward_cpu(grad_hs, buf, weight_hh, nonlinearity):
    return _ulm_backward(grad_hs, buf, weight_hh, nonlinearity, kernel_for(buf))


@ulm_scan_backward.register_fake
def _ulm_scan_backward_fake(grad_hs, buf, weight_hh, nonlinearity):
    batch, total, hidden = buf.shape
    k = weight_hh.shape[1] // hidden
    return (buf.new_empty(batch, total - k, hidden).transpose(0, 1),
            buf.new_empty(batch, k * hidden), torch.empty_like(weight_hh))


def _ulm_backward(grad_hs, buf, weight_hh, nonlinearity, kernel):
    batch, total, hidden = buf.shape
    k = weight_hh.shape[1] // hidden
    steps, row = total - k, total * hidden
    w_time = _time_order(weight_hh, hidden)
    d_buf = torch.zeros_like(buf)  # dL/dh of every state, the past's included
    if grad_hs is not None:
        d_buf[:, k:] = grad_hs.transpose(0, 1)
    d_a = buf.new_zeros(batch, steps, hidden)  # dL/d(pre-activation), batch-major
    if steps and batch and kernel is not None:
        module, variant = kernel
        module.ulm_backward(buf, w_time, KERNEL_CODES[nonlinearity], d_buf, d_a, variant)
    elif steps and batch:
        slope = activation_grad(buf[:, k:], nonlinearity)  # (B, T, H)
        for t in range(steps - 1, -1, -1):
            da = torch.mul(d_buf[:, k + t], slope[:, t], out=d_a[:, t])
            d_buf.as_strided((batch, k * hidden), (row, 1), t * hidden).addmm_(da, w_time)
    grad_time = w_time.new_zeros(w_time.shape)
    chunk = max(1, 2 ** 22 // max(1, batch * k * hidden))  # windows copied per product
    for start in range(0, steps if batch else 0, chunk):
        n = min(chunk, steps - start)
        windows = buf.as_strided((batch, n, k * hidden), (row, hidden, 1),
                                 start * hidden).reshape(-1, k * hidden)
        grad_time.addmm_(d_a[:, start:start + n].reshape(-1, hidden).t(), windows)
    return (d_a.transpose(0, 1), d_buf[:, :k].flip(1).flatten(1),
            grad_time.unflatten(1, (k, hidden)).flip(1).flatten(1))


def _ulm_setup_context(ctx, inputs, output) -> None:
    x_proj, past, weight_hh, nonlinearity = inputs
    ctx.nonlinearity = nonlinearity
    ctx.save_for_backward(x_proj, past, weight_hh, output[1])


def _ulm_backward_fn(ctx, grad_hs, grad_buf, backward_op=None):
    x_proj, past, weight_hh, buf = ctx.saved_tensors
    if torch.is_grad_enabled():  # a graph of the gradient: autograd through the reference
        grads = through_reference(ulm_scan_ref, (x_proj, past, weight_hh, ctx.nonlinearity),
                                  (grad_hs,))
    else:
        grads = (backward_op or ulm_scan_backward)(grad_hs, buf, weight_hh, ctx.nonlinearity)
    return (*grads, None)


ulm_scan.register_autograd(_ulm_backward_fn, setup_context=_ulm_setup_context)

_EagerULMScan = eager_function(
    "_EagerULMScan", by_device(_ulm_scan_cpu, lambda *a: _ulm_forward(*a, None)),
    _ulm_setup_context, _ulm_backward_fn,
    by_device(_ulm_scan_backward_cpu, lambda *a: _ulm_backward(*a, None)))


def ulm_states(x_proj: Tensor, past: Tensor, weight_hh: Tensor, nonlinearity: str = "tanh"
               ) -> Tensor:
    """Eq. (10)'s states ``(T, B, H)`` by what runs them best here (as :func:`scan`): the
    operator :func:`ulm_scan` where PyTorch traces, the reference under torch.func, in eager mode
    the operator's implementations without its dispatch."""
    if torch._C._are_functorch_transforms_active():
        return ulm_scan_ref(x_proj, past, weight_hh, nonlinearity)
    if torch.compiler.is_compiling():
        return ulm_scan(x_proj, past, weight_hh, nonlinearity)[0]
    return _EagerULMScan.apply(x_proj, past, weight_hh, nonlinearity)[0]
