"""The finished studies of a search storage: selection on validation (:func:`select`), the records
the report reads (:func:`search_records`), and a search moved between machines as a text file
(:func:`export_studies`, :func:`import_studies`: the finished trials as Optuna journal lines).
"""

from __future__ import annotations

import copy
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from linmem._extras import require
from linmem._io import PROVENANCE_FIELDS, atomic_write, machine
from linmem.experiments.grids import FINISHED, grid_points, point_states, trial_point
from linmem.experiments.run_costs import run_cpu_seconds, run_machine
from linmem.training.config import DEFAULT_PROTOCOL, LEGACY_PROTOCOL, TrainConfig, record_protocol
from linmem.training.runs import METRICS, RunsRoot, expected_fields, has, read_record, run_under

optuna = require("optuna", "a search")
TrialState = optuna.trial.TrialState

__all__ = [
    "export_studies",
    "grid_studies",
    "import_studies",
    "search_records",
    "select",
    "select_per_frame",
    "storage_grids",
    "storage_protocol",
    "study_protocol",
    "trial_seconds",
]


def select(study, key: str | None = None) -> tuple[Any, dict[str, int]] | None:
    """The complete trial with the best validation score (the trial's value: the accuracy its
    runs select on, or minus the NLL; or the user attribute ``key``, such as ``valid_acc``;
    ties: the lower trial number), and the counts of trials that were run (``complete``,
    ``pruned``, ``failed``); None when no trial is complete. Test scores play no part."""

    trials = [t for t in study.get_trials(deepcopy=False) if "duplicate_of" not in t.user_attrs]
    complete = [t for t in trials if t.state == TrialState.COMPLETE and t.value is not None
                and math.isfinite(t.value)]
    if key is not None:
        complete = [t for t in complete if t.user_attrs.get(key) is not None]
        return None if not complete else (
            max(complete, key=lambda t: (t.user_attrs[key], -t.number)),
            _trial_counts(trials, complete))
    counts = _trial_counts(trials, complete)
    if not complete:
        return None
    return max(complete, key=lambda t: (t.value, -t.number)), counts


def _trial_counts(trials: list, complete: list) -> dict[str, int]:
    """Points complete, pruned and failed (with an error) among a study's ``trials``."""
    return {"complete": len({trial_point(t) for t in complete}),
            "pruned": len({trial_point(t) for t in trials if t.state == TrialState.PRUNED}),
            "failed": len({trial_point(t) for t in trials if t.state == TrialState.FAIL
                           and "error" in t.user_attrs})}


def select_per_frame(study, runs_root: RunsRoot = ".") -> dict[str, Any] | None:
    """The complete trial with the best validation accuracy under the per-frame mean (ties: the
    lower trial number) and its scores under that definition, for the per-frame column of
    Table 2, with its run's provenance (:data:`linmem._io.PROVENANCE_FIELDS`); None when a
    complete trial has no per-frame score (older runs whose ``metrics.json`` is not under
    ``runs_root``): no selection from part of the grid."""
    scored = []
    for t in study.get_trials(deepcopy=False):
        if (t.state != TrialState.COMPLETE or "duplicate_of" in t.user_attrs
                or t.value is None or not math.isfinite(t.value)):
            continue
        u = dict(t.user_attrs)
        if "valid_acc_frame" not in u:
            metrics = read_record(run_under(runs_root, str(u.get("run_dir"))), METRICS)
            if metrics is None:
                return None
            u = {**metrics, **u}
        scored.append((u["valid_acc_frame"], -t.number, t, u))
    if not scored:
        return None
    valid, _, best, u = max(scored, key=lambda x: x[:2])
    p = trial_point(best)
    return {"point": p.name, "hidden": p.hidden, "memory": p.memory,
            "weight_decay": p.weight_decay, "valid_acc_frame": valid,
            "test_acc_frame": u["test_acc_frame"], "run_dir": u.get("run_dir"),
            **{k: u.get(k) for k in PROVENANCE_FIELDS}}


