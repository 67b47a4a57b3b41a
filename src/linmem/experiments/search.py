"""Model selection by grid search, as in the paper's "Experimental Results", on Optuna studies.

One study per (data set, model, grid), named ``DATA-MODEL-GRID``, in any storage Optuna's
``RDBStorage`` takes: a SQLite file by default (nothing to install), or a PostgreSQL URL that any
number of workers on any number of machines share. A grid point is one trial whose parameters are
fixed when it is enqueued (``hidden``, ``memory`` for LMNs, ``weight_decay``); its run directory
``OUT/STUDY/POINT`` holds an ordinary training run (:func:`linmem.train`).

How workers share a study without losing or repeating work:

- A point is *claimed* by any trial of it that is waiting, running, complete or pruned. A worker
  enqueues a point only when no trial claims it, and runs waiting trials first.
- Two workers may still enqueue the same point at once; the trial with the lower number wins and
  the other ends at once as a duplicate (pruned, user attribute ``duplicate_of``; never run).
- Every running trial sends a heartbeat. A trial whose worker died is failed once its heartbeat is
  older than the grace period (by any worker, which checks before each trial and while waiting);
  Optuna's retry callback (``RetryHeartbeatStaleTrialCallback``) enqueues it again, and the retry
  resumes the dead worker's run directory from its last finished epoch.
- A point whose training raised an error (a run that diverged with ``on_divergence="raise"``;
  by default a diverged run ends at its last good epoch with its best checkpoint, as early
  stopping does, and completes), or whose worker died more than ``max_retry`` times
  (:data:`MAX_RETRY` by default), is *failed*: reported, not retried (``retry_failed``, ``linmem
  search --retry-failed``, gives a point an error failed one more trial, once the fault that
  failed it is mended). A worker killed at the end
  of a machine's session is a death too, and a long point (a pretrained LMN on MuseData: hours)
  can span several sessions, so the default is generous; a point that crashes its worker at
  once is still given up after that many tries.
- A worker leaves when every point of its studies is complete, pruned or failed; while points are
  only running elsewhere it waits, so that it can take over the trials of a worker that dies.
  With ``wait=False`` (``linmem search --no-wait``) it leaves them to their workers instead, once
  it has been up for a grace period (so that the trials of workers that died before it started
  have been failed and taken over): a worker that has other work to do goes on to it, rather than
  idling through another's last trial.
- With a deadline (``stop_by``, ``linmem search --stop-by``) a worker starts no point projected
  to end after it (:func:`point_seconds`, less what the point's run directory has logged already
  where a killed run resumes, but not less than the epochs its early stopping still holds it to
  where no pruner may end it sooner), and none at all once it has passed, and leaves when none
  that fits is left: on a machine with a time limit, no point is cut off half-way. A study with
  nothing finished has nothing to project from: it starts with its smallest point
  (:func:`next_point`), whose time then projects the others' (a random one could be its
  dearest, which would run on past the deadline).

Selection is on validation accuracy only (:func:`linmem.experiments.studies.select`); the test
scores of the other trials are stored with them but never used to choose. The grids, their points
and the storage are :mod:`linmem.experiments.grids`'; reading finished studies, and moving a search
between machines as a text file, :mod:`linmem.experiments.studies`'.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import socket
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from linmem._check import check_device, check_int
from linmem._extras import require
from linmem._io import command_line
from linmem._threads import usable_cpus
from linmem.data import load_polyphonic, resolve_name
from linmem.experiments.grids import (
    GRIDS,
    MAX_RETRY,
    Point,
    check_grid,
    claimed_before,
    grid_points,
    point_states,
    study_name,
    trial_point,
)
from linmem.experiments.run_costs import (
    epochs_due_cpu_seconds,
    mean_epoch_cpu_seconds,
    training_cpu_seconds,
)
from linmem.experiments.storage import (
    caused_by_interrupt,
    check_storage,
    default_storage,
    interrupts_between_storage_calls,
    make_storage,
)
from linmem.experiments.studies import trial_seconds
from linmem.models import option_names
from linmem.registry import get_spec
from linmem.training.config import PLACE_FIELDS, PROTOCOLS, TrainConfig
from linmem.training.evaluation import check_size
from linmem.training.recipes import train as run_training
from linmem.training.selection import selection_score, selection_scores
from linmem.training.trainer import TrainingDiverged

optuna = require("optuna", "a search")
TrialState = optuna.trial.TrialState

__all__ = [
    "SearchConfig",
    "check_search",
    "count_points",
    "next_point",
    "open_study",
    "point_params",
    "point_seconds",
    "run_search",
    "run_worker",
    "size_cost",
    "size_slope",
]


@dataclass
class SearchConfig:
    """What a worker runs: the studies (data sets x models) of one grid, and how."""

    data: Sequence[str] = ("jsb",)
    models: Sequence[str] = ("lmn-b",)
    grid: str = "paper"
    out_dir: str = "runs/search"
    storage: str | None = None  # None: default_storage(out_dir)
    # training settings other than the grid's (None: TrainConfig's defaults, under
    # DEFAULT_PROTOCOL as linmem train's)
    base: TrainConfig | None = None
    pruner: str | None = None  # "median" or "none"; None: the base's protocol's
    prune_warmup: int = 50  # epochs before a trial may be pruned
    prune_startup: int = 5  # trials per study that finish before pruning starts
    subset: int | None = None  # the first N sequences of each split (quick runs and tests)
    heartbeat_interval: int = 60
    grace_period: int | None = None  # default 2 x heartbeat_interval
    max_retry: int = MAX_RETRY
    retry_failed: bool = False  # a point a trial's error failed: one more trial (point_states)
    poll_s: float = 10.0
    progress: bool = True
    wait: bool = True  # False: leave points running in live workers to them (module docstring)
    stop_by: float | None = None  # a Unix time: start no point projected to end after it

    def __post_init__(self) -> None:
        check_grid(self.grid)
        self.base = self.base or TrainConfig()
        if self.pruner is None:
            self.pruner = PROTOCOLS[self.base.protocol].pruner
        if self.pruner not in ("median", "none"):
            raise ValueError(f"pruner must be 'median' or 'none', got {self.pruner!r}")
        check_int("subset", self.subset, none_ok=True)
        if not self.poll_s > 0:
            raise ValueError(f"poll_s must be > 0, got {self.poll_s!r}")
        self.models = list(self.models)
        self.data = [resolve_name(d) for d in self.data]
        if not self.models or not self.data:
            raise ValueError("a search needs at least one data set and one model")
        for m in self.models:
            replace(self.base, model=m)  # validates the model with the base settings


def _study_attrs(config: SearchConfig, data: str, model: str) -> dict[str, Any]:
    base = asdict(replace(config.base, data=data, model=model))
    for key in ("hidden", "memory", "weight_decay", *PLACE_FIELDS):
        base.pop(key)
    return {"grid": config.grid, "data": data, "model": model, "subset": config.subset,
            "train": base}


def open_study(config: SearchConfig, data: str, model: str, storage=None):
    """Create or load the study of (data, model); refuses one made with other settings."""

    storage = storage or make_storage(config.storage or default_storage(config.out_dir),
                                      config.heartbeat_interval, config.grace_period,
                                      config.max_retry)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=config.prune_startup,
                                          n_warmup_steps=config.prune_warmup)
              if config.pruner == "median" else optuna.pruners.NopPruner())
    attrs = _study_attrs(config, data, model)
    overrides = config.base.protocol_overrides()
    if config.base.memory_bound is not None:  # a bounded memory: a study of its own too
        overrides["memory_bound"] = config.base.memory_bound
    name = study_name(data, model, config.grid, config.base.protocol, overrides)
    if overrides:  # a study made before names carried the departures keeps its name
        legacy = study_name(data, model, config.grid, config.base.protocol)
        found = {s.study_name: s.user_attrs for s in optuna.get_all_study_summaries(storage)}
        if name not in found and legacy in found and not _settings_diff(found[legacy], attrs):
            name = legacy
    study = optuna.create_study(storage=storage, study_name=name,
                                direction="maximize", pruner=pruner, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(0))  # params are enqueued
    if not study.user_attrs:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    elif diff := _settings_diff(study.user_attrs, attrs):
        stored = study.user_attrs
        raise ValueError(
            f"study {study.study_name!r} in this storage was made with other settings "
            f"({', '.join(diff)}: {', '.join(repr(stored.get(k)) for k in diff)}); "
            "use the same options, or another --out/--storage")
    return study


def _settings_diff(stored: dict[str, Any], attrs: dict[str, Any]) -> list[str]:
    """The keys of a study's user attributes ``attrs`` (:func:`_study_attrs`) in which the
    ``stored`` ones differ; a setting added to TrainConfig since the study was made counts at
    its default (a study made before protocols had names: :data:`LEGACY_PROTOCOL`'s)."""
    stored = dict(stored)
    defaults = TrainConfig.legacy_defaults()
    stored["train"] = {**{k: v for k, v in defaults.items() if k in attrs["train"]},
                       **stored.get("train", {})}
    return [k for k, v in attrs.items() if stored.get(k) != v]


def _objective(config: SearchConfig, study, model: str, data: dict[str, list[np.ndarray]],
               command: str) -> Callable:

    g = GRIDS[config.grid]
    lmn = get_spec(model).has_memory

    def objective(trial: optuna.Trial) -> float:
        frozen = next(t for t in study.get_trials(deepcopy=False) if t.number == trial.number)
        if "fixed_params" not in frozen.system_attrs:
            # another worker took the trial this one enqueued, and Optuna opened a new one
            trial.set_user_attr("duplicate_of", -1)
            raise optuna.TrialPruned("not an enqueued grid point")
        hidden = trial.suggest_categorical(
            "hidden", sorted({h for h, _ in g.lmn_sizes}) if lmn else list(g.hidden))
        memory = (trial.suggest_categorical("memory", sorted({m for _, m in g.lmn_sizes}))
                  if lmn else None)
        weight_decay = trial.suggest_categorical("weight_decay", list(g.weight_decay))
        point = Point(hidden, memory, weight_decay)
        owner = claimed_before(study, frozen)
        if owner is not None:
            trial.set_user_attr("duplicate_of", owner)
            raise optuna.TrialPruned(f"duplicate of trial {owner}")
        run_dir = point_run_dir(config, study, point)
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr("pruner", config.pruner)  # what may end it before early stopping
        # the points that differ in memory size alone share their unrolled network (pret-lmn)
        cache = (config.base.ulm_cache or str(Path(config.out_dir) / "ulm-cache")
                 if "ulm_cache" in option_names(model) else None)
        train_config = replace(config.base, data=study.user_attrs["data"], model=model,
                               hidden=hidden, memory=memory, weight_decay=weight_decay,
                               ulm_cache=cache)

        def report(epoch: int, row: dict) -> None:  # the pruner's input, kept in any case
            trial.report(selection_score(row, train_config.select, "valid_"), epoch)
            if trial.should_prune():
                trial.set_user_attr("pruned_at_epoch", epoch)
                raise optuna.TrialPruned(f"pruned at epoch {epoch} (valid "
                                         f"{_score_text(row, train_config.select)})")

        try:
            metrics = run_training(train_config, run_dir, resume=True, progress=False,
                                   data=data, on_epoch_end=report, command=command)
        except KeyboardInterrupt:  # Ctrl-C: the run resumes later; Optuna need not say more
            _quiet_after_interrupt.interrupted = True
            raise
        except TrainingDiverged as err:
            trial.set_user_attr("error", str(err))
            raise
        for key in ("valid_acc", "valid_nll", "test_acc", "test_nll", "test_nll_se",
                    "valid_acc_frame", "test_acc_frame", "test_acc_expected",
                    "test_acc_expected_se", "valid_threshold", "test_acc_at_valid_threshold",
                    "n_params", "epochs", "best_epoch", "wall_time_s", "cpu_time_s",
                    "machine", "commit", "data_sha256", "seed", "command"):
            if key in metrics:  # rnn-rbm: no valid_nll (its NLL is estimated on test only)
                trial.set_user_attr(key, metrics[key])
        return selection_score(metrics, train_config.select, "valid_")

    return objective


class _QuietAfterInterrupt(logging.Filter):
    """Drops Optuna's log records once the user interrupted a trial (Ctrl-C), and any record
    whose exception a Ctrl-C caused: Optuna's traceback of the ``KeyboardInterrupt`` and "failed
    with value None" say nothing that the command's own line does not (the storage's own records
    of a Ctrl-C: :func:`linmem.experiments.storage.make_storage`)."""

    interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not (self.interrupted or caused_by_interrupt(record.exc_info))


_quiet_after_interrupt = _QuietAfterInterrupt()


def _score_text(row: dict[str, Any], select: str) -> str:
    if select == "nll":
        return f"nll {row['valid_nll']:.3f}"
    return f"acc {row[f'valid_{select}']:.2f}%" + (" per-frame" if select == "acc_frame" else "")


def _load_data(config: SearchConfig, name: str) -> dict[str, list[np.ndarray]]:
    data = load_polyphonic(name, root=config.base.data_dir, progress=config.progress)
    if config.subset is not None:
        data = {split: seqs[:config.subset] for split, seqs in data.items()}
    return data


def point_seconds(config: SearchConfig, study, model: str, points: Sequence[Point]
                  ) -> dict[Point, float | None]:
    """Each point's projected wall time in seconds: the study's finished points' stored times
    (complete and pruned, :func:`_trial_seconds`) scaled to the point's parameters (counted on
    the meta device, :func:`point_params`) by :func:`size_cost`: a point of 750 units costs
    more than one of 250; where they are all of one size, at the slope of the epochs' CPU time
    that the study's runs here show over their sizes (:func:`size_slope`), else in proportion.
    None where none of the study's points has finished yet. The times are those of the
    machines that ran the points."""

    data = study.user_attrs["data"]
    sizes, seconds = [], []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        point = trial_point(t)
        if point is not None and "duplicate_of" not in t.user_attrs:
            seconds.append(trial_seconds(t))
            sizes.append(point_params(config.base, data, model, point))
    epochs = [(point_params(config.base, data, model, p), mean_epoch_cpu_seconds(run))
              for p in grid_points(model, config.grid)
              if (run := point_run_dir(config, study, p)).is_dir()]
    cost = size_cost(sizes, seconds, size_slope([epochs]))
    return {p: None if cost is None else cost(point_params(config.base, data, model, p))
            for p in points}


def size_slope(groups: Iterable[Sequence[tuple[int, float | None]]]) -> float | None:
    """The slope of log seconds on log parameters over ``groups`` of (parameters, seconds)
    pairs, each group's pairs against their own means (least squares pooled over the groups:
    a group of longer sequences costs more at every size, which is no slope), the pairs
    without seconds left out. For :func:`size_cost`'s points of one size: the slope that
    epochs' CPU times (``linmem.experiments.run_costs.mean_epoch_cpu_seconds``) show over
    several sizes.
    None where no group has two sizes."""
    sxy = sxx = 0.0
    for group in groups:
        pairs = [(math.log(n), math.log(t)) for n, t in group if t and n > 0]
        if len(pairs) < 2:
            continue
        mx, my = (sum(v) / len(pairs) for v in zip(*pairs, strict=True))
        sxy += sum((x - mx) * (y - my) for x, y in pairs)
        sxx += sum((x - mx) ** 2 for x, _ in pairs)
    return sxy / sxx if sxx > 1e-12 else None


def size_cost(sizes: Sequence[int], seconds: Sequence[float], slope: float | None = None
              ) -> Callable[[int], float] | None:
    """The cost of a point of ``n`` parameters, ``c * n ** a``, from finished points of
    ``sizes`` parameters that took ``seconds``: ``a`` the slope of log seconds on log
    parameters (least squares, kept within [0, 2]; where the points are all of one size,
    ``slope``, kept there too, or 1 without it: an epoch's matrix products grow with the
    parameters), ``c`` such that the finished points' costs add up to their seconds. An RNN's
    or LSTM's time grows about as its parameters, an LMN's far less (its small matrices'
    products do not dominate a step), and early stopping moves both; the fit follows each
    study. None with no finished point that took any time."""
    pairs = [(n, t) for n, t in zip(sizes, seconds, strict=True) if n > 0 and t > 0]
    if not pairs:
        return None
    fitted = size_slope([pairs])  # None: all of one size
    a = min(max(fitted if fitted is not None else 1.0 if slope is None else slope, 0.0), 2.0)
    c = sum(t for _, t in pairs) / sum(n ** a for n, _ in pairs)
    return lambda n: c * n ** a


def point_params(base: TrainConfig, data: str, model: str, point: Point) -> int:
    """The number of parameters of ``model`` at ``point`` on ``data``, the rest of its settings
    ``base``'s (:func:`linmem.training.evaluation.check_size`: counted on the meta device, nothing
    allocated). The projections scale a point's cost with it (:func:`size_cost`)."""
    return check_size(replace(base, data=data, model=model, hidden=point.hidden,
                              memory=point.memory))


def _late(config: SearchConfig, study, model: str, points: Sequence[Point]) -> set[Point]:
    """The points of ``points`` projected to end after ``config.stop_by`` (none without it),
    and every one once it has passed (those without a projection included). A killed run that
    would resume counts its projection less what it has logged, and without a pruner not less
    than what its early stopping still holds it to
    (:func:`linmem.experiments.run_costs.epochs_due_cpu_seconds`)."""
    if config.stop_by is None or not points:
        return set()
    left = config.stop_by - time.time()
    if left <= 0:
        return set(points)
    late = set()
    for p, s in point_seconds(config, study, model, points).items():
        run_dir = point_run_dir(config, study, p)  # a killed run resumes: less its time so far,
        if s is None or not run_dir.is_dir():  # and not less than its early stopping holds it to
            due = s
        else:
            due = max(s - training_cpu_seconds(run_dir),
                      epochs_due_cpu_seconds(run_dir) if config.pruner == "none" else 0.0)
        if due is not None and due > left:
            late.add(p)
    return late


def next_point(config: SearchConfig, study, model: str, todo: Sequence[Point],
               rng: np.random.Generator) -> Point:
    """The point of ``todo`` to start next: a random one (workers that share a study spread
    over its points), but with a deadline (``config.stop_by``) and none of the study's points
    projected (nothing finished, :func:`point_seconds`) a random one of the fewest parameters
    (:func:`point_params`), so that the first to finish is the cheapest and projects the rest."""
    if config.stop_by is not None and all(
            s is None for s in point_seconds(config, study, model, todo).values()):
        data = study.user_attrs["data"]
        params = {p: point_params(config.base, data, model, p) for p in todo}
        todo = [p for p in todo if params[p] == min(params.values())]
    return todo[int(rng.integers(len(todo)))]


def point_run_dir(config: SearchConfig, study, point: Point) -> Path:
    """The run directory of a grid point: ``OUT/STUDY/POINT``."""
    return Path(config.out_dir) / study.study_name / point.name


def run_worker(config: SearchConfig, command: str | None = None,
               log: Callable[[str], None] | None = None) -> dict[str, dict[str, int]]:
    """Work on the studies of ``config`` until every point is done or failed (see the module
    docstring). Returns the count of points per state per study. A Ctrl-C lets a storage call
    end first (:func:`linmem.experiments.storage.interrupts_between_storage_calls`)."""

    with interrupts_between_storage_calls():
        return _run_worker(config, command, log)


def _run_worker(config: SearchConfig, command: str | None,
                log: Callable[[str], None] | None) -> dict[str, dict[str, int]]:
    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    command = command or command_line()
    check_device(config.base.device)  # here, before a trial could fail for want of it
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for handler in logging.getLogger("optuna").handlers:
        if _quiet_after_interrupt not in handler.filters:
            handler.addFilter(_quiet_after_interrupt)
    # heartbeats and fail_stale_trials are marked experimental since Optuna 2.9
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    storage = make_storage(config.storage or default_storage(config.out_dir),
                           config.heartbeat_interval, config.grace_period, config.max_retry)
    studies = [(d, m, open_study(config, d, m, storage)) for d in config.data
               for m in config.models]
    points = {id(s): grid_points(m, config.grid) for _, m, s in studies}
    datasets: dict[str, dict[str, list[np.ndarray]]] = {}
    rng = np.random.default_rng([os.getpid(), int(time.time())])  # workers spread over points
    grace = config.grace_period or 2 * config.heartbeat_interval
    up_since = time.monotonic()
    while True:
        checked = time.monotonic()  # stale trials are failed below, from this time on
        busy = False
        late: dict[str, int] = {}  # study: points left that are projected to end too late
        for data, model, study in studies:
            optuna.storages.fail_stale_trials(study)
            states = point_states(study, points[id(study)], config.max_retry, config.retry_failed)
            todo = [p for p, s in states.items() if s == "todo"]
            queued = [trial_point(t) for t in study.get_trials(deepcopy=False)
                      if t.state == TrialState.WAITING]
            too_late = _late(config, study, model, todo + [p for p in queued if p is not None])
            if too_late:
                late[study.study_name] = len(too_late)
                todo = [p for p in todo if p not in too_late]
            waiting = bool(queued)
            if any(p in too_late for p in queued):  # the next trial to run would end too late
                todo, waiting = [], False
            if not todo and not waiting:
                busy = busy or any(s == "running" for s in states.values())
                continue
            if not waiting:
                point = next_point(config, study, model, todo, rng)
                study.enqueue_trial(point.params)
            if data not in datasets:
                datasets[data] = _load_data(config, data)
            started = time.perf_counter()
            ran: list = []
            study.optimize(_objective(config, study, model, datasets[data], command),
                           n_trials=1, catch=(TrainingDiverged,),
                           callbacks=[lambda _, t, ran=ran: ran.append(t)])
            if ran and "duplicate_of" not in ran[0].user_attrs:
                t = ran[0]
                done = sum(s == "done" for s in point_states(
                    study, points[id(study)], config.max_retry, config.retry_failed).values())
                select = config.base.select
                log(f"[{study.study_name}] trial {t.number} {trial_point(t).name}: "
                    f"{t.state.name.lower()}"
                    + (f", valid {_score_text(selection_scores(t.value, select), select)}"
                       if t.value is not None else "")
                    + f" ({time.perf_counter() - started:.0f}s; {done}/{len(points[id(study)])}"
                    " points done)")
            break
        else:
            if late:  # the points left would end after the deadline: leave
                when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(config.stop_by))
                for name, n in late.items():
                    log(f"[{name}] {n} point(s) left, none projected to end by {when}: "
                        "not started")
                break
            # points running elsewhere: wait, to take over the dead; without wait, only until
            # the trials of workers dead before this one started were stale when checked
            # above (and so failed and retried; a second's margin for the stored clock)
            if not busy or (not config.wait and checked - up_since > grace + 1.0):
                break
            time.sleep(config.poll_s)
    return {s.study_name: dict(Counter(point_states(s, points[id(s)], config.max_retry,
                                                   config.retry_failed).values()))
            for _, _, s in studies}


