"""Frame accuracy and NLL against brute-force loops over frames and keys."""

import math

import numpy as np
import pytest
import torch

from linmem.metrics import FrameScores, frame_accuracy, frame_nll


def brute_counts(probs, targets, threshold=0.5):
    rows = []
    for p_frame, y_frame in zip(probs, targets, strict=True):
        tp = fp = fn = 0
        for p, y in zip(p_frame, y_frame, strict=True):
            on = p >= threshold
            tp += on and y == 1
            fp += on and y == 0
            fn += (not on) and y == 1
        rows.append((tp, fp, fn))
    return rows


@pytest.fixture
def sample():
    rng = np.random.default_rng(0)
    targets = (rng.random((40, 12)) < 0.25).astype(np.uint8)
    targets[:5] = 0  # silent frames
    probs = np.clip(targets * 0.5 + rng.random((40, 12)) * 0.6, 0, 1)
    probs[:3] = 0.1  # silent and correctly predicted silent
    return probs, targets


def test_global_and_frame_average_match_brute_force(sample):
    probs, targets = sample
    rows = brute_counts(probs, targets)
    tp = sum(r[0] for r in rows)
    denom = sum(sum(r) for r in rows)
    assert frame_accuracy(probs, targets) == pytest.approx(tp / denom, abs=1e-15)
    ratios = [r[0] / sum(r) for r in rows if sum(r) > 0]
    assert frame_accuracy(probs, targets, average="frame") == pytest.approx(np.mean(ratios))
    assert frame_accuracy(torch.tensor(probs), torch.tensor(targets)) == pytest.approx(
        tp / denom)


def test_silent_and_correct_frames_add_nothing(sample):
    probs, targets = sample
    silent = np.zeros((30, 12))
    both = (np.concatenate([probs, silent]), np.concatenate([targets, silent]))
    assert frame_accuracy(*both) == pytest.approx(frame_accuracy(probs, targets))
    assert frame_accuracy(*both, average="frame") == pytest.approx(
        frame_accuracy(probs, targets, average="frame"))
    assert frame_accuracy(silent, silent) == 1.0


def test_mask_threshold_and_shapes(sample):
    probs, targets = sample
    p3, y3 = probs.reshape(4, 10, 12), targets.reshape(4, 10, 12)
    mask = np.zeros((4, 10), dtype=bool)
    mask[:, :6] = True
    expected = frame_accuracy(p3[:, :6].reshape(-1, 12), y3[:, :6].reshape(-1, 12))
    assert frame_accuracy(p3, y3, mask) == pytest.approx(expected)
    rows = brute_counts(probs, targets, threshold=0.3)
    assert frame_accuracy(probs, targets, threshold=0.3) == pytest.approx(
        sum(r[0] for r in rows) / sum(sum(r) for r in rows))
    assert frame_accuracy(targets.astype(float), targets) == 1.0


def test_logits_and_bad_input_are_rejected(sample):
    probs, targets = sample
    with pytest.raises(ValueError, match="probabilities"):
        frame_accuracy(probs * 4 - 2, targets)
    with pytest.raises(ValueError, match="NaN"):
        frame_accuracy(np.full_like(probs, np.nan), targets)
    with pytest.raises(ValueError, match="must match"):
        frame_accuracy(probs[:, :5], targets)
    with pytest.raises(ValueError, match="mask"):
        frame_accuracy(probs, targets, mask=np.ones(3, dtype=bool))
    with pytest.raises(ValueError, match="average"):
        frame_accuracy(probs, targets, average="micro")


def test_frame_nll_matches_formula(sample):
    _, targets = sample
    rng = np.random.default_rng(1)
    logits = rng.normal(size=targets.shape) * 3
    total = 0.0
    for z_frame, y_frame in zip(logits, targets, strict=True):
        for z, y in zip(z_frame, y_frame, strict=True):
            p = 1 / (1 + math.exp(-z))
            total -= math.log(p) if y else math.log(1 - p)
    assert frame_nll(logits, targets) == pytest.approx(total / len(targets), rel=1e-12)
    mask = np.arange(len(targets)) % 2 == 0
    assert frame_nll(logits, targets, mask) == pytest.approx(
        frame_nll(logits[mask], targets[mask]), rel=1e-12)