def study_protocol(attrs: dict[str, Any]) -> str:
    """The training protocol of a study from its user attributes (a study made before protocols
    were named trained under linmem's)."""
    return record_protocol(attrs.get("train", {}))


def storage_protocol(storage: str, grid: str | None = None) -> str:
    """The protocol the search studies of ``grid`` (None: every grid) in ``storage`` were
    trained under: what ``linmem report`` and ``linmem progress`` read when no ``--protocol`` is
    given (:data:`~linmem.training.config.DEFAULT_PROTOCOL` for a storage with none, or no
    database yet); a ``ValueError`` when they were trained under several, which one of them
    then names."""
    from linmem.experiments.storage import sqlite_path

    database = sqlite_path(storage)
    if database is not None and not database.is_file():
        return DEFAULT_PROTOCOL
    found = sorted({study_protocol(attrs) for attrs, _ in _study_attrs(storage, grid)})
    if len(found) > 1:
        raise ValueError(f"the storage holds studies trained under {' and '.join(found)}: "
                         "name one with --protocol")
    return found[0] if found else DEFAULT_PROTOCOL


def _study_attrs(storage: str, grid: str | None) -> Iterator[tuple[dict[str, Any], str]]:
    """``(user attributes, name)`` of each search study of ``grid`` (None: all) in ``storage``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for summary in optuna.get_all_study_summaries(storage):
        attrs = summary.user_attrs
        if "grid" in attrs and (grid is None or attrs["grid"] == grid):
            yield attrs, summary.study_name


def grid_studies(storage: str, grid: str | None, protocol: str | None = None
                  ) -> Iterator[tuple[dict[str, Any], Any]]:
    """``(user attributes, study)`` of each search study of ``grid`` (None: every grid) trained
    under ``protocol`` (None: any) in ``storage``."""
    for attrs, name in _study_attrs(storage, grid):
        if protocol is None or study_protocol(attrs) == protocol:
            yield attrs, optuna.load_study(study_name=name, storage=storage)


def trial_seconds(trial) -> float:
    """A finished trial's time as the storage holds it: its run's CPU time, else its wall time,
    where the trial stored them (complete), else the trial's own duration (pruned, failed)."""
    for key in ("cpu_time_s", "wall_time_s"):
        if key in trial.user_attrs:
            return float(trial.user_attrs[key])
    return trial.duration.total_seconds() if trial.duration is not None else 0.0


def _reports_so_far(trials) -> Iterator[tuple[Any, dict[int, float]]]:
    """Each trial, in the order of their numbers, with its run's reports so far: epoch -> the
    score reported at that epoch by it and by the earlier trials that trained its run directory
    (a worker killed mid-run leaves a failed trial with the epochs up to then, and the trial that
    resumed the run reports only the epochs after; a later trial's report of an epoch wins). A
    trial without a run directory: its own reports. Read each before the next is drawn."""
    reported: dict[str, dict[int, float]] = {}
    for t in sorted(trials, key=lambda t: t.number):
        values = (reported.setdefault(t.user_attrs["run_dir"], {})
                  if "run_dir" in t.user_attrs else {})
        values.update({int(k): v for k, v in t.intermediate_values.items()})
        yield t, values


def run_reports(trials) -> dict[str, dict[int, float]]:
    """Run directory -> epoch -> the score reported at that epoch by every trial that trained
    the run (:func:`_reports_so_far` at the last of them)."""
    return {t.user_attrs["run_dir"]: values for t, values in _reports_so_far(trials)
            if "run_dir" in t.user_attrs}


