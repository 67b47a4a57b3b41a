"""The ``linmem`` command: thin wrappers over the library.

Usage errors (unknown data set or model, bad sizes, missing data) print one line
``linmem: error: ...`` and exit with code 2; a diverged run exits with 1, an interrupted one 130.
"""

from __future__ import annotations

import errno
import json
import re
import sys
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from ._io import (
    atomic_write,
    command_line,
    git_commit,
    provenance,
    read_json,
    write_json,
)
from .analyses import (
    STARTS,
    first_updates,
    first_updates_markdown,
    memory_markdown,
    patience_markdown,
    patience_records,
)
from .data import (
    DATASETS,
    DataError,
    content_digest,
    data_checksum,
    is_data_file,
    load_polyphonic,
    resolve_name,
)
from .generate import continue_run, predict_sequence
from .midi import DEFAULT_STEP_SECONDS, import_midi_folder
from .models import PREDICTIONS, expected_accuracy, get_spec, model_names
from .nn import NONLINEARITIES
from .plots import plot_pretraining, plot_run
from .recipes import SeedsDiverged, analyze_pretraining, pretrained_models, reseed
from .recipes import run as run_training
from .report import (
    markdown_table,
    previous_frame_report,
    protocols_markdown,
    run_records,
    seed_groups,
    seeds_markdown,
    summary_file_records,
    with_selected_run_fields,
    write_search_report,
)
from .runs import (
    CONFIG,
    METRICS,
    RunDirBusy,
    collect_metrics,
)
from .train import (
    CPU_KERNELS,
    DIVERGENCE,
    FROM_PROTOCOL,
    LOSS_REDUCTIONS,
    OPTIMIZERS,
    PROTOCOL_FIELDS,
    PROTOCOLS,
    SELECTIONS,
    TrainConfig,
    TrainingDiverged,
    evaluate,
    load_run_model,
)

_DEFAULT = TrainConfig()


def _train_options(options: dict[str, Any]) -> dict[str, Any]:
    """The command line's training options without the protocol fields left unset (None;
    ``--clip``, where None is 'none': FROM_PROTOCOL): :class:`TrainConfig` takes those from
    ``--protocol``."""
    unset = {k for k, v in options.items() if k in PROTOCOL_FIELDS
             and (v is FROM_PROTOCOL or (v is None and k != "clip"))}
    return {k: v for k, v in options.items() if k not in unset}


__all__ = ["cli", "main"]

class UsageFailure(click.ClickException):
    exit_code = 2


