"""The NADE readout (issue 17): a distribution (sums to one), its likelihood against a per-key loop
and gradcheck, its sampler and marginal estimates against exact enumeration, and the NADE models
in the trainer."""

import itertools
import json
import math

import numpy as np
import pytest
import torch

from linmem.batching import iterate_batches
from linmem.metrics import FrameScores, expected_frame_accuracy, masked_nll
from linmem.models import build_model
from linmem.nn.nade import NADE
from linmem.training.config import TrainConfig
from linmem.training.evaluation import evaluate, load_run_model
from linmem.training.trainer import train_loop


def small_nade(d=5, h=4, s=3, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    nade = NADE(d, h, s).to(dtype)
    with torch.no_grad():  # V = 0 at the start: make the keys depend on each other
        nade.V.normal_(0, 1.5)
        nade.W.normal_(0, 1.5)
    return nade


def all_frames(d, dtype=torch.float64):
    return torch.tensor(list(itertools.product([0, 1], repeat=d)), dtype=dtype)


def loop_log_prob(nade, context, v):
    """log P(v | s) by the definition, one key at a time."""
    b = nade.visible_bias(context)
    c = nade.hidden_bias(context)
    total = torch.zeros(context.shape[:-1], dtype=context.dtype)
    for i in range(nade.n_visible):
        h = torch.sigmoid(c + v[..., :i] @ nade.W[:, :i].T)
        p = torch.sigmoid(b[..., i] + h @ nade.V[i])
        total = total + torch.where(v[..., i] > 0, torch.log(p), torch.log1p(-p))
    return total


def test_probabilities_of_every_frame_sum_to_one():
    nade = small_nade(d=8)
    context = torch.randn(3, 3, dtype=torch.float64)
    frames = all_frames(8)  # 256 frames
    logp = nade.log_prob(context[:, None].expand(-1, len(frames), -1),
                         frames.expand(3, -1, -1))
    assert torch.allclose(logp.exp().sum(1), torch.ones(3, dtype=torch.float64), atol=1e-12)


def test_log_prob_equals_a_per_key_loop_and_passes_gradcheck():
    nade = small_nade(d=7, h=5, s=4)
    context = torch.randn(2, 6, 4, dtype=torch.float64)
    v = (torch.rand(2, 6, 7, dtype=torch.float64) < 0.4).double()
    assert torch.allclose(nade.log_prob(context, v), loop_log_prob(nade, context, v), atol=1e-12)

    class LogProb(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, ctx, frames):
            return self.inner.log_prob(ctx, frames)

    wrapped = LogProb(nade)
    names = [n for n, _ in wrapped.named_parameters()]
    values = [p.detach().clone().requires_grad_() for _, p in wrapped.named_parameters()]
    ctx = context.clone().requires_grad_()

    def func(ctx, *params):
        return torch.func.functional_call(wrapped, dict(zip(names, params, strict=True)),
                                          (ctx, v))

    assert torch.autograd.gradcheck(func, (ctx, *values))


def test_samples_follow_the_exact_probabilities():
    d = 4
    nade = small_nade(d=d, h=3, s=2)
    context = torch.randn(2, dtype=torch.float64)
    frames = all_frames(d)
    exact = nade.log_prob(context.expand(len(frames), -1), frames).exp()
    n = 40_000
    gen = torch.Generator().manual_seed(0)
    v, p = nade.sample(context, n, generator=gen)
    assert v.shape == p.shape == (n, d)
    codes = (v @ (2 ** torch.arange(d - 1, -1, -1, dtype=torch.float64))).long()
    freq = torch.bincount(codes, minlength=2**d).double() / n
    # each frequency within 4.5 binomial standard errors of its probability (16 cells)
    se = (exact * (1 - exact) / n).sqrt()
    assert ((freq - exact).abs() <= 4.5 * se + 1e-12).all(), (freq, exact)
    # the conditional probabilities along each path are the model's: log P(v) = sum log p
    logp_path = torch.where(v > 0, p.log(), (1 - p).log()).sum(-1)
    assert torch.allclose(logp_path, nade.log_prob(context.expand(n, -1), v), atol=1e-10)


def test_marginal_estimates_match_enumeration_within_their_error():
    d = 6
    nade = small_nade(d=d, h=4, s=3, seed=1)
    context = torch.randn(5, 3, dtype=torch.float64)
    frames = all_frames(d)
    probs = nade.log_prob(context[:, None].expand(-1, len(frames), -1),
                          frames.expand(5, -1, -1)).exp()  # (5, 64)
    exact = probs @ frames  # (5, d): P(v_i = 1)
    mean, se = nade.marginals(context, 4000, generator=torch.Generator().manual_seed(2))
    assert mean.shape == se.shape == (5, d)
    assert ((mean - exact).abs() <= 4.5 * se + 1e-9).all()
    assert (se < 0.02).all()
    # forward: the logits of the estimate with the module's own seed, the same on every call
    nade.n_samples = 50
    assert torch.equal(nade(context), nade(context))
    assert torch.allclose(torch.sigmoid(nade(context)), exact, atol=0.1)


def test_bad_inputs():
    nade = NADE(5, 4, 3)
    with pytest.raises(ValueError, match="context must be"):
        nade.log_prob(torch.zeros(2, 4), torch.zeros(2, 5))
    with pytest.raises(ValueError, match="frames must be"):
        nade.log_prob(torch.zeros(2, 3), torch.zeros(2, 6))
    with pytest.raises(ValueError, match="n_hidden must be a positive integer"):
        NADE(5, 0, 3)
    with pytest.raises(ValueError, match="temperature"):
        nade.sample(torch.zeros(3), 2, temperature=0)


def test_expected_accuracy_equals_a_loop():
    rng = np.random.default_rng(0)
    targets = torch.from_numpy(rng.random((30, 12)) < 0.2).double()
    targets[3] = 0  # a silent target frame
    samples = torch.from_numpy(rng.random((7, 30, 12)) < 0.2).double()
    samples[:, 3] = 0  # silent in both: left out
    per_sample = []
    for s in range(7):
        ratios = []
        for f in range(30):
            tp = sum(samples[s, f, k] * targets[f, k] for k in range(12))
            union = sum(max(samples[s, f, k], targets[f, k]) for k in range(12))
            if union > 0:
                ratios.append(float(tp / union))
        per_sample.append(np.mean(ratios))
    acc, se = expected_frame_accuracy(samples, targets)
    assert acc == pytest.approx(np.mean(per_sample), abs=1e-12)
    assert se == pytest.approx(np.std(per_sample, ddof=1) / math.sqrt(7), abs=1e-12)
    with pytest.raises(ValueError, match="samples must be"):
        expected_frame_accuracy(samples[0], targets)


@pytest.mark.parametrize("core", ["lmn-b", "lstm"])
def test_nade_model_with_v_zero_is_the_factorised_model(core):
    """V = 0 (the initialisation): the NADE's NLL is the factorised model's with the same core
    and readout weights."""
    torch.manual_seed(0)
    joint = build_model(f"{core}-nade", 10, 8 if core == "lmn-b" else None, nade_hidden=6)
    plain = build_model(core, 10, 8 if core == "lmn-b" else None)
    plain.core.load_state_dict(joint.core.state_dict())
    plain.readout.load_state_dict(joint.readout.visible_bias.state_dict())
    x = (torch.rand(3, 9, 88) < 0.1).float()
    y = (torch.rand(3, 9, 88) < 0.1).float()
    mask = torch.ones(3, 9, dtype=torch.bool)
    assert torch.allclose(masked_nll(joint.likelihood_logits(x, y), y, mask),
                          masked_nll(plain(x), y, mask), atol=1e-6)


def test_evaluation_runs_the_core_once_per_batch_and_scores_as_two_passes():
    """evaluate() takes the marginals and the exact NLL from one pass of the core; its figures
    are those of scoring ``forward`` and ``likelihood_logits`` separately."""
    torch.manual_seed(0)
    model = build_model("lmn-b-nade", 6, 5, nade_hidden=4, nade_samples=7).eval()
    with torch.no_grad():
        model.readout.V.normal_(0, 0.5)
    rng = np.random.default_rng(2)
    seqs = [(rng.random((n, 88)) < 0.1).astype(np.float32) for n in (7, 5, 9)]
    calls = []
    hook = model.core.register_forward_hook(lambda *a: calls.append(1))
    got = evaluate(model, seqs, batch_size=2)
    assert len(calls) == 2  # two batches
    nll_only = evaluate(model, seqs, batch_size=2, accuracy=False)
    hook.remove()
    expected = FrameScores()
    with torch.no_grad():
        for batch in iterate_batches(seqs, 2):
            expected.update(model(batch.inputs), batch.targets, batch.mask,
                            nll_logits=model.likelihood_logits(batch.inputs, batch.targets))
    expected = expected.compute()
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6), key  # acc_at: a flat dict
    assert nll_only == pytest.approx({"nll": expected["nll"], "frames": expected["frames"]},
                                     rel=1e-6)

    class TwoPasses(torch.nn.Module):  # a joint model of the older protocol: no evaluation_logits
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, inputs):
            return self.inner(inputs)

        def likelihood_logits(self, inputs, targets):
            return self.inner.likelihood_logits(inputs, targets)

    older = evaluate(TwoPasses(model), seqs, batch_size=2)
    assert older["nll"] == pytest.approx(expected["nll"], rel=1e-6)
    assert older["acc"] == pytest.approx(expected["acc"], rel=1e-6)


