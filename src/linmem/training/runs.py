"""A run directory: the one place that names its files, claims it for one process, reads and
writes its checkpoints and records, and says how a run ended and what CPU time it took.

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
    "RECORDS",
    "RUN_FILES",
    "ULM",
    "CheckpointError",
    "RunDirBusy",
    "RunDirClaim",
    "RunsRoot",
    "collect_metrics",
    "end_record",
    "ended",
    "epochs_cpu_seconds",
    "epochs_due_cpu_seconds",
    "expected_fields",
    "failed_on",
    "has",
    "load_checkpoint",
    "log_fields",
    "log_rows",
    "mean_epoch_cpu_seconds",
    "publish",
    "read_record",
    "records_only",
    "rerun_cpu_seconds",
    "resume_checkpoint",
    "run_cpu_seconds",
    "run_machine",
    "run_under",
    "save_checkpoint",
    "save_last",
    "scoring_cpu_seconds",
    "trained",
    "training_cpu_seconds",
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


def _seconds(record: dict[str, Any], cpu: str, wall: str) -> float:
    """The CPU time ``record[cpu]`` where it was recorded (runs from commit 8b4fc25 on), else
    the wall time ``record[wall]`` (one thread per run: not below the CPU time, above it when
    other processes shared the cores)."""
    return record.get(cpu, record.get(wall, 0.0))


def run_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds a run's training took as its files record them: a finished run's
    (``metrics.json``: every session's training and the final scoring; ``diverged.json``: that
    of a run that failed by diverging, its last attempt's), else its epochs' in
    ``log.jsonl`` (training and validation; epochs cut short by a killed worker are not
    there), and the pretraining's (``pretraining.json``) once; 0 for a run that has written
    neither; and the scoring of its expected accuracy (``expected.json``, ``linmem evaluate
    --expected``), a process of its own. The CPU time where it is recorded, else the wall time
    (one thread per run).

    The unrolled network of a pret-LMN run counts for the run that trained it, every session's
    (:func:`_ulm_before_seconds`): in flight, ``run_dir/ulm``'s epochs; once pretrained, what
    its earlier, killed processes spent on it beside the recipe's own clock."""
    return training_cpu_seconds(run_dir) + scoring_cpu_seconds(run_dir)


def scoring_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds of a run's expected accuracy (``expected.json``; its wall time where it
    did not record them); 0 without one."""
    expected = Path(run_dir) / EXPECTED
    return _seconds(read_json(expected), "cpu_time_s", "wall_time_s") if expected.is_file() \
        else 0.0


def _epochs_seconds(rows: list[dict]) -> float:
    """The CPU seconds of ``log.jsonl`` rows, each one's wall time where it did not record it."""
    return sum(_seconds(row, "epoch_cpu_s", "epoch_time_s") for row in rows)


def epochs_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds of a run's logged epochs (``log.jsonl``: training and validation; the
    wall time where they did not record it)."""
    return _epochs_seconds(log_rows(Path(run_dir)))


def mean_epoch_cpu_seconds(run_dir: str | os.PathLike) -> float | None:
    """The mean CPU seconds of a run's logged epochs (:func:`epochs_cpu_seconds` over their
    number): what an epoch of its size costs on its data set, however long early stopping let
    it run. None for a run that has logged no epoch."""
    rows = log_rows(Path(run_dir))
    return _epochs_seconds(rows) / len(rows) if rows else None


def epochs_due_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds a run in flight still takes at the least, unless it diverges or a pruner
    stops it: early stopping ends it ``patience`` epochs after its best epoch so far at the
    soonest (its ``epochs`` limit at the latest; both from ``config.json``), each epoch at the
    mean CPU time of its logged ones (their wall time where they did not record it). 0 for a
    run that has ended or has logged no epoch."""
    rows = log_rows(run_dir)
    if not rows or ended(run_dir) or not (Path(run_dir) / CONFIG).is_file():
        return 0.0
    config = read_json(Path(run_dir) / CONFIG)  # the budget as the run resolved it
    last = rows[-1]["epoch"]
    best = max((r["epoch"] for r in rows if r.get("best")), default=0)
    due = max(0, min(config["patience"] - (last - best), config["epochs"] - last))
    return due * _epochs_seconds(rows) / len(rows)  # the rows read above, not the file again


