"""The linear autoencoder against independent references: the dense Xi and numpy's SVD."""

import numpy as np
import pytest
import scipy.linalg
import torch

import linmem.la_solvers as la_solvers
from linmem.data import load_polyphonic
from linmem.la import LinearAutoencoder, NotFittedError
from linmem.la_solvers import build_xi, xi_rows, xi_squared_norm


def random_sequences(lengths, a, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, a)) for n in lengths]


def smooth_sequences(lengths, a, seed=0):
    """Outputs of a stable random linear system plus noise: a decaying spectrum of Xi."""
    rng = np.random.default_rng(seed)
    state_dim = 6
    dyn = np.linalg.qr(rng.standard_normal((state_dim, state_dim)))[0] * 0.9
    out = rng.standard_normal((a, state_dim))
    seqs = []
    for n in lengths:
        z = rng.standard_normal(state_dim)
        rows = []
        for _ in range(n):
            z = dyn @ z + 0.3 * rng.standard_normal(state_dim)
            rows.append(out @ z + 0.05 * rng.standard_normal(a))
        seqs.append(np.array(rows))
    return seqs


# The randomized solver three ways: all in float64 (a tolerance below float32's reach), and
# iterating in float32 (a loose tolerance) with the final Rayleigh-Ritz step in float64 on
# Xi^T Q held whole ("mixed") or streamed in column chunks ("mixed-streamed").
VARIANTS = {"dense": {"solver": "dense"}, "qr": {"solver": "qr"},
            "randomized": {"solver": "randomized", "tol": 1e-8},
            "mixed": {"solver": "randomized", "tol": 1e-2},
            "mixed-streamed": {"solver": "randomized", "tol": 1e-2}}


def fit_variant(variant, monkeypatch, n_components, seqs, **kwargs):
    if variant == "mixed-streamed":
        monkeypatch.setattr(la_solvers, "_STAGE_B_MAX_BYTES", 0)
    la = LinearAutoencoder(n_components, random_state=0, **{**VARIANTS[variant], **kwargs})
    la.fit(seqs)
    if variant.startswith("mixed"):
        assert la.iteration_dtype_ == "float32"
    elif variant == "randomized":
        assert la.iteration_dtype_ == "float64"
    assert la.A_.dtype == np.float64
    return la


def test_xi_rows_is_the_reversed_prefix_matrix():
    x = np.arange(12.0).reshape(4, 3)
    rows = xi_rows(x, 3)
    expected = np.array([
        [*x[0], 0, 0, 0, 0, 0, 0],
        [*x[1], *x[0], 0, 0, 0],
        [*x[2], *x[1], *x[0]],
        [*x[3], *x[2], *x[1]],
    ])
    np.testing.assert_array_equal(rows, expected)


