"""The ``linmem`` commands of the experiments: searches and their reports, seeds, diagnostics of
runs and the paper's analyses (:mod:`linmem.cli.commands` adds them to the command group). Each
parses its options, makes one library call and prints."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click

from linmem._io import (
    atomic_write,
    command_line,
    git_commit,
    write_json,
)
from linmem.cli.common import (
    _DEFAULT,
    SEARCH_FIELDS,
    UsageFailure,
    _clips,
    _integers,
    _ModelChoice,
    _needs_matplotlib,
    _opened_storage,
    _positive,
    _protocol_option,
    _protocol_values,
    _runs_root_option,
    _stop_by,
    _storage_option,
    _train_options,
    config_error,
    config_options,
    stopped,
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
from linmem.experiments.plots import plot_pretraining
from linmem.experiments.pretraining import analyze_pretraining
from linmem.experiments.report import build_report, markdown_table, summary_file_records
from linmem.experiments.seed_groups import seed_groups, seeds_markdown, valid_seeds_markdown
from linmem.experiments.seeds import SeedsDiverged, published_seed_name, reseed
from linmem.training.config import DEFAULT_PROTOCOL, PROTOCOLS, TrainConfig
from linmem.training.runs import collect_metrics, ended, publish
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
    _needs_matplotlib("analyze-pretraining (figure5.png)")
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
@click.option("--out", type=click.Path(file_okay=False), default=None,
              help="Also write OUT/replay-epoch.json (every update) and OUT/replay-epoch.md.")
def replay_epoch_cmd(run_dirs: tuple[str, ...], clips: tuple[float | None, ...],
                     data_dir: str | None, device: str, out: str | None) -> None:
    """Where a run diverged: replays the epoch after each run's last checkpoint (for a diverged
    run, the epoch it stopped in) update by update, and prints how it ended and the largest
    gradient norms before clipping, once per --clip."""
    command = command_line()
    try:
        results = [epoch_replay(run, clips, data_dir=data_dir, device=device, command=command)
                   for run in run_dirs]
    except (DataError, ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    _emit(results, epoch_replay_markdown(results, command), out, "replay-epoch")


# None: linmem.experiments.search.MAX_RETRY (optuna: slow to import)
_max_retry_option = click.option(
    "--max-retry", type=click.IntRange(min=0), default=None,
    help="Deaths of a point's worker (a session's end kills it too) before the point is "
         "failed [default: 10].")


@click.command("search")
@click.option("--data", "datasets", multiple=True, default=["jsb"], show_default=True,
              help="Data set (repeat for several).")
@click.option("--model", "models", multiple=True, type=_ModelChoice(),
              default=["lmn-b"], show_default=True, help="Model (repeat for several).")
@click.option("--grid", default="paper", show_default=True,
              help="Named grid: paper, paper-small, reduced, nade, quick, tiny "
                   "(linmem.experiments.grids.GRIDS).")
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
                   "per parameter; a study with none starts at its smallest point) and exit "
                   "when none is left that fits; a point already running goes on. For a "
                   "machine or batch job with a time limit.")
@_max_retry_option
@click.option("--retry-failed", is_flag=True,
              help="Give each point that a trial's error failed (a run that diverged, a "
                   "pretraining that failed) one more trial: after mending what failed it.")
@config_options(*SEARCH_FIELDS)
@click.option("--quiet", is_flag=True)
def search_cmd(datasets: tuple[str, ...], models: tuple[str, ...], grid: str,
               storage: str | None, out: str, jobs: int, pruner: str | None, prune_warmup: int,
               subset: int | None, heartbeat: int, grace: int | None, poll: float, wait: bool,
               stop_by: float | None, max_retry: int | None, retry_failed: bool, quiet: bool,
               **train_options) -> None:
    """Grid search on validation (--select: accuracy or NLL), one Optuna study per (data set,
    model).

    Resumable: run the same command again (on any machine, with --storage) and it goes on where
    the studies stand; a trial whose worker died is retried from its run's last epoch.
    `linmem report` then selects on validation and writes the tables.
    """
    from linmem.experiments.grids import default_storage
    from linmem.experiments.search import (  # optuna: slow to import
        SearchConfig,
        check_search,
        run_search,
    )

    try:
        base = TrainConfig.from_dict(_train_options(train_options))
    except ValueError as err:
        raise config_error(err) from None
    try:
        config = SearchConfig(
            data=datasets, models=models, grid=grid, out_dir=out, storage=storage,
            base=base, pruner=pruner,
            prune_warmup=prune_warmup, subset=subset, heartbeat_interval=heartbeat,
            grace_period=grace, poll_s=poll, progress=not quiet, wait=wait, stop_by=stop_by,
            retry_failed=retry_failed,
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
    except KeyboardInterrupt as err:
        stopped(err, "run the same command again to continue")
    for name, c in counts.items():
        click.echo(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(c.items())))


def _summary_files(paths: tuple[str, ...]) -> list[list[dict]]:
    """The records of each earlier summary.json (``--summary``); a usage error for a bad one."""
    try:
        return [summary_file_records(path) for path in paths]
    except ValueError as err:
        raise UsageFailure(str(err)) from None


@click.command("report")
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
@click.option("--compare-seed-runs", "compare_seed_runs", multiple=True,
              type=click.Path(exists=True),
              help="The other protocol's seed runs: OUT/protocol-choice.md compares both "
                   "protocols' seeds on validation and applies the rule for linmem train's "
                   "default (linmem.experiments.protocol_choice).")
@click.option("--ablation", type=click.Path(exists=True, dir_okay=False), default=None,
              help="`linmem ablation`'s ablation.json: which parts of the paper's protocol "
                   "carry its result, in table2.md's section on both protocols (with --compare "
                   "and --compare-seed-runs).")
def report_cmd(storage: str | None, grid: str, runs_root: str, out: str,
               runs: tuple[str, ...], summaries: tuple[str, ...], seed_runs: tuple[str, ...],
               baseline: str | None, protocol: str, compare: str | None,
               compare_seed_runs: tuple[str, ...], ablation: str | None) -> None:
    """Select each (data set, model) on validation; write OUT/summary.json, OUT/table2.md,
    OUT/figure4.png (+ .json), OUT/search_trials.json and the selected runs' files."""
    _needs_matplotlib("report (figure4.png)")
    from linmem.experiments.grids import default_storage, sqlite_path  # optuna: slow to import

    storage = storage or default_storage("runs/search")
    if sqlite_path(storage) is None or sqlite_path(storage).is_file():
        storage = _opened_storage(storage)
    try:
        records = build_report(storage, None if grid == "all" else grid, runs_root, out, runs,
                               summaries, seed_runs, baseline, protocol, compare, command_line(),
                               compare_seed_runs, ablation)
    except (ValueError, FileNotFoundError) as err:
        raise UsageFailure(str(err)) from None
    out_dir = Path(out)
    for r in records:
        sel = (f"selected {r['model']} h{r['hidden']}"
               + (f" m{r['memory']}" if r.get("memory") else "")
               + f" wd {r['weight_decay']:g}: valid {r['valid_acc']:.2f}% test {r['test_acc']:.2f}%"
               if "test_acc" in r else "nothing complete yet")
        where = (f"{r['study']}: {r['points_done']}/{r['grid_points']} points done"
                 if r["study"] else f"{r['dataset']}-{r['model']}: {r['trials']} single runs")
        click.echo(f"{where}; {sel}")
    click.echo(f"-> {out_dir}/summary.json, table2.md, figure4.png")


