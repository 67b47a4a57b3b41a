"""What defines a training run: :class:`TrainConfig` (saved as a run's ``config.json``), the
named training protocols (:data:`PROTOCOLS`) and the choices its fields take.

``TrainConfig`` holds the fields every model trains with (data, sizes, the optimizer, early
stopping, the protocol's fields) and each model's own options (the RNN-RBM's, the NADE's, the
pretraining's), which the model's registry entry names (:attr:`linmem.models.ModelSpec.options`):
a model refuses a value for an option that is not its own.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from ._check import check_int, device_form
from ._io import read_json
from .data import resolve_name
from .models import (
    DEFAULT_MODEL,
    NONLINEARITIES,
    PREDICTIONS,
    check_options,
    get_spec,
    model_names,
)
from .runs import CONFIG

__all__ = [
    "BUDGET_FIELDS",
    "CPU_KERNELS",
    "DIVERGENCE",
    "FROM_PROTOCOL",
    "LOSS_REDUCTIONS",
    "OPTIMIZERS",
    "PLACE_FIELDS",
    "PROTOCOLS",
    "PROTOCOL_FIELDS",
    "RECIPE_OPTIONS",
    "SELECTIONS",
    "Protocol",
    "TrainConfig",
]


OPTIMIZERS = ("adam", "sgd")


# what chooses the best epoch on validation: the global accuracy (Bay et al.), the per-frame mean
# accuracy (the metric of the paper's code), or the NLL (a likelihood goal; for a joint readout it
# also spares the sampling of the marginals at every epoch)
SELECTIONS = ("acc", "acc_frame", "nll")


# the training loss's normalisation: "frame" sums the Bernoulli NLL over the keys and averages it
# over the valid frames (nats per step); "mean" also averages over the keys (PyTorch's default
# BCE reduction, the paper's code). Adam ignores the loss's scale (up to eps), not the scale of
# its weight decay nor of a gradient-norm clip: the paper's decay 1e-5 on "mean" is 8.8e-4 on
# "frame". Logs and metrics report the NLL in nats per step either way.
LOSS_REDUCTIONS = ("frame", "mean")


CPU_KERNELS = ("auto", "best", "loop", "avx512", "avx2", "generic")  # TrainConfig.cpu_kernel


DIVERGENCE = ("stop", "raise")  # TrainConfig.on_divergence


# what bounds a run's length: --resume may change them; every other field is the run's identity
BUDGET_FIELDS = ("epochs", "patience")


# neither changes the numbers: a run may continue on another device or with the data elsewhere
PLACE_FIELDS = ("device", "data_dir", "ulm_cache")


# optional fields (None: unset) that only some models' pretraining reads
# (ModelSpec.recipe_options); any other model refuses a value for them
RECIPE_OPTIONS = ("ulm_nonlinearity", "ulm_cache")


@dataclass(frozen=True)
class Protocol:
    """A training protocol: the settings that the paper's text leaves open and that change the
    result, named as one unit (:data:`PROTOCOLS`), so that a table can say which one produced each
    figure. A :class:`TrainConfig` takes them from its ``protocol`` unless given field by field."""

    name: str
    batch_size: int  # sequences per update (whole sequences, shuffled every epoch)
    loss_reduction: str  # LOSS_REDUCTIONS: what weight_decay and clip are relative to
    clip: float | None  # gradient-norm clipping on that loss; None: none
    init_bias: bool  # readout bias from the key rates (False: nn.Linear's default init)
    patience: int  # early stopping: epochs without a better validation score
    select: str  # SELECTIONS: the validation score of early stopping and of best.pt
    pruner: str  # linmem search: "median" (from its warm-up epoch) or "none"
    about: str


PROTOCOLS: dict[str, Protocol] = {
    # ours, measured on JSB Chorales' validation split (results/foundation): batches of 4
    # length-bucketed sequences, the NLL in nats per step, key-rate readout bias
    "linmem": Protocol("linmem", batch_size=4, loss_reduction="frame", clip=5.0, init_bias=True,
                       patience=50, select="acc", pruner="median",
                       about="linmem's: batch 4 length-bucketed, NLL summed over keys, clip 5, "
                             "key-rate readout bias, global accuracy, median pruner"),
    # the authors' code (AntonioCarta/cannon, 2018; issue 43): batch 1, BCE averaged over keys and
    # frames (so the paper's weight decays mean what they meant), clip 10 on it, nn.Linear's
    # readout init, early stopping on the per-frame mean accuracy, every grid point to its end
    "paper": Protocol("paper", batch_size=1, loss_reduction="mean", clip=10.0, init_bias=False,
                      patience=50, select="acc_frame", pruner="none",
                      about="the paper's code: batch 1, BCE averaged over keys and frames, clip "
                            "10, default readout init, per-frame accuracy, no pruning"),
}


# the TrainConfig fields a protocol sets (its pruner is the search's)
PROTOCOL_FIELDS = ("batch_size", "loss_reduction", "clip", "init_bias", "patience", "select")


class _FromProtocol:
    """The default of a :data:`PROTOCOL_FIELDS` field: its protocol's value."""

    def __repr__(self) -> str:
        return "FROM_PROTOCOL"


