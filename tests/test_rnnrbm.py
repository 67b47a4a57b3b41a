"""RNN-RBM against enumeration on tiny RBMs: free energy, log Z (exact vs AIS), CD gradients."""

import itertools

import pytest
import torch

from linmem.nn.rnnrbm import RNNRBM, ais_log_partition, free_energy, gibbs_chain


def _all_states(n: int) -> torch.Tensor:
    return torch.tensor(list(itertools.product([0.0, 1.0], repeat=n)), dtype=torch.float64)


def _tiny_rbm(nv=6, nh=4, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    w = scale * torch.randn(nv, nh, generator=g, dtype=torch.float64)
    b_v = 0.5 * torch.randn(nv, generator=g, dtype=torch.float64)
    b_h = 0.5 * torch.randn(nh, generator=g, dtype=torch.float64)
    return w, b_v, b_h


def _exact_log_z(w, b_v, b_h):
    vs = _all_states(w.shape[0])
    return torch.logsumexp(-free_energy(vs, w, b_v, b_h), 0)


def test_free_energy_is_minus_log_sum_over_hidden_states():
    w, b_v, b_h = _tiny_rbm()
    vs, hs = _all_states(6), _all_states(4)
    energy = -(vs @ b_v)[:, None] - (hs @ b_h)[None, :] - vs @ w @ hs.T  # E(v, h)
    assert torch.allclose(free_energy(vs, w, b_v, b_h), -torch.logsumexp(-energy, 1), atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1])
def test_ais_matches_the_exact_partition_function(seed):
    w, b_v, b_h = _tiny_rbm(seed=seed, scale=1.5)
    exact = _exact_log_z(w, b_v, b_h)
    est, se = ais_log_partition(w, b_v[None], b_h[None], chains=400, betas=300,
                                generator=torch.Generator().manual_seed(seed))
    assert se.item() < 0.05
    assert abs(est.item() - exact.item()) < 4 * se.item() + 1e-3, (est, exact, se)


def test_ais_handles_a_batch_of_rbms_with_their_own_biases():
    w, b_v, b_h = _tiny_rbm(seed=3)
    b_vs = torch.stack([b_v, b_v + 1.0, b_v - 2.0])
    b_hs = torch.stack([b_h, b_h - 1.0, b_h + 0.5])
    est, se = ais_log_partition(w, b_vs, b_hs, chains=300, betas=200,
                                generator=torch.Generator().manual_seed(0))
    for i in range(3):
        exact = _exact_log_z(w, b_vs[i], b_hs[i])
        assert abs(est[i].item() - exact.item()) < 4 * se[i].item() + 1e-3