@pytest.fixture(scope="module")
def small(jsb):
    """This module's slice of JSB Chorales, smaller than conftest's ``small``."""
    return {"train": jsb["train"][:12], "valid": jsb["valid"][:4], "test": jsb["test"][:4]}


def test_training_a_nade_model_scores_its_exact_likelihood(tmp_path, small):
    cfg = TrainConfig(model="lmn-b-nade", hidden=10, memory=8, nade_hidden=6, nade_samples=8,
                      batch_size=4, epochs=2, seed=1)
    metrics = train_loop(cfg, tmp_path / "run", progress=False, data=small, command="test")
    model, _ = load_run_model(tmp_path / "run")
    model.eval()
    # an independent figure: log P of every test frame by the per-key loop, summed
    total = frames = 0.0
    with torch.no_grad():
        for seq in small["test"]:
            x = torch.tensor(seq[:-1], dtype=torch.float32)[None]
            v = torch.tensor(seq[1:], dtype=torch.float32)[None]
            out, _ = model.core(x)
            readout = model.readout.double()
            total -= float(loop_log_prob(readout, out.double()[0], v.double()[0]).sum())
            model.readout.float()
            frames += len(seq) - 1
    assert metrics["test_nll"] == pytest.approx(total / frames, rel=1e-5)
    assert metrics["nll_method"] == "exact (NADE)"
    for split in ("valid", "test"):
        assert 0 <= metrics[f"{split}_acc_expected"] <= 100
        assert metrics[f"{split}_acc_expected_se"] > 0
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert "valid_nll" in log[0] and "train_nll" in log[0]
    # truncated BPTT trains it too
    train_loop(TrainConfig(**{**cfg.__dict__, "chunk": 5, "epochs": 1}), tmp_path / "chunked",
               progress=False, data=small)


