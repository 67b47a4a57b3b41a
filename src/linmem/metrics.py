"""Scores of next-frame prediction on piano rolls.

``frame_accuracy`` is the frame-level accuracy of Bay, Ehmann & Downie (2009) as used in multi-pitch
evaluation and in the paper's Table 2; ``frame_nll`` is the negative log-likelihood per time step.
Both accept numpy arrays or torch tensors of shape ``(..., K)`` with an optional ``(...)`` mask of
valid frames. :class:`FrameScores` accumulates the same quantities over batches, so that a score
over a whole split is computed over all its frames, never averaged per batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["FrameScores", "expected_accuracy_from_sums", "expected_frame_accuracy",
           "frame_accuracy", "frame_counts", "frame_nll", "masked_nll", "previous_frame_model",
           "previous_frame_model_scores", "previous_frame_scores", "sample_ratio_sums"]

ArrayLike = np.ndarray | torch.Tensor


def masked_nll(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Training loss: Bernoulli NLL summed over keys, averaged over valid frames (=
    :func:`frame_nll`, differentiable, no input checks).

    Shapes: ``logits`` and ``targets`` ``(B, T, K)``, ``mask`` ``(B, T)``.
    """
    per_frame = F.binary_cross_entropy_with_logits(logits, targets, reduction="none").sum(-1)
    return (per_frame * mask).sum() / mask.sum()


def _as_tensor(x: ArrayLike, name: str) -> torch.Tensor:
    t = torch.as_tensor(x)
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if not torch.isfinite(t.to(torch.float64)).all():
        raise ValueError(f"{name} contains NaN or inf")
    return t


def _flatten(values: ArrayLike, targets: ArrayLike, mask: ArrayLike | None, name: str):
    v, y = _as_tensor(values, name), _as_tensor(targets, "targets")
    if v.shape != y.shape or v.dim() < 1:
        raise ValueError(f"{name} {tuple(v.shape)} and targets {tuple(y.shape)} must match")
    shape = tuple(v.shape)
    v, y = v.reshape(-1, v.shape[-1]), y.reshape(-1, y.shape[-1])
    if mask is not None:
        m = torch.as_tensor(mask).to(torch.bool).to(v.device)
        if tuple(m.shape) != shape[:-1]:
            raise ValueError(f"mask {tuple(m.shape)} must have the shape of {name} without "
                             "the last dimension")
        m = m.reshape(-1)
        v, y = v[m], y[m]
    return v, y.to(v.device)


def _check_binary(targets: torch.Tensor) -> None:
    if targets.numel() and bool(((targets != 0) & (targets != 1)).any()):
        raise ValueError("targets must be binary (0 or 1)")


