"""Model selection by grid search, as in the paper's "Experimental Results", on Optuna studies.

One study per (data set, model, grid), named ``DATA-MODEL-GRID``, in any storage Optuna's
``RDBStorage`` takes: a SQLite file by default (nothing to install), or a PostgreSQL URL that any
number of workers on any number of machines share. A grid point is one trial whose parameters are
fixed when it is enqueued (``hidden``, ``memory`` for LMNs, ``weight_decay``); its run directory
``OUT/STUDY/POINT`` holds an ordinary training run (:func:`linmem.train.train`).

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
  (:data:`MAX_RETRY` by default), is *failed*: reported, not retried. A worker killed at the end
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
  to end after it (:func:`point_seconds`), and none at all once it has passed (a study with
  nothing finished has nothing to project from), and leaves when none that fits is left: on a
  machine with a time limit, no point is cut off half-way.

Selection is on validation accuracy only (:func:`select`); the test scores of the other trials are
stored with them but never used to choose.

A search moves between machines as a text file: :func:`export_studies` writes the finished trials
(complete, pruned, failed) of every study into an Optuna journal (JSON lines), and
:func:`import_studies` adds them to another storage, where the search goes on from them. Trials
still running or waiting are left out: their points are run again.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import multiprocessing
import os
import socket
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import optuna
import torch
from optuna.trial import TrialState

from ._check import check_device, check_int
from ._io import atomic_write, command_line, machine, read_json
from ._threads import usable_cpus
from .data import load_polyphonic, resolve_name
from .models import get_spec
from .recipes import run as run_training
from .runs import (
    METRICS,
    expected_fields,
    run_cpu_seconds,
    run_machine,
)
from .train import PLACE_FIELDS, PROTOCOLS, TrainConfig, TrainingDiverged, check_size

__all__ = [
    "FINISHED",
    "GRIDS",
    "MAX_RETRY",
    "Grid",
    "Point",
    "SearchConfig",
    "StorageError",
    "check_grid",
    "check_search",
    "check_storage",
    "count_points",
    "default_storage",
    "export_studies",
    "grid_points",
    "grid_studies",
    "import_studies",
    "make_storage",
    "open_study",
    "point_seconds",
    "point_states",
    "run_search",
    "run_worker",
    "search_records",
    "select",
    "select_per_frame",
    "sqlite_path",
    "storage_grids",
    "storage_url",
    "study_name",
    "study_protocol",
    "trial_point",
    "trial_seconds",
]

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
MAX_RETRY = 10  # a point whose worker died more often than this is failed (module docstring)
PAPER_LMN_SIZES = ((50, 50), (50, 100), (100, 100), (100, 250), (250, 250), (250, 500))
PAPER_WEIGHT_DECAYS = (1e-4, 1e-5, 1e-6, 1e-7, 0.0)


@dataclass(frozen=True)
class Grid:
    """A named grid: hidden sizes of the RNN-like models, (functional, memory) pairs of the LMNs,
    weight decays of every model."""

    hidden: tuple[int, ...]
    lmn_sizes: tuple[tuple[int, int], ...]
    weight_decay: tuple[float, ...]


GRIDS: dict[str, Grid] = {
    # the paper's grids (RNN, LSTM and, here, GRU; the LMN pairs), 25 and 30 points per model
    "paper": Grid((50, 100, 250, 500, 750), PAPER_LMN_SIZES, PAPER_WEIGHT_DECAYS),
    # the paper's grid without the sizes above 250 units: a quicker first pass
    "paper-small": Grid((50, 100, 250), PAPER_LMN_SIZES[:3], PAPER_WEIGHT_DECAYS),
    # issue 15's reduced grid for the three larger data sets (evidence in results/search.md):
    # each model's size selected on JSB Chorales' full grid with the paper's sizes around it,
    # and the two weight decays selected there (1e-5: five models; 1e-7: pret-LMN-B)
    "reduced": Grid((250, 500, 750), ((100, 250), (250, 250), (250, 500)), (1e-5, 1e-7)),
    # issue 17's NADE models on JSB Chorales: RNN-NADE's sizes (Boulanger-Lewandowski et al.
    # 2012: 150-300 recurrent units, a NADE of 150), two weight decays against overfitting
    "nade": Grid((150, 300), ((150, 150), (150, 300)), (1e-4, 1e-5)),
    "quick": Grid((50, 100), ((50, 50), (50, 100)), (1e-5, 0.0)),
    "tiny": Grid((4, 8), ((4, 4), (4, 8)), (1e-5, 0.0)),  # for tests
}


@dataclass(frozen=True)
class Point:
    """One grid point."""

    hidden: int
    memory: int | None
    weight_decay: float

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"hidden": self.hidden, "weight_decay": self.weight_decay}
        if self.memory is not None:
            params["memory"] = self.memory
        return params

    @property
    def name(self) -> str:
        sizes = f"h{self.hidden}" + ("" if self.memory is None else f"-m{self.memory}")
        return f"{sizes}-wd{self.weight_decay:g}"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Point:
        return cls(int(params["hidden"]),
                   None if params.get("memory") is None else int(params["memory"]),
                   float(params["weight_decay"]))


def check_grid(grid: str) -> None:
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose from {', '.join(GRIDS)}")


def grid_points(model: str, grid: str | Grid) -> list[Point]:
    """The points of ``grid`` for ``model`` (LMNs: the size pairs; others: the hidden sizes)."""
    g = GRIDS[grid] if isinstance(grid, str) else grid
    if get_spec(model).has_memory:
        sizes: Sequence[tuple[int, int | None]] = g.lmn_sizes
    else:
        sizes = [(h, None) for h in g.hidden]
    return [Point(h, m, wd) for h, m in sizes for wd in g.weight_decay]


def study_name(data: str, model: str, grid: str, protocol: str = "linmem") -> str:
    """``DATA-MODEL-GRID``, and ``@PROTOCOL`` after it for a protocol other than linmem's (the
    studies of both protocols share a storage)."""
    return f"{data}-{model}-{grid}" + ("" if protocol == "linmem" else f"@{protocol}")


def default_storage(out_dir: str | os.PathLike) -> str:
    """The SQLite file ``OUT/search.db``."""
    return f"sqlite:///{Path(out_dir).resolve() / 'search.db'}"


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///PATH`` storage URL; None for any other URL."""
    prefix = "sqlite:///"
    return Path(url[len(prefix):]) if url.startswith(prefix) else None