def _trial_rows(study, selects: str) -> list[dict[str, Any]]:
    """Every trial of ``study`` that ran a point: its point, state, validation scores (the
    objective ``selects`` names it), best reported score, epochs and wall time; no test score."""
    on_acc, on_frame = selects == "acc", selects == "acc_frame"
    trials = []
    all_trials = study.get_trials(deepcopy=False)
    # the best epoch's score reported for each trial's run by it and by the trials it
    # resumed (the study's objective: an accuracy, global or per-frame, or minus the NLL)
    best_of = {t.number: max(values.values(), default=None)
               for t, values in _reports_so_far(all_trials)}
    for t in all_trials:
        p = trial_point(t)
        if "duplicate_of" in t.user_attrs or p is None or t.state == TrialState.WAITING:
            continue
        best = best_of[t.number]  # named below for what it is
        trials.append({"number": t.number, "point": p.name, "hidden": p.hidden,
                       "memory": p.memory, "weight_decay": p.weight_decay,
                       "state": t.state.name.lower(),
                       "valid_acc": t.value if on_acc else t.user_attrs.get("valid_acc"),
                       **({"valid_acc_frame": t.user_attrs.get("valid_acc_frame")}
                          if on_frame else {}),
                       "valid_nll": t.user_attrs.get("valid_nll"),
                       "best_intermediate_valid_acc": best if on_acc else None,
                       **({"best_intermediate_valid_acc_frame": best} if on_frame else {}),
                       "best_intermediate_valid_nll": (
                           -best if selects == "nll" and best is not None else None),
                       "epochs": t.user_attrs.get("epochs",
                                                  t.user_attrs.get("pruned_at_epoch")),
                       "wall_time_s": (t.duration.total_seconds()
                                       if t.duration is not None else None)})
    return trials


def _selected_fields(best, counts: dict[str, int], runs_root: RunsRoot,
                     trials: list[dict[str, Any]]) -> dict[str, Any]:
    """The selected trial's configuration, scores and provenance (read from its run's
    ``metrics.json`` under ``runs_root`` where the trial did not store a field), and the
    study's trial counts."""
    p = trial_point(best)
    u = dict(best.user_attrs)
    run = run_under(runs_root, str(u.get("run_dir")))
    if has(run, METRICS):  # fields a trial did not store (older trials: command)
        u = {**read_record(run, METRICS), **expected_fields(run), **u}
    return {
        "hidden": p.hidden, "memory": p.memory, "weight_decay": p.weight_decay,
        "valid_acc": u["valid_acc"], "valid_nll": u.get("valid_nll"),
        "test_acc": u["test_acc"],
        "valid_acc_frame": u.get("valid_acc_frame"),
        "test_acc_frame": u.get("test_acc_frame"), "test_nll": u["test_nll"],
        "test_nll_se": u.get("test_nll_se"),
        "test_acc_expected": u.get("test_acc_expected"),
        "test_acc_expected_se": u.get("test_acc_expected_se"),
        "valid_threshold": u.get("valid_threshold"),
        "test_acc_at_valid_threshold": u.get("test_acc_at_valid_threshold"),
        "n_params": u["n_params"], "epochs": u["epochs"],
        "best_epoch": u.get("best_epoch"), "wall_time_s": u["wall_time_s"],
        "trials": counts["complete"] + counts["pruned"] + counts["failed"],
        "trials_complete": counts["complete"], "trials_pruned": counts["pruned"],
        "trials_failed": counts["failed"], "run_dir": u.get("run_dir"),
        "command": u.get("command"), "commit": u.get("commit"),
        "seed": u.get("seed"), "data_sha256": u.get("data_sha256"),
        "search_wall_time_s": sum(t["wall_time_s"] or 0.0 for t in trials)}