@pytest.mark.parametrize("variant", ["dense", "randomized", "mixed", "mixed-streamed"])
def test_full_length_full_rank_is_exact(variant, monkeypatch):
    seqs = random_sequences([7, 5, 9, 4, 8], 3)
    xi = build_xi(seqs, 9)
    s_ref = np.linalg.svd(xi, compute_uv=False)
    rank = np.linalg.matrix_rank(xi)
    la = fit_variant(variant, monkeypatch, rank, seqs)
    solver = VARIANTS[variant]["solver"]
    assert la.n_components_ == rank and la.solver_ == solver
    # the randomized solver takes the singular values from the Gram matrix of Xi^T Q: exact up to
    # the Gram's rounding, eps ||Xi||^2 on s_i^2 (Weyl), i.e. eps s_1^2 / s_i on s_i
    gram_error = 10 * np.finfo(float).eps * s_ref[0] ** 2 / s_ref[:rank]
    assert np.all(np.abs(la.singular_values_ - s_ref[:rank]) <= 1e-10 * s_ref[:rank] + gram_error)
    for x in seqs:
        states = la.encode(x)
        rec = la.decode(states[-1], len(x))
        assert np.abs(rec - x).max() <= 1e-8 * np.abs(x).max()
        # eq. 2: [x_t; y_{t-1}] = C y_t for every step
        for t in range(1, len(x)):
            np.testing.assert_allclose(la.C_ @ states[t], np.concatenate([x[t], states[t - 1]]),
                                       atol=1e-9)
    if solver == "dense":
        np.testing.assert_allclose(la.all_singular_values_, s_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("variant", ["dense", "qr", "randomized", "mixed", "mixed-streamed"])
def test_windowed_full_rank_is_exact(variant, monkeypatch):
    seqs = random_sequences([30, 12, 25, 61], 4, seed=1)  # 61 > window * a: sliced by "qr"
    window = 5
    xi = build_xi(seqs, window)
    assert xi_squared_norm(seqs, window) == pytest.approx(np.linalg.norm(xi) ** 2)
    rank = np.linalg.matrix_rank(xi)
    assert rank == window * 4
    la = fit_variant(variant, monkeypatch, rank, seqs, window=window)
    np.testing.assert_allclose(la.singular_values_, np.linalg.svd(xi, compute_uv=False),
                               rtol=1e-10)
    for x in seqs:
        states = la.encode(x)
        for t in range(len(x)):
            m = min(t + 1, window)
            rec = la.decode(states[t], m)
            assert np.abs(rec - x[t + 1 - m: t + 1]).max() <= 1e-8 * np.abs(x).max()


@pytest.mark.parametrize(("window", "variant"), [
    (None, "randomized"), (None, "mixed"), (None, "mixed-streamed"),
    (6, "qr"), (6, "randomized"), (6, "mixed"), (6, "mixed-streamed")])
def test_solvers_agree_with_dense_below_rank(window, variant, monkeypatch):
    seqs = smooth_sequences([40, 33, 50, 21], 5, seed=2)
    p = 8
    ref = LinearAutoencoder(p, window=window, solver="dense").fit(seqs)
    if variant.startswith("mixed"):
        # float32 iterations stop once every Ritz value settles to 1e-4 (the loosest tolerance
        # that the float32 path takes): values that close, vectors to about its square root
        la = fit_variant(variant, monkeypatch, p, seqs, window=window, tol=1e-4)
        rtol, max_angle, atol = 1e-5, 1e-2, 1e-3
    else:
        la = fit_variant(variant, monkeypatch, p, seqs, window=window)
        rtol, max_angle, atol = 1e-6, 1e-4, 1e-5
    np.testing.assert_allclose(la.singular_values_, ref.singular_values_, rtol=rtol)
    angles = scipy.linalg.subspace_angles(la.components_.T, ref.components_.T)
    assert angles.max() < max_angle
    # same subspace and the same deterministic signs: the same A and B
    np.testing.assert_allclose(la.A_, ref.A_, atol=atol)
    np.testing.assert_allclose(la.B_, ref.B_, atol=atol)


def test_randomized_solver_warns_when_it_stops_at_max_iter():
    seqs = smooth_sequences([40, 33, 50, 21], 5, seed=2)
    with pytest.warns(la_solvers.ConvergenceWarning, match="max_iter=1"):
        la = LinearAutoencoder(8, solver="randomized", tol=1e-12, max_iter=1,
                               random_state=0).fit(seqs)
    assert la.n_iter_ == 1


def test_sign_convention_is_the_largest_entry_positive():
    rng = np.random.default_rng(8)
    u = rng.standard_normal((40000, 3))  # more rows than one scan block
    u[35000, 0], u[123, 1], u[39999, 2] = -9.0, 9.0, -9.5
    fixed = la_solvers.sign_fix(u.copy())
    np.testing.assert_array_equal(fixed, u * np.array([-1.0, 1.0, -1.0]))


def test_svd_error_is_the_tail_energy_and_la_error_is_consistent():
    seqs = smooth_sequences([30, 24, 18], 4, seed=3)
    xi = build_xi(seqs, 30)
    s = np.linalg.svd(xi, compute_uv=False)
    prev = None
    for p in (2, 5, 10, 20):
        la = LinearAutoencoder(p, solver="dense").fit(seqs)
        u = la.components_.T
        residual = np.linalg.norm(xi - xi @ u @ u.T) ** 2
        assert residual == pytest.approx((s[p:] ** 2).sum(), rel=1e-9)
        assert la.xi_norm2_ == pytest.approx(np.linalg.norm(xi) ** 2, rel=1e-12)
        assert la.relative_svd_error_ == pytest.approx(residual / la.xi_norm2_, rel=1e-8)
        err = la.reconstruction_error(seqs)
        # brute force over the same entries: the inputs up to each step
        la_sum = svd_sum = count = 0.0
        for x in seqs:
            states = la.encode(x)
            rows = xi_rows(x, la.window_)
            proj = rows @ u @ u.T
            for t in range(len(x)):
                rec = la.decode(states[t], t + 1)
                la_sum += ((rec - x[: t + 1]) ** 2).sum()
                svd_sum += ((proj[t, : (t + 1) * 4] - rows[t, : (t + 1) * 4]) ** 2).sum()
                count += (t + 1) * 4
        assert err["la"] == pytest.approx(la_sum / count, rel=1e-9)
        assert err["svd"] == pytest.approx(svd_sum / count, rel=1e-9)
        assert err["svd"] <= err["la"] + 1e-12
        if prev is not None:
            assert err["svd"] < prev
        prev = err["svd"]


def test_rank_warning_centering_and_input_untouched():
    seqs = random_sequences([6, 4], 3, seed=4)
    seqs = [s + 5.0 for s in seqs]
    copies = [s.copy() for s in seqs]
    xi = build_xi([s - np.concatenate(seqs).mean(0) for s in seqs], 6)
    rank = np.linalg.matrix_rank(xi)
    with pytest.warns(UserWarning, match="exceeds rank"):
        la = LinearAutoencoder(100, center=True, solver="dense").fit(seqs)
    assert la.n_components_ == rank
    np.testing.assert_allclose(la.mean_, np.concatenate(seqs).mean(0))
    for x, original in zip(seqs, copies, strict=True):
        np.testing.assert_array_equal(x, original)
        np.testing.assert_allclose(la.decode(la.encode(x)[-1], len(x)), x, atol=1e-9)


def test_float32_torch_input_and_batched_encode():
    seqs = random_sequences([9, 6, 3], 4, seed=5)
    la = LinearAutoencoder(10, solver="dense").fit([torch.tensor(s, dtype=torch.float32)
                                                   for s in seqs])
    assert la.A_.dtype == np.float32
    la64 = LinearAutoencoder(10, solver="dense").fit(seqs)
    np.testing.assert_allclose(la.singular_values_, la64.singular_values_, rtol=1e-4)
    fast = LinearAutoencoder(10, solver="randomized", tol=1e-8, random_state=0).fit(
        [s.astype(np.float32) for s in seqs])  # float32 in and out, iterated in float32
    assert fast.A_.dtype == np.float32 and fast.iteration_dtype_ == "float32"
    np.testing.assert_allclose(fast.singular_values_, la64.singular_values_, rtol=1e-4)
    loose = LinearAutoencoder(10, solver="randomized", tol=1e-2, random_state=0).fit(
        [s.astype(np.float32) for s in seqs])  # a loose tolerance iterates in float32
    assert loose.A_.dtype == np.float32 and loose.iteration_dtype_ == "float32"
    padded = np.zeros((3, 9, 4))
    for i, s in enumerate(seqs):
        padded[i, : len(s)] = s
    batch = la64.encode(padded, lengths=[9, 6, 3])
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(batch[i, : len(s)], la64.encode(s), atol=1e-12)
        assert np.all(batch[i, len(s):] == 0)
    # a list of sequences of their own lengths, as fit takes it: a list of their states, each
    # the eq. 1 recursion run by hand
    listed = la64.transform(seqs)
    assert [len(y) for y in listed] == [9, 6, 3]
    for s, states in zip(seqs, listed, strict=True):
        y = np.zeros(10)
        for t, x in enumerate(s):
            y = la64.A_ @ x + la64.B_ @ y
            np.testing.assert_allclose(states[t], y, atol=1e-12)
    refit = LinearAutoencoder(10, solver="dense")
    fitted = refit.fit_transform([torch.from_numpy(s) for s in seqs])
    for a, b in zip(fitted, listed, strict=True):
        np.testing.assert_array_equal(a, b)
    assert refit.A_.shape == la64.A_.shape


def test_bad_input():
    good = random_sequences([5, 4], 3)
    with pytest.raises(ValueError, match="non-empty"):
        LinearAutoencoder(2).fit([])
    with pytest.raises(ValueError, match="features"):
        LinearAutoencoder(2).fit([good[0], np.ones((4, 2))])
    with pytest.raises(ValueError, match="NaN"):
        LinearAutoencoder(2).fit([good[0], np.full((3, 3), np.nan)])
    with pytest.raises(ValueError, match="NaN"):
        LinearAutoencoder(2).fit([np.array([[1.0, np.inf, 0.0]])])
    with pytest.raises(ValueError, match="T >= 1"):
        LinearAutoencoder(2).fit([good[0], np.ones((0, 3))])
    with pytest.raises(ValueError, match="window"):
        LinearAutoencoder(2, solver="qr").fit(good)
    with pytest.raises(ValueError, match="n_components"):
        LinearAutoencoder(0).fit(good)
    with pytest.raises(ValueError,
                       match=r"n_components must be a positive integer or None, got 2\.0"):
        LinearAutoencoder(2.0).fit(good)
    with pytest.raises(ValueError, match="solver"):
        LinearAutoencoder(2, solver="magic").fit(good)
    for method, args in (("encode", (good[0],)), ("decode", (np.ones(2), 3)),
                         ("transform", (good,)), ("reconstruction_error", (good,))):
        with pytest.raises(NotFittedError, match="not fitted") as info:
            getattr(LinearAutoencoder(2), method)(*args)
        # caught as scikit-learn's NotFittedError is (ValueError, AttributeError), and as before
        assert all(isinstance(info.value, kind)
                   for kind in (ValueError, AttributeError, RuntimeError))
    la = LinearAutoencoder(2, solver="dense").fit(good)
    with pytest.raises(ValueError, match="expected"):
        la.encode(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"sequence 1: expected \(T, 3\)"):
        la.encode([good[0], np.ones((4, 5))])
    with pytest.raises(ValueError, match="lengths"):
        la.encode(good, lengths=[4, 4])
    with pytest.raises(ValueError, match="state"):
        la.decode(np.ones(3), 2)


@pytest.mark.parametrize("kwargs", [dict(window=4, center=True, solver="qr"),
                                    dict(solver="randomized", tol=1e-3, random_state=3)])
def test_save_and_load_round_trip(tmp_path, kwargs):
    """Every parameter and fitted attribute comes back; the loaded estimator encodes, decodes and
    truncates exactly as the original."""
    seqs = smooth_sequences([20, 15], 3, seed=6)
    la = LinearAutoencoder(5, **kwargs).fit(seqs)
    la.save(tmp_path / "la.npz")
    again = LinearAutoencoder.load(tmp_path / "la.npz")
    assert again.get_params() == la.get_params()
    fitted = {k for k in vars(la) if k.endswith("_")}
    assert {k for k in vars(again) if k.endswith("_")} == fitted
    for name in fitted:
        if isinstance(getattr(la, name), np.ndarray):
            np.testing.assert_array_equal(getattr(again, name), getattr(la, name))
        else:
            assert getattr(again, name) == getattr(la, name), name
    np.testing.assert_array_equal(again.encode(seqs[0]), la.encode(seqs[0]))
    np.testing.assert_array_equal(again.decode(la.encode(seqs[0])[-1], 3),
                                  la.decode(la.encode(seqs[0])[-1], 3))
    cut, cut_again = la.truncated(3), again.truncated(3)
    np.testing.assert_array_equal(cut_again.encode(seqs[1]), cut.encode(seqs[1]))
    assert cut_again.relative_svd_error_ == cut.relative_svd_error_
    with np.load(tmp_path / "la.npz", allow_pickle=False) as f:
        assert "A_" in f.files


def test_scikit_learn_clone_and_set_params():
    """scikit-learn's own clone, check_is_fitted and set_params protocol on the estimator."""
    from sklearn.base import clone
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    seqs = smooth_sequences([20, 15], 3, seed=7)
    la = LinearAutoencoder(4, window=5, center=True, solver="qr")
    with pytest.raises(NotFittedError):
        check_is_fitted(la)
    la.fit(seqs, None)
    check_is_fitted(la)
    copy = clone(la)  # the arguments, none of the fitted attributes
    assert copy is not la and copy.get_params() == la.get_params()
    assert copy.get_params(deep=False) == la.get_params(deep=True)
    with pytest.raises(NotFittedError):
        check_is_fitted(copy)
    np.testing.assert_array_equal(copy.fit(seqs).A_, la.A_)
    assert copy.set_params(n_components=2, window=3) is copy
    assert copy.get_params()["n_components"] == 2 and copy.n_components_ == 4  # until refit
    refit = copy.fit(seqs)
    fresh = LinearAutoencoder(2, window=3, center=True, solver="qr").fit(seqs)
    assert refit.n_components_ == 2
    np.testing.assert_array_equal(refit.A_, fresh.A_)
    np.testing.assert_array_equal(refit.B_, fresh.B_)
    with pytest.raises(ValueError, match=r"invalid parameter\(s\) \['windows'\]"):
        la.set_params(windows=3)
    with pytest.raises(ValueError, match="positive"):
        LinearAutoencoder(4).set_params(n_components=0).fit(seqs)


def test_scikit_learn_check_estimator_passes_but_for_what_a_sequence_is():
    """Every check of sklearn.utils.estimator_checks passes (sparse input refused in words,
    n_iter_ after a fit, ...) but the two declared with their reason: a 2-D array is one
    sequence, so its rows' order and subsets change its states."""
    import warnings

    from sklearn.utils.estimator_checks import check_estimator

    from linmem.la import SKLEARN_EXPECTED_FAILED_CHECKS

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # not a BaseEstimator; the array-API check skipped
        results = check_estimator(LinearAutoencoder(), on_fail=None,
                                  expected_failed_checks=SKLEARN_EXPECTED_FAILED_CHECKS)
    status = {r["check_name"]: r["status"] for r in results}
    assert len(status) >= 35
    assert {name for name, s in status.items() if s == "failed"} == set()
    assert {name for name, s in status.items() if s == "xfail"} == set(
        SKLEARN_EXPECTED_FAILED_CHECKS)  # each declared failure is a real one
    assert status["check_estimator_sparse_array"] == "passed"
    assert status["check_transformer_n_iter"] == "passed"


def test_inverse_transform_takes_what_transform_gives():
    """A list of sequences (ragged), a padded batch, one sequence: inverse_transform of
    transform is A^T y_t in each shape, equal to the one-sequence result."""
    seqs = smooth_sequences([20, 15], 3, seed=8)
    la = LinearAutoencoder(4, window=5, solver="dense").fit(seqs)
    back = la.inverse_transform(la.transform(seqs))
    assert isinstance(back, list) and [b.shape for b in back] == [(20, 3), (15, 3)]
    for b, s in zip(back, seqs, strict=True):
        np.testing.assert_allclose(b, la.encode(s) @ la.A_, rtol=1e-12)
    batch = la.inverse_transform(la.transform(np.stack([seqs[0][:15], seqs[1]])))
    np.testing.assert_allclose(batch[1], back[1], rtol=1e-12)
    with pytest.raises(ValueError, match=r"expected states \(\.\.\., 4\)"):
        la.inverse_transform(np.zeros((3, 5)))
    import scipy.sparse

    with pytest.raises(TypeError, match="sparse input is not supported"):
        la.transform(scipy.sparse.csr_matrix(seqs[0]))


def test_constructor_arguments_after_n_components_are_keywords():
    with pytest.raises(TypeError):
        LinearAutoencoder(5, 4)
    assert LinearAutoencoder(5, window=4).get_params()["window"] == 4


def test_the_default_keeps_every_component_of_a_small_xi():
    """LinearAutoencoder() as scikit-learn's PCA(): every component (the rank of Xi, no
    warning), equal to asking for the rank; a Xi too large for an exact decomposition, or the
    randomized solver, is one clear error asking for n_components."""
    import warnings

    seqs = smooth_sequences([12, 9], 3, seed=9)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        la = LinearAutoencoder(window=4).fit(seqs)
    assert la.n_components_ == la.rank_ == 12  # window 4 x 3 features, full column rank
    np.testing.assert_array_equal(la.A_, LinearAutoencoder(la.rank_, window=4).fit(seqs).A_)
    with pytest.raises(ValueError, match="randomized solver finds a few, pass n_components"):
        LinearAutoencoder(window=4, solver="randomized").fit(seqs)
    long = [np.random.default_rng(0).random((3000, 88)) for _ in range(2)]
    with pytest.raises(ValueError, match=r"keeps every component of Xi, 6000 x 264000 here"):
        LinearAutoencoder().fit(long)


def test_load_reads_the_first_file_format(tmp_path):
    """Files written before every attribute was kept (meta_* arrays) still load and encode."""
    seqs = smooth_sequences([20, 15], 3, seed=6)
    la = LinearAutoencoder(5, window=4, center=True, solver="qr").fit(seqs)
    meta = {"n_components": 5, "window": 4, "center": 1, "n_components_": 5,
            "n_features_in_": 3, "window_": 4}
    np.savez(tmp_path / "old.npz", solver_=np.array("qr"), solver=np.array("qr"),
             **{k: getattr(la, k) for k in ("A_", "B_", "C_", "singular_values_",
                                            "components_", "mean_")},
             **{f"meta_{k}": np.array(v) for k, v in meta.items()})
    old = LinearAutoencoder.load(tmp_path / "old.npz")
    np.testing.assert_array_equal(old.encode(seqs[0]), la.encode(seqs[0]))


def test_auto_solver_choice():
    la = LinearAutoencoder(3)
    assert la._choose_solver(100, 100) == "dense"
    assert la._choose_solver(10**6, 10**4) == "randomized"
    assert LinearAutoencoder(3, window=10)._choose_solver(10**6, 880) == "qr"
    seqs = random_sequences([5, 4], 3)
    assert LinearAutoencoder(2).fit(seqs).solver_ == "dense"


def test_truncated_equals_a_smaller_fit():
    seqs = smooth_sequences([25, 30], 4, seed=7)
    big = LinearAutoencoder(12, window=6, solver="qr").fit(seqs)
    small = LinearAutoencoder(5, window=6, solver="qr").fit(seqs)
    cut = big.truncated(5)
    for name in ("A_", "B_", "C_", "singular_values_", "components_"):
        np.testing.assert_allclose(getattr(cut, name), getattr(small, name), atol=1e-12)
    assert cut.relative_svd_error_ == pytest.approx(small.relative_svd_error_)
    assert big.n_components_ == 12  # the original is unchanged
    np.testing.assert_allclose(cut.encode(seqs[0]), small.encode(seqs[0]), atol=1e-10)
    with pytest.raises(ValueError, match="n_components"):
        big.truncated(13)


def test_the_fft_follows_the_thread_policy(monkeypatch):
    """The randomized solver's FFTs use torch's thread count (a search worker's share of the
    CPUs), not every CPU of the machine (issue 47)."""
    import scipy.fft
    import torch

    seen = []
    real = scipy.fft.rfft

    def rfft(*args, workers=None, **kwargs):
        seen.append(workers)
        return real(*args, workers=workers, **kwargs)

    monkeypatch.setattr(scipy.fft, "rfft", rfft)
    rng = np.random.default_rng(0)
    seqs = [rng.standard_normal((30, 4)) for _ in range(3)]
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        LinearAutoencoder(3, solver="randomized").fit(seqs)
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}


