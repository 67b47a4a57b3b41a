"""Where a search stands: the points done, failed and running per study, the CPU hours logged and
those projected for what is left (``linmem progress``).

The CPU seconds of a run come from its files (:mod:`linmem.training.runs`), those of an imported
trial from the trial (:mod:`linmem.experiments.search`); this module adds them up per study and per
CPU, projects the points left, and writes the table.
"""

from __future__ import annotations

import datetime
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from linmem._extras import require
from linmem._io import command_line, machine, made_by
from linmem.data import DATASETS, resolve_name
from linmem.experiments.grids import (
    FINISHED,
    MAX_RETRY,
    Point,
    check_grid,
    grid_points,
    point_states,
    study_name,
    trial_point,
)
from linmem.experiments.projection import probe_ratios, project_points
from linmem.experiments.run_costs import (
    epochs_cpu_seconds,
    epochs_due_cpu_seconds,
    mean_epoch_cpu_seconds,
    run_cpu_seconds,
    run_machine,
    scoring_cpu_seconds,
    training_cpu_seconds,
)
from linmem.experiments.search import point_params
from linmem.experiments.seeds import seed_folder_of
from linmem.experiments.studies import grid_studies, select, storage_protocol, trial_seconds
from linmem.registry import get_spec
from linmem.training.config import DEFAULT_PROTOCOL, PROTOCOLS, TrainConfig
from linmem.training.runs import (
    CONFIG,
    DIVERGED,
    EXPECTED,
    LOG,
    PRETRAINING,
    ULM,
    ended,
    has,
    log_rows,
    read_record,
)

optuna = require("optuna", "a search")

__all__ = [
    "planned_record",
    "planned_run_record",
    "progress_markdown",
    "progress_records",
    "progress_table",
    "seeds_record",
]


def _hours_by_machine(studies: Sequence[dict], runs: Sequence[tuple[str, float]],
                      run_machines: dict[str, str | None]) -> str:
    """The sentence of :func:`progress_markdown` that splits the CPU hours logged by the CPU
    that ran them, the most first, those of no recorded CPU last."""
    hours: dict[str | None, float] = {}
    for r in studies:
        for cpu, seconds in (r.get("cpu_s_by_machine") or {None: r["cpu_s"]}).items():
            hours[cpu] = hours.get(cpu, 0.0) + seconds / 3600
    for name, seconds in runs:
        cpu = run_machines.get(name)
        hours[cpu] = hours.get(cpu, 0.0) + seconds / 3600
    parts = [f"{cpu} {h:.1f}" for cpu, h in sorted(hours.items(), key=lambda ch: -ch[1])
             if cpu is not None and h > 0]
    if hours.get(None, 0.0) > 0:
        parts.append(f"not recorded (runs and trials from before the record) {hours[None]:.1f}")
    return ("CPU hours logged by the CPU that ran them (machines differ between sessions; a run "
            "resumed on another machine counts on the one it ended on, a run in flight on this "
            "one): " + "; ".join(parts) + ".")


_LEFT_FROM_LABELS = {  # where a point's projected cost comes from, as the table says it
    "data set": " (data set's)",
    "model": " (model's, scaled)",
    "model, other grid": " (model's in another grid, scaled)",
    "selected run": " (selected run's)",
    "selected trial": " (selected run's, trial's stored time)",
    "run, scaled": " (another data set's run, scaled)",
    "probe": " (model's on another data set, by size, x the probes)",
    "dearest point": " (the study's dearest point, projected)",
}