def search_records(storage: str, grid: str | None = None,
                   runs_root: RunsRoot = ".", protocol: str | None = None
                   ) -> list[dict[str, Any]]:
    """One record per study in ``storage`` (of ``grid``, or every grid; trained under
    ``protocol``, None: any): the configuration selected on validation with its test scores, the
    coverage of the grid, and every trial that was run (points, states and validation
    accuracies only: no test score but the selected one). Fields a trial did not store
    (``command``, the per-frame accuracies) are read from its run's ``metrics.json`` under
    ``runs_root`` (a folder, or several searched in order) when that is there. Each record
    names its study's memory bound (``memory_bound``) and the protocol fields its study departs
    from (``overrides``: name and value pairs), which Table 2's rows show. A study whose runs
    select their epoch on the per-frame accuracy (the ``paper`` protocol) has its global column
    selected on the global validation accuracy all the same, and its per-frame column
    (``frame_selection``) on the per-frame.
    """

    records = []
    for attrs, study in grid_studies(storage, grid, protocol):
        selects = attrs.get("train", {}).get("select", "acc")
        on_acc = selects == "acc"
        on_frame = selects == "acc_frame"
        points = grid_points(attrs["model"], attrs["grid"])
        states = point_states(study, points)
        trials = _trial_rows(study, selects)
        record: dict[str, Any] = {
            "study": study.study_name, "dataset": attrs["data"], "model": attrs["model"],
            "grid": attrs["grid"], "subset": attrs.get("subset"),
            "reduced": _reductions(attrs),
            "selected_on": "valid nll" if selects == "nll" else "valid acc",
            **({"protocol": study_protocol(attrs)} if study_protocol(attrs) != LEGACY_PROTOCOL
               else {}),
            "memory_bound": attrs.get("train", {}).get("memory_bound"),
            "overrides": _overrides(attrs),
            "grid_points": len(points), "points_done": sum(s == "done" for s in states.values()),
            "points_failed": sum(s == "failed" for s in states.values()),
            "grid_complete": all(s in ("done", "failed") for s in states.values()),
            "trials_run": trials}
        chosen = select(study, "valid_acc" if on_frame else None)
        if chosen is not None and (on_acc or on_frame):  # the per-frame column's own selection
            record["frame_selection"] = select_per_frame(study, runs_root)
        if chosen is not None:
            record.update(_selected_fields(*chosen, runs_root, trials))
        records.append(record)
    return records


def _overrides(attrs: dict[str, Any]) -> list[tuple[str, Any]]:
    """The protocol fields a study's runs depart from (``linmem search --init-bias`` under
    ``paper``, say), sorted: name and value pairs."""
    train = attrs.get("train", {})
    if not train:
        return []
    config = TrainConfig.from_dict({**train, "data": attrs["data"], "model": attrs["model"],
                                    "protocol": study_protocol(attrs)})
    return sorted(config.protocol_overrides().items())


def _reductions(attrs: dict[str, Any]) -> list[str]:
    """How a study's search was cut down from a full one (its ``--subset`` of the sequences, an
    epoch bound or a patience below the defaults): its figures are not comparable with the
    paper's."""
    train = attrs.get("train", {})
    default = TrainConfig(protocol=study_protocol(attrs))
    out = []
    if attrs.get("subset") is not None:
        out.append(f"the first {attrs['subset']} sequences of each split")
    for name in ("epochs", "patience"):
        if train.get(name, getattr(default, name)) < getattr(default, name):
            out.append(f"{name} {train[name]}")
    return out


def storage_grids(storage: str) -> list[str]:
    """The grids of the search studies in ``storage``."""
    return sorted({attrs["grid"] for attrs, _ in grid_studies(storage, None)})


def _journal(path: str | os.PathLike):
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock, JournalStorage

    return JournalStorage(JournalFileBackend(str(path), lock_obj=JournalFileOpenLock(str(path))))


def _finished_trials(study) -> list:
    """The finished trials of a study's grid points, duplicates left out, by number."""
    return [t for t in study.get_trials(deepcopy=False)
            if t.state in FINISHED and "duplicate_of" not in t.user_attrs
            and trial_point(t) is not None]


