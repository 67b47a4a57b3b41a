"""``torch.nn.RNN`` and ``torch.nn.GRU`` with an explicit backward through time on the CPU (the
baselines' speed).

The RNN and GRU of the paper's comparison are PyTorch's; :class:`RNN` and :class:`GRU` are those
modules (subclasses: the same parameters, initialisation, ``state_dict`` keys and results),
trained faster on the CPU. PyTorch's CPU RNN and GRU (unlike its LSTM, which oneDNN fuses) run
their backward step by step through autograd, and at every step they form and add a gradient of
``W_hh`` (``H x H``, ``3H x H``) from a product of inner dimension ``B``: memory-bound work that
dominates at the batch sizes and widths of the searches. Here, as in the LMN's recurrence
(:mod:`linmem.nn`), the input products of all steps are one matrix product before the loop, the
loop and its backward keep only the products with ``W_hh``, and the weight gradients are one
large product over all steps after it. The loops run in the LMN's compiled kernel
(``csrc/lmn_kernel.h``: the same register-tiled product over weights packed once per call, the
gates computed in place) wherever :func:`linmem._ext.cpu_path` chose one of its variants for the
LMN, else as a PyTorch loop; ``linmem.nn.use_cpu_kernel`` and ``LINMEM_CPU_KERNEL`` switch both.

Equations (PyTorch's), per step: the RNN ``h_t = sigma(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``
with ``sigma`` tanh or relu; the GRU::

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

The fast path takes a non-empty tensor input on the CPU (float32 or float64), one direction,
biases on (and no LSTM-style projection); anything else (a ``PackedSequence``, CUDA where cuDNN
is fast, a bidirectional layer) is PyTorch's own forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .nn import _KERNEL_CODES, _kernel_for, _lagged_product, _rows, activation_slope

__all__ = ["GRU", "RNN", "gru_recurrence", "rnn_recurrence"]


class _GRURecurrence(torch.autograd.Function):
    """The recurrence of one layer given its input products ``gi = x W_ih^T + b_ih`` ``(T, B,
    3H)``: ``hs (T, B, H)``. Backward: what does not depend on ``dh`` for all steps at once, then
    per step the gates' gradients and ``dh_{t-1} = dh_t z_t + dgh_t W_hh``, then ``dW_hh =
    sum_t dgh_t^T h_{t-1}`` in large products over all steps."""

    @staticmethod
    def forward(ctx, gi, h0, weight_hh, bias_hh):
        steps, batch, width = gi.shape
        hidden = width // 3
        hs = gi.new_empty(steps, batch, hidden)
        gates = gi.new_empty(steps, batch, width)  # r, z, n of every step
        gh = gi.new_empty(steps, batch, width)  # h_{t-1} W_hh^T + b_hh of every step
        kernel = _kernel_for(gi)
        if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
            module, variant = kernel
            module.gru_forward(_rows(gi), _rows(h0), weight_hh, bias_hh.contiguous(), hs, gates,
                               gh, variant)
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
        ctx.kernel = kernel
        ctx.save_for_backward(h0, hs, gates, gh, weight_hh)
        ctx.set_materialize_grads(False)
        return hs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_hs):
        h0, hs, gates, gh, weight_hh = ctx.saved_tensors
        hidden = hs.shape[2]
        if ctx.kernel is not None:  # the backward runs where the forward ran
            module, variant = ctx.kernel
            d_gh, d_n, dh = torch.empty_like(gates), torch.empty_like(hs), h0.new_empty(h0.shape)
            module.gru_backward(_rows(grad_hs), _rows(h0), hs, gates, gh, weight_hh, d_gh, d_n,
                                dh, variant)
        else:
            d_gh, d_n, dh = _gru_loop_backward(grad_hs, h0, hs, gates, gh, weight_hh)
        need = ctx.needs_input_grad
        flat = d_gh.reshape(-1, d_gh.shape[2])
        return (torch.cat([d_gh[..., :2 * hidden], d_n], 2) if need[0] else None,
                dh if need[1] else None,
                _lagged_product(d_gh, hs, h0, batch_major=False) if need[2] else None,
                flat.sum(0) if need[3] else None)


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
    return _GRURecurrence.apply(gi, h0, weight_hh, bias_hh)


class _RNNRecurrence(torch.autograd.Function):
    """The recurrence of one RNN layer given its input products ``gi = x W_ih^T + b_ih`` ``(T,
    B, H)``: ``hs (T, B, H)``. Backward: per step ``da_t = dh_t sigma'`` and ``dh_{t-1} = da_t
    W_hh``, then ``dW_hh = sum_t da_t^T h_{t-1}`` in large products over all steps."""

    @staticmethod
    def forward(ctx, gi, h0, weight_hh, bias_hh, nonlinearity):
        hs = torch.empty_like(gi, memory_format=torch.contiguous_format)
        kernel = _kernel_for(gi)
        if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
            module, variant = kernel
            module.rnn_forward(_rows(gi), _rows(h0), weight_hh, bias_hh.contiguous(),
                               _KERNEL_CODES[nonlinearity], hs, variant)
        else:
            w_t, h = weight_hh.t().contiguous(), h0
            for t in range(gi.shape[0]):
                h = torch.addmm(bias_hh, h, w_t, out=hs[t]).add_(gi[t])
                if nonlinearity == "tanh":
                    h.tanh_()
                else:
                    h.clamp_min_(0.0)
        ctx.nonlinearity, ctx.kernel = nonlinearity, kernel
        ctx.save_for_backward(h0, hs, weight_hh)
        ctx.set_materialize_grads(False)
        return hs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_hs):
        h0, hs, weight_hh = ctx.saved_tensors
        steps, batch, hidden = hs.shape
        d_a = torch.empty_like(hs)  # dL/d(pre-activation)
        if ctx.kernel is not None:  # the backward runs where the forward ran
            module, variant = ctx.kernel
            dh = h0.new_empty(h0.shape)
            module.rnn_backward(_rows(grad_hs), hs, weight_hh, _KERNEL_CODES[ctx.nonlinearity],
                                d_a, dh, variant)
        else:
            slope = activation_slope(hs, ctx.nonlinearity)
            dh = h0.new_zeros(batch, hidden)
            for t in range(steps - 1, -1, -1):
                if grad_hs is not None:
                    dh += grad_hs[t]
                dh = torch.mm(torch.mul(dh, slope[t], out=d_a[t]), weight_hh)
        need = ctx.needs_input_grad
        return (d_a if need[0] else None, dh if need[1] else None,
                _lagged_product(d_a, hs, h0, batch_major=False) if need[2] else None,
                d_a.reshape(-1, hidden).sum(0) if need[3] else None, None)


def rnn_recurrence(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor,
                   nonlinearity: str = "tanh") -> Tensor:
    """One RNN layer's states ``(T, B, H)`` from its input products ``gi = x W_ih^T + b_ih``
    ``(T, B, H)`` and initial state ``h0 (B, H)``, differentiable in all four."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return _RNNRecurrence.apply(gi, h0, weight_hh, bias_hh, nonlinearity)