# what the progress table's figures count, and how the points left are projected
_PROGRESS_NOTE = (
    "CPU hours: each finished run's time (`metrics.json`), else the epochs' "
    "times in its `log.jsonl`, and its pretraining time: the CPU time where the run "
    "recorded it (from commit 8b4fc25 on), else the wall time, which is above it when "
    "processes shared the cores (one thread per run; epochs cut short by a killed "
    "worker are not counted; a study imported from another machine counts its finished "
    "trials' stored time where their runs are not here: their CPU time where they "
    "stored it, else their wall time). A pret-LMN run counts the "
    "training of its unrolled network, every session's, when it trained it, and none "
    "when it read it from the cache (`--ulm-cache`); runs recorded before commit "
    "3c1102d count what the network's own run logged beyond the recipe's clock when "
    "the network is their own, and nothing for a killed process's share of a cache "
    "entry. "
    "A study marked 'earlier' counts its trials' durations from `summary.json` (its "
    "storage and runs are gone): an upper bound, a trial whose worker died lasting "
    "until it was found dead. "
    "Projection: each point left at a cost c * n ** a of its n parameters, a fitted to "
    "the study's finished points (complete, pruned or failed after an epoch: one that "
    "diverged in its first epoch shows its set-up's cost, not a point's; the column "
    "shows their mean) by least squares on the logs, within [0, 2], and when they are "
    "all of one size the slope of log epoch CPU time on log parameters over the "
    "model's runs of two sizes or more (each study's against its own mean; in the "
    "same grid, else in any; an epoch's cost, not early stopping's), else 1; c such "
    "that they add up to their CPU time; for a study with "
    "none, with probes (`--probe`: short runs of one configuration on two data sets), "
    "each point at the cost c * n ** a fitted to its model's finished points on another"
    " data set times the probes' ratio of their epochs' CPU time there and here, for "
    "the models with a memory from an LMN's probes and for the others from the others' "
    "(\"model's on another data set, by size, x the probes\": an epoch's cost measured, "
    "where whole runs' costs carry how long they ran, short for runs that diverge), "
    "else its model's mean on the other data sets scaled by the two data sets' cost "
    "ratio over the models both have finished (\"model's, scaled\"), else the same from "
    "its model's points in another grid, the ratio then over the models finished in "
    "both grids (\"model's in another grid, scaled\"), else its data set's mean over "
    "every model. A point running counts its projection, or what it has logged and "
    "the epochs its early stopping still has to run at the least when that is more "
    "(patience epochs after its best so far, each at its logged epochs' mean CPU time;"
    " under a protocol without a pruner, which could end it sooner). "
    "Seeds still to run (`--plan-seeds`): each at the CPU time of the "
    "study's selected run, with its unrolled network's when it read that from the cache"
    " (a seed trains its own), or at its trial's stored time when the run is on another"
    " machine (\"trial's stored time\"), and while the study has selected nothing, at its"
    " dearest point, finished or projected (\"the study's dearest point, projected\"); "
    "the seeds run so far count as single runs. A single run still to make (`--plan-"
    "run`, an RNN-RBM): another data set's run of the same configuration, its epochs "
    "scaled by the two data sets' training and validation frames, its final scoring as "
    "it is (a fixed sample of frames for the AIS), its expected accuracy's scoring by "
    "the frames scored (\"another data set's run, scaled\"); a run's scoring "
    "(`expected.json`) counts in its CPU time.")