def frame_counts(probs: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None,
                 threshold: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per valid frame true positives, false positives and false negatives, each ``(N,)`` int64."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"threshold must be in (0, 1], got {threshold!r}")
    p, y = _flatten(probs, targets, mask, "probs")
    if p.numel() and (p.min() < 0 or p.max() > 1):
        raise ValueError("probs must be probabilities in [0, 1] (apply a sigmoid to logits)")
    _check_binary(y)
    pred, truth = p >= threshold, y > 0.5
    tp = (pred & truth).sum(-1)
    fp = (pred & ~truth).sum(-1)
    fn = (~pred & truth).sum(-1)
    return tp, fp, fn


def frame_accuracy(probs: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None,
                   threshold: float = 0.5, average: str = "global") -> float:
    """Frame-level accuracy (Bay, Ehmann & Downie 2009), a fraction in [0, 1].

    ``probs`` are probabilities, not logits: a key is predicted on where ``probs >= threshold``.
    With TP, FP and FN counted per frame over the keys:

    - ``average="global"`` (default, the figure we report): ``sum TP / sum (TP + FP + FN)`` over
      all valid frames;
    - ``average="frame"``: the mean over frames of ``TP / (TP + FP + FN)``, which some earlier
      code reported.

    A frame where target and prediction are both silent adds nothing to either sum, and is left
    out of the ``"frame"`` mean. If the valid frames have no note to score, the accuracy is 1.0
    (nothing was missed or invented); no valid frame at all is an error, as in
    :func:`frame_nll`.

    Args:
        probs: ``(..., K)`` predicted probabilities of each key (numpy array or tensor).
        targets: ``(..., K)`` binary targets, the shape of ``probs``.
        mask: ``(...)`` valid frames (bool or 0/1); ``None``: every frame. Default: ``None``.
        threshold: a key is predicted on where ``probs >= threshold``. Default: 0.5.
        average: ``"global"`` or ``"frame"`` (above). Default: ``"global"``.

    Returns:
        The accuracy, a float in ``[0, 1]``.
    """
    if average not in ("global", "frame"):
        raise ValueError(f"average must be 'global' or 'frame', got {average!r}")
    tp, fp, fn = frame_counts(probs, targets, mask, threshold)
    if tp.numel() == 0:
        raise ValueError("no valid frame to score (empty input or an all-False mask)")
    denom = tp + fp + fn
    if average == "global":
        total = int(denom.sum())
        return float(tp.sum()) / total if total else 1.0
    if average == "frame":
        scored = denom > 0
        if not scored.any():
            return 1.0
        return float((tp[scored].double() / denom[scored].double()).mean())
    raise ValueError(f"average must be 'global' or 'frame', got {average!r}")


def sample_ratio_sums(samples: torch.Tensor, targets: torch.Tensor
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of ``S`` sampled predictions ``samples (S, N, K)`` (0/1) of the frames
    ``targets (N, K)``: the sum over frames of ``TP / (TP + FP + FN)`` and the number of frames
    scored (those not silent in both), each ``(S,)`` float64 (:func:`expected_frame_accuracy`
    over batches)."""
    if samples.dim() != 3 or samples.shape[1:] != targets.shape:
        raise ValueError(f"samples must be (S, {', '.join(map(str, targets.shape))}), got "
                         f"{tuple(samples.shape)}")
    pred, truth = samples > 0.5, (targets > 0.5).unsqueeze(0)
    tp = (pred & truth).sum(-1).double()
    denom = (pred | truth).sum(-1).double()  # TP + FP + FN
    scored = denom > 0
    return (tp / denom.clamp(min=1)).sum(-1), scored.sum(-1).double()


def expected_accuracy_from_sums(sums: torch.Tensor, counts: torch.Tensor
                                ) -> tuple[float, float]:
    """The expected accuracy and its standard error from :func:`sample_ratio_sums`' totals: each
    sample ``s`` gives a per-frame mean ``A_s``; the estimate is their mean, the error their
    standard deviation over ``sqrt(S)``."""
    per_sample = torch.where(counts > 0, sums / counts.clamp(min=1), torch.ones_like(sums))
    n = len(per_sample)
    se = float(per_sample.std() / math.sqrt(n)) if n > 1 else float("nan")
    return float(per_sample.mean()), se


def expected_frame_accuracy(samples: torch.Tensor, targets: torch.Tensor
                            ) -> tuple[float, float]:
    """Expected frame-level accuracy under a model's distribution (Boulanger-Lewandowski et al.
    2012), estimated from ``S`` frames drawn per step, ``samples (S, N, K)`` 0/1 against
    ``targets (N, K)``: the mean over samples and frames of ``TP / (TP + FP + FN)``, frames
    silent in both sample and target left out (as in ``average="frame"``), and the standard
    error of the estimate over the ``S`` samples. Fractions in [0, 1]."""
    return expected_accuracy_from_sums(*sample_ratio_sums(samples, targets))


def previous_frame_scores(sequences) -> dict[str, float]:
    """The "previous frame" baseline: no model, frame ``t + 1`` predicted to be frame ``t``.

    Scored like every next-step model, on the targets ``x_1 .. x_{T-1}`` of each sequence of at
    least two frames: ``acc`` (global, Bay et al.) and ``acc_frame`` (per-frame mean), fractions,
    and ``frames``. It has no likelihood: its predictions are certain, and wrong ones are
    infinitely unlikely.
    """
    previous, following = _frame_pairs(sequences)
    probs, targets = torch.from_numpy(previous), torch.from_numpy(following)
    return {"acc": frame_accuracy(probs, targets),
            "acc_frame": frame_accuracy(probs, targets, average="frame"),
            "frames": len(targets)}


def _frame_pairs(sequences) -> tuple[np.ndarray, np.ndarray]:
    """Each frame ``x_t`` beside its successor ``x_{t+1}``, over every sequence of two frames or
    more: ``(previous, next)``, float64 ``(N, K)`` each."""
    usable = [np.asarray(s, dtype=np.float64) for s in sequences if len(s) >= 2]
    if not usable:
        raise ValueError("no sequence of two frames or more to score")
    return (np.concatenate([s[:-1] for s in usable]), np.concatenate([s[1:] for s in usable]))


def previous_frame_model(sequences, smoothing: float = 1.0) -> np.ndarray:
    """The per-key model of the previous frame, two parameters a key: ``p[b, k] = P(x_{t+1,k} =
    1 | x_{t,k} = b)``, fitted on ``sequences`` (a training split) by counting, each count
    smoothed by ``smoothing`` (add-one: a key never seen on still has a probability); ``(2, K)``.
    """
    previous, following = _frame_pairs(sequences)
    on = np.stack([((1 - previous) * following).sum(0), (previous * following).sum(0)])
    seen = np.stack([(1 - previous).sum(0), previous.sum(0)])
    return (on + smoothing) / (seen + 2 * smoothing)


def previous_frame_model_scores(model: np.ndarray, sequences) -> dict[str, float]:
    """:func:`previous_frame_model`'s ``model`` scored on ``sequences`` as every next-step model:
    ``nll`` (nats per frame, :func:`frame_nll`), ``acc`` and ``acc_frame`` (its probabilities
    thresholded at 0.5, fractions), and ``frames``."""
    previous, following = _frame_pairs(sequences)
    probs = np.where(previous > 0.5, model[1], model[0])
    logits = torch.from_numpy(np.log(probs) - np.log1p(-probs))
    targets = torch.from_numpy(following)
    p = torch.from_numpy(probs)
    return {"nll": frame_nll(logits, targets), "acc": frame_accuracy(p, targets),
            "acc_frame": frame_accuracy(p, targets, average="frame"), "frames": len(targets)}


def frame_nll(logits: ArrayLike, targets: ArrayLike, mask: ArrayLike | None = None) -> float:
    """Negative log-likelihood per time step in nats: the Bernoulli NLL of ``sigmoid(logits)``
    summed over the keys and averaged over valid frames (the figure the literature reports).

    Args:
        logits: ``(..., K)`` predicted log-odds of each key.
        targets: ``(..., K)`` binary targets, the shape of ``logits``.
        mask: ``(...)`` valid frames; ``None``: every frame. Default: ``None``.

    Returns:
        The NLL in nats per frame (float64 arithmetic).

    Raises:
        ValueError: no valid frame, NaN or inf in the inputs, or mismatched shapes.
    """
    z, y = _flatten(logits, targets, mask, "logits")
    if z.shape[0] == 0:
        raise ValueError("no valid frame to score")
    z = z.to(torch.float64)
    return float(F.binary_cross_entropy_with_logits(z, y.to(z.dtype), reduction="sum")
                 / z.shape[0])


THRESHOLD_GRID = tuple(round(0.05 * i, 2) for i in range(1, 11))  # 0.05, 0.10, ..., 0.50


@dataclass
class FrameScores:
    """Accumulates accuracy and NLL over batches: ``update`` per batch, then ``compute``.

    Besides the accuracy at ``threshold`` it counts the global accuracy at every threshold of
    ``grid``, so that a decision threshold can be chosen on a validation split (a diagnostic;
    the reported accuracy is the one at ``threshold``).
    """

    threshold: float = 0.5
    grid: tuple[float, ...] = THRESHOLD_GRID
    tp: int = 0
    denom: int = 0
    frame_ratio_sum: float = 0.0
    scored_frames: int = 0
    nll_sum: float = 0.0
    frames: int = 0
    grid_tp: list[int] = field(default_factory=list)
    grid_denom: list[int] = field(default_factory=list)
    grid_ratio_sum: list[float] = field(default_factory=list)
    grid_scored: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        for t in (self.threshold, *self.grid):
            if not 0.0 < t <= 1.0:
                raise ValueError(f"thresholds must be in (0, 1], got {t!r}")

    @torch.no_grad()
    def update(self, logits: torch.Tensor, targets: torch.Tensor,
               mask: torch.Tensor | None = None, nll_logits: torch.Tensor | None = None
               ) -> None:
        """Scores ``logits`` (``(..., K)``, the key marginals' log-odds) against ``targets``;
        the NLL is that of ``nll_logits`` when given (a joint model's conditionals, whose
        Bernoulli NLL is its exact likelihood), else of ``logits``.

        The counts at every threshold of ``grid`` come from one pass, not one per threshold:
        each key's probability is placed among the sorted thresholds (``bucketize``), and a
        histogram of those places per frame, apart for the keys on and off in the target, gives
        by its cumulative sums each frame's true and false positives at each threshold (the
        same integers as :func:`frame_counts` at that threshold): summed, the global accuracy;
        as ratios, the per-frame mean."""
        z, y = _flatten(logits, targets, mask, "logits")
        zn = z if nll_logits is None else _flatten(nll_logits, targets, mask, "nll_logits")[0]
        _check_binary(y)
        probs = torch.sigmoid(z.to(torch.float64))
        truth = y > 0.5
        pred = probs >= self.threshold
        tp = (pred & truth).sum(-1)
        denom = (pred | truth).sum(-1)  # TP + FP + FN
        self.tp += int(tp.sum())
        self.denom += int(denom.sum())
        scored = denom > 0
        self.frame_ratio_sum += float((tp[scored].double() / denom[scored].double()).sum())
        self.scored_frames += int(scored.sum())
        self.nll_sum += float(F.binary_cross_entropy_with_logits(
            zn.to(torch.float64), y.to(torch.float64), reduction="sum"))
        self.frames += z.shape[0]
        if not self.grid_tp:
            zeros = [0] * len(self.grid)
            self.grid_tp, self.grid_denom = list(zeros), list(zeros)
            self.grid_ratio_sum, self.grid_scored = [0.0] * len(self.grid), list(zeros)
        if not self.grid:
            return
        order = sorted(range(len(self.grid)), key=self.grid.__getitem__)
        bounds = torch.tensor([self.grid[i] for i in order], dtype=torch.float64,
                              device=probs.device)
        # place: how many thresholds are <= p, so that p >= the j-th smallest iff place > j
        place = torch.bucketize(probs, bounds, right=True)
        n, rows = len(order) + 1, place.shape[0]
        frame = 2 * n * torch.arange(rows, device=place.device)[:, None]
        hist = torch.bincount((place + n * truth + frame).reshape(-1),
                              minlength=2 * n * rows).reshape(rows, 2, n)
        # above[:, c, b]: the frame's keys (off, on in the target) placed at b or higher
        above = hist.flip(-1).cumsum(-1).flip(-1)
        positives = hist[:, 1].sum(-1)
        for j, i in enumerate(order):  # keys predicted on at the j-th smallest threshold
            g_tp, g_fp = above[:, 1, j + 1], above[:, 0, j + 1]
            g_denom = g_fp + positives  # TP + FP + FN, FN = positives - TP
            self.grid_tp[i] += int(g_tp.sum())
            self.grid_denom[i] += int(g_denom.sum())
            on = g_denom > 0
            self.grid_ratio_sum[i] += float((g_tp[on].double() / g_denom[on].double()).sum())
            self.grid_scored[i] += int(on.sum())

    def compute(self) -> dict:
        """``acc`` (global), ``acc_frame`` (per-frame mean), ``nll`` (nats/step), ``frames``,
        ``acc_at``: ``{threshold: global accuracy}`` over ``grid``, and ``acc_frame_at``: the
        per-frame mean likewise."""
        if self.frames == 0:
            raise ValueError("no valid frame was scored")
        return {
            "acc": self.tp / self.denom if self.denom else 1.0,
            "acc_frame": (self.frame_ratio_sum / self.scored_frames
                          if self.scored_frames else 1.0),
            "nll": self.nll_sum / self.frames,
            "frames": self.frames,
            "acc_at": {t: (tp / d if d else 1.0)
                       for t, tp, d in zip(self.grid, self.grid_tp, self.grid_denom, strict=True)},
            "acc_frame_at": {t: (r / k if k else 1.0) for t, r, k in zip(
                self.grid, self.grid_ratio_sum, self.grid_scored, strict=True)},
        }
