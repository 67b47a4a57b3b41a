"""The ``linmem`` command: thin wrappers over the library.

Usage errors (unknown data set or model, bad sizes, missing data) print one line
``linmem: error: ...`` and exit with code 2; a diverged run exits with 1, an interrupted one 130.
"""

from __future__ import annotations

import errno
import json
import signal
import sys
import threading
from pathlib import Path

import click
from click.core import ParameterSource

from linmem._extras import EXTRAS, extra_message
from linmem._io import (
    check_outputs,
    write_json,
)
from linmem._threads import training_threads
from linmem.cli.common import (
    TRAIN_FIELDS,
    Terminated,
    UsageFailure,
    _needs_extra,
    _positive,
    _thresholds,
    _train_options,
    config_error,
    config_options,
    stopped,
)
from linmem.cli.experiments import COMMANDS
from linmem.data import (
    DEFAULT_STEP_SECONDS,
    DataError,
    content_digest,
    data_checksum,
    is_data_file,
    load_polyphonic,
)
from linmem.experiments.plots import plot_run
from linmem.experiments.rescore import SPLITS, score_run
from linmem.generate import continue_run, predict_sequence
from linmem.registry import get_spec
from linmem.training.config import TrainConfig
from linmem.training.recipes import pretrained_models
from linmem.training.recipes import train as run_training
from linmem.training.runs import CONFIG, METRICS, CheckpointError, RunDirBusy, has
from linmem.training.trainer import TrainingDiverged

__all__ = ["cli", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]},
             invoke_without_command=True)
@click.version_option(package_name="linear-memory-networks")
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Linear Memory Networks: train and evaluate models on the polyphonic music data sets."""
    if ctx.invoked_subcommand is None:  # plain `linmem`: the usage, not an error
        click.echo(ctx.get_help())


for _command in COMMANDS:  # the experiments' commands (linmem.cli.experiments)
    cli.add_command(_command)


@cli.command("train")
@config_options(*TRAIN_FIELDS)
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
        if resume and has(out, CONFIG):  # the saved run, and what was given
            config = TrainConfig.from_run(out, **{
                k: v for k, v in _train_options(options).items()
                if ctx.get_parameter_source(k) != ParameterSource.DEFAULT})
        else:
            config = TrainConfig.from_dict(_train_options(options))
    except ValueError as err:
        raise config_error(err) from None
    if config.data_dir is not None and not Path(config.data_dir).is_dir():
        raise UsageFailure(f"--data-dir {config.data_dir}: no such directory")
    if resume and not (Path(out).is_dir() and any(Path(out).iterdir())):  # never silently
        click.echo(f"linmem: {out} holds no run to resume: starting it", err=True)
    try:
        with training_threads(config.batch_size):  # batch 1: one thread, unless the user chose
            metrics = run_training(config, out, resume=resume, progress=not quiet)
    except TrainingDiverged as err:
        click.echo(f"linmem: training diverged: {err}", err=True)
        sys.exit(1)
    except KeyboardInterrupt as err:
        stopped(err, f"continue with: linmem train --resume --out {out}")
    except (DataError, ValueError, FileExistsError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(
        f"{config.model} on {config.data} ({config.protocol} protocol): valid acc "
        f"{_both(metrics, 'valid')}  test acc {_both(metrics, 'test')}  "
        f"test nll {metrics['test_nll']:.3f}  "
        f"({metrics['n_params']} params, {metrics['epochs']} epochs, best {metrics['best_epoch']},"
        f" {metrics['wall_time_s']:.0f}s) -> {Path(out) / METRICS}")


def _both(metrics: dict, split: str) -> str:
    """A split's frame accuracy, global (Bay et al.) and per-frame mean (the paper's)."""
    frame = metrics.get(f"{split}_acc_frame")
    return f"{metrics[f'{split}_acc']:.2f}%" + ("" if frame is None else
                                                  f" (per-frame {frame:.2f}%)")


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
    commit, the run's training seed, data checksum, wall and CPU time (--expected's own seed
    as sampling_seed)."""
    try:
        result = score_run(run_dir, SPLITS if split == "all" else [split], which, data_dir,
                           device, expected, seed, thresholds)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
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
    _needs_extra("pretty_midi", "linmem data import-midi")
    from linmem.midi import import_midi_folder

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
@click.option("--force", is_flag=True, help="Overwrite OUT, its record (OUT with the suffix "
                                             ".json), --png and --wav if they exist.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
def generate_cmd(run_dir: str, prime: str, prime_steps: int | None, steps: int,
                 temperature: float, seed: int, out: str, png: str | None, wav: str | None,
                 without_prime: bool, step_seconds: float | None, data_dir: str | None,
                 force: bool) -> None:
    """Continue a prime with the best checkpoint of RUN_DIR: OUT (MIDI) and its record beside
    it (OUT with the suffix .json: --out a.mid writes a.json)."""
    _needs_extra("pretty_midi", "linmem generate")
    if png is not None:
        _needs_extra("matplotlib", "--png")
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
@click.option("--prediction", default=None, metavar="[DATA:]SPLIT:INDEX|FILE.mid",
              help="SPLIT:INDEX (test:0) of the run's data set, DATA:SPLIT:INDEX of another "
                   "(jsb:test:0), or a .mid file: draw the truth and the model's key "
                   "probabilities for that sequence instead of the training curves.")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="The PNG [default: RUN_DIR/curves.png, or RUN_DIR/prediction-SPLIT-INDEX.png, "
                   "drawn again each time].")
