"""A run again with other seeds: the spread between seeds, with a deadline.

:func:`reseed` trains a finished run's configuration with each of a list of seeds
(``linmem reseed``); a seed that diverges is recorded, not retried, and the others go on.

Where seeds lie, in one place: a reseed writes seed K of a configuration into ``OUT/sK``
(:func:`seed_dir`), one folder per configuration holding its seeds; results/ keeps them flat,
``NAME-sK`` beside the others' (:func:`published_seed_name`, ``linmem publish --name seed``);
:func:`seed_folder_of` reads either.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

from linmem.data import load_polyphonic
from linmem.experiments.run_costs import rerun_cpu_seconds, training_cpu_seconds
from linmem.training.config import TrainConfig
from linmem.training.recipes import train
from linmem.training.runs import CONFIG, DIVERGED, METRICS, end_record, has, read_record
from linmem.training.trainer import TrainingDiverged, with_data_dir

__all__ = ["SeedsDiverged", "published_seed_name", "reseed", "seed_dir", "seed_folder_of"]


def seed_dir(out_dir: str | Path, seed: int) -> Path:
    """The folder of seed ``seed`` of a reseed into ``out_dir``: ``OUT/sK``."""
    return Path(out_dir) / f"s{int(seed)}"


def published_seed_name(run: str | Path) -> str:
    """The name results/ keeps seed run ``run`` (``OUT/sK``, :func:`seed_dir`) under: ``OUT-sK``,
    its configuration's folder and its seed (``jsb-lmn-b/s2`` -> ``jsb-lmn-b-s2``)."""
    run = Path(run)
    return f"{run.parent.name}-{run.name}"


def seed_folder_of(run: str | Path, name: str) -> int | None:
    """The seed of ``run`` when it is a seed folder of configuration ``name`` (``DATA-MODEL``):
    ``name/sK`` as a reseed lays it out or ``name-sK`` as results/ keeps it; else None."""
    run = Path(run)
    if run.parent.name == name and run.name[:1] == "s" and run.name[1:].isdigit():
        return int(run.name[1:])
    tail = run.name[len(name) + 2:]
    return int(tail) if run.name.startswith(f"{name}-s") and tail.isdigit() else None


def reseed(run_dir: str | Path, seeds: Sequence[int], out_dir: str | Path,
           progress: bool = True, data_dir: str | None = None,
           command: str | None = None,
           changes: Mapping[str, Any] | None = None, stop_by: float | None = None,
           log: Callable[[str], None] | None = None) -> dict[int, dict[str, Any]]:
    """The run in ``run_dir`` again with each of ``seeds`` (everything else of its
    ``config.json`` unchanged: data, model, sizes, training settings, but the fields
    ``changes`` sets, e.g. ``{"nonlinearity": "tanh"}``), into ``out_dir/sSEED``, one after
    the other; resumable (a finished seed is not run again). The data are read from
    ``data_dir`` (default: the run's own folder). Returns the metrics of each seed's run by
    seed (the spread between seeds).

    A seed whose training diverges with no epoch to keep does not stop the others: they all
    run, then :class:`SeedsDiverged` names the diverged seeds and carries the finished ones'
    metrics. Such a seed's ``diverged.json`` is its result: run again, ``reseed`` names it
    without training it again (delete the file to retry it).

    With a deadline ``stop_by`` (a Unix time; ``linmem reseed --stop-by``) a seed not finished
    yet starts, or resumes, only if it is projected to end by then: ``run_dir``'s CPU time
    (:func:`linmem.experiments.run_costs.rerun_cpu_seconds`, on the machine that ran it) less
    what the seed's folder has logged already. A seed left so is said to ``log`` and missing
    from the result: the same call later goes on with it, so that a machine's time limit cuts
    no run half-way whose folder would be lost with the machine."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not has(run_dir, CONFIG):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = TrainConfig.from_run(run_dir)
    changes = dict(changes or {})
    unknown = sorted(set(changes) - {f.name for f in fields(TrainConfig)})
    if unknown or "seed" in changes:
        raise ValueError(f"cannot set {', '.join(unknown) or 'seed (pass the seeds)'}: the "
                         f"fields are {', '.join(f.name for f in fields(TrainConfig))}")
    config = replace(config, **changes)  # validated as any TrainConfig
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds must be distinct and at least one, got {list(seeds)}")
    # the seeds' configs name the folder their data came from
    config = with_data_dir(replace(config, data_dir=data_dir or config.data_dir))
    data = load_polyphonic(config.data, root=config.data_dir, progress=progress)
    finished: dict[int, dict[str, Any]] = {}
    diverged: dict[int, str] = {}
    projected = rerun_cpu_seconds(run_dir) if stop_by is not None else 0.0
    for seed in seeds:
        folder, seed_config = seed_dir(out_dir, seed), replace(config, seed=int(seed))
        if _diverged_before(folder, seed_config):
            diverged[seed] = (f"{read_record(folder, DIVERGED)['diverged']} (as "
                              f"{folder / DIVERGED} records: delete it to run it again)")
            continue  # a result, as a finished seed is: not run again on resume
        if stop_by is not None and not has(folder, METRICS):
            left = max(projected - training_cpu_seconds(folder), 0.0)
            if time.time() + left > stop_by:
                if log is not None:
                    end = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() + left))
                    by = time.strftime("%Y-%m-%d %H:%M", time.localtime(stop_by))
                    log(f"seed {seed}: not started, projected to end at {end} "
                        f"({left / 3600:.2f} CPU h left), after the deadline {by}")
                continue
        try:
            finished[seed] = train(seed_config, folder, resume=True, progress=progress,
                                 data=data, command=command)
        except TrainingDiverged as err:
            diverged[seed] = str(err)
    if diverged:
        raise SeedsDiverged("; ".join(f"seed {s}: {why}" for s, why in diverged.items()),
                            finished)
    return finished


def _diverged_before(run_dir: Path, config: TrainConfig) -> bool:
    """Whether ``run_dir`` holds ``config``'s run failed by diverging (``diverged.json``, no
    ``metrics.json``); a run of other settings there is left to :func:`run` to refuse."""
    if end_record(run_dir) != run_dir / DIVERGED or not has(run_dir, CONFIG):
        return False
    saved = TrainConfig.from_run(run_dir)
    return saved.identity() == config.identity()


class SeedsDiverged(TrainingDiverged):
    """Seeds of :func:`reseed` whose training diverged with nothing kept; ``finished`` holds
    the metrics of the seeds that ran to the end."""

    def __init__(self, message: str, finished: dict[int, dict[str, Any]]):
        super().__init__(message)
        self.finished = finished