@pytest.mark.parametrize("beta", [1.0, 0.37])
def test_gibbs_chain_is_the_written_out_chain(beta):
    """The chain computed in place (each conditional in its product's buffer, each draw over its
    uniform numbers) gives the numbers of the chain written out, a new tensor per operation,
    draw for draw; with per-step biases ``(B, T, .)`` and with shared ones."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(9, 6, generator=g)
    for b_v, b_h in ((torch.randn(3, 5, 9, generator=g), torch.randn(3, 5, 6, generator=g)),
                     (torch.randn(9, generator=g), torch.randn(6, generator=g))):
        v0 = (torch.rand(3, 5, 9, generator=g) < 0.3).float()
        start = v0.clone()
        ours = gibbs_chain(v0, w, b_v, b_h, 4, torch.Generator().manual_seed(1), beta)
        gen, v = torch.Generator().manual_seed(1), v0
        for _ in range(4):
            p = torch.sigmoid(b_h + beta * (v @ w))
            h = (torch.rand(p.shape, generator=gen) < p).float()
            p = torch.sigmoid(b_v + beta * (h @ w.T))
            v = (torch.rand(p.shape, generator=gen) < p).float()
        assert torch.equal(ours, v) and ours.dtype == v.dtype
        assert torch.equal(v0, start)  # the start (the data, in CD-k) is not written over


def test_row_draws_are_each_rows_own_generator():
    """Row ``b`` of a batch's draws is ``rand < p[b]`` from a generator seeded by the row's key
    and the draw's number alone (what makes a prediction independent of its batch), also for
    probabilities that are not contiguous."""
    from linmem.nn.rnnrbm import _row_bernoulli

    p = torch.rand(5, 3, 7, generator=torch.Generator().manual_seed(0)).transpose(0, 1)
    keys = [11, 2 ** 62 + 5, 0]
    draws = _row_bernoulli(p, keys, 4)
    for b, key in enumerate(keys):
        g = torch.Generator().manual_seed((key + 1_000_003 * 4) % 2 ** 63)
        assert torch.equal(draws[b], (torch.rand(5, 7, generator=g) < p[b]).float())


def test_cd_gradient_matches_the_exact_log_likelihood_gradient_in_expectation():
    """With long chains, E[grad of F(v) - F(v*)] = -grad of the mean log-likelihood."""
    torch.manual_seed(0)
    w, b_v, b_h = _tiny_rbm(nv=5, nh=3, seed=2, scale=0.8)
    data = torch.bernoulli(torch.full((6, 5), 0.4, dtype=torch.float64))
    # exact: d/dW mean log p(v) = E_data[v sigma(b_h + vW)^T] - E_model[v sigma(b_h + vW)^T]
    vs = _all_states(5)
    p_model = torch.softmax(-free_energy(vs, w, b_v, b_h), 0)
    ph = torch.sigmoid(b_h + data @ w)
    exact_w = data.T @ ph / len(data) - (vs * p_model[:, None]).T @ torch.sigmoid(b_h + vs @ w)
    exact_bv = data.mean(0) - p_model @ vs
    # CD-k estimate, averaged over many chains started at the data
    reps = 4000
    v0 = data.repeat(reps, 1)
    w_ = w.clone().requires_grad_(True)
    bv_ = b_v.clone().requires_grad_(True)
    neg = gibbs_chain(v0, w, b_v, b_h, k=30)
    cost = (free_energy(v0, w_, bv_, b_h) - free_energy(neg, w_, bv_, b_h)).mean()
    cost.backward()
    assert torch.allclose(-w_.grad, exact_w, atol=0.02), (-w_.grad - exact_w).abs().max()
    assert torch.allclose(-bv_.grad, exact_bv, atol=0.02)
    # and CD-1 is not the same thing here (the test can tell the two apart)
    w1 = w.clone().requires_grad_(True)
    neg1 = gibbs_chain(v0, w, b_v, b_h, k=1)
    (free_energy(v0, w1, b_v, b_h) - free_energy(neg1, w1, b_v, b_h)).mean().backward()
    assert (-w1.grad - exact_w).abs().max() > 0.02


def test_rnn_part_is_torch_rnn_and_biases_are_causal():
    torch.manual_seed(0)
    model = RNNRBM(n_visible=10, n_recurrent=7, n_hidden=5).double()
    x = torch.bernoulli(torch.full((2, 6, 10), 0.3, dtype=torch.float64))
    b_v, b_h = model.step_biases(x)
    assert b_v.shape == (2, 6, 10) and b_h.shape == (2, 6, 5)
    # u_t by an explicit loop with the RNN's own weights
    r = model.rnn
    u = torch.tanh(model.u0).expand(2, -1)
    for t in range(6):
        u = torch.tanh(x[:, t] @ r.weight_ih_l0.T + r.bias_ih_l0 + u @ r.weight_hh_l0.T
                       + r.bias_hh_l0)
        assert torch.allclose(b_v[:, t], model.b_v + u @ model.W_uv.weight.T, atol=1e-12)
        assert torch.allclose(b_h[:, t], model.b_h + u @ model.W_uh.weight.T, atol=1e-12)
    # the biases of frame t + 1 depend on frames 0..t only
    y = x.clone()
    y[:, 4] = 1 - y[:, 4]
    b_v2, _ = model.step_biases(y)
    assert torch.equal(b_v2[:, :4], b_v[:, :4]) and not torch.allclose(b_v2[:, 4], b_v[:, 4])


def test_rnn_part_has_torch_rnn_gradients():
    """The RNN part (linmem.nn.rnns.RNN: an explicit backward) against torch.nn.RNN with the same
    weights: the same CD cost and the same gradient of every parameter."""
    from torch import nn

    from linmem.nn import rnns

    model = RNNRBM(n_visible=10, n_recurrent=7, n_hidden=5, cd_k=3).double()
    assert isinstance(model.rnn, rnns.RNN)
    x = torch.bernoulli(torch.full((3, 9, 10), 0.3, dtype=torch.float64),
                        generator=torch.Generator().manual_seed(1))
    mask = torch.ones(3, 8, dtype=torch.float64)
    mask[0, 5:] = 0
    grads = []
    for rnn in (model.rnn, nn.RNN(10, 7, batch_first=True).double()):
        rnn.load_state_dict(model.rnn.state_dict())
        model.rnn = rnn
        model.zero_grad()
        torch.manual_seed(0)  # the same Gibbs chains
        cost = model.cd_cost(x[:, :-1], x[:, 1:], mask)
        cost.backward()
        grads.append((cost.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-12)
    for ours, ref in zip(grads[0][1], grads[1][1], strict=True):
        assert torch.allclose(ours, ref, atol=1e-12)
        assert ref.abs().max() > 0


def test_marginals_match_enumeration():
    torch.manual_seed(0)
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=4, predict_steps=4000, burn_in=50).double()
    with torch.no_grad():
        model.W.mul_(100)  # a coupled RBM, so that the marginals are not the biases' sigmoids
    x = torch.bernoulli(torch.full((1, 2, 6), 0.5, dtype=torch.float64))
    b_v, b_h = model.step_biases(x)
    vs = _all_states(6)
    for t in range(2):
        p = torch.softmax(-free_energy(vs, model.W, b_v[0, t], b_h[0, t]), 0)
        exact = p @ vs
        gibbs = model.marginals(x)[0, t]
        assert torch.allclose(gibbs, exact, atol=0.03), (gibbs, exact)
    model.predict = "mean-field"
    mf = model.marginals(x)
    assert mf.shape == (1, 2, 6) and torch.all((mf > 0) & (mf < 1))


def test_log_likelihood_with_exact_log_z():
    torch.manual_seed(0)
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=4).double()
    x = torch.bernoulli(torch.full((2, 3, 6), 0.5, dtype=torch.float64))
    y = torch.bernoulli(torch.full((2, 3, 6), 0.5, dtype=torch.float64))
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], dtype=torch.float64)
    ll, se = model.log_likelihood(x, y, mask, chains=200, betas=200,
                                  generator=torch.Generator().manual_seed(1))
    assert ll.shape == (5,) and se.shape == (5,)
    b_v, b_h = model.step_biases(x)
    exact = [(-free_energy(y[b, t], model.W, b_v[b, t], b_h[b, t])
              - _exact_log_z(model.W, b_v[b, t], b_h[b, t])).item()
             for b in range(2) for t in range(3) if mask[b, t]]
    assert torch.allclose(ll, torch.tensor(exact, dtype=torch.float64), atol=4 * se.max() + 1e-3)


def test_training_cost_decreases_and_sampling():
    torch.manual_seed(0)
    model = RNNRBM(n_visible=12, n_recurrent=8, n_hidden=10, cd_k=5)
    x = torch.zeros(4, 10, 12)
    x[:, :, ::3] = 1.0  # a fixed chord
    mask = torch.ones(4, 9)
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(60):
        opt.zero_grad()
        model.cd_cost(x[:, :-1], x[:, 1:], mask).backward()
        opt.step()
    probs = model.marginals(x[:, :-1])
    assert torch.all(probs[..., ::3] > 0.9) and torch.all(probs[..., 1::3] < 0.1)
    roll = model.sample(x[0, :3], 5, gibbs_steps=20, generator=torch.Generator().manual_seed(0))
    assert roll.shape == (8, 12) and torch.equal(roll[:3], x[0, :3])
    assert set(roll.unique().tolist()) <= {0.0, 1.0}
    assert torch.equal(roll[3:, ::3], torch.ones(5, 4))  # continues the chord
    again = model.sample(x[0, :3], 5, gibbs_steps=20, generator=torch.Generator().manual_seed(0))
    assert torch.equal(roll, again)


def test_bad_input():
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=4)
    with pytest.raises(ValueError, match="inputs must be"):
        model.step_biases(torch.zeros(2, 3, 5))
    with pytest.raises(ValueError, match="prefix"):
        model.sample(torch.zeros(0, 6), 3)
    with pytest.raises(ValueError, match="predict"):
        RNNRBM(predict="exact")
    from linmem.models import build_model
    from linmem.training.config import TrainConfig

    for make in (lambda: build_model("rnn-rbm", 8, dropout=0.1),
                 lambda: TrainConfig(model="rnn-rbm", dropout=0.1)):
        with pytest.raises(ValueError, match="no dropout"):
            make()


def test_trainer_runs_rnn_rbm_and_resumes_exactly(tmp_path, jsb):
    """`linmem train --model rnn-rbm`: CD training, accuracy from the marginals, AIS test NLL;
    a run resumed after epoch 1 ends like an uninterrupted one (the Gibbs RNG is restored)."""
    import json

    from linmem.training.config import TrainConfig
    from linmem.training.trainer import train_loop

    data = {split: seqs[:6] for split, seqs in jsb.items()}
    config = TrainConfig(model="rnn-rbm", hidden=8, rbm_hidden=10, cd_k=2, epochs=2,
                         ais_chains=20, ais_betas=30, ais_frames=40, eval_batch_size=8)
    full = train_loop(config, tmp_path / "full", progress=False, data=data)
    first = TrainConfig(**{**config.__dict__, "epochs": 1})
    train_loop(first, tmp_path / "part", progress=False, data=data)
    resumed = train_loop(config, tmp_path / "part", resume=True, progress=False, data=data)
    assert json.loads((tmp_path / "part" / "config.json").read_text())["epochs"] == 2
    for key in ("valid_acc", "test_acc", "test_nll", "test_nll_marginals"):
        assert resumed[key] == full[key], key
    a = torch.load(tmp_path / "full" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "part" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)  # epoch 2's Gibbs chains drew the same
    log = [json.loads(line) for line in (tmp_path / "full" / "log.jsonl").read_text().splitlines()]
    assert "train_cd_cost" in log[0] and "valid_nll_marginals" in log[0]
    assert "AIS" in full["test_nll_method"] and full["test_nll_se"] > 0
    assert 0 < full["test_nll"] < 88 * 0.7 and full["n_params"] > 0


def test_init_from_rnn_reproduces_the_rnn_predictions():
    """With W = 0 each step's RBM is independent Bernoullis with logits b_v^t: after the copy
    they are the RNN predictor's logits exactly."""
    from linmem.models import build_model
    from linmem.nn.rnnrbm import init_from_rnn

    torch.manual_seed(0)
    rnn = build_model("rnn", 7, input_size=10).double()
    model = RNNRBM(n_visible=10, n_recurrent=7, n_hidden=4).double()
    init_from_rnn(model, rnn, set_visible_bias=True)
    x = torch.bernoulli(torch.full((3, 5, 10), 0.3, dtype=torch.float64))
    b_v, _ = model.step_biases(x)
    with torch.no_grad():
        assert torch.allclose(b_v, rnn(x), atol=1e-12)
        model.W.zero_()
        model.predict = "mean-field"
        assert torch.allclose(model.marginals(x), torch.sigmoid(rnn(x)), atol=1e-12)
    with pytest.raises(ValueError, match="tanh rnn"):
        init_from_rnn(model, build_model("lstm", 7, input_size=10), True)


