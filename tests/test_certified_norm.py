"""The certified norm (linmem.ops.certified_norm): never below a float64 SVD's norm and at most
its width above it, on the matrices where an estimate goes wrong (clustered and rank-deficient
spectra, any loaded state, a memory pushed far out by Adam), whichever of its paths answers;
the layer's buffer moves in training alone, travels in the state dict, and lets a resumed run
continue exactly; a training run with it matches one with the exact norm it replaced."""

import math

import numpy as np
import pytest
import torch

import linmem.ops.certificates as cn
import linmem.ops.certified_norm as certified
from linmem import LMN, LMNCell
from linmem.ops.bound import bounded_memory, bounded_memory_ref
from linmem.ops.certificates import SLACK
from linmem.ops.certified_norm import bounded_scale, certified_norm


def exact(v) -> float:
    return float(torch.linalg.matrix_norm(v.detach().double(), 2))


def width(v) -> float:
    """The certificate's largest relative excess over ``||v||_2`` (its ``d``) and a few units of
    rounding of ``v``'s dtype."""
    unit = torch.finfo(v.dtype).eps / 2
    frobenius2 = float(v.detach().double().pow(2).sum()) * (1 + 2 * v.numel() * unit)
    norm = exact(v)
    if norm == 0:
        return 0.0
    return SLACK + max(v.shape) * unit * frobenius2 / (2 * norm ** 2) + 16 * unit


def check(v, start=None):
    """The certified norm of ``v`` is never below its exact norm and at most its width above."""
    s, vector = certified_norm(v, start)
    norm = exact(v)
    assert float(s) >= norm, (float(s), norm)
    assert float(s) <= norm * (1 + width(v)), (float(s) / norm - 1, width(v))
    assert vector.shape == (min(v.shape),)
    return s, vector