class StorageError(RuntimeError):
    """A search storage that cannot be opened: a corrupt file, a server out of reach, a missing
    database driver (the machine's fault, not the command line's)."""


def storage_url(url: str) -> str:
    """``url`` with its database driver made explicit where SQLAlchemy would pick one that is
    not installed: ``postgresql://`` means psycopg (version 3) to SQLAlchemy 2, while the
    ``postgres`` extra installs psycopg2, so without psycopg it becomes
    ``postgresql+psycopg2://``."""
    import importlib.util

    if url.startswith(("postgresql://", "postgres://")) and \
            importlib.util.find_spec("psycopg") is None:
        return "postgresql+psycopg2://" + url.split("://", 1)[1]
    return url


def check_storage(url: str) -> str:
    """Open the storage at ``url`` once (:func:`storage_url`'s form, returned): ``ValueError``
    for a URL that names no database Optuna can use, :class:`StorageError` when it cannot be
    opened (each one line, with what to do)."""
    import sqlalchemy.exc

    url = storage_url(url)
    database = sqlite_path(url)
    if database is not None:  # a new SQLite file is made in its folder, as Optuna does
        database.parent.mkdir(parents=True, exist_ok=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            optuna.storages.RDBStorage(url)
    except (sqlalchemy.exc.ArgumentError, sqlalchemy.exc.NoSuchModuleError, ValueError) as err:
        raise ValueError(f"--storage {url}: not a database URL Optuna can open "
                         f"({_first_line(err)}); use sqlite:///FILE or "
                         "postgresql://USER@HOST/DATABASE") from None
    except ImportError as err:
        raise StorageError(f"--storage {url}: its database driver is not installed "
                           f"({_first_line(err)}); for PostgreSQL: pip install "
                           "'linear-memory-networks[postgres]'") from None
    except sqlalchemy.exc.SQLAlchemyError as err:
        what = _first_line(getattr(err, "orig", None) or err)
        hint = (f"{database} is not a search database, or is damaged: pass another --storage "
                "(or move the file away to start a new one)" if database is not None else
                "check that the server runs and the URL, user and database are right")
        raise StorageError(f"--storage {url}: cannot open it ({what}); {hint}") from None
    return url


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0][:200] if text else type(err).__name__