def _opened_storage(storage: str) -> str:
    """``storage`` opened once (:func:`linmem.search.check_storage`), in the form to use: a URL
    no database answers to is a usage error (exit 2); one that cannot be opened (a damaged
    file, a server out of reach, no driver) a fault of the machine (exit 1). One line each."""
    from .search import StorageError, check_storage  # optuna: slow to import

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             invoke_without_command=True)
@click.version_option(package_name="linear-memory-networks")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Linear Memory Networks: train and evaluate models on the polyphonic music data sets."""
    if ctx.invoked_subcommand is None:  # plain `linmem`: the usage, not an error
        click.echo(ctx.get_help())


@cli.command("train")
@click.option("--data", default=_DEFAULT.data, show_default=True,
              help=f"Data set: {', '.join(DATASETS)} (common spellings accepted), or a "
                   ".pickle file of your own (linmem data import-midi).")
@click.option("--model", type=_ModelChoice(), default=_DEFAULT.model,
              show_default=True)
@click.option("--hidden", type=int, default=_DEFAULT.hidden, show_default=True,
              callback=_positive, help="Hidden units (LMN: functional units).")
@click.option("--memory", type=int, default=_DEFAULT.memory, show_default=True,
              callback=_positive, help="LMN memory units (ignored by rnn, lstm, gru).")
@click.option("--num-layers", type=int, default=_DEFAULT.num_layers, show_default=True,
              callback=_positive)
@click.option("--weight-decay", type=click.FloatRange(min=0), default=_DEFAULT.weight_decay,
              show_default=True, help="L2 weight decay (Adam's weight_decay).")
@_run_options
@click.option("--optimizer", type=click.Choice(OPTIMIZERS), default=_DEFAULT.optimizer,
              show_default=True)
@click.option("--momentum", type=click.FloatRange(0, 1, max_open=True), default=_DEFAULT.momentum,
              show_default=True, help="SGD momentum.")
@click.option("--dropout", type=click.FloatRange(0, 1, max_open=True), default=_DEFAULT.dropout,
              show_default=True, help="Dropout on the recurrent output before the readout.")
@click.option("--transpose", type=click.IntRange(0, 87), default=_DEFAULT.transpose,
              show_default=True,
              help="Augmentation: shift each training sequence by up to +-N semitones.")
@click.option("--init-bias/--no-init-bias", default=None,
              help="Start the readout bias at the training split's key rates, or at "
                   "nn.Linear's default [default: the protocol's, "
                   + _protocol_values("init_bias") + "].")
@click.option("--nonlinearity", type=click.Choice(NONLINEARITIES), default=None,
              help="Recurrent activation [default: selu for ulm and pret-lmn-*, else tanh].")
@click.option("--ulm-nonlinearity", type=click.Choice(NONLINEARITIES), default=None,
              help="pret-lmn-*: the unrolled network's activation [default: the LMN's, an exact "
                   "transfer]; selu with --nonlinearity tanh is the paper's text.")
@click.option("--ulm-cache", type=click.Path(file_okay=False), default=None,
              help="pret-lmn-*: a folder of unrolled networks shared between runs (those of "
                   "one grid's memory sizes are the same: trained once) [default: each run "
                   "trains its own in RUN_DIR/ulm; linmem search: OUT/ulm-cache].")
@click.option("--la-window", type=click.IntRange(min=0), default=None,
              help="Pretraining: the linear autoencoder's window [default: k + 1 for pret-lmn-*, "
                   "full length for pret-rnn; 0: full length].")
@click.option("--pretrain-epochs", type=int, default=None, callback=_positive,
              help="Pretraining: epoch bound of the unrolled network [default: --epochs].")
@click.option("--rbm-hidden", type=int, default=_DEFAULT.rbm_hidden, show_default=True,
              callback=_positive, help="rnn-rbm: hidden units of each step's RBM "
                                       "(--hidden: the RNN's units).")
@click.option("--cd-k", type=int, default=_DEFAULT.cd_k, show_default=True, callback=_positive,
              help="rnn-rbm: Gibbs steps of contrastive divergence.")
@click.option("--rbm-predict", type=click.Choice(PREDICTIONS),
              default=_DEFAULT.rbm_predict, show_default=True,
              help="rnn-rbm: how the key marginals (accuracy) are estimated.")
@click.option("--ais-chains", type=int, default=_DEFAULT.ais_chains, show_default=True,
              callback=_positive, help="rnn-rbm: AIS chains per frame (test NLL).")
@click.option("--ais-betas", type=int, default=_DEFAULT.ais_betas, show_default=True,
              callback=_positive, help="rnn-rbm: AIS temperatures (test NLL).")
@click.option("--ais-frames", type=int, default=_DEFAULT.ais_frames, show_default=True,
              callback=_positive, help="rnn-rbm: test frames drawn for the AIS NLL.")
@click.option("--rbm-pretrain-epochs", type=click.IntRange(min=0),
              default=_DEFAULT.rbm_pretrain_epochs, show_default=True,
              help="rnn-rbm: first train W, b_v, b_h as one RBM on all frames (CD epochs).")
@click.option("--rnn-pretrain-epochs", type=click.IntRange(min=0),
              default=_DEFAULT.rnn_pretrain_epochs, show_default=True,
              help="rnn-rbm: first train a tanh RNN next-step predictor (epoch bound) and copy "
                   "it into the RNN part.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Run directory (default: runs/DATA-MODEL-SIZES-wdWD-sSEED).")
@click.option("--resume", is_flag=True, help="Continue the run in --out from its last epoch.")
@click.option("--quiet", is_flag=True, help="No progress bar or per-epoch lines.")
@click.pass_context
def train_cmd(ctx: click.Context, out: str | None, resume: bool, quiet: bool, **options) -> None:
    """Train a next-step model, select the epoch on validation, score it once on test."""
    if out is None:
        if resume:
            raise click.UsageError("--resume needs --out RUN_DIR")
        sizes = f"h{options['hidden']}" + (
            f"-m{options['memory']}" if get_spec(options["model"]).has_memory else "")
        data = Path(options["data"]).stem if is_data_file(options["data"]) else options["data"]
        out = (f"runs/{data}-{options['model']}-{sizes}-wd{options['weight_decay']:g}"
               f"-s{options['seed']}")
    try:
        if resume and (Path(out) / CONFIG).is_file():
            saved = read_json(Path(out) / CONFIG)
            given = {k: v for k, v in _train_options(options).items()
                     if ctx.get_parameter_source(k) != ParameterSource.DEFAULT}
            options = {**saved, **given}
        config = TrainConfig.from_dict(_train_options(options))
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    if config.data_dir is not None and not Path(config.data_dir).is_dir():
        raise UsageFailure(f"--data-dir {config.data_dir}: no such directory")
    try:
        metrics = run_training(config, out, resume=resume, progress=not quiet)
    except TrainingDiverged as err:
        click.echo(f"linmem: training diverged: {err}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo(f"\nlinmem: interrupted; continue with: linmem train --resume --out {out}",
                   err=True)
        sys.exit(130)
    except (DataError, ValueError, FileExistsError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(
        f"{config.model} on {config.data}: valid acc {metrics['valid_acc']:.2f}%  "
        f"test acc {metrics['test_acc']:.2f}%  test nll {metrics['test_nll']:.3f}  "
        f"({metrics['n_params']} params, {metrics['epochs']} epochs, best {metrics['best_epoch']},"
        f" {metrics['wall_time_s']:.0f}s) -> {Path(out) / METRICS}")


@cli.command("pretrain", context_settings={"ignore_unknown_options": True,
                                           "allow_extra_args": True})
@click.option("--model", type=click.Choice(pretrained_models()),
              default="pret-lmn-b", show_default=True)
@click.pass_context
def pretrain_cmd(ctx: click.Context, model: str) -> None:
    """Pretrain and fine-tune: `linmem train --model pret-lmn-b`, same options.

    pret-lmn-*: trains the unrolled network (RUN_DIR/ulm), fits the memory on its states
    (RUN_DIR/memory.npz), initialises the LMN (RUN_DIR/init.pt, eqs. 12-15), fine-tunes it.
    Each step is kept: --resume continues from the step that was interrupted.
    """
    train_cmd.main(args=["--model", model, *ctx.args], prog_name="linmem pretrain",
                   standalone_mode=False)


@cli.command("analyze-pretraining")
@click.option("--data", default="jsb", show_default=True)
@click.option("--hidden", type=int, default=50, show_default=True, callback=_positive)
@click.option("--k", type=int, default=10, show_default=True, callback=_positive)
@click.option("--memories", default="10,25,50,100,200,300,400,550", show_default=True,
              help="Memory sizes for panels (a) and (b), comma-separated.")
@click.option("--first-memory", type=int, default=1000, show_default=True, callback=_positive,
              help="Memory of panel (c)'s full-length autoencoder (kept below the rank).")
@click.option("--ulm-run", type=click.Path(file_okay=False), default=None,
              help="A trained ulm run directory to analyse [default: train one into "
                   "runs/DATA-ulm-hHIDDEN-kK-sSEED, resumable].")
@click.option("--epochs", type=int, default=_DEFAULT.epochs, show_default=True,
              callback=_positive, help="Epoch bound when training the ULM.")
@click.option("--patience", type=int, default=_DEFAULT.patience, show_default=True,
              callback=_positive)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--out", type=click.Path(file_okay=False), default="results/pretraining",
              show_default=True)
@click.option("--quiet", is_flag=True)
def analyze_pretraining_cmd(data: str, hidden: int, k: int, memories: str, first_memory: int,
                            ulm_run: str | None, epochs: int, patience: int, seed: int,
                            data_dir: str | None, out: str, quiet: bool) -> None:
    """The paper's pretraining analysis (Figure 5): OUT/analysis.json and OUT/figure5.png."""
    _needs_matplotlib("analyze-pretraining (figure5.png)")
    try:
        result = analyze_pretraining(
            data=data, hidden=hidden, k=k, memories=[int(v) for v in memories.split(",")],
            first_memory=first_memory, ulm_run=ulm_run, epochs=epochs, patience=patience,
            seed=seed, data_dir=data_dir, progress=not quiet)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    write_json(Path(out) / "analysis.json", result)
    plot_pretraining(result, Path(out) / "figure5.png")
    click.echo(f"ULM valid acc {result['ulm_valid_acc']:.2f}%; pretrained LMN valid acc "
               + ", ".join(f"{r['components']}: {r['lmn_valid_acc']:.2f}%"
                           for r in result["memories"])
               + f" -> {Path(out) / 'analysis.json'}, {Path(out) / 'figure5.png'}")


