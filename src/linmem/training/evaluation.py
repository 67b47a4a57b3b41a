"""Scoring a model on sequences (accuracy, NLL, frames: :func:`evaluate`) and the models of a
run: the one a config describes (and whether it fits this machine, :func:`check_size`), the one
a run starts from and the ones it saved (:func:`load_run_model`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from linmem._check import check_device
from linmem.batching import EVAL_MAX_RATIO, Batch, iterate_batches
from linmem.metrics import THRESHOLD_GRID, FrameScores
from linmem.models import build_model
from linmem.training.config import TrainConfig
from linmem.training.runs import (
    CONFIG,
    METRICS,
    CheckpointError,
    has,
    load_checkpoint,
    read_record,
)

__all__ = ["NonFiniteOutputs", "build_run_model", "check_size", "divergence_note", "evaluate",
           "load_run_model", "model_of", "run_threshold"]


class NonFiniteOutputs(ValueError):
    """A model's outputs are NaN or infinite (its weights, or its state over a long sequence,
    diverged)."""


@torch.no_grad()
def evaluate(model: torch.nn.Module, sequences: Sequence[np.ndarray], batch_size: int = 64,
             device: str | torch.device = "cpu", accuracy: bool = True,
             max_ratio: float | None = EVAL_MAX_RATIO,
             thresholds: Sequence[float] = THRESHOLD_GRID) -> dict[str, Any]:
    """Accuracy (global and per-frame), NLL per step and frame count of next-step prediction over
    ``sequences``, accumulated over every valid frame (not averaged per batch). A model with a
    joint readout (``likelihood_logits``, the NADE models) is scored on its exact likelihood,
    and without ``accuracy`` on that alone (``nll`` and ``frames``): no marginals drawn. Its
    ``evaluation_logits``, when it has one, gives both from one pass of the core. Batches hold
    up to ``batch_size`` sequences of lengths within ``max_ratio`` of each other (None: any).
    ``acc_at`` holds the global accuracy at each of ``thresholds`` (none: an empty dict; the
    training's epochs skip them, only the final scores choose a threshold), ``acc_frame_at``
    the per-frame mean likewise."""
    model.eval()
    scores = FrameScores(grid=tuple(thresholds))
    joint = hasattr(model, "likelihood_logits")
    for batch in iterate_batches(sequences, batch_size, dtype=next(model.parameters()).dtype,
                                 max_ratio=max_ratio):
        batch = batch.to(device)
        if hasattr(model, "evaluation_logits"):
            logits, exact = model.evaluation_logits(batch.inputs, batch.targets, accuracy)
        elif joint:
            exact = model.likelihood_logits(batch.inputs, batch.targets)
            logits = model(batch.inputs) if accuracy else None
        else:
            logits, exact = model(batch.inputs), None
        logits = exact if logits is None else logits
        for out in (logits, exact):
            if out is not None and not torch.isfinite(out).all():
                raise NonFiniteOutputs(
                    f"the model's outputs are NaN or inf on a batch of sequences of up to "
                    f"{batch.mask.shape[1]} steps (its weights or its state diverged)"
                    + divergence_note(model, batch))
        scores.update(logits, batch.targets, batch.mask, nll_logits=exact)
    result = scores.compute()
    return result if accuracy or not joint else {"nll": result["nll"],
                                                 "frames": result["frames"]}


def run_threshold(run_dir: str | Path) -> float | None:
    """The decision threshold a run chose on validation (``valid_threshold`` of its
    ``metrics.json``: the grid's first best global accuracy there), or None (no record of one)."""
    value = read_record(run_dir, METRICS, {}).get("valid_threshold")
    return None if value is None else float(value)


def divergence_note(model: torch.nn.Module, batch: Batch) -> str:
    """The model's own account of NaN or inf outputs on ``batch`` (an LMN's: where its memory
    overflowed, and the remedy), as a clause for the error; "" where it has none."""
    note = getattr(model, "divergence_note", None)
    return note(batch.inputs, batch.mask) if note is not None else ""


def load_run_model(run_dir: str | Path, which: str = "best",
                   device: str | torch.device = "cpu") -> tuple[torch.nn.Module, TrainConfig]:
    """The model saved in ``run_dir`` and its config: ``which`` is ``"best"``, ``"last"`` or
    ``"init"`` (a pretrained run's initial weights, :func:`linmem.training.recipes.pretrain`'s)."""
    run_dir, device = Path(run_dir), check_device(device)
    if not has(run_dir, CONFIG):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = TrainConfig.from_run(run_dir)
    path = run_dir / f"{which}.pt"
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist")
    try:
        state = load_checkpoint(path, device)
    except CheckpointError as err:  # and what of the run's other checkpoint
        raise CheckpointError(f"{err}{_other_checkpoint(run_dir, which)}") from None
    model = model_of(config)
    try:
        model.load_state_dict(state["model"] if "model" in state else state)
    except (RuntimeError, KeyError, TypeError) as err:  # another model's weights
        why = str(err).strip().splitlines()
        why = next((line.strip() for line in why[1:] if line.strip()), why[0] if why else "")
        raise CheckpointError(f"{path} does not fit {run_dir / CONFIG} (the two are of different "
                              f"runs, or one was edited: {why.rstrip('.')})") from None
    return model.to(device), config


def _other_checkpoint(run_dir: Path, which: str) -> str:
    """A clause on the run's other checkpoint (``best`` or ``last``) when ``which`` cannot be
    read: whether it can (and how to score it), or is damaged too; "" where there is none."""
    other = "last" if which == "best" else "best"
    path = run_dir / f"{other}.pt"
    if which not in ("best", "last") or not path.is_file():
        return ""
    try:
        load_checkpoint(path)
    except CheckpointError:
        return f"; {path.name} is unreadable too"
    return f"; {path.name} reads (linmem evaluate --which {other} scores it)"


def build_run_model(config: TrainConfig, train_seqs: Sequence[np.ndarray]) -> torch.nn.Module:
    """The model :func:`train_loop` starts from before any pretraining: built under
    ``config.seed``, its readout bias at the keys' base rates in ``train_seqs`` when
    ``config.init_bias``."""
    torch.manual_seed(config.seed)
    model = model_of(config)
    if config.init_bias:
        model.init_output_bias(torch.from_numpy(np.concatenate(train_seqs).mean(0)))
    return model


def model_of(config: TrainConfig) -> torch.nn.Module:
    """The model ``config`` describes (its registry name and options), as built: untrained."""
    return build_model(config.model, **asdict(config.model_options()))


def check_size(config: TrainConfig, memory_fraction: float = 0.5) -> int:
    """The number of parameters of ``config``'s model, counted without allocating it (on the
    meta device); ``ValueError`` when the model cannot be built at that size or when training
    it (weights, gradients and Adam's two moments) would take more than ``memory_fraction`` of
    this machine's memory."""
    try:
        with torch.device("meta"):
            n_params = sum(p.numel() for p in model_of(config).parameters())
    except (RuntimeError, OverflowError, ValueError, TypeError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"{config.model} cannot be built with hidden={config.hidden}, "
                         f"memory={config.memory}: {why}") from None
    need = 4 * n_params * 4  # float32: weights, gradients, Adam's m and v
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not POSIX: no check
        return n_params
    if need > memory_fraction * total:
        raise ValueError(f"{config.model} with hidden={config.hidden}, memory={config.memory} "
                         f"has {n_params:,} parameters: training it needs about "
                         f"{need / 2**30:.0f} GiB, this machine has {total / 2**30:.0f} GiB")
    return n_params
