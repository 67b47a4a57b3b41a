"""What a run cost in CPU time, as its files record it: the whole run's, its epochs', what a run
in flight still takes, and what another seed of it would take; and the CPU it ran on. The
searches' projections, the progress tables and ``linmem reseed`` read them; a run records its
own times (:mod:`linmem.training.trainer`), nothing here is needed to train one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from linmem._io import read_json
from linmem.training.runs import (
    CONFIG,
    ENDINGS,
    EXPECTED,
    METRICS,
    PRETRAINING,
    ULM,
    end_record,
    ended,
    log_rows,
)

__all__ = [
    "epochs_cpu_seconds",
    "epochs_due_cpu_seconds",
    "mean_epoch_cpu_seconds",
    "rerun_cpu_seconds",
    "run_cpu_seconds",
    "run_machine",
    "scoring_cpu_seconds",
    "training_cpu_seconds",
]


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

