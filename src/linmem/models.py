"""Next-step predictors over piano rolls: a recurrent core and a sigmoid readout over the keys.

================  ==========================================  ==========================
name              core                                        readout reads
================  ==========================================  ==========================
``lmn-a``         :class:`linmem.LMN`, ``output="hidden"``     ``h_t`` (eq. 9)
``lmn-b``         :class:`linmem.LMN`, ``output="memory"``     ``m_t`` (eq. 8)
``rnn``           ``torch.nn.RNN`` (Elman, tanh)               ``h_t``
``lstm``          ``torch.nn.LSTM``                            ``h_t``
``gru``           ``torch.nn.GRU``                             ``h_t``
``ulm``           :class:`linmem.UnrolledNet` (eqs. 10-11)     ``h_t .. h_{t-k}`` (eq. 11)
``pret-lmn-a``    as ``lmn-a``, initialised by pretraining     ``h_t``
``pret-lmn-b``    as ``lmn-b``, initialised by pretraining     ``m_t``
``pret-rnn``      as ``rnn``, initialised by pretraining       ``h_t``
================  ==========================================  ==========================

Every model maps inputs ``(B, T, K)`` to logits ``(B, T, K)``; ``sigmoid(logits[:, t])`` is the
predicted probability of each key at step ``t + 1``. The readout is ``Linear(out, K)`` with a bias
(the paper writes ``sigma(W^mo m_t)``; the bias is the usual per-key base rate). The ``pret-``
models are the same networks; :mod:`linmem.pretrain` sets their initial weights (the trainer
calls it), see there.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from .data import N_KEYS
from .nn import _NONLINEARITIES, LMN, UnrolledNet

MODELS = ("lmn-a", "lmn-b", "rnn", "lstm", "gru", "ulm", "pret-lmn-a", "pret-lmn-b", "pret-rnn")
# every model the trainer takes: the NextStepPredictor networks above and the RNN-RBM
# (linmem.rnnrbm), which is trained by contrastive divergence instead of the Bernoulli NLL
ALL_MODELS = (*MODELS, "rnn-rbm")
_TORCH_RNNS: dict[str, Callable[..., nn.Module]] = {"rnn": nn.RNN, "lstm": nn.LSTM,
                                                    "gru": nn.GRU}


class NextStepPredictor(nn.Module):
    """``core`` (batch first) followed by a linear readout to ``n_keys`` logits."""

    def __init__(self, name: str, input_size: int = N_KEYS, hidden: int = 100,
                 memory: int | None = None, num_layers: int = 1, dropout: float = 0.0,
                 nonlinearity: str | None = None, k: int = 10):
        super().__init__()
        nonlinearity = check_options(name, nonlinearity, num_layers)
        arch = architecture(name)
        for label, value in (("hidden", hidden), ("num_layers", num_layers),
                             ("input_size", input_size)):
            if int(value) != value or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        self.name, self.input_size, self.hidden, self.num_layers = name, input_size, hidden, \
            num_layers
        self.nonlinearity, self.k = nonlinearity, None
        if arch.startswith("lmn"):
            memory = hidden if memory is None else memory
            if int(memory) != memory or memory < 1:
                raise ValueError(f"memory must be a positive integer, got {memory!r}")
            output = "hidden" if arch == "lmn-a" else "memory"
            self.core = LMN(input_size, hidden, memory, num_layers, output=output,
                            batch_first=True, nonlinearity=nonlinearity,
                            dropout=dropout if num_layers > 1 else 0.0)
            out_size = hidden if arch == "lmn-a" else memory
        elif arch == "ulm":
            memory, self.k = None, k
            self.core = UnrolledNet(input_size, hidden, k, nonlinearity, batch_first=True)
            out_size = (k + 1) * hidden
        else:
            memory = None
            extra = {"nonlinearity": nonlinearity} if arch == "rnn" else {}
            self.core = _TORCH_RNNS[arch](input_size, hidden, num_layers, batch_first=True,
                                          dropout=dropout if num_layers > 1 else 0.0, **extra)
            out_size = hidden
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.memory, self.dropout = memory, dropout
        self.drop = nn.Dropout(dropout)
        self.readout = nn.Linear(out_size, input_size)

    def forward(self, inputs: Tensor) -> Tensor:
        """``inputs (B, T, K)`` -> logits ``(B, T, K)``. Padding at the end of a sequence does not
        change the logits of its valid steps (the recurrence is causal)."""
        out, _ = self.core(inputs)
        return self.readout(self.drop(out))

    @torch.no_grad()
    def init_output_bias(self, key_rates: Tensor, eps: float = 1e-3) -> None:
        """Set the readout bias to the log-odds of each key's rate (from the training split), so
        that training starts from the per-key base rates instead of p = 0.5 everywhere."""
        p = torch.as_tensor(key_rates, dtype=self.readout.bias.dtype).clamp(eps, 1 - eps)
        self.readout.bias.copy_(torch.log(p) - torch.log1p(-p))

    def config(self) -> dict:
        return {"model": self.name, "hidden": self.hidden, "memory": self.memory,
                "num_layers": self.num_layers, "input_size": self.input_size,
                "dropout": self.dropout, "nonlinearity": self.nonlinearity, "k": self.k}


def architecture(name: str) -> str:
    """The network behind a registry name: ``pret-lmn-b`` -> ``lmn-b``, ``lstm`` -> ``lstm``."""
    return name.removeprefix("pret-")


def default_nonlinearity(name: str) -> str:
    """SELU for the unrolled network and the LMNs initialised from it (the paper found it helps
    the unrolled model converge; the transfer is exact only with the same activation), tanh for
    the rest."""
    return "selu" if name in ("ulm", "pret-lmn-a", "pret-lmn-b") else "tanh"


def check_options(name: str, nonlinearity: str | None = None, num_layers: int = 1,
                  dropout: float = 0.0) -> str:
    """Validate a model name with its activation, depth and dropout, without building anything;
    returns the activation (``nonlinearity`` or :func:`default_nonlinearity`)."""
    if name not in ALL_MODELS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(ALL_MODELS)}")
    arch = architecture(name)
    nonlinearity = nonlinearity or default_nonlinearity(name)
    allowed = {"lstm": ("tanh",), "gru": ("tanh",), "rnn-rbm": ("tanh",),
               "rnn": ("tanh", "relu")}.get(
        arch, _NONLINEARITIES)
    if nonlinearity not in allowed:
        if len(allowed) == 1:
            raise ValueError(f"{name} has no nonlinearity option (got {nonlinearity!r})")
        raise ValueError(f"{name}: nonlinearity must be one of {list(allowed)}, "
                         f"got {nonlinearity!r}")
    if arch in ("ulm", "rnn-rbm") and num_layers != 1:
        raise ValueError(f"{name} has one layer")
    if arch == "rnn-rbm" and dropout:
        raise ValueError("rnn-rbm has no dropout option")
    return nonlinearity


def build_model(name: str, hidden: int, memory: int | None = None, num_layers: int = 1,
                input_size: int = N_KEYS, dropout: float = 0.0, nonlinearity: str | None = None,
                k: int = 10, **rbm_options) -> nn.Module:
    """A next-step predictor by registry name (see :data:`ALL_MODELS`); ``dropout`` is applied
    to the recurrent output before the readout (and between layers); ``nonlinearity`` defaults
    to :func:`default_nonlinearity`; ``k`` is the unrolled network's number of past blocks.
    ``rnn-rbm``: ``hidden`` RNN units, ``rbm_options`` passed to :class:`linmem.rnnrbm.RNNRBM`
    (``n_hidden``, ``cd_k``, ``predict``)."""
    if name == "rnn-rbm":
        from .rnnrbm import RNNRBM

        check_options(name, nonlinearity, num_layers, dropout)
        return RNNRBM(input_size, n_recurrent=hidden, **rbm_options)
    return NextStepPredictor(name, input_size, hidden, memory, num_layers, dropout,
                             nonlinearity, k)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def recurrent_weight_count(name: str, x: int, h: int, m: int | None = None, k: int = 10) -> int:
    """The paper's count of a single layer's recurrent weights (biases and readout excluded).

    Section "A comparison with gated recurrent architectures": LSTM ``4(x + h)h``, GRU
    ``3(x + h)h``, LMN ``(x + m)f + (f + m)m`` with ``f = h`` functional units; an Elman RNN has
    ``(x + h)h``; the unrolled network ``(x + k h)h``.
    """
    name = architecture(name)
    if name == "ulm":
        return (x + k * h) * h
    if name.startswith("lmn"):
        if m is None:
            raise ValueError("the LMN count needs the memory size m")
        return (x + m) * h + (h + m) * m
    return {"rnn": 1, "gru": 3, "lstm": 4}[name] * (x + h) * h