def test_two_default_fits_are_the_same():
    """The default seed is fixed: two fits of the same data with the default options are equal
    bit for bit, also where "auto" takes the randomized solver (JSB Chorales at full length,
    the README's example); ``random_state=None`` draws a fresh start each time."""
    rng = np.random.default_rng(0)
    seqs = [(rng.random((int(rng.integers(20, 60)), 12)) < 0.3).astype(np.float64)
            for _ in range(8)]
    a = LinearAutoencoder(10, solver="randomized", tol=1e-3).fit(seqs)
    b = LinearAutoencoder(10, solver="randomized", tol=1e-3).fit(seqs)
    assert a.random_state == 0
    assert np.array_equal(a.A_, b.A_) and np.array_equal(a.B_, b.B_)
    c = LinearAutoencoder(10, solver="randomized", tol=1e-3, random_state=None).fit(seqs)
    d = LinearAutoencoder(10, solver="randomized", tol=1e-3, random_state=None).fit(seqs)
    assert not np.array_equal(c.A_, d.A_)  # a fresh start each: not bit for bit


@pytest.mark.slow
def test_the_readme_fit_is_deterministic(jsb):
    """The README's ten lines: LinearAutoencoder(n_components=100) on JSB Chorales' training
    split ("auto" takes the randomized solver there), twice: the same matrices."""
    a = LinearAutoencoder(n_components=100).fit(jsb["train"])
    b = LinearAutoencoder(n_components=100).fit(jsb["train"])
    assert a.solver_ == "randomized"
    assert np.array_equal(a.A_, b.A_) and np.array_equal(a.B_, b.B_)


