"""The ``linmem`` commands of the experiments: seeds, diagnostics of runs and the paper's
analyses, and the searches' (:mod:`linmem.cli.searches`), listed in :data:`COMMANDS`, which
:mod:`linmem.cli.commands` adds to the command group. Each parses its options, makes one
library call and prints."""

from __future__ import annotations

import contextlib
import json
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from linmem._io import (
    atomic_write,
    command_line,
    git_commit,
    provenance,
    write_json,
)
from linmem._threads import training_threads
from linmem.cli.common import (
    _DEFAULT,
    UsageFailure,
    _clips,
    _integers,
    _needs_extra,
    _opened_storage,
    _positive,
    _runs_root_option,
    _stop_by,
    _storage_option,
)
from linmem.cli.searches import (
    progress_cmd,
    report_cmd,
    search_cmd,
    search_export_cmd,
    search_import_cmd,
)
from linmem.data import (
    DATASETS,
    DataError,
    resolve_name,
)
from linmem.experiments.ablation import write_ablation
from linmem.experiments.analyses import (
    STARTS,
    epoch_replay,
    epoch_replay_markdown,
    first_updates,
    first_updates_markdown,
    memory_markdown,
    patience_markdown,
    patience_records,
    previous_frame_report,
)
from linmem.experiments.beyond import beyond_markdown, beyond_rows
from linmem.experiments.bound_choice import bound_choice, bound_choice_markdown
from linmem.experiments.bound_comparison import bound_comparison_markdown
from linmem.experiments.loop_choice import loop_choice, loop_choice_markdown
from linmem.experiments.plots import plot_pretraining
from linmem.experiments.pretraining import analyze_pretraining
from linmem.experiments.publish import publish
from linmem.experiments.report import markdown_table
from linmem.experiments.seed_groups import seed_groups, seeds_markdown, valid_seeds_markdown
from linmem.experiments.seeds import SeedsDiverged, published_seed_name, reseed
from linmem.training.config import DEFAULT_PROTOCOL, PROTOCOLS, TrainConfig
from linmem.training.runs import CONFIG, collect_metrics, ended
from linmem.training.trainer import TrainingDiverged

__all__ = ["COMMANDS"]


@click.command("analyze-pretraining")
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
@click.option("--protocol", type=click.Choice(list(PROTOCOLS)), default=DEFAULT_PROTOCOL,
              show_default=True, help="The training protocol of the ULM trained here "
                                      "(results/pretraining: linmem's).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--out", type=click.Path(file_okay=False), default="results/pretraining",
              show_default=True)
@click.option("--quiet", is_flag=True)
def analyze_pretraining_cmd(data: str, hidden: int, k: int, memories: str, first_memory: int,
                            ulm_run: str | None, epochs: int, patience: int, seed: int,
                            protocol: str, data_dir: str | None, out: str, quiet: bool) -> None:
    """The paper's pretraining analysis (Figure 5): OUT/analysis.json and OUT/figure5.png."""
    _needs_extra("matplotlib", "linmem analyze-pretraining (figure5.png)")
    try:
        result = analyze_pretraining(
            data=data, hidden=hidden, k=k, memories=[int(v) for v in memories.split(",")],
            first_memory=first_memory, ulm_run=ulm_run, epochs=epochs, patience=patience,
            seed=seed, data_dir=data_dir, progress=not quiet, protocol=protocol)
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    write_json(Path(out) / "analysis.json", result)
    plot_pretraining(result, Path(out) / "figure5.png")
    click.echo(f"ULM valid acc {result['ulm_valid_acc']:.2f}%; pretrained LMN valid acc "
               + ", ".join(f"{r['components']}: {r['lmn_valid_acc']:.2f}%"
                           for r in result["memories"])
               + f" -> {Path(out) / 'analysis.json'}, {Path(out) / 'figure5.png'}")


@click.command("first-updates")
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
    _emit(results, first_updates_markdown(results, command), out, "first-updates")