def progress_markdown(studies: Sequence[dict], runs: Sequence[tuple[str, float]] = (),
                      command: str | None = None, when: str | None = None,
                      run_machines: dict[str, str | None] | None = None) -> str:
    """The progress of the searches (:func:`progress_records`) and of single runs
    (``(name, cpu seconds)``) as a Markdown table with the totals: CPU hours logged, projected
    CPU hours left, and the hours logged by the CPU that ran them (a study's
    ``cpu_s_by_machine``, a single run's CPU in ``run_machines``; not recorded where neither
    says)."""

    def hours(s: float | None) -> str:
        return "?" if s is None else f"{s / 3600:.2f}"

    lines = ["| study | points done / grid | failed | running | CPU h | CPU h per finished "
             "point | projected CPU h left |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(studies, key=lambda r: r["study"]):
        st = r["states"]
        per = hours(r["mean_point_cpu_s"]) + _LEFT_FROM_LABELS.get(r["left_from"], "")
        if r["mean_point_cpu_s"] is None and r["left_cpu_s"] == 0.0:
            per = "–"  # nothing left, nothing to project from
        name = r["study"] + (f" ({r['points_from_trials']} points: trial's stored time)"
                             if r.get("points_from_trials") else "")
        lines.append(f"| {name} | {st.get('done', 0)} / {r['grid_points']} | "
                     f"{st.get('failed', 0)} | {st.get('running', 0) + st.get('waiting', 0)} | "
                     f"{hours(r['cpu_s'])} | {per} | {hours(r['left_cpu_s'])} |")
    for name, seconds in runs:
        lines.append(f"| {name} (single run) | – | – | – | {hours(seconds)} | – | – |")
    spent = sum(r["cpu_s"] for r in studies) + sum(s for _, s in runs)
    unknown = [r["study"] for r in studies if r["left_cpu_s"] is None]
    left = sum(r["left_cpu_s"] or 0.0 for r in studies)
    lines += ["", f"CPU hours logged: **{spent / 3600:.1f}**; projected CPU hours left for the "
              f"studies above: **{left / 3600:.1f}**"
              + (f" (and no estimate yet for {', '.join(unknown)})" if unknown else "") + "."]
    if spent > 0:
        lines += ["", _hours_by_machine(studies, runs, run_machines or {})]
    lines += ["", _PROGRESS_NOTE]
    return "\n".join(lines + made_by(command, when)) + "\n"


def progress_records(storage: str, grid: str | None = None, runs_root: str | os.PathLike = ".",
                     max_retry: int = MAX_RETRY,
                     protocol: str | None = None) -> list[dict]:
    """Where each study of ``grid`` (or of every grid) in ``storage`` stands, nothing run: its
    points by state and the CPU seconds its points' runs logged (:func:`linmem.training.runs.
    run_cpu_seconds`: one thread per run), and the seconds its points left would take
    (:func:`project_points`: by size from its finished points, complete, pruned or failed
    after an epoch (a point that diverged in its first epoch costs its set-up: left out),
    :func:`size_cost`; else from its model's on other data sets, else from its data set's). A
    finished point whose run is not under ``runs_root`` (a study imported from another machine,
    :func:`import_studies`) counts its trial's stored time (``points_from_trials``: its CPU
    time, or its wall time for older trials). A running point's run is held to the epochs its
    early stopping still has to run (``running_due_cpu_s``) where no pruner may end it sooner:
    the pruner its trial ran under (``linmem search --pruner``), else its protocol's."""

    here = machine()["cpu"]
    records = []
    for attrs, study in grid_studies(storage, grid, protocol):
        points = grid_points(attrs["model"], attrs["grid"])
        states = point_states(study, points, max_retry)
        seconds = dict.fromkeys(points, 0.0)
        cpu: dict[Point, str | None] = dict.fromkeys(points)
        local: dict[Point, Path | None] = {}  # each point's last run here (None: elsewhere)
        pruner: dict[Point, str] = {}  # the pruner its last trial ran under, where it says
        from_trials = set()
        for t in study.get_trials(deepcopy=False):
            p = trial_point(t)
            if "duplicate_of" in t.user_attrs or "run_dir" not in t.user_attrs or p not in seconds:
                continue
            seconds[p], elsewhere = _run_seconds(t, runs_root)
            if "pruner" in t.user_attrs:
                pruner[p] = t.user_attrs["pruner"]
            if elsewhere:
                from_trials.add(p)
                local[p] = None
                cpu[p] = (t.user_attrs.get("machine") or {}).get("cpu")
            else:  # its run is here: the CPU it ended on, or this one (in flight, killed)
                local[p] = Path(runs_root) / t.user_attrs["run_dir"]
                cpu[p] = run_machine(local[p], here)
        by_machine: dict[str | None, float] = {}
        for p, s in seconds.items():
            if s > 0:
                by_machine[cpu[p]] = by_machine.get(cpu[p], 0.0) + s
        base = TrainConfig.from_dict(attrs.get("train", {}))  # a setting added since: default
        size = {p: point_params(base, attrs["data"], attrs["model"], p) for p in points}
        # the cost samples: a point failed before its first epoch ended (diverged at once) has
        # logged its set-up's cost, not a point's; its time counts in ``cpu_s`` all the same
        finished = [p for p in points if states[p] == "done" or (
            states[p] == "failed" and p in local and (local[p] is None or log_rows(local[p])))]
        running = [p for p in points if states[p] in ("running", "waiting")]
        todo = [p for p in points if states[p] == "todo"]
        # what early stopping still holds a running point to: only where no pruner may end it
        # (the one its trial ran under; a trial from before they said: the protocol's default)
        unpruned = {p: pruner.get(p, PROTOCOLS[base.protocol].pruner) == "none" for p in running}
        due = [epochs_due_cpu_seconds(local[p]) if unpruned[p] and local.get(p) else 0.0
               for p in running]
        per_epoch = {p: mean_epoch_cpu_seconds(local[p]) if local.get(p) else None
                     for p in finished + running}
        records.append({"study": study.study_name, "dataset": attrs["data"],
                        "model": attrs["model"], "grid": attrs["grid"],
                        "grid_points": len(points), "states": dict(Counter(states.values())),
                        "cpu_s": sum(seconds.values()), "cpu_s_by_machine": by_machine,
                        "finished_cpu_s": [seconds[p] for p in finished],
                        "running_cpu_s": [seconds[p] for p in running], "todo": len(todo),
                        "running_due_cpu_s": due, "points_from_trials": len(from_trials),
                        "finished_params": [size[p] for p in finished],
                        "running_params": [size[p] for p in running],
                        "todo_params": [size[p] for p in todo],
                        "finished_epoch_cpu_s": [per_epoch[p] for p in finished],
                        "running_epoch_cpu_s": [per_epoch[p] for p in running]})
    return project_points(records)


def seeds_record(storage: str, data: str, model: str, grid: str, seeds: int = 3,
                 done: int = 0, runs_root: str | os.PathLike = ".",
                 protocol: str | None = None, planned: str | None = None) -> dict:
    """The progress record of the seeds still to run (``seeds - done``, ``linmem reseed``) of a
    study's selected configuration, each projected at the selected run's CPU seconds and, when
    that run read its unrolled network from the cache, the network's own (a seed trains its
    own); no projection while the study has no complete point (and no study needed once every
    seed is done). A selected run that is not under ``runs_root`` (a study imported from another
    machine) counts its trial's stored time instead (its CPU time, or the wall time of an older
    trial: one thread per run, an upper bound of its CPU time). Their logged time is the seed
    runs' (``linmem progress --run``), not counted here. ``planned``: the name of the planned
    search's record (:func:`planned_record`) when the study does not exist yet: no projection
    here (:func:`progress_table` then takes that search's dearest point). ``protocol``: the
    study's (None: the one the storage's studies were trained under)."""
    data = resolve_name(data)
    protocol = protocol or storage_protocol(storage, grid)
    name = planned or study_name(data, model, grid, protocol)
    todo = max(seeds - done, 0)
    if todo and planned is None:
        name = _the_study(storage, name, data, model, grid, protocol)
    chosen = (select(optuna.load_study(study_name=name, storage=storage))
              if todo and planned is None else None)
    per, source = None, "selected run"
    if chosen is not None:
        run = Path(runs_root) / chosen[0].user_attrs["run_dir"]
        per, elsewhere = _run_seconds(chosen[0], runs_root)
        ulm = read_record(run, PRETRAINING, {}).get("ulm_run")
        if elsewhere:
            source = "selected trial"
        elif ulm and Path(ulm).name != ULM:  # a cache entry, not the run's own
            per += run_cpu_seconds(Path(runs_root) / ulm)
    return {"study": f"{name} seeds", "of_study": name, "dataset": data, "model": model,
            "grid": grid, "grid_points": seeds, "states": {"done": min(done, seeds)},
            "cpu_s": 0.0, "finished_cpu_s": [], "running_cpu_s": [], "todo": todo,
            "points_from_trials": 0, "mean_point_cpu_s": per, "left_from": source,
            "left_cpu_s": None if per is None and todo else todo * (per or 0.0)}


def _the_study(storage: str, name: str, data: str, model: str, grid: str, protocol: str) -> str:
    """The storage's study of (data, model, grid) under ``protocol``: the one named ``name``,
    else the only one whose name departs from it (``+FIELD=VALUE``: a protocol field, a bounded
    memory; :func:`linmem.experiments.grids.study_name`); ``ValueError`` for none or several."""
    names = optuna.get_all_study_names(storage)
    if name in names:
        return name
    departing = [n for n in names if n.startswith(name + "+")]
    if len(departing) == 1:
        return departing[0]
    if not departing:
        raise ValueError(f"no study {name} in the storage")
    raise ValueError(f"{len(departing)} studies of {data}-{model}-{grid} in the storage "
                     f"({', '.join(sorted(departing))}): give each seeds' plan a storage of its "
                     "own")


def planned_run_record(data: str, run: str | os.PathLike) -> dict:
    """The progress record of a single run still to make (an RNN-RBM): the configuration of
    ``run``, a finished run on another data set, on ``data``. Projected at ``run``'s epochs' CPU
    time scaled by the two data sets' training and validation frames (an epoch's work; the
    epochs to early stopping taken as equal), the rest of its training as it is (the final
    scoring, whose AIS estimate of the NLL takes a fixed number of frames), and the scoring of
    its expected accuracy (``expected.json``) scaled by ``data``'s test frames over the frames
    ``run`` scored (the Makefile scores the test split)."""
    run = Path(run)
    config = read_record(run, CONFIG)
    if config is None:
        raise ValueError(f"{run}: no run there (config.json)")
    data, source = resolve_name(data), resolve_name(config["data"])
    if data not in DATASETS or source not in DATASETS:
        raise ValueError("both data sets must be known ones (linmem.data.DATASETS)")
    frames = {name: DATASETS[name].n_frames for name in (data, source)}
    epochs = epochs_cpu_seconds(run)
    per = (epochs * sum(frames[data][:2]) / sum(frames[source][:2])
           + max(training_cpu_seconds(run) - epochs, 0.0))
    if has(run, EXPECTED):
        scored = sum(v["frames"] for v in read_record(run, EXPECTED).values()
                     if isinstance(v, dict) and "acc_expected" in v)
        per += scoring_cpu_seconds(run) * frames[data][2] / max(scored, 1)
    return {"study": f"{data}-{config['model']} (planned run, from {run})", "dataset": data,
            "model": config["model"], "grid": "runs", "grid_points": 1, "states": {"todo": 1},
            "cpu_s": 0.0, "finished_cpu_s": [], "running_cpu_s": [], "todo": 1,
            "points_from_trials": 0, "mean_point_cpu_s": per, "left_from": "run, scaled",
            "left_cpu_s": per}


def planned_record(data: str, model: str, grid: str, protocol: str = DEFAULT_PROTOCOL) -> dict:
    """The progress record (:func:`progress_records`) of a study not created yet: every point of
    ``grid`` to do. Its cost is then projected like any other's (:func:`project_points`), so that
    the projection covers the searches still to start, not only those under way."""
    check_grid(grid)
    data = resolve_name(data)
    get_spec(model)  # a clear error for an unknown model
    points = grid_points(model, grid)
    n = len(points)
    base = TrainConfig.from_dict({"protocol": protocol})
    return {"study": f"{study_name(data, model, grid, protocol)} (planned)", "dataset": data,
            "model": model, "grid": grid, "grid_points": n, "states": {"todo": n}, "cpu_s": 0.0,
            "finished_cpu_s": [], "running_cpu_s": [], "todo": n, "points_from_trials": 0,
            "todo_params": [point_params(base, data, model, p) for p in points]}


def _run_seconds(trial, runs_root: str | os.PathLike) -> tuple[float, bool]:
    """The CPU seconds of ``trial``'s run under ``runs_root`` (:func:`linmem.training.runs.
    run_cpu_seconds`), or, for a finished trial whose run is not there (a study imported from
    another machine), its stored time (:func:`_trial_seconds`); and whether it is the latter."""
    seconds = run_cpu_seconds(Path(runs_root) / trial.user_attrs["run_dir"])
    if seconds == 0.0 and trial.state in FINISHED:
        return trial_seconds(trial), True
    return seconds, False


def _add_earlier(studies: list[dict], earlier: Sequence[Sequence[dict]]) -> None:
    """The searches of earlier reports' records that ``studies`` lacks, appended: their points
    at their trials' mean wall time (their storage is gone)."""
    for records in earlier:
        here = {(r["dataset"], r["model"]) for r in studies}
        for r in records:
            if not r["study"] or (r["dataset"], r["model"]) in here:
                continue
            done, spent = r["points_done"] or 0, r.get("search_wall_time_s") or 0.0
            # its points at their mean (their storage is gone): they inform the projections
            studies.append({"study": f"{r['study']} (earlier: trial wall time)",
                            "dataset": r["dataset"], "model": r["model"], "grid": r["grid"],
                            "grid_points": r["grid_points"], "states": {"done": done},
                            "cpu_s": spent, "finished_cpu_s": [spent / done] * done if done
                            else [], "todo": 0, "running_cpu_s": []})


def _add_planned_searches(studies: list[dict], plans: Sequence[str], grid: str | None,
                          protocol: str | None) -> None:
    """The searches ``plans`` names (``DATA:MODEL:GRID``) that ``studies`` has not started,
    appended (:func:`planned_record`)."""
    for plan in plans:
        parts = plan.split(":")
        if len(parts) == 2 and grid is not None:
            parts.append(grid)
        if len(parts) != 3:
            raise ValueError(f"--plan {plan}: expected DATA:MODEL:GRID (or DATA:MODEL with a "
                             "--grid other than 'all')")
        try:
            record = planned_record(*parts, protocol=protocol or DEFAULT_PROTOCOL)
        except ValueError as err:
            raise ValueError(f"--plan {plan}: {err}") from None
        if not any((r["dataset"], r["model"], r["grid"]) ==
                   (record["dataset"], record["model"], record["grid"]) for r in studies):
            studies.append(record)  # a planned search already started is counted as it stands


def _add_planned_seeds(studies: list[dict], seed_plans: Sequence[str], singles: list,
                       storage: str, runs_root: str | os.PathLike,
                       protocol: str | None) -> None:
    """The seeds ``seed_plans`` names (``DATA:MODEL:GRID[:N]``), less those among the single
    runs, appended and projected (:func:`seeds_record`)."""
    for plan in seed_plans:
        parts = plan.split(":")
        try:
            if len(parts) not in (3, 4):
                raise ValueError("expected DATA:MODEL:GRID[:N]")
            data, model, plan_grid = resolve_name(parts[0]), parts[1], parts[2]
            seeds = int(parts[3]) if len(parts) == 4 else 3
            done = sum(_finished_seed(Path(p), f"{data}-{model}") for p, _ in singles)
            planned = next((r for r in studies if r["study"].endswith(" (planned)") and
                            (r["dataset"], r["model"], r["grid"]) == (data, model, plan_grid)),
                           None)
            # a search planned, not started: its seeds at its dearest point, once projected
            record = seeds_record(storage, data, model, plan_grid, seeds, done, runs_root,
                                  protocol or DEFAULT_PROTOCOL,
                                  planned=planned["study"] if planned is not None else None)
            _project_unselected_seeds(record, studies)
            studies.append(record)
        except (ValueError, KeyError) as err:
            raise ValueError(f"--plan-seeds {plan}: {err}") from None


def _add_planned_runs(studies: list[dict], run_plans: Sequence[str], singles: list) -> None:
    """The runs ``run_plans`` names (``DATA:RUN``) of which no single run is made yet,
    appended (:func:`planned_run_record`)."""
    made = set()  # (data set, model) of the single runs given, for run_plans
    for p, _ in singles if run_plans else ():
        c = read_record(p, CONFIG)
        if c is not None:
            try:
                made.add((resolve_name(c["data"]), c["model"]))
            except ValueError:  # a data set file of its own that is not here
                continue
    for plan in run_plans:
        data, _, run = plan.partition(":")
        try:
            record = planned_run_record(data, run)
        except (ValueError, KeyError) as err:
            raise ValueError(f"--plan-run {plan}: {err}") from None
        if (record["dataset"], record["model"]) not in made:
            studies.append(record)


def progress_table(storage: str, grid: str | None = None, runs_root: str | os.PathLike = ".",
                   runs: Sequence[str | os.PathLike] = (), earlier: Sequence[Sequence[dict]] = (),
                   plans: Sequence[str] = (), seed_plans: Sequence[str] = (),
                   run_plans: Sequence[str] = (), max_retry: int | None = None,
                   protocol: str | None = None, command: str | None = None,
                   probes: Sequence[str | os.PathLike] = ()) -> str:
    """``linmem progress``'s table: the studies of ``grid`` (None: all) in ``storage``
    (:func:`progress_records`); the searches of earlier reports' ``summary.json`` records that
    the storage lacks (``earlier``; their trials' wall time); the single runs under ``runs``
    (their logged CPU time); and the work still to start, projected like the rest: ``plans``
    (``DATA:MODEL:GRID``, a search; :func:`planned_record`), ``seed_plans``
    (``DATA:MODEL:GRID[:N]``, a study's N seeds less those among ``runs``; :func:`seeds_record`)
    and ``run_plans`` (``DATA:RUN``, RUN's configuration on DATA unless a run of it is among
    ``runs``; :func:`planned_run_record`); ``probes``: short runs that scale a model's cost
    between data sets (:func:`probe_ratios`); ``protocol``: the studies' (None: the one they
    were trained under, :func:`linmem.experiments.studies.storage_protocol`). ``ValueError``
    names a bad plan, run or probe."""
    protocol = protocol or storage_protocol(storage, grid)
    studies = progress_records(storage, grid, runs_root,
                               MAX_RETRY if max_retry is None else max_retry, protocol)
    _add_earlier(studies, earlier)
    _add_planned_searches(studies, plans, grid, protocol)
    try:
        ratios = probe_ratios(probes) if probes else None
    except FileNotFoundError as err:
        raise ValueError(f"--probe: {err}") from None
    studies = project_points(studies, ratios)
    singles = _single_runs(runs)
    _add_planned_seeds(studies, seed_plans, singles, storage, runs_root, protocol)
    _add_planned_runs(studies, run_plans, singles)
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    here = machine()["cpu"]  # a single run in flight (no record yet) runs here
    return progress_markdown(studies, singles, command or command_line(), when,
                             {name: run_machine(name, here) for name, _ in singles})


def _project_unselected_seeds(record: dict, studies: Sequence[dict]) -> None:
    """Seeds of a study that has selected nothing yet: each at the study's dearest point as
    :func:`project_points` projects it (the selection is not known; the dearest is the bound),
    in place; ``record`` unchanged when the study is not among ``studies`` or has no
    projection."""
    if record["mean_point_cpu_s"] is not None or not record["todo"]:
        return
    dearest = next((r.get("dearest_point_cpu_s") for r in studies
                    if r["study"] == record["of_study"]), None)
    if dearest is not None:
        record.update(mean_point_cpu_s=dearest, left_from="dearest point",
                      left_cpu_s=record["todo"] * dearest)


def _single_runs(paths: Sequence[str | os.PathLike]) -> list[tuple[str, float]]:
    """``(run, CPU seconds)`` of each run under ``paths``; a run's pretraining runs (RUN/ulm,
    RUN/rnn) count in their run's figure."""
    singles = []
    for path in map(Path, paths):
        marks = (LOG, DIVERGED)  # a run diverged in its first epoch has no log
        found = ([path] if any((path / m).is_file() for m in marks) else
                 sorted({p.parent for m in marks for p in path.rglob(m)}))
        if not found:
            raise ValueError(f"--run {path}: no run (log.jsonl or diverged.json) there")
        singles += [(str(p), run_cpu_seconds(p)) for p in found
                    if not any(q in p.parents for q in found)]
    return singles


def _finished_seed(run: Path, name: str) -> bool:
    """Whether ``run`` is a finished (or diverged) seed run of ``name`` (DATA-MODEL), as
    ``linmem reseed`` lays them out (``NAME/sK``) or as results/seeds keeps them (``NAME-sK``)."""
    return seed_folder_of(run, name) is not None and ended(run)