def test_accumulator_equals_one_shot(sample):
    probs, targets = sample
    logits = torch.logit(torch.tensor(probs).clamp(1e-6, 1 - 1e-6))
    y = torch.tensor(targets, dtype=torch.float64)
    scores = FrameScores()
    for chunk in range(0, 40, 7):  # uneven batches: sums over frames, not means of means
        scores.update(logits[chunk: chunk + 7], y[chunk: chunk + 7])
    result = scores.compute()
    assert result["acc"] == pytest.approx(frame_accuracy(torch.sigmoid(logits), y))
    assert result["acc_frame"] == pytest.approx(
        frame_accuracy(torch.sigmoid(logits), y, average="frame"))
    assert result["nll"] == pytest.approx(frame_nll(logits, y))
    assert result["frames"] == 40


def test_threshold_grid_counts(sample):
    probs, targets = sample
    logits = torch.logit(torch.tensor(probs).clamp(1e-6, 1 - 1e-6))
    scores = FrameScores(grid=(0.2, 0.35, 0.5))
    scores.update(logits[:17], torch.tensor(targets[:17]))
    scores.update(logits[17:], torch.tensor(targets[17:]))
    acc_at = scores.compute()["acc_at"]
    for t in (0.2, 0.35, 0.5):
        assert acc_at[t] == pytest.approx(frame_accuracy(torch.sigmoid(logits), targets,
                                                         threshold=t))