def make_storage(url: str, heartbeat_interval: int = 60, grace_period: int | None = None,
                 max_retry: int = MAX_RETRY):
    """An ``optuna.storages.RDBStorage`` with heartbeats and the retry of failed trials."""

    url = storage_url(url)
    database = sqlite_path(url)
    if database is not None:
        database.parent.mkdir(parents=True, exist_ok=True)
        engine_kwargs = {"connect_args": {"timeout": 120}}  # several local workers share it
    else:
        engine_kwargs = {"pool_pre_ping": True}
    retry: dict[str, Any]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        if hasattr(optuna.storages, "RetryHeartbeatStaleTrialCallback"):  # Optuna >= 4.9
            retry = {"heartbeat_stale_trial_callback":
                     optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=max_retry)}
        else:
            retry = {"failed_trial_callback":
                     optuna.storages.RetryFailedTrialCallback(max_retry=max_retry)}
        return optuna.storages.RDBStorage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval,
            grace_period=grace_period or 2 * heartbeat_interval, **retry)


def trial_point(trial) -> Point | None:
    """The grid point of a trial (its fixed parameters, set when it was enqueued), or None for a
    trial that was not enqueued (it ends at once, see :func:`_objective`)."""
    params = trial.system_attrs.get("fixed_params") or trial.params
    return Point.from_params(params) if "hidden" in params else None


def point_states(study, points: Sequence[Point], max_retry: int = MAX_RETRY) -> dict[Point, str]:
    """``done`` (complete or pruned), ``failed``, ``waiting``, ``running`` or ``todo`` per point."""

    rank = {"todo": 0, "running": 1, "waiting": 2, "failed": 3, "done": 4}
    states = dict.fromkeys(points, "todo")
    deaths: dict[Point, int] = {}
    for t in study.get_trials(deepcopy=False):
        p = trial_point(t)
        if "duplicate_of" in t.user_attrs or p not in states:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            s = "done"
        elif t.state == TrialState.FAIL:
            deaths[p] = deaths.get(p, 0) + 1
            s = "failed" if "error" in t.user_attrs or deaths[p] > max_retry else "todo"
        elif t.state == TrialState.WAITING:
            s = "waiting"
        else:
            s = "running"
        if rank[s] > rank[states[p]]:
            states[p] = s
    return states


def _claimed_before(study, trial) -> int | None:
    """The number of another trial that owns ``trial``'s point, if any: a finished one, or a
    waiting or running one with a lower number."""

    point = trial_point(trial)
    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number or "duplicate_of" in t.user_attrs or trial_point(t) != point:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            return t.number
        if t.state in (TrialState.WAITING, TrialState.RUNNING) and t.number < trial.number:
            return t.number
    return None