def _emit(results: list[dict], text: str, out: str | None, name: str) -> None:
    """Print a diagnostic's table ``text``; with ``out``, also write OUT/NAME.json (the
    ``results``) and OUT/NAME.md (the table)."""
    if out is not None:
        write_json(Path(out) / f"{name}.json", results)
        with atomic_write(Path(out) / f"{name}.md", "w") as f:
            f.write(text)
    click.echo(text, nl=False)


@click.command("replay-epoch")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(file_okay=False))
@click.option("--clip", "clips", multiple=True, callback=_clips, metavar="FLOAT|none",
              help="A gradient-norm clip to replay with (repeatable; 'none': no clipping) "
                   "[default: each run's own].")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--device", default="cpu", show_default=True)
@click.option("--skip-update", "skip", multiple=True, type=click.IntRange(min=1), metavar="N",
              help="Leave out the epoch's update N, its batch unseen (repeatable): whether one "
                   "outlying update set off what followed.")
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Also write OUT/replay-epoch.json (every update) and OUT/replay-epoch.md.")
def replay_epoch_cmd(run_dirs: tuple[str, ...], clips: tuple[float | None, ...],
                     data_dir: str | None, device: str, skip: tuple[int, ...],
                     out: str | None) -> None:
    """Where a run diverged or collapsed: replays the epoch after each run's last checkpoint
    (for a diverged run, the epoch it stopped in) update by update, and prints how it ended,
    the largest gradient norms before clipping and, for a tanh LMN, its saturated units and
    loop gain at the end, once per --clip."""
    command = command_line()
    try:
        results = [epoch_replay(run, clips, data_dir=data_dir, device=device, command=command,
                                skip=skip) for run in run_dirs]
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    _emit(results, epoch_replay_markdown(results, command), out, "replay-epoch")


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