@click.option("--force", is_flag=True, help="Overwrite --out if it exists.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
def plot_cmd(run_dir: str, prediction: str | None, out: str | None, force: bool,
             data_dir: str | None) -> None:
    """Draw a run: its training curves, or its predictions for one sequence."""
    _needs_extra("matplotlib", "linmem plot")
    try:
        if out is not None:  # a file of the user's own is never overwritten silently
            check_outputs({"--out": out}, force)
        if prediction is None:
            out = out or str(Path(run_dir) / "curves.png")
            plot_run(run_dir, out)
        else:
            out = out or str(Path(run_dir) / f"prediction-{prediction.replace(':', '-')}.png")
            predict_sequence(run_dir, prediction, out, data_dir)
    except (DataError, ValueError, FileNotFoundError, FileExistsError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(f"-> {out}")










def _on_sigterm(signum, frame) -> None:
    raise Terminated()


def main(argv: list[str] | None = None) -> None:
    """Entry point: runs the command group, turning every usage error into one line, exit 2;
    a SIGTERM stops a command as a Ctrl-C does, with its own line and exit status 143."""
    handle = (threading.current_thread() is threading.main_thread()
              and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    if handle:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        _main(argv)
    finally:
        if handle:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _main(argv: list[str] | None) -> None:
    try:
        cli.main(args=argv, prog_name="linmem", standalone_mode=False)
    except click.exceptions.Exit as exit_:
        sys.exit(exit_.exit_code)
    except click.Abort as err:  # click's for a Ctrl-C (or SIGTERM) no command caught
        stopped(err.__context__)
    except click.ClickException as err:  # one line, whatever the message held
        message = " ".join(line.strip() for line in err.format_message().splitlines())
        click.echo(f"linmem: error: {message}", err=True)
        # a damaged checkpoint, or one that does not fit its run's config, is a fault of the
        # files (exit 1, as a full disk), not of the command line, wherever it was caught
        if isinstance(err.__context__, CheckpointError):
            sys.exit(1)
        sys.exit(2 if isinstance(err, click.UsageError | UsageFailure) else err.exit_code)
    except RunDirBusy as err:  # another process: the environment, not the command line
        click.echo(f"linmem: error: {err}", err=True)
        sys.exit(1)
    except ModuleNotFoundError as err:  # a feature whose extra is not installed: which to install
        top = (err.name or "").split(".")[0]  # a MissingExtra's too: it names an EXTRAS module
        if top not in EXTRAS:
            raise
        command = " ".join(["linmem", *(argv if argv is not None else sys.argv[1:])[:1]])
        click.echo(f"linmem: error: {extra_message(top, command)}", err=True)
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
    removed = getattr(err, "run_removed", None)  # a run that had kept nothing, removed
    if removed is not None and advice is not None:
        advice = (advice.split(";")[0] + f"; {removed} had finished no epoch and was removed: "
                  "start the run again")
    return f"{what}{where}" + (f" ({advice})" if advice else "")

