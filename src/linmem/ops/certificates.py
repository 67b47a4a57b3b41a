"""The certificates behind :mod:`linmem.ops.certified_norm`: upper bounds of ``||V||_2`` proven
in exact arithmetic, every floating-point rounding accounted for (that module says which runs
when). ``G`` is the Gram matrix of ``V``'s smaller side (``V V^T`` for a square or wide matrix,
whose eigenvector is the left singular vector), ``lambda_1 >= lambda_2`` its largest
eigenvalues, ``u`` the unit roundoff."""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from linmem.ops.eigen import blas_controller, top_eigenpair, top_eigenpair_lapack

__all__ = ["KEEP", "NO_CERTIFICATE", "RESIDUAL", "SLACK", "TEMPLE_GAP", "WAIT",
           "Float64Products", "OneBlasThread", "certify_norm", "frobenius2_above", "left_gram",
           "on_the_ball", "scipy_blas"]

SLACK = 5e-4  # how far above the power iteration's estimate the certificate is tried
# the power iteration's residual ||G x - lam x|| / lam at which its vector is taken (float32,
# float64): the gradient u v^T is then that accurate over the relative spectral gap
RESIDUAL = {True: 1e-4, False: 1e-10}
_MIN_ITERATIONS, _MAX_ITERATIONS = 2, 30


@functools.cache
def scipy_blas():
    """scipy's BLAS and LAPACK wrappers, and threadpoolctl's handles on the BLAS libraries
    loaded (made once: importing scipy costs 0.4 s, and only a bounded memory needs it)."""
    import scipy.linalg.blas
    import scipy.linalg.lapack

    # scipy's own BLAS (its wheels ship one beside numpy's); every BLAS where that is not told
    libs = blas_controller().lib_controllers
    own = [lib for lib in libs if "scipy.libs" in lib.filepath or "scipy/.libs" in lib.filepath]
    return scipy.linalg.blas, scipy.linalg.lapack, own or libs


class OneBlasThread:
    """scipy's BLAS on one thread for a block, then as it was: scipy's OpenBLAS sizes its pool
    to the machine and its threads spin while they wait, which beside a busy process costs more
    than a second thread saves on matrices this small (a few us, where threadpoolctl's
    ``limit`` takes 45)."""

    def __enter__(self):
        self.before = [(lib, n) for lib in scipy_blas()[2] if (n := lib.get_num_threads()) != 1]
        for lib, _ in self.before:
            lib.set_num_threads(1)

    def __exit__(self, *exc):
        for lib, n in self.before:
            lib.set_num_threads(n)


class _Numpy:
    """The three steps on the CPU: scipy's BLAS ``syrk``/``symv`` and LAPACK ``potrf``/``syevr``
    on one BLAS thread (scipy's OpenBLAS spins its threads, :func:`linmem.ops.eigen.
    top_eigenpair_lapack`)."""

    def __init__(self, a: np.ndarray):
        self.blas, self.lapack, _ = scipy_blas()
        self.single = a.dtype == np.float32
        syrk = self.blas.ssyrk if self.single else self.blas.dsyrk
        # a.T is a's Fortran view: syrk(a.T, trans=1) = a a^T (the faster: dot products of
        # contiguous rows), syrk(a.T) = a^T a (no copy either way); the upper triangle only
        self.gram = syrk(1.0, a.T, trans=int(left_gram(a)))

    def positive_definite(self, shift: float) -> bool:
        """Whether ``shift I - G`` (float64) has a Cholesky factor."""
        # in Fortran order, as syrk wrote G: potrf copies nothing
        return _has_cholesky(np.negative(self.gram, dtype=np.float64, order="F"), shift)

    def top_pair(self) -> tuple[float, np.ndarray]:
        g = torch.from_numpy(np.triu(self.gram) + np.triu(self.gram, 1).T)
        lam, vec = top_eigenpair_lapack(g)
        return lam, vec.numpy()


