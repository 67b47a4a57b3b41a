"""The Optuna storage that holds a search's studies: its URL (SQLite by default, PostgreSQL for
workers on several machines), opened once with a clear error, with heartbeats and the retry of
failed trials, and its calls kept whole under Ctrl-C (an interrupt waits for the call under way,
so that a study is never left half written)."""

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from linmem._extras import require
from linmem.experiments.grids import MAX_RETRY

optuna = require("optuna", "a search")

__all__ = [
    "StorageError",
    "caused_by_interrupt",
    "check_storage",
    "default_storage",
    "interrupts_between_storage_calls",
    "make_storage",
    "sqlite_path",
    "storage_url",
]


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
                           "'linear-memory-networks[search]'") from None
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
