"""A run directory: the one place that names its files, claims it for one process, reads and
writes its checkpoints and records, and says how a run ended.

A run directory (``linmem train --out RUN``) holds::

    config.json       the TrainConfig (CONFIG)
    log.jsonl         one line per epoch (LOG)
    last.pt           the latest checkpoint, and last.prev.pt the one before it (LAST, LAST_PREV)
    best.pt           the checkpoint selected on validation (BEST)
    metrics.json      the scores and provenance of a finished run (METRICS)
    diverged.json     why a run ended without scores (DIVERGED)
    pretraining.json  a pretrained run's pretraining record (PRETRAINING)
    expected.json     the expected accuracy (``linmem evaluate --expected``; EXPECTED)
    init.pt           a pretrained run's initial weights (INIT)
    ulm/              a pret-LMN run's unrolled network, itself a run directory (ULM)
    memory.npz        a pret-LMN run's linear autoencoder, fitted on the ULM's states (MEMORY)
    .lock             held by the process that writes the run (LOCK)
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import platform
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch

from linmem._check import check_device
from linmem._io import atomic_write, read_json

__all__ = [
    "BEST",
    "CONFIG",
    "DIVERGED",
    "ENDINGS",
    "EXPECTED",
    "FAILURES",
    "INIT",
    "LAST",
    "LAST_PREV",
    "LOCK",
    "LOG",
    "MEMORY",
    "METRICS",
    "PRETRAINING",
    "RUN_FILES",
    "ULM",
    "CheckpointError",
    "RunDirBusy",
    "RunDirClaim",
    "RunsRoot",
    "collect_metrics",
    "end_record",
    "ended",
    "expected_fields",
    "failed_on",
    "has",
    "load_checkpoint",
    "log_fields",
    "log_rows",
    "read_record",
    "records_only",
    "resume_checkpoint",
    "run_under",
    "save_checkpoint",
    "save_last",
    "trained",
    "write_log",
]

CONFIG = "config.json"
LOG = "log.jsonl"
LAST = "last.pt"
LAST_PREV = "last.prev.pt"
BEST = "best.pt"
METRICS = "metrics.json"
DIVERGED = "diverged.json"
PRETRAINING = "pretraining.json"
EXPECTED = "expected.json"
INIT = "init.pt"
ULM = "ulm"
MEMORY = "memory.npz"
LOCK = ".lock"
ENDINGS = (METRICS, DIVERGED)  # a run has ended when it wrote one of these
# where a run that ended without scores (diverged.json) failed: in its training (a NaN or inf
# loss or validation output), or when the checkpoint chosen on validation was scored on a
# split; a pretrained run's pretraining failed in the same ways ("pretraining test")
FAILURES = ("training", "valid", "test")
RUN_FILES = (CONFIG, LOG, LAST, LAST_PREV, BEST, METRICS, DIVERGED, PRETRAINING, EXPECTED, INIT,
             LOCK)


def end_record(run_dir: str | os.PathLike) -> Path | None:
    """The file that says a run ended (``metrics.json``, else ``diverged.json``), or None for a
    run in flight, killed, or never started."""
    return next((Path(run_dir) / n for n in ENDINGS if (Path(run_dir) / n).is_file()), None)


def failed_on(record: dict[str, Any]) -> str:
    """Where the run of a ``diverged.json`` record failed: one of :data:`FAILURES`, prefixed
    "pretraining " where its pretraining did. Records written before they said so name it in
    their message: "the checkpoint chosen on validation" was scored again on validation (the
    same batches, finite when it was chosen) and then on the test split, which is where it
    failed."""
    if "failed_on" in record:
        return record["failed_on"]
    why = record.get("diverged", "")
    stage = "test" if "the checkpoint chosen on validation" in why else "training"
    return f"pretraining {stage}" if why.startswith("its pretraining:") else stage


def ended(run_dir: str | os.PathLike) -> bool:
    """Whether a run has ended (:func:`end_record`)."""
    return end_record(run_dir) is not None


def has(run_dir: str | os.PathLike, name: str) -> bool:
    """Whether the run in ``run_dir`` has its file ``name`` (one of :data:`RUN_FILES`)."""
    return (Path(run_dir) / name).is_file()


def read_record(run_dir: str | os.PathLike, name: str, default: Any = None) -> Any:
    """The JSON record ``name`` (:data:`CONFIG`, :data:`METRICS`, :data:`DIVERGED`,
    :data:`PRETRAINING`, :data:`EXPECTED`) of the run in ``run_dir``, or ``default`` when it
    has none: how the modules above read a run's records."""
    path = Path(run_dir) / name
    return read_json(path) if path.is_file() else default


