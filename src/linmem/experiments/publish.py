"""Publishing a run into ``results/``: its records (not its checkpoints, unless asked), copied
atomically, so that a committed result carries its configuration, log and scores."""

from __future__ import annotations

import os
from pathlib import Path

from linmem._io import atomic_write
from linmem.training.runs import (
    BEST,
    CONFIG,
    DIVERGED,
    EXPECTED,
    LOG,
    METRICS,
    PRETRAINING,
    ULM,
    ended,
)

__all__ = ["RECORDS", "publish"]


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

