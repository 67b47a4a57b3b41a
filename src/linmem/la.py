"""The linear autoencoder for sequences (paper, section 2; Sperduti 2013), trained in closed form.

The model is ``y_t = A x_t + B y_{t-1}`` (eq. 1) with decoder ``[x_t; y_{t-1}] = C y_t`` (eq. 2).
Its training matrix ``Xi`` stacks, for every sequence and step, the reversed prefix
``[x_t, x_{t-1}, ..., x_1, 0, ...]`` (eq. 3), or its first ``k`` blocks with a window ``k``. From
the SVD ``Xi = V S U^T`` truncated to ``p`` components: ``A = U^T P`` (the first block of ``U``,
transposed) and ``B = U^T R U`` with ``R`` the down-shift by one block, and ``C = [A^T; B^T]``.
Then ``y_t = U^T xi_t``: the state is the projection of the reversed prefix on the
top-``p`` right singular vectors, and at ``p = rank(Xi)`` encoding and decoding are exact.

Solvers (``solver=``):

- ``"dense"``: materialise ``Xi`` and take its SVD. The reference; for small problems.
- ``"qr"``: window ``k`` only. Streams over sequences, building each sequence's block-Toeplitz
  rows from a strided view of the sequence, and folds them into a ``(k a) x (k a)`` triangular
  factor (TSQR), whose SVD gives ``S`` and ``U`` exactly. Memory ``O((k a)^2)``; the condition
  number is not squared.
- ``"randomized"``: any window, ``p`` components. Subspace iteration (Halko, Martinsson & Tropp
  2011) on ``Xi Xi^T`` in the row space, with ``Xi`` and ``Xi^T`` applied implicitly as per-sequence
  causal convolutions and correlations by FFT, so ``Xi`` (600 GB for MuseData at full length) is
  never formed. The right singular vectors come back through one more implicit product,
  ``U = Xi^T V S^-1``, which holds for any window (the row-space shortcut
  ``B = S^-1 V^T R_t V S`` is exact for the full-length ``Xi`` only). With a loose tolerance
  (``tol >= 1e-4``) the iteration runs in float32 and only this last Rayleigh-Ritz step in the
  input's precision: ``U`` then lies in the row space of ``Xi`` and is orthonormal to that
  precision, so a fit at full rank stays exact.
"""

from __future__ import annotations

import json
import os
import warnings
import zipfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from linmem._check import check_int
from linmem._io import atomic_write
from linmem.la_solvers import (
    numerical_rank,
    shift_gram,
    sign_fix,
    svd_dense,
    svd_qr,
    svd_randomized,
    xi_rows,
    xi_squared_norm,
)

SOLVERS = ("auto", "dense", "qr", "randomized")


class NotFittedError(RuntimeError, ValueError, AttributeError):
    """A :class:`LinearAutoencoder` used before :meth:`~LinearAutoencoder.fit`: a
    ``ValueError`` and an ``AttributeError`` as scikit-learn's ``NotFittedError`` is, so code
    written for its estimators catches it, and a ``RuntimeError`` (a call in the wrong order)."""


_DENSE_MAX_ENTRIES = 2e7  # Xi entries up to which "auto" takes the dense SVD (160 MB in float64)
_QR_MAX_COLUMNS = 4000  # window * features up to which "auto" takes the exact streamed QR


def _refuse_sparse(x: Any) -> None:
    """A ``TypeError`` for a SciPy sparse matrix or array (or a list of them): a piano roll is
    small and dense, and the fit's products want dense rows."""
    import scipy.sparse

    items = x if isinstance(x, (list, tuple)) else [x]
    if any(scipy.sparse.issparse(item) for item in items):
        raise TypeError("sparse input is not supported: pass dense arrays (x.toarray())")