def training_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """:func:`run_cpu_seconds` less the expected accuracy's scoring."""
    run_dir = Path(run_dir)
    epochs = epochs_cpu_seconds(run_dir)
    if (run_dir / PRETRAINING).is_file():
        record = read_json(run_dir / PRETRAINING)
        pretraining = _seconds(record, "cpu_time_s", "wall_time_s")
        before = _ulm_before_seconds(run_dir, record)
    else:  # not pretrained, or a ULM stage in flight
        ulm = run_dir / ULM
        pretraining, before = 0.0, run_cpu_seconds(ulm) if ulm.is_dir() else 0.0
    end = end_record(run_dir)
    if end is None:
        return epochs + pretraining + before
    total = _seconds(read_json(end), "cpu_time_s", "wall_time_s")
    # the pretraining runs inside the training's clock when one session did both (its wall
    # time then exceeds the pretraining's and the epochs'); otherwise it is added
    return before + (total if total >= pretraining + epochs else total + pretraining)


def run_machine(run_dir: str | os.PathLike, unfinished: str | None = None) -> str | None:
    """The CPU a run ended on, as its ``metrics.json`` (or ``diverged.json``) records it
    (:func:`linmem._io.machine`: model name, x86 family and model); None for a run recorded
    before machines were, ``unfinished`` for a run with neither file (in flight, or killed:
    this machine's CPU, where the caller knows that the run is this machine's)."""
    for name in ENDINGS:
        path = Path(run_dir) / name
        if path.is_file():
            cpu = (read_json(path).get("machine") or {}).get("cpu")
            return str(cpu) if cpu else None
    return unfinished


def rerun_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds a run of ``run_dir``'s configuration with another seed would take
    (``linmem reseed``'s projection), as ``run_dir``'s files record them: its training's
    (:func:`training_cpu_seconds`), and for a pretrained run that read its unrolled network
    from a cache, that network's too (``pretraining.json``'s ``ulm_cpu_time_s``, or
    ``ulm_wall_time_s`` in older records): another seed trains its own. The times are those of
    the machine that ran ``run_dir``."""
    run_dir = Path(run_dir)
    total = training_cpu_seconds(run_dir)
    if (run_dir / PRETRAINING).is_file():
        record = read_json(run_dir / PRETRAINING)
        ulm = record.get("ulm_cpu_time_s") or record.get("ulm_wall_time_s") or 0.0
        total = max(total, epochs_cpu_seconds(run_dir) + ulm)
    return total


def _ulm_before_seconds(run_dir: Path, record: dict[str, Any]) -> float:
    """The CPU seconds a pret-LMN run spent on its unrolled network in processes that ended
    before its pretraining did (the recipe's ``cpu_time_s`` holds the last one's): recorded
    since the fields ``ulm_cpu_time_s`` and ``ulm_cpu_here_s`` were; for earlier records whose
    ULM is the run's own (``run_dir/ulm``), the ULM's logged CPU time beyond the recipe's (a
    lower bound: the recipe's time also holds the autoencoder's fit); else 0."""
    if "ulm_cpu_time_s" in record:
        return max(record["ulm_cpu_time_s"] - record["ulm_cpu_here_s"], 0.0)
    # a cache entry is named by its key (:func:`linmem.training.recipes.ulm_key`)
    own = run_dir / ULM
    if Path(record.get("ulm_run", ULM)).name != ULM or not (own / METRICS).is_file():
        return 0.0
    ulm = _seconds(read_json(own / METRICS), "cpu_time_s", "wall_time_s")
    return max(ulm - _seconds(record, "cpu_time_s", "wall_time_s"), 0.0)


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


RECORDS = (CONFIG, LOG, METRICS, DIVERGED, PRETRAINING, EXPECTED)  # what results/ keeps of a run


def publish(run_dir: str | os.PathLike, dest: str | os.PathLike,
            checkpoint: bool = False) -> list[Path]:
    """Copy an ended run's records into ``dest`` (a folder of ``results/``): the files of
    :data:`RECORDS` it has, those of its unrolled network (``ulm/``: a pret-LMN run's), and with
    ``checkpoint`` its selected checkpoint (``best.pt``). Each file is written atomically; a
    record ``dest`` holds that the run no longer has (a ``metrics.json`` where the run now
    diverged) is removed. ``ValueError`` for a run that has not ended (nothing to publish).
    Returns the files written."""
    run_dir, dest = Path(run_dir), Path(dest)
    if not ended(run_dir):
        raise ValueError(f"{run_dir}: the run has not ended (no {METRICS} or {DIVERGED})")
    wanted = [*RECORDS, *(f"{ULM}/{name}" for name in (CONFIG, LOG, METRICS))]
    if checkpoint:
        wanted.append(BEST)
    written = []
    for name in wanted:
        source, target = run_dir / name, dest / name
        if source.is_file():
            target.parent.mkdir(parents=True, exist_ok=True)
            with atomic_write(target) as f:
                f.write(source.read_bytes())
            written.append(target)
        elif target.is_file():
            target.unlink()
    return written