FROM_PROTOCOL: Any = _FromProtocol()


@dataclass
class TrainConfig:
    """Everything that defines a training run (saved as ``config.json``).

    ``protocol`` (:data:`PROTOCOLS`) sets the fields of :data:`PROTOCOL_FIELDS` that are not
    given; a field given explicitly overrides it (``TrainConfig(protocol="paper",
    batch_size=4)``). The saved config holds the protocol's name and every resolved value.
    ``dataclasses.replace(config, protocol=...)`` keeps the other fields as they are: build a new
    config to change the protocol."""

    protocol: str = "linmem"
    data: str = "jsb"
    model: str = DEFAULT_MODEL
    hidden: int = 100
    memory: int | None = 100  # LMN memory units; ignored by rnn/lstm/gru
    num_layers: int = 1
    dropout: float = 0.0  # on the recurrent output before the readout
    weight_decay: float = 1e-5
    lr: float = 1e-3
    optimizer: str = "adam"  # the paper's; "sgd" (with `momentum`) as some baselines used
    momentum: float = 0.0  # sgd only
    # Defaults measured on JSB Chorales' validation split (figures in issue 2's closing note):
    # batch 4 reaches a given accuracy in ~4x fewer epochs than 8; validation accuracy keeps
    # rising long after the validation NLL bottoms out, hence the long patience.
    batch_size: int = FROM_PROTOCOL  # linmem: 4; paper: 1
    # truncated backpropagation through time: an update per window of `chunk` steps, the state
    # carried (detached) from window to window of a batch; None: one update per whole batch
    chunk: int | None = None
    epochs: int = 1000  # upper bound; early stopping ends the run first
    patience: int = FROM_PROTOCOL  # epochs without a better validation score before stopping
    select: str = FROM_PROTOCOL  # the validation score of early stopping and best.pt (SELECTIONS)
    clip: float | None = FROM_PROTOCOL  # gradient-norm clipping; None disables it
    loss_reduction: str = FROM_PROTOCOL  # LOSS_REDUCTIONS
    # a NaN/inf training loss or validation output: "stop" ends the run at its last good epoch
    # with its best checkpoint (as early stopping; Lightning's check_finite), "raise" fails it
    on_divergence: str = "stop"
    init_bias: bool = FROM_PROTOCOL  # readout bias from the training split's key rates
    transpose: int = 0  # augmentation: shift each training sequence by up to +-N semitones
    seed: int = 0
    device: str = "cpu"
    data_dir: str | None = None
    eval_batch_size: int = 64
    nonlinearity: str | None = None  # None: models.default_nonlinearity (selu for ulm/pret-lmn)
    # the CPU path of the recurrences (CPU_KERNELS): "auto" the one measured fastest on this
    # machine's first use (linmem._ext.cpu_path); "best" the best variant the CPU runs, chosen
    # without timing (the same numbers for the same seed on this machine, whatever a timing
    # said); "loop" the PyTorch loop; or a variant's name. Every path computes the same function
    # in another order of floating-point operations: figures agree to rounding, not bit for bit
    cpu_kernel: str = "auto"
    # pretraining (linmem.pretrain): ulm and pret-* models only
    k: int = 10  # past blocks of the unrolled network
    la_window: int | None = None  # None: k + 1 for pret-lmn, full length for pret-rnn; 0: full
    pretrain_epochs: int | None = None  # epoch bound of the unrolled network (default: epochs)
    # pret-lmn-* only: the unrolled network's activation; None: the LMN's (the transfer is then
    # exact); "selu" with nonlinearity "tanh" is the paper's text (SELU for the unrolled model
    # only, tanh for the final LMN): the same weights, an approximate transfer
    ulm_nonlinearity: str | None = None
    # pret-lmn-* only: a folder of unrolled networks shared between runs (linmem.recipes.ulm_key:
    # a grid's memory sizes need one); None: each run trains its own in RUN_DIR/ulm
    ulm_cache: str | None = None
    # rnn-rbm only (linmem.rnnrbm): hidden is the RNN's units
    rbm_hidden: int = 150  # hidden units of each step's RBM
    cd_k: int = 15  # Gibbs steps of contrastive divergence
    rbm_predict: str = "gibbs"  # key marginals for accuracy: "gibbs" or "mean-field"
    ais_chains: int = 100  # test NLL: AIS chains per frame
    ais_betas: int = 1000  # test NLL: annealing steps
    ais_frames: int | None = 500  # test NLL on this many random test frames (None: all)
    rbm_pretrain_epochs: int = 0  # CD epochs of the RBM on all frames before training (0: none)
    rnn_pretrain_epochs: int = 0  # epoch bound of the next-step RNN copied in (0: none)
    # *-nade only (linmem.nade): the NADE's hidden units, and the ancestral samples per step
    # of the key marginals (accuracy) and of the expected accuracy
    nade_hidden: int = 150
    nade_samples: int = 100

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {self.protocol!r}")
        for name in PROTOCOL_FIELDS:
            if getattr(self, name) is FROM_PROTOCOL:
                setattr(self, name, getattr(PROTOCOLS[self.protocol], name))
        if self.cpu_kernel not in CPU_KERNELS:
            raise ValueError(f"cpu_kernel must be one of {list(CPU_KERNELS)}, "
                             f"got {self.cpu_kernel!r}")
        if self.loss_reduction not in LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {list(LOSS_REDUCTIONS)}, "
                             f"got {self.loss_reduction!r}")
        self.data = resolve_name(self.data)
        device_form(self.device)
        # the model with its activation, depth and dropout: fail now, not after hours of pretraining
        check_options(self.model, self.nonlinearity, self.num_layers, self.dropout)
        if not get_spec(self.model).has_memory:
            self.memory = None
        for name in ("hidden", "num_layers", "batch_size", "epochs", "patience",
                     "eval_batch_size", "k", "rbm_hidden", "cd_k", "ais_chains", "ais_betas",
                     "nade_hidden", "nade_samples"):
            check_int(name, getattr(self, name))
        check_int("seed", self.seed, minimum=0)
        check_int("memory", self.memory, none_ok=True)
        check_int("chunk", self.chunk, none_ok=True)
        if not (self.weight_decay >= 0 and math.isfinite(self.weight_decay)):
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout!r}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        if int(self.transpose) != self.transpose or not 0 <= self.transpose < 88:
            raise ValueError(f"transpose must be an integer in [0, 88), got {self.transpose!r}")
        if self.clip is not None and not self.clip > 0:
            raise ValueError(f"clip must be > 0 or None, got {self.clip!r}")
        check_int("la_window", self.la_window, minimum=0, none_ok=True)  # 0: full length
        if self.on_divergence not in DIVERGENCE:
            raise ValueError(f"on_divergence must be one of {list(DIVERGENCE)}, "
                             f"got {self.on_divergence!r}")
        if self.select not in SELECTIONS:
            raise ValueError(f"select must be one of {list(SELECTIONS)}, got {self.select!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, "
                             f"got {self.optimizer!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.rbm_predict not in PREDICTIONS:
            raise ValueError(f"rbm_predict must be one of {list(PREDICTIONS)}, "
                             f"got {self.rbm_predict!r}")
        check_int("ais_frames", self.ais_frames, none_ok=True)
        for name in ("rbm_pretrain_epochs", "rnn_pretrain_epochs"):
            check_int(name, getattr(self, name), minimum=0)
        check_int("pretrain_epochs", self.pretrain_epochs, none_ok=True)
        if self.ulm_nonlinearity not in (None, *NONLINEARITIES):
            raise ValueError(f"ulm_nonlinearity must be one of {list(NONLINEARITIES)}, "
                             f"got {self.ulm_nonlinearity!r}")
        spec = get_spec(self.model)
        for name in RECIPE_OPTIONS:
            if getattr(self, name) is not None and name not in spec.recipe_options:
                takers = [m for m in model_names() if name in get_spec(m).recipe_options]
                raise ValueError(f"{name} applies to {', '.join(takers) or 'no model'} "
                                 f"(its pretraining recipe reads it), not to {self.model}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike) -> TrainConfig:
        """The config a run directory holds (its ``config.json``)."""
        return cls.from_dict(read_json(Path(run_dir) / CONFIG))

    def identity(self) -> dict[str, Any]:
        """The fields that define the run's numbers: all but the budget (:data:`BUDGET_FIELDS`)
        and where it runs (device, data folder). ``--resume`` refuses a change of these."""
        return {k: v for k, v in asdict(self).items()
                if k not in BUDGET_FIELDS and k not in PLACE_FIELDS}

    def protocol_overrides(self) -> dict[str, Any]:
        """The fields of :data:`PROTOCOL_FIELDS` where this run departs from its protocol."""
        spec = PROTOCOLS[self.protocol]
        return {name: getattr(self, name) for name in PROTOCOL_FIELDS
                if getattr(self, name) != getattr(spec, name)}

    def loss_scale(self, n_keys: int) -> float:
        """The factor from the models' training loss (nats per step, summed over ``n_keys``) to
        the loss that is minimised (:data:`LOSS_REDUCTIONS`)."""
        return 1.0 / n_keys if self.loss_reduction == "mean" else 1.0

    def model_options(self) -> dict[str, Any]:
        """The fields the model's registry entry takes as its own options."""
        return {name: getattr(self, name) for name in get_spec(self.model).options}