def test_rbm_pretraining_learns_the_frame_distribution():
    """Three two-key chords: after CD pretraining they are the RBM's three most probable frames
    (exact probabilities by enumeration) and hold most of its mass."""
    import numpy as np

    from linmem.nn.rnnrbm import pretrain_rbm

    torch.manual_seed(0)
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=8, cd_k=15).double()
    patterns = torch.tensor([[1, 1, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0], [0, 0, 0, 0, 1, 1]],
                            dtype=torch.float64)
    seqs = [patterns[torch.randint(0, 3, (20,))].numpy() for _ in range(5)]
    data = torch.from_numpy(np.concatenate(seqs))
    states = _all_states(6)

    def log_probs():
        with torch.no_grad():
            lp = -free_energy(states, model.W, model.b_v, model.b_h)
            return lp - torch.logsumexp(lp, 0)

    before = log_probs()
    costs = pretrain_rbm(model, seqs, epochs=150, batch_size=20, lr=0.02)
    after = log_probs()
    assert len(costs) == 150
    index = {tuple(s.int().tolist()): i for i, s in enumerate(states)}
    chords = [index[tuple(p.int().tolist())] for p in patterns]
    assert set(after.argsort(descending=True)[:3].tolist()) == set(chords)
    assert after[chords].exp().sum() > 0.8 > before[chords].exp().sum()
    ll = lambda lp: lp[[index[tuple(v.int().tolist())] for v in data]].mean()  # noqa: E731
    assert ll(after) > ll(before) + 2.0


