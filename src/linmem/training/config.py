"""What defines a training run: :class:`TrainConfig` (saved as a run's ``config.json``), the
named training protocols (:data:`PROTOCOLS`) and the choices its fields take.

``TrainConfig`` holds the fields every model trains with (data, the optimizer, early stopping,
the protocol's fields) and the models' options, declared in :mod:`linmem.models` (the sizes every
model has, and each model's own: the RNN-RBM's, the NADE's, the pretraining's, in the class its
registry entry names, :attr:`linmem.registry.ModelSpec.options`): a model refuses a value for an
option that is not its own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from linmem._check import check_fields, device_form, option
from linmem.data import DATASETS, resolve_name
from linmem.model_options import ModelOptions, NADEOptions, RBMOptions, TransferOptions
from linmem.models import (
    DEFAULT_MODEL,
    check_options,
    default_nonlinearity,
    memory_bound_of,
    model_options,
    option_names,
)
from linmem.ops.cpu import CPU_KERNELS
from linmem.ops.loop_bound import check_loop_bound
from linmem.registry import get_spec, model_names
from linmem.training.runs import CONFIG, read_record
from linmem.training.selection import SELECTIONS

__all__ = [
    "BEFORE_FIELD",
    "BUDGET_FIELDS",
    "DEFAULT_PROTOCOL",
    "DIVERGENCE",
    "FROM_PROTOCOL",
    "LEGACY_PROTOCOL",
    "LOSS_REDUCTIONS",
    "MODEL_OPTION_FIELDS",
    "OPTIMIZERS",
    "PLACE_FIELDS",
    "PROTOCOLS",
    "PROTOCOL_FIELDS",
    "Protocol",
    "ProtocolSettings",
    "RunSettings",
    "TrainConfig",
    "check_protocol",
    "departures_text",
    "record_protocol",
]


OPTIMIZERS = ("adam", "sgd")

# what a record saved before a field existed meant by its absence, for the fields whose default
# may come to differ from it: a run before memory_bound had the paper's unbounded memory
BEFORE_FIELD: dict[str, Any] = {"memory_bound": None, "loop_bound": False}


# the training loss's normalisation: "frame" sums the Bernoulli NLL over the keys and averages it
# over the valid frames (nats per step); "mean" also averages over the keys (PyTorch's default
# BCE reduction, the paper's code). Adam ignores the loss's scale (up to eps), not the scale of
# its weight decay nor of a gradient-norm clip: the paper's decay 1e-5 on "mean" is 8.8e-4 on
# "frame". Logs and metrics report the NLL in nats per step either way.
LOSS_REDUCTIONS = ("frame", "mean")




DIVERGENCE = ("stop", "raise")  # TrainConfig.on_divergence


# what bounds a run's length: --resume may change them; every other field is the run's identity
BUDGET_FIELDS = ("epochs", "patience")


# neither changes the numbers: a run may continue on another device or with the data elsewhere
PLACE_FIELDS = ("device", "data_dir", "ulm_cache")


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
    # the authors' code (AntonioCarta/cannon, results/paper-protocol): its 2018 LMN code's
    # batch 1, BCE averaged over keys and frames (so the paper's weight decays mean what they
    # meant), nn.Linear's readout init, early stopping on the per-frame mean accuracy, every grid
    # point to its end; the clip of 10 on that loss first appears in its November 2019 trainer
    # (cannon/torch_trainer.py), the 2018 code clips nothing
    "paper": Protocol("paper", batch_size=1, loss_reduction="mean", clip=10.0, init_bias=False,
                      patience=50, select="acc_frame", pruner="none",
                      about="the paper's code: batch 1, BCE averaged over keys and frames, clip "
                            "10, default readout init, per-frame accuracy, no pruning"),
}


# linmem train's default: the protocol that wins the rule of linmem.experiments.protocol_choice on
# the seeds' validation scores (results/paper-protocol/protocol-choice.md; a test
# holds the two together)
DEFAULT_PROTOCOL = "paper"

# the protocol of a saved config or study that names none (made before protocols had names):
# how such records are read, never a default for new work
LEGACY_PROTOCOL = "linmem"


def record_protocol(record: Mapping[str, Any]) -> str:
    """The protocol a saved record names (a run's config or record, a study's train settings):
    one saved before protocols had names trained under :data:`LEGACY_PROTOCOL`'s."""
    protocol = record.get("protocol")
    return LEGACY_PROTOCOL if protocol is None else protocol