@click.command("progress")
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
                   "DATA-MODEL/sK, finished) left out; before a selection, each at the "
                   "study's dearest point.")
@click.option("--plan-run", "run_plans", multiple=True, metavar="DATA:RUN",
              help="Also a single run still to make: RUN's configuration (a finished run on "
                   "another data set) on DATA, projected from RUN scaled by the data sets' "
                   "frames; left out once a run of that model on DATA is among --run.")
@click.option("--probe", "probes", multiple=True, type=click.Path(exists=True),
              help="Short runs of one configuration on several data sets (run directories or "
                   "folders of them): a study with nothing finished takes its model's points "
                   "on another data set, scaled by their epochs' CPU times.")
@_max_retry_option
@_protocol_option
def progress_cmd(storage: str | None, grid: str, runs_root: str, runs: tuple[str, ...],
                 summaries: tuple[str, ...], out: str | None, plans: tuple[str, ...],
                 seed_plans: tuple[str, ...], run_plans: tuple[str, ...],
                 probes: tuple[str, ...], max_retry: int | None, protocol: str) -> None:
    """Where the searches stand: points done per study, the CPU hours their runs logged, the
    hours projected for the rest; nothing is run (safe beside running workers)."""
    from linmem.experiments.grids import default_storage, sqlite_path
    from linmem.experiments.progress import progress_table  # optuna: slow import

    storage = storage or default_storage("runs/search")
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise UsageFailure(f"no search database at {database} (pass --storage)")
    try:
        text = progress_table(_opened_storage(storage), None if grid == "all" else grid,
                              runs_root, runs, list(_summary_files(summaries)), plans,
                              seed_plans, run_plans, max_retry, protocol, command_line(),
                              probes)
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    if out is None:
        click.echo(text, nl=False)
    else:
        with atomic_write(out, "w") as f:
            f.write(text)
        click.echo(f"-> {out}")


@click.command("search-export")
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
    from linmem.experiments.grids import default_storage, sqlite_path  # optuna: slow import
    from linmem.experiments.studies import export_studies

    storage = storage or default_storage("runs/search")
    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        raise UsageFailure(f"no search database at {database} (pass --storage)")
    counts = export_studies(_opened_storage(storage), file, None if grid == "all" else grid,
                            runs_root)
    click.echo(f"{sum(counts.values())} finished trials of {len(counts)} studies -> {file}")


@click.command("search-import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@_storage_option
def search_import_cmd(file: str, storage: str | None) -> None:
    """Add the studies of FILE (written by `linmem search-export`) to the storage; `linmem
    search` then goes on from them. Points the storage has finished are kept as they are."""
    from linmem.experiments.grids import default_storage, make_storage  # optuna: slow import
    from linmem.experiments.studies import import_studies

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


@click.command("baseline")
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
def summarize_cmd(paths: tuple[str, ...], seeds: bool, valid: bool) -> None:
    """Markdown table of the runs (metrics.json files) under PATHS, with their commands."""
    try:
        records = collect_metrics(paths, diverged=seeds or valid)  # a diverged seed counts
        scored = [r for r in records if "diverged" not in r]
        if not scored:
            raise FileNotFoundError("no metrics.json under " + ", ".join(map(str, paths)))
        click.echo(markdown_table(scored), nl=False)
        if seeds:
            click.echo("\n" + seeds_markdown(seed_groups(records)))
        if valid:
            click.echo("\n" + valid_seeds_markdown(seed_groups(records)))
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


COMMANDS = (
    ablation_cmd,
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