def clustered(n: int, k: int, seed: int, top: float = 0.99, gap: float = 0.0) -> torch.Tensor:
    """An ``n x n`` matrix whose ``k`` largest singular values are ``top`` (the next ones
    ``gap`` below: 0 is one exact cluster, a memory projected onto the ball)."""
    rng = np.random.default_rng(seed)
    q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    rest = np.sort(rng.uniform(0, top - gap, n - k))[::-1]
    s = np.concatenate([np.full(k, top), rest])
    return torch.from_numpy((q1 * s) @ q2.T)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_never_below_the_exact_norm_on_random_matrices(dtype):
    g = torch.Generator().manual_seed(0)
    for shape in [(1, 1), (2, 7), (7, 2), (30, 30), (250, 250), (300, 40), (40, 300)]:
        for scale in (1e-30, 1e-6, 1.0, 1e6, 1e30):
            check((torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype))
        # uniform entries of one sign: a dominant top pair; and the layer's initialisation
        check((torch.rand(*shape, generator=g, dtype=torch.float64)).to(dtype))
        check(((torch.rand(*shape, generator=g) * 2 - 1) / math.sqrt(shape[1])).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_never_below_on_clustered_and_rank_deficient_spectra(dtype):
    """One exact cluster at the top (a pretrained memory put into the ball), a gap of one part
    in a million (the power iteration cannot tell them apart), and rank-deficient matrices (a
    zero, a rank-one, a rank-k product)."""
    for seed in range(6):
        for k, gap in ((1, 1e-6), (5, 0.0), (40, 0.0), (3, 1e-3)):
            check(clustered(60, k, seed, gap=gap).to(dtype))
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(80, 3, generator=g), torch.randn(3, 80, generator=g)
    for v in (torch.zeros(5, 5), torch.outer(torch.randn(9, generator=g), torch.randn(9,
                                                                                     generator=g)),
              a @ b, torch.zeros(4, 6).index_fill_(1, torch.tensor([2]), 3.0)):
        s, _ = certified_norm(v.to(dtype))
        norm = exact(v.to(dtype))
        assert norm <= float(s) <= norm * (1 + width(v.to(dtype)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_never_below_whatever_the_start(dtype):
    """The start vector (the layer's buffer) is a hint, never trusted: a state dict loaded
    from elsewhere (random, orthogonal to the top pair, NaN, of another length) changes the
    work done, not the guarantee."""
    v = clustered(50, 1, 3, gap=0.2).to(dtype)
    _, _, vh = torch.linalg.svd(v.double())
    orthogonal = vh[-1].to(dtype)  # the smallest singular direction: the worst start
    g = torch.Generator().manual_seed(2)
    for start in (None, torch.randn(50, generator=g).to(dtype), orthogonal,
                  torch.full((50,), math.nan, dtype=dtype), torch.zeros(7, dtype=dtype),
                  torch.full((50,), 1e30, dtype=dtype)):
        check(v, start)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_bound_holds_after_1000_adam_steps_at_a_large_learning_rate(dtype):
    """An objective that rewards a large memory, Adam at lr 0.1: the raw matrix goes far out and
    turns every step; the matrix eq. (7) runs with stays in the ball at every step, and its
    norm is at most the certificate's width below the bound."""
    torch.manual_seed(0)
    lmn = LMN(4, 6, 30, memory_bound=0.9, output="hidden", dtype=dtype)
    opt = torch.optim.Adam(lmn.parameters(), lr=0.1)
    x = torch.rand(12, 2, 4, dtype=dtype)
    lowest, highest = math.inf, 0.0
    for _ in range(1000):
        _, (_, m_n) = lmn(x)
        loss = -m_n.pow(2).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        norm = exact(lmn.memory_weight())
        lowest, highest = min(lowest, norm), max(highest, norm)
    assert exact(lmn.weight_mm_l0) > 20  # the parameter went far outside the ball
    assert highest <= 0.9 * (1 + 8 * torch.finfo(dtype).eps)
    assert lowest >= 0.9 / (1 + width(lmn.weight_mm_l0)) - 1e-6


def test_the_numpy_and_torch_paths_agree():
    """The CPU's path (scipy's BLAS and LAPACK) and the one every other device runs (PyTorch's
    operations, here on CPU tensors) certify the same norm to rounding."""
    g = torch.Generator().manual_seed(4)
    for shape in [(20, 20), (30, 10), (10, 30)]:
        for dtype in (torch.float32, torch.float64):
            w = torch.randn(*shape, generator=g, dtype=dtype)
            w = w / w.abs().max()
            frobenius2 = cn.frobenius2_above(w)
            start = torch.zeros(min(shape), dtype=dtype)
            with cn.OneBlasThread():
                by_numpy = cn.certify_norm(w.numpy(), start.numpy(), math.inf, frobenius2)
            by_torch = cn.certify_norm(w, start, math.inf, frobenius2)
            assert by_torch[0] == pytest.approx(by_numpy[0], rel=1e-5)
            assert by_torch[0] >= exact(w)


def test_a_failed_certificate_falls_back_to_the_eigensolver_then_to_the_frobenius_norm(
        monkeypatch):
    """A power iteration that stops far too low (simulated) cannot be certified: the
    eigensolver's pair is, at the same width; a factorisation that never succeeds (simulated)
    leaves ``||V||_F``, which is above too."""
    v = clustered(40, 2, 5, gap=0.1)
    monkeypatch.setattr(cn, "_power64", lambda ops, x, tol, slack=SLACK: (
        0.25 * exact(v) ** 2, 0.0, x, False, False))
    s, _ = certified_norm(v)
    assert exact(v) <= float(s) <= exact(v) * (1 + width(v))
    monkeypatch.setattr(cn._Numpy, "positive_definite", lambda self, shift: False)
    s, _ = certified_norm(v)
    assert float(s) >= float(torch.linalg.matrix_norm(v, "fro"))


def test_the_anchor_serves_most_updates_and_its_bound_is_tight(jsb):
    """Training LMN-B on JSB Chorales, the top singular value of the raw memory separates from
    the rest (the bound makes the loss blind to its scale, and Adam grows it): most updates are
    certified from the anchor of an earlier full certificate (Temple's bound, no Gram matrix),
    and at every update the matrix eq. (7) runs with has norm r to float32's rounding."""
    import collections

    from linmem.models import build_model

    paths = collections.Counter()
    upper_bound = cn.certify_norm
    last = []

    def counted(*args, **kwargs):
        out = upper_bound(*args, **kwargs)
        last[:] = ["direct" if out[3] is None else "kept" if out[3] == cn.KEEP else "temple"]
        paths[last[0]] += 1
        return out

    torch.manual_seed(0)
    model = build_model("lmn-b", 40, 40, memory_bound=0.99)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    norms = collections.defaultdict(list)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(certified, "certify_norm", counted)
        for seq in jsb["train"]:
            x = torch.as_tensor(np.asarray(seq), dtype=torch.float32)[None]
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x[:, :-1]),
                                                                        x[:, 1:])
            norms[last[0]].append(exact(model.core.memory_weight()))  # the forward's matrix
            opt.zero_grad()
            loss.backward()
            opt.step()
    assert paths["kept"] > 2 * (paths["temple"] + paths["direct"]), dict(paths)
    assert max(max(v) for v in norms.values()) <= 0.99 * (1 + 1e-6)
    tight = norms["kept"] + norms["temple"]  # Temple's bound: the exact norm to rounding
    assert min(tight) >= 0.99 * (1 - 1e-6)
    assert min(norms["direct"]) >= 0.99 / (1 + 2 * SLACK)  # the direct certificate: within d


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_an_anchor_from_elsewhere_is_never_trusted(dtype):
    """Buffers that do not belong together (a state dict of random values, an anchor replaced,
    a certificate claiming a second eigenvalue of 0) are ignored, not believed: the norm is
    still never below the exact one."""
    torch.manual_seed(8)
    lmn = LMN(3, 5, 30, dtype=dtype)
    with torch.no_grad():  # the top singular value well apart: an anchor of its own
        lmn.weight_mm_l0.copy_(clustered(30, 1, 10, top=3.0, gap=2.0).to(dtype))
    x = torch.rand(6, 2, 3, dtype=dtype)
    for _ in range(3):
        lmn(x)
    assert float(lmn.bound_certificate_l0[1]) > 0
    with torch.no_grad():
        lmn.weight_mm_l0.copy_(clustered(30, 3, 9, top=2.0).to(dtype))  # the top not separated
        lmn.bound_anchor_l0.copy_(lmn.weight_mm_l0)
        lmn.bound_certificate_l0[0] = 0.0  # "the second eigenvalue is at most 0"
    check(lmn.weight_mm_l0)
    assert exact(lmn.memory_weight()) <= 0.99 * (1 + 1e-6)
    state = {k: torch.randn_like(v) * 100 if v.is_floating_point() else v
             for k, v in lmn.state_dict().items()}
    state["bound_certificate_l0"] = torch.tensor([0.0, 1.0, 1.0], dtype=torch.float64)
    lmn.load_state_dict(state)
    assert exact(lmn.memory_weight()) <= 0.99 * (1 + 1e-6)


def test_non_finite_and_empty_matrices():
    for bad in (math.nan, math.inf):
        v = torch.ones(3, 3)
        v[1, 2] = bad
        s, _ = certified_norm(v)
        assert math.isnan(float(s))
        w = bounded_memory(v, 0.9)
        assert torch.isnan(w).all()
    s, vector = certified_norm(torch.zeros(0, 4))
    assert float(s) == 0 and vector.shape == (0,)
    with pytest.raises(ValueError, match="takes a matrix"):
        certified_norm(torch.ones(3))


def test_the_scale_and_its_gradient():
    """``bounded_scale``: 1 on or inside the ball, ``bound / s`` outside, and the gradient of
    ``s`` the certified factor times the top pair's ``u v^T``, the exact norm's gradient within
    the width."""
    torch.manual_seed(6)
    v = torch.randn(8, 8, dtype=torch.float64, requires_grad=True)
    scale, s, _ = bounded_scale(v, None, 0.5)
    assert float(scale) == pytest.approx(0.5 / float(s), rel=1e-15)
    (grad,) = torch.autograd.grad(s, v)
    (ref,) = torch.autograd.grad(torch.linalg.matrix_norm(v, 2), v)
    torch.testing.assert_close(grad, ref * float(s) / exact(v), rtol=1e-6, atol=1e-9)
    scale, _, _ = bounded_scale(v, None, 2 * exact(v))
    assert float(scale) == 1.0


def test_the_layers_buffer_moves_in_training_only_and_travels_in_the_state_dict():
    torch.manual_seed(7)
    lmn = LMN(3, 5, 6, num_layers=2, bidirectional=True)
    names = [n for n, _ in lmn.named_buffers()]
    assert names == [f"bound_{name}_l{k}{suffix}" for k in (0, 1) for suffix in ("", "_reverse")
                     for name in ("vector", "anchor", "certificate")]
    assert set(names) <= set(lmn.state_dict())
    x = torch.rand(4, 2, 3)
    lmn.eval()
    lmn(x)
    assert all(float(b.abs().sum()) == 0 for b in lmn.buffers())  # eval: untouched
    lmn.train()
    lmn(x)
    vectors = [b for n, b in lmn.named_buffers() if "vector" in n]
    assert all(float(b.norm()) == pytest.approx(1.0, rel=1e-5) for b in vectors)
    # an unbounded layer has none, and either layer loads the other's state dict
    free = LMN(3, 5, 6, num_layers=2, bidirectional=True, memory_bound=None)
    assert list(free.buffers()) == []
    free.load_state_dict(lmn.state_dict())
    other = LMN(3, 5, 6, num_layers=2, bidirectional=True)
    other.load_state_dict(free.state_dict())  # as a checkpoint from before the buffers: zeros
    assert all(float(b.abs().sum()) == 0 for b in other.buffers())
    other.load_state_dict(lmn.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(other.buffers(), lmn.buffers(), strict=True))
    cell = LMNCell(3, 5, 6)
    cell.load_state_dict({k.removesuffix("_l0"): p for k, p in lmn.state_dict().items()
                          if k.endswith("_l0")})
    assert torch.equal(cell.bound_vector, lmn.bound_vector_l0)
    assert torch.equal(cell.bound_certificate, lmn.bound_certificate_l0)
    for b in cell.buffers():
        b.zero_()
    cell(torch.rand(2, 3))  # a cold start: the vector, and an anchor where the top is separated
    assert float(cell.bound_vector.norm()) == pytest.approx(1.0, rel=1e-5)
    assert float(cell.bound_certificate[1]) != 0


def test_a_training_run_with_the_certified_norm_matches_the_exact_one(tmp_path, small):
    """linmem's trainer on a small JSB subset, LMN-B with the default bound, once with the
    certified norm and once with the exact one it replaced (bounded_memory_ref): the memory
    matrix differs by at most the certificate's width at the start, and a few epochs later the
    scores agree within a fraction of a point."""
    import linmem.nn.lmn as lmn_module
    from linmem.training.config import TrainConfig
    from linmem.training.trainer import train_loop

    cfg = TrainConfig(data="jsb", model="lmn-b", hidden=20, memory=20, epochs=4, seed=3,
                      lr=0.01, batch_size=1)
    certified = train_loop(cfg, tmp_path / "certified", progress=False, data=small)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lmn_module, "bounded_memory",
                   lambda weight, bound, *args, **kwargs: bounded_memory_ref(weight, bound))
        reference = train_loop(cfg, tmp_path / "exact", progress=False, data=small)
    for key in ("valid_acc", "valid_acc_frame", "test_acc", "test_acc_frame"):
        assert certified[key] == pytest.approx(reference[key], abs=0.5), key
    assert certified["test_nll"] == pytest.approx(reference["test_nll"], rel=0.02)
    assert certified["test_acc"] != reference["test_acc"] or \
        certified["test_nll"] != reference["test_nll"]  # two paths, not one
