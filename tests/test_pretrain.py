"""Pretraining: the unrolled network against a brute-force loop, the ULM -> LMN transfer
(exact at full rank: the equivalence of the paper's section 3, executable), pret-RNN."""

import json
import shutil
import warnings
from dataclasses import replace

import numpy as np
import pytest
import torch

from linmem import LMN, LinearAutoencoder, UnrolledNet
from linmem.experiments.run_costs import run_cpu_seconds
from linmem.models import build_model
from linmem.pretrain import hidden_states, lag_decoder, pretrain_rnn, project_memory, transfer
from linmem.training.config import PROTOCOL_FIELDS, PROTOCOLS, TrainConfig
from linmem.training.evaluation import load_run_model
from linmem.training.recipes import ulm_key


@pytest.fixture
def float64():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def randomise(module, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * scale)
    return module


def rolls(n, keys, seed, lengths=(5, 14)):
    rng = np.random.default_rng(seed)
    return [(rng.random((rng.integers(*lengths), keys)) < 0.3).astype(np.float64)
            for _ in range(n)]


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("nonlinearity", ["selu", "tanh"])
def test_unrolled_net_matches_equations(nonlinearity):
    """Eq. (10) with explicit per-lag blocks W^hh_i and zero states before the start."""
    torch.manual_seed(0)
    k, h = 3, 4
    net = randomise(UnrolledNet(5, h, k, nonlinearity), 1)
    x = torch.randn(9, 2, 5)
    lagged, hs = net(x)
    act = torch.selu if nonlinearity == "selu" else torch.tanh
    for b in range(2):
        past = [torch.zeros(h) for _ in range(9 + k)]  # index t + k holds h_t
        for t in range(9):
            pre = net.weight_xh @ x[t, b] + net.bias_h
            for i in range(1, k + 1):
                pre = pre + net.weight_hh[:, (i - 1) * h: i * h] @ past[t + k - i]
            past[t + k] = act(pre)
            torch.testing.assert_close(hs[t, b], past[t + k])
            for i in range(k + 1):  # lag block i of the readout input is h_{t-i}
                torch.testing.assert_close(lagged[t, b, i * h:(i + 1) * h], past[t + k - i])
    bf, _ = UnrolledNet(5, h, k, nonlinearity, batch_first=True).requires_grad_(False), None
    bf.load_state_dict(net.state_dict())
    torch.testing.assert_close(bf(x.transpose(0, 1))[0], lagged.transpose(0, 1))


def _brute_force_unrolled(net, x, past):
    """Eq. (10) step by step with autograd (the reference for the explicit backward)."""
    act = {"selu": torch.selu, "tanh": torch.tanh, "relu": torch.relu}[net.nonlinearity]
    blocks = list(past.split(net.hidden_size, 1))  # h_{t-1}, ..., h_{t-k}
    hs = []
    for t in range(x.shape[0]):
        h = act(net.weight_xh @ x[t].T + net.bias_h[:, None]
                + net.weight_hh @ torch.cat(blocks, 1).T).T
        hs.append(h)
        blocks = [h, *blocks[:-1]]
    return torch.stack(hs)


@pytest.mark.usefixtures("float64")
@pytest.mark.parametrize("nonlinearity", ["selu", "tanh", "relu"])
def test_unrolled_net_gradients_match_autograd_loop(nonlinearity):
    """The explicit backward through time: every gradient (weights, inputs, the past states)
    equals autograd's through the step-by-step loop; and torch's gradcheck."""
    torch.manual_seed(0)
    k, h = 3, 4
    net = randomise(UnrolledNet(5, h, k, nonlinearity), 2)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 2, 5, generator=g, requires_grad=True)
    past = torch.randn(2, k * h, generator=g, requires_grad=True)
    weights = torch.randn(7, 2, (k + 1) * h, generator=g)
    lagged, hs = net(x, past)
    ref = _brute_force_unrolled(net, x, past)
    torch.testing.assert_close(hs, ref)
    params = [x, past, *net.parameters()]
    ours = torch.autograd.grad((lagged * weights).sum() + (hs ** 2).sum(), params)
    ref_lagged = torch.cat([torch.cat([past.unflatten(1, (k, h)).flip(1).transpose(0, 1), ref])[
        k - i: k - i + 7] for i in range(k + 1)], 2)
    theirs = torch.autograd.grad((ref_lagged * weights).sum() + (ref ** 2).sum(), params)
    for a, b in zip(ours, theirs, strict=True):
        torch.testing.assert_close(a, b)
    from linmem.ops.ulm import ulm_scan

    x_proj = torch.randn(7, 2, h, generator=g, requires_grad=True)
    weight_hh = net.weight_hh.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(
        lambda *a: ulm_scan(*a, nonlinearity)[0], (x_proj, past, weight_hh))