def test_trainer_pretrains_rnn_rbm_resumably(tmp_path, jsb):
    import json

    from linmem.training.config import TrainConfig
    from linmem.training.recipes import train

    data = {split: seqs[:5] for split, seqs in jsb.items()}
    config = TrainConfig(model="rnn-rbm", hidden=6, rbm_hidden=8, cd_k=2, epochs=1,
                         rbm_pretrain_epochs=2, rnn_pretrain_epochs=2, ais_chains=10,
                         ais_betas=10, ais_frames=20)
    metrics = train(config, tmp_path / "run", progress=False, data=data)
    info = metrics["pretraining"]
    assert info["rbm"]["epochs"] == 2 and len(info["rbm"]["cd_cost"]) == 2
    assert info["rnn"]["epochs"] == 2 and (tmp_path / "run" / "rnn" / "metrics.json").is_file()
    init = torch.load(tmp_path / "run" / "init.pt", weights_only=True)
    rnn_best = torch.load(tmp_path / "run" / "rnn" / "best.pt", weights_only=True)["model"]
    assert torch.equal(init["rnn.weight_hh_l0"], rnn_best["core.weight_hh_l0"])
    assert torch.equal(init["W_uv.weight"], rnn_best["readout.weight"])
    assert json.loads((tmp_path / "run" / "pretraining.json").read_text()) == info