@cli.command("first-updates")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--updates", type=int, default=20, show_default=True, callback=_positive,
              help="Updates to replay (the training's own batches, in its order).")
@click.option("--lr", "lrs", type=click.FloatRange(min=0, min_open=True), multiple=True,
              help="A learning rate to replay at (repeatable) [default: each run's].")
@click.option("--start", "starts", type=click.Choice(STARTS), multiple=True,
              default=("init",), show_default=True,
              help="init: the run's initial weights (init.pt, a pretrained run's); random: "
                   "those the trainer draws for its configuration (the control). Repeatable.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--device", default="cpu", show_default=True)
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Also write OUT/first-updates.json and OUT/first-updates.md.")
def first_updates_cmd(run_dirs: tuple[str, ...], updates: int, lrs: tuple[float, ...],
                      starts: tuple[str, ...], data_dir: str | None, device: str,
                      out: str | None) -> None:
    """What the first updates of training do to each run's initial weights: replays them and
    prints the losses, the recurrent radius and the validation scores before and after."""
    command = command_line()
    try:
        results = [first_updates(run, updates, lrs, start, data_dir=data_dir, device=device,
                                 command=command) for run in run_dirs for start in starts]
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    text = first_updates_markdown(results, command)
    if out is not None:
        write_json(Path(out) / "first-updates.json", results)
        with atomic_write(Path(out) / "first-updates.md", "w") as f:
            f.write(text)
    click.echo(text, nl=False)


_max_retry_option = click.option(  # None: linmem.search.MAX_RETRY (optuna: slow to import)
    "--max-retry", type=click.IntRange(min=0), default=None,
    help="Deaths of a point's worker (a session's end kills it too) before the point is "
         "failed [default: 10].")


@cli.command("search")
@click.option("--data", "datasets", multiple=True, default=["jsb"], show_default=True,
              help="Data set (repeat for several).")
@click.option("--model", "models", multiple=True, type=_ModelChoice(),
              default=["lmn-b"], show_default=True, help="Model (repeat for several).")
@click.option("--grid", default="paper", show_default=True,
              help="Named grid: paper, paper-small, reduced, nade, quick, tiny "
                   "(linmem.search.GRIDS).")
@click.option("--storage", default=None,
              help="Optuna storage URL, e.g. postgresql://user@host/db to share the studies "
                   "between machines [default: sqlite:///OUT/search.db].")
@click.option("--out", type=click.Path(file_okay=False), default="runs/search",
              show_default=True, help="Folder of the trials' run directories.")
@click.option("--jobs", "-j", type=int, default=1, show_default=True, callback=_positive,
              help="Worker processes on this machine (the CPU threads are shared out).")
@click.option("--pruner", type=click.Choice(["median", "none"]), default=None,
              help="Stop a trial whose validation accuracy is below the median of the others' "
                   "at the same epoch (median), or run every point to its end (none) "
                   "[default: the protocol's, " + _protocol_values("pruner") + "].")
@click.option("--prune-warmup", type=int, default=50, show_default=True,
              help="Epochs before a trial may be pruned.")
@click.option("--subset", type=int, default=None, callback=_positive,
              help="Use the first N sequences of each split (quick runs, tests).")
@click.option("--heartbeat", type=int, default=60, show_default=True, callback=_positive,
              help="Seconds between a running trial's heartbeats; a trial silent for twice "
                   "as long is failed and retried.")
@click.option("--grace", type=int, default=None, callback=_positive,
              help="Seconds of silence before a trial is failed [default: 2 x --heartbeat].")
@click.option("--poll", type=float, default=10.0, show_default=True,
              help="Seconds between checks while the remaining points run elsewhere.")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Wait for the points running in other workers (to take over if one dies), "
                   "or leave them to their workers and exit once no point is left to start.")
@click.option("--stop-by", "stop_by", default=None, callback=_stop_by, metavar="WHEN",
              help="A time (2026-11-25T07:10, local) or a duration from now (2h30m): start no "
                   "point projected to end after it (from the study's finished points' times "
                   "per parameter) and exit when none is left that fits; a point already "
                   "running goes on. For a machine or batch job with a time limit.")