def ulm_and_states(k=2, h=3, keys=6, seed=0):
    ulm = randomise(build_model("ulm", h, input_size=keys, k=k), seed)
    seqs = rolls(8, keys, seed)
    return ulm, seqs, hidden_states(ulm, seqs)


def transferred_gap(ulm, seqs, states, memory, k, n_components=None, memory_bound=None):
    la = LinearAutoencoder(n_components or memory, window=k + 1).fit(states)
    lmn = build_model("pret-lmn-b", ulm.hidden, memory, input_size=ulm.input_size,
                      memory_bound=memory_bound, loop_bound=False)  # the memory bound alone
    torch.manual_seed(1)
    transfer(la, ulm.core, lmn.core, ulm.readout, lmn.readout)
    gap = 0.0
    with torch.no_grad():
        for s in seqs:
            x = torch.from_numpy(s[None, :-1])
            gap = max(gap, float((ulm(x) - lmn(x)).abs().max()))
    return gap, la


@pytest.mark.usefixtures("float64")
def test_hidden_states_are_the_ulm_states():
    """Each sequence's states are those of running it alone, in batches of sequences of unlike
    lengths (5 to 60 frames: the evaluation's length bound splits them)."""
    ulm, seqs, states = ulm_and_states()
    seqs += rolls(6, 6, 1, lengths=(20, 61))
    states = hidden_states(ulm, seqs)
    for s, hs in zip(seqs, states, strict=True):
        _, expected = ulm.core(torch.from_numpy(s[None, :-1]))
        np.testing.assert_allclose(hs, expected[0].detach().numpy(), rtol=0, atol=1e-12)


@pytest.mark.usefixtures("float64")
def test_transfer_is_exact_at_full_rank_and_degrades_below():
    k, h = 2, 3
    ulm, seqs, states = ulm_and_states(k, h)
    full = LinearAutoencoder((k + 1) * h, window=k + 1, solver="dense").fit(states)
    rank = full.n_components_
    assert rank == (k + 1) * h  # random states: the windowed state matrix has full column rank
    gap, la = transferred_gap(ulm, seqs, states, rank, k)
    assert gap < 1e-5, gap
    # the memory decodes the k + 1 lag blocks the transfer uses: U_i m_t = h_{t-i}
    u = lag_decoder(la, k + 1)
    m = la.encode(states[0])
    for t in range(len(states[0])):
        for i in range(min(t + 1, k + 1)):
            np.testing.assert_allclose(u[i * h:(i + 1) * h] @ m[t], states[0][t - i], atol=1e-9)
    gaps = [transferred_gap(ulm, seqs, states, p, k)[0] for p in range(1, rank)]
    assert min(gaps) > 1e-4  # below the rank the memory is lossy, and it shows
    assert gaps[0] > gaps[-1]  # and the gap shrinks as the memory grows


@pytest.mark.usefixtures("float64")
def test_transfer_into_a_bounded_memory_is_exact_within_the_bound():
    """||B||_2 <= 1 (U orthonormal, the shift a partial isometry): under a bound of 1 the
    transfer is exact, the layer running with B itself; below ||B||_2 the memory starts from the
    nearest matrix of the ball, and the gap that costs shows."""
    k, h = 2, 3
    ulm, seqs, states = ulm_and_states(k, h)
    rank = (k + 1) * h
    la = LinearAutoencoder(rank, window=k + 1).fit(states)
    norm = float(np.linalg.norm(la.B_, 2))
    assert 0.5 < norm <= 1 + 1e-12
    gap, _ = transferred_gap(ulm, seqs, states, rank, k, memory_bound=1.0)
    assert gap < 1e-5, gap
    lmn = build_model("pret-lmn-b", h, rank, input_size=ulm.input_size, memory_bound=1.0,
                      loop_bound=False)
    facts = transfer(la, ulm.core, lmn.core, ulm.readout, lmn.readout)
    assert facts == {"memory_norm": pytest.approx(norm), "memory_bound": 1.0,
                     "memory_change": 0.0}
    np.testing.assert_array_equal(lmn.core.memory_weight().detach().numpy(), la.B_)
    tight = 0.5 * norm
    gap, _ = transferred_gap(ulm, seqs, states, rank, k, memory_bound=tight)
    assert gap > 1e-3
    lmn = build_model("pret-lmn-b", h, rank, input_size=ulm.input_size, memory_bound=tight,
                      loop_bound=False)
    facts = transfer(la, ulm.core, lmn.core, ulm.readout, lmn.readout)
    assert facts["memory_change"] > 0.01
    w = lmn.core.memory_weight().detach().numpy()
    np.testing.assert_allclose(w, lmn.core.weight_mm_l0.detach().numpy(), rtol=0, atol=1e-12)
    assert np.linalg.norm(w, 2) == pytest.approx(tight, rel=1e-10)


