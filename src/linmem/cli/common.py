"""What the ``linmem`` command's modules share: the usage error, the options of a training run
(declared once, from :class:`linmem.training.config.TrainConfig`'s defaults) and the option
parsers."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from dataclasses import MISSING, Field, fields
from datetime import datetime
from typing import Any, NoReturn

import click

from linmem._extras import missing_extra
from linmem.model_options import ModelOptions
from linmem.registry import model_names
from linmem.training.config import (
    FROM_PROTOCOL,
    MODEL_OPTION_FIELDS,
    PROTOCOL_FIELDS,
    PROTOCOLS,
    ProtocolSettings,
    RunSettings,
    TrainConfig,
)

__all__ = [  # shared by the modules of the commands (linmem.cli.commands, experiments, searches)
    "SEARCH_FIELDS",
    "TRAIN_FIELDS",
    "_DEFAULT",
    "Terminated",
    "UsageFailure",
    "_ModelChoice",
    "_clip",
    "_clips",
    "_integers",
    "_needs_extra",
    "_opened_storage",
    "_positive",
    "_protocol_option",
    "_protocol_values",
    "_runs_root_option",
    "_stop_by",
    "_storage_option",
    "_thresholds",
    "_train_options",
    "bound_value",
    "config_error",
    "config_options",
    "stopped",
]


_DEFAULT = TrainConfig()


def _train_options(options: dict[str, Any]) -> dict[str, Any]:
    """The command line's training options without the protocol fields left unset (None;
    ``--clip``, where None is 'none': FROM_PROTOCOL): :class:`TrainConfig` takes those from
    ``--protocol``."""
    unset = {k for k, v in options.items() if k in PROTOCOL_FIELDS
             and (v is FROM_PROTOCOL or (v is None and k != "clip"))}
    return {k: v for k, v in options.items() if k not in unset}


class UsageFailure(click.ClickException):
    exit_code = 2


def _opened_storage(storage: str) -> str:
    """``storage`` opened once (:func:`linmem.experiments.search.check_storage`), in the form to
    use: a URL no database answers to is a usage error (exit 2); one that cannot be opened (a
    damaged file, a server out of reach, no driver) a fault of the machine (exit 1). One line
    each."""
    from linmem.experiments.storage import StorageError, check_storage  # optuna: slow to import

    try:
        return check_storage(storage)
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    except StorageError as err:
        raise click.ClickException(str(err)) from None


def _needs_extra(module: str, what: str) -> None:
    """Exit 1 in one line, before anything is written, when ``module`` (a package of an extra,
    :data:`linmem._extras.EXTRAS`) is not installed: the line names the extra to install."""
    missing = missing_extra(module, what)
    if missing is not None:
        raise click.ClickException(str(missing))


class _ModelChoice(click.Choice):
    """The registry's models (:func:`linmem.registry.model_names`), read when a command line is
    parsed, so that a model registered after this module was imported is a choice too."""

    def __init__(self) -> None:
        super().__init__(model_names())

    @property
    def choices(self):
        return model_names()

    @choices.setter
    def choices(self, value) -> None:  # click's __init__ assigns it
        pass


def _integers(option: str, text: str) -> list[int]:
    """The comma-separated integers of ``option`` (``--seeds``, ``--values``), or one line."""
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UsageFailure(f"{option} must be comma-separated integers, got {text!r}") from None


def _positive(ctx, param, value):
    if value is not None and value < 1:
        raise click.BadParameter(f"must be a positive integer, got {value}")
    return value


def _stop_by(ctx, param, value: str | None) -> float | None:
    """``--stop-by``: a time (ISO 8601, local time without a zone) or a duration from now
    (``2h30m``, ``90m``, ``45s``), as a Unix time."""
    if value is None:
        return None
    match = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", value.strip())
    if value.strip() and match:
        h, m, sec = (int(g or 0) for g in match.groups())
        return time.time() + 3600 * h + 60 * m + sec
    try:
        return datetime.fromisoformat(value.strip()).timestamp()
    except ValueError:
        raise click.BadParameter(f"expected a time (2026-11-25T07:10) or a duration (2h30m), "
                                 f"got {value!r}") from None


def _thresholds(ctx, param, value: str | None) -> tuple[float, ...]:
    """``--thresholds``: ``0.3,0.5,0.7`` or a range ``START:STOP:STEP`` (``STOP`` included when
    the steps reach it), every one in (0, 1]."""
    if value is None:
        return ()
    try:
        if ":" in value:
            start, stop, step = (float(v) for v in value.split(":"))
            if not step > 0 or stop < start:
                raise ValueError
            count = int((stop - start) / step + 1e-9) + 1  # the steps that stay <= STOP
            values = [round(start + i * step, 6) for i in range(count)]
        else:
            values = [float(v) for v in value.split(",")]
    except ValueError:
        raise click.BadParameter(f"expected thresholds such as 0.3,0.5,0.7 or 0.05:0.95:0.05, "
                                 f"got {value!r}") from None
    if not all(0 < t <= 1 for t in values):
        raise click.BadParameter(f"thresholds must be in (0, 1], got {value!r}")
    return tuple(dict.fromkeys(values))


def _protocol_values(field: str) -> str:
    """``--help``'s text for a protocol field's default: each protocol's value."""
    return ", ".join(f"{getattr(p, field)} ({p.name})" for p in PROTOCOLS.values())


