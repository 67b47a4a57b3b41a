"""The linear autoencoder's solvers (:class:`linmem.la.LinearAutoencoder`): the matrix ``Xi`` of a
sequence's reversed prefixes (paper sec. 2; :func:`xi_rows`, :func:`build_xi`), and the SVDs
that give its components: dense, an exact streamed QR, and a randomized one that never forms
``Xi`` (its products with ``Xi`` by FFTs of the sequences); their signs fixed so that a fit is
reproducible (:func:`sign_fix`)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import scipy.fft
import scipy.linalg

from linmem._threads import compute_threads

__all__ = ["ConvergenceWarning", "build_xi", "numerical_rank", "shift_gram", "sign_fix",
           "svd_dense", "svd_qr", "svd_randomized", "xi_rows", "xi_squared_norm"]

_FLOAT32_TOL = 1e-4  # randomized solver: from this tolerance up, iterate in float32
_STAGE_B_MAX_BYTES = 1e9  # final Rayleigh-Ritz step: hold Xi^T Q whole up to this size


class ConvergenceWarning(UserWarning):
    """The randomized solver reached ``max_iter`` before its tolerance."""


def xi_rows(x: np.ndarray, window: int) -> np.ndarray:
    """The rows of ``Xi`` for one sequence ``x`` ``(T, a)``: row ``t`` is
    ``[x_t, x_{t-1}, ..., x_{t-window+1}]`` with zeros before the start, shape ``(T, window*a)``."""
    steps, a = x.shape
    padded = np.concatenate([np.zeros((window - 1, a), x.dtype), x])
    view = np.lib.stride_tricks.sliding_window_view(padded, window, axis=0)  # (T, a, window)
    return view[:, :, ::-1].transpose(0, 2, 1).reshape(steps, window * a)


def xi_squared_norm(sequences: Sequence[np.ndarray], window: int) -> float:
    """``||Xi||_F^2`` without forming ``Xi``: input ``x_j`` of a length-``T`` sequence appears in
    ``min(window, T - j)`` rows."""
    total = 0.0
    for x in sequences:
        counts = np.minimum(window, len(x) - np.arange(len(x)))
        total += float(counts @ (np.asarray(x, dtype=np.float64) ** 2).sum(1))
    return total


def build_xi(sequences: Sequence[np.ndarray], window: int) -> np.ndarray:
    """The dense ``Xi`` (eq. 3) of ``sequences`` with ``window`` blocks (tests, small data)."""
    return np.concatenate([xi_rows(np.asarray(s), window) for s in sequences])


def shift_gram(u: np.ndarray, a: int) -> np.ndarray:
    """``B = U^T R U`` for ``U`` ``(L a, p)``: ``sum_i U_i^T U_{i-1}`` over blocks ``i >= 1``."""
    return u[a:].T @ u[:-a]  # one product on two views of U: no copy of U


def numerical_rank(s: np.ndarray, shape: tuple[int, int], safety: float = 1.0) -> int:
    """How many singular values ``s`` (descending) of a ``shape`` matrix are numerically nonzero:
    above ``safety * s_1 * max(shape) * eps``."""
    if s.size == 0 or s[0] == 0:
        return 0
    tol = safety * s[0] * max(shape) * np.finfo(s.dtype).eps
    return int((s > tol).sum())


def _row_blocks(n: int, size: int = 16384):
    return (slice(i, i + size) for i in range(0, n, size))


def sign_fix(u: np.ndarray) -> np.ndarray:
    """Deterministic signs, in place: the largest-magnitude entry of each column (the first one
    on ties) is positive. Scans ``u`` in row blocks: no temporary of ``u``'s size."""
    cols = np.arange(u.shape[1])
    best = np.full(u.shape[1], -1.0)
    signs = np.ones(u.shape[1], u.dtype)
    for rows in _row_blocks(u.shape[0]):
        block = u[rows]
        idx = np.abs(block).argmax(axis=0)
        value = block[idx, cols]
        better = np.abs(value) > best
        best[better] = np.abs(value[better])
        signs[better] = np.where(value[better] < 0, -1, 1)
    u *= signs
    return u


