"""The Linear Memory Network layer: a non-linear functional part and a linear memory.

Paper, eqs. (6)-(7), with biases::

    h_t = sigma(W^xh x_t + W^mh m_{t-1} + b^h)      functional activation   (6)
    m_t = W^hm h_t + W^mm m_{t-1} + b^m              linear memory           (7)

The output of a layer is the memory sequence ``m_t`` (``output="memory"``, the LMN-B wiring of
eq. 8) or the functional sequence ``h_t`` (``output="hidden"``, LMN-A, eq. 9). ``h_t`` depends on
``m_{t-1}`` only, never on ``h_{t-1}``: the whole state of a layer is its memory.

Fast path (measured in ``benchmarks/throughput.py``): ``W^xh x_t + b^h`` for all steps is one
matrix product before the loop; the loop runs in a custom autograd function with an explicit
backward through time (only the products that must be sequential stay in the loop, in buffers
laid out like the input so that batch-first data is never transposed in memory); the weight
gradients are a few large products over all steps after it. On CPU (float32, float64) the loop
and its backward are the compiled kernel of ``csrc/lmn_cpu.cpp`` (:mod:`linmem.ops.cpu`), elsewhere
PyTorch ops; :func:`use_cpu_kernel` chooses between them. On CUDA the fused Triton kernels
(:mod:`linmem.ops.gpu`) run where measured faster; :func:`use_gpu_kernel` chooses.
"""

from __future__ import annotations

import warnings

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence, pack_padded_sequence, pad_packed_sequence

from linmem._check import check_int
from linmem.nn.recurrent import (
    check_dtype,
    in_parameter_precision,
    init_uniform,
    no_torchscript,
)
from linmem.ops.bound import DEFAULT_MEMORY_BOUND, bounded_memory, check_memory_bound
from linmem.ops.certified_norm import STATE
from linmem.ops.lmn import scan
from linmem.ops.loop_bound import bounded_loop, check_loop_bound
from linmem.ops.toolkit import check_nonlinearity, is_batch_major

__all__ = ["LMN", "LMNCell", "lmn_recurrence"]

_FUNCTIONS = {"tanh": torch.tanh, "relu": torch.relu, "selu": torch.selu}
_PARAM_NAMES = ("weight_xh", "weight_mh", "weight_hm", "weight_mm", "bias_h", "bias_m")

State = Tensor | tuple[Tensor | None, Tensor] | None

# a bounded layer's buffers (bound_vector, bound_anchor, bound_certificate; with a loop bound
# also bound_hm_* and bound_mh_*, of W^hm and W^mh): the certified norm's state at the last
# training update (linmem.ops.certified_norm.STATE: the power iteration's start, the matrix of
# the last full certificate and its bounds); in the state dict, so that a resumed run continues
# exactly as an uninterrupted one
_BOUND = "bound_"
_LOOP = ("", "hm_", "mh_")  # the buffers' infix of W^mm, W^hm and W^mh


def _bound_buffers(module: nn.Module, shapes: dict[str, tuple[int, int]], factory: dict) -> None:
    """Register the certified norm's buffers on ``module`` for each matrix of ``shapes``
    (infix -> ``(rows, cols)``: ``""`` for ``W^mm``)."""
    for infix, (rows, cols) in shapes.items():
        for name, shape in STATE.items():
            dtype = torch.float64 if name == "certificate" else factory["dtype"]
            module.register_buffer(_BOUND + infix + name, torch.zeros(
                shape(rows, cols), device=factory["device"], dtype=dtype))


def _bound_state(module: nn.Module, suffix: str = "", infix: str = "") -> tuple | None:
    """The buffers of :func:`_bound_buffers` (``suffix``: a layer's, ``_l0``; ``infix``: which
    matrix's), or None."""
    if not hasattr(module, f"{_BOUND}{infix}vector{suffix}"):
        return None
    return tuple(getattr(module, f"{_BOUND}{infix}{name}{suffix}") for name in STATE)