def _as_sequences(sequences, dtype=None) -> tuple[list[np.ndarray], np.dtype]:
    """Validated float copies of the input: a list of ``(T_i, a)`` arrays or tensors, one
    ``(T, a)`` array, or a ``(B, T, a)`` array of equal-length sequences."""
    _refuse_sparse(sequences)
    if hasattr(sequences, "detach"):  # a torch tensor
        sequences = sequences.detach().cpu().numpy()
    if isinstance(sequences, np.ndarray):
        if sequences.ndim == 2:
            sequences = [sequences]
        elif sequences.ndim == 3:
            sequences = list(sequences)
        else:
            raise ValueError(f"expected (T, a) or (B, T, a) input, got shape {sequences.shape}")
    if not isinstance(sequences, Sequence) or len(sequences) == 0:
        raise ValueError("expected a non-empty list of (T_i, a) sequences")
    out = []
    for i, s in enumerate(sequences):
        if hasattr(s, "detach"):
            s = s.detach().cpu().numpy()
        s = np.asarray(s)
        if s.ndim != 2 or s.shape[0] == 0:
            raise ValueError(f"sequence {i} must have shape (T, a) with T >= 1, got {s.shape}")
        if s.shape[1] != np.asarray(sequences[0]).shape[-1]:
            raise ValueError(f"sequence {i} has {s.shape[1]} features, sequence 0 has "
                             f"{np.asarray(sequences[0]).shape[-1]}")
        out.append(s)
    if dtype is None:
        dtype = np.result_type(*[s.dtype for s in out], np.float32)
        dtype = np.float32 if dtype == np.float32 else np.float64
    out = [np.array(s, dtype=dtype, copy=True) for s in out]  # never touch the caller's data
    for i, s in enumerate(out):
        if not np.isfinite(s).all():
            raise ValueError(f"sequence {i} contains NaN or inf")
    return out, np.dtype(dtype)


# ----------------------------------------------------------------------------- the estimator


# the checks of sklearn.utils.estimator_checks that LinearAutoencoder fails by design, with
# why (scikit-learn >= 1.6 takes them as ``check_estimator(..., expected_failed_checks=...)``).
# It does not inherit sklearn.base.BaseEstimator, whose absence check_estimator warns of: it
# implements the protocol itself (get_params, set_params, __sklearn_tags__, fit returning self),
# so scikit-learn stays out of the install and `import linmem.la` does not import it (1.4 s)
SKLEARN_EXPECTED_FAILED_CHECKS = {
    "check_methods_sample_order_invariance": "a 2-D array is one sequence, its rows time steps: "
                                             "their order is the data (a state sums the past)",
    "check_methods_subset_invariance": "a 2-D array is one sequence: a row's state depends on "
                                       "the rows before it, so a subset's states differ",
}


