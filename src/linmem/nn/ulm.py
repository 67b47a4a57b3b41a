"""The LMN unrolled for ``k`` steps (ULM, paper eqs. 10-11): the network whose hidden states the
pretraining's autoencoder encodes (:mod:`linmem.pretrain`); its recurrence is the operator of
:mod:`linmem.ops.ulm`."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from linmem._check import check_int
from linmem.nn.recurrent import in_parameter_precision, init_uniform, no_torchscript
from linmem.ops.toolkit import check_nonlinearity
from linmem.ops.ulm import ulm_states

__all__ = ["UnrolledNet"]


def _unrolled_states(x_proj: Tensor, past: Tensor, weight_hh: Tensor,
                     nonlinearity: str) -> Tensor:
    """Eq. (10)'s states ``(T, B, H)`` (:func:`linmem.ops.ulm.ulm_states`)."""
    return ulm_states(x_proj, past, weight_hh, nonlinearity)


class UnrolledNet(nn.Module):
    r"""The LMN unrolled for ``k`` steps (ULM, paper eqs. 10-11): the memory is replaced by the
    last ``k`` functional states, each with its own weight block.

    ::

        h_t = sigma(W^xh x_t + b^h + sum_{i=1..k} W^hh_i h_{t-i})      (10)
        y_t = sigmoid(sum_{i=0..k} W^o_i h_{t-i} + b^o)                 (11)

    with ``h_{t-i} = 0`` before the start. Convention: ``k`` past blocks feed the functional
    state, ``k + 1`` blocks (lag 0 included) the output, so the memory that replaces them must
    reconstruct ``k + 1`` blocks (:mod:`linmem.pretrain` fits it with window ``k + 1``).
    Training back-propagates through the whole sequence (nothing is detached).

    Args:
        input_size: the number of features of ``x_t``.
        hidden_size: the number of functional units ``H``.
        k: the number of past functional states that feed ``h_t``. Default: 10.
        nonlinearity: ``"selu"`` (the paper's choice for this model), ``"tanh"`` or
            ``"relu"``. Default: ``"selu"``.
        batch_first: if ``True``, input and outputs are batch first. Default: ``False``.
        device: where to create the parameters. Default: the current default device.
        dtype: the parameters' dtype. Default: the current default dtype.

    Inputs: input
        - **input**: ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``).

    Outputs: lagged, hs
        - **lagged**: ``(T, B, (k + 1) H)``, ``[h_t, h_{t-1}, ..., h_{t-k}]`` at every step (a
          linear readout of it is eq. 11).
        - **hs**: ``(T, B, H)``, the functional states.

    Parameters: ``weight_xh`` ``(H, input_size)``, ``bias_h`` ``(H,)``, ``weight_hh``
    ``(H, k H)`` ``= [W^hh_1 ... W^hh_k]``; initialised like :class:`LMNCell`.
    """

    __prepare_scriptable__ = no_torchscript

    def __init__(self, input_size: int, hidden_size: int, k: int = 10,
                 nonlinearity: str = "selu", batch_first: bool = False, device=None,
                 dtype=None):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("k", k)):
            check_int(name, value)
        check_nonlinearity(nonlinearity)
        factory = {"device": device, "dtype": dtype}
        self.input_size, self.hidden_size, self.k = input_size, hidden_size, k
        self.nonlinearity, self.batch_first = nonlinearity, batch_first
        self.weight_xh = nn.Parameter(torch.empty(hidden_size, input_size, **factory))
        self.bias_h = nn.Parameter(torch.zeros(hidden_size, **factory))
        self.weight_hh = nn.Parameter(torch.empty(hidden_size, k * hidden_size, **factory))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        with torch.no_grad():
            init_uniform(self.weight_xh, self.input_size)
            init_uniform(self.weight_hh, self.k * self.hidden_size)
            nn.init.zeros_(self.bias_h)

    @in_parameter_precision
    def forward(self, input: Tensor, past: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``past`` ``(B, k H)``: ``[h_0, h_{-1}, ..., h_{1-k}]`` before the first step (default
        zeros), e.g. ``lagged[:, -1, :k H]`` of a previous call, to continue a sequence."""
        if input.dim() != 3 or input.shape[-1] != self.input_size:
            raise ValueError(f"UnrolledNet expects input of shape (T, B, {self.input_size}) "
                             f"(batch first: (B, T, ...)), got {tuple(input.shape)}")
        x = input.transpose(0, 1) if self.batch_first else input
        steps, batch = x.shape[:2]
        x_proj = nn.functional.linear(x, self.weight_xh, self.bias_h)
        if past is None:
            past = x_proj.new_zeros(batch, self.k * self.hidden_size)
        if tuple(past.shape) != (batch, self.k * self.hidden_size):
            raise ValueError(f"past must have shape ({batch}, {self.k * self.hidden_size}), "
                             f"got {tuple(past.shape)}")
        before = past.unflatten(1, (self.k, self.hidden_size)).flip(1).transpose(0, 1)
        hs = (_unrolled_states(x_proj, past, self.weight_hh, self.nonlinearity)
              if steps else x_proj.new_zeros(0, batch, self.hidden_size))
        padded = torch.cat([before, hs])  # (k + T, B, H) in time order
        lagged = torch.cat([padded[self.k - i: self.k - i + steps] for i in range(self.k + 1)],
                           2)
        if self.batch_first:
            return lagged.transpose(0, 1), hs.transpose(0, 1)
        return lagged, hs

    def extra_repr(self) -> str:
        return (f"{self.input_size}, hidden_size={self.hidden_size}, k={self.k}, "
                f"nonlinearity={self.nonlinearity!r}")
