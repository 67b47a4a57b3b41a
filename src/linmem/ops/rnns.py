"""The recurrences of ``torch.nn.RNN``, ``GRU`` and ``LSTM`` as registered operators with an
explicit backward through time, beside their per-step references (``*_scan_ref``): what
:mod:`linmem.nn.rnns`' modules run. The loops run in the LMN's compiled kernel
(``csrc/lmn_kernel.h``) wherever :func:`linmem.ops.cpu.cpu_path` chose one of its variants,
else as PyTorch loops; the input products of all steps are one matrix product before the loop
and the weight gradients one product over all steps after it (:mod:`linmem.nn.rnns` says why)."""

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
    lagged_product,
    rows,
    through_reference,
)

__all__ = ["gru_recurrence", "gru_scan", "gru_scan_ref", "lstm_recurrence", "lstm_scan",
           "lstm_scan_ref", "rnn_recurrence", "rnn_scan", "rnn_scan_ref"]


# The recurrences as registered operators (torch.library, as the LMN's in linmem.ops.lmn): each
# forward returns its states and the intermediates its backward reads; the backward is an
# operator of its own; with a graph of the gradient asked for (double backward) it is autograd
# through the per-step reference instead; under torch.func's transforms the reference runs.


def rnn_scan_ref(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor,
                 nonlinearity: str = "tanh") -> Tensor:
    """One RNN layer's states, step by step in differentiable PyTorch ops."""
    h, hs = h0, []
    for g in gi.unbind(0):
        h = activate(g + bias_hh + h @ weight_hh.t(), nonlinearity)
        hs.append(h)
    return torch.stack(hs) if hs else gi.new_zeros(gi.shape)


def gru_scan_ref(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor) -> Tensor:
    """One GRU layer's states, step by step in differentiable PyTorch ops."""
    hidden = h0.shape[1]
    h, hs = h0, []
    for g in gi.unbind(0):
        gh = h @ weight_hh.t() + bias_hh
        r = torch.sigmoid(g[:, :hidden] + gh[:, :hidden])
        z = torch.sigmoid(g[:, hidden:2 * hidden] + gh[:, hidden:2 * hidden])
        n = torch.tanh(g[:, 2 * hidden:] + r * gh[:, 2 * hidden:])
        h = (1 - z) * n + z * h
        hs.append(h)
    return torch.stack(hs) if hs else gi.new_zeros(gi.shape[0], gi.shape[1], hidden)