RunsRoot = str | os.PathLike | Sequence[str | os.PathLike]


def run_under(runs_root: RunsRoot, run_dir: str | os.PathLike) -> Path:
    """A search trial's run directory ``run_dir`` (relative to where the search ran) under
    ``runs_root``: one folder, or several (a report of searches that ran in different places)
    searched in order; the first folder's where none holds it."""
    roots = [runs_root] if isinstance(runs_root, (str, os.PathLike)) else list(runs_root)
    if not roots:
        raise ValueError("no runs root given")
    paths = [Path(root) / run_dir for root in roots]
    return next((p for p in paths if p.is_dir()), paths[0])


def trained(run_dir: str | os.PathLike) -> bool:
    """Whether a run finished with its selected model here: ``metrics.json`` and ``best.pt``.
    A run's records published (:func:`publish`) and copied back onto another machine have the
    first without the second: they say a model was trained, not where it is."""
    return (Path(run_dir) / METRICS).is_file() and (Path(run_dir) / BEST).is_file()


def records_only(run_dir: str | os.PathLike) -> bool:
    """Whether ``run_dir`` holds a finished run's records without its checkpoints (a published
    copy, :func:`publish`): nothing to resume from or to load."""
    folder = Path(run_dir)
    return (folder / METRICS).is_file() and not any((folder / n).is_file()
                                                     for n in (BEST, LAST, LAST_PREV))


def log_rows(run_dir: str | os.PathLike) -> list[dict]:
    """The per-epoch rows of a run's ``log.jsonl``; [] when it has none."""
    log = Path(run_dir) / LOG
    if not log.is_file():
        return []
    rows = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{log}: line {number} is not valid JSON ({err.msg}, column "
                                 f"{err.colno})") from None
    return rows


def log_fields(run_dir: Path) -> dict:
    """From a run's per-epoch ``log.jsonl``: the best validation NLL of any epoch and the
    validation accuracy at that epoch (the selected checkpoint maximises accuracy instead)."""
    rows = log_rows(run_dir)
    if not rows:
        return {}
    fields = {}
    selected = [r["epoch"] for r in rows if r.get("best")]
    if selected and all("epoch_time_s" in r for r in rows):  # training time to the checkpoint
        fields["minutes_to_best"] = sum(r["epoch_time_s"] for r in rows
                                        if r["epoch"] <= selected[-1]) / 60
    epochs = [e for e in rows if e.get("valid_nll") is not None and e.get("valid_acc") is not None]
    if epochs:
        best = min(epochs, key=lambda e: e["valid_nll"])
        fields.update(valid_nll_best=best["valid_nll"], valid_acc_at_best_nll=best["valid_acc"],
                      best_nll_epoch=best["epoch"])
    return fields
























def expected_fields(run_dir: str | os.PathLike) -> dict:
    """The expected accuracy (Boulanger-Lewandowski et al. 2012) of a run's best checkpoint
    where ``linmem evaluate RUN --expected N --out RUN/expected.json`` wrote it:
    ``test_acc_expected`` and its standard error (and the validation's); {} otherwise."""
    path = Path(run_dir) / EXPECTED
    if not path.is_file():
        return {}
    scores = read_json(path)
    if scores.get("checkpoint", "best") != "best":
        return {}
    return {f"{split}_acc_expected{suffix}": scores[split][f"acc_expected{suffix}"]
            for split in ("valid", "test") if "acc_expected" in scores.get(split, {})
            for suffix in ("", "_se")}