class _FastForward:
    """The forward of :class:`RNN` and :class:`GRU`: PyTorch's module layer by layer, each
    layer's input products one matrix product and its recurrence :meth:`_recurrence`."""

    def _fast(self, input) -> bool:
        return (isinstance(input, Tensor) and input.device.type == "cpu"
                and input.dtype in (torch.float32, torch.float64) and not self.bidirectional
                and self.bias and not self.proj_size and input.dim() in (2, 3)
                and input.numel() > 0)

    def forward(self, input, hx=None):  # torch's argument names
        if not self._fast(input):
            return super().forward(input, hx)
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first
                                                   else input)
        batch = x.shape[1]
        if x.shape[2] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {x.shape[2]}")
        if hx is None:
            hx = x.new_zeros(self.num_layers, batch, self.hidden_size)
        elif unbatched:
            hx = hx.unsqueeze(1)
        if hx.shape != (self.num_layers, batch, self.hidden_size):
            raise RuntimeError(f"Expected hidden size {(self.num_layers, batch, self.hidden_size)}"
                               f", got {tuple(hx.shape)}")
        last = []
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(self, f"{name}_l{layer}") for name in
                                      ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            x = self._recurrence(nn.functional.linear(x, w_ih, b_ih), hx[layer], w_hh, b_hh)
            last.append(x[-1])
            if layer < self.num_layers - 1 and self.dropout and self.training:
                x = nn.functional.dropout(x, self.dropout, training=True)
        h_n = torch.stack(last, 0)
        out = x.transpose(0, 1) if self.batch_first and not unbatched else x
        if unbatched:
            out, h_n = out.squeeze(1), h_n.squeeze(1)
        return out, h_n


class RNN(_FastForward, nn.RNN):
    """``torch.nn.RNN`` (same arguments, parameters and results; tanh or relu), with the fast
    CPU path of this module. Shapes as ``torch.nn.RNN``'s: input ``(T, B, I)`` (``(B, T, I)``
    with ``batch_first``), ``h_0``/``h_n`` ``(num_layers, B, H)``; returns ``(output, h_n)``."""

    def _recurrence(self, gi, h0, w_hh, b_hh):
        return rnn_recurrence(gi, h0, w_hh, b_hh, self.nonlinearity)


class GRU(_FastForward, nn.GRU):
    """``torch.nn.GRU`` (same arguments, parameters and results), with the fast CPU path of this
    module. Shapes as ``torch.nn.GRU``'s: input ``(T, B, I)`` (``(B, T, I)`` with
    ``batch_first``), ``h_0``/``h_n`` ``(num_layers, B, H)``; returns ``(output, h_n)``."""

    _recurrence = staticmethod(gru_recurrence)