@dataclass
class SearchConfig:
    """What a worker runs: the studies (data sets x models) of one grid, and how."""

    data: Sequence[str] = ("jsb",)
    models: Sequence[str] = ("lmn-b",)
    grid: str = "paper"
    out_dir: str = "runs/search"
    storage: str | None = None  # None: default_storage(out_dir)
    base: TrainConfig | None = None  # training settings other than the grid's (None: defaults)
    pruner: str | None = None  # "median" or "none"; None: the base's protocol's
    prune_warmup: int = 50  # epochs before a trial may be pruned
    prune_startup: int = 5  # trials per study that finish before pruning starts
    subset: int | None = None  # the first N sequences of each split (quick runs and tests)
    heartbeat_interval: int = 60
    grace_period: int | None = None  # default 2 x heartbeat_interval
    max_retry: int = MAX_RETRY
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
    name = study_name(data, model, config.grid, config.base.protocol)
    study = optuna.create_study(storage=storage, study_name=name,
                                direction="maximize", pruner=pruner, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(0))  # params are enqueued
    attrs = _study_attrs(config, data, model)
    if not study.user_attrs:
        for key, value in attrs.items():
            study.set_user_attr(key, value)
    else:
        stored = dict(study.user_attrs)
        # a setting added to TrainConfig since the study was made counts at its default
        defaults = asdict(TrainConfig())
        stored["train"] = {**{k: v for k, v in defaults.items() if k in attrs["train"]},
                           **stored.get("train", {})}
        diff = [k for k, v in attrs.items() if stored.get(k) != v]
        if diff:
            raise ValueError(
                f"study {study.study_name!r} in this storage was made with other settings "
                f"({', '.join(diff)}: {', '.join(repr(stored.get(k)) for k in diff)}); "
                "use the same options, or another --out/--storage")
    return study


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
        owner = _claimed_before(study, frozen)
        if owner is not None:
            trial.set_user_attr("duplicate_of", owner)
            raise optuna.TrialPruned(f"duplicate of trial {owner}")
        run_dir = Path(config.out_dir) / study.study_name / point.name
        trial.set_user_attr("run_dir", str(run_dir))
        trial.set_user_attr("worker", f"{socket.gethostname()}:{os.getpid()}")
        # the points that differ in memory size alone share their unrolled network (pret-lmn)
        cache = (config.base.ulm_cache or str(Path(config.out_dir) / "ulm-cache")
                 if "ulm_cache" in get_spec(model).recipe_options else None)
        train_config = replace(config.base, data=study.user_attrs["data"], model=model,
                               hidden=hidden, memory=memory, weight_decay=weight_decay,
                               ulm_cache=cache)

        def report(epoch: int, row: dict) -> None:  # the pruner's input, kept in any case
            trial.report(_score(row, train_config.select), epoch)
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
        return _score(metrics, train_config.select)

    return objective


class _QuietAfterInterrupt(logging.Filter):
    """Drops Optuna's log records once the user interrupted a trial (Ctrl-C): its traceback of
    the ``KeyboardInterrupt`` and "failed with value None" say nothing that the command's own
    line does not."""

    interrupted = False

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.interrupted


_quiet_after_interrupt = _QuietAfterInterrupt()


def _score(row: dict[str, Any], select: str) -> float:
    """A trial's objective (maximised): its validation accuracy (global or per-frame, as the
    run selects its epoch), or minus its NLL."""
    return -row["valid_nll"] if select == "nll" else row[f"valid_{select}"]


def _row(value: float, select: str) -> dict[str, float]:
    """The validation score of a trial's objective ``value`` (:func:`_score`'s inverse)."""
    return {"valid_nll": -value} if select == "nll" else {f"valid_{select}": value}


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
    more than one of 250. None where none of the study's points has finished yet. The times
    are those of the machines that ran the points."""

    data = study.user_attrs["data"]
    sizes, seconds = [], []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        point = trial_point(t)
        if point is not None and "duplicate_of" not in t.user_attrs:
            seconds.append(trial_seconds(t))
            sizes.append(point_params(config.base, data, model, point))
    cost = size_cost(sizes, seconds)
    return {p: None if cost is None else cost(point_params(config.base, data, model, p))
            for p in points}


def size_cost(sizes: Sequence[int], seconds: Sequence[float]
              ) -> Callable[[int], float] | None:
    """The cost of a point of ``n`` parameters, ``c * n ** a``, from finished points of
    ``sizes`` parameters that took ``seconds``: ``a`` the slope of log seconds on log
    parameters (least squares, kept within [0, 2]; 1 where the points are all of one size: an
    epoch's matrix products grow with the parameters), ``c`` such that the finished points'
    costs add up to their seconds. An RNN's or LSTM's time grows about as its parameters, an
    LMN's far less (its small matrices' products do not dominate a step), and early stopping
    moves both; the fit follows each study. None with no finished point that took any time."""
    pairs = [(math.log(n), t) for n, t in zip(sizes, seconds, strict=True) if n > 0 and t > 0]
    if not pairs:
        return None
    xs, ys = [x for x, _ in pairs], [math.log(t) for _, t in pairs]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread
             if spread > 1e-12 else 1.0)
    a = min(max(slope, 0.0), 2.0)
    c = sum(t for _, t in pairs) / sum(math.exp(a * x) for x, _ in pairs)
    return lambda n: c * n ** a


def point_params(base: TrainConfig, data: str, model: str, point: Point) -> int:
    """The number of parameters of ``model`` at ``point`` on ``data``, the rest of its settings
    ``base``'s (:func:`linmem.train.check_size`: counted on the meta device, nothing allocated).
    The projections scale a point's cost with it (:func:`size_cost`)."""
    return check_size(replace(base, data=data, model=model, hidden=point.hidden,
                              memory=point.memory))