def test_projected_memory_is_the_nearest_matrix_of_the_ball():
    """Clipping the singular values: within the ball, and no other matrix of the ball tried is
    closer (the rescaled one, random ones), in the Frobenius norm."""
    rng = np.random.default_rng(0)
    b = rng.normal(size=(6, 6))
    norm = np.linalg.norm(b, 2)
    same, facts = project_memory(b, 2 * norm)
    assert same is b and facts["memory_change"] == 0.0
    projected, facts = project_memory(b, 0.5 * norm)
    assert np.linalg.norm(projected, 2) == pytest.approx(0.5 * norm, rel=1e-12)
    best = np.linalg.norm(projected - b)
    assert facts["memory_change"] == pytest.approx(best / np.linalg.norm(b))
    for _ in range(200):
        other = rng.normal(size=(6, 6))
        other *= 0.5 * norm / np.linalg.norm(other, 2) * rng.random()
        assert np.linalg.norm(other - b) >= best
    assert np.linalg.norm(0.5 * b - b) > best  # rescaling is not the nearest
    assert project_memory(b, None)[0] is b


def test_the_closed_form_memory_of_jsb_has_norm_at_most_one(jsb):
    """The autoencoder of JSB Chorales' training split (window 11, as the transfer fits):
    ||B||_2 <= 1 to rounding, so a bound of 1 transfers it exactly."""
    la = LinearAutoencoder(100, window=11, center=False, random_state=0).fit(jsb["train"])
    norm = float(np.linalg.norm(la.B_, 2))
    assert 0.99 < norm <= 1 + 1e-9


@pytest.mark.usefixtures("float64")
def test_transfer_works_on_the_layers():
    """The transfer takes the layers: without readouts it sets the LMN layer alone (a readout of
    the user's own stays as it was) and gives the layer the predictor-level call gives; one
    readout without the other is refused."""
    k, h = 2, 3
    ulm, _, states = ulm_and_states(k, h)
    la = LinearAutoencoder((k + 1) * h, window=k + 1).fit(states)
    whole = build_model("pret-lmn-b", h, (k + 1) * h, input_size=ulm.input_size)
    transfer(la, ulm.core, whole.core, ulm.readout, whole.readout)
    layer = LMN(ulm.input_size, h, (k + 1) * h, nonlinearity=ulm.nonlinearity).double()
    own = torch.nn.Linear((k + 1) * h, 5).double()
    before = own.weight.detach().clone()
    transfer(la, ulm.core, layer)
    for name, value in whole.core.state_dict().items():
        if name.startswith(("weight", "bias")):
            torch.testing.assert_close(layer.state_dict()[name], value.to(torch.float64))
    assert torch.equal(own.weight, before)
    with pytest.raises(ValueError, match="both readouts"):
        transfer(la, ulm.core, layer, ulm.readout)


@pytest.mark.usefixtures("float64")
def test_transfer_pads_a_memory_larger_than_the_rank():
    """Extra memory units start with zero incoming weights: the function is unchanged."""
    k, h = 2, 3
    ulm, seqs, states = ulm_and_states(k, h, seed=3)
    rank = (k + 1) * h
    gap, _ = transferred_gap(ulm, seqs, states, rank + 4, k, n_components=rank)
    assert gap < 1e-5
    with pytest.raises(ValueError, match="components"):
        transferred_gap(ulm, seqs, states, rank - 1, k, n_components=rank)


@pytest.mark.usefixtures("float64")
def test_pret_rnn_states_are_the_scaled_autoencoder_states():
    """Before the tanh, the initialised Elman RNN runs s (A (x - mu) + B y_{t-1})."""
    seqs = rolls(10, 6, 5, lengths=(6, 12))
    rnn = build_model("pret-rnn", 4, input_size=6)
    info = pretrain_rnn(rnn, seqs, window=None)
    la = LinearAutoencoder(4, center=True, random_state=0).fit([s[:-1] for s in seqs])
    core, s = rnn.core, info["state_scale"]
    x = torch.from_numpy(seqs[0][:-1])
    y = torch.zeros(4)
    for t in range(len(x)):  # the linear part of the RNN, step by step
        y = core.weight_ih_l0 @ x[t] + core.bias_ih_l0 + core.weight_hh_l0 @ y + core.bias_hh_l0
        np.testing.assert_allclose(y.detach().numpy(), s * la.encode(seqs[0][:-1])[t],
                                   atol=1e-8)
    states = np.concatenate([la.encode(q[:-1]) for q in seqs]) * s
    assert np.quantile(np.abs(states), 0.99) == pytest.approx(0.5)


def run_cli(*args):
    from linmem.cli.commands import main

    try:
        main(list(args))
    except SystemExit as exit_:
        return exit_.code
    return 0


