"""The ``linmem`` commands of the grid searches: run them (``search``), report and project them
(``report``, ``progress``) and move them between machines (``search-export``, ``search-import``).
Each parses its options, makes one library call and prints; optuna is imported inside them (it
is slow to import)."""

from __future__ import annotations

from pathlib import Path

import click

from linmem._io import atomic_write, command_line
from linmem.cli.common import (
    SEARCH_FIELDS,
    UsageFailure,
    _ModelChoice,
    _needs_extra,
    _opened_storage,
    _positive,
    _protocol_option,
    _protocol_values,
    _runs_root_option,
    _stop_by,
    _storage_option,
    _train_options,
    bound_value,
    config_error,
    config_options,
    stopped,
)
from linmem.data import DataError
from linmem.experiments.report import ANY_BOUND, build_report, summary_file_records
from linmem.training.config import TrainConfig

__all__ = ["progress_cmd", "report_cmd", "search_cmd", "search_export_cmd", "search_import_cmd"]


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
    from linmem.experiments.search import (  # optuna: slow to import
        SearchConfig,
        check_search,
        run_search,
    )
    from linmem.experiments.storage import default_storage

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
@click.option("--runs-root", "runs_roots", multiple=True, type=click.Path(file_okay=False),
              help="Folder the trials' run directories are relative to (where search ran); "
                   "several: searched in order (studies imported from searches run in different "
                   "places) [default: .].")
@click.option("--memory-bound", "memory_bound", default=None, metavar="R|none",
              callback=lambda ctx, param, value: ANY_BOUND if value is None else bound_value(value),
              help="The LMNs' rows (and seeds) from the studies and runs with this memory bound "
                   "('none': the paper's unbounded memory); those of another bound are left "
                   "out and named [default: every study, one a data set and model].")
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
def report_cmd(storage: str | None, grid: str, runs_roots: tuple[str, ...],
               memory_bound: float | str | None, out: str,
               runs: tuple[str, ...], summaries: tuple[str, ...], seed_runs: tuple[str, ...],
               baseline: str | None, protocol: str, compare: str | None,
               compare_seed_runs: tuple[str, ...], ablation: str | None) -> None:
    """Select each (data set, model) on validation; write OUT/summary.json, OUT/table2.md,
    OUT/figure4.png (+ .json), OUT/search_trials.json and the selected runs' files."""
    _needs_extra("matplotlib", "linmem report (figure4.png)")
    from linmem.experiments.storage import default_storage, sqlite_path  # optuna: slow to import

    storage = storage or default_storage("runs/search")
    if sqlite_path(storage) is None or sqlite_path(storage).is_file():
        storage = _opened_storage(storage)
    try:
        records = build_report(storage, None if grid == "all" else grid, runs_roots or ".", out,
                               runs, summaries, seed_runs, baseline, protocol, compare,
                               command_line(), compare_seed_runs, ablation, memory_bound)
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
    from linmem.experiments.progress import progress_table  # optuna: slow import
    from linmem.experiments.storage import default_storage, sqlite_path

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
    from linmem.experiments.storage import default_storage, sqlite_path  # optuna: slow import
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
    from linmem.experiments.storage import default_storage, make_storage  # optuna: slow import
    from linmem.experiments.studies import import_studies

    storage = _opened_storage(storage or default_storage("runs/search"))
    try:
        added = import_studies(file, make_storage(storage))
    except ValueError as err:
        raise UsageFailure(str(err)) from None
    for name, n in sorted(added.items()):
        click.echo(f"{name}: {n} trials added")