def collect_metrics(paths: Iterable[str | os.PathLike], diverged: bool = False) -> list[dict]:
    """The ``metrics.json`` records under ``paths`` (run directories or folders holding them;
    a run's own steps, such as a pretraining run inside it, are not runs of their own),
    sorted by path, each with its ``run`` (the directory), its batch size, chunk, activation,
    dropout and transposition (from ``config.json``) and, where the run's ``log.jsonl`` is
    there, the training minutes to the selected epoch, its best validation NLL and the
    validation accuracy at that epoch.
    ``diverged``: also the runs that failed by diverging (``diverged.json``, no scores; its
    ``diverged`` field says why)."""
    ends = ENDINGS
    names = ends if diverged else ends[:1]

    def is_run(folder: Path) -> bool:  # ended or not (config.json is its first file)
        return any((folder / n).is_file() for n in (*ends, CONFIG))

    records = []
    for root in paths:
        root = Path(root)
        folders = [root] if is_run(root) else sorted(
            {f.parent for n in ends for f in root.rglob(n)
             # a run, not a step inside a run (pretraining), whether that run has ended or not
             if not any(is_run(d) for d in f.parent.parents
                        if d.is_relative_to(root) and d != root)})
        for folder in folders:
            f = next((folder / n for n in names if (folder / n).is_file()), None)
            if f is None:  # a run that diverged, not asked for
                continue
            config = (json.loads((f.parent / CONFIG).read_text())
                      if (f.parent / CONFIG).is_file() else {})
            record = {**{k: config.get(k) for k in ("batch_size", "chunk", "nonlinearity",
                                                    "dropout", "transpose")},
                      **json.loads(f.read_text()), **log_fields(f.parent),
                      **expected_fields(f.parent)}
            record["run"] = str(f.parent)
            records.append(record)
    if not records:
        raise FileNotFoundError(f"no {' or '.join(names)} under " + ", ".join(map(str, paths)))
    return sorted(records, key=lambda r: r["run"])


class RunDirBusy(RuntimeError):
    """Another process holds the run directory (:class:`RunDirClaim`)."""