def test_pretrain_command_runs_every_step_and_resumes(tmp_path, data_dir):
    """`linmem pretrain`: ULM run, memory, init, fine-tuning; after losing the later steps,
    --resume redoes only those (the ULM is not retrained) and gets the same initial LMN."""
    out = tmp_path / "pret"
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--hidden", "6", "--memory", "20",
              "--k", "3", "--batch-size", "32", "--epochs", "1", "--out", str(out), "--quiet"]
    assert run_cli("pretrain", *common) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "pret-lmn-b" and metrics["pretraining"]["la_components"] == 20
    assert metrics["pretraining"]["la_window"] == 4
    assert metrics["pretraining"]["machine"] == metrics["machine"]  # the same process: the same
    ulm_log = (out / "ulm" / "log.jsonl").read_text()
    init = torch.load(out / "init.pt", weights_only=True)
    for name in ("init.pt", "pretraining.json", "last.pt", "best.pt", "metrics.json",
                 "log.jsonl"):
        (out / name).unlink()
    assert run_cli("pretrain", *common, "--resume") == 0
    assert (out / "ulm" / "log.jsonl").read_text() == ulm_log
    again = torch.load(out / "init.pt", weights_only=True)
    for key, value in init.items():
        torch.testing.assert_close(again[key], value, rtol=0, atol=0)


def test_ulm_activation_apart_from_the_lmns(tmp_path, data_dir):
    """--ulm-nonlinearity selu --nonlinearity tanh (the paper's text): the unrolled network
    trains with SELU, the LMN starts from the same transferred weights as the all-SELU run but
    computes with tanh; the choice is recorded; other models refuse the option."""
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--hidden", "6", "--memory", "20",
              "--k", "3", "--batch-size", "32", "--epochs", "1", "--quiet"]
    assert run_cli("pretrain", *common, "--out", str(tmp_path / "selu")) == 0
    assert run_cli("pretrain", *common, "--ulm-nonlinearity", "selu", "--nonlinearity", "tanh",
                   "--out", str(tmp_path / "tanh")) == 0
    selu, tanh = (json.loads((tmp_path / n / "metrics.json").read_text())["pretraining"]
                  for n in ("selu", "tanh"))
    assert (selu["ulm_nonlinearity"], selu["lmn_nonlinearity"]) == ("selu", "selu")
    assert (tanh["ulm_nonlinearity"], tanh["lmn_nonlinearity"]) == ("selu", "tanh")
    assert json.loads((tmp_path / "tanh" / "ulm" / "config.json").read_text())[
        "nonlinearity"] == "selu"
    assert json.loads((tmp_path / "tanh" / "config.json").read_text())["nonlinearity"] == "tanh"
    # the same ULM (same seed, same activation), so the same initial weights
    a, b = (torch.load(tmp_path / n / "init.pt", weights_only=True) for n in ("selu", "tanh"))
    assert set(a) - set(b) == {k for k in a if k.startswith(("core.bound_hm_", "core.bound_mh_"))}
    for key, value in b.items():  # the SELU layer's loop bound has buffers of its own
        torch.testing.assert_close(a[key], value, rtol=0, atol=0)
    # ... computed with tanh: the fine-tuned LMN of the second run is a tanh LMN
    model, _ = load_run_model(tmp_path / "tanh", "best")
    assert model.nonlinearity == "tanh" and model.core.nonlinearity == "tanh"
    # a run started in a folder holding another run's unrolled network and memory (the
    # Makefile's pretraining-activation targets) takes them as they are: the same initial weights
    copied = tmp_path / "copied"
    copied.mkdir()
    shutil.copytree(tmp_path / "selu" / "ulm", copied / "ulm")
    shutil.copy(tmp_path / "selu" / "memory.npz", copied)
    ulm_log = (copied / "ulm" / "log.jsonl").read_text()
    assert run_cli("pretrain", *common, "--ulm-nonlinearity", "selu", "--nonlinearity", "tanh",
                   "--out", str(copied)) == 0
    assert (copied / "ulm" / "log.jsonl").read_text() == ulm_log  # read, not trained again
    c = torch.load(copied / "init.pt", weights_only=True)
    for key, value in b.items():
        torch.testing.assert_close(c[key], value, rtol=0, atol=0)
    assert run_cli("train", "--model", "lmn-b", "--ulm-nonlinearity", "selu", *common,
                   "--out", str(tmp_path / "refused")) == 2
    assert not (tmp_path / "refused").exists()