def _positive_or_none(value: Any, nones: tuple[str, ...] = ("none",)) -> float | None:
    """A positive number, or None for one of ``nones`` (or no value)."""
    if value is None or str(value).lower() in nones:
        return None
    try:
        number = float(value)
    except ValueError:
        raise click.BadParameter(f"must be a positive number or 'none', got {value!r}") from None
    if not number > 0:
        raise click.BadParameter(f"must be a positive number or 'none', got {value!r}")
    return number


def _clip_value(value: str) -> float | None:
    """A ``--clip`` value: a positive number, or None ('none', '0', 'off'): no clipping."""
    return _positive_or_none(value, ("none", "0", "off"))


def bound_value(value: Any) -> float | None:
    """A ``--memory-bound`` value: a positive number, or None ('none'): the paper's unbounded
    memory."""
    return _positive_or_none(value)


def _clip(ctx, param, value):
    return FROM_PROTOCOL if value is None else _clip_value(value)  # None: not given


def _clips(ctx, param, values):
    """A repeatable ``--clip`` (linmem replay-epoch): each value as :func:`_clip_value`."""
    return tuple(_clip_value(v) for v in values)


# how the command line reads a field where its declared kind is not enough
_READERS: dict[str, dict[str, Any]] = {
    "model": {"type": _ModelChoice()},
    "clip": {"type": str, "callback": _clip, "metavar": "FLOAT|none"},
    "memory_bound": {"type": str, "callback": lambda ctx, param, value: bound_value(value),
                     "metavar": "R|none"},
}


def _config_option(f: Field, default: Any = MISSING, note: str = "") -> Callable:
    """The ``--option`` of :class:`TrainConfig` field ``f``, made from its declaration
    (:func:`linmem._check.option`): a protocol's field defaults to None (unset: the protocol's
    value, said in its help); checking the value is :class:`TrainConfig`'s (one place). A
    command whose default differs from the field's gives ``default``, and ``note`` says why."""
    meta, flag = f.metadata, "--" + f.name.replace("_", "-")
    unset = f.name in PROTOCOL_FIELDS
    if default is MISSING:
        default = None if unset else f.default
    kw: dict[str, Any] = {"default": default, "help": meta["help"] + note,
                          "show_default": default is not None and meta["kind"] is not bool}
    if unset:
        kw["help"] = (meta["help"].rstrip(".") + " [default: the protocol's, "
                      + _protocol_values(f.name) + "].")
    if meta["kind"] is bool:
        flag = f"{flag}/--no-{flag[2:]}"
    elif meta["choices"] is not None:
        kw["type"] = click.Choice(list(meta["choices"]))
    elif meta["folder"]:
        kw["type"] = click.Path(file_okay=False)
    else:
        kw["type"] = meta["kind"]
    kw.update(_READERS.get(f.name, {}))
    return click.option(flag, f.name, **kw)


