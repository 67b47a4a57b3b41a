"""Next-step predictors over piano rolls: a recurrent core and a sigmoid readout over the keys.

================  ==========================================  ==========================
name              core                                        readout reads
================  ==========================================  ==========================
``lmn-a``         :class:`linmem.LMN`, ``output="hidden"``     ``h_t`` (eq. 9)
``lmn-b``         :class:`linmem.LMN`, ``output="memory"``     ``m_t`` (eq. 8)
``rnn``           ``torch.nn.RNN`` (Elman, tanh) (*)           ``h_t``
``lstm``          ``torch.nn.LSTM`` (*)                        ``h_t``
``gru``           ``torch.nn.GRU`` (*)                         ``h_t``
``ulm``           :class:`linmem.UnrolledNet` (eqs. 10-11)     ``h_t .. h_{t-k}`` (eq. 11)
``pret-lmn-a``    as ``lmn-a``, initialised by pretraining     ``h_t``
``pret-lmn-b``    as ``lmn-b``, initialised by pretraining     ``m_t``
``pret-rnn``      as ``rnn``, initialised by pretraining       ``h_t``
``CORE-nade``     the core of ``CORE`` (lmn-a, lmn-b, rnn,     as ``CORE``; a NADE over
                  lstm, gru), :class:`NADEPredictor`           the keys, not independent
================  ==========================================  ==========================

(*): as the subclasses :class:`linmem.nn.rnns.RNN`, :class:`linmem.nn.rnns.GRU` and
:class:`linmem.nn.rnns.LSTM`, which give PyTorch's results with a faster backward on the CPU.

Every model maps inputs ``(B, T, K)`` to logits ``(B, T, K)``; ``sigmoid(logits[:, t])`` is the
predicted probability of each key at step ``t + 1``. The readout is ``Linear(out, K)`` with a bias
(the paper writes ``sigma(W^mo m_t)``; the bias is the usual per-key base rate). The ``pret-``
models are the same networks; :mod:`linmem.pretrain` sets their initial weights (the trainer
calls it), see there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields
from typing import Any

import torch
from torch import Tensor, nn

from linmem._check import check_fields, check_int
from linmem.batching import Batch, iterate_batches
from linmem.data import N_KEYS
from linmem.metrics import expected_accuracy_from_sums, masked_nll, sample_ratio_sums
from linmem.model_options import (
    ModelOptions,
    NADEOptions,
    PretrainOptions,
    RBMOptions,
    TransferOptions,
)
from linmem.nn.diagnostics import memory_loop_gains, memory_radii_of
from linmem.nn.lmn import LMN
from linmem.nn.nade import NADE
from linmem.nn.readout import InputPath, check_input_path
from linmem.nn.rnnrbm import RNNRBM, sequence_keys
from linmem.nn.rnns import GRU, LSTM, RNN
from linmem.nn.ulm import UnrolledNet
from linmem.ops.bound import DEFAULT_MEMORY_BOUND
from linmem.ops.toolkit import NONLINEARITIES
from linmem.registry import REGISTRY, ModelSpec, get_spec, model_names, register

__all__ = [
    "CORES",
    "DEFAULT_MODEL",
    "MODELS",
    "NADEPredictor",
    "NextStepPredictor",
    "activation_of",
    "architecture",
    "build_model",
    "check_options",
    "count_parameters",
    "default_nonlinearity",
    "display_name",
    "expected_accuracy",
    "memory_bound_of",
    "model_options",
    "option_names",
    "recurrent_weight_count",
]

_TORCH_RNNS: dict[str, Callable[..., nn.Module]] = {"rnn": RNN, "lstm": LSTM, "gru": GRU}


def _lmn_core(input_size, hidden, memory, num_layers, dropout, nonlinearity, k, memory_bound,
              loop_bound, arch):
    memory = check_int("memory", hidden if memory is None else memory)
    output = "hidden" if arch == "lmn-a" else "memory"  # LMN-A reads h_t, LMN-B m_t
    core = LMN(input_size, hidden, memory, num_layers, output=output, batch_first=True,
               nonlinearity=nonlinearity, dropout=dropout, memory_bound=memory_bound,
               loop_bound=loop_bound)
    return core, hidden if arch == "lmn-a" else memory, memory, None


def _ulm_core(input_size, hidden, memory, num_layers, dropout, nonlinearity, k, memory_bound,
              loop_bound, arch):
    core = UnrolledNet(input_size, hidden, k, nonlinearity, batch_first=True)
    return core, (k + 1) * hidden, None, k


def _torch_core(input_size, hidden, memory, num_layers, dropout, nonlinearity, k, memory_bound,
                loop_bound, arch):
    extra = {"nonlinearity": nonlinearity} if arch == "rnn" else {}
    core = _TORCH_RNNS[arch](input_size, hidden, num_layers, batch_first=True, dropout=dropout,
                             **extra)
    return core, hidden, None, None


# each architecture's recurrent core: ``(core, readout width, memory size, k)`` from the
# predictor's arguments; a registry entry names its architecture (:attr:`ModelSpec.architecture`)
CORES: dict[str, Callable[..., tuple[nn.Module, int, int | None, int | None]]] = {
    "lmn-a": _lmn_core, "lmn-b": _lmn_core, "ulm": _ulm_core,
    "rnn": _torch_core, "lstm": _torch_core, "gru": _torch_core,
}


class NextStepPredictor(nn.Module):
    """``core`` (batch first) followed by a linear readout to ``n_keys`` logits.

    The trainer's model protocol (:mod:`linmem.training.trainer`): :meth:`training_loss` of a batch
    (optionally :meth:`chunk_loss`, for training on windows), ``forward`` giving the logits that
    every metric scores, :meth:`init_output_bias`, the names
    of the logged losses (:attr:`train_loss_name`, :attr:`valid_nll_name`) and
    :meth:`finalize_metrics` for scores only the model can compute (none here).
    """

    train_loss_name = "train_nll"
    valid_nll_name = "valid_nll"

    def __init__(self, name: str, input_size: int = N_KEYS, hidden: int = 100,
                 memory: int | None = None, num_layers: int = 1, dropout: float = 0.0,
                 nonlinearity: str | None = None, k: int = 10,
                 memory_bound: float | None = DEFAULT_MEMORY_BOUND,
                 loop_bound: bool | None = None, input_path: str = "none"):
        super().__init__()
        nonlinearity = check_options(name, nonlinearity, num_layers, memory_bound=memory_bound,
                                     loop_bound=loop_bound, input_path=input_path)
        arch = architecture(name)
        for label, value in (("hidden", hidden), ("num_layers", num_layers),
                             ("input_size", input_size)):
            check_int(label, value)
        self.name, self.input_size, self.hidden, self.num_layers = name, input_size, hidden, \
            num_layers
        self.nonlinearity = nonlinearity
        self.core, out_size, memory, self.k = CORES[arch](
            input_size, hidden, memory, num_layers, dropout if num_layers > 1 else 0.0,
            nonlinearity, k, memory_bound, loop_bound, arch)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout!r}")
        self.memory, self.dropout = memory, dropout
        self.drop = nn.Dropout(dropout)
        self.readout = nn.Linear(out_size, input_size)
        # the logits' term from the current frame (linmem.nn.readout), or None
        self.input_path = None if input_path == "none" else InputPath(input_path, input_size)

    def _logits(self, out: Tensor, inputs: Tensor) -> Tensor:
        """The readout of the core's outputs ``out``, plus the input path's term of ``inputs``."""
        logits = self.readout(self.drop(out))
        return logits if self.input_path is None else logits + self.input_path(inputs)

    def forward(self, inputs: Tensor) -> Tensor:
        """``inputs (B, T, K)`` -> logits ``(B, T, K)``. Padding at the end of a sequence does not
        change the logits of its valid steps (the recurrence is causal)."""
        out, _ = self.core(inputs)
        return self._logits(out, inputs)

    def step(self, inputs: Tensor, state: Any = None) -> tuple[Tensor, Any]:
        """Continue the recurrence over ``inputs`` ``(B, T, K)`` from ``state`` (``None``: the
        start; else what the previous call returned): ``(logits (B, T, K), state)``. Running a
        sequence in pieces gives the logits of running it whole."""
        if isinstance(self.core, UnrolledNet):
            lagged, _ = self.core(inputs, state)
            out, state = lagged, lagged[:, -1, : self.core.k * self.hidden]
        else:  # the LMN's (h, m), an RNN's or GRU's h, an LSTM's (h, c)
            out, state = self.core(inputs, state)
        return self._logits(out, inputs), state

    def generation_step(self, frames: Tensor, state: Any = None, temperature: float = 1.0,
                        generator: torch.Generator | None = None
                        ) -> tuple[Tensor, Any, Tensor]:
        """Consume ``frames`` ``(B, T, K)`` and draw the next frame, each key from its
        Bernoulli with probability ``sigmoid(logit / temperature)``: ``(frame (B, K) 0/1,
        state, probabilities (B, K))``."""
        logits, state = self.step(frames, state)
        probs = torch.sigmoid(logits[:, -1] / temperature)
        return torch.bernoulli(probs, generator=generator), state, probs

    @torch.no_grad()
    def sample_next(self, inputs: Tensor, mask: Tensor, n: int,
                    generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws of the next frame at every valid step (``mask (B, T)``) from the model's
        distribution: ``(n, valid steps, K)`` 0/1 (here each key from its Bernoulli)."""
        p = torch.sigmoid(self(inputs)[mask])
        return (torch.rand((n, *p.shape), generator=generator, dtype=p.dtype,
                           device=p.device) < p).to(p.dtype)

    def training_loss(self, batch: Batch) -> Tensor:
        """The Bernoulli NLL of the batch's next frames, per valid frame."""
        return masked_nll(self(batch.inputs), batch.targets, batch.mask)

    def chunk_loss(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        """Truncated backpropagation through time: the NLL of one window of a batch
        (:meth:`linmem.batching.Batch.windows`), the recurrence continued from ``state`` (``None``
        for the first window); ``(loss, state)``, the state detached: the next window's
        gradient stops at its start."""
        logits, state = self.step(batch.inputs, state)
        return masked_nll(logits, batch.targets, batch.mask), _detach(state)

    def finalize_metrics(self, metrics: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        """The run's final metrics, with what only this model can add (nothing)."""
        return metrics

    @property
    def memory_bound(self) -> float | None:
        """The LMN core's bound on ``||W^mm||_2`` (:mod:`linmem.ops.bound`); None for another
        core."""
        return getattr(self.core, "memory_bound", None)

    @property
    def loop_bound(self) -> bool | None:
        """Whether the LMN core holds its memory loop's gain to the bound
        (:mod:`linmem.ops.loop_bound`); None for another core."""
        return getattr(self.core, "loop_bound", None)

    def _loop(self) -> str | None:
        """The activation whose loop bound the core holds, or None (the diagnostics' ``loop``)."""
        return self.core.nonlinearity if self.loop_bound else None

    @torch.no_grad()
    def divergence_note(self, inputs: Tensor, mask: Tensor) -> str:
        """What NaN or inf outputs on ``inputs`` ``(B, T, K)`` (valid steps ``mask``) say of an
        LMN's linear memory, as a clause for the error: with the spectral radius of ``W^mm``
        above 1, the first step whose outputs are not finite, that sequence's length, the
        radius and the remedy, ``--memory-bound``; for a relu or selu layer without the loop
        bound whose loop gain is above 1, that gain and ``--loop-bound``; "" for another core or
        a radius (and loop gain) up to 1."""
        if not isinstance(self.core, LMN):
            return ""
        weights = [w for layer in self.core.all_weights for w in layer]
        if not all(bool(torch.isfinite(w).all()) for w in weights):
            return "; the LMN's weights are NaN or inf"
        state = self.core.state_dict()
        radius = max(memory_radii_of(state, self.memory_bound, self._loop()))
        if radius <= 1:
            act = self.core.nonlinearity
            if act == "tanh" or self.loop_bound or self.memory_bound is None:
                return ""
            gain = max(memory_loop_gains(state, act, self.memory_bound))
            return "" if gain <= 1 else (
                f"; the LMN's memory loop has gain {gain:.3f} > 1 through {act}, which does "
                f"not saturate (||W^mm||_2 is bounded, the loop through the functional units "
                f"is not): --loop-bound holds the loop's gain below the bound too")
        bad = ~torch.isfinite(self(inputs)).all(-1) & mask.bool()
        where = ""
        if bool(bad.any()):
            row = int(bad.any(1).nonzero()[0])
            step = int(bad[row].nonzero()[0]) + 1
            where = f" at step {step} of a {int(mask[row].sum())}-step sequence"
        return (f"; the LMN's linear memory overflowed{where}: the spectral radius of W^mm is "
                f"{radius:.3f} (above 1 the memory grows geometrically along a sequence). "
                f"--memory-bound 0.99 holds ||W^mm||_2 <= 0.99, and the memory finite")

    @torch.no_grad()
    def init_output_bias(self, key_rates: Tensor, eps: float = 1e-3) -> None:
        """Set the readout bias to the log-odds of each key's rate (from the training split), so
        that training starts from the per-key base rates instead of p = 0.5 everywhere."""
        p = torch.as_tensor(key_rates, dtype=self.readout.bias.dtype).clamp(eps, 1 - eps)
        self.readout.bias.copy_(torch.log(p) - torch.log1p(-p))

    def config(self) -> dict:
        return {"model": self.name, "hidden": self.hidden, "memory": self.memory,
                "num_layers": self.num_layers, "input_size": self.input_size,
                "dropout": self.dropout, "nonlinearity": self.nonlinearity, "k": self.k,
                "memory_bound": self.memory_bound, "loop_bound": self.loop_bound,
                "input_path": "none" if self.input_path is None else self.input_path.kind}


def _detach(state: Any) -> Any:
    """A recurrent state (a tensor, an LSTM's ``(h, c)``, an LMN's ``(h, m)``) cut from the
    graph."""
    if isinstance(state, Tensor):
        return state.detach()
    return type(state)(_detach(s) for s in state)


class NADEPredictor(NextStepPredictor):
    """The recurrent core of a :class:`NextStepPredictor` with a joint readout over the keys, a
    :class:`linmem.nn.nade.NADE` whose biases the state sets (RNN-NADE of Boulanger-Lewandowski et
    al. 2012; here over any core: ``lmn-b-nade`` reads the LMN's memory ``m_t``).

    Training minimises the exact NLL of the next frame (the conditionals' Bernoulli NLL, keys
    in order); :meth:`likelihood_logits` gives the trainer's evaluation the same exact NLL.
    ``forward`` returns the logits of the key marginals estimated by sampling (the accuracy's
    input), and :meth:`finalize_metrics` adds the expected accuracy of Boulanger-Lewandowski et
    al. (over samples of the model's frames).
    """

    def __init__(self, name: str, input_size: int = N_KEYS, hidden: int = 100,
                 memory: int | None = None, num_layers: int = 1, dropout: float = 0.0,
                 nonlinearity: str | None = None, k: int = 10, nade_hidden: int = 150,
                 nade_samples: int = 100, seed: int = 0,
                 memory_bound: float | None = DEFAULT_MEMORY_BOUND,
                 loop_bound: bool | None = None):
        super().__init__(name, input_size, hidden, memory, num_layers, dropout, nonlinearity, k,
                         memory_bound, loop_bound)
        self.readout = NADE(input_size, nade_hidden, self.readout.in_features, nade_samples,
                            seed)
        self.nade_hidden, self.nade_samples, self.seed = nade_hidden, nade_samples, seed

    @torch.no_grad()
    def init_output_bias(self, key_rates: Tensor, eps: float = 1e-3) -> None:
        """The NADE's visible bias at the log-odds of each key's rate (with ``V = 0`` at the
        start, the conditionals are the base rates)."""
        p = torch.as_tensor(key_rates, dtype=self.readout.W.dtype).clamp(eps, 1 - eps)
        self.readout.visible_bias.bias.copy_(torch.log(p) - torch.log1p(-p))

    def likelihood_logits(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Logits whose Bernoulli NLL against ``targets`` is the model's exact NLL: the NADE's
        conditionals ``P(v_i = 1 | v_<i, past)`` of the target frames. ``(B, T, K)``."""
        out, _ = self.core(inputs)
        return self.readout.conditional_logits(self.drop(out), targets)

    def evaluation_logits(self, inputs: Tensor, targets: Tensor, marginals: bool = True
                          ) -> tuple[Tensor | None, Tensor]:
        """What the trainer's evaluation scores, from one pass of the core: the logits of
        ``forward`` (the sampled key marginals; ``None`` without ``marginals``) and those of
        :meth:`likelihood_logits` (the exact NLL). Each ``(B, T, K)``."""
        out, _ = self.core(inputs)
        out = self.drop(out)
        exact = self.readout.conditional_logits(out, targets)
        return (self.readout(out) if marginals else None), exact

    def training_loss(self, batch: Batch) -> Tensor:
        """The exact NLL of the batch's next frames, per valid frame."""
        return masked_nll(self.likelihood_logits(batch.inputs, batch.targets), batch.targets,
                          batch.mask)

    def chunk_loss(self, batch: Batch, state: Any = None) -> tuple[Tensor, Any]:
        """:meth:`NextStepPredictor.chunk_loss` with the exact NLL."""
        out, state = self.core(batch.inputs, state)
        z = self.readout.conditional_logits(self.drop(out), batch.targets)
        return masked_nll(z, batch.targets, batch.mask), _detach(state)

    @torch.no_grad()
    def generation_step(self, frames: Tensor, state: Any = None, temperature: float = 1.0,
                        generator: torch.Generator | None = None
                        ) -> tuple[Tensor, Any, Tensor]:
        """Consume ``frames`` and draw the next frame from the NADE (keys jointly, ancestral):
        ``(frame (B, K), state, conditional probabilities (B, K) along the drawn frame)``."""
        out, state = self.core(frames, state)
        v, p = self.readout.sample(out[:, -1], 1, temperature, generator)
        return v[0], state, p[0]

    def finalize_metrics(self, metrics: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        """Adds the expected accuracies (:func:`linmem.metrics.expected_frame_accuracy`, over
        ``nade_samples`` frames drawn per step) of the validation and test splits, and how the
        marginals were estimated."""
        metrics = dict(metrics)
        device = next(self.parameters()).device
        for split in ("valid", "test"):
            acc, se = expected_accuracy(self, data[split], self.nade_samples, self.seed + 1,
                                        device=device)
            metrics[f"{split}_acc_expected"], metrics[f"{split}_acc_expected_se"] = \
                100 * acc, 100 * se
        metrics["key_marginals"] = (f"mean of the conditional probabilities along "
                                    f"{self.nade_samples} ancestral samples per step (seed "
                                    f"{self.seed})")
        metrics["nll_method"] = "exact (NADE)"
        return metrics

    @torch.no_grad()
    def sample_next(self, inputs: Tensor, mask: Tensor, n: int,
                    generator: torch.Generator | None = None) -> Tensor:
        """``n`` joint draws of the next frame at every valid step from the NADE:
        ``(n, valid steps, K)``."""
        out, _ = self.core(inputs)
        return self.readout.sample(out[mask], n, generator=generator)[0]


@torch.no_grad()
def expected_accuracy(model: nn.Module, sequences: list, n_samples: int = 100, seed: int = 0,
                      device: str | torch.device = "cpu") -> tuple[float, float]:
    """Boulanger-Lewandowski et al.'s expected frame-level accuracy of next-step prediction over
    ``sequences`` and its standard error (fractions): ``n_samples`` frames drawn at every step
    from the model's own distribution (its ``sample_next``), scored by
    :func:`linmem.metrics.expected_frame_accuracy`, accumulated over every valid frame.

    Each sequence draws from a generator of its own, seeded by ``seed`` and its frames
    (:func:`linmem.nn.rnnrbm.sequence_keys`): a sequence's draws do not depend on the others nor
    on their order."""
    check_int("n_samples", n_samples)
    was_training = model.training
    model.eval()
    dtype = next(model.parameters()).dtype
    sums = counts = torch.zeros(n_samples, dtype=torch.float64)
    for batch in iterate_batches(sequences, 1, dtype=dtype):
        batch = batch.to(device)
        gen = torch.Generator(device=device).manual_seed(sequence_keys(batch.inputs, seed)[0])
        v = model.sample_next(batch.inputs, batch.mask, n_samples, gen)
        ratio_sum, scored = sample_ratio_sums(v, batch.targets[batch.mask])
        sums, counts = sums + ratio_sum.cpu(), counts + scored.cpu()
    model.train(was_training)
    return expected_accuracy_from_sums(sums, counts)


# ------------------------------------------------- the built-in models (linmem.registry)


def _predictor(name: str) -> Callable[[int, Any], nn.Module]:
    def build(input_size: int, o: ModelOptions) -> nn.Module:
        return NextStepPredictor(name, input_size, o.hidden, o.memory, o.num_layers, o.dropout,
                                 o.nonlinearity, getattr(o, "k", 10), o.memory_bound,
                                 o.loop_bound, o.input_path)
    return build


def _nade_predictor(name: str) -> Callable[[int, Any], nn.Module]:
    def build(input_size: int, o: NADEOptions) -> nn.Module:
        return NADEPredictor(name, input_size, o.hidden, o.memory, o.num_layers, o.dropout,
                             o.nonlinearity, 10, o.nade_hidden, o.nade_samples, o.seed,
                             o.memory_bound, o.loop_bound)
    return build


def _rnn_rbm(input_size: int, o: RBMOptions) -> nn.Module:
    return RNNRBM(input_size, n_recurrent=o.hidden, n_hidden=o.rbm_hidden, cd_k=o.cd_k,
                  predict=o.rbm_predict, seed=o.seed, ais_chains=o.ais_chains,
                  ais_betas=o.ais_betas, ais_frames=o.ais_frames)


# SELU for the unrolled network and the LMNs initialised from it (the paper found it helps the
# unrolled model converge; the transfer is exact only with the same activation), tanh elsewhere
for _spec in (
    ModelSpec("lmn-a", "LMN-A", "lmn-a", _predictor("lmn-a"), has_memory=True,
              nonlinearities=NONLINEARITIES),
    ModelSpec("lmn-b", "LMN-B", "lmn-b", _predictor("lmn-b"), has_memory=True,
              nonlinearities=NONLINEARITIES),
    ModelSpec("rnn", "RNN", "rnn", _predictor("rnn"), nonlinearities=("tanh", "relu")),
    ModelSpec("lstm", "LSTM", "lstm", _predictor("lstm")),
    ModelSpec("gru", "GRU", "gru", _predictor("gru")),
    ModelSpec("ulm", "ULM", "ulm", _predictor("ulm"), PretrainOptions,
              nonlinearities=NONLINEARITIES, default_nonlinearity="selu", single_layer=True),
    ModelSpec("pret-lmn-a", "pret-LMN-A", "lmn-a", _predictor("pret-lmn-a"), TransferOptions,
              has_memory=True, nonlinearities=NONLINEARITIES, default_nonlinearity="selu",
              recipe="ulm-transfer"),
    ModelSpec("pret-lmn-b", "pret-LMN-B", "lmn-b", _predictor("pret-lmn-b"), TransferOptions,
              has_memory=True, nonlinearities=NONLINEARITIES, default_nonlinearity="selu",
              recipe="ulm-transfer"),
    ModelSpec("pret-rnn", "pret-RNN", "rnn", _predictor("pret-rnn"), PretrainOptions,
              nonlinearities=("tanh", "relu"), recipe="la-rnn"),
    ModelSpec("rnn-rbm", "RNN-RBM*", "rnn-rbm", _rnn_rbm, RBMOptions, single_layer=True,
              dropout=False, recipe="rnn-rbm"),
):
    register(_spec)

# a NADE readout over the keys on every trainable core: rnn-nade is RNN-NADE
for _core in ("lmn-a", "lmn-b", "rnn", "lstm", "gru"):
    _base = REGISTRY[_core]
    register(ModelSpec(f"{_core}-nade", f"{_base.display}-NADE", _core,
                       _nade_predictor(f"{_core}-nade"), NADEOptions,
                       has_memory=_base.has_memory, nonlinearities=_base.nonlinearities))

MODELS = model_names()  # the built-in models; model_names() also lists later registrations
DEFAULT_MODEL = "lmn-b"  # what `linmem train` trains unless told otherwise


def architecture(name: str) -> str:
    """The network behind a registry name: ``pret-lmn-b`` -> ``lmn-b``, ``lstm`` -> ``lstm``."""
    return get_spec(name).architecture


def default_nonlinearity(name: str) -> str:
    """The activation a model uses unless told otherwise (:attr:`ModelSpec.nonlinearities`)."""
    return get_spec(name).default_nonlinearity


def check_options(name: str, nonlinearity: str | None = None, num_layers: int = 1,
                  dropout: float = 0.0, memory_bound: float | None = None,
                  loop_bound: bool | None = None, input_path: str = "none") -> str:
    """Validate a model name with its activation, depth, dropout, memory bound
    (:func:`memory_bound_of`), loop bound and input path, without building anything; returns
    the activation (``nonlinearity`` or the model's default)."""
    spec = get_spec(name)
    memory_bound_of(name, memory_bound)
    if loop_bound and not spec.has_memory:
        raise ValueError(f"{name} has no linear memory: loop_bound applies to the LMNs")
    if check_input_path(input_path) != "none" and issubclass(spec.options,
                                                             (NADEOptions, RBMOptions)):
        raise ValueError(f"{name}'s readout is a distribution over the keys: input_path "
                         "applies to the linear readouts")
    nonlinearity = nonlinearity or spec.default_nonlinearity
    allowed = spec.nonlinearities
    if nonlinearity not in allowed:
        if len(allowed) == 1:
            raise ValueError(f"{name} has no nonlinearity option (got {nonlinearity!r})")
        raise ValueError(f"{name}: nonlinearity must be one of {list(allowed)}, "
                         f"got {nonlinearity!r}")
    if spec.single_layer and num_layers != 1:
        raise ValueError(f"{name} has one layer")
    if not spec.dropout and dropout:
        raise ValueError(f"{name} has no dropout option")
    return nonlinearity


def memory_bound_of(name: str, memory_bound: float | None) -> float | None:
    """The memory bound model ``name`` is built with: ``memory_bound`` for a model with a linear
    memory; for one without, None where ``memory_bound`` is None or the default
    (:data:`~linmem.ops.bound.DEFAULT_MEMORY_BOUND`, which every model is given unless told
    otherwise), another bound refused in one line."""
    if get_spec(name).has_memory:
        return memory_bound  # checked where it is used (TrainConfig's fields, the layer)
    if memory_bound is None or memory_bound == DEFAULT_MEMORY_BOUND:
        return None
    raise ValueError(f"{name} has no linear memory: memory_bound applies to the LMNs")


def option_names(name: str) -> tuple[str, ...]:
    """The options of model ``name`` beyond every model's sizes (:class:`ModelOptions`): the
    fields of its :attr:`ModelSpec.options` of its own, in declaration order."""
    every = {f.name for f in fields(ModelOptions)}
    return tuple(f.name for f in fields(get_spec(name).options) if f.name not in every)


def model_options(name: str, **values: Any) -> ModelOptions:
    """The options of model ``name`` (an instance of its :attr:`ModelSpec.options`) from
    ``values``, checked: its activation (the model's default if unset), depth, dropout and sizes;
    ``ValueError`` for a value that is not one of its options."""
    spec = get_spec(name)
    unknown = set(values) - {f.name for f in fields(spec.options)}
    if unknown:
        raise ValueError(f"{name} has no option {', '.join(sorted(unknown))}")
    options = spec.options(**values)
    options.nonlinearity = check_options(name, options.nonlinearity, options.num_layers,
                                         options.dropout, options.memory_bound,
                                         options.loop_bound, options.input_path)
    if not spec.has_memory:
        options.memory = None
    elif options.memory is None:
        options.memory = options.hidden
    check_fields(options)
    return options


def build_model(name: str, hidden: int, memory: int | None = None, num_layers: int = 1,
                input_size: int = N_KEYS, dropout: float = 0.0, nonlinearity: str | None = None,
                **options: Any) -> nn.Module:
    """A next-step model by registry name (:func:`model_names`).

    Args:
        hidden: functional (LMN) or hidden units.  memory: LMN memory units (default
            ``hidden``; ignored by models without a memory).
        num_layers: stacked recurrent layers.  input_size: keys per frame.
        dropout: on the recurrent output before the readout (and between layers).
        nonlinearity: the activation (default: the model's, :attr:`ModelSpec.nonlinearities`).
        options: the model's own options (the fields of its :attr:`ModelSpec.options`: the
            unrolled network's ``k``, the RNN-RBM's ``rbm_hidden``, ``cd_k``, ...).
    """
    check_int("input_size", input_size)
    spec = get_spec(name)
    built = model_options(name, hidden=hidden, memory=memory, num_layers=num_layers,
                          dropout=dropout, nonlinearity=nonlinearity, **options)
    return spec.build(input_size, built)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable scalars."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def recurrent_weight_count(name: str, x: int, h: int, m: int | None = None, k: int = 10) -> int:
    """The paper's count of a single layer's recurrent weights (biases and readout excluded).

    Section "A comparison with gated recurrent architectures": LSTM ``4(x + h)h``, GRU
    ``3(x + h)h``, LMN ``(x + m)f + (f + m)m`` with ``f = h`` functional units; an Elman RNN has
    ``(x + h)h``; the unrolled network ``(x + k h)h``.
    """
    spec = get_spec(name)
    name = spec.architecture
    if name == "ulm":
        return (x + k * h) * h
    if spec.has_memory:
        if m is None:
            raise ValueError("the LMN count needs the memory size m")
        return (x + m) * h + (h + m) * m
    return {"rnn": 1, "gru": 3, "lstm": 4}[name] * (x + h) * h


def display_name(model: str) -> str:
    """A model's name in tables and figures: its registry entry's."""
    spec = REGISTRY.get(model)
    return spec.display if spec is not None else model


def activation_of(record: dict) -> str | None:
    """A run's recurrent activation from its record (its ``config.json``'s, else its model's
    default)."""
    spec = REGISTRY.get(record.get("model"))
    return record.get("nonlinearity") or (spec.default_nonlinearity if spec else None)