def test_ulm_key_names_the_unrolled_network_not_the_memory():
    base = TrainConfig(model="pret-lmn-b", hidden=6, memory=20, k=3)
    key = ulm_key(base)
    assert key.startswith("jsb-h6-selu-s0-")
    for same in (dict(memory=12), dict(data_dir="/elsewhere"), dict(model="pret-lmn-a"),
                 dict(nonlinearity="selu"),
                 dict(nonlinearity="tanh", ulm_nonlinearity="selu"), dict(ulm_cache="/c")):
        assert ulm_key(replace(base, **same)) == key, same
    for other in (dict(hidden=7), dict(weight_decay=1e-3), dict(seed=1), dict(epochs=5),
                  dict(patience=3), dict(k=4), dict(ulm_nonlinearity="tanh"), dict(lr=0.01)):
        assert ulm_key(replace(base, **other)) != key, other
    # a setting added to TrainConfig later, at its default, leaves the names as they were
    from dataclasses import asdict, make_dataclass

    later = make_dataclass("Later", [("new_setting", int, 3)], bases=(TrainConfig,))
    assert ulm_key(later(**asdict(base))) == key
    assert ulm_key(later(**asdict(base), new_setting=4)) != key
    # nor does a change of TrainConfig's default protocol (linmem's until 2026-11-28): the names
    # the cache entries on disk were given under each protocol
    for protocol, name in (("linmem", "jsb-h6-selu-s0-b00b8df557de"),
                           ("paper", "jsb-h6-selu-s0-c72fe2b09a6f")):
        assert ulm_key(replace(base, protocol=protocol, **{
            f: getattr(PROTOCOLS[protocol], f) for f in PROTOCOL_FIELDS})) == name


def test_runs_share_their_unrolled_network_through_ulm_cache(tmp_path, data_dir):
    """Two runs that differ in memory size alone train one ULM between them, and the second
    starts from the weights it would get from a ULM of its own. A run that finds the entry
    locked by another process trains its own; a finished ULM of its own is copied into the
    cache."""
    fcntl = pytest.importorskip("fcntl", reason="the ULM cache's lock is POSIX's (flock)")
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--hidden", "6", "--k", "3",
              "--batch-size", "32", "--epochs", "1", "--quiet"]
    cache = tmp_path / "cache"

    def entries(folder):
        return sorted(p for p in folder.iterdir() if not p.name.startswith("."))

    assert run_cli("pretrain", *common, "--memory", "20", "--ulm-cache", str(cache),
                   "--out", str(tmp_path / "a")) == 0
    (entry,) = entries(cache)
    assert not (tmp_path / "a" / "ulm").exists()
    log = (entry / "log.jsonl").read_text()
    assert run_cli("pretrain", *common, "--memory", "12", "--ulm-cache", str(cache),
                   "--out", str(tmp_path / "b")) == 0
    assert entries(cache) == [entry] and (entry / "log.jsonl").read_text() == log
    infos = [json.loads((tmp_path / run / "pretraining.json").read_text()) for run in "ab"]
    assert [info["ulm_run"] for info in infos] == [str(entry)] * 2
    # the ULM's CPU time counts for the run that trained it, not for the one that read it
    ulm_cpu = json.loads((entry / "metrics.json").read_text())["cpu_time_s"]
    assert infos[0]["ulm_cpu_time_s"] == ulm_cpu > 0 and infos[0]["ulm_cpu_here_s"] > 0
    assert infos[1]["ulm_cpu_time_s"] == infos[1]["ulm_cpu_here_s"] == 0.0
    # the pretrained LMN's memory loop gain, as its initial weights give it
    from linmem.nn.diagnostics import memory_loop_gains

    init = torch.load(tmp_path / "a" / "init.pt", weights_only=True)
    bound = json.loads((tmp_path / "a" / "config.json").read_text())["memory_bound"]
    assert infos[0]["lmn_loop_gain"] == memory_loop_gains(init, "selu", bound, loop_bound=True)
    assert run_cli("pretrain", *common, "--memory", "12", "--out", str(tmp_path / "own")) == 0
    def scores(log_text):  # a log without its timings
        return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s")}
                for line in log_text.splitlines()]

    assert scores((tmp_path / "own" / "ulm" / "log.jsonl").read_text()) == scores(log)
    shared, own = (torch.load(tmp_path / n / "init.pt", weights_only=True) for n in ("b", "own"))
    for key, value in own.items():
        torch.testing.assert_close(shared[key], value, rtol=0, atol=0)

    # the entry in training elsewhere (its lock held): the run trains its own
    busy = TrainConfig(data="jsb", model="pret-lmn-b", hidden=6, memory=12, k=3, batch_size=32,
                       epochs=1, seed=1)
    with open(cache / f".{ulm_key(busy)}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert run_cli("pretrain", *common, "--memory", "12", "--seed", "1", "--ulm-cache",
                       str(cache), "--out", str(tmp_path / "busy")) == 0
    assert (tmp_path / "busy" / "ulm" / "metrics.json").is_file()
    assert entries(cache) == [entry]
    # a run whose own ULM was begun, resumed with the cache: it is finished there (here only
    # its final scores were missing) and joins the cache
    for name in ("init.pt", "pretraining.json", "last.pt", "best.pt", "metrics.json",
                 "ulm/metrics.json"):
        (tmp_path / "busy" / name).unlink()
    assert run_cli("pretrain", *common, "--memory", "12", "--seed", "1", "--ulm-cache",
                   str(cache), "--out", str(tmp_path / "busy"), "--resume") == 0
    adopted = cache / ulm_key(busy)
    assert entries(cache) == sorted([entry, adopted]) and (adopted / "metrics.json").is_file()
    assert (adopted / "log.jsonl").read_text() == \
        (tmp_path / "busy" / "ulm" / "log.jsonl").read_text()
    # its ULM's epoch ran in the earlier process: counted beside this one's recipe clock
    info = json.loads((tmp_path / "busy" / "pretraining.json").read_text())
    ulm_cpu = json.loads((adopted / "metrics.json").read_text())["cpu_time_s"]
    assert info["ulm_cpu_time_s"] == ulm_cpu > info["ulm_cpu_here_s"] > 0
    assert run_cpu_seconds(tmp_path / "busy") >= ulm_cpu + info["cpu_time_s"] - \
        info["ulm_cpu_here_s"]
    # models whose recipe does not read it refuse the option
    assert run_cli("train", *common, "--model", "lstm", "--ulm-cache", str(cache),
                   "--out", str(tmp_path / "refused")) == 2
    # a cache made before the names changed (every field hashed): its finished entry is read
    from linmem.training.recipes import _legacy_ulm_key

    first = replace(busy, memory=20, seed=0)
    assert ulm_key(first) == entry.name != _legacy_ulm_key(first)
    legacy = entry.with_name(_legacy_ulm_key(first))
    entry.rename(legacy)
    assert run_cli("pretrain", *common, "--memory", "8", "--ulm-cache", str(cache),
                   "--out", str(tmp_path / "legacy")) == 0
    info = json.loads((tmp_path / "legacy" / "pretraining.json").read_text())
    assert info["ulm_run"] == str(legacy) and info["ulm_cpu_time_s"] == 0.0
    assert entries(cache) == sorted([legacy, adopted])  # nothing trained again
    # ... and one begun under the former name is finished under the new one, not started again
    second = replace(first, seed=2)
    assert run_cli("pretrain", *common, "--memory", "8", "--seed", "2", "--ulm-cache",
                   str(cache), "--out", str(tmp_path / "s2")) == 0
    begun = cache / ulm_key(second)
    (begun / "metrics.json").unlink()  # killed after its last epoch, before its final scores
    log = (begun / "log.jsonl").read_text()
    begun.rename(cache / _legacy_ulm_key(second))
    assert run_cli("pretrain", *common, "--memory", "12", "--seed", "2", "--ulm-cache",
                   str(cache), "--out", str(tmp_path / "s2b")) == 0
    assert entries(cache) == sorted([legacy, adopted, begun])
    assert (begun / "metrics.json").is_file() and (begun / "log.jsonl").read_text() == log