# ----------------------------------------------------------------------------- solvers


def svd_dense(seqs, window, p):
    xi = build_xi(seqs, window)
    _, s, ut = np.linalg.svd(xi, full_matrices=False)
    return s, sign_fix(ut[:p].T.copy()), xi.shape


def svd_qr(seqs, window, p):
    """Exact streamed SVD of the windowed Xi: fold row blocks into one R factor (TSQR). At most
    ``3 (window a)`` rows of ``Xi`` are held at once, long sequences in slices."""
    a = seqs[0].shape[1]
    cols = window * a
    r = np.zeros((0, cols), seqs[0].dtype)
    pending, pending_rows, rows = [], 0, 0
    for x in seqs:
        for start in range(0, len(x), cols):  # at most `cols` rows of Xi at a time
            first = max(0, start - window + 1)
            block = xi_rows(x[first: start + cols], window)[start - first:]
            pending.append(block)
            pending_rows += len(block)
            rows += len(block)
            if pending_rows >= 2 * cols:
                r = np.linalg.qr(np.concatenate([r, *pending]), mode="r")
                pending, pending_rows = [], 0
    if pending:
        r = np.linalg.qr(np.concatenate([r, *pending]), mode="r")
    _, s, ut = np.linalg.svd(r, full_matrices=False)
    return s, sign_fix(ut[:p].T.copy()), (rows, cols)


