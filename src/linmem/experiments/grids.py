"""The grids of the paper's searches and their points, and the Optuna storage that holds a grid's
studies: one study per (data set, model, grid), named ``DATA-MODEL-GRID`` (``@PROTOCOL`` for a
protocol other than linmem's), one trial per point, and the state of each point across the
workers that share a study (:func:`point_states`: the rules are :mod:`linmem.experiments.search`'s).
"""

from __future__ import annotations

import _thread
import contextlib
import functools
import inspect
import logging
import os
import signal
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from linmem.models import get_spec
from linmem.training.config import LEGACY_PROTOCOL, departures_text

__all__ = [
    "FINISHED",
    "GRIDS",
    "MAX_RETRY",
    "PAPER_LMN_SIZES",
    "PAPER_WEIGHT_DECAYS",
    "Grid",
    "Point",
    "StorageError",
    "check_grid",
    "check_storage",
    "claimed_before",
    "default_storage",
    "grid_points",
    "make_storage",
    "point_states",
    "sqlite_path",
    "storage_url",
    "study_name",
    "trial_point",
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
    # the reduced grid for the three larger data sets (evidence in results/search.md):
    # each model's size selected on JSB Chorales' full grid with the paper's sizes around it,
    # and the two weight decays selected there (1e-5: five models; 1e-7: pret-LMN-B)
    "reduced": Grid((250, 500, 750), ((100, 250), (250, 250), (250, 500)), (1e-5, 1e-7)),
    # the paper protocol's grid for MuseData, Nottingham and Piano-midi.de
    # (results/paper-protocol/README.md): what JSB Chorales' full grid selected under that
    # protocol (RNN 250, LSTM 750 units; LMN-A (50, 50), LMN-B and pret-LMN-B (250, 250); no
    # decay, or 1e-6), one LMN pair between; 4 points per RNN-like model, 6 per LMN
    "paper-long": Grid((250, 750), ((50, 50), (100, 250), (250, 250)), (0.0, 1e-6)),
    # the NADE models on JSB Chorales: RNN-NADE's sizes (Boulanger-Lewandowski et al.
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


def study_name(data: str, model: str, grid: str, protocol: str,
               overrides: dict[str, Any] | None = None) -> str:
    """``DATA-MODEL-GRID``, ``@PROTOCOL`` after it for a protocol other than
    :data:`~linmem.training.config.LEGACY_PROTOCOL` (whose studies were named before protocols
    had names; the studies of both protocols share a storage), and ``+FIELD=VALUE`` for each
    field in which the study departs from its protocol (``TrainConfig.protocol_overrides``) or
    bounds the memory (``memory_bound``), so that a study with a departure never takes the name
    of one without it: ``piano-lmn-b-paper-long@paper+clip=0.0568``,
    ``jsb-lmn-a-paper@paper+memory_bound=0.99``."""
    suffix = "" if protocol == LEGACY_PROTOCOL else f"@{protocol}"
    return f"{data}-{model}-{grid}{suffix}" + departures_text(overrides or {})


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
    """An ``optuna.storages.RDBStorage`` with heartbeats and the retry of failed trials, whose
    calls a Ctrl-C lets end (:func:`interrupts_between_storage_calls`) and whose SQLAlchemy
    loggers drop the records a Ctrl-C caused."""

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
        storage = _Storage(
            url, engine_kwargs=engine_kwargs, heartbeat_interval=heartbeat_interval,
            grace_period=grace_period or 2 * heartbeat_interval, **retry)
    _hush_interrupts(storage.engine)
    return storage


class _Deferral(threading.local):
    """How deep the main thread is in storage calls, and whether a Ctrl-C came meanwhile."""

    depth = 0
    pending = False


_deferral = _Deferral()


@contextlib.contextmanager
def _storage_call() -> Iterator[None]:
    """A storage call that a Ctrl-C does not cut (under :func:`interrupts_between_storage_calls`):
    the ``KeyboardInterrupt`` is raised when the outermost call has returned. Cut, a call can
    leave its connection inside a transaction that holds SQLite's lock, so that the trial's
    own "failed" write waits out the busy timeout (120 s) and fails, or make SQLAlchemy log a
    traceback (both seen in CI)."""
    _deferral.depth += 1
    try:
        yield
    finally:
        _deferral.depth -= 1
        if not _deferral.depth and _deferral.pending:
            _deferral.pending = False
            raise KeyboardInterrupt


def _deferring(method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        with _storage_call():
            return method(self, *args, **kwargs)
    return call


class _Storage(optuna.storages.RDBStorage):
    """``RDBStorage`` whose calls a Ctrl-C lets end (:func:`_storage_call`): the public ones
    and the private ones, which Optuna's ``_CachedStorage`` (the storage a study holds) calls
    itself: ``_get_trials`` for every ``study.get_trials``, ``_create_new_trial`` for every
    ``ask``, ``_get_stale_trial_ids`` (CI caught a Ctrl-C cutting one of them: the trial's
    "failed" write then waited out the busy timeout)."""


for _name, _method in vars(optuna.storages.RDBStorage).items():
    if not _name.startswith("__") and inspect.isfunction(_method):
        setattr(_Storage, _name, _deferring(_method))
del _name, _method


@contextlib.contextmanager
def interrupts_between_storage_calls() -> Iterator[None]:
    """Within the block, a Ctrl-C (SIGINT) that comes during a call of a storage from
    :func:`make_storage` raises its ``KeyboardInterrupt`` once the call has returned, and at
    once anywhere else (a second Ctrl-C during the call: at once too), or, when it lands in a
    finalizer that would drop it, once the finalizer has returned. Python's own handler only,
    in the main thread; a handler set by the program is left alone."""
    if (threading.current_thread() is not threading.main_thread()
            or signal.getsignal(signal.SIGINT) is not signal.default_int_handler):
        yield
        return

    def on_sigint(signum, frame):
        if _deferral.depth and not _deferral.pending:
            _deferral.pending = True
        else:
            signal.default_int_handler(signum, frame)

    def on_unraisable(unraisable: Any) -> None:
        # The handler ran inside a finalizer (a __del__, a weakref callback: SQLAlchemy runs one
        # when an ORM state is dropped), whose exceptions Python prints and drops: the Ctrl-C
        # would be lost and the search go on. Deliver it again from another thread, so that
        # the handler runs once the finalizer (and this hook) have returned.
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Timer(0.05, _thread.interrupt_main, (signal.SIGINT,)).start()
        else:
            previous_hook(unraisable)

    previous_hook = sys.unraisablehook
    signal.signal(signal.SIGINT, on_sigint)
    sys.unraisablehook = on_unraisable
    try:
        yield
    finally:
        sys.unraisablehook = previous_hook
        signal.signal(signal.SIGINT, signal.default_int_handler)
        _deferral.pending = False


def caused_by_interrupt(exc_info: Any) -> bool:
    """Whether a ``KeyboardInterrupt`` is in the chain (cause or context) of a log record's
    exception (``record.exc_info``)."""
    err = exc_info[1] if isinstance(exc_info, tuple) else None
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, KeyboardInterrupt):
            return True
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return False


class _NotOfAnInterrupt(logging.Filter):
    """Drops a record whose exception a Ctrl-C caused: SQLAlchemy's "Error closing cursor" with
    its traceback when the Ctrl-C lands in a query (it closes the connection, then fails to
    close the cursor on it), which says nothing that the command's own line does not."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not caused_by_interrupt(record.exc_info)


_not_of_an_interrupt = _NotOfAnInterrupt()


def _hush_interrupts(engine: Any) -> None:
    """Adds :data:`_not_of_an_interrupt` to the loggers of a SQLAlchemy ``engine`` and its pool
    (they write to stderr when no logging is configured)."""
    for logger in (getattr(engine, "logger", None),
                   getattr(getattr(engine, "pool", None), "logger", None)):
        logger = getattr(logger, "logger", logger)  # SQLAlchemy's InstanceLogger (echo=True)
        if isinstance(logger, logging.Logger) and _not_of_an_interrupt not in logger.filters:
            logger.addFilter(_not_of_an_interrupt)


def trial_point(trial) -> Point | None:
    """The grid point of a trial (its fixed parameters, set when it was enqueued), or None for a
    trial that was not enqueued (it ends at once, see :func:`_objective`)."""
    params = trial.system_attrs.get("fixed_params") or trial.params
    return Point.from_params(params) if "hidden" in params else None


def point_states(study, points: Sequence[Point], max_retry: int = MAX_RETRY,
                 retry_failed: bool = False) -> dict[Point, str]:
    """``done`` (complete or pruned), ``failed``, ``waiting``, ``running`` or ``todo`` per point.

    A point whose trial raised an error is failed; with ``retry_failed`` it is to do again once
    (its second error fails it): what ``linmem search --retry-failed`` gives a point that a
    since-mended fault failed."""

    rank = {"todo": 0, "running": 1, "waiting": 2, "failed": 3, "done": 4}
    states = dict.fromkeys(points, "todo")
    deaths: dict[Point, int] = {}
    errors: dict[Point, int] = {}
    for t in study.get_trials(deepcopy=False):
        p = trial_point(t)
        if "duplicate_of" in t.user_attrs or p not in states:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            s = "done"
        elif t.state == TrialState.FAIL:
            deaths[p] = deaths.get(p, 0) + 1
            if "error" in t.user_attrs:
                errors[p] = errors.get(p, 0) + 1
            given_up = errors.get(p, 0) > (1 if retry_failed else 0)
            s = "failed" if given_up or deaths[p] > max_retry else "todo"
        elif t.state == TrialState.WAITING:
            s = "waiting"
        else:
            s = "running"
        if rank[s] > rank[states[p]]:
            states[p] = s
    return states


def claimed_before(study, trial) -> int | None:
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