def test_only_models_whose_recipe_reads_ulm_nonlinearity_take_it():
    """The check is in TrainConfig, so a library call to train() refuses it as the CLI does."""
    assert TrainConfig(model="pret-lmn-a", ulm_nonlinearity="selu").ulm_nonlinearity == "selu"
    for model in ("lmn-b", "ulm", "pret-rnn", "lstm-nade"):
        with pytest.raises(ValueError, match=f"applies to pret-lmn-a, pret-lmn-b, not to {model}"):
            TrainConfig(model=model, ulm_nonlinearity="tanh")
    assert TrainConfig(model="lmn-b").ulm_nonlinearity is None
    # the rule reads the models' option classes: the autoencoder's window is every pretrained
    # model's (and the unrolled network's), not a factorised model's
    assert TrainConfig(model="pret-rnn", la_window=0).la_window == 0
    with pytest.raises(ValueError, match="la_window applies to ulm, pret-lmn-a, pret-lmn-b, "
                                         "pret-rnn, not to lstm"):
        TrainConfig(model="lstm", la_window=5)


def test_pret_rnn_command(tmp_path, data_dir):
    out = tmp_path / "prnn"
    assert run_cli("pretrain", "--model", "pret-rnn", "--data", "jsb", "--data-dir",
                   str(data_dir), "--hidden", "12", "--epochs", "1", "--batch-size", "32",
                   "--out", str(out), "--quiet") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "pret-rnn" and metrics["pretraining"]["la_components"] == 12