def test_sampled_next_frames_follow_each_steps_rbm():
    """sample_next: frames drawn by Gibbs chains at each valid step, distributed as that step's
    RBM (enumeration of its 2^4 frames)."""
    torch.manual_seed(1)
    model = RNNRBM(n_visible=4, n_recurrent=3, n_hidden=3, predict_steps=30).double()
    with torch.no_grad():
        model.W.mul_(60)
    x = torch.bernoulli(torch.full((2, 3, 4), 0.5, dtype=torch.float64))
    mask = torch.tensor([[True, True, False], [True, False, False]])
    n = 6000
    v = model.sample_next(x, mask, n, torch.Generator().manual_seed(0))
    assert v.shape == (n, 3, 4)
    b_v, b_h = model.step_biases(x)
    vs = _all_states(4)
    for i, (b, t) in enumerate([(0, 0), (0, 1), (1, 0)]):
        p = torch.softmax(-free_energy(vs, model.W, b_v[b, t], b_h[b, t]), 0)
        codes = (v[:, i] @ torch.tensor([8.0, 4.0, 2.0, 1.0], dtype=torch.float64)).long()
        freq = torch.bincount(codes, minlength=16).double() / n
        assert ((freq - p).abs() <= 4.5 * (p * (1 - p) / n).sqrt() + 2e-3).all(), (freq, p)