def lstm_scan_ref(gi: Tensor, h0: Tensor, c0: Tensor, weight_hh: Tensor, bias_hh: Tensor
                  ) -> tuple[Tensor, Tensor]:
    """One LSTM layer's states and last cell state, step by step in differentiable ops."""
    h, c, hs = h0, c0, []
    for g in gi.unbind(0):
        i, f, gg, o = (g + bias_hh + h @ weight_hh.t()).chunk(4, 1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(gg)
        h = torch.sigmoid(o) * torch.tanh(c)
        hs.append(h)
    return (torch.stack(hs) if hs else gi.new_zeros(gi.shape[0], gi.shape[1], h0.shape[1])), c


# -------------------------------------------------------------------------------------- RNN


def _rnn_forward(gi, h0, weight_hh, bias_hh, nonlinearity, kernel):
    hs = torch.empty_like(gi, memory_format=torch.contiguous_format)
    if gi.shape[0] == 0 or gi.shape[1] == 0:
        return hs
    if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
        module, variant = kernel
        module.rnn_forward(rows(gi), rows(h0), weight_hh, bias_hh.contiguous(),
                           KERNEL_CODES[nonlinearity], hs, variant)
    else:
        w_t, h = weight_hh.t().contiguous(), h0
        for t in range(gi.shape[0]):
            h = torch.addmm(bias_hh, h, w_t, out=hs[t]).add_(gi[t])
            if nonlinearity == "tanh":
                h.tanh_()
            else:
                h.clamp_min_(0.0)
    return hs


@torch.library.custom_op("linmem::rnn_scan", mutates_args=())
def rnn_scan(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor,
             nonlinearity: str) -> Tensor:
    """One RNN layer's states ``(T, B, H)`` from ``gi = x W_ih^T + b_ih``: the PyTorch loop;
    the CPU runs the compiled kernel."""
    return _rnn_forward(gi, h0, weight_hh, bias_hh, nonlinearity, None)


@rnn_scan.register_kernel("cpu")
def _rnn_scan_cpu(gi, h0, weight_hh, bias_hh, nonlinearity):
    return _rnn_forward(gi, h0, weight_hh, bias_hh, nonlinearity, kernel_for(gi))


@rnn_scan.register_fake
def _rnn_scan_fake(gi, h0, weight_hh, bias_hh, nonlinearity):
    return torch.empty_like(gi, memory_format=torch.contiguous_format)


def _rnn_backward(grad_hs, h0, hs, weight_hh, nonlinearity, kernel):
    """Per step ``da_t = dh_t sigma'`` and ``dh_{t-1} = da_t W_hh``, then ``dW_hh = sum_t
    da_t^T h_{t-1}`` in large products over all steps."""
    steps, batch, hidden = hs.shape
    d_a = torch.zeros_like(hs)  # dL/d(pre-activation)
    if steps == 0 or batch == 0:
        return d_a, torch.zeros_like(h0), torch.zeros_like(weight_hh), hs.new_zeros(hidden)
    if kernel is not None:
        module, variant = kernel
        dh = h0.new_empty(h0.shape)
        module.rnn_backward(rows(grad_hs), hs, weight_hh, KERNEL_CODES[nonlinearity], d_a, dh,
                            variant)
    else:
        slope = activation_grad(hs, nonlinearity)
        dh = h0.new_zeros(batch, hidden)
        for t in range(steps - 1, -1, -1):
            if grad_hs is not None:
                dh += grad_hs[t]
            dh = torch.mm(torch.mul(dh, slope[t], out=d_a[t]), weight_hh)
    return (d_a, dh, lagged_product(d_a, hs, h0, batch_major=False),
            d_a.reshape(-1, hidden).sum(0))


@torch.library.custom_op("linmem::rnn_scan_backward", mutates_args=())
def rnn_scan_backward(grad_hs: Tensor | None, h0: Tensor, hs: Tensor, weight_hh: Tensor,
                      nonlinearity: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`rnn_scan` with respect to ``(gi, h0, weight_hh, bias_hh)``."""
    return _rnn_backward(grad_hs, h0, hs, weight_hh, nonlinearity, None)


@rnn_scan_backward.register_kernel("cpu")
def _rnn_scan_backward_cpu(grad_hs, h0, hs, weight_hh, nonlinearity):
    return _rnn_backward(grad_hs, h0, hs, weight_hh, nonlinearity, kernel_for(hs))


@rnn_scan_backward.register_fake
def _rnn_scan_backward_fake(grad_hs, h0, hs, weight_hh, nonlinearity):
    return (torch.empty_like(hs), torch.empty_like(h0), torch.empty_like(weight_hh),
            hs.new_empty(hs.shape[2]))


def _rnn_setup(ctx, inputs, output):
    gi, h0, weight_hh, bias_hh, nonlinearity = inputs
    ctx.nonlinearity = nonlinearity
    ctx.save_for_backward(gi, h0, weight_hh, bias_hh, output)


def _rnn_grad(ctx, grad_hs, backward_op=None):
    gi, h0, weight_hh, bias_hh, hs = ctx.saved_tensors
    if torch.is_grad_enabled():
        grads = through_reference(rnn_scan_ref, (gi, h0, weight_hh, bias_hh, ctx.nonlinearity),
                                  (grad_hs,))
    else:
        grads = (backward_op or rnn_scan_backward)(grad_hs, h0, hs, weight_hh, ctx.nonlinearity)
    return (*grads, None)


rnn_scan.register_autograd(_rnn_grad, setup_context=_rnn_setup)
_EagerRNN = eager_function(
    "_EagerRNN", by_device(_rnn_scan_cpu, lambda *a: _rnn_forward(*a, None)), _rnn_setup,
    _rnn_grad, by_device(_rnn_scan_backward_cpu, lambda *a: _rnn_backward(*a, None)))


def rnn_recurrence(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor,
                   nonlinearity: str = "tanh") -> Tensor:
    """One RNN layer's states ``(T, B, H)`` from its input products ``gi = x W_ih^T + b_ih``
    ``(T, B, H)`` and initial state ``h0 (B, H)``, differentiable in all four."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    if torch._C._are_functorch_transforms_active():
        return rnn_scan_ref(gi, h0, weight_hh, bias_hh, nonlinearity)
    if torch.compiler.is_compiling():
        return rnn_scan(gi, h0, weight_hh, bias_hh, nonlinearity)
    return _EagerRNN.apply(gi, h0, weight_hh, bias_hh, nonlinearity)


# -------------------------------------------------------------------------------------- GRU


def _gru_forward(gi, h0, weight_hh, bias_hh, kernel):
    steps, batch, width = gi.shape
    hidden = width // 3
    hs = gi.new_empty(steps, batch, hidden)
    gates = gi.new_empty(steps, batch, width)  # r, z, n of every step
    gh = gi.new_empty(steps, batch, width)  # h_{t-1} W_hh^T + b_hh of every step
    if steps == 0 or batch == 0:
        return hs, gates, gh
    if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
        module, variant = kernel
        module.gru_forward(rows(gi), rows(h0), weight_hh, bias_hh.contiguous(), hs, gates, gh,
                           variant)
    else:
        w_t = weight_hh.t().contiguous()
        rz, h = slice(0, 2 * hidden), h0
        for t in range(steps):
            torch.addmm(bias_hh, h, w_t, out=gh[t])
            g = gates[t]
            torch.add(gi[t, :, rz], gh[t, :, rz], out=g[:, rz]).sigmoid_()
            n = g[:, 2 * hidden:]
            torch.addcmul(gi[t, :, 2 * hidden:], g[:, :hidden], gh[t, :, 2 * hidden:],
                          out=n).tanh_()
            h = torch.addcmul(n, g[:, hidden:2 * hidden], h - n, out=hs[t])  # (1-z)n + zh
    return hs, gates, gh


@torch.library.custom_op("linmem::gru_scan", mutates_args=())
def gru_scan(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor
             ) -> tuple[Tensor, Tensor, Tensor]:
    """One GRU layer's states ``(T, B, H)`` from ``gi = x W_ih^T + b_ih`` ``(T, B, 3H)``, and
    its gates and hidden products (what the backward reads): the PyTorch loop; the CPU runs the
    compiled kernel."""
    return _gru_forward(gi, h0, weight_hh, bias_hh, None)


@gru_scan.register_kernel("cpu")
def _gru_scan_cpu(gi, h0, weight_hh, bias_hh):
    return _gru_forward(gi, h0, weight_hh, bias_hh, kernel_for(gi))


@gru_scan.register_fake
def _gru_scan_fake(gi, h0, weight_hh, bias_hh):
    steps, batch, width = gi.shape
    return (gi.new_empty(steps, batch, width // 3), gi.new_empty(steps, batch, width),
            gi.new_empty(steps, batch, width))


def _gru_backward(grad_hs, h0, hs, gates, gh, weight_hh, kernel):
    steps, batch, hidden = hs.shape
    if steps == 0 or batch == 0:
        return (gates.new_zeros(gates.shape), torch.zeros_like(h0), torch.zeros_like(weight_hh),
                hs.new_zeros(3 * hidden))
    if kernel is not None:
        module, variant = kernel
        d_gh, d_n, dh = torch.empty_like(gates), torch.empty_like(hs), h0.new_empty(h0.shape)
        module.gru_backward(rows(grad_hs), rows(h0), hs, gates, gh, weight_hh, d_gh, d_n, dh,
                            variant)
    else:
        d_gh, d_n, dh = _gru_loop_backward(grad_hs, h0, hs, gates, gh, weight_hh)
    return (torch.cat([d_gh[..., :2 * hidden], d_n], 2), dh,
            lagged_product(d_gh, hs, h0, batch_major=False),
            d_gh.reshape(-1, d_gh.shape[2]).sum(0))


@torch.library.custom_op("linmem::gru_scan_backward", mutates_args=())
def gru_scan_backward(grad_hs: Tensor | None, h0: Tensor, hs: Tensor, gates: Tensor,
                      gh: Tensor, weight_hh: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`gru_scan`'s states with respect to ``(gi, h0, weight_hh,
    bias_hh)``."""
    return _gru_backward(grad_hs, h0, hs, gates, gh, weight_hh, None)


@gru_scan_backward.register_kernel("cpu")
def _gru_scan_backward_cpu(grad_hs, h0, hs, gates, gh, weight_hh):
    return _gru_backward(grad_hs, h0, hs, gates, gh, weight_hh, kernel_for(hs))


@gru_scan_backward.register_fake
def _gru_scan_backward_fake(grad_hs, h0, hs, gates, gh, weight_hh):
    return (torch.empty_like(gates), torch.empty_like(h0), torch.empty_like(weight_hh),
            hs.new_empty(gates.shape[2]))


def _gru_setup(ctx, inputs, output):
    gi, h0, weight_hh, bias_hh = inputs
    ctx.save_for_backward(gi, h0, weight_hh, bias_hh, *output)


def _gru_grad(ctx, grad_hs, grad_gates, grad_gh, backward_op=None):
    gi, h0, weight_hh, bias_hh, hs, gates, gh = ctx.saved_tensors
    if torch.is_grad_enabled():
        return through_reference(gru_scan_ref, (gi, h0, weight_hh, bias_hh), (grad_hs,))
    return (backward_op or gru_scan_backward)(grad_hs, h0, hs, gates, gh, weight_hh)


gru_scan.register_autograd(_gru_grad, setup_context=_gru_setup)
_EagerGRU = eager_function(
    "_EagerGRU", by_device(_gru_scan_cpu, lambda *a: _gru_forward(*a, None)), _gru_setup,
    _gru_grad, by_device(_gru_scan_backward_cpu, lambda *a: _gru_backward(*a, None)))


def _gru_loop_backward(grad_hs, h0, hs, gates, gh, weight_hh):
    """The GRU's backward through time as a PyTorch loop: ``(dL/d gh (T, B, 3H), dL/d(n's
    pre-activation) (T, B, H), dL/dh_0)``."""
    steps, batch, hidden = hs.shape
    r, z, n = gates[..., :hidden], gates[..., hidden:2 * hidden], gates[..., 2 * hidden:]
    # every step's local derivatives at once: dh to n's and z's pre-activations, n's to r's
    to_n = (1 - z) * (1 - n * n)
    to_z = torch.empty_like(n)  # (h_{t-1} - n_t) z_t (1 - z_t)
    torch.sub(h0, n[0], out=to_z[0])
    torch.sub(hs[:-1], n[1:], out=to_z[1:])
    to_z *= z * (1 - z)
    to_r = gh[..., 2 * hidden:] * r * (1 - r)
    d_gh = torch.empty_like(gates)  # dL/d(h_{t-1} W_hh^T + b_hh)
    d_n = torch.empty_like(n)  # dL/d(pre-activation of n)
    dh = h0.new_zeros(batch, hidden)
    for t in range(steps - 1, -1, -1):
        if grad_hs is not None:
            dh += grad_hs[t]
        db = d_gh[t]
        torch.mul(dh, to_n[t], out=d_n[t])
        torch.mul(dh, to_z[t], out=db[:, hidden:2 * hidden])
        torch.mul(d_n[t], to_r[t], out=db[:, :hidden])
        torch.mul(d_n[t], r[t], out=db[:, 2 * hidden:])
        dh = torch.addmm(dh * z[t], db, weight_hh)
    return d_gh, d_n, dh


def gru_recurrence(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor) -> Tensor:
    """One GRU layer's states ``(T, B, H)`` from its input products ``gi = x W_ih^T + b_ih``
    ``(T, B, 3H)`` and initial state ``h0 (B, H)``, differentiable in all four."""
    if torch._C._are_functorch_transforms_active():
        return gru_scan_ref(gi, h0, weight_hh, bias_hh)
    if torch.compiler.is_compiling():
        return gru_scan(gi, h0, weight_hh, bias_hh)[0]
    return _EagerGRU.apply(gi, h0, weight_hh, bias_hh)[0]


# ------------------------------------------------------------------------------------- LSTM


def _lstm_forward(gi, h0, c0, weight_hh, bias_hh, kernel):
    steps, batch, width = gi.shape
    hidden = width // 4
    hs, cs, tcs = (gi.new_empty(steps, batch, hidden) for _ in range(3))
    gates = gi.new_empty(steps, batch, width)  # i, f, g, o of every step
    if steps == 0 or batch == 0:
        return hs, c0.clone(), cs, tcs, gates
    if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
        module, variant = kernel
        module.lstm_forward(rows(gi), rows(h0), rows(c0), weight_hh, bias_hh.contiguous(),
                            hs, cs, tcs, gates, variant)
    else:
        w_t, h, c = weight_hh.t().contiguous(), h0, c0
        ifo = [slice(0, 2 * hidden), slice(3 * hidden, 4 * hidden)]
        for t in range(steps):
            a = torch.addmm(bias_hh, h, w_t, out=gates[t]).add_(gi[t])
            for cols in ifo:
                a[:, cols].sigmoid_()
            a[:, 2 * hidden:3 * hidden].tanh_()
            i, f, g, o = a.split(hidden, 1)
            c = torch.addcmul(torch.mul(f, c, out=cs[t]), i, g, out=cs[t])
            h = torch.mul(o, torch.tanh(c, out=tcs[t]), out=hs[t])
    return hs, cs[-1].clone(), cs, tcs, gates  # c_T: the cell state that leaves the layer


@torch.library.custom_op("linmem::lstm_scan", mutates_args=())
def lstm_scan(gi: Tensor, h0: Tensor, c0: Tensor, weight_hh: Tensor, bias_hh: Tensor
              ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """One LSTM layer's states ``(T, B, H)`` and last cell state ``(B, H)`` from ``gi = x
    W_ih^T + b_ih`` ``(T, B, 4H)``, and the cell states, their tanh and the gates (what the
    backward reads): the PyTorch loop; the CPU runs the compiled kernel."""
    return _lstm_forward(gi, h0, c0, weight_hh, bias_hh, None)


@lstm_scan.register_kernel("cpu")
def _lstm_scan_cpu(gi, h0, c0, weight_hh, bias_hh):
    return _lstm_forward(gi, h0, c0, weight_hh, bias_hh, kernel_for(gi))


@lstm_scan.register_fake
def _lstm_scan_fake(gi, h0, c0, weight_hh, bias_hh):
    steps, batch, width = gi.shape
    hidden = width // 4
    return (gi.new_empty(steps, batch, hidden), torch.empty_like(c0),
            gi.new_empty(steps, batch, hidden), gi.new_empty(steps, batch, hidden),
            gi.new_empty(steps, batch, width))


def _lstm_backward(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates, weight_hh, kernel):
    steps, batch, hidden = hs.shape
    if steps == 0 or batch == 0:
        return (gates.new_zeros(gates.shape), torch.zeros_like(h0),
                torch.zeros_like(c0) if grad_cn is None else grad_cn.clone(),
                torch.zeros_like(weight_hh), hs.new_zeros(4 * hidden))
    if kernel is not None:
        module, variant = kernel
        d_a = torch.empty_like(gates)
        dh, dc = h0.new_empty(h0.shape), c0.new_empty(c0.shape)
        module.lstm_backward(rows(grad_hs), rows(grad_cn), rows(c0), cs, tcs, gates,
                             weight_hh, d_a, dh, dc, variant)
    else:
        d_a, dh, dc = _lstm_loop_backward(grad_hs, grad_cn, c0, cs, tcs, gates, weight_hh)
    return (d_a, dh, dc, lagged_product(d_a, hs, h0, batch_major=False),
            d_a.reshape(-1, 4 * hidden).sum(0))


@torch.library.custom_op("linmem::lstm_scan_backward", mutates_args=())
def lstm_scan_backward(grad_hs: Tensor | None, grad_cn: Tensor | None, h0: Tensor, c0: Tensor,
                       hs: Tensor, cs: Tensor, tcs: Tensor, gates: Tensor, weight_hh: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The gradients of :func:`lstm_scan`'s states and last cell state with respect to ``(gi,
    h0, c0, weight_hh, bias_hh)``."""
    return _lstm_backward(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates, weight_hh, None)


@lstm_scan_backward.register_kernel("cpu")
def _lstm_scan_backward_cpu(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates, weight_hh):
    return _lstm_backward(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates, weight_hh,
                          kernel_for(hs))


@lstm_scan_backward.register_fake
def _lstm_scan_backward_fake(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates, weight_hh):
    return (torch.empty_like(gates), torch.empty_like(h0), torch.empty_like(c0),
            torch.empty_like(weight_hh), hs.new_empty(gates.shape[2]))


def _lstm_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs, output[0], *output[2:])


