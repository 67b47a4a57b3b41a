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
the LMN's recurrence (:mod:`linmem.nn.lmn`; the operators: :mod:`linmem.ops.rnns`), the input
products of all steps are one matrix product
before the loop, the loop and its backward keep only the products with ``W_hh``, and the weight
gradients are one large product over all steps after it. The loops run in the LMN's compiled
kernel (``csrc/lmn_kernel.h``: the same register-tiled product over weights packed once per
call, the gates computed in place) wherever :func:`linmem.ops.cpu.cpu_path` chose one of its
variants for the LMN, else as a PyTorch loop; ``linmem.ops.paths.use_cpu_kernel`` and
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

from linmem.nn.recurrent import autocast_enabled, no_torchscript, to_dtype
from linmem.ops.cpu import LOOP
from linmem.ops.paths import cpu_kernel_path
from linmem.ops.rnns import gru_recurrence, lstm_recurrence, rnn_recurrence

__all__ = ["GRU", "LSTM", "RNN", "as_torch"]


class _FastForward:
    """The forward of :class:`RNN`, :class:`GRU` and :class:`LSTM`: PyTorch's module layer by
    layer, each layer's input products one matrix product and its recurrence
    :meth:`_recurrence` (``(hs, *the other last states)``: the LSTM's ``c_T``)."""

    __prepare_scriptable__ = no_torchscript

    def _fast(self, input) -> bool:
        return (isinstance(input, Tensor) and input.device.type == "cpu"
                and input.dtype in (torch.float32, torch.float64) and not self.bidirectional
                and self.bias and not self.proj_size and input.dim() in (2, 3)
                and input.numel() > 0)

    def forward(self, input, hx=None):  # torch's argument names
        if (isinstance(input, Tensor) and input.device.type == "cpu"
                and autocast_enabled("cpu")):  # the fast path, in the parameters' precision
            dtype = self.weight_ih_l0.dtype
            with torch.autocast("cpu", enabled=False):
                return self.forward(input.to(dtype), to_dtype(hx, dtype))
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
                and _kernel_available())

    def _recurrence(self, gi, h0, c0, w_hh, b_hh):
        return lstm_recurrence(gi, h0, c0, w_hh, b_hh)


_kernel_seen = False  # what the last eager call of _kernel_available found


def _kernel_available() -> bool:
    """Whether the CPU path is a compiled kernel variant. Under torch.compile, what eager mode
    last found (a module global, which dynamo guards on): tracing must not build or time the
    kernel, and before any eager call PyTorch's LSTM is the safe choice."""
    global _kernel_seen
    if torch.compiler.is_compiling():
        return _kernel_seen
    _kernel_seen = cpu_kernel_path() != LOOP
    return _kernel_seen


def as_torch(module: nn.RNNBase) -> nn.RNNBase:
    """PyTorch's own module (``torch.nn.RNN``, ``GRU`` or ``LSTM``, its CPU LSTM oneDNN's fused
    one) with ``module``'s configuration and a copy of its weights: the reference that
    :class:`RNN`, :class:`GRU` and :class:`LSTM` equal, for comparisons and benchmarks."""
    torch_cls = next((ref for ours, ref in ((LSTM, nn.LSTM), (GRU, nn.GRU), (RNN, nn.RNN))
                      if isinstance(module, ours)), None)
    if torch_cls is None:
        raise TypeError(f"expected a linmem.nn.rnns RNN, GRU or LSTM, got {type(module).__name__}")
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