def test_rnn_rbm_trains_on_windows_with_the_state_carried():
    """--chunk: the biases of the windows, the RNN continued from the previous window's state,
    are those of the whole sequence; the trainer runs it."""
    from linmem.batching import collate

    torch.manual_seed(0)
    model = RNNRBM(n_visible=88, n_recurrent=5, n_hidden=4, cd_k=1).double()
    rng = torch.Generator().manual_seed(1)
    seqs = [(torch.rand(n, 88, generator=rng) < 0.1).double().numpy() for n in (13, 7)]
    batch = collate(seqs, dtype=torch.float64)
    b_v, b_h = model.step_biases(batch.inputs)
    state, pieces = None, []
    for window in batch.windows(5):
        pieces.append(model._biases(window.inputs, state)[:2])
        cost, state = model.chunk_loss(window, state)
        assert torch.isfinite(cost) and not state.requires_grad
    assert torch.allclose(torch.cat([p[0] for p in pieces], 1), b_v, atol=1e-12)
    assert torch.allclose(torch.cat([p[1] for p in pieces], 1), b_h, atol=1e-12)


def test_gibbs_predictions_do_not_depend_on_the_batch():
    """Each sequence's chains are seeded by the model's seed and its frames: its marginals are
    the same alone, padded in a batch beside others, or at another place in it (float64,
    exactly); another seed draws other chains; a sequence ending in silence keeps its draws."""
    from linmem.batching import collate
    from linmem.nn.rnnrbm import sequence_keys

    torch.manual_seed(0)
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=4, predict_steps=30, burn_in=5).double()
    g = torch.Generator().manual_seed(1)
    seqs = [(torch.rand(n, 6, generator=g, dtype=torch.float64) < 0.4).double().numpy()
            for n in (9, 4, 13)]
    seqs[1][-1] = 0.0  # ends in silence, as padding does
    alone = [model.marginals(collate([s], torch.float64).inputs)[0] for s in seqs]
    for order in ([0, 1, 2], [2, 0, 1]):
        batch = collate([seqs[i] for i in order], torch.float64)
        together = model.marginals(batch.inputs)
        for row, i in enumerate(order):
            steps = len(seqs[i]) - 1
            assert torch.equal(together[row, :steps], alone[i][:steps])
    keys = sequence_keys(collate(seqs).inputs, 0)
    assert len(set(keys)) == 3 and keys != sequence_keys(collate(seqs).inputs, 1)
    model.seed = 1
    assert not torch.equal(model.marginals(collate([seqs[0]], torch.float64).inputs)[0], alone[0])


def test_rnn_rbm_scores_do_not_depend_on_the_evaluation_batches(jsb):
    """``evaluate`` of an RNN-RBM: the same accuracies and frame counts in batches of one
    sequence as of up to 64 (the marginals' NLL up to the order of its sum)."""
    from linmem.training.evaluation import evaluate

    torch.manual_seed(0)
    model = RNNRBM(predict_steps=12, burn_in=2)
    sequences = jsb["valid"][:20]
    one, many = evaluate(model, sequences, 1), evaluate(model, sequences, 64)
    assert (one["acc"], one["frames"]) == (many["acc"], many["frames"])
    assert one["acc_frame"] == pytest.approx(many["acc_frame"], rel=1e-12)
    assert one["nll"] == pytest.approx(many["nll"], rel=1e-6)


def test_expected_accuracy_draws_each_sequence_from_its_own_generator():
    """``expected_accuracy``: a sequence's draws depend on the seed and its frames alone: the
    same with a copy of it beside it (the ratios per draw unchanged), in either order beside
    another sequence; another seed draws others."""
    from linmem.models import expected_accuracy

    torch.manual_seed(0)
    model = RNNRBM(n_visible=6, n_recurrent=3, n_hidden=4, predict_steps=10, burn_in=2).double()
    g = torch.Generator().manual_seed(2)
    a, b = [(torch.rand(n, 6, generator=g, dtype=torch.float64) < 0.4).double().numpy()
            for n in (30, 17)]
    alone = expected_accuracy(model, [a], 40, seed=5)
    assert expected_accuracy(model, [a, a.copy()], 40, seed=5) == pytest.approx(alone, rel=1e-12)
    assert expected_accuracy(model, [a, b], 40, 5) == expected_accuracy(model, [b, a], 40, 5)
    assert expected_accuracy(model, [a], 40, seed=6) != alone
    assert 0 < alone[0] < 1 and 0 < alone[1] < 0.2