@click.command("reseed")
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
    set_fields = _field_values(changes)
    batch = set_fields.get("batch_size")
    if batch is None and (Path(run_dir) / CONFIG).is_file():
        with contextlib.suppress(ValueError, OSError):  # reseed says what is wrong with it
            batch = TrainConfig.from_run(run_dir).batch_size
    diverged = None
    try:
        with training_threads(batch):  # batch 1: one thread, unless the user chose
            results = reseed(run_dir, values, out, progress=not quiet, data_dir=data_dir,
                             changes=set_fields, stop_by=stop_by,
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


@click.command("baseline")
@click.option("--data", "datasets", multiple=True, default=list(DATASETS), show_default=True,
              help="Data set (repeat for several).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None)
@click.option("--out", type=click.Path(dir_okay=False), default="results/baseline.json",
              show_default=True)
def baseline_cmd(datasets: tuple[str, ...], data_dir: str | None, out: str) -> None:
    """The calibration rows on the validation and test splits: the previous frame (frame t + 1 =
    frame t: accuracy) and the per-key model of the previous frame fitted on the training split
    (NLL and accuracy): OUT (JSON)."""
    if data_dir is not None and not Path(data_dir).is_dir():
        raise UsageFailure(f"--data-dir {data_dir}: no such directory")
    try:
        result = previous_frame_report([resolve_name(d) for d in datasets], data_dir)
    except (DataError, ValueError) as err:
        raise UsageFailure(str(err)) from None
    write_json(out, result)
    for name, splits in result["scores"].items():
        fitted = result["per_key_model"]["scores"][name]["test"]
        click.echo(f"{name}: test acc {splits['test']['acc']:.2f}% (per-frame mean "
                   f"{splits['test']['acc_frame']:.2f}%), valid acc {splits['valid']['acc']:.2f}%;"
                   f" the per-key model of the previous frame: test NLL {fitted['nll']:.3f}")
    click.echo(f"-> {out}")


@click.command("memory")
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


@click.command("patience")
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


@click.command("summarize")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--seeds", is_flag=True,
              help="Then the runs that differ only in their seed, grouped: mean ± sd, and the "
                   "paper's two claims where both sides are there (as table2.md's seeds).")
@click.option("--valid", is_flag=True,
              help="Then the same groups' validation accuracies (what a choice between them is "
                   "made on).")
@click.option("--bound-choice", "choose_bound", is_flag=True,
              help="Then the groups with and without a memory bound side by side on test "
                   "(linmem.experiments.bound_comparison), and the rule that chooses the LMN's "
                   "default bound from them on validation (linmem.experiments.bound_choice).")
@click.option("--loop-choice", "choose_loop", is_flag=True,
              help="Then the rule that chooses pret-LMN-B's default activation and bound from "
                   "the loop bound's candidates on validation (linmem.experiments.loop_choice).")
def summarize_cmd(paths: tuple[str, ...], seeds: bool, valid: bool, choose_bound: bool,
                  choose_loop: bool) -> None:
    """Markdown table of the runs (metrics.json files) under PATHS, with their commands."""
    grouped = seeds or valid or choose_bound or choose_loop
    try:
        # a failed seed counts, in the groups
        records = collect_metrics(paths, diverged=grouped)
        scored = [r for r in records if "diverged" not in r]
        if not scored:
            raise FileNotFoundError("no metrics.json under " + ", ".join(map(str, paths)))
        click.echo(markdown_table(scored), nl=False)
        groups = seed_groups(records) if grouped else []
        if seeds:
            click.echo("\n" + seeds_markdown(groups))
        if valid:
            click.echo("\n" + valid_seeds_markdown(groups))
        if choose_bound:  # the test side by side, then the choice on validation
            click.echo("\n" + bound_comparison_markdown(groups))
            click.echo("\n" + bound_choice_markdown(bound_choice(groups)))
        if choose_loop:
            click.echo("\n" + loop_choice_markdown(loop_choice(groups)))
        # the command that made the file the output is written to (each run's is in its row)
        flags = [f for f, on in (("--seeds", seeds), ("--valid", valid),
                                 ("--bound-choice", choose_bound), ("--loop-choice", choose_loop))
                 if on]
        click.echo(f"\nMade by `{shlex.join(['linmem', 'summarize', *flags, *paths])}`.")
    except (FileNotFoundError, ValueError) as err:
        raise UsageFailure(str(err)) from None


@click.command("publish")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--to", "dest", required=True, type=click.Path(file_okay=False),
              help="The folder of results/ that receives them, one folder per run.")
@click.option("--name", "naming", type=click.Choice(["run", "seed"]), default="run",
              show_default=True,
              help="Each run's folder: the run's own name, or for a seed (`linmem reseed`'s "
                   "OUT/sK) its parent's and its own, OUT-sK.")
@click.option("--checkpoint", is_flag=True, help="Also the selected checkpoint (best.pt).")
def publish_cmd(run_dirs: tuple[str, ...], dest: str, naming: str, checkpoint: bool) -> None:
    """Copy the records of the ended runs RUN_DIRS (config, log, metrics or divergence,
    pretraining, expected accuracy; a pret-LMN run's unrolled network's) into --to, what
    results/ keeps of a run; runs that have not ended are named and left out."""
    for run in map(Path, run_dirs):
        name = published_seed_name(run) if naming == "seed" else run.name
        if not ended(run):
            click.echo(f"{run}: not ended, left out", err=True)
            continue
        written = publish(run, Path(dest) / name, checkpoint)
        click.echo(f"{run} -> {Path(dest) / name} ({len(written)} files)")


@click.command("ablation")
@click.option("--base", "base_runs", multiple=True, type=click.Path(exists=True),
              help="The seeds of the selected configurations as their protocol trains them "
                   "(run directories or folders of them).")
@click.option("--runs", "variant_runs", multiple=True, type=click.Path(exists=True),
              help="Their seeds with one protocol field changed (`linmem reseed RUN --set "
                   "FIELD=VALUE`), each set against its base.")
