"""``torch.nn.RNN``, ``torch.nn.GRU`` and ``torch.nn.LSTM`` with an explicit backward through
time on the CPU (the baselines' speed).

The RNN, GRU and LSTM of the paper's comparison are PyTorch's; :class:`RNN`, :class:`GRU` and
:class:`LSTM` are those modules (subclasses: the same parameters, initialisation,
``state_dict`` keys and results), trained faster on the CPU. PyTorch's CPU RNN and GRU run
their backward step by step through autograd, and at every step they form and add a gradient of
``W_hh`` (``H x H``, ``3H x H``) from a product of inner dimension ``B``: memory-bound work that
dominates at the batch sizes and widths of the searches; its LSTM is oneDNN's fused one, as fast
as ours at 250 units but slower at 750, most of all beside other busy processes (so
:class:`LSTM` takes the kernel from 512 units on). Here, as in
the LMN's recurrence (:mod:`linmem.nn`), the input products of all steps are one matrix product
before the loop, the loop and its backward keep only the products with ``W_hh``, and the weight
gradients are one large product over all steps after it. The loops run in the LMN's compiled
kernel (``csrc/lmn_kernel.h``: the same register-tiled product over weights packed once per
call, the gates computed in place) wherever :func:`linmem._ext.cpu_path` chose one of its
variants for the LMN, else as a PyTorch loop; ``linmem.nn.use_cpu_kernel`` and
``LINMEM_CPU_KERNEL`` switch both.

Equations (PyTorch's), per step: the RNN ``h_t = sigma(W_ih x_t + b_ih + W_hh h_{t-1} + b_hh)``
with ``sigma`` tanh or relu; the GRU::

    r_t = sigmoid(W_ir x_t + b_ir + W_hr h_{t-1} + b_hr)
    z_t = sigmoid(W_iz x_t + b_iz + W_hz h_{t-1} + b_hz)
    n_t = tanh(W_in x_t + b_in + r_t * (W_hn h_{t-1} + b_hn))
    h_t = (1 - z_t) * n_t + z_t * h_{t-1}

the LSTM (gates ``i, f, g, o`` in that order in its weights)::

    i_t, f_t, o_t = sigmoid(W_i* x_t + b_i* + W_h* h_{t-1} + b_h*)
    g_t = tanh(W_ig x_t + b_ig + W_hg h_{t-1} + b_hg)
    c_t = f_t * c_{t-1} + i_t * g_t,   h_t = o_t * tanh(c_t)

The fast path takes a non-empty tensor input on the CPU (float32 or float64), one direction,
biases on (and no LSTM projection); anything else (a ``PackedSequence``, CUDA where cuDNN is
fast, a bidirectional layer) is PyTorch's own forward.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from .nn import _autocast_enabled, _to_dtype, activation_slope
from .ops import _KERNEL_CODES, _eager, _kernel_for, _lagged_product, _rows

__all__ = ["GRU", "LSTM", "RNN", "as_torch", "gru_recurrence", "lstm_recurrence",
           "rnn_recurrence"]


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


@_eager
def gru_recurrence(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor) -> Tensor:
    """One GRU layer's states ``(T, B, H)`` from its input products ``gi = x W_ih^T + b_ih``
    ``(T, B, 3H)`` and initial state ``h0 (B, H)``, differentiable in all four."""
    return _GRURecurrence.apply(gi, h0, weight_hh, bias_hh)


class _LSTMRecurrence(torch.autograd.Function):
    """The recurrence of one LSTM layer given its input products ``gi = x W_ih^T + b_ih`` ``(T,
    B, 4H)``: ``(hs, c_T)``, ``(T, B, H)`` and ``(B, H)``. Backward: per step the gates'
    gradients ``da_t``, ``dc_{t-1} = dc_t f_t`` and ``dh_{t-1} = da_t W_hh``, then ``dW_hh =
    sum_t da_t^T h_{t-1}`` in large products over all steps."""

    @staticmethod
    def forward(ctx, gi, h0, c0, weight_hh, bias_hh):
        steps, batch, width = gi.shape
        hidden = width // 4
        hs, cs, tcs = (gi.new_empty(steps, batch, hidden) for _ in range(3))
        gates = gi.new_empty(steps, batch, width)  # i, f, g, o of every step
        kernel = _kernel_for(gi)
        if kernel is not None:  # the compiled loop (csrc/lmn_kernel.h), the same equations
            module, variant = kernel
            module.lstm_forward(_rows(gi), _rows(h0), _rows(c0), weight_hh,
                                bias_hh.contiguous(), hs, cs, tcs, gates, variant)
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
        ctx.kernel = kernel
        ctx.save_for_backward(h0, c0, hs, cs, tcs, gates, weight_hh)
        ctx.set_materialize_grads(False)
        return hs, cs[-1].clone()  # c_T: the cell state that leaves the layer

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_hs, grad_cn):
        h0, c0, hs, cs, tcs, gates, weight_hh = ctx.saved_tensors
        hidden = hs.shape[2]
        if ctx.kernel is not None:  # the backward runs where the forward ran
            module, variant = ctx.kernel
            d_a = torch.empty_like(gates)
            dh, dc = h0.new_empty(h0.shape), c0.new_empty(c0.shape)
            module.lstm_backward(_rows(grad_hs), _rows(grad_cn), _rows(c0), cs, tcs, gates,
                                 weight_hh, d_a, dh, dc, variant)
        else:
            d_a, dh, dc = _lstm_loop_backward(grad_hs, grad_cn, c0, cs, tcs, gates, weight_hh)
        need = ctx.needs_input_grad
        return (d_a if need[0] else None, dh if need[1] else None, dc if need[2] else None,
                _lagged_product(d_a, hs, h0, batch_major=False) if need[3] else None,
                d_a.reshape(-1, 4 * hidden).sum(0) if need[4] else None)


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


@_eager
def lstm_recurrence(gi: Tensor, h0: Tensor, c0: Tensor, weight_hh: Tensor,
                    bias_hh: Tensor) -> tuple[Tensor, Tensor]:
    """One LSTM layer's states ``hs (T, B, H)`` and last cell state ``c_T (B, H)`` from its
    input products ``gi = x W_ih^T + b_ih`` ``(T, B, 4H)`` and initial states ``h0, c0 (B,
    H)``, differentiable in all five."""
    return _LSTMRecurrence.apply(gi, h0, c0, weight_hh, bias_hh)


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


@_eager
def rnn_recurrence(gi: Tensor, h0: Tensor, weight_hh: Tensor, bias_hh: Tensor,
                   nonlinearity: str = "tanh") -> Tensor:
    """One RNN layer's states ``(T, B, H)`` from its input products ``gi = x W_ih^T + b_ih``
    ``(T, B, H)`` and initial state ``h0 (B, H)``, differentiable in all four."""
    if nonlinearity not in ("tanh", "relu"):
        raise ValueError(f"nonlinearity must be 'tanh' or 'relu', got {nonlinearity!r}")
    return _RNNRecurrence.apply(gi, h0, weight_hh, bias_hh, nonlinearity)


class _FastForward:
    """The forward of :class:`RNN`, :class:`GRU` and :class:`LSTM`: PyTorch's module layer by
    layer, each layer's input products one matrix product and its recurrence
    :meth:`_recurrence` (``(hs, *the other last states)``: the LSTM's ``c_T``)."""

    def _fast(self, input) -> bool:
        return (isinstance(input, Tensor) and input.device.type == "cpu"
                and input.dtype in (torch.float32, torch.float64) and not self.bidirectional
                and self.bias and not self.proj_size and input.dim() in (2, 3)
                and input.numel() > 0)

    def forward(self, input, hx=None):  # torch's argument names
        if (isinstance(input, Tensor) and input.device.type == "cpu"
                and _autocast_enabled("cpu")):  # the fast path, in the parameters' precision
            dtype = self.weight_ih_l0.dtype
            with torch.autocast("cpu", enabled=False):
                return self.forward(input.to(dtype), _to_dtype(hx, dtype))
        if not self._fast(input):
            return super().forward(input, hx)
        lstm = isinstance(self, nn.LSTM)  # its state is the pair (h, c)
        unbatched = input.dim() == 2
        x = input.unsqueeze(1) if unbatched else (input.transpose(0, 1) if self.batch_first
                                                   else input)
        batch = x.shape[1]
        if x.shape[2] != self.input_size:
            raise RuntimeError(f"input.size(-1) must be equal to input_size. Expected "
                               f"{self.input_size}, got {x.shape[2]}")
        if hx is None:
            states = tuple(x.new_zeros(self.num_layers, batch, self.hidden_size)
                           for _ in range(2 if lstm else 1))
        else:
            states = tuple(hx) if lstm else (hx,)
            if unbatched:
                states = tuple(s.unsqueeze(1) for s in states)
        for s in states:
            if s.shape != (self.num_layers, batch, self.hidden_size):
                raise RuntimeError(f"Expected hidden size "
                                   f"{(self.num_layers, batch, self.hidden_size)}, got "
                                   f"{tuple(s.shape)}")
        last = [[] for _ in states]
        for layer in range(self.num_layers):
            w_ih, w_hh, b_ih, b_hh = (getattr(self, f"{name}_l{layer}") for name in
                                      ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
            x, *others = self._recurrence(nn.functional.linear(x, w_ih, b_ih),
                                          *(s[layer] for s in states), w_hh, b_hh)
            for kept, state in zip(last, (x[-1], *others), strict=True):
                kept.append(state)
            if layer < self.num_layers - 1 and self.dropout and self.training:
                x = nn.functional.dropout(x, self.dropout, training=True)
        finals = tuple(torch.stack(kept, 0) for kept in last)
        out = x.transpose(0, 1) if self.batch_first and not unbatched else x
        if unbatched:
            out, finals = out.squeeze(1), tuple(f.squeeze(1) for f in finals)
        return out, (finals if lstm else finals[0])


class RNN(_FastForward, nn.RNN):
    """``torch.nn.RNN`` (same arguments, parameters and results; tanh or relu), with the fast
    CPU path of this module. Shapes as ``torch.nn.RNN``'s: input ``(T, B, I)`` (``(B, T, I)``
    with ``batch_first``), ``h_0``/``h_n`` ``(num_layers, B, H)``; returns ``(output, h_n)``."""

    def _recurrence(self, gi, h0, w_hh, b_hh):
        return (rnn_recurrence(gi, h0, w_hh, b_hh, self.nonlinearity),)


class GRU(_FastForward, nn.GRU):
    """``torch.nn.GRU`` (same arguments, parameters and results), with the fast CPU path of this
    module. Shapes as ``torch.nn.GRU``'s: input ``(T, B, I)`` (``(B, T, I)`` with
    ``batch_first``), ``h_0``/``h_n`` ``(num_layers, B, H)``; returns ``(output, h_n)``."""

    def _recurrence(self, gi, h0, w_hh, b_hh):
        return (gru_recurrence(gi, h0, w_hh, b_hh),)


class LSTM(_FastForward, nn.LSTM):
    """``torch.nn.LSTM`` (same arguments, parameters and results; no projection on the fast
    path), with the fast CPU path of this module where it is faster than PyTorch's own: on the
    compiled kernel (not on the PyTorch loop, which oneDNN's fused LSTM outruns) and from
    ``min_kernel_hidden`` units on (an attribute; 512 by default: training at batch 4 on an
    AMD EPYC Zen 3 ran at 0.97x oneDNN's rate with 250 units, 1.10x with 500 (0.97x in another
    run) and 1.21x with 750 on a quiet machine, 0.92x and 1.74x with 250 and 750 beside two
    other trainings, ``results/speed/baselines*.txt``). Shapes as ``torch.nn.LSTM``'s: input
    ``(T, B, I)`` (``(B, T, I)`` with ``batch_first``), ``h_0``/``c_0`` and ``h_n``/``c_n``
    ``(num_layers, B, H)``; returns ``(output, (h_n, c_n))``."""

    min_kernel_hidden = 512

    def _fast(self, input) -> bool:
        return (super()._fast(input) and self.hidden_size >= self.min_kernel_hidden
                and _kernel_for(input) is not None)

    def _recurrence(self, gi, h0, c0, w_hh, b_hh):
        return lstm_recurrence(gi, h0, c0, w_hh, b_hh)


def as_torch(module: nn.RNNBase) -> nn.RNNBase:
    """PyTorch's own module (``torch.nn.RNN``, ``GRU`` or ``LSTM``, its CPU LSTM oneDNN's fused
    one) with ``module``'s configuration and a copy of its weights: the reference that
    :class:`RNN`, :class:`GRU` and :class:`LSTM` equal, for comparisons and benchmarks."""
    torch_cls = next((ref for ours, ref in ((LSTM, nn.LSTM), (GRU, nn.GRU), (RNN, nn.RNN))
                      if isinstance(module, ours)), None)
    if torch_cls is None:
        raise TypeError(f"expected a linmem.rnns RNN, GRU or LSTM, got {type(module).__name__}")
    kwargs = dict(input_size=module.input_size, hidden_size=module.hidden_size,
                  num_layers=module.num_layers, bias=module.bias,
                  batch_first=module.batch_first, dropout=module.dropout,
                  bidirectional=module.bidirectional)
    if torch_cls is nn.RNN:
        kwargs["nonlinearity"] = module.nonlinearity
    if torch_cls is nn.LSTM:
        kwargs["proj_size"] = module.proj_size
    reference = torch_cls(**kwargs)
    p = next(module.parameters())
    reference.to(device=p.device, dtype=p.dtype).load_state_dict(module.state_dict())
    return reference.train(module.training)