def check_protocol(protocol: str) -> str:
    """``protocol`` if it names one of :data:`PROTOCOLS`, else a ``ValueError`` listing them:
    the one check of a protocol's name (a config, a search, a report)."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"protocol must be one of {list(PROTOCOLS)}, got {protocol!r}")
    return protocol


class _FromProtocol:
    """The default of a :data:`PROTOCOL_FIELDS` field: its protocol's value."""

    def __repr__(self) -> str:
        return "FROM_PROTOCOL"


FROM_PROTOCOL: Any = _FromProtocol()


@dataclass
class ProtocolSettings:
    """The settings of a training that its protocol names as one unit (:class:`Protocol`,
    :data:`PROTOCOLS`): each defaults to its protocol's value (:data:`FROM_PROTOCOL`, resolved by
    :class:`TrainConfig`) and may be given to depart from it."""

    # linmem: batch 4 reaches a given accuracy in ~4x fewer epochs than 8 on JSB's validation
    # split (results/foundation)
    batch_size: int = option(FROM_PROTOCOL, "Sequences per update.", kind=int)
    loss_reduction: str = option(
        FROM_PROTOCOL, "The training loss: the NLL summed over the keys per frame (frame), or "
                       "averaged over the keys too (mean: PyTorch's BCE default; --weight-decay "
                       "and --clip are relative to it).", kind=str, choices=LOSS_REDUCTIONS)
    clip: float | None = option(FROM_PROTOCOL, "Gradient-norm clipping, or 'none'.", kind=float,
                                above=0.0, none_ok=True)
    init_bias: bool = option(FROM_PROTOCOL, "Start the readout bias at the training split's key "
                                            "rates, or at nn.Linear's default.", kind=bool)
    patience: int = option(FROM_PROTOCOL, "Epochs without a better validation score.", kind=int)
    select: str = option(FROM_PROTOCOL, "The validation score that picks the best epoch: global "
                                        "accuracy, per-frame mean accuracy or NLL.",
                         kind=str, choices=SELECTIONS)


# the TrainConfig fields a protocol sets (its pruner is the search's)
PROTOCOL_FIELDS = tuple(f.name for f in fields(ProtocolSettings))


@dataclass
class RunSettings:
    """Where and how a run computes, not what: its device and data folder (a run may go on with
    others, :data:`PLACE_FIELDS`), its evaluation's batches and its CPU path (the same numbers to
    rounding)."""

    device: str = option("cpu", "cpu, cuda, cuda:1")
    data_dir: str | None = option(None, "Folder with the data files (default: $LINMEM_DATA, else "
                                        "the user cache).", kind=str, folder=True)
    eval_batch_size: int = option(64, "Sequences per batch of the evaluation.")
    # every path computes the same function in another order of floating-point operations:
    # figures agree to rounding, not bit for bit
    cpu_kernel: str = option(
        "auto", "The recurrences' CPU path: auto (measured fastest on this machine's first use), "
                "best (the best variant the CPU runs, not timed: the same numbers for the same "
                "seed on this machine), loop (PyTorch), or a variant. Paths agree to rounding, "
                "not bit for bit; metrics.json names the one used.", choices=CPU_KERNELS)