class _Torch:
    """The same steps with PyTorch's operations, on any device (CUDA: cuBLAS and cuSOLVER)."""

    def __init__(self, w: Tensor):
        self.gram = w @ w.T if left_gram(w) else w.T @ w
        self.single = w.dtype == torch.float32

    def positive_definite(self, shift: float) -> bool:
        return _has_cholesky(-self.gram.double(), shift)

    def top_pair(self) -> tuple[float, Tensor]:
        return top_eigenpair(self.gram)


def _has_cholesky(minus, shift: float, copy: bool = False) -> bool:
    """Whether ``shift I + minus`` has a Cholesky factor (float64; a numpy array in Fortran
    order, its upper triangle read, for LAPACK's ``potrf``, or a tensor); ``minus`` itself is
    overwritten unless ``copy``."""
    if isinstance(minus, np.ndarray):
        a = minus.copy(order="F") if copy else minus
        a.ravel(order="K")[::a.shape[0] + 1] += shift
        return scipy_blas()[1].dpotrf(a, lower=0, clean=0, overwrite_a=1)[1] == 0
    a = minus.clone() if copy else minus
    a.diagonal().add_(shift)
    return int(torch.linalg.cholesky_ex(a).info) == 0


def left_gram(w) -> bool:
    """Whether the Gram matrix is ``w w^T`` (its eigenvector the left singular vector ``u``;
    a square or wide matrix) rather than ``w^T w`` (a tall one): the smaller, and for a square
    matrix the one whose BLAS product reads contiguous rows."""
    return w.shape[0] <= w.shape[1]


def _certify(ops, upper: float, eta: float, n: int) -> bool:
    """Whether ``||V||_2 < upper`` is proven: ``upper^2 I - G`` less the rounding of ``G``
    (``eta``) and of a float64 Cholesky factorisation of an ``n x n`` matrix (``4 (n + 1) n u
    upper^2`` bounds it: Rump 2006, Thm 2.3, with the trace ``<= n upper^2``) has a factor."""
    mu = upper * upper
    shift = mu - eta - 4 * (n + 1) * n * 2.0 ** -53 * mu
    return shift > 0 and ops.positive_definite(shift)


def frobenius2_above(a) -> float:
    """``||a||_F^2`` (a numpy array or a tensor), its rounding (at most ``size * u`` relative)
    added: never below the exact value."""
    flat = a.reshape(-1)
    single = a.dtype in (np.float32, torch.float32)
    if isinstance(a, np.ndarray):
        blas = scipy_blas()[0]
        total = float((blas.sdot if single else blas.ddot)(flat, flat))
    else:
        total = float(flat @ flat)
    return total * (1 + 2 * flat.shape[0] * (2.0 ** -24 if single else 2.0 ** -53))


def _on_the_ball(ops, w, floor: float, frobenius2: float) -> bool:
    """Whether ``||w||_2 <= floor`` is proven, in float64 throughout (a float32 matrix's Gram
    matrix formed again in float64, where its products are exact): near the ball's surface the
    float32 Gram matrix's rounding would hide the answer."""
    n, inner = min(w.shape), max(w.shape)
    if ops.single:
        ops = _Numpy(w.astype(np.float64)) if isinstance(w, np.ndarray) else _Torch(w.double())
    return _certify(ops, floor, inner * 2.0 ** -53 * frobenius2, n)


def on_the_ball(bound: float, weight: Tensor) -> float:
    """The largest certified norm that counts as on the ball of radius ``bound`` (the matrix
    then kept as it is: a memory projected onto the ball, or ``B`` with ``||B||_2 = 1``,
    transfers exactly): ``bound`` times one plus 8 units of rounding of ``weight``'s dtype, or
    the float64 certificate's own rounding if that is wider."""
    n = min(weight.shape)
    return bound * (1 + max(8 * torch.finfo(weight.dtype).eps,
                            (4 * (n + 1) * n + 2 * max(weight.shape) * n) * 2.0 ** -53))


_U64 = 2.0 ** -53
TEMPLE_GAP = 0.1  # Temple's bound is taken where rho - alpha is at least this share of rho


