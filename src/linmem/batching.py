"""Batches of piano rolls for next-step prediction: a padded batch of (input, target) pairs with
its mask (:class:`Batch`, :func:`collate`, also a ``DataLoader``'s ``collate_fn``), length buckets
that keep padding low (:func:`bucket_batches`, :func:`iterate_batches`), transposition. Re-exported
by :mod:`linmem.data`, beside the data sets they batch."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from linmem._check import check_int

__all__ = ["EVAL_MAX_RATIO", "Batch", "bucket_batches", "collate", "iterate_batches",
           "next_step_pairs", "padding_fraction", "transpose"]

# the evaluation's batches pad no sequence beyond 1.5x its length: the fastest of 1.25, 1.5 and 2
# on the four data sets (benchmarks/eval_batching.py, results/speed/eval_batching.txt)
EVAL_MAX_RATIO = 1.5


@dataclass
class Batch:
    """A padded batch of next-step prediction pairs, batch first.

    ``inputs[b, t]`` is frame ``t`` and ``targets[b, t]`` frame ``t + 1`` of sequence ``b``;
    ``mask[b, t]`` is True for the ``lengths[b]`` valid steps.
    """

    inputs: torch.Tensor  # (B, T, 88) float
    targets: torch.Tensor  # (B, T, 88) float
    mask: torch.Tensor  # (B, T) bool
    lengths: torch.Tensor  # (B,) int64, on the CPU (as pack_padded_sequence wants)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.inputs.to(device), self.targets.to(device), self.mask.to(device),
                     self.lengths)

    def windows(self, size: int) -> Iterator[Batch]:
        """The batch cut along time into consecutive windows of ``size`` steps (the last one
        shorter), for truncated backpropagation through time: a sequence's ``lengths`` in a
        window are its valid steps there (0 once it has ended)."""
        size = check_int("size", size)
        for start in range(0, self.inputs.shape[1], size):
            stop = min(start + size, self.inputs.shape[1])
            yield Batch(self.inputs[:, start:stop], self.targets[:, start:stop],
                        self.mask[:, start:stop], (self.lengths - start).clamp(0, stop - start))


def transpose(batch: Batch, shifts: Sequence[int]) -> Batch:
    """Shift each sequence of ``batch`` by ``shifts[b]`` semitones (positive = up). Notes pushed
    off the keyboard are dropped; inputs and targets move together (data augmentation)."""
    def shift(rolls: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(rolls)
        for b, k in enumerate(shifts):
            k = int(k)
            if k > 0:
                out[b, :, k:] = rolls[b, :, :-k]
            elif k < 0:
                out[b, :, :k] = rolls[b, :, -k:]
            else:
                out[b] = rolls[b]
        return out

    if len(shifts) != batch.inputs.shape[0]:
        raise ValueError(f"{len(shifts)} shifts for a batch of {batch.inputs.shape[0]}")
    return Batch(shift(batch.inputs), shift(batch.targets), batch.mask, batch.lengths)


def next_step_pairs(sequences: Sequence[np.ndarray]) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(frames 0..T-2, frames 1..T-1)`` per sequence; sequences shorter than 2 are dropped."""
    return [(s[:-1], s[1:]) for s in sequences if len(s) >= 2]


def collate(sequences: Sequence[np.ndarray | torch.Tensor], dtype: torch.dtype = torch.float32
            ) -> Batch:
    """Pad next-step pairs of ``sequences`` (arrays, or CPU tensors such as
    :class:`PolyphonicMusic`'s items: a ``DataLoader``'s ``collate_fn``) into one
    :class:`Batch`."""
    pairs = next_step_pairs(sequences)
    if not pairs:
        raise ValueError("no sequence of length >= 2 to make next-step pairs from")
    lengths = torch.tensor([len(x) for x, _ in pairs], dtype=torch.int64)
    steps = int(lengths.max())
    inputs = torch.zeros(len(pairs), steps, pairs[0][0].shape[1], dtype=dtype)
    targets = torch.zeros_like(inputs)
    for b, (x, y) in enumerate(pairs):
        inputs[b, : len(x)] = torch.from_numpy(np.asarray(x, dtype=np.float32))
        targets[b, : len(y)] = torch.from_numpy(np.asarray(y, dtype=np.float32))
    mask = torch.arange(steps)[None, :] < lengths[:, None]
    return Batch(inputs, targets, mask, lengths)


def bucket_batches(
    lengths: Sequence[int], batch_size: int, shuffle: bool = True, seed: int = 0,
    max_ratio: float | None = None,
) -> list[list[int]]:
    """Group sequence indices into batches of similar length.

    Without shuffling: sorted by length, chunked; with ``max_ratio``, a batch also ends before a
    sequence longer than ``max_ratio`` times its shortest, so that no batch pads its sequences
    by more than that factor (evaluation: MuseData's lengths run from tens of steps to 4273, and
    64 of them padded to the longest computed 2.3x the steps of its validation split). With
    shuffling, the sort key is the length plus a uniform jitter of one batch's worth of length
    range, so batches differ from epoch to epoch while padding stays small; the batch order is
    shuffled too. Deterministic for a given ``seed``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_ratio is not None and (shuffle or not max_ratio >= 1):
        raise ValueError(f"max_ratio must be >= 1 and applies without shuffle, got {max_ratio!r}")
    lengths = np.asarray(lengths, dtype=np.float64)
    if shuffle:
        rng = np.random.default_rng(seed)
        spread = (lengths.max() - lengths.min()) * batch_size / max(len(lengths), 1)
        order = np.argsort(lengths + rng.uniform(0, spread + 1e-9, len(lengths)), kind="stable")
        batches = [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
        return [batches[i] for i in rng.permutation(len(batches))]
    order = np.argsort(lengths, kind="stable")
    if max_ratio is None:
        return [order[i : i + batch_size].tolist() for i in range(0, len(order), batch_size)]
    batches: list[list[int]] = [[]]
    for i in order.tolist():
        if batches[-1] and (len(batches[-1]) == batch_size
                            or lengths[i] > max_ratio * lengths[batches[-1][0]]):
            batches.append([])
        batches[-1].append(i)
    return batches if batches[0] else []


def padding_fraction(lengths: Sequence[int], batches: Sequence[Sequence[int]]) -> float:
    """Share of padded steps among all steps computed for ``batches``."""
    lengths = np.asarray(lengths)
    padded = sum(len(b) * int(lengths[b].max()) for b in batches)
    return 1.0 - float(lengths.sum()) / padded if padded else 0.0


def iterate_batches(
    sequences: Sequence[np.ndarray],
    batch_size: int,
    shuffle: bool = False,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    max_ratio: float | None = EVAL_MAX_RATIO,
) -> Iterator[Batch]:
    """Yield padded next-step :class:`Batch` es of similar-length sequences (see
    :func:`bucket_batches`; without ``shuffle``, none longer than ``max_ratio`` times its
    shortest: the evaluation's batches)."""
    usable = [s for s in sequences if len(s) >= 2]
    ratio = None if shuffle else max_ratio
    for idx in bucket_batches([len(s) for s in usable], batch_size, shuffle, seed, ratio):
        yield collate([usable[i] for i in idx], dtype)