class RunDirClaim:
    """``with RunDirClaim(run_dir) as claim``: the one process that writes a run directory.

    :meth:`acquire` takes an exclusive OS lock (``fcntl.flock``) on ``run_dir/.lock``, and writes
    the holder (process, host, start time) into it; a second process that asks for the same
    directory gets :class:`RunDirBusy` naming the holder. :meth:`release` removes the file; the
    operating system drops the lock when the holder ends in any other way (``kill -9``
    included), so a stale file cannot block a ``--resume``. Without ``fcntl`` (Windows) there is
    no lock."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self.file = None

    def acquire(self) -> None:
        """Lock the (existing) directory; a no-op when this claim holds it already."""
        if self.file is not None:
            return
        try:
            import fcntl
        except ImportError:  # not POSIX
            return
        path = self.run_dir / LOCK
        while True:
            file = open(path, "a+")  # held open as long as the claim
            try:
                fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                file.seek(0)
                holder = file.read().strip() or "another process"
                file.close()
                raise RunDirBusy(f"{self.run_dir} is in use by {holder}: wait for it to end, "
                                 "or choose another output folder") from None
            try:  # the holder before removed the file as it let go: lock the one there now
                same = os.stat(path).st_ino == os.fstat(file.fileno()).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            file.close()
        try:
            file.seek(0)
            file.truncate()
            file.write(f"linmem process {os.getpid()} on {platform.node()} (since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')})\n")
            file.flush()
        except OSError as err:  # a full disk: the run could write nothing anyway
            with contextlib.suppress(OSError):
                file.close()
            raise type(err)(err.errno, err.strerror, str(path)) from None
        self.file = file

    def release(self) -> None:
        """Remove the lock file and let go (a killed holder leaves the file, not the lock)."""
        if self.file is not None:
            (self.run_dir / LOCK).unlink(missing_ok=True)
            self.file.close()  # closing the descriptor drops the lock
            self.file = None

    def __enter__(self) -> RunDirClaim:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class CheckpointError(ValueError):
    """A checkpoint file that cannot be read (truncated, empty, not a checkpoint)."""


def load_checkpoint(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint written by :func:`linmem.training.trainer.train_loop` (tensors, numbers and
    strings only: ``weights_only``), its tensors on ``device``; :class:`CheckpointError` naming
    the file when it cannot be read, ``ValueError`` when this machine has no such device."""
    device = check_device(device)
    try:
        return torch.load(path, map_location=device, weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:  # the weights-only unpickler refused something
        fault = _checkpoint_fault(path, err)
        if fault.startswith("the file is truncated"):  # a real checkpoint, with objects in it
            fault = ("it holds objects other than tensors, numbers and strings, so it was not "
                     "written by linmem and is not loaded (that could run code)")
        raise CheckpointError(f"{path}: unreadable checkpoint: {fault}") from None
    except Exception as err:  # truncated, empty or damaged files fail in many ways
        raise CheckpointError(f"{path}: unreadable checkpoint: {_checkpoint_fault(path, err)}"
                              ) from None


def _checkpoint_fault(path: str | Path, err: Exception) -> str:
    """What is wrong with a checkpoint that ``torch.load`` could not read, in a few words (never
    torch's advice to load it with ``weights_only=False``)."""
    try:
        if os.path.getsize(path) == 0:
            return "the file is empty"
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        head = b"PK"
    if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save's zip, or its older pickle
        return (f"it is not a PyTorch checkpoint at all (one is a zip archive; this file begins "
                f"with {head[:12]!r})")
    return ("the file is truncated or damaged, as a copy cut short or a disk that filled while "
            f"it was written leave it ({type(err).__name__})")


def save_checkpoint(obj: Any, path: Path) -> None:
    """``torch.save(obj)`` to ``path``, atomically. A write the disk refuses (full, over quota)
    is its ``OSError``, naming ``path``, and a Ctrl-C (or SIGTERM) during the write is its
    ``KeyboardInterrupt``: torch's zip writer would hide either behind a ``RuntimeError``
    ("unexpected pos") of its own end-of-file record. ``path`` keeps what it held."""
    with atomic_write(path) as f:
        try:
            torch.save(obj, f)
        except RuntimeError as err:
            if isinstance(err.__context__, (OSError, KeyboardInterrupt)):
                raise err.__context__ from None
            raise


def save_last(obj: Any, run_dir: Path) -> None:
    """``last.pt``, keeping the one before as ``last.prev.pt``: a checkpoint damaged after its
    write (a full disk, a crash of the file system) costs one epoch, never the run."""
    last, previous, new = run_dir / LAST, run_dir / LAST_PREV, run_dir / ".last.pt.new"
    save_checkpoint(obj, new)
    if last.is_file():
        os.replace(last, previous)
    os.replace(new, last)


def resume_checkpoint(run_dir: Path, device: torch.device) -> dict[str, Any] | None:
    """The newest readable of ``last.pt`` and ``last.prev.pt`` (``None`` if neither exists),
    saying on stderr when it falls back."""
    last, previous = run_dir / LAST, run_dir / LAST_PREV
    try:
        return load_checkpoint(last, device)
    except FileNotFoundError:
        if not previous.is_file():
            return None  # a run that never finished an epoch: it starts
        reason = "missing"
    except CheckpointError as err:
        if not previous.is_file():
            raise CheckpointError(f"{err}; no earlier checkpoint (last.prev.pt) to resume "
                                  "from: delete the run directory to start again") from None
        reason = "unreadable"
    ckpt = load_checkpoint(previous, device)
    print(f"linmem: {last} is {reason}; resuming from {previous.name} (epoch "
          f"{ckpt['state']['epoch']})", file=sys.stderr, flush=True)
    return ckpt


def write_log(run_dir: Path, history: list[dict]) -> None:
    with atomic_write(run_dir / LOG, "w") as f:
        for row in history:
            f.write(json.dumps(row) + "\n")