class Float64Products:
    """``G x`` through two float64 matrix-vector products with ``w`` itself (the Gram matrix
    never formed; scipy's BLAS on the CPU, PyTorch's elsewhere): the power iteration's products,
    accurate to ``tau`` (:func:`_product_error`) whatever ``w``'s dtype."""

    def __init__(self, w):
        self.cpu = isinstance(w, np.ndarray)
        self.left = left_gram(w)
        if self.cpu:
            self.a = w.astype(np.float64)
            self.gemv = scipy_blas()[0].dgemv
        else:
            self.a = w.double()

    def matvec(self, x):
        a = self.a
        if self.cpu:  # a.T is a's Fortran view: gemv(a.T, x, trans=1) = a x, trans=0: a^T x
            inner = self.gemv(1.0, a.T, x, trans=int(not self.left))
            return self.gemv(1.0, a.T, inner, trans=int(self.left))
        return a @ (a.T @ x) if self.left else a.T @ (a @ x)

    def start(self, x):
        return x.astype(np.float64) if self.cpu else x.double()

    def other(self, x):
        """``w^T x`` (left) or ``w x`` in float64: the other singular vector, unnormalised."""
        return (self.a.T @ x) if self.left else (self.a @ x)


def _product_error(frobenius2: float, shape: tuple[int, int]) -> float:
    """``tau``, a bound of ``||fl(G x) - G x||`` and of ``|fl(x^T G x) - x^T G x|`` for a unit
    ``x`` (within rounding) computed by :class:`Float64Products`: each product's error is at most
    ``k u |A| |x|`` (``k`` its inner dimension), and ``|| |V| ||_2 <= ||V||_F``."""
    return 8 * (sum(shape) + 4) * _U64 * frobenius2


def _power64(ops: Float64Products, x, tol: float, slack: float = SLACK
             ) -> tuple[float, float, object, bool, bool]:
    """Power iteration in float64 from ``x``: ``(rho, eps, x, converged, separated)``, the
    Rayleigh quotient of the unit ``x`` returned and its residual ``||G x - rho x||``; at the
    first ``x`` whose residual is at most ``tol rho`` (``converged``), or once the quotient
    gains less than a tenth of ``slack`` relative while the residual shrinks by less than
    ``1 - TEMPLE_GAP`` a product (``separated`` False: the second eigenvalue is too close for
    Temple's bound; the quotient is still a lower bound), at most thirty products."""
    norm = float(np.sqrt(x @ x)) if ops.cpu else float(x.norm())
    if not norm > 0 or not math.isfinite(norm):  # no warm start: the Gram's image of the ones
        x = ops.matvec(x * 0 + 1)
        norm = float(np.sqrt(x @ x)) if ops.cpu else float(x.norm())
        if not norm > 0:
            return 0.0, 0.0, x * 0, True, True
    x = x / norm
    last_rho = last_eps = 0.0
    for i in range(_MAX_ITERATIONS):
        y = ops.matvec(x)
        rho = float(x @ y)
        r = y - rho * x
        eps = float(np.sqrt(r @ r)) if ops.cpu else float(r.norm())
        if eps <= tol * rho or not rho > 0:
            return max(rho, 0.0), eps, x, True, True
        if i >= 2 and eps > (1 - TEMPLE_GAP) * last_eps and rho - last_rho <= 0.1 * slack * rho:
            return rho, eps, x, False, False
        last_rho, last_eps = rho, eps
        x = y / (float(np.sqrt(y @ y)) if ops.cpu else float(y.norm()))
    return max(rho, 0.0), eps, x, False, True


def _temple(rho: float, eps: float, tau: float, alpha: float) -> float | None:
    """Temple's upper bound of the largest eigenvalue, ``rho + eps^2 / (rho - alpha)`` for a unit
    vector of Rayleigh quotient ``rho`` and residual ``eps`` when ``alpha`` bounds the second
    eigenvalue from above (Kato 1949, Temple 1928), the products' rounding ``tau`` added; None
    where ``rho - alpha`` is below ``TEMPLE_GAP`` of ``rho`` (no use, or no bound)."""
    gap = rho - tau - alpha
    if not gap > TEMPLE_GAP * rho:
        return None
    e = eps + 2 * tau
    return (rho + tau + e * e / gap) * (1 + 8 * _U64)


