"""What the ``linmem`` command's modules share: the usage error, the options of a training run
(declared once, from :class:`linmem.config.TrainConfig`'s defaults) and the option parsers."""

from __future__ import annotations

import re
import time
from datetime import datetime
from typing import Any

import click

from .config import (
    CPU_KERNELS,
    DIVERGENCE,
    FROM_PROTOCOL,
    LOSS_REDUCTIONS,
    PROTOCOL_FIELDS,
    PROTOCOLS,
    SELECTIONS,
    TrainConfig,
)
from .models import model_names

__all__ = [  # shared by linmem.cli and linmem.cli_experiments
    "_DEFAULT",
    "_RUN_OPTIONS",
    "UsageFailure",
    "_ModelChoice",
    "_clip",
    "_integers",
    "_needs_matplotlib",
    "_opened_storage",
    "_positive",
    "_protocol_option",
    "_protocol_values",
    "_run_options",
    "_runs_root_option",
    "_stop_by",
    "_storage_option",
    "_thresholds",
    "_train_options",
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
    """``storage`` opened once (:func:`linmem.search.check_storage`), in the form to use: a URL
    no database answers to is a usage error (exit 2); one that cannot be opened (a damaged
    file, a server out of reach, no driver) a fault of the machine (exit 1). One line each."""
    from .grids import StorageError, check_storage  # optuna: slow to import

    try:
        return check_storage(storage)
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    except StorageError as err:
        raise click.ClickException(str(err)) from None


def _needs_matplotlib(what: str) -> None:
    """Exit 1 in one line, before anything is written, when matplotlib (the ``plot`` extra) is
    not installed."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise click.ClickException(
            f"{what} needs matplotlib, which is not installed: pip install "
            "'linear-memory-networks[plot]'")


class _ModelChoice(click.Choice):
    """The registry's models (:func:`linmem.models.model_names`), read when a command line is
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


def _clip(ctx, param, value):
    if value is None:
        return FROM_PROTOCOL  # not given
    if str(value).lower() in ("none", "0", "off"):
        return None
    try:
        clip = float(value)
    except ValueError:
        raise click.BadParameter(f"must be a positive number or 'none', got {value!r}") from None
    if not clip > 0:
        raise click.BadParameter(f"must be a positive number or 'none', got {value!r}")
    return clip


# training settings that `linmem train` and `linmem search` both take
_RUN_OPTIONS = (
    click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=_DEFAULT.lr,
                 show_default=True),
    click.option("--epochs", type=int, default=_DEFAULT.epochs, show_default=True,
                 callback=_positive, help="Upper bound on epochs."),
    click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default=_DEFAULT.protocol,
                 show_default=True,
                 help="The training protocol: the defaults of --batch-size, --loss-reduction, "
                      "--clip, --init-bias, --patience and --select (" + "; ".join(
                          f"{p.name}: {p.about}" for p in PROTOCOLS.values()) + ")."),
    click.option("--patience", type=int, default=None, callback=_positive,
                 help="Epochs without a better validation score [default: the protocol's, "
                      + _protocol_values("patience") + "]."),
    click.option("--batch-size", type=int, default=None, callback=_positive,
                 help="Sequences per update [default: the protocol's, "
                      + _protocol_values("batch_size") + "]."),
    click.option("--loss-reduction", type=click.Choice(LOSS_REDUCTIONS), default=None,
                 help="The training loss: the NLL summed over the keys per frame (frame), or "
                      "averaged over the keys too (mean: PyTorch's BCE default; --weight-decay "
                      "and --clip are relative to it) [default: the protocol's, "
                      + _protocol_values("loss_reduction") + "]."),
    click.option("--select", type=click.Choice(SELECTIONS), default=None,
                 help="The validation score that picks the best epoch: global accuracy, "
                      "per-frame mean accuracy or NLL [default: the protocol's, "
                      + _protocol_values("select") + "]."),
    click.option("--chunk", type=int, default=_DEFAULT.chunk, callback=_positive,
                 help="Truncated backpropagation through time: an update per window of N steps, "
                      "the state carried between windows [default: whole sequences]."),
    click.option("--clip", default=None, callback=_clip,
                 help="Gradient-norm clipping, or 'none' [default: the protocol's, "
                      + _protocol_values("clip") + "]."),
    click.option("--on-divergence", type=click.Choice(DIVERGENCE),
                 default=_DEFAULT.on_divergence, show_default=True,
                 help="A NaN/inf loss or validation output: end the run at its last good epoch "
                      "with its best checkpoint (stop), or fail it (raise)."),
    click.option("--k", type=int, default=_DEFAULT.k, show_default=True, callback=_positive,
                 help="Pretraining: past blocks of the unrolled network (ulm, pret-lmn-*)."),
    click.option("--nade-hidden", type=int, default=_DEFAULT.nade_hidden, show_default=True,
                 callback=_positive, help="*-nade: hidden units of the NADE over the keys."),
    click.option("--nade-samples", type=int, default=_DEFAULT.nade_samples, show_default=True,
                 callback=_positive, help="*-nade: frames drawn per step for the key marginals "
                                          "and the expected accuracy."),
    click.option("--seed", type=click.IntRange(min=0), default=_DEFAULT.seed, show_default=True),
    click.option("--cpu-kernel", type=click.Choice(CPU_KERNELS), default=_DEFAULT.cpu_kernel,
                 show_default=True,
                 help="The recurrences' CPU path: auto (measured fastest on this machine's first "
                      "use), best (the best variant the CPU runs, not timed: the same numbers "
                      "for the same seed on this machine), loop (PyTorch), or a variant. Paths "
                      "agree to rounding, not bit for bit; metrics.json names the one used."),
    click.option("--device", default=_DEFAULT.device, show_default=True,
                 help="cpu, cuda, cuda:1"),
    click.option("--data-dir", type=click.Path(file_okay=False), default=None,
                 help="Folder with the data files (default: $LINMEM_DATA, else the user cache)."),
)


# the search storage and where its runs are, for `linmem report` and `linmem progress`
_storage_option = click.option(
    "--storage", default=None,
    help="Optuna storage URL of the search [default: sqlite:///runs/search/search.db].")
_protocol_option = click.option(
    "--protocol", type=click.Choice(list(PROTOCOLS)), default="linmem", show_default=True,
    help="The studies trained under this protocol (linmem search --protocol).")
_runs_root_option = click.option(
    "--runs-root", type=click.Path(file_okay=False), default=".", show_default=True,
    help="Folder the trials' run directories are relative to (where search ran).")


def _run_options(command):
    """Adds :data:`_RUN_OPTIONS` to a command, in their order in ``--help``."""
    for option in reversed(_RUN_OPTIONS):
        command = option(command)
    return command