def test_generation_draws_frames_from_the_nade():
    from linmem.generate import generate

    torch.manual_seed(0)
    model = build_model("lstm-nade", 8, nade_hidden=5)
    prime = (np.random.default_rng(0).random((6, 88)) < 0.1).astype(np.float32)
    out = generate(model, prime, 5, generator=torch.Generator().manual_seed(3))
    again = generate(model, prime, 5, generator=torch.Generator().manual_seed(3))
    assert np.array_equal(out, again) and out.shape == (5, 88)
    assert set(np.unique(out)) <= {0, 1}
    # one step: the frame is a joint draw whose path probabilities are the NADE's
    with torch.no_grad():
        model.readout.V.normal_(0, 1.0)
        frames = torch.from_numpy(prime)[None]
        frame, _, p = model.generation_step(frames, None, generator=torch.Generator())
        out, _ = model.core(frames)
        logp = torch.where(frame > 0, p.log(), (1 - p).log()).sum(-1)
        assert torch.allclose(logp, model.readout.log_prob(out[:, -1], frame), atol=1e-4)


def test_expected_accuracy_of_a_factorised_model_matches_enumeration():
    """expected_accuracy draws frames from the model's own distribution: for a factorised model
    over 3 keys the expectation is a sum over the 8 frames of each step, computed exactly."""
    from linmem.models import expected_accuracy

    torch.manual_seed(0)
    model = build_model("lstm", 4, input_size=3).double()
    rng = np.random.default_rng(1)
    seqs = [(rng.random((n, 3)) < 0.5).astype(np.float64) for n in (6, 9, 4)]
    frames = all_frames(3)
    ratios = []
    with torch.no_grad():
        for seq in seqs:
            p = torch.sigmoid(model(torch.tensor(seq[:-1])[None])[0])  # (T-1, 3)
            for t, target in enumerate(torch.tensor(seq[1:])):
                probs = torch.prod(torch.where(frames > 0, p[t], 1 - p[t]), -1)  # (8,)
                tp = (frames * target).sum(-1)
                union = ((frames + target) > 0).sum(-1)
                scored = union > 0
                # E[ratio] over the frames with something to score, and P(scored)
                ratios.append(((probs * tp / union.clamp(min=1))[scored].sum(),
                               probs[scored].sum()))
    # the estimator's target: per sample, the mean over its scored frames; with many samples
    # that is sum_f E[ratio_f] / sum_f P(scored_f)
    exact = float(sum(r for r, _ in ratios) / sum(w for _, w in ratios))
    acc, se = expected_accuracy(model, seqs, n_samples=4000, seed=3)
    assert abs(acc - exact) <= 4.5 * se + 1e-3 and 0 < se < 0.01
    assert expected_accuracy(model, seqs, 50, seed=3) == expected_accuracy(model, seqs, 50, 3)