@dataclass
class TrainConfig(NADEOptions, RBMOptions, TransferOptions, ProtocolSettings,
                  RunSettings):
    """Everything that defines a training run (saved as ``config.json``, flat).

    Its fields, by concern: the training's own below (its protocol, data, model, optimizer and
    budget), the settings its protocol names (:class:`ProtocolSettings`), where and how it runs
    (:class:`RunSettings`), and the models' options,
    each declared once in :mod:`linmem.model_options` (:class:`~linmem.model_options.ModelOptions`,
    the sizes every model has; :class:`~linmem.model_options.PretrainOptions`,
    :class:`~linmem.model_options.TransferOptions`, :class:`~linmem.model_options.RBMOptions`,
    :class:`~linmem.model_options.NADEOptions`, a model's own, :attr:`ModelSpec.options`); every
    field's help and valid values are in its declaration, from which ``linmem train`` makes its
    options.

    ``protocol`` (:data:`PROTOCOLS`) sets the fields of :data:`PROTOCOL_FIELDS` that are not
    given; a field given explicitly overrides it (``TrainConfig(protocol="paper",
    batch_size=4)``). The saved config holds the protocol's name and every resolved value.
    ``dataclasses.replace(config, protocol=...)`` keeps the other fields as they are: build a new
    config to change the protocol."""

    protocol: str = option(DEFAULT_PROTOCOL, "The training protocol: the defaults of --batch-size, "
                           "--loss-reduction, --clip, --init-bias, --patience and --select (" +
                           "; ".join(f"{p.name}: {p.about}" for p in PROTOCOLS.values()) + ").",
                           choices=tuple(PROTOCOLS))
    data: str = option("jsb", f"Data set: {', '.join(DATASETS)} (common spellings accepted), or "
                              "a .pickle file of your own (linmem data import-midi).")
    model: str = option(DEFAULT_MODEL, "The model (linmem.registry.REGISTRY).")
    weight_decay: float = option(1e-5, "L2 weight decay (Adam's weight_decay).", minimum=0.0)
    lr: float = option(1e-3, "Learning rate.", above=0.0)
    # "adam" is the paper's; "sgd" (with `momentum`) as some baselines used
    optimizer: str = option("adam", "The optimizer.", choices=OPTIMIZERS)
    momentum: float = option(0.0, "SGD momentum.", minimum=0.0, below=1.0)
    # truncated backpropagation through time: an update per window of `chunk` steps, the state
    # carried (detached) from window to window of a batch; None: one update per whole batch
    chunk: int | None = option(
        None, "Truncated backpropagation through time: an update per window of N steps, the "
              "state carried between windows [default: whole sequences].", kind=int)
    epochs: int = option(1000, "Upper bound on epochs.")  # early stopping ends the run first
    # a NaN/inf training loss or validation output: "stop" ends the run at its last good epoch
    # with its best checkpoint (as early stopping; Lightning's check_finite), "raise" fails it
    on_divergence: str = option(
        "stop", "A NaN/inf loss or validation output: end the run at its last good epoch with "
                "its best checkpoint (stop), or fail it (raise).", choices=DIVERGENCE)
    transpose: int = option(0, "Augmentation: shift each training sequence by up to +-N "
                               "semitones.", minimum=0, below=88)

    def __post_init__(self) -> None:
        check_protocol(self.protocol)  # before its fields are read from it
        for name in PROTOCOL_FIELDS:
            if getattr(self, name) is FROM_PROTOCOL:
                setattr(self, name, getattr(PROTOCOLS[self.protocol], name))
        self.data = resolve_name(self.data)
        device_form(self.device)
        # the model with its activation, depth and dropout: fail now, not after hours of pretraining
        activation = check_options(self.model, self.nonlinearity, self.num_layers, self.dropout,
                                   self.memory_bound, self.loop_bound, self.input_path)
        self.memory_bound = memory_bound_of(self.model, self.memory_bound)
        spec = get_spec(self.model)
        if not spec.has_memory:  # no loop to bound (False: as in every record before the field)
            self.memory, self.loop_bound = None, False
        else:  # what the layer will do, recorded (None resolves by the activation)
            self.loop_bound = check_loop_bound(self.loop_bound, activation, self.memory_bound)
        check_fields(self)
        # an option that only some models have, left unset (None) by default: refused elsewhere
        own = option_names(self.model)
        for f in fields(self):
            if f.name in MODEL_OPTION_FIELDS and f.name not in own and f.default is None \
                    and getattr(self, f.name) is not None:
                takers = [m for m in model_names() if f.name in option_names(m)]
                raise ValueError(f"{f.name} applies to {', '.join(takers) or 'no model'}, not "
                                 f"to {self.model}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        """The config of a dict of fields (``config.json``, a study's settings); one that names
        no protocol was saved before protocols had names: :data:`LEGACY_PROTOCOL`'s, and a field
        it lacks takes its value from before the field existed (:data:`BEFORE_FIELD`)."""
        known = {f.name for f in fields(cls)}
        return cls(**{**BEFORE_FIELD, **{k: v for k, v in d.items() if k in known},
                      "protocol": record_protocol(d)})

    @classmethod
    def legacy_defaults(cls) -> dict[str, Any]:
        """The value of each field in a record saved before the field or protocols' names
        existed: the defaults under :data:`LEGACY_PROTOCOL`, and :data:`BEFORE_FIELD`'s."""
        return {**asdict(cls(protocol=LEGACY_PROTOCOL)), **BEFORE_FIELD}

    @classmethod
    def from_run(cls, run_dir: str | os.PathLike, **changes: Any) -> TrainConfig:
        """The config a run directory holds (its ``config.json``), with ``changes`` (a resumed
        run's new budget, say)."""
        return cls.from_dict({**read_record(run_dir, CONFIG), **changes})

    def identity(self) -> dict[str, Any]:
        """The fields that define the run's numbers: all but the budget (:data:`BUDGET_FIELDS`)
        and where it runs (device, data folder), the activation spelt out (``None`` is the
        model's default: the same run). ``--resume`` refuses a change of these."""
        fields = {k: v for k, v in asdict(self).items()
                  if k not in BUDGET_FIELDS and k not in PLACE_FIELDS}
        fields["nonlinearity"] = self.nonlinearity or default_nonlinearity(self.model)
        return fields

    def protocol_overrides(self) -> dict[str, Any]:
        """The fields of :data:`PROTOCOL_FIELDS` where this run departs from its protocol."""
        spec = PROTOCOLS[self.protocol]
        return {name: getattr(self, name) for name in PROTOCOL_FIELDS
                if getattr(self, name) != getattr(spec, name)}

    def loss_scale(self, n_keys: int) -> float:
        """The factor from the models' training loss (nats per step, summed over ``n_keys``) to
        the loss that is minimised (:data:`LOSS_REDUCTIONS`)."""
        return 1.0 / n_keys if self.loss_reduction == "mean" else 1.0

    def model_options(self) -> ModelOptions:
        """The model's options (an instance of its :attr:`ModelSpec.options`), from this
        config's fields."""
        return model_options(self.model, **{f.name: getattr(self, f.name)
                                            for f in fields(get_spec(self.model).options)})


# the fields TrainConfig takes from the models' option classes (its bases) but for the sizes
# every model has (ModelOptions), in its order: each some models' only (the bases declared in
# linmem.model_options; not the protocol's or the run's settings); linmem train lists them last
_FROM_OPTIONS = {f.name for base in TrainConfig.__bases__
                 if base.__module__ == ModelOptions.__module__ for f in fields(base)}
MODEL_OPTION_FIELDS = tuple(f.name for f in fields(TrainConfig) if f.name in _FROM_OPTIONS
                            and f.name not in {g.name for g in fields(ModelOptions)})


def departures_text(departures: dict[str, Any]) -> str:
    """``+FIELD=VALUE`` for each of ``departures`` (the protocol fields a study or run departs
    from, its memory bound), sorted by field: what names a study of them
    (:func:`linmem.experiments.grids.study_name`) and a report's copy of its selected run
    apart from those without them."""
    return "".join(f"+{field}={value:g}" if isinstance(value, float) else f"+{field}={value}"
                   for field, value in sorted(departures.items()))