def _bound_shapes(loop: bool, hidden_size: int, memory_size: int) -> dict[str, tuple[int, int]]:
    """The matrices a bounded layer certifies: ``W^mm``, and with a loop bound ``W^hm`` and
    ``W^mh``."""
    shapes = {"": (memory_size, memory_size)}
    if loop:
        shapes.update({"hm_": (memory_size, hidden_size), "mh_": (hidden_size, memory_size)})
    return shapes


def _recurrent(weights: dict[str, Tensor | None], bound: float | None, loop: bool,
               nonlinearity: str, module: nn.Module, suffix: str,
               update: bool) -> tuple[Tensor, Tensor]:
    """``(W^mm, W^hm)`` as eqs. (6)-(7) run them: the parameters, or under a memory bound
    ``W^mm`` rescaled into its ball, or under a loop bound both scaled to the loop's gain
    (:mod:`linmem.ops.loop_bound`); with ``update``, the buffers moved on."""
    if loop:
        states = tuple(_bound_state(module, suffix, infix) for infix in _LOOP)
        return bounded_loop(weights["weight_mm"], weights["weight_hm"], weights["weight_mh"],
                            bound, nonlinearity, None if None in states else states, update)
    return (bounded_memory(weights["weight_mm"], bound, _bound_state(module, suffix), update),
            weights["weight_hm"])


def _bound_vectors_as_expected(module: nn.Module, state_dict: dict, prefix: str) -> None:
    """A state dict written without the bound's buffers (an unbounded layer's, or one saved
    before the certified norm) leaves the module's as they are (zeros: a cold start); one with
    buffers that the module has no bound for drops them. Changes ``state_dict`` in place."""
    own = {n for n, _ in module.named_buffers(recurse=False) if n.startswith(_BOUND)}
    for key in [k for k in state_dict if k.startswith(prefix + _BOUND)]:
        if key[len(prefix):] not in own:
            del state_dict[key]
    for name in own:
        state_dict.setdefault(prefix + name, getattr(module, name))

def _split_state(state: State) -> tuple[Tensor | None, Tensor | None]:
    """``(h, m)`` of a state given as the memory alone or as a ``(h, m)`` pair; only ``m``
    carries information (``h`` is checked for shape by the callers)."""
    if isinstance(state, tuple | list):
        if len(state) != 2:
            raise ValueError("state must be m_0 or a pair (h_0, m_0)")
        return state[0], state[1]
    return None, state


def _reset_layer(weights: dict[str, Tensor | None], input_size: int, hidden_size: int,
                 memory_size: int) -> None:
    """Weights ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, biases zero (see :class:`LMNCell`)."""
    with torch.no_grad():
        init_uniform(weights["weight_xh"], input_size)
        init_uniform(weights["weight_mh"], memory_size)
        init_uniform(weights["weight_hm"], hidden_size)
        init_uniform(weights["weight_mm"], memory_size)
        for name in ("bias_h", "bias_m"):
            if weights[name] is not None:
                nn.init.zeros_(weights[name])