def _late(config: SearchConfig, study, model: str, points: Sequence[Point]) -> set[Point]:
    """The points of ``points`` projected to end after ``config.stop_by`` (none without it),
    and every one once it has passed (those without a projection included)."""
    if config.stop_by is None or not points:
        return set()
    left = config.stop_by - time.time()
    if left <= 0:
        return set(points)
    return {p for p, s in point_seconds(config, study, model, points).items()
            if s is not None and s > left}


def run_worker(config: SearchConfig, command: str | None = None,
               log: Callable[[str], None] | None = None) -> dict[str, dict[str, int]]:
    """Work on the studies of ``config`` until every point is done or failed (see the module
    docstring). Returns the count of points per state per study."""

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
            states = point_states(study, points[id(study)], config.max_retry)
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
                point = todo[int(rng.integers(len(todo)))]
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
                    study, points[id(study)], config.max_retry).values())
                select = config.base.select
                log(f"[{study.study_name}] trial {t.number} {trial_point(t).name}: "
                    f"{t.state.name.lower()}"
                    + (f", valid {_score_text(_row(t.value, select), select)}"
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
    return {s.study_name: dict(Counter(point_states(s, points[id(s)], config.max_retry).values()))
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
            states = point_states(study, grid_points(model, config.grid), config.max_retry)
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


def select_per_frame(study, runs_root: str | os.PathLike = ".") -> dict[str, Any] | None:
    """The complete trial with the best validation accuracy under the per-frame mean (ties: the
    lower trial number) and its scores under that definition, for the per-frame column of
    Table 2; None when a complete trial has no per-frame score (older runs whose
    ``metrics.json`` is not under ``runs_root``): no selection from part of the grid."""
    scored = []
    for t in study.get_trials(deepcopy=False):
        if (t.state != TrialState.COMPLETE or "duplicate_of" in t.user_attrs
                or t.value is None or not math.isfinite(t.value)):
            continue
        u = dict(t.user_attrs)
        if "valid_acc_frame" not in u:
            metrics_file = Path(runs_root) / str(u.get("run_dir")) / METRICS
            if not metrics_file.is_file():
                return None
            u = {**read_json(metrics_file), **u}
        scored.append((u["valid_acc_frame"], -t.number, t, u))
    if not scored:
        return None
    valid, _, best, u = max(scored, key=lambda x: x[:2])
    p = trial_point(best)
    return {"point": p.name, "hidden": p.hidden, "memory": p.memory,
            "weight_decay": p.weight_decay, "valid_acc_frame": valid,
            "test_acc_frame": u["test_acc_frame"], "run_dir": u.get("run_dir")}


def study_protocol(attrs: dict[str, Any]) -> str:
    """The training protocol of a study from its user attributes (a study made before protocols
    were named trained under linmem's)."""
    return attrs.get("train", {}).get("protocol", "linmem")


def grid_studies(storage: str, grid: str | None, protocol: str | None = None
                  ) -> Iterator[tuple[dict[str, Any], Any]]:
    """``(user attributes, study)`` of each search study of ``grid`` (None: every grid) trained
    under ``protocol`` (None: any) in ``storage``."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for summary in optuna.get_all_study_summaries(storage):
        attrs = summary.user_attrs
        if "grid" in attrs and (grid is None or attrs["grid"] == grid) and (
                protocol is None or study_protocol(attrs) == protocol):
            yield attrs, optuna.load_study(study_name=summary.study_name, storage=storage)


def trial_seconds(trial) -> float:
    """A finished trial's time as the storage holds it: its run's CPU time, else its wall time,
    where the trial stored them (complete), else the trial's own duration (pruned, failed)."""
    for key in ("cpu_time_s", "wall_time_s"):
        if key in trial.user_attrs:
            return float(trial.user_attrs[key])
    return trial.duration.total_seconds() if trial.duration is not None else 0.0


def search_records(storage: str, grid: str | None = None,
                   runs_root: str | os.PathLike = ".", protocol: str | None = "linmem"
                   ) -> list[dict[str, Any]]:
    """One record per study in ``storage`` (of ``grid``, or every grid; trained under
    ``protocol``, None: any): the configuration selected on validation with its test scores, the
    coverage of the grid, and every trial that was run (points, states and validation
    accuracies only: no test score but the selected one). Fields a trial did not store
    (``command``, the per-frame accuracies) are read from its run's ``metrics.json`` under
    ``runs_root`` when that is there. A study whose runs select their epoch on the per-frame
    accuracy (the ``paper`` protocol) has its global column selected on the global validation
    accuracy all the same, and its per-frame column (``frame_selection``) on the per-frame.
    """

    records = []
    for attrs, study in grid_studies(storage, grid, protocol):
        selects = attrs.get("train", {}).get("select", "acc")
        on_acc = selects == "acc"
        on_frame = selects == "acc_frame"
        points = grid_points(attrs["model"], attrs["grid"])
        states = point_states(study, points)
        trials = []
        for t in study.get_trials(deepcopy=False):
            p = trial_point(t)
            if "duplicate_of" in t.user_attrs or p is None or t.state == TrialState.WAITING:
                continue
            trials.append({"number": t.number, "point": p.name, "hidden": p.hidden,
                           "memory": p.memory, "weight_decay": p.weight_decay,
                           "state": t.state.name.lower(),
                           "valid_acc": t.value if on_acc else t.user_attrs.get("valid_acc"),
                           **({"valid_acc_frame": t.user_attrs.get("valid_acc_frame")}
                              if on_frame else {}),
                           "valid_nll": t.user_attrs.get("valid_nll"),
                           "best_intermediate_valid_acc": (
                               max(t.intermediate_values.values(), default=None) if on_acc
                               else None),
                           "best_intermediate_valid_nll": (
                               None if on_acc or not t.intermediate_values
                               else -max(t.intermediate_values.values())),
                           "epochs": t.user_attrs.get("epochs",
                                                      t.user_attrs.get("pruned_at_epoch")),
                           "wall_time_s": (t.duration.total_seconds()
                                           if t.duration is not None else None)})
        record: dict[str, Any] = {
            "study": study.study_name, "dataset": attrs["data"], "model": attrs["model"],
            "grid": attrs["grid"], "subset": attrs.get("subset"),
            "reduced": _reductions(attrs),
            "selected_on": "valid nll" if selects == "nll" else "valid acc",
            **({"protocol": study_protocol(attrs)} if study_protocol(attrs) != "linmem"
               else {}),
            "grid_points": len(points), "points_done": sum(s == "done" for s in states.values()),
            "points_failed": sum(s == "failed" for s in states.values()),
            "grid_complete": all(s in ("done", "failed") for s in states.values()),
            "trials_run": trials}
        chosen = select(study, "valid_acc" if on_frame else None)
        if chosen is not None and (on_acc or on_frame):  # the per-frame column's own selection
            record["frame_selection"] = select_per_frame(study, runs_root)
        if chosen is not None:
            best, counts = chosen
            p = trial_point(best)
            u = dict(best.user_attrs)
            metrics_file = Path(runs_root) / str(u.get("run_dir")) / METRICS
            if metrics_file.is_file():  # fields a trial did not store (older trials: command)
                u = {**read_json(metrics_file), **expected_fields(metrics_file.parent), **u}
            record.update({
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
                "search_wall_time_s": sum(t["wall_time_s"] or 0.0 for t in trials)})
        records.append(record)
    return records


def _reductions(attrs: dict[str, Any]) -> list[str]:
    """How a study's search was cut down from a full one (its ``--subset`` of the sequences, an
    epoch bound or a patience below the defaults): its figures are not comparable with the
    paper's."""
    train, default = attrs.get("train", {}), TrainConfig()
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
    takes its run's there (:func:`linmem.runs.run_cpu_seconds`) and CPU
    (:func:`linmem.runs.run_machine`, this machine's for a run that ended without a record)
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
        with atomic_write(path, "w") as f:  # one writer's name: the same trials, the same text
            f.writelines(json.dumps({**e, "worker_id": "linmem-export"}, separators=(",", ":"))
                         + "\n" for e in lines)
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