def _second_bound(ops, x, rho: float, eta: float) -> float | None:
    """A certified upper bound of the Gram matrix's second eigenvalue, or None: by Cauchy's
    interlacing it is at most the largest eigenvalue of ``P G P`` (``P = I - x x^T``, any unit
    ``x``), which a Cholesky factorisation of ``alpha I - P G P`` bounds (the float32 Gram
    matrix's rounding ``eta`` and the float64 factorisation's and projection's added), at an
    ``alpha`` a little above a power iteration's estimate of it; None where that estimate
    leaves no gap for Temple's bound."""
    n = ops.gram.shape[0]
    cpu = isinstance(ops.gram, np.ndarray)
    if cpu:  # -P G P = -G + h x^T + x h^T, h = G x - (x^T G x / 2) x: one rank-2 update
        blas = scipy_blas()[0]
        minus = np.negative(ops.gram, dtype=np.float64, order="F")  # the upper triangle
        g = -blas.dsymv(1.0, minus, x)
        minus = blas.dsyr2(1.0, g - 0.5 * float(x @ g) * x, x, a=minus, overwrite_a=1)
        trace = -float(np.trace(minus))

        def matvec(z):
            return -blas.dsymv(1.0, minus, z)
    else:
        g64 = ops.gram.double()
        g = g64 @ x
        minus = torch.outer(g, x) + torch.outer(x, g) - float(x @ g) * torch.outer(x, x) - g64
        trace = -float(minus.trace())

        def matvec(z):
            return -(minus @ z)
    z = x * 0 + 1
    z = z - float(x @ z) * x
    est = 0.0
    for _ in range(8):
        y = matvec(z)
        norm = float((y * y).sum()) ** 0.5
        if not norm > 0:
            break
        est = max(est, float((z * y).sum()) / float((z * z).sum()))
        if est * 1.1 + 1e-3 * rho > (1 - 1.5 * TEMPLE_GAP) * rho:  # a lower bound already
            return None                                             # too high: no gap
        z = y / norm
    # the estimate is from below, and where the next eigenvalues crowd may be well below: a
    # tenth above it, then the highest alpha that leaves the anchor some room to drift
    highest = (1 - 1.5 * TEMPLE_GAP) * rho
    for alpha in sorted({min(est * 1.1 + 1e-3 * rho, highest), highest}):
        shift = alpha - eta - 64 * (n + 2) * _U64 * max(trace, 0.0) \
            - 4 * (n + 1) * n * _U64 * alpha
        if shift > 0 and _has_cholesky(minus, shift, copy=True):
            return alpha
    return None


KEEP = "keep"  # the anchor of the last full certificate still serves
NO_CERTIFICATE = (0.0, 0.0, 0.0)  # a certificate that holds nothing
WAIT = 16  # updates before the second eigenvalue's certificate is tried again after a failure

def _drift(w, anchor) -> float:
    """``||w - anchor||_F`` from above (float64; a float32 difference is exact there)."""
    if isinstance(w, np.ndarray):
        d = np.subtract(w, anchor, dtype=np.float64).reshape(-1)
        total = float(scipy_blas()[0].ddot(d, d))
    else:
        d = (w.double() - anchor.double()).reshape(-1)
        total = float(d @ d)
    return math.sqrt(total * (1 + 4 * d.shape[0] * _U64)) * (1 + 4 * _U64)