class _ImplicitXi:
    """``Xi`` of a set of sequences as a linear operator, applied by FFT per length group, in the
    sequences' precision (operands of another precision are cast, chunk by chunk)."""

    def __init__(self, seqs: list[np.ndarray], window: int):
        self.window = window
        self.a = seqs[0].shape[1]
        self.dtype = seqs[0].dtype
        self.lengths = np.array([len(s) for s in seqs])
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)])
        self.n_rows = int(self.offsets[-1])
        self.n_cols = window * self.a
        order = np.argsort(self.lengths, kind="stable")
        self.groups = []  # (indices, lags used, FFT size, longest length, stacked spectra)
        start = 0
        while start < len(order):  # lengths within a factor 1.5 share one FFT size
            stop = start
            limit = max(1.5 * self.lengths[order[start]], self.lengths[order[start]] + 8)
            while stop < len(order) and self.lengths[order[stop]] <= limit:
                stop += 1
            idx = order[start:stop]
            t_max = int(self.lengths[idx].max())
            lags = min(t_max, window)
            n = scipy.fft.next_fast_len(t_max + lags - 1, real=True)
            spectra = np.stack([scipy.fft.rfft(seqs[i], n, axis=0, workers=compute_threads())
                                for i in idx], 1)  # (F, B, a)
            self.groups.append((idx, lags, n, t_max, spectra))
            start = stop

    def chunk_size(self, budget: float = 6.4e7) -> int:
        """Columns per chunk that keep one chunk's frequency-domain arrays near ``budget`` bytes."""
        biggest = max(g[2] for g in self.groups)
        return max(8, int(budget / (16 * (biggest // 2 + 1) * self.a)))

    def rmatmul(self, z: np.ndarray, chunk: int | None = None) -> np.ndarray:
        """``Xi^T z`` for ``z`` ``(N, r)``: block ``i`` is ``sum_q sum_t x_{t-i} z_t^T``,
        computed ``chunk`` columns at a time (default :meth:`chunk_size`)."""
        chunk = chunk or self.chunk_size()
        out = np.empty((self.window, self.a, z.shape[1]), self.dtype)
        for c in range(0, z.shape[1], chunk):
            out[:, :, c: c + chunk] = self._rmatmul(z[:, c: c + chunk])
        return out.reshape(self.n_cols, z.shape[1])

    def _rmatmul(self, z: np.ndarray) -> np.ndarray:
        r = z.shape[1]
        out = np.zeros((self.window, self.a, r), self.dtype)
        for idx, lags, n, _, spectra in self.groups:
            zs = np.zeros((len(idx), n, r), self.dtype)  # zero-padded to the FFT size here
            for j, i in enumerate(idx):
                zs[j, : self.lengths[i]] = z[self.offsets[i]: self.offsets[i + 1]]
            z_f = scipy.fft.rfft(zs, axis=1, workers=compute_threads())
            z_f = z_f.transpose(1, 0, 2)  # (F, B, r)
            corr_f = np.matmul(spectra.conj().transpose(0, 2, 1), z_f)  # (F, a, r)
            out[:lags] += scipy.fft.irfft(corr_f, n, axis=0, workers=compute_threads())[:lags]
        return out

    def matmul(self, w: np.ndarray) -> np.ndarray:
        """``Xi w`` for ``w`` ``(window a, r)``: row ``t`` is ``sum_i x_{t-i}^T w_i``."""
        r = w.shape[1]
        blocks = w.reshape(self.window, self.a, r).astype(self.dtype, copy=False)
        out = np.empty((self.n_rows, r), self.dtype)
        for idx, lags, n, _, spectra in self.groups:
            w_f = scipy.fft.rfft(blocks[:lags], n, axis=0, workers=compute_threads())  # (F, a, r)
            conv = scipy.fft.irfft(np.matmul(spectra, w_f), n, axis=0,
                                   workers=compute_threads())  # (n, B, r)
            for j, i in enumerate(idx):
                out[self.offsets[i]: self.offsets[i + 1]] = conv[: self.lengths[i], j]
        return out

    def gram_apply(self, q: np.ndarray, chunk: int) -> np.ndarray:
        """``Xi Xi^T q`` in column chunks, so that no ``(window a, r)`` matrix is held whole."""
        out = np.empty(q.shape, self.dtype, order="F")  # Fortran order: QR'd in place after
        for c in range(0, q.shape[1], chunk):
            w = self._rmatmul(q[:, c: c + chunk]).reshape(self.n_cols, -1)
            out[:, c: c + chunk] = self.matmul(w)
        return out


def _orthonormalize(y: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the columns of ``y`` (Householder QR), in ``y``'s own memory when
    ``y`` is Fortran-ordered."""
    return scipy.linalg.qr(y, mode="economic", overwrite_a=True, check_finite=False)[0]


def _ritz(m: np.ndarray, gram: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Eigenpairs of the symmetric ``m`` (with the metric ``gram`` when the basis is not exactly
    orthonormal), largest first."""
    m = (m + m.T) / 2
    evals, evecs = scipy.linalg.eigh(m, None if gram is None else (gram + gram.T) / 2,
                                     driver="evd" if gram is None else "gvd",
                                     check_finite=False)  # divide and conquer: the fastest
    return np.clip(evals[::-1], 0, None), evecs[:, ::-1]


def _rows_tdot(a: np.ndarray, b: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``a^T b`` in ``dtype`` for tall ``a`` and ``b`` of another precision, cast one block of rows
    at a time (no full-size copy)."""
    out = 0
    for rows in _row_blocks(len(a)):
        block = a[rows].astype(dtype)
        out = out + block.T @ (block if b is a else b[rows].astype(dtype, copy=False))
    return out


def _subspace(op: _ImplicitXi, r: int, p: int, rng, max_iter: int, tol: float):
    """An ``(N, r)`` orthonormal basis ``Q`` near the top-``r`` left singular subspace of ``Xi``,
    by subspace iteration on ``Xi Xi^T`` with a Rayleigh-Ritz step per iteration, stopped when
    every one of the top-``p`` Ritz values changes by less than ``tol`` relative to itself (the
    smallest converge last and decide the reconstruction error). Returns ``Q``, the last
    Rayleigh-Ritz eigenpairs of ``Q^T Xi Xi^T Q`` and the number of iterations."""
    chunk = min(r, op.chunk_size())
    # A Gaussian block needs no orthonormalisation: the first product only starts the iteration
    q = rng.standard_normal((r, op.n_rows), dtype=op.dtype).T  # Fortran
    q = op.gram_apply(q, chunk)
    previous = None
    iterations = 0
    while True:
        q = _orthonormalize(q)  # at most two (N, r) blocks alive at once
        y = op.gram_apply(q, chunk)  # Xi Xi^T Q
        evals, evecs = _ritz(q.T @ y)  # the Ritz values of span(Q)
        top = evals[:p]
        # Ritz values are resolved to a few eps * the largest one (float32: ~5e-7 of it): changes
        # below that are rounding, and count as settled
        resolution = 10 * np.finfo(op.dtype).eps * float(top[0])
        converged = previous is not None and np.all(
            np.abs(top - previous) <= tol * top + resolution)
        if converged or iterations >= max_iter:
            if not converged:
                warnings.warn(f"the randomized solver stopped at max_iter={max_iter} before "
                              f"every Ritz value settled to tol={tol:g}", ConvergenceWarning,
                              stacklevel=4)
            return q, evals, evecs, iterations
        previous = top
        q = y
        del y
        iterations += 1


def svd_randomized(seqs, window, p, rng, n_oversamples, max_iter, tol, iterate=None):
    """Top-``p`` singular values ``s`` of ``Xi`` and right singular vectors ``U``
    ``(window a, kept)`` (only the numerically nonzero ones are kept) by subspace iteration
    (:func:`_subspace`), and ``{"n_iter", "iteration_dtype"}``: how it ran.

    ``iterate``: the precision of the iterations below that tolerance (the caller's input's;
    default ``seqs``'). With ``tol >= 1e-4`` the iteration runs in float32 whatever the input's
    precision (twice the speed, half the memory; float32 resolves the Ritz values to about 1e-6,
    far below ``tol``), and the final Rayleigh-Ritz step on the subspace found runs in the
    precision of ``seqs``. Its
    ``U = Xi^T Q E S^-1`` lies in the row space of ``Xi`` and is orthonormal to the input's
    precision (the metric ``Q^T Q`` absorbs the float32 rounding of ``Q``), so a fit at full rank
    stays exact in float64."""
    dtype = seqs[0].dtype
    work = np.dtype(np.float32) if tol >= _FLOAT32_TOL else np.dtype(iterate or dtype)
    op = _ImplicitXi([s.astype(work, copy=False) for s in seqs], window)
    r = min(p + n_oversamples, op.n_rows, op.n_cols)
    q, evals, evecs, iterations = _subspace(op, r, p, rng, max_iter, tol)
    info = {"n_iter": iterations, "iteration_dtype": work.name}
    w = None
    if work != dtype:  # Rayleigh-Ritz again in the input's precision, on the same subspace
        del op
        op = _ImplicitXi(seqs, window)
        gram = _rows_tdot(q, q, dtype)  # Q^T Q in `dtype`: Q is orthonormal only in float32
        if op.n_cols * r * dtype.itemsize <= _STAGE_B_MAX_BYTES:
            w = op.rmatmul(q)  # Xi^T Q: Ritz pairs from W^T W = Q^T Xi Xi^T Q, U from W
            m = w.T @ w
        else:
            m = np.empty((r, r), dtype)  # Q^T Xi Xi^T Q without holding Xi^T Q whole
            chunk = min(r, op.chunk_size())
            for c in range(0, r, chunk):
                m[:, c: c + chunk] = _rows_tdot(q, op.gram_apply(q[:, c: c + chunk], chunk),
                                                dtype)
        evals, evecs = _ritz(m, gram)
    # Ritz values are squared singular values: their rounding is that of the Gram matrix
    kept = numerical_rank(np.sqrt(evals[:p]), (op.n_rows, op.n_cols), safety=10)
    s = np.sqrt(evals[:kept])
    if w is not None:
        return s, w @ (evecs[:, :kept] / s), info
    v = np.empty((op.n_rows, kept), dtype)  # V = Q E: the left singular vectors
    for rows in _row_blocks(op.n_rows):
        v[rows] = q[rows].astype(dtype, copy=False) @ evecs[:, :kept].astype(dtype, copy=False)
    del q
    u = op.rmatmul(v)  # U = Xi^T V S^-1, exact for any window
    u /= s
    return s, u, info