@_storage_option
@click.option("--study", "studies", multiple=True,
              help="A search study whose finished runs are replayed through the median pruner "
                   "(its name, as `linmem progress` lists it).")
@_runs_root_option
@click.option("--warmup", type=int, default=50, show_default=True, callback=_positive,
              help="The pruner's warm-up epochs (linmem search's).")
@click.option("--out", type=click.Path(file_okay=False), required=True,
              help="The folder that receives ablation.md and ablation.json.")
def ablation_cmd(base_runs: tuple[str, ...], variant_runs: tuple[str, ...], storage: str | None,
                 studies: tuple[str, ...], runs_root: str, warmup: int, out: str) -> None:
    """One factor of a training protocol at a time: seeds trained with one field changed
    against the selected configuration's own, and the median pruner replayed on a grid."""
    if studies and storage is not None:
        storage = _opened_storage(storage)
    try:
        path = write_ablation(out, base_runs, variant_runs, storage, studies, runs_root, warmup)
    except (ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    click.echo(path.read_text(), nl=False)
    click.echo(f"-> {path}, {path.with_suffix('.json')}")


def _json_file(path: str, option: str) -> Any:
    """The JSON in ``path``, or a ``ValueError`` naming the option and the file."""
    try:
        return json.loads(Path(path).read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"{option} {path}: not a JSON file ({err})") from None


@click.command("beyond")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--baseline", type=click.Path(dir_okay=False, exists=True),
              default="results/baseline.json", show_default=True,
              help="The calibration rows (linmem baseline's JSON).")
@click.option("--paper-seeds", type=click.Path(dir_okay=False, exists=True), default=None,
              help="The paper protocol's seed groups (results/paper-protocol/seeds.json): its "
                   "row of each model set beside the campaign's.")
@click.option("--out", type=click.Path(file_okay=False), default="results", show_default=True,
              help="Folder of beyond.md and beyond.json.")
def beyond_cmd(paths: tuple[str, ...], baseline: str, paper_seeds: str | None, out: str) -> None:
    """The campaign beyond the paper (results/beyond): the seeds under PATHS grouped into rows, each
    with its test scores over seeds and CPU hours, beside the paper's best, the published NLLs,
    the paper-protocol rows and the calibration rows: OUT/beyond.md and OUT/beyond.json."""
    started = time.perf_counter()
    try:
        records = collect_metrics(paths, diverged=True)
        if not any("diverged" not in r for r in records):
            raise FileNotFoundError("no metrics.json under " + ", ".join(map(str, paths)))
        rows = beyond_rows(records, seed_groups(records))
        calibration, paper = _json_file(baseline, "--baseline"), (
            _json_file(paper_seeds, "--paper-seeds") if paper_seeds else [])
    except (FileNotFoundError, ValueError) as err:
        raise UsageFailure(str(err)) from None
    command, commit = command_line(), git_commit()
    text = (beyond_markdown(rows, calibration, paper)
            + f"\nMade by `{command}` at {commit}.\n")
    folder = Path(out)
    with atomic_write(folder / "beyond.md", "w") as f:
        f.write(text)
    checksums = sorted({r.get("data_sha256") for r in records if r.get("data_sha256")})
    write_json(folder / "beyond.json", {
        "rows": rows, "calibration": {k: calibration[k] for k in ("scores", "per_key_model")
                                      if k in calibration},
        **provenance(command, commit, None, checksums, time.perf_counter() - started)})
    click.echo(text, nl=False)
    click.echo(f"-> {folder / 'beyond.md'}, {folder / 'beyond.json'}")


COMMANDS = (
    ablation_cmd,
    beyond_cmd,
    analyze_pretraining_cmd,
    first_updates_cmd,
    replay_epoch_cmd,
    search_cmd,
    report_cmd,
    progress_cmd,
    search_export_cmd,
    search_import_cmd,
    reseed_cmd,
    baseline_cmd,
    memory_cmd,
    patience_cmd,
    summarize_cmd,
    publish_cmd,
)