def _time_major_linear(seq: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """``seq W^T + b`` for a ``(T, B, F)`` sequence, computed in ``seq``'s memory order so that
    a batch-first input is neither copied nor transposed in memory."""
    if is_batch_major(seq):
        return nn.functional.linear(seq.transpose(0, 1), weight, bias).transpose(0, 1)
    return nn.functional.linear(seq, weight, bias)


def lmn_recurrence(
    x_proj: Tensor,
    m0: Tensor,
    weight_mh: Tensor,
    weight_hm: Tensor,
    weight_mm: Tensor,
    bias_m: Tensor | None,
    nonlinearity: str = "tanh",
    lengths: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Run eqs. (6)-(7) over time (the fast path: the operator :func:`linmem.ops.lmn.lmn_scan`).

    Args:
        x_proj: ``(T, B, H)``, the input term ``W^xh x_t + b^h`` for every step.
        m0: ``(B, M)`` initial memory.
        nonlinearity: ``"tanh"`` (the paper), ``"relu"`` or ``"selu"``.
        lengths: optional ``(B,)`` valid steps per sequence (padding at the end); the final
            states are taken at each sequence's last valid step. Steps past a sequence's end are
            computed but never feed its valid steps.

    Returns:
        ``(hs, ms, h_n, m_n)``: ``(T, B, H)``, ``(T, B, M)``, and the states at each sequence's
        last valid step, ``(B, H)`` and ``(B, M)``.
    """
    check_nonlinearity(nonlinearity)
    steps, batch, hidden = x_proj.shape
    if steps == 0:
        return (x_proj.new_zeros(0, batch, hidden), x_proj.new_zeros(0, batch, m0.shape[1]),
                x_proj.new_zeros(batch, hidden), m0)
    if bias_m is None:
        bias_m = x_proj.new_zeros(weight_hm.shape[0])
    hs, ms = scan(x_proj, m0, weight_mh, weight_hm, weight_mm, bias_m, nonlinearity)
    if lengths is None:
        return hs, ms, hs[-1], ms[-1]
    index = torch.arange(batch, device=x_proj.device)
    last = (lengths.to(x_proj.device) - 1).clamp(min=0)
    return hs, ms, hs[last, index], ms[last, index]


class LMNCell(nn.Module):
    r"""One step of a Linear Memory Network, eqs. (6)-(7).

    Args:
        input_size: the number of features of ``x_t``.
        hidden_size: the number of functional units ``H``.
        memory_size: the number of memory units ``M``.
        bias: if ``False``, no ``b^h`` and ``b^m``. Default: ``True``.
        nonlinearity: the activation of eq. (6), ``"tanh"`` (the paper's), ``"relu"`` or
            ``"selu"``. Default: ``"tanh"``.
        memory_bound: ``r``: eq. (7) runs with ``W^mm = weight_mm * min(1, r / s)``, ``s`` a
            certified upper bound of ``||weight_mm||_2`` (:mod:`linmem.ops.certified_norm`), so
            ``||W^mm||_2 <= r`` whatever the parameter's value (:mod:`linmem.ops.bound`; below 1
            a tanh layer's memory cannot grow without bound; a relu or selu layer's could, through
            ``W^hm sigma(W^mh m)``, which ``loop_bound`` closes); its state is the buffers
            ``bound_vector``, ``bound_anchor`` and ``bound_certificate``, moved on in training
            mode. ``None``: the paper's
            unconstrained memory. Default: :data:`~linmem.ops.bound.DEFAULT_MEMORY_BOUND` (0.99).
        loop_bound: if ``True``, ``memory_bound`` holds the memory loop's gain
            ``||W^mm||_2 + L ||W^hm||_2 ||W^mh||_2`` (``L`` the activation's Lipschitz constant)
            instead: eqs. (6)-(7) run with ``W^mm`` and ``W^hm`` scaled by one factor so that it
            is at most ``r`` (:mod:`linmem.ops.loop_bound`), and below 1 a relu or selu layer's
            memory stays finite too; buffers ``bound_hm_*`` and ``bound_mh_*`` besides. ``None``:
            ``True`` for relu and selu under a memory bound, else ``False``. Default: ``None``.
        device: where to create the parameters. Default: the current default device.
        dtype: the parameters' dtype. Default: the current default dtype.

    Inputs: input, state
        - **input**: ``(B, input_size)`` or ``(input_size,)``: ``x_t``.
        - **state**: ``m_{t-1}`` ``(B, M)`` (``(M,)`` unbatched), or a pair
          ``(h_{t-1}, m_{t-1})`` as returned by a previous step (``h_{t-1}`` is not used by the
          equations). Default: zeros.

    Outputs: (h_t, m_t)
        - **h_t**: ``(B, H)`` (``(H,)`` unbatched), the functional activation.
        - **m_t**: ``(B, M)`` (``(M,)`` unbatched), the memory.

    Attributes:
        weight_xh: ``(H, input_size)``, ``W^xh``.
        weight_mh: ``(H, M)``, ``W^mh``.
        weight_hm: ``(M, H)``, ``W^hm``.
        weight_mm: ``(M, M)``, ``W^mm``.
        bias_h: ``(H,)``, ``b^h``.
        bias_m: ``(M,)``, ``b^m``.

    Weights are drawn from ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``; biases start at zero. The
    spectral radius of ``W^mm`` is then about ``1/sqrt(3)`` (circular law), so the linear memory
    is a contraction at initialisation and cannot accumulate without bound.
    """

    __prepare_scriptable__ = no_torchscript

    def __init__(self, input_size: int, hidden_size: int, memory_size: int, bias: bool = True,
                 nonlinearity: str = "tanh",
                 memory_bound: float | None = DEFAULT_MEMORY_BOUND,
                 loop_bound: bool | None = None, device=None, dtype=None):
        super().__init__()
        for name, value in (("input_size", input_size), ("hidden_size", hidden_size),
                            ("memory_size", memory_size)):
            check_int(name, value)
        factory = {"device": device, "dtype": dtype}
        self.input_size, self.hidden_size, self.memory_size = input_size, hidden_size, memory_size
        self.nonlinearity = nonlinearity
        check_nonlinearity(nonlinearity)
        self.memory_bound = check_memory_bound(memory_bound)
        self.loop_bound = check_loop_bound(loop_bound, nonlinearity, self.memory_bound)
        self.weight_xh = nn.Parameter(torch.empty(hidden_size, input_size, **factory))
        self.weight_mh = nn.Parameter(torch.empty(hidden_size, memory_size, **factory))
        self.weight_hm = nn.Parameter(torch.empty(memory_size, hidden_size, **factory))
        self.weight_mm = nn.Parameter(torch.empty(memory_size, memory_size, **factory))
        if bias:
            self.bias_h = nn.Parameter(torch.empty(hidden_size, **factory))
            self.bias_m = nn.Parameter(torch.empty(memory_size, **factory))
        else:
            self.register_parameter("bias_h", None)
            self.register_parameter("bias_m", None)
        if self.memory_bound is not None:
            _bound_buffers(self, _bound_shapes(self.loop_bound, hidden_size, memory_size),
                           factory)
        self.reset_parameters()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _bound_vectors_as_expected(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def reset_parameters(self) -> None:
        weights = {name: getattr(self, name) for name in _PARAM_NAMES}
        _reset_layer(weights, self.input_size, self.hidden_size, self.memory_size)

    @in_parameter_precision
    def forward(self, input: Tensor, state: State = None) -> tuple[Tensor, Tensor]:
        batched = input.dim() == 2
        if input.dim() not in (1, 2) or input.shape[-1] != self.input_size:
            raise ValueError(f"LMNCell expects input of shape (B, {self.input_size}) or "
                             f"({self.input_size},), got {tuple(input.shape)}")
        check_dtype(input, self.weight_xh)
        x = input if batched else input.unsqueeze(0)
        h0, m = _split_state(state)
        if m is None:
            m = x.new_zeros(x.shape[0], self.memory_size)
        elif not batched:
            m = m.unsqueeze(0)
        if m.shape != (x.shape[0], self.memory_size):
            raise ValueError(f"memory state must have shape ({x.shape[0]}, {self.memory_size}), "
                             f"got {tuple(m.shape)}")
        expected = (x.shape[0], self.hidden_size) if batched else (self.hidden_size,)
        if h0 is not None and tuple(h0.shape) != expected:
            raise ValueError(f"h_(t-1) must have shape {expected}, got {tuple(h0.shape)}")
        check_dtype(m, self.weight_xh, "the memory state")
        x_proj = nn.functional.linear(x, self.weight_xh, self.bias_h)
        w_mm, w_hm = self.recurrent_weights(self.training)
        _, _, h, m_new = lmn_recurrence(x_proj[None], m, self.weight_mh, w_hm, w_mm,
                                        self.bias_m, self.nonlinearity)  # 1 step
        return (h, m_new) if batched else (h.squeeze(0), m_new.squeeze(0))

    def memory_weight(self) -> Tensor:
        """``W^mm`` as eq. (7) uses it: ``weight_mm`` itself, or rescaled into the ball of
        ``memory_bound`` (under a loop bound, scaled to the loop's gain)."""
        return self.recurrent_weights(False)[0]

    def recurrent_weights(self, update: bool = False) -> tuple[Tensor, Tensor]:
        """``(W^mm, W^hm)`` as eqs. (6)-(7) run them; with ``update``, the certified norms'
        state moved on."""
        weights = {name: getattr(self, name) for name in _PARAM_NAMES}
        return _recurrent(weights, self.memory_bound, self.loop_bound, self.nonlinearity, self,
                          "", update)

    def extra_repr(self) -> str:
        s = (f"{self.input_size}, hidden_size={self.hidden_size}, "
             f"memory_size={self.memory_size}, nonlinearity={self.nonlinearity!r}")
        s += f", memory_bound={self.memory_bound}" if self.memory_bound is not None else ""
        return s + (", loop_bound=True" if self.loop_bound else "")


class LMN(nn.Module):
    r"""A multi-layer Linear Memory Network over sequences, used like ``torch.nn.RNN``.

    Args:
        input_size: the number of features of ``x_t``.
        hidden_size: the number of functional units ``H`` per layer.
        memory_size: the number of memory units ``M`` per layer.
        num_layers: stacked layers; layer ``k > 0`` reads the output sequence of layer
            ``k - 1``. Default: 1.
        output: ``"memory"`` (LMN-B, eq. 8: a layer outputs ``m_t``) or ``"hidden"`` (LMN-A,
            eq. 9: ``h_t``). Default: ``"memory"``.
        bias: if ``False``, no ``b^h`` and ``b^m``. Default: ``True``.
        batch_first: if ``True``, input and output are ``(B, T, F)`` instead of ``(T, B, F)``.
            Default: ``False``.
        nonlinearity: the activation of eq. (6), ``"tanh"`` (the paper's), ``"relu"`` or
            ``"selu"``. Default: ``"tanh"``.
        dropout: dropout on the outputs of every layer but the last, as in ``torch.nn.RNN``.
            Default: 0.
        bidirectional: if ``True``, every layer also runs over the reversed sequence (each
            sequence reversed within its own length) with weights of its own, and outputs both
            directions' states concatenated at each step, as ``torch.nn.RNN`` does. Default:
            ``False``.
        memory_bound: ``r``: every layer's eq. (7) runs with ``W^mm`` rescaled into the ball
            ``||W^mm||_2 <= r`` (:class:`LMNCell`, :mod:`linmem.ops.bound`; the parameters stay
            as they are, :meth:`memory_weight` gives the matrix used). Below 1 a tanh layer's
            memory stays finite for every input; a relu or selu layer's functional part is not
            bounded, and the loop ``m -> W^hm sigma(W^mh m)`` could still grow ``m``: with
            ``loop_bound`` (their default) ``r`` bounds the loop's gain. ``None``: the
            paper's unconstrained memory (and no loop bound). Default:
            :data:`~linmem.ops.bound.DEFAULT_MEMORY_BOUND` (0.99).
        loop_bound: if ``True``, ``memory_bound`` holds each layer's memory loop gain
            ``||W^mm||_2 + L ||W^hm||_2 ||W^mh||_2`` to ``r`` instead (:class:`LMNCell`), so that
            below 1 a relu or selu layer's memory stays finite for every input too. ``None``:
            ``True`` for relu and selu under a memory bound, else ``False``. Default: ``None``.
        device: where to create the parameters. Default: the current default device.
        dtype: the parameters' dtype. Default: the current default dtype.

    Inputs: input, state
        - **input**: ``(T, B, input_size)`` (``(B, T, input_size)`` with ``batch_first``),
          ``(T, input_size)`` unbatched, or a ``PackedSequence``.
        - **state**: ``m_0`` of shape ``(D * num_layers, B, M)`` (``(D * num_layers, M)``
          unbatched; ``D`` is 2 when bidirectional, else 1; layer ``k``'s reverse direction at
          ``2k + 1``), or a pair ``(h_0, m_0)`` as returned by a previous call (``h_0`` is not
          used by the equations). Default: zeros.

    Outputs: output, (h_n, m_n)
        - **output**: ``(T, B, D * M)`` (``(T, B, D * H)`` with ``output="hidden"``; batch
          first with ``batch_first``), the last layer's outputs (the forward direction's
          first); a ``PackedSequence`` for packed input (padded steps are zero).
        - **h_n**: ``(D * num_layers, B, H)``, every layer's ``h`` after each sequence's last
          step (the reverse direction's: after its first).
        - **m_n**: ``(D * num_layers, B, M)``, every layer's memory, likewise.

        Unlike ``torch.nn.RNN``'s, the state is two tensors, and which one the output reads
        depends on ``output``: for LMN-B (the default) the last step's output is
        ``m_n[-1]``, for LMN-A ``h_n[-1]`` (one layer, one direction)::

            out, (h_n, m_n) = LMN(88, 100, 50, batch_first=True)(x)  # LMN-B
            last = m_n[-1]                # == out[:, -1], the memory: (B, 50)
            functional = h_n[-1]          # the functional state h_T: (B, 100), not the output

    Attributes:
        weight_xh_l{k}, weight_mh_l{k}, weight_hm_l{k}, weight_mm_l{k}, bias_h_l{k},
            bias_m_l{k}: layer ``k``'s parameters, shaped and initialised as in
            :class:`LMNCell` (the reverse direction's end in ``_reverse``; layer ``k > 0``
            reads ``D`` times the output size).
        bound_vector_l{k}, bound_anchor_l{k}, bound_certificate_l{k}: with a bound, the
            certified norm's state (:data:`linmem.ops.certified_norm.STATE`), buffers in the
            state dict (zeros: a cold start, as a state dict without them loads); with a loop
            bound ``bound_hm_*_l{k}`` and ``bound_mh_*_l{k}`` too.
    """

    __prepare_scriptable__ = no_torchscript

    def __init__(self, input_size: int, hidden_size: int, memory_size: int, num_layers: int = 1,
                 output: str = "memory", bias: bool = True, batch_first: bool = False,
                 nonlinearity: str = "tanh", dropout: float = 0.0, bidirectional: bool = False,
                 memory_bound: float | None = DEFAULT_MEMORY_BOUND,
                 loop_bound: bool | None = None, device=None, dtype=None):
        super().__init__()
        if output not in ("memory", "hidden"):
            raise ValueError(f"output must be 'memory' (LMN-B) or 'hidden' (LMN-A), got {output!r}")
        check_int("num_layers", num_layers)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        if dropout and num_layers == 1:  # torch.nn.RNN's warning: nothing would be dropped
            warnings.warn("dropout acts between stacked layers, after every layer but the last: "
                          f"dropout={dropout} with num_layers=1 drops nothing (to drop the "
                          "layer's output, apply nn.Dropout to it)", stacklevel=2)
        self.input_size, self.hidden_size, self.memory_size = input_size, hidden_size, memory_size
        self.num_layers, self.output, self.bias = num_layers, output, bias
        self.batch_first, self.nonlinearity, self.dropout = batch_first, nonlinearity, dropout
        self.bidirectional = bool(bidirectional)
        self.memory_bound = check_memory_bound(memory_bound)
        self.loop_bound = check_loop_bound(loop_bound, nonlinearity, self.memory_bound)
        for k in range(num_layers):
            for reverse in self._directions():
                cell = LMNCell(self._layer_input_size(k), hidden_size, memory_size, bias,
                               nonlinearity, self.memory_bound, self.loop_bound, device=device,
                               dtype=dtype)
                for name, param in cell.named_parameters():
                    self.register_parameter(f"{name}_l{k}{'_reverse' * reverse}", param)
                for name, buffer in cell.named_buffers():
                    self.register_buffer(f"{name}_l{k}{'_reverse' * reverse}", buffer)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        _bound_vectors_as_expected(self, state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def _directions(self) -> tuple[bool, ...]:
        """``reverse`` of each direction of a layer, in the order of the outputs and states."""
        return (False, True) if self.bidirectional else (False,)

    def _layer_input_size(self, k: int) -> int:
        out_size = self.memory_size if self.output == "memory" else self.hidden_size
        return self.input_size if k == 0 else len(self._directions()) * out_size

    def reset_parameters(self) -> None:
        for k in range(self.num_layers):
            for reverse in self._directions():
                _reset_layer(self.layer_weights(k, reverse), self._layer_input_size(k),
                             self.hidden_size, self.memory_size)

    def flatten_parameters(self) -> None:
        """Nothing to do (``torch.nn.RNN``'s packs cuDNN's weights into one buffer; the LMN's
        recurrence reads its parameters as they are): there so that code written for
        ``torch.nn.RNN`` runs unchanged."""

    @property
    def all_weights(self) -> list[list[nn.Parameter]]:
        """Each layer's parameters (each direction's, the forward one first): ``weight_xh``,
        ``weight_mh``, ``weight_hm``, ``weight_mm``, then the biases, as
        ``torch.nn.RNN.all_weights`` lists its own."""
        return [[w for w in self.layer_weights(k, reverse).values() if w is not None]
                for k in range(self.num_layers) for reverse in self._directions()]

    def layer_weights(self, k: int, reverse: bool = False) -> dict[str, Tensor | None]:
        """The parameters of layer ``k`` (its reverse direction's with ``reverse``) under their
        cell names (``weight_xh``, ...)."""
        if reverse and not self.bidirectional:
            raise ValueError("the LMN is not bidirectional: it has no reverse direction")
        suffix = "_reverse" if reverse else ""
        return {name: getattr(self, f"{name}_l{k}{suffix}", None) for name in _PARAM_NAMES}

    def memory_weight(self, k: int = 0, reverse: bool = False) -> Tensor:
        """Layer ``k``'s ``W^mm`` as eq. (7) uses it: ``weight_mm_l{k}`` itself, or rescaled
        into the ball of ``memory_bound`` (under a loop bound, scaled to the loop's gain)."""
        return self.recurrent_weights(k, reverse)[0]

    def recurrent_weights(self, k: int = 0, reverse: bool = False,
                          update: bool = False) -> tuple[Tensor, Tensor]:
        """Layer ``k``'s ``(W^mm, W^hm)`` as eqs. (6)-(7) run them (under a bound, scaled);
        with ``update``, the certified norms' state (the buffers ``bound_*_l{k}``) moved on to
        this call's."""
        suffix = f"_l{k}" + ("_reverse" if reverse else "")
        return _recurrent(self.layer_weights(k, reverse), self.memory_bound, self.loop_bound,
                          self.nonlinearity, self, suffix, update)

    @in_parameter_precision
    def forward(self, input: Tensor | PackedSequence, state: State = None):
        packed = isinstance(input, PackedSequence)
        if packed:
            x, lengths = pad_packed_sequence(input)  # (T, B, F), original batch order
            unbatched = False
        else:
            if input.dim() not in (2, 3):
                raise ValueError("LMN expects input of shape (T, B, F), (B, T, F) with "
                                 f"batch_first, or (T, F); got {tuple(input.shape)}")
            unbatched = input.dim() == 2
            x = input.unsqueeze(1) if unbatched else (
                input.transpose(0, 1) if self.batch_first else input)
            lengths = None
        if x.shape[-1] != self.input_size:
            raise ValueError(f"input has {x.shape[-1]} features, the LMN expects "
                             f"{self.input_size}")
        check_dtype(x, self.weight_xh_l0)
        steps, batch = x.shape[0], x.shape[1]
        states = len(self._directions()) * self.num_layers
        h0, m0 = _split_state(state)
        if m0 is None:
            m0 = x.new_zeros(states, batch, self.memory_size)
        elif unbatched and m0.dim() == 2:
            m0 = m0.unsqueeze(1)
        if m0.shape != (states, batch, self.memory_size):
            raise ValueError(f"memory state must have shape ({states}, {batch}, "
                             f"{self.memory_size}), got {tuple(m0.shape)}")
        if h0 is not None:  # not used by the equations, but a wrong one is a caller's bug
            expected = ((states, self.hidden_size) if unbatched
                        else (states, batch, self.hidden_size))
            if tuple(h0.shape) != expected:
                raise ValueError(f"h_0 must have shape {expected}, got {tuple(h0.shape)}")
        check_dtype(m0, self.weight_xh_l0, "the memory state")
        mask = None
        packed_lengths = lengths
        if lengths is not None and bool((lengths != steps).any()):
            mask = (torch.arange(steps)[:, None] < lengths[None, :]).to(x.device)
        else:
            lengths = None  # every sequence is as long as the batch: no masking to do
        h_n, m_n = [], []
        layer_in = x
        for k in range(self.num_layers):
            outs = []
            for reverse in self._directions():
                w = self.layer_weights(k, reverse)
                seq = _reverse_steps(layer_in, lengths) if reverse else layer_in
                x_proj = _time_major_linear(seq, w["weight_xh"], w["bias_h"])
                w_mm, w_hm = self.recurrent_weights(k, reverse, self.training)
                hs, ms, h_last, m_last = lmn_recurrence(
                    x_proj, m0[len(h_n)], w["weight_mh"], w_hm, w_mm, w["bias_m"],
                    self.nonlinearity, lengths)
                h_n.append(h_last)
                m_n.append(m_last)
                out = ms if self.output == "memory" else hs
                outs.append(_reverse_steps(out, lengths) if reverse else out)
            layer_in = torch.cat(outs, -1) if len(outs) > 1 else outs[0]
            if self.dropout and self.training and k < self.num_layers - 1:
                layer_in = nn.functional.dropout(layer_in, self.dropout, training=True)
        h_n, m_n = torch.stack(h_n), torch.stack(m_n)
        out = layer_in
        if packed:
            if mask is not None:
                out = out * mask[:, :, None].to(out.dtype)
            return _pack_like(out, packed_lengths, input), (h_n, m_n)
        if unbatched:
            return out.squeeze(1), (h_n.squeeze(1), m_n.squeeze(1))
        if self.batch_first:
            out = out.transpose(0, 1)
        return out, (h_n, m_n)

    def extra_repr(self) -> str:
        s = (f"{self.input_size}, hidden_size={self.hidden_size}, memory_size="
             f"{self.memory_size}, num_layers={self.num_layers}, output={self.output!r}")
        if self.batch_first:
            s += ", batch_first=True"
        if self.dropout:
            s += f", dropout={self.dropout}"
        if self.bidirectional:
            s += ", bidirectional=True"
        if self.memory_bound is not None:
            s += f", memory_bound={self.memory_bound}"
        if self.loop_bound:
            s += ", loop_bound=True"
        return s


def _pack_like(out: Tensor, lengths: Tensor, like: PackedSequence) -> PackedSequence:
    """``out`` ``(T, B, n)`` (the batch in its original order, ``lengths`` steps each) packed
    as ``like`` is: the same batch sizes and sorting indices, as ``torch.nn.RNN`` returns."""
    if like.sorted_indices is not None:
        out, lengths = out.index_select(1, like.sorted_indices), lengths[like.sorted_indices.cpu()]
    data = pack_padded_sequence(out, lengths, enforce_sorted=True).data
    return PackedSequence(data, like.batch_sizes, like.sorted_indices, like.unsorted_indices)


def _reverse_steps(seq: Tensor, lengths: Tensor | None) -> Tensor:
    """``(T, B, n)`` with each sequence's steps in reverse order within its length (``lengths``
    ``(B,)``; None: all ``T``); the padded steps after a sequence's end stay where they are."""
    if lengths is None:
        return seq.flip(0)
    steps = torch.arange(seq.shape[0])[:, None]
    valid = lengths.to(steps.dtype)[None, :]
    index = torch.where(steps < valid, valid - 1 - steps, steps).to(seq.device)
    return seq.gather(0, index[:, :, None].expand_as(seq))