@pytest.mark.slow
def test_analysis_command_writes_json_and_png(tmp_path, data_dir):
    ulm_run = tmp_path / "ulm"
    assert run_cli("train", "--model", "ulm", "--data", "jsb", "--data-dir", str(data_dir),
                   "--hidden", "5", "--k", "2", "--epochs", "1", "--batch-size", "32",
                   "--out", str(ulm_run), "--quiet") == 0
    out = tmp_path / "analysis"
    assert run_cli("analyze-pretraining", "--data", "jsb", "--data-dir", str(data_dir),
                   "--ulm-run", str(ulm_run), "--memories", "2,15", "--first-memory", "40",
                   "--out", str(out), "--quiet") == 0
    result = json.loads((out / "analysis.json").read_text())
    rows = result["memories"]
    assert [r["components"] for r in rows] == [2, 15]
    assert rows[1]["svd_error"] < rows[0]["svd_error"]  # errors fall with memory size
    assert rows[1]["svd_error"] <= rows[1]["la_error"] + 1e-12
    # at the full rank of the window (15 = 3 blocks x 5 units) the transfer is exact
    assert rows[1]["la_error"] < 1e-12
    assert abs(rows[1]["lmn_valid_acc"] - result["ulm_valid_acc"]) < 0.05
    assert len(result["first_sequence"]["relative_error"]) > 10
    assert (out / "figure5.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_pretraining_warns_of_a_memory_loop_gain_above_one(tmp_path, data_dir, monkeypatch):
    """An unbounded activation with a loop gain above 1 (Nottingham's two diverged SELU
    initialisations had 1.67 and 1.75) is said before fine-tuning starts; the defaults (SELU
    with the loop bound, which holds the gain below the bound) and tanh are not."""
    import linmem.training.recipes

    common = ["--data", "jsb", "--data-dir", str(data_dir), "--hidden", "6", "--memory", "5",
              "--k", "3", "--batch-size", "64", "--epochs", "1", "--quiet"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_cli("pretrain", *common, "--out", str(tmp_path / "default")) == 0
    assert not [w for w in caught if "loop has gain" in str(w.message)]
    info = json.loads((tmp_path / "default" / "pretraining.json").read_text())
    assert info["lmn_nonlinearity"] == "selu" and max(info["lmn_loop_gain"]) <= 0.99 + 1e-9
    monkeypatch.setattr(linmem.training.recipes, "memory_loop_gains",
                        lambda state, act, bound=None, loop=False: [0.9, 1.7])
    with pytest.warns(UserWarning, match=r"loop has gain 1\.700 > 1 with selu"):
        assert run_cli("pretrain", *common, "--no-loop-bound", "--out",
                       str(tmp_path / "selu")) == 0
    info = json.loads((tmp_path / "selu" / "pretraining.json").read_text())
    assert info["lmn_loop_gain"] == [0.9, 1.7]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert run_cli("pretrain", *common, "--nonlinearity", "tanh", "--ulm-nonlinearity",
                       "selu", "--out", str(tmp_path / "tanh")) == 0
    assert not [w for w in caught if "loop has gain" in str(w.message)]


@pytest.mark.parametrize("shape", [(9, 7, 17, 3), (5, 1, 5, 1), (4, 13, 33, 10)])
@pytest.mark.parametrize("nonlinearity", ["selu", "tanh", "relu"])
@pytest.mark.parametrize("threads", [1, 2])
def test_unrolled_recurrence_kernel_equals_the_loop(shape, nonlinearity, threads):
    """The ULM's recurrence in the compiled kernel (each variant this CPU runs) against its
    PyTorch loop: states and the gradients of x_proj, the past states and W^hh, float64 to
    1e-12; sizes off every variant's lanes and 6-row tiles, batches split over threads."""
    from linmem.ops import cpu as _ext
    from linmem.ops.paths import use_cpu_kernel
    from linmem.ops.ulm import ulm_scan

    steps, batch, h, k = shape
    g = torch.Generator().manual_seed(sum(shape))
    ops = [torch.randn(steps, batch, h, generator=g, dtype=torch.float64),
           torch.randn(batch, k * h, generator=g, dtype=torch.float64),
           torch.randn(h, k * h, generator=g, dtype=torch.float64) * (k * h) ** -0.5]
    ops = [t.requires_grad_() for t in ops]
    weights = torch.randn(steps, batch, h, generator=g, dtype=torch.float64)

    def run(path):
        with use_cpu_kernel(path):
            hs = ulm_scan(*ops, nonlinearity)[0]
            return (hs, *torch.autograd.grad((hs * weights).sum(), ops))

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        reference = run(False)
        for variant in _ext.kernel_variants():
            for a, b in zip(run(variant), reference, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    finally:
        torch.set_num_threads(previous)


def test_a_bounded_pretrained_lmn_trains_through_the_cli_and_shares_the_ulm(tmp_path, data_dir):
    """`linmem train --model pret-lmn-b --memory-bound R --ulm-cache C` (what a bounded search
    runs): the unrolled network, which has no memory, trains unbounded and is the cache entry
    of the unbounded run too (trained once); the LMN starts from the autoencoder's memory put
    into the ball, and its memory stays in it."""
    cache = tmp_path / "cache"
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--model", "pret-lmn-b", "--hidden",
              "6", "--memory", "20", "--k", "3", "--batch-size", "32", "--epochs", "1",
              "--ulm-cache", str(cache), "--quiet"]
    bound = 0.5
    assert run_cli("train", *common, "--memory-bound", str(bound),
                   "--out", str(tmp_path / "bounded")) == 0
    assert run_cli("train", *common, "--out", str(tmp_path / "free")) == 0
    assert len([e for e in cache.iterdir() if e.is_dir()]) == 1  # one ULM for both
    bounded = json.loads((tmp_path / "bounded" / "metrics.json").read_text())
    facts = bounded["pretraining"]
    assert bounded["memory_bound"] == bound and facts["memory_bound"] == bound
    assert facts["memory_norm"] > bound and facts["memory_change"] > 0  # B was put in the ball
    init = torch.load(tmp_path / "bounded" / "init.pt", weights_only=True)
    weight = init["core.weight_mm_l0"].double()
    model, _ = load_run_model(tmp_path / "bounded")
    assert float(torch.linalg.matrix_norm(model.core.memory_weight(0).double(), 2)) <= bound + 1e-6
    assert float(torch.linalg.matrix_norm(weight, 2)) <= bound + 1e-6


def test_a_cache_entry_with_only_published_records_is_trained_again(tmp_path, data_dir):
    """The campaign's restore step copies published records back into runs/, its ULM cache
    among them: an entry with metrics.json but no checkpoint (it stopped the campaign with
    "best.pt does not exist") is trained again in place, with a warning, and the pret-LMN
    trains; the entry then holds its checkpoint."""
    from linmem.experiments.publish import publish
    from linmem.training.runs import trained

    cache = tmp_path / "cache"
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--model", "pret-lmn-b", "--hidden",
              "6", "--memory", "20", "--k", "3", "--batch-size", "32", "--epochs", "1",
              "--ulm-cache", str(cache), "--quiet"]
    assert run_cli("train", *common, "--out", str(tmp_path / "first")) == 0
    (entry,) = [e for e in cache.iterdir() if e.is_dir()]
    publish(entry, tmp_path / "published")
    shutil.rmtree(entry)
    shutil.copytree(tmp_path / "published", entry)
    assert (entry / "metrics.json").is_file() and not trained(entry)
    with pytest.warns(UserWarning, match="records but not its checkpoint"):
        assert run_cli("train", *common, "--out", str(tmp_path / "second")) == 0
    assert trained(entry)
    assert (tmp_path / "second" / "metrics.json").is_file()


def test_an_unrolled_network_that_fails_only_on_test_is_transferred_as_chosen(tmp_path, small,
                                                                             monkeypatch):
    """The unrolled network's checkpoint, chosen on validation, gives NaN on a test sequence (a
    selu network on Piano-midi.de's long sequences): the pret-LMN is not failed for it. The
    transfer uses that checkpoint, pretraining.json says ulm_failed_on "test", the LMN is scored
    on its own; a second run reads the cache entry as it is (not trained again). A network that
    fails on validation still fails the run (nothing was chosen)."""
    import linmem.training.trainer as trainer
    from linmem import UnrolledNet
    from linmem.training.config import TrainConfig
    from linmem.training.evaluation import NonFiniteOutputs
    from linmem.training.recipes import train
    from linmem.training.runs import failed_on

    score = trainer.evaluate
    failing = {"split": "test"}

    def evaluate(model, sequences, *args, **kwargs):
        if isinstance(model.core, UnrolledNet) and sequences is small[failing["split"]]:
            raise NonFiniteOutputs("the model's outputs are NaN or inf on a batch")
        return score(model, sequences, *args, **kwargs)

    monkeypatch.setattr(trainer, "evaluate", evaluate)
    cache = tmp_path / "cache"
    cfg = TrainConfig(protocol="linmem", data="jsb", model="pret-lmn-b", hidden=6, memory=12, k=3,
                      epochs=2, seed=1, ulm_cache=str(cache))
    with pytest.warns(UserWarning, match="not finite on the test split"):
        first = train(cfg, tmp_path / "first", progress=False, data=small)
    (entry,) = [e for e in cache.iterdir() if e.is_dir()]
    assert failed_on(json.loads((entry / "diverged.json").read_text())) == "test"
    assert first["pretraining"]["ulm_failed_on"] == "test"
    assert first["test_acc"] >= 0 and (tmp_path / "first" / "metrics.json").is_file()
    second = train(cfg, tmp_path / "second", progress=False, data=small)
    assert second["pretraining"]["ulm_cpu_time_s"] == 0.0  # read, not trained again
    failing["split"] = "valid"
    with pytest.raises(trainer.TrainingDiverged, match="pretraining"):
        train(replace(cfg, ulm_cache=None), tmp_path / "third", progress=False, data=small)