def _lstm_grad(ctx, grad_hs, grad_cn, *_, backward_op=None):
    gi, h0, c0, weight_hh, bias_hh, hs, cs, tcs, gates = ctx.saved_tensors
    if torch.is_grad_enabled():
        return through_reference(lstm_scan_ref, (gi, h0, c0, weight_hh, bias_hh),
                                 (grad_hs, grad_cn))
    return (backward_op or lstm_scan_backward)(grad_hs, grad_cn, h0, c0, hs, cs, tcs, gates,
                                               weight_hh)


lstm_scan.register_autograd(_lstm_grad, setup_context=_lstm_setup)
_EagerLSTM = eager_function(
    "_EagerLSTM", by_device(_lstm_scan_cpu, lambda *a: _lstm_forward(*a, None)), _lstm_setup,
    _lstm_grad, by_device(_lstm_scan_backward_cpu, lambda *a: _lstm_backward(*a, None)))


def _lstm_loop_backward(grad_hs, grad_cn, c0, cs, tcs, gates, weight_hh):
    """The LSTM's backward through time as a PyTorch loop: ``(dL/d(the gates'
    pre-activations) (T, B, 4H), dL/dh_0, dL/dc_0)``."""
    steps, batch, hidden = cs.shape
    i, f, g, o = gates.split(hidden, 2)
    c_prev = torch.cat([c0.unsqueeze(0), cs[:-1]])
    # every step's local derivatives at once
    to_c = o * (1 - tcs * tcs)  # dh to dc
    to_i, to_f, to_g = g * i * (1 - i), c_prev * f * (1 - f), i * (1 - g * g)
    to_o = tcs * o * (1 - o)  # dh to o's pre-activation
    d_a = torch.empty_like(gates)
    dh = c0.new_zeros(batch, hidden)
    dc = c0.new_zeros(batch, hidden) if grad_cn is None else grad_cn.clone()
    for t in range(steps - 1, -1, -1):
        if grad_hs is not None:
            dh += grad_hs[t]
        dc = torch.addcmul(dc, dh, to_c[t])
        da = d_a[t]
        torch.mul(dc, to_i[t], out=da[:, :hidden])
        torch.mul(dc, to_f[t], out=da[:, hidden:2 * hidden])
        torch.mul(dc, to_g[t], out=da[:, 2 * hidden:3 * hidden])
        torch.mul(dh, to_o[t], out=da[:, 3 * hidden:])
        dc = dc * f[t]
        dh = torch.mm(da, weight_hh)
    return d_a, dh, dc


def lstm_recurrence(gi: Tensor, h0: Tensor, c0: Tensor, weight_hh: Tensor,
                    bias_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM layer's states ``hs (T, B, H)`` and last cell state ``c_T (B, H)`` from its
    input products ``gi = x W_ih^T + b_ih`` ``(T, B, 4H)`` and initial states ``h0, c0 (B,
    H)``, differentiable in all five."""
    if torch._C._are_functorch_transforms_active():
        return lstm_scan_ref(gi, h0, c0, weight_hh, bias_hh)
    scan = lstm_scan if torch.compiler.is_compiling() else _EagerLSTM.apply
    hs, c_n, *_ = scan(gi, h0, c0, weight_hh, bias_hh)
    return hs, c_n