def test_threshold_grid_counts_equal_a_loop_at_every_threshold():
    """The one-pass counts at every threshold (a histogram of where each probability falls
    among them) are the brute-force loop's, to the integer: probabilities exactly at thresholds
    (logit 0 is 0.5), a grid out of order, padded frames masked out, several batches."""
    g = torch.Generator().manual_seed(3)
    grid = (0.5, 0.05, 0.95, 0.25, 0.3)
    scores = FrameScores(grid=grid)
    seen_p, seen_y = [], []
    for frames in (31, 1, 17):
        logits = torch.randn(2, frames, 9, generator=g, dtype=torch.float64) * 3 - 1
        logits[torch.rand(logits.shape, generator=g) < 0.2] = 0.0
        logits[torch.rand(logits.shape, generator=g) < 0.1] = math.log(0.25 / 0.75)
        targets = (torch.rand(logits.shape, generator=g) < 0.3).to(torch.float64)
        mask = torch.ones(2, frames, dtype=torch.bool)
        mask[1, frames // 2:] = False
        scores.update(logits, targets, mask)
        seen_p += torch.sigmoid(logits)[mask].tolist()
        seen_y += targets[mask].tolist()
    for i, t in enumerate(grid):
        rows = brute_counts(seen_p, seen_y, t)
        assert scores.grid_tp[i] == sum(r[0] for r in rows), t
        assert scores.grid_denom[i] == sum(sum(r) for r in rows), t
        # the per-frame mean at each threshold too, over the frames with a key on in either
        ratios = [r[0] / sum(r) for r in rows if sum(r)]
        assert scores.compute()["acc_frame_at"][t] == pytest.approx(np.mean(ratios), abs=1e-12)
    rows = brute_counts(seen_p, seen_y, 0.5)
    assert (scores.tp, scores.denom) == (sum(r[0] for r in rows), sum(sum(r) for r in rows))
    assert scores.compute()["acc_at"][0.5] == scores.compute()["acc"]
    assert scores.compute()["acc_frame_at"][0.5] == pytest.approx(scores.compute()["acc_frame"])


def test_scores_reject_non_binary_targets_and_thresholds_outside_0_1():
    with pytest.raises(ValueError, match="binary"):
        FrameScores().update(torch.zeros(3, 4), torch.full((3, 4), 0.5))
    for bad in ({"threshold": 0.0}, {"grid": (0.2, 1.5)}):
        with pytest.raises(ValueError, match="thresholds must be in"):
            FrameScores(**bad)


def test_previous_frame_baseline_against_a_loop_and_the_known_jsb_figures(jsb):
    """Frame t + 1 predicted to be frame t: the scores equal a plain loop over frames with
    Python sets, and on JSB Chorales' test split the figures quoted in issue 15 (22.20% global,
    27.34% per-frame mean, recomputed there from the authors' code's definition)."""
    from linmem.metrics import previous_frame_scores

    rng = np.random.default_rng(3)
    seqs = [(rng.random((n, 6)) < 0.3).astype(np.uint8) for n in (5, 1, 9, 2)]
    tp_sum = denom_sum = 0
    ratios = []
    for s in seqs:
        for t in range(1, len(s)):
            pred, true = set(np.flatnonzero(s[t - 1])), set(np.flatnonzero(s[t]))
            tp, denom = len(pred & true), len(pred | true)
            tp_sum, denom_sum = tp_sum + tp, denom_sum + denom
            if denom:
                ratios.append(tp / denom)
    scores = previous_frame_scores(seqs)
    assert scores["frames"] == 4 + 8 + 1
    assert scores["acc"] == pytest.approx(tp_sum / denom_sum, abs=1e-12)
    assert scores["acc_frame"] == pytest.approx(np.mean(ratios), abs=1e-12)
    test = previous_frame_scores(jsb["test"])
    assert round(100 * test["acc"], 2) == 22.20 and round(100 * test["acc_frame"], 2) == 27.34
    with pytest.raises(ValueError, match="no sequence"):
        previous_frame_scores([np.zeros((1, 88))])


def test_per_key_model_of_the_previous_frame_against_a_loop_and_the_jsb_figure(jsb):
    """The per-key model of the previous frame: its probabilities are the add-one smoothed
    counts of a plain loop over frames and keys, its NLL the loop's sum of Bernoulli log-losses
    per frame, its accuracies the thresholded probabilities'; on JSB Chorales (fitted on the
    training split) the test NLL quoted in issue 89, 10.49 nats per frame."""
    from linmem.metrics import previous_frame_model, previous_frame_model_scores

    rng = np.random.default_rng(4)
    train = [(rng.random((n, 5)) < 0.4).astype(np.uint8) for n in (7, 1, 12)]
    test = [(rng.random((n, 5)) < 0.4).astype(np.uint8) for n in (6, 3)]
    counts = np.ones((2, 5, 2))  # [previous, key, next]: add-one
    for s in train:
        for t in range(1, len(s)):
            for k in range(5):
                counts[s[t - 1, k], k, s[t, k]] += 1
    expected = counts[:, :, 1] / counts.sum(-1)
    model = previous_frame_model(train)
    np.testing.assert_allclose(model, expected, rtol=1e-14)
    losses, tp, denom, ratios = [], 0, 0, []
    for s in test:
        for t in range(1, len(s)):
            p = [expected[s[t - 1, k], k] for k in range(5)]
            losses.append(-sum(math.log(p[k]) if s[t, k] else math.log(1 - p[k])
                               for k in range(5)))
            pred = {k for k in range(5) if p[k] >= 0.5}
            true = set(np.flatnonzero(s[t]))
            tp, denom = tp + len(pred & true), denom + len(pred | true)
            if pred | true:
                ratios.append(len(pred & true) / len(pred | true))
    scores = previous_frame_model_scores(model, test)
    assert scores["frames"] == 5 + 2
    assert scores["nll"] == pytest.approx(np.mean(losses), rel=1e-12)
    assert scores["acc"] == pytest.approx(tp / denom, abs=1e-12)
    assert scores["acc_frame"] == pytest.approx(np.mean(ratios), abs=1e-12)
    fitted = previous_frame_model_scores(previous_frame_model(jsb["train"]), jsb["test"])
    assert round(fitted["nll"], 2) == 10.49