def certify_norm(w, start, floor: float, frobenius2: float, anchor=None, second: bool = True,
                 products: Float64Products | None = None) -> tuple[float, float, object, object]:
    """``(s, lam, x, anchor)`` for the matrix ``w`` (a numpy array on the CPU, else a tensor;
    scaled so that its Gram matrix neither overflows nor underflows) of squared Frobenius norm
    ``frobenius2`` (from above): the certified ``s``, the estimate ``lam`` of ``||w||_2^2``,
    its unit vector ``x`` (the power iteration's, from ``start``), and what becomes of the
    anchor ``(w0, alpha0, c0)`` (an earlier matrix, a certified bound of its Gram matrix's
    second eigenvalue and of its norm): ``KEEP``, a new ``(alpha, c)`` for ``w`` itself, or
    None (no anchor: the top of the spectrum is not separated). ``second``: whether to try the
    second eigenvalue's certificate (no: it failed a few updates ago). ``products``: ``w``'s
    :class:`Float64Products`, where the caller has them already."""
    n, inner = min(w.shape), max(w.shape)
    products = products or Float64Products(w)
    tau = _product_error(frobenius2, w.shape)
    single = w.dtype in (np.float32, torch.float32)
    rho, eps, x, converged, separated = _power64(products, products.start(start),
                                                 RESIDUAL[single])
    if anchor is not None and converged:
        # Weyl: lambda_2(G) <= lambda_2(G0) + ||G - G0||_2 <= alpha0 + (2 c0 + delta) delta
        w0, alpha0, c0 = anchor
        delta = _drift(w, w0)
        bound = _temple(rho, eps, tau, alpha0 + (2 * c0 + delta) * delta)
        if bound is not None:
            return _at_the_floor(math.sqrt(bound), rho, w, floor, frobenius2), rho, x, KEEP
    ops = _Numpy(w) if isinstance(w, np.ndarray) else _Torch(w)
    eta = inner * (2.0 ** -24 if ops.single else _U64) * frobenius2  # ||fl(G) - G||_2
    eigenpair = None  # the eigensolver's, computed once at most
    if separated and second:
        if not converged:  # the eigensolver's vector, and its quotient and residual in float64
            eigenpair = ops.top_pair()
            rho, eps, x, _, _ = _power64(products, products.start(eigenpair[1]), math.inf)
        alpha = _second_bound(ops, x, rho, eta)
        bound = None if alpha is None else _temple(rho, eps, tau, alpha)
        if bound is not None:
            upper = math.sqrt(bound)
            return _at_the_floor(upper, rho, w, floor, frobenius2, ops), rho, x, (alpha, upper)
    # the top of the spectrum is not separated: c = sqrt(rho) (1 + d) certified directly, from
    # the power iteration's quotient (where it stalled in a cluster of the largest eigenvalues,
    # also at 4 d: the cluster's width), else the eigensolver's
    for attempt in range(2):
        if attempt:
            lam, top = eigenpair or ops.top_pair()
            rho, eps, x, _, _ = _power64(products, products.start(top), math.inf)
            rho = max(rho, lam)
        d = SLACK + (eta / (2 * rho) if rho > 0 else 0.0)
        for width in (1,) if attempt or converged else (1, 4):
            upper = math.sqrt(rho) * (1 + width * d)
            if upper > 0 and _certify(ops, upper, eta, n):
                return _at_the_floor(upper, rho, w, floor, frobenius2, ops), rho, x, None
    for k in range(1, 6):  # the slack 4, 16, ... times as wide
        upper = math.sqrt(rho) * (1 + d * 4 ** k)
        if upper > 0 and _certify(ops, upper, eta, n):
            return _at_the_floor(upper, rho, w, floor, frobenius2, ops), rho, x, None
    # then ||V||_F, which is never below ||V||_2
    return math.sqrt(frobenius2 + eta) * (1 + 1e-6), rho, x, None


def _at_the_floor(upper: float, rho: float, w, floor: float, frobenius2: float,
                  ops=None) -> float:
    """``floor`` where the estimate is below it, ``upper`` above it, and ``||w||_2 <= floor``
    is proven (a matrix on the ball's surface, kept as it is); else ``upper``."""
    if math.sqrt(rho) <= floor < upper:
        ops = ops or (_Numpy(w) if isinstance(w, np.ndarray) else _Torch(w))
        if _on_the_ball(ops, w, floor, frobenius2):
            return floor
    return upper