def count_points(config: SearchConfig) -> dict[str, dict[str, int]]:
    """The count of points per state (``done``, ``todo``, ``running``, ``failed``) per study of
    ``config``, read from the storage; nothing is run."""
    storage = make_storage(config.storage or default_storage(config.out_dir),
                           config.heartbeat_interval, config.grace_period, config.max_retry)
    counts = {}
    for data in config.data:
        for model in config.models:
            study = open_study(config, data, model, storage)
            states = point_states(study, grid_points(model, config.grid), config.max_retry,
                                  config.retry_failed)
            counts[study.study_name] = dict(Counter(states.values()))
    return counts


def _worker_process(config: SearchConfig, command: str, threads: int) -> None:
    """One worker process of :func:`run_search` (module level: spawned processes import it)."""
    torch.set_num_threads(threads)
    run_worker(config, command)


def check_search(config: SearchConfig) -> None:
    """What a search needs, checked once before any worker starts: the device, every data set
    (missing data is one error, and no storage is made for nothing) and the storage
    (:func:`check_storage`)."""
    check_device(config.base.device)
    for name in config.data:
        _load_data(replace(config, progress=False), name)
    check_storage(config.storage or default_storage(config.out_dir))


def run_search(config: SearchConfig, jobs: int = 1, command: str | None = None,
               start_gap_s: float = 2.0, check: bool = True) -> dict[str, dict[str, int]]:
    """Run ``config`` with ``jobs`` worker processes on this machine (one in this process when
    ``jobs`` is 1), each with its share of the usable CPUs, until every point is done or failed;
    returns :func:`count_points`. Raises ``RuntimeError`` when a worker process fails.
    ``check``: :func:`check_search` first (skip it when the caller did)."""
    check_int("jobs", jobs)
    if check:
        check_search(config)
    command = command or command_line()
    if jobs == 1:
        run_worker(config, command)
        return count_points(config)
    threads = max(1, usable_cpus() // jobs)
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_worker_process, args=(config, command, threads))
             for _ in range(jobs)]
    try:
        for p in procs:
            p.start()
            time.sleep(start_gap_s)  # the first creates the studies
        for p in procs:
            p.join()
    finally:
        for p in procs:  # interrupted: no orphaned worker keeps training
            if p.is_alive():
                p.terminate()
                p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError("search worker exit codes " + ", ".join(str(p.exitcode)
                                                                    for p in procs))
    return count_points(config)


