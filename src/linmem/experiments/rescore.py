"""Scoring a trained run again (``linmem evaluate``): its checkpoint on the splits asked for,
with the accuracy at other decision thresholds and the expected accuracy when asked, and the
provenance of the scoring itself."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from linmem._io import command_line, git_commit, provenance
from linmem.data import data_checksum, load_polyphonic
from linmem.models import expected_accuracy
from linmem.training.evaluation import evaluate, load_run_model, run_threshold

__all__ = ["SPLITS", "score_run"]

SPLITS = ("train", "valid", "test")


def score_run(run_dir: str | os.PathLike, splits: Sequence[str] = SPLITS, which: str = "best",
              data_dir: str | None = None, device: str = "cpu", expected: int | None = None,
              seed: int = 0, thresholds: Sequence[float] = (),
              command: str | None = None) -> dict[str, Any]:
    """The scores of RUN_DIR's ``which`` checkpoint (``best`` or ``last``) on ``splits``, in
    percent: global and per-frame accuracy, NLL per step, frames scored; ``acc_at`` the global
    accuracy at each of ``thresholds`` and, with the valid split, ``valid_threshold`` (the grid's
    first best there, as training chooses it) and each split's accuracy at it;
    with the threshold the run chose on validation when it recorded one (``run_threshold``),
    each split's global and per-frame accuracy at it (``acc_at_run_threshold``,
    ``acc_frame_at_run_threshold``);
    ``acc_expected`` (± ``acc_expected_se``) over ``expected`` frames drawn per step with
    ``seed`` (``sampling_seed``). With the command, commit, data checksum, wall and CPU time
    of the scoring, and as its ``seed`` the run's own training seed (the model scored: a run
    trained with seed 0 says 0, not null).

    Raises ``FileNotFoundError`` for a run without that checkpoint, ``DataError`` for missing
    data, ``ValueError`` for an unknown split."""
    started, cpu_started = time.perf_counter(), time.process_time()
    unknown = set(splits) - set(SPLITS)
    if unknown or not splits:
        raise ValueError(f"splits must be among {list(SPLITS)}, got {list(splits)}")
    model, config = load_run_model(run_dir, which, device)
    data = load_polyphonic(config.data, root=data_dir or config.data_dir)
    checksum = data_checksum(config.data, data_dir or config.data_dir)
    result: dict[str, Any] = {"run_dir": str(run_dir), "checkpoint": which,
                              "dataset": config.data, "model": config.model}
    tuned = run_threshold(run_dir)  # scored in the same pass as the grid's thresholds
    grid = tuple(dict.fromkeys((*thresholds, *(() if tuned is None else (tuned,)))))
    for name in splits:
        scores = evaluate(model, data[name], config.eval_batch_size, device, thresholds=grid)
        result[name] = {"acc": 100 * scores["acc"], "acc_frame": 100 * scores["acc_frame"],
                        "nll": scores["nll"], "frames": scores["frames"]}
        if thresholds:
            result[name]["acc_at"] = {str(t): 100 * scores["acc_at"][t] for t in thresholds}
        if tuned is not None and "acc" in scores:
            result[name].update(acc_at_run_threshold=100 * scores["acc_at"][tuned],
                                acc_frame_at_run_threshold=100 * scores["acc_frame_at"][tuned])
            result["run_threshold"] = tuned
        if expected is not None:
            acc, se = expected_accuracy(model, data[name], expected, seed, device=device)
            result[name].update(acc_expected=100 * acc, acc_expected_se=100 * se,
                                expected_samples=expected, expected_seed=seed)
    if thresholds and "valid" in splits:  # the grid's first best on validation, as train does
        chosen = max(result["valid"]["acc_at"], key=result["valid"]["acc_at"].get)
        result["valid_threshold"] = float(chosen)
        for name in splits:
            result[name]["acc_at_valid_threshold"] = result[name]["acc_at"][chosen]
    if expected is not None:
        result["sampling_seed"] = seed
    result.update(provenance(command or command_line(), git_commit(), config.seed, checksum,
                             time.perf_counter() - started, device))
    result["cpu_time_s"] = time.process_time() - cpu_started
    return result