@_max_retry_option
@_run_options
@click.option("--quiet", is_flag=True)
def search_cmd(datasets: tuple[str, ...], models: tuple[str, ...], grid: str,
               storage: str | None, out: str, jobs: int, pruner: str | None, prune_warmup: int,
               subset: int | None, heartbeat: int, grace: int | None, poll: float, wait: bool,
               stop_by: float | None, max_retry: int | None, quiet: bool,
               **train_options) -> None:
    """Grid search on validation (--select: accuracy or NLL), one Optuna study per (data set,
    model).

    Resumable: run the same command again (on any machine, with --storage) and it goes on where
    the studies stand; a trial whose worker died is retried from its run's last epoch.
    `linmem report` then selects on validation and writes the tables.
    """
    from .search import (  # optuna: slow to import
        SearchConfig,
        check_search,
        default_storage,
        run_search,
    )

    try:
        config = SearchConfig(
            data=datasets, models=models, grid=grid, out_dir=out, storage=storage,
            base=TrainConfig.from_dict(_train_options(train_options)), pruner=pruner,
            prune_warmup=prune_warmup, subset=subset, heartbeat_interval=heartbeat,
            grace_period=grace, poll_s=poll, progress=not quiet, wait=wait, stop_by=stop_by,
            **({} if max_retry is None else {"max_retry": max_retry}))
        if config.base.data_dir is not None and not Path(config.base.data_dir).is_dir():
            raise ValueError(f"--data-dir {config.base.data_dir}: no such directory")
        check_search(config)
        click.echo(f"linmem search: storage {storage or default_storage(out)}, runs in {out}",
                   err=True)
        counts = run_search(config, jobs, command_line(), check=False)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    except RuntimeError as err:  # a worker that failed, a storage that cannot be opened
        raise click.ClickException(str(err)) from None
    except KeyboardInterrupt:
        click.echo("\nlinmem: interrupted; run the same command again to continue", err=True)
        sys.exit(130)
    for name, c in counts.items():
        click.echo(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(c.items())))


def _summary_files(paths: tuple[str, ...]) -> list[list[dict]]:
    """The records of each earlier summary.json (``--summary``); a usage error for a bad one."""
    try:
        return [summary_file_records(path) for path in paths]
    except ValueError as err:
        raise UsageFailure(str(err)) from None


@cli.command("report")
@_storage_option
@click.option("--grid", default="paper", show_default=True,
              help="Report the studies of this grid ('all': every grid).")
@_runs_root_option
@click.option("--out", type=click.Path(file_okay=False), default="results", show_default=True)
@click.option("--run", "runs", multiple=True, type=click.Path(exists=True),
              help="Also report single runs (run directories or folders of them) of models "
                   "without a search study, the best on validation per (data set, model).")
@click.option("--summary", "summaries", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="Also the selections of an earlier report's summary.json (a search whose "
                   "storage is not here), for (data set, model) pairs the storage lacks.")
@click.option("--seed-runs", "seed_runs", multiple=True, type=click.Path(exists=True),
              help="Runs of the selected configurations with other seeds (`linmem reseed`): "
                   "their spread, a table of its own.")