def config_options(*names: str, defaults: dict[str, tuple[Any, str]] | None = None) -> Callable:
    """Adds the options of :class:`TrainConfig`'s fields ``names`` to a command, in that order in
    ``--help``; ``defaults``: ``{name: (default, why)}`` where the command's default is not the
    field's."""
    declared = {f.name: f for f in fields(TrainConfig)}
    defaults = defaults or {}

    def add(command):
        for name in reversed(names):
            command = _config_option(declared[name], *defaults.get(name, ()))(command)
        return command
    return add


def _train_fields() -> tuple[str, ...]:
    """Every field of :class:`TrainConfig` in ``linmem train --help``'s order, by concern: the
    protocol, data and model, every model's sizes, the training's own settings, those its
    protocol names (:class:`ProtocolSettings`), where and how it runs (:class:`RunSettings`),
    then each model's own options."""
    sizes = [f.name for f in fields(ModelOptions)]
    protocol = [f.name for f in fields(ProtocolSettings)]
    run = [f.name for f in fields(RunSettings)]
    first = ["protocol", "data", "model"]
    own = [f.name for f in fields(TrainConfig) if f.name not in
           {*first, *sizes, *protocol, *run, *MODEL_OPTION_FIELDS}]
    return (*first, *sizes, *own, *protocol, *run, *MODEL_OPTION_FIELDS)


TRAIN_FIELDS = _train_fields()  # linmem train: all of them

# linmem search: the fields its points share (its grid sets the sizes and the weight decay)
SEARCH_FIELDS = ("lr", "epochs", "protocol", "patience", "batch_size", "loss_reduction",
                 "init_bias", "select", "chunk", "clip", "on_divergence", "memory_bound", "k",
                 "nade_hidden", "nade_samples", "seed", "cpu_kernel", "device", "data_dir")


def config_error(err: ValueError) -> UsageFailure:
    """A :class:`TrainConfig` error as the command line's: "--hidden must be a positive integer,
    got -5" (the field named as its option)."""
    text = str(err)
    name = text.split(" ", 1)[0]
    if name in TRAIN_FIELDS:
        text = "--" + name.replace("_", "-") + text[len(name):]
        if " or None, got " in text:  # None is the option left out, not a value to type
            text = text.replace(" or None, got ", ", got ", 1) + " (leave it out for its default)"
    return UsageFailure(text)


# the search storage and where its runs are, for `linmem report` and `linmem progress`
_storage_option = click.option(
    "--storage", default=None,
    help="Optuna storage URL of the search [default: sqlite:///runs/search/search.db].")
_protocol_option = click.option(
    "--protocol", type=click.Choice(list(PROTOCOLS)), default=None,
    help="The studies trained under this protocol (linmem search --protocol) [default: the "
         "protocol the storage's studies were trained under].")
_runs_root_option = click.option(
    "--runs-root", type=click.Path(file_okay=False), default=".", show_default=True,
    help="Folder the trials' run directories are relative to (where search ran).")


class Terminated(KeyboardInterrupt):
    """A SIGTERM (``kill``, a batch system's stop, a machine's shutdown), raised where a Ctrl-C
    would be so that a command stops as cleanly (the checkpoints are written atomically);
    the exit status is then 143, the shell's for a SIGTERM."""


def stopped(err: BaseException | None, then: str | None = None) -> NoReturn:
    """One line for a command stopped by Ctrl-C or SIGTERM (``err``; ``then``: how to go on),
    and the exit status of each (130, 143)."""
    what = "terminated (SIGTERM)" if isinstance(err, Terminated) else "interrupted"
    click.echo(f"\nlinmem: {what}" + (f"; {then}" if then else ""), err=True)
    sys.exit(143 if isinstance(err, Terminated) else 130)