class LinearAutoencoder:
    """Linear autoencoder for sequences, fitted in closed form (scikit-learn conventions).

    Args:
        n_components: the state size ``p``; more than ``rank(Xi)`` keeps the rank, with a
            warning. ``None`` keeps every component (the rank of ``Xi``, by an exact solver:
            for a small ``Xi`` only, scikit-learn's ``PCA()`` default). Default: ``None``.
        window: the number of past inputs (blocks of ``Xi``) to encode; ``None`` for the full
            length of the longest training sequence. Default: ``None``.
        center: subtract the mean input ``mean_`` before encoding (and add it back on
            decoding). Default: ``False``.
        solver: ``"auto"``, ``"dense"``, ``"qr"`` (windowed only) or ``"randomized"``.
            Default: ``"auto"``.
        random_state: the seed of the randomized solver (the exact solvers draw nothing).
            The randomized solver reaches the top subspace to ``tol``, not exactly, from a
            random start: a fixed seed makes two fits of the same data the same, ``None`` draws
            a fresh one per fit. Default: ``0``.
        n_oversamples: extra columns of the randomized solver's subspace. Default:
            ``max(10, n_components // 2)`` (measured on JSB Chorales: far fewer iterations than
            the textbook ``+10`` for the same accuracy).
        max_iter: the randomized solver's iteration bound. Default: 30.
        tol: the randomized solver iterates until each of the top ``n_components`` Ritz values
            (squared singular values) changes by less than ``tol`` relative to itself, or
            ``max_iter`` iterations; ``n_iter_`` says how many it took. With ``tol >= 1e-4``,
            or a float32 input, it iterates in float32 (``iteration_dtype_``), about twice as
            fast in half the memory, and takes the final Rayleigh-Ritz step in float64 (the
            attributes are then in the input's precision), so that a float64 fit at full rank
            stays exact. ``tol = 1e-2`` put the optimal rank-p error
            within 1e-3 (relative) of the dense SVD's on JSB Chorales
            (``benchmarks/la_solvers.py``). Default: ``1e-8``.

    Attributes:
        A_: ``(p, a)``, the encoder's input matrix (eq. 2).
        B_: ``(p, p)``, the encoder's state matrix (eq. 2).
        C_: ``(a + p, p)``, the decoder: ``[x_t; y_{t-1}] = C y_t``.
        singular_values_: ``(p,)``, descending, the ``p`` kept.
        all_singular_values_: all of them (exact solvers only).
        components_: ``(p, window a)``, the right singular vectors of ``Xi``.
        n_components_: ``p``, the components kept.
        n_features_in_: ``a``, the features per step.
        window_: the window used.
        solver_: the solver used.
        mean_: ``(a,)``, the mean input (zeros without centering).
        rank_: the numerical rank of ``Xi`` (exact solvers only).
        n_iter_: iterations run (the randomized solver's; 1 for an exact solver's one
            decomposition).
        iteration_dtype_: the precision the iterations ran in (randomized solver only).
        xi_norm2_: ``||Xi||^2``, for the relative errors.
        relative_svd_error_: the optimal rank-p error relative to ``||Xi||^2``.
    """

    _PARAMS = ("n_components", "window", "center", "solver", "random_state", "n_oversamples",
               "max_iter", "tol")

    def __init__(self, n_components: int | None = None, *, window: int | None = None,
                 center: bool = False, solver: str = "auto", random_state: int | None = 0,
                 n_oversamples: int | None = None, max_iter: int = 30, tol: float = 1e-8):
        self.n_components = n_components
        self.window = window
        self.center = center
        self.solver = solver
        self.random_state = random_state
        self.n_oversamples = n_oversamples
        self.max_iter = max_iter
        self.tol = tol

    # -- fitting ---------------------------------------------------------------------------

    def _choose_solver(self, n_rows: int, n_cols: int) -> str:
        if self.solver != "auto":
            return self.solver
        if n_rows * n_cols <= _DENSE_MAX_ENTRIES:
            return "dense"
        if self.window is not None and n_cols <= _QR_MAX_COLUMNS:
            return "qr"
        return "randomized"

    def fit(self, sequences, y: None = None) -> LinearAutoencoder:
        """Fit on a list of ``(T_i, a)`` sequences (arrays or tensors); returns ``self``. ``y``
        is ignored (scikit-learn's signature for unsupervised estimators)."""
        check_int("n_components", self.n_components, none_ok=True)
        check_int("window", self.window, none_ok=True)
        if self.solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {self.solver!r}")
        seqs, out_dtype = _as_sequences(sequences)
        # the decomposition's last step (and so the numerical rank's cutoff) in float64 whatever
        # the input's precision, the attributes then in the input's: the cutoff scales with eps
        # and with the width of Xi (window x a), and at full length in float32 it dropped
        # components of a third of s_1 that float64 keeps (a uint8 piano roll is exact in
        # either); the randomized solver still iterates in the input's precision
        seqs, dtype = [s.astype(np.float64, copy=False) for s in seqs], np.dtype(np.float64)
        a = seqs[0].shape[1]
        self.n_features_in_ = a
        self.mean_ = (np.concatenate(seqs).mean(0) if self.center else np.zeros(a, dtype))
        if self.center:
            for s in seqs:
                s -= self.mean_
        window = int(self.window) if self.window is not None else max(len(s) for s in seqs)
        self.window_ = window
        n_rows, n_cols = sum(len(s) for s in seqs), window * a
        solver = self._choose_solver(n_rows, n_cols)
        if self.n_components is None:  # every component: an exact solver's, on a small Xi
            if solver == "randomized":
                raise ValueError(
                    f"n_components=None keeps every component of Xi, {n_rows} x {n_cols} here: "
                    "too large for an exact decomposition" if self.solver == "auto" else
                    "n_components=None keeps every component: the randomized solver finds a "
                    "few, pass n_components (or solver='dense')")
        if solver == "qr" and self.window is None:
            raise ValueError("solver='qr' needs a window; use 'randomized' for full length")
        self.solver_ = solver
        p = min(n_rows, n_cols) if self.n_components is None else int(self.n_components)
        if solver in ("dense", "qr"):
            fit = svd_dense if solver == "dense" else svd_qr
            s, u, shape = fit(seqs, window, min(p, n_rows, n_cols))
            rank = numerical_rank(s, shape)
            self.rank_ = rank
            self.all_singular_values_ = s
            if p > rank:
                if self.n_components is not None:  # None asked for all there are
                    warnings.warn(f"n_components={p} exceeds rank(Xi)={rank}; keeping {rank}",
                                  stacklevel=2)
                p = rank
            u = u[:, :p]
            self.A_ = u[:a].T.copy()
            self.B_ = shift_gram(u, a)
            self.components_ = u.T  # rows: right singular vectors, (p, window * a)
            self.n_iter_ = 1  # one decomposition, as scikit-learn counts an exact solver's
        else:
            rng = np.random.default_rng(self.random_state)
            over = self.n_oversamples if self.n_oversamples is not None else max(10, p // 2)
            s, u, info = svd_randomized(seqs, window, p, rng, over, self.max_iter, self.tol,
                                         iterate=out_dtype)  # float32 input: float32 iterations
            self.n_iter_, self.iteration_dtype_ = info["n_iter"], info["iteration_dtype"]
            if len(s) < p:
                warnings.warn(f"n_components={p} exceeds the numerical rank of Xi "
                              f"({len(s)}); keeping {len(s)}", stacklevel=2)
            p = len(s)
            sign_fix(u)
            self.A_ = u[:a].T.copy()
            self.B_ = shift_gram(u, a)
            self.components_ = u.T  # a view: U can be large, keep one copy
        self.singular_values_ = np.asarray(s[:p])
        self.n_components_ = p
        self.xi_norm2_ = xi_squared_norm(seqs, window)
        self.relative_svd_error_ = max(
            0.0, 1.0 - float((self.singular_values_.astype(np.float64) ** 2).sum())
            / self.xi_norm2_) if self.xi_norm2_ > 0 else 0.0
        self.C_ = np.concatenate([self.A_.T, self.B_.T], 0)  # (a + p, p): [x_t; y_{t-1}] = C y_t
        for name in ("A_", "B_", "C_", "components_", "singular_values_", "all_singular_values_",
                     "mean_"):
            if hasattr(self, name):
                setattr(self, name, getattr(self, name).astype(out_dtype, copy=False))
        return self

    def truncated(self, n_components: int) -> LinearAutoencoder:
        """A copy keeping the first ``n_components`` components. The SVD's components are nested,
        so this equals fitting with fewer components, without a second SVD (e.g. to sweep the
        memory size, as in the paper's Figure 5)."""
        self._check_fitted()
        if int(n_components) != n_components or not 1 <= n_components <= self.n_components_:
            raise ValueError(f"n_components must be in [1, {self.n_components_}], "
                             f"got {n_components!r}")
        p, a = int(n_components), self.n_features_in_
        new = LinearAutoencoder(**{**self.get_params(), "n_components": p})
        for name, value in vars(self).items():
            if name.endswith("_") and not name.startswith("_"):
                setattr(new, name, value)
        u = self.components_[:p].T
        new.components_ = self.components_[:p]
        new.A_ = u[:a].T.copy()
        new.B_ = shift_gram(u, a)
        new.C_ = np.concatenate([new.A_.T, new.B_.T], 0)
        new.singular_values_ = self.singular_values_[:p]
        new.n_components_ = p
        new.relative_svd_error_ = max(0.0, 1.0 - float(
            (new.singular_values_.astype(np.float64) ** 2).sum()) / self.xi_norm2_)
        return new

    # -- using -----------------------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not hasattr(self, "A_"):
            raise NotFittedError("this LinearAutoencoder is not fitted yet; call fit first")

    def encode(self, sequence, lengths=None) -> np.ndarray | list[np.ndarray]:
        """States ``y_t = A x_t + B y_{t-1}`` (eq. 1, ``y_0 = 0``) for every step.

        ``sequence`` is ``(T, a)`` -> ``(T, p)``, a padded batch ``(N, T, a)`` -> ``(N, T, p)``
        computed with batched matrix products (``lengths`` only zeroes the states after each
        sequence's end), or a list of ``(T_i, a)`` sequences, as :meth:`fit` takes them -> a
        list of ``(T_i, p)``.
        """
        self._check_fitted()
        _refuse_sparse(sequence)
        if isinstance(sequence, (list, tuple)) and sequence and all(
                np.ndim(s) == 2 for s in sequence):  # (np.ndim: a tensor's too)
            if lengths is not None:
                raise ValueError("lengths is for a padded (N, T, a) batch, not a list")
            out = []
            for i, s in enumerate(sequence):
                try:
                    out.append(self.encode(s))
                except ValueError as e:
                    raise ValueError(f"sequence {i}: {e}") from None
            return out
        x = sequence.detach().cpu().numpy() if hasattr(sequence, "detach") else np.asarray(
            sequence)
        if x.ndim not in (2, 3) or x.shape[-1] != self.n_features_in_:
            raise ValueError(f"expected (T, {self.n_features_in_}) or (N, T, "
                             f"{self.n_features_in_}) input, got shape {x.shape}")
        if not np.isfinite(x).all():
            raise ValueError("input contains NaN or inf")
        single = x.ndim == 2
        x = (x[None] if single else x).astype(self.A_.dtype) - self.mean_
        drive = x @ self.A_.T  # (N, T, p): every A x_t in one product
        states = np.empty_like(drive)
        y = np.zeros((x.shape[0], self.n_components_), self.A_.dtype)
        bt = self.B_.T
        for t in range(x.shape[1]):
            y = drive[:, t] + y @ bt
            states[:, t] = y
        if lengths is not None:
            mask = np.arange(x.shape[1])[None, :] < np.asarray(lengths)[:, None]
            states *= mask[..., None]
        return states[0] if single else states

    transform = encode

    def fit_transform(self, sequences, y: None = None) -> np.ndarray | list[np.ndarray]:
        """:meth:`fit` on ``sequences``, then their states (:meth:`encode`)."""
        return self.fit(sequences).encode(sequences)

    def decode(self, state, n_steps: int) -> np.ndarray:
        """The last ``n_steps`` inputs reconstructed from one state ``y_t`` ``(p,)``, in
        chronological order (last row ``x_t``): ``x_{t-i} = A^T (B^T)^i y_t`` (eq. 2 iterated)."""
        self._check_fitted()
        y = np.asarray(state.detach().cpu().numpy() if hasattr(state, "detach") else state,
                       dtype=self.A_.dtype)
        if y.shape != (self.n_components_,):
            raise ValueError(f"state must have shape ({self.n_components_},), got {y.shape}")
        if int(n_steps) != n_steps or n_steps < 0:
            raise ValueError(f"n_steps must be a non-negative integer, got {n_steps!r}")
        out = np.empty((int(n_steps), self.n_features_in_), self.A_.dtype)
        for i in range(int(n_steps)):
            out[n_steps - 1 - i] = self.A_.T @ y + self.mean_
            y = self.B_.T @ y
        return out

    def inverse_transform(self, states) -> np.ndarray | list[np.ndarray]:
        """``x_t = A^T y_t`` for every state: ``(T, p) -> (T, a)``, ``(N, T, p) -> (N, T, a)``,
        or a list of ``(T_i, p)`` (what :meth:`transform` gives for a list) -> a list."""
        self._check_fitted()
        _refuse_sparse(states)
        if isinstance(states, (list, tuple)):
            return [self.inverse_transform(s) for s in states]
        y = states.detach().cpu().numpy() if hasattr(states, "detach") else np.asarray(states)
        if y.ndim not in (1, 2, 3) or y.shape[-1] != self.n_components_:
            raise ValueError(f"expected states (..., {self.n_components_}), got shape {y.shape}")
        return y @ self.A_ + self.mean_

    def reconstruction_error(self, sequences, n_steps: int | None = None) -> dict[str, float]:
        """Mean squared error per reconstructed input value, two ways (paper, Figure 5a):

        - ``"la"``: the autoencoder's recursion: from every state ``y_t`` decode the last
          ``min(t, n_steps)`` inputs (``n_steps`` defaults to the window) as in :meth:`decode`;
        - ``"svd"``: the optimal rank-``p`` reconstruction ``xi_t U U^T`` of the same entries of
          ``Xi``.

        Both average over the same entries, so ``svd <= la`` and they agree at full rank.
        """
        self._check_fitted()
        seqs, _ = _as_sequences(sequences, self.A_.dtype)
        n = self.window_ if n_steps is None else int(n_steps)
        if n < 1:
            raise ValueError(f"n_steps must be >= 1, got {n_steps!r}")
        a = self.n_features_in_
        u = self.components_.T  # (window a, p)
        la = svd = 0.0
        count = 0
        for x in seqs:
            xc = x - self.mean_
            cur = self.encode(x)  # (T, p); lag i: x_{t-i} ~ A^T (B^T)^i y_t
            for i in range(min(n, len(x))):
                rec = cur[i:] @ self.A_  # rows t >= i
                la += float(((rec - xc[: len(x) - i]) ** 2).sum())
                count += (len(x) - i) * a
                cur = cur @ self.B_
            rows = xi_rows(xc, self.window_)
            diff = (rows @ u) @ u.T - rows
            blocks = np.minimum(np.arange(1, len(x) + 1), min(n, self.window_))  # per row
            valid = np.arange(self.window_)[None, :] < blocks[:, None]  # (T, window)
            svd += float(((diff.reshape(len(x), self.window_, a) ** 2).sum(-1) * valid).sum())
        return {"la": la / count, "svd": svd / count}

    # -- persistence -----------------------------------------------------------------------

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The constructor's arguments (scikit-learn's ``get_params``, so that
        ``sklearn.base.clone`` and its searches work; ``deep`` changes nothing: no argument is
        itself an estimator)."""
        return {name: getattr(self, name) for name in self._PARAMS}

    def __sklearn_tags__(self):
        """scikit-learn's description of the estimator (its ``Tags``, from 1.6; imported only
        when scikit-learn asks): unsupervised, a transformer, fitted on one ``(T, a)`` sequence,
        a ``(B, T, a)`` array or a list of sequences, which it checks itself."""
        from sklearn.utils import InputTags, Tags, TargetTags, TransformerTags

        return Tags(estimator_type=None, target_tags=TargetTags(required=False),
                    transformer_tags=TransformerTags(), no_validation=True,
                    input_tags=InputTags(two_d_array=True, three_d_array=True))

    def set_params(self, **params: Any) -> LinearAutoencoder:
        """Set constructor arguments (scikit-learn's ``set_params``; checked by :meth:`fit`, as
        the constructor's are); returns ``self``. The fitted attributes stay until the next
        ``fit``."""
        unknown = sorted(set(params) - set(self._PARAMS))
        if unknown:
            raise ValueError(f"invalid parameter(s) {unknown} for LinearAutoencoder; valid: "
                             f"{list(self._PARAMS)}")
        for name, value in params.items():
            setattr(self, name, value)
        return self

    def _fitted(self) -> dict[str, Any]:
        return {k: v for k, v in vars(self).items() if k.endswith("_") and not k.startswith("_")}

    def save(self, path: str | os.PathLike) -> None:
        """Save the parameters and every fitted attribute to a plain ``.npz`` (no pickle):
        arrays as arrays, the rest as JSON; :meth:`load` restores an equal estimator."""
        self._check_fitted()
        fitted = self._fitted()
        arrays = {k: v for k, v in fitted.items() if isinstance(v, np.ndarray)}
        scalars = {k: v.item() if isinstance(v, np.generic) else v
                   for k, v in fitted.items() if k not in arrays}
        header = json.dumps({"format": 2, "params": self.get_params(), "attributes": scalars})
        with atomic_write(path) as f:
            np.savez(f, header_json=np.array(header), **arrays)

    @classmethod
    def load(cls, path: str | os.PathLike) -> LinearAutoencoder:
        """The estimator :meth:`save` wrote (also files of the first format, which kept only the
        arrays needed to encode and decode); ``ValueError`` naming the file when it is not one
        (empty, truncated, another kind of file: never numpy's advice to unpickle it)."""
        try:
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: f[k] for k in f.files}
        except FileNotFoundError:
            raise
        except (ValueError, OSError, EOFError, zipfile.BadZipFile, KeyError):
            why = ("the file is empty" if os.path.isfile(path) and os.path.getsize(path) == 0
                   else "it is not a file LinearAutoencoder.save wrote (an .npz archive of "
                        "arrays); it may be truncated or damaged")
            raise ValueError(f"{path}: cannot load a linear autoencoder: {why}") from None
        if "header_json" not in arrays:
            return cls._load_first_format(arrays)
        header = json.loads(arrays.pop("header_json").item())
        la = cls(**header["params"])
        for name, value in {**header["attributes"], **arrays}.items():
            setattr(la, name, value)
        return la

    @classmethod
    def _load_first_format(cls, f: dict[str, np.ndarray]) -> LinearAutoencoder:
        meta = {k[5:]: f[k].item() for k in f if k.startswith("meta_")}
        la = cls(int(meta["n_components"]),
                 window=None if meta["window"] == -1 else int(meta["window"]),
                 center=bool(meta["center"]), solver=str(f["solver"]))
        for k in ("A_", "B_", "C_", "singular_values_", "components_", "mean_"):
            setattr(la, k, f[k])
        la.solver_ = str(f["solver_"])
        la.n_components_ = int(meta["n_components_"])
        la.n_features_in_ = int(meta["n_features_in_"])
        la.window_ = int(meta["window_"])
        return la

    def __repr__(self) -> str:
        return (f"LinearAutoencoder(n_components={self.n_components}, window={self.window}, "
                f"center={self.center}, solver={self.solver!r})")


__all__ = ["SKLEARN_EXPECTED_FAILED_CHECKS", "SOLVERS", "LinearAutoencoder"]