@click.option("--baseline", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The previous-frame baseline (`linmem baseline`'s JSON): a row of Table 2.")
@_protocol_option
@click.option("--compare", type=click.Path(exists=True, dir_okay=False), default=None,
              help="The summary.json of a report under the other protocol: OUT/protocols.md "
                   "sets both protocols' Table 2 side by side.")
def report_cmd(storage: str | None, grid: str, runs_root: str, out: str,
               runs: tuple[str, ...], summaries: tuple[str, ...], seed_runs: tuple[str, ...],
               baseline: str | None, protocol: str, compare: str | None) -> None:
    """Select each (data set, model) on validation; write OUT/summary.json, OUT/table2.md,
    OUT/figure4.png (+ .json), OUT/search_trials.json and the selected runs' files."""
    _needs_matplotlib("report (figure4.png)")
    from .search import default_storage, search_records, sqlite_path  # optuna: slow to import

    storage = storage or default_storage("runs/search")
    database = sqlite_path(storage)
    if database is not None and not database.is_file() and not (summaries or runs):
        raise UsageFailure(f"no search database at {database} (run `linmem search` first, or "
                           "pass --storage)")
    records = ([] if database is not None and not database.is_file() else
               search_records(_opened_storage(storage), None if grid == "all" else grid,
                              runs_root, protocol))
    # a study imported from another machine: what its run directories held, from the last report
    records = [with_selected_run_fields(r, Path(out) / "selected") if "test_acc" in r else r
               for r in records]
    if not records and not (summaries or runs):
        from .search import storage_grids

        others = [] if database is not None and not database.is_file() else \
            storage_grids(storage)
        hint = (f" (it holds the grid{'s' if len(others) > 1 else ''} {', '.join(others)}: "
                f"pass --grid {others[0]}, or --grid all)" if others else "")
        raise UsageFailure(f"no study of grid {grid!r} in {storage}{hint}")
    if runs:
        searched = {(r["dataset"], r["model"]) for r in records}
        try:
            singles = run_records(collect_metrics(runs))
        except (ValueError, FileNotFoundError) as err:
            raise UsageFailure(str(err)) from None
        clash = [f"{r['dataset']}/{r['model']}" for r in singles
                 if (r["dataset"], r["model"]) in searched]
        if clash:
            raise UsageFailure(f"--run {', '.join(clash)}: these have a search study already")
        records += singles
    for earlier in _summary_files(summaries):
        have = {(r["dataset"], r["model"]) for r in records}
        records += [r for r in earlier if (r["dataset"], r["model"]) not in have]
    out_dir = Path(out)
    try:
        calibration = read_json(baseline) if baseline is not None else None
        if calibration is not None and "scores" not in calibration:
            raise ValueError("no 'scores' in it")
    except ValueError as err:  # JSONDecodeError is one
        raise UsageFailure(f"--baseline {baseline}: not a baseline file ({err})") from None
    try:
        seeds = seed_groups(collect_metrics(seed_runs, diverged=True)) if seed_runs else []
    except (ValueError, FileNotFoundError) as err:
        raise UsageFailure(f"--seed-runs: {err}") from None
    write_search_report(records, out_dir, command_line(), runs_root, calibration, seeds)
    if compare is not None:  # the other protocol's selections beside these
        with atomic_write(out_dir / "protocols.md", "w") as f:
            f.write(protocols_markdown(records, *_summary_files((compare,)), command_line()))
    for r in records:
        sel = (f"selected {r['model']} h{r['hidden']}"
               + (f" m{r['memory']}" if r.get("memory") else "")
               + f" wd {r['weight_decay']:g}: valid {r['valid_acc']:.2f}% test {r['test_acc']:.2f}%"
               if "test_acc" in r else "nothing complete yet")
        where = (f"{r['study']}: {r['points_done']}/{r['grid_points']} points done"
                 if r["study"] else f"{r['dataset']}-{r['model']}: {r['trials']} single runs")
        click.echo(f"{where}; {sel}")
    click.echo(f"-> {out_dir}/summary.json, table2.md, figure4.png")


@cli.command("progress")
@_storage_option
@click.option("--grid", default="all", show_default=True,
              help="The studies of this grid ('all': every grid).")
@_runs_root_option
@click.option("--run", "runs", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Also count single runs (run directories, or folders of them).")
@click.option("--summary", "summaries", multiple=True,
              type=click.Path(exists=True, dir_okay=False),
              help="Also the searches of an earlier report's summary.json that the storage "
                   "lacks (their trials' wall time).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the table to this Markdown file [default: print it].")
@click.option("--plan", "plans", multiple=True, metavar="DATA:MODEL[:GRID]",
              help="Also a search not started yet (GRID: --grid's when that is not 'all'), "
                   "projected like the others, so that the total covers it.")
@click.option("--plan-seeds", "seed_plans", multiple=True, metavar="DATA:MODEL:GRID[:N]",
              help="Also the N (default 3) seeds of the study's selected configuration "
                   "(`linmem reseed`), those found among --run (DATA-MODEL-sK or "
                   "DATA-MODEL/sK, finished) left out.")
@click.option("--plan-run", "run_plans", multiple=True, metavar="DATA:RUN",
              help="Also a single run still to make: RUN's configuration (a finished run on "
                   "another data set) on DATA, projected from RUN scaled by the data sets' "
                   "frames; left out once a run of that model on DATA is among --run.")
@_max_retry_option
@_protocol_option
def progress_cmd(storage: str | None, grid: str, runs_root: str, runs: tuple[str, ...],
                 summaries: tuple[str, ...], out: str | None, plans: tuple[str, ...],
                 seed_plans: tuple[str, ...], run_plans: tuple[str, ...],
                 max_retry: int | None, protocol: str) -> None:
    """Where the searches stand: points done per study, the CPU hours their runs logged, the
    hours projected for the rest; nothing is run (safe beside running workers)."""
    from .progress import progress_table  # optuna: slow import
    from .search import default_storage, sqlite_path

    storage = storage or default_storage("runs/search")
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise UsageFailure(f"no search database at {database} (pass --storage)")
    try:
        text = progress_table(_opened_storage(storage), None if grid == "all" else grid,
                              runs_root, runs, list(_summary_files(summaries)), plans,
                              seed_plans, run_plans, max_retry, protocol, command_line())
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    if out is None:
        click.echo(text, nl=False)
    else:
        with atomic_write(out, "w") as f:
            f.write(text)
        click.echo(f"-> {out}")


@cli.command("search-export")
@click.argument("file", type=click.Path(dir_okay=False))
@_storage_option
@click.option("--grid", default="all", show_default=True,
              help="The studies of this grid ('all': every grid).")
@_runs_root_option
def search_export_cmd(file: str, storage: str | None, grid: str, runs_root: str) -> None:
    """Write the searches' finished trials to FILE (a text Optuna journal) for `linmem
    search-import` on another machine; trials still running are left out (they run again).
    A trial that stored no CPU time (pruned, or failed with its worker) takes its run's under
    --runs-root. Safe beside running workers."""
    from .search import default_storage, export_studies, sqlite_path  # optuna: slow import

    storage = storage or default_storage("runs/search")
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise UsageFailure(f"no search database at {database} (pass --storage)")
    counts = export_studies(_opened_storage(storage), file, None if grid == "all" else grid,
                            runs_root)
    click.echo(f"{sum(counts.values())} finished trials of {len(counts)} studies -> {file}")


@cli.command("search-import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_storage_option
def search_import_cmd(file: str, storage: str | None) -> None:
    """Add the studies of FILE (written by `linmem search-export`) to the storage; `linmem
    search` then goes on from them. Points the storage has finished are kept as they are."""
    from .search import default_storage, import_studies, make_storage  # optuna: slow import

    storage = _opened_storage(storage or default_storage("runs/search"))
    try:
        added = import_studies(file, make_storage(storage))
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    for name, n in sorted(added.items()):
        click.echo(f"{name}: {n} trials added")


def _field_values(pairs: Sequence[str]) -> dict[str, Any]:
    """``FIELD=VALUE`` options as a dict, each VALUE read as JSON where it parses."""
    values: dict[str, Any] = {}
    for pair in pairs:
        name, sep, text = pair.partition("=")
        if not sep or not name.strip():
            raise UsageFailure(f"--set takes FIELD=VALUE, got {pair!r}")
        try:
            values[name.strip()] = json.loads(text)
        except json.JSONDecodeError:
            values[name.strip()] = text
    return values


@cli.command("reseed")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--seeds", default="1,2,3", show_default=True,
              help="Comma-separated seeds to train RUN_DIR's configuration with.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Folder of the new runs, one sSEED per seed [default: RUN_DIR-seeds].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the data files [default: the run's own].")
@click.option("--set", "changes", multiple=True, metavar="FIELD=VALUE",
              help="Change a field of RUN_DIR's config.json (repeatable), e.g. "
                   "nonlinearity=tanh; VALUE is read as JSON where it parses (1e-7, 250, null), "
                   "else as text.")
@click.option("--stop-by", "stop_by", default=None, callback=_stop_by, metavar="WHEN",
              help="A time (2026-11-25T07:10, local) or a duration from now (2h30m): start "
                   "or resume no seed projected to end after it (RUN_DIR's CPU time less what "
                   "the seed has logged); run the command again later for the seeds left.")
@click.option("--quiet", is_flag=True)
def reseed_cmd(run_dir: str, seeds: str, out: str | None, data_dir: str | None,
               changes: tuple[str, ...], stop_by: float | None, quiet: bool) -> None:
    """Train RUN_DIR's configuration again with other seeds (the spread between seeds), with
    the fields --set changes; run the same command again to resume."""
    values = _integers("--seeds", seeds)
    out = out or f"{str(run_dir).rstrip('/')}-seeds"
    diverged = None
    try:
        results = reseed(run_dir, values, out, progress=not quiet, data_dir=data_dir,
                         changes=_field_values(changes), stop_by=stop_by,
                         log=lambda line: click.echo(f"linmem: {line}", err=True))
    except SeedsDiverged as err:
        results, diverged = err.finished, err
    except TrainingDiverged as err:
        click.echo(f"linmem: training diverged: {err}", err=True)
        sys.exit(1)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    for seed, m in results.items():
        click.echo(f"seed {seed}: valid acc {m['valid_acc']:.2f}%  test acc {m['test_acc']:.2f}%"
                   f"  test nll {m['test_nll']:.3f} -> {Path(out) / f's{seed}'}")
    if diverged is not None:
        click.echo(f"linmem: training diverged: {diverged}", err=True)
        sys.exit(1)


@cli.command("evaluate")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--split", type=click.Choice(["train", "valid", "test", "all"]), default="all",
              show_default=True)
@click.option("--which", type=click.Choice(["best", "last"]), default="best", show_default=True)
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--device", default="cpu", show_default=True)
@click.option("--expected", type=int, default=None, callback=_positive,
              help="Also the expected accuracy (Boulanger-Lewandowski et al. 2012) over N frames "
                   "drawn per step from the model, with its standard error.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of --expected.")
@click.option("--thresholds", callback=_thresholds, default=None,
              help="Also the global accuracy at each decision threshold (0.3,0.5,0.7 or "
                   "0.05:0.95:0.05) and, with the valid split, the one chosen there and every "
                   "split's accuracy at it.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON to this file (atomically; RUN_DIR/expected.json is "
                   "what `linmem report` reads the expected accuracy from).")
def evaluate_cmd(run_dir: str, split: str, which: str, data_dir: str | None, device: str,
                 expected: int | None, seed: int, thresholds: tuple[float, ...],
                 out: str | None) -> None:
    """Re-score the checkpoint of RUN_DIR; prints JSON (accuracies in percent) with the command,
    commit, seed, data checksum, wall and CPU time."""
    started, cpu_started = time.perf_counter(), time.process_time()
    try:
        model, config = load_run_model(run_dir, which, device)
        data = load_polyphonic(config.data, root=data_dir or config.data_dir)
        checksum = data_checksum(config.data, data_dir or config.data_dir)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    splits = ["train", "valid", "test"] if split == "all" else [split]
    result = {"run_dir": str(run_dir), "checkpoint": which, "dataset": config.data,
              "model": config.model}
    for name in splits:
        scores = evaluate(model, data[name], config.eval_batch_size, device,
                          thresholds=thresholds)
        result[name] = {"acc": 100 * scores["acc"], "acc_frame": 100 * scores["acc_frame"],
                        "nll": scores["nll"], "frames": scores["frames"]}
        if thresholds:
            result[name]["acc_at"] = {str(t): 100 * a for t, a in scores["acc_at"].items()}
        if expected is not None:
            acc, se = expected_accuracy(model, data[name], expected, seed, device=device)
            result[name].update(acc_expected=100 * acc, acc_expected_se=100 * se,
                                expected_samples=expected, expected_seed=seed)
    if thresholds and "valid" in splits:  # the grid's first best on validation, as train does
        chosen = max(result["valid"]["acc_at"], key=result["valid"]["acc_at"].get)
        result["valid_threshold"] = float(chosen)
        for name in splits:
            result[name]["acc_at_valid_threshold"] = result[name]["acc_at"][chosen]
    result.update(provenance(command_line(), git_commit(), seed if expected else None, checksum,
                             time.perf_counter() - started, device))
    result["cpu_time_s"] = time.process_time() - cpu_started
    if out is not None:
        write_json(out, result)
    click.echo(json.dumps(result, indent=2))


class _DataGroup(click.Group):
    """``linmem data NAME`` describes a data set (the ``describe`` command, the default);
    ``linmem data import-midi FOLDER`` makes one."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] not in self.commands and args[0] not in ("-h", "--help"):
            args = ["describe", *args]
        return super().resolve_command(ctx, args)


@cli.group("data", cls=_DataGroup, context_settings={"ignore_unknown_options": True},
           invoke_without_command=True)
@click.pass_context
def data_group(ctx: click.Context) -> None:
    """Describe a data set (`linmem data NAME`) or make one from MIDI files (`import-midi`)."""
    if ctx.invoked_subcommand is None:
        click.echo(ctx.get_help())


@data_group.command("describe")
@click.argument("name")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--no-download", is_flag=True, help="Fail instead of downloading.")
def data_cmd(name: str, data_dir: str | None, no_download: bool) -> None:
    """Load, verify and describe data set NAME (downloading it if needed)."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageFailure(f"--data-dir {data_dir}: no such directory")
    try:
        data = load_polyphonic(name, root=data_dir, download=not no_download)
        checksum = data_checksum(name, data_dir)
    except (DataError, ValueError) as err:
        raise UsageFailure(str(err)) from None
    info = {split: {"sequences": len(seqs), "frames": int(sum(len(s) for s in seqs)),
                    "max_length": int(max(len(s) for s in seqs)),
                    "notes_per_frame": float(sum(int(s.sum()) for s in seqs)
                                             / max(1, sum(len(s) for s in seqs)))}
            for split, seqs in data.items()}
    click.echo(json.dumps({"name": name, "file_sha256": checksum,
                           "content_digest": content_digest(data), **info}, indent=2))


@data_group.command("import-midi")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--out", type=click.Path(dir_okay=False), required=True,
              help="The data set file to write (NAME.pickle).")
@click.option("--step-seconds", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_STEP_SECONDS, show_default=True, help="Seconds per frame.")
@click.option("--split", default="0.8,0.1,0.1", show_default=True,
              help="Fractions of train, valid and test.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the split.")
@click.option("--force", is_flag=True, help="Overwrite OUT if it exists.")
def import_midi_cmd(folder: str, out: str, step_seconds: float, split: str, seed: int,
                    force: bool) -> None:
    """Make a data set of the MIDI files under FOLDER: OUT, for `linmem train --data OUT`."""
    if not out.endswith(".pickle"):
        raise UsageFailure(f"--out {out}: the file must end in .pickle")
    try:
        fractions = tuple(float(v) for v in split.split(","))
    except ValueError:
        raise UsageFailure(f"--split {split!r}: expected three fractions such as 0.8,0.1,0.1"
                           ) from None
    try:
        result = import_midi_folder(folder, out, step_seconds, fractions, seed, force)
    except (DataError, ValueError, FileExistsError) as err:
        raise UsageFailure(f"--split: {err}" if str(err).startswith("split") else str(err)
                           ) from None
    for path, why in result["skipped"].items():
        click.echo(f"linmem: skipped {path}: {why}", err=True)
    for path, n in result["notes_outside"].items():
        click.echo(f"linmem: {path}: {n} notes outside the piano's A0-C8 left out", err=True)
    seqs = result["sequences"]
    click.echo(f"{out}: {seqs['train']} train, {seqs['valid']} valid, {seqs['test']} test "
               f"sequences from {result['files']} MIDI files ({len(result['skipped'])} "
               "skipped)")


@cli.command("generate")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--prime", required=True,
              help="DATA:SPLIT:INDEX (jsb:test:3; SPLIT:INDEX for the run's data set) or a "
                   ".mid file: the music to continue.")