@pytest.mark.slow
def test_a_long_sequence_keeps_its_components_in_every_precision(data_dir):
    """Piano-midi.de's longest training sequence (3,857 frames, uint8 as the data set gives it)
    at full length, 50 components: uint8, float32 and float64 keep all 50, with the same
    singular values to float32 precision (the rank's cutoff once scaled with float32's eps and
    Xi's width, 3,857 x 88 columns, and kept 1)."""
    x = max(load_polyphonic("piano", root=data_dir)["train"], key=len)
    assert x.shape == (3857, 88) and x.dtype == np.uint8
    fits = {dt: LinearAutoencoder(50, tol=1e-2).fit([x.astype(dt)])
            for dt in (np.uint8, np.float32, np.float64)}
    reference = fits[np.float64].singular_values_
    for dt, la in fits.items():
        assert la.n_components_ == 50 and la.solver_ == "randomized", dt
        np.testing.assert_allclose(la.singular_values_, reference, rtol=1e-5)
    assert fits[np.uint8].A_.dtype == np.float32  # the attributes in the input's precision


def test_load_of_a_file_that_is_not_a_saved_estimator_names_it(tmp_path):
    """Issue 91 item 4: random bytes, an empty file and a truncated save are one ValueError
    naming the file, never numpy's advice to load it with allow_pickle."""
    import os

    la = LinearAutoencoder(3, random_state=0).fit([np.random.default_rng(0).random((20, 5))])
    la.save(tmp_path / "ok.npz")
    whole = (tmp_path / "ok.npz").read_bytes()
    for name, data in (("random", os.urandom(300)), ("empty", b""),
                       ("truncated", whole[: len(whole) // 2])):
        path = tmp_path / f"{name}.npz"
        path.write_bytes(data)
        with pytest.raises(ValueError, match="cannot load a linear autoencoder") as err:
            LinearAutoencoder.load(path)
        assert str(path) in str(err.value) and "allow_pickle" not in str(err.value)
    with pytest.raises(FileNotFoundError):
        LinearAutoencoder.load(tmp_path / "missing.npz")
    np.testing.assert_array_equal(LinearAutoencoder.load(tmp_path / "ok.npz").B_, la.B_)