def export_studies(storage: str, path: str | os.PathLike, grid: str | None = None,
                   runs_root: str | os.PathLike | None = None) -> dict[str, int]:
    """Write the finished trials (complete, pruned, failed: scores, attributes, the pruner's
    intermediate values, wall times) of every search study of ``grid`` (None: every grid) in
    ``storage`` to the Optuna journal file ``path`` (JSON lines), replaced atomically; the
    number of trials written per study. Running and waiting trials are left out.

    With ``runs_root``, a trial that stored no CPU time (pruned, or failed: a killed worker's)
    takes its run's there (:func:`linmem.experiments.run_costs.run_cpu_seconds`) and CPU
    (:func:`linmem.experiments.run_costs.run_machine`, this machine's for a run that ended
    without a record)
    into the file, so that another machine counts what it logged, not the trial's duration
    (which, for a trial failed once its worker's heartbeat stopped, lasts until a worker found
    it dead)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = {}
    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as tmp:
        journal_file = Path(tmp) / path.name
        journal = _journal(journal_file)
        for attrs, study in sorted(grid_studies(storage, grid), key=lambda x: x[1].study_name):
            target = optuna.create_study(storage=journal, study_name=study.study_name,
                                       direction=study.direction)
            for key, value in attrs.items():
                target.set_user_attr(key, value)
            trials = _finished_trials(study)
            if runs_root is not None:
                trials = [_with_run_time(t, runs_root) for t in trials]
            target.add_trials(trials)
            counts[study.study_name] = len(trials)
        journal_file.touch()  # no study: an empty journal
        lines = [json.loads(line) for line in journal_file.read_text().splitlines()]
        # one writer's name and sorted keys: the same trials, the same text (a storage that
        # imported them keeps a trial's attributes in another order)
        with atomic_write(path, "w") as f:
            f.writelines(json.dumps({**e, "worker_id": "linmem-export"}, separators=(",", ":"),
                                    sort_keys=True) + "\n" for e in lines)
    return counts


def _with_run_time(trial, runs_root: str | os.PathLike):
    """``trial``, or a copy of it with its run's CPU seconds and CPU (``cpu_time_s``,
    ``machine``) where it stored none and its run under ``runs_root`` logged some."""
    if "cpu_time_s" in trial.user_attrs or "run_dir" not in trial.user_attrs:
        return trial
    run = Path(runs_root) / trial.user_attrs["run_dir"]
    seconds = run_cpu_seconds(run)
    if seconds <= 0:
        return trial
    cpu = run_machine(run, machine()["cpu"])
    trial = copy.deepcopy(trial)
    trial.user_attrs = {**trial.user_attrs, "cpu_time_s": seconds,
                        **({"machine": {"cpu": cpu}} if cpu else {})}
    return trial


def _trial_key(trial) -> tuple:
    """A trial's identity across storages: its point and start time."""
    start = trial.datetime_start
    return trial_point(trial), None if start is None else round(start.timestamp(), 3)


def import_studies(path: str | os.PathLike,
                   storage: str | optuna.storages.BaseStorage) -> dict[str, int]:
    """Add the studies of a journal written by :func:`export_studies` to ``storage``: a study
    missing there is created with its attributes; into each, the journal's trials of the points
    that are still to do there (not done, running, waiting or failed), each trial once (so
    importing twice adds nothing, and a point a worker runs there is left to it). The number of
    trials added per study."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no search export at {path}")
    for n, line in enumerate(path.read_bytes().splitlines(keepends=True), 1):
        try:  # Optuna would skip a cut line silently (a write in progress)
            entry = json.loads(line) if line.endswith(b"\n") else None
        except ValueError:
            entry = None
        if not (isinstance(entry, dict) and "op_code" in entry):
            raise ValueError(f"{path}, line {n}: not a search export (Optuna journal lines)")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    journal = _journal(path)
    summaries = optuna.get_all_study_summaries(journal)
    added = {}
    for summary in summaries:
        source = optuna.load_study(study_name=summary.study_name, storage=journal)
        target = optuna.create_study(storage=storage, study_name=summary.study_name,
                                     direction=source.direction, load_if_exists=True)
        if not target.user_attrs:
            for key, value in source.user_attrs.items():
                target.set_user_attr(key, value)
        elif target.user_attrs != source.user_attrs:
            raise ValueError(f"study {summary.study_name!r} in the storage was made with other "
                             f"settings than the one in {path}")
        attrs = target.user_attrs
        states = point_states(target, grid_points(attrs["model"], attrs["grid"]))
        there = {_trial_key(t) for t in target.get_trials(deepcopy=False)}
        new = [t for t in _finished_trials(source)
               if states.get(trial_point(t)) == "todo" and _trial_key(t) not in there]
        target.add_trials(new)
        added[summary.study_name] = len(new)
    return added