@click.option("--prime-steps", type=int, default=None, callback=_positive,
              help="Use the prime's first N frames [default: all].")
@click.option("--steps", type=int, default=64, show_default=True, callback=_positive,
              help="Frames to generate.")
@click.option("--temperature", type=click.FloatRange(min=0, min_open=True), default=1.0,
              show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="The MIDI file.")
@click.option("--png", type=click.Path(dir_okay=False), default=None,
              help="Also draw the prime and the continuation as a piano roll.")
@click.option("--wav", type=click.Path(dir_okay=False), default=None,
              help="Also render audio (pretty_midi's sine synthesizer).")
@click.option("--without-prime", is_flag=True,
              help="The MIDI and audio hold the generated frames only (the PNG shows both).")
@click.option("--step-seconds", type=click.FloatRange(min=0, min_open=True), default=None,
              help="Seconds per frame of the MIDI written and of a .mid prime [default: the "
                   "run's data set's; a data set of your own: the step it was imported at].")
@click.option("--force", is_flag=True, help="Overwrite OUT, OUT.json, --png and --wav if they "
                                             "exist.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
def generate_cmd(run_dir: str, prime: str, prime_steps: int | None, steps: int,
                 temperature: float, seed: int, out: str, png: str | None, wav: str | None,
                 without_prime: bool, step_seconds: float | None, data_dir: str | None,
                 force: bool) -> None:
    """Continue a prime with the best checkpoint of RUN_DIR: OUT (MIDI) and OUT.json."""
    if png is not None:
        _needs_matplotlib("--png")
    try:
        record = continue_run(run_dir, prime, out, steps, prime_steps, temperature, seed, png,
                              wav, data_dir, with_prime=not without_prime, seconds=step_seconds,
                              force=force)
    except (DataError, ValueError, FileNotFoundError, FileExistsError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(f"{record['model']}: {record['prime_frames']} prime frames + {steps} generated "
               f"({record['notes_per_frame']:.1f} notes per frame) -> "
               + ", ".join(str(p) for p in (out, png, wav) if p))


@cli.command("plot")
@click.argument("run_dir", type=click.Path(file_okay=False))
@click.option("--prediction", default=None,
              help="SPLIT:INDEX (test:0): draw the truth and the model's key probabilities for "
                   "that sequence instead of the training curves.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="The PNG [default: RUN_DIR/curves.png, or RUN_DIR/prediction-SPLIT-INDEX.png].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
def plot_cmd(run_dir: str, prediction: str | None, out: str | None, data_dir: str | None
             ) -> None:
    """Draw a run: its training curves, or its predictions for one sequence."""
    _needs_matplotlib("plot")
    try:
        if prediction is None:
            out = out or str(Path(run_dir) / "curves.png")
            plot_run(run_dir, out)
        else:
            out = out or str(Path(run_dir) / f"prediction-{prediction.replace(':', '-')}.png")
            predict_sequence(run_dir, prediction, out, data_dir)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(f"-> {out}")


@cli.command("baseline")
@click.option("--data", "datasets", multiple=True, default=list(DATASETS), show_default=True,
              help="Data set (repeat for several).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--out", type=click.Path(dir_okay=False), default="results/baseline.json",
              show_default=True)
def baseline_cmd(datasets: tuple[str, ...], data_dir: str | None, out: str) -> None:
    """The previous-frame baseline (frame t + 1 = frame t) on every split: OUT (JSON)."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageFailure(f"--data-dir {data_dir}: no such directory")
    try:
        result = previous_frame_report([resolve_name(d) for d in datasets], data_dir)
    except (DataError, ValueError) as err:
        raise UsageFailure(str(err)) from None
    write_json(out, result)
    for name, splits in result["scores"].items():
        click.echo(f"{name}: test acc {splits['test']['acc']:.2f}% (per-frame mean "
                   f"{splits['test']['acc_frame']:.2f}%), valid acc {splits['valid']['acc']:.2f}%")
    click.echo(f"-> {out}")


@cli.command("memory")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
def memory_cmd(paths: tuple[str, ...]) -> None:
    """Markdown table of the runs under PATHS (those that diverged with no score too) with the
    spectral radius of their linear memory (W^mm, eq. 7) at the start (a pretrained run's
    initial weights), the selected and the last epoch, the gain of its loop through the
    functional units, and how they stopped."""
    try:
        click.echo(memory_markdown(collect_metrics(paths, diverged=True), command_line(),
                                   git_commit()), nl=False)
    except (FileNotFoundError, ValueError) as err:  # a damaged run file, named
        raise UsageFailure(str(err)) from None


@cli.command("patience")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--values", default="10,20,30,40", show_default=True,
              help="Comma-separated patiences to replay (shorter than the runs' own).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Also write the table to this file (atomically).")
def patience_cmd(paths: tuple[str, ...], values: str, out: str | None) -> None:
    """What a shorter early-stopping patience would have changed in the finished runs under
    PATHS, from their logs: selected epochs, validation accuracy lost, CPU time saved."""
    patiences = _integers("--values", values)
    if not patiences or min(patiences) < 1:
        raise UsageFailure(f"--values must be positive integers, got {values!r}")
    try:
        text = patience_markdown(patience_records(collect_metrics(paths), patiences),
                                 command_line(), git_commit())
    except (FileNotFoundError, ValueError) as err:  # a damaged run file, named
        raise UsageFailure(str(err)) from None
    click.echo(text, nl=False)
    if out is not None:
        with atomic_write(out, "w") as f:
            f.write(text)


@cli.command("summarize")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--seeds", is_flag=True,
              help="Then the runs that differ only in their seed, grouped: mean ± sd, and the "
                   "paper's two claims where both sides are there (as table2.md's seeds).")
def summarize_cmd(paths: tuple[str, ...], seeds: bool) -> None:
    """Markdown table of the runs (metrics.json files) under PATHS, with their commands."""
    try:
        records = collect_metrics(paths, diverged=seeds)  # a seed that diverged counts as run
        scored = [r for r in records if "diverged" not in r]
        if not scored:
            raise FileNotFoundError("no metrics.json under " + ", ".join(map(str, paths)))
        click.echo(markdown_table(scored), nl=False)
        if seeds:
            click.echo("\n" + seeds_markdown(seed_groups(records)))
    except (FileNotFoundError, ValueError) as err:
        raise UsageFailure(str(err)) from None


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the command group, turning every usage error into one line, exit 2."""
    try:
        cli.main(args=argv, prog_name="linmem", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except click.Abort:
        click.echo("linmem: aborted", err=True)
        sys.exit(130)
    except click.ClickException as err:  # one line, whatever the message held
        message = " ".join(line.strip() for line in err.format_message().splitlines())
        click.echo(f"linmem: error: {message}", err=True)
        sys.exit(2 if isinstance(err, click.UsageError | UsageFailure) else err.exit_code)
    except RunDirBusy as err:  # another process: the environment, not the command line
        click.echo(f"linmem: error: {err}", err=True)
        sys.exit(1)
    except OSError as err:  # a fault of the machine (no space, read-only, permissions)
        click.echo(f"linmem: error: {os_error_text(err)}", err=True)
        sys.exit(1)


# what to do about a fault of the machine, by errno
_OS_ADVICE = {
    errno.ENOSPC: "free some space on that disk, or write elsewhere; --resume continues a run "
                  "from its last finished epoch",
    errno.EDQUOT: "free some of your disk quota, or write elsewhere",
    errno.EROFS: "that file system is read-only: choose a folder you can write",
    errno.EACCES: "you may not write there: choose a folder you can write, or change its "
                  "permissions",
    errno.EPERM: "you may not write there: choose a folder you can write",
}


def os_error_text(err: OSError) -> str:
    """One line for an ``OSError``: what failed, on which file, and what to do."""
    what = err.strerror or str(err) or type(err).__name__
    where = f": {err.filename}" if err.filename else ""
    advice = _OS_ADVICE.get(err.errno)
    return f"{what}{where}" + (f" ({advice})" if advice else "")

