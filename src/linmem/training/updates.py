"""The updates of a training run: its optimizer, one update on a batch (or one per window of it:
truncated backpropagation through time), and the batches of an epoch, drawn from the seed and
the epoch alone so that a resumed run repeats them (:mod:`linmem.training.trainer` runs them)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch

from linmem.batching import Batch, bucket_batches, collate, transpose
from linmem.training.config import TrainConfig

__all__ = ["batch_updates", "chunked_steps", "epoch_plan", "epoch_seed", "make_optimizer",
           "train_step", "training_batch"]


def make_optimizer(params, config: TrainConfig) -> torch.optim.Optimizer:
    """Adam (the paper's) or SGD with momentum, at ``config.lr`` with L2 ``weight_decay``.

    Adam is torch's fused implementation where every parameter allows it (floating point, on
    the CPU or a CUDA device): one kernel for all of them instead of a dozen operations per
    tensor, a third of the time (0.26 against 0.80 ms an update for LMN-B(250, 250) on one
    core), the same update to float rounding. A checkpoint saved by the unfused Adam resumes
    with it (its ``param_groups`` carry the choice), so a run keeps its own arithmetic."""
    params = list(params)
    if config.optimizer == "sgd":
        return torch.optim.SGD(params, lr=config.lr, momentum=config.momentum,
                               weight_decay=config.weight_decay)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return torch.optim.Adam(params, lr=config.lr, weight_decay=config.weight_decay,
                            fused=fused or None)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch,
               clip: float | None = None, scale: float = 1.0,
               norms: list[float] | None = None) -> float | None:
    """One update on ``batch`` (already on the model's device): the model's
    ``training_loss(batch)`` (the masked NLL; the RNN-RBM's contrastive-divergence cost) times
    ``scale`` (:meth:`TrainConfig.loss_scale`), backward, optional gradient-norm clipping,
    optimizer step. Returns the unscaled loss, or None (and no update) when it is not finite.
    ``norms``: when given, the gradient's norm before clipping is appended to it (a
    diagnostic: :func:`linmem.experiments.analyses.epoch_replay`)."""
    return _update(model, optimizer, model.training_loss(batch), clip, scale, norms)


def chunked_steps(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch,
                  chunk: int, clip: float | None = None, scale: float = 1.0,
                  norms: list[float] | None = None) -> Iterator[tuple[float | None, Batch]]:
    """Truncated backpropagation through time over ``batch``: one update per window of
    ``chunk`` steps (the model's ``chunk_loss(window, state)``, times ``scale``), the state
    carried from window to window without gradient. Yields ``(unscaled loss or None if not
    finite, window)`` after each update."""
    state = None
    for window in batch.windows(chunk):
        loss, state = model.chunk_loss(window, state)  # state: detached by the model
        yield _update(model, optimizer, loss, clip, scale, norms), window


def batch_updates(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch,
                  config: TrainConfig, norms: list[float] | None = None
                  ) -> Iterable[tuple[float | None, Batch]]:
    """The updates of ``config``'s training on ``batch``: one on the whole sequences, or one
    per window of ``config.chunk`` steps (:func:`chunked_steps`). Yields ``(loss or None if not
    finite, the part of the batch it was computed on)``; ``norms``: :func:`train_step`'s."""
    scale = config.loss_scale(batch.targets.shape[-1])
    if config.chunk is None:
        return [(train_step(model, optimizer, batch, config.clip, scale, norms), batch)]
    return chunked_steps(model, optimizer, batch, config.chunk, config.clip, scale, norms)


def epoch_plan(config: TrainConfig, lengths: Sequence[int],
               epoch: int) -> tuple[list[list[int]], np.ndarray]:
    """The training's batches in ``epoch`` (lists of indices of the training sequences, whose
    ``lengths`` are given) and each sequence's transposition shift, both drawn from the seed and
    the epoch alone (a resumed run repeats them)."""
    seed = epoch_seed(config.seed, epoch)
    batches = bucket_batches(lengths, config.batch_size, shuffle=True, seed=seed)
    shifts = np.random.default_rng(seed).integers(
        -config.transpose, config.transpose + 1, size=len(lengths))
    return batches, shifts


def training_batch(train_seqs: Sequence[np.ndarray], idx: Sequence[int], shifts: np.ndarray,
                   config: TrainConfig) -> Batch:
    """The batch of the training sequences ``idx`` (a batch of :func:`epoch_plan`),
    transposed by their ``shifts`` when ``config.transpose``."""
    batch = collate([train_seqs[i] for i in idx])
    return transpose(batch, shifts[idx]) if config.transpose else batch


def _update(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss: torch.Tensor,
            clip: float | None, scale: float = 1.0,
            norms: list[float] | None = None) -> float | None:
    if not torch.isfinite(loss):
        return None
    optimizer.zero_grad(set_to_none=True)
    (loss * scale if scale != 1.0 else loss).backward()
    if clip is not None:
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    elif norms is not None:
        norm = torch.nn.utils.get_total_norm(
            [p.grad for p in model.parameters() if p.grad is not None])
    if norms is not None:
        norms.append(float(norm))
    optimizer.step()
    return loss.item()


def epoch_seed(seed: int, epoch: int) -> int:
    """The seed of epoch ``epoch``'s batches and shifts in a run of seed ``seed``."""
    return int(np.random.SeedSequence([seed, epoch]).generate_state(1)[0])
