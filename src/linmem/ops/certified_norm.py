"""``||V||_2`` from above, certified, at the cost of a Gram matrix and one Cholesky factorisation.

The bounded memory (:mod:`linmem.ops.bound`) runs eq. (7) with ``W^mm = V min(1, r / s)``; it
holds ``||W^mm||_2 <= r`` whenever ``s >= ||V||_2``. An exact ``s`` (the top eigenpair of
``V^T V`` by LAPACK, :func:`linmem.ops.bound.spectral_norm`) costs a tridiagonal reduction per
update, more than a batch-1 training step of LMN-B(250, 250) on JSB's 60-step sequences. Here
``s`` is found in three steps, each cheaper than the last one it avoids:

1. the Gram matrix ``G = V^T V`` (of the smaller side; BLAS ``syrk``, one triangle) and a power
   iteration on it, warm-started from the previous update's top right singular vector
   ``start`` (a layer keeps it as a buffer): ``lambda = x^T G x``, a *lower* bound of
   ``||V||_2^2``, usually within ``1e-4`` after a few products;
2. the certificate: ``c = sqrt(lambda) (1 + d)`` is an *upper* bound of ``||V||_2`` exactly when
   ``c^2 I - G`` is positive definite, which a Cholesky factorisation (float64, LAPACK
   ``potrf``) decides. The rounding of ``G`` (``|fl(G) - G| <= n u |V|^T |V|``, ``n`` the
   inner dimension, ``u`` the unit roundoff; Jeannerod & Rump 2013, any summation order) and of
   the factorisation (Demmel 1989; Rump 2006) are subtracted from the shift first, so a success
   proves ``||V||_2 < c`` in real arithmetic. ``d = SLACK + eta / (2 lambda)``, ``eta`` that
   rounding bound: ``c`` exceeds the norm by at most ``SLACK`` relative plus the rounding's own
   width (float32, ``M = 250``: about ``5e-4``);
3. only where the certificate fails (a cold start, the top pair moved): the eigensolver's pair,
   then the certificate again; as the last resort ``||V||_F``, which is always above.

So ``||V||_2 <= s <= ||V||_2 (1 + d)``, never below. Where the estimate is below the bound
and ``s`` would be above it, the certificate is tried at the bound itself (:func:`on_the_ball`:
within rounding), in float64, so that a matrix on the ball (a pretrained memory projected onto
it) is recognised as inside and kept exactly, not rescaled by ``1 / (1 + d)``. The
gradient is ``(s / sqrt(lambda)) u v^T`` from the estimate's singular pair, the gradient of
``||V||_2 (1 + d)``.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch
from torch import Tensor

from linmem.ops.eigen import blas_controller, top_eigenpair, top_eigenpair_lapack

__all__ = ["SLACK", "bounded_scale", "bounded_weight", "certified_norm", "on_the_ball", "widened"]

SLACK = 5e-4  # how far above the power iteration's estimate the certificate is tried
# the power iteration's residual ||G x - lam x|| / lam at which its vector is taken (float32,
# float64): the gradient u v^T is then that accurate over the relative spectral gap
RESIDUAL = {True: 1e-5, False: 1e-10}
_MIN_ITERATIONS, _MAX_ITERATIONS = 2, 30


@functools.cache
def _scipy_blas():
    """scipy's BLAS and LAPACK wrappers, and threadpoolctl's handles on the BLAS libraries
    loaded (made once: importing scipy costs 0.4 s, and only a bounded memory needs it)."""
    import scipy.linalg.blas
    import scipy.linalg.lapack

    # scipy's own BLAS (its wheels ship one beside numpy's); every BLAS where that is not told
    libs = blas_controller().lib_controllers
    own = [lib for lib in libs if "scipy.libs" in lib.filepath or "scipy/.libs" in lib.filepath]
    return scipy.linalg.blas, scipy.linalg.lapack, own or libs


class _OneBlasThread:
    """scipy's BLAS on one thread for a block, then as it was: scipy's OpenBLAS sizes its pool
    to the machine and its threads spin while they wait, which beside a busy process costs more
    than a second thread saves on matrices this small (a few us, where threadpoolctl's
    ``limit`` takes 45)."""

    def __enter__(self):
        self.before = [(lib, n) for lib in _scipy_blas()[2] if (n := lib.get_num_threads()) != 1]
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
        self.blas, self.lapack, _ = _scipy_blas()
        self.dot = self.blas.sdot if a.dtype == np.float32 else self.blas.ddot
        self.single = a.dtype == np.float32
        syrk = self.blas.ssyrk if self.single else self.blas.dsyrk
        # a.T is a's Fortran view: syrk(a.T, trans=1) = a a^T (the faster: dot products of
        # contiguous rows), syrk(a.T) = a^T a (no copy either way); the upper triangle only
        self.gram = syrk(1.0, a.T, trans=int(_left(a)))
        self.symv = self.blas.ssymv if self.single else self.blas.dsymv

    def matvec(self, x: np.ndarray) -> np.ndarray:
        return self.symv(1.0, self.gram, x)

    def positive_definite(self, shift: float) -> bool:
        """Whether ``shift I - G`` (float64) has a Cholesky factor."""
        # in Fortran order, as syrk wrote G: potrf copies nothing
        a = np.negative(self.gram, dtype=np.float64, order="F")
        a.ravel(order="K")[::a.shape[0] + 1] += shift
        _, info = self.lapack.dpotrf(a, lower=0, clean=0, overwrite_a=1)
        return info == 0

    def top_pair(self) -> tuple[float, np.ndarray]:
        g = torch.from_numpy(np.triu(self.gram) + np.triu(self.gram, 1).T)
        lam, vec = top_eigenpair_lapack(g)
        return lam, vec.numpy()


class _Torch:
    """The same steps with PyTorch's operations, on any device (CUDA: cuBLAS and cuSOLVER)."""

    def __init__(self, w: Tensor):
        self.gram = w @ w.T if _left(w) else w.T @ w
        self.single = w.dtype == torch.float32

    def matvec(self, x: Tensor) -> Tensor:
        return self.gram @ x

    @staticmethod
    def dot(x: Tensor, y: Tensor) -> float:
        return float(x @ y)

    def positive_definite(self, shift: float) -> bool:
        a = -self.gram.double()
        a.diagonal().add_(shift)
        return int(torch.linalg.cholesky_ex(a).info) == 0

    def top_pair(self) -> tuple[float, Tensor]:
        return top_eigenpair(self.gram)


def _left(w) -> bool:
    """Whether the Gram matrix is ``w w^T`` (its eigenvector the left singular vector ``u``;
    a square or wide matrix) rather than ``w^T w`` (a tall one): the smaller, and for a square
    matrix the one whose BLAS product reads contiguous rows."""
    return w.shape[0] <= w.shape[1]


def _power(ops, x, slack: float) -> tuple[float, object, bool]:
    """Power iteration on the Gram matrix from ``x``: the Rayleigh quotient ``lam`` (a lower
    bound of its largest eigenvalue, non-decreasing), the unit iterate, and whether it
    converged: the quotient gains less than a tenth of ``slack`` relative and the residual
    ``||G x - lam x||`` is below ``RESIDUAL`` of ``lam`` (the vector, and with it the gradient
    ``u v^T``, accurate to about that over the spectral gap), at most thirty products."""
    tol = RESIDUAL[ops.single]
    norm = ops.dot(x, x) ** 0.5
    if not norm > 0 or not math.isfinite(norm):  # no warm start: a fixed start, the Gram's
        x = ops.matvec(x * 0 + 1)                 # image of the ones vector
        norm = ops.dot(x, x) ** 0.5
    x = x / norm
    lam = 0.0
    for i in range(_MAX_ITERATIONS):
        y = ops.matvec(x)
        new = ops.dot(x, y)
        y2 = ops.dot(y, y)
        if not y2 > 0:
            return max(new, 0.0), x, True
        done = i + 1 >= _MIN_ITERATIONS and new - lam <= 0.1 * slack * new
        if done:
            r = y - new * x
            done = ops.dot(r, r) <= (tol * new) ** 2  # ||G x - lam x|| <= tol lam
        x = y / y2 ** 0.5
        if done:
            return new, x, True
        lam = new
    return lam, x, False


def _certify(ops, upper: float, eta: float, n: int) -> bool:
    """Whether ``||V||_2 < upper`` is proven: ``upper^2 I - G`` less the rounding of ``G``
    (``eta``) and of a float64 Cholesky factorisation of an ``n x n`` matrix (``4 (n + 1) n u
    upper^2`` bounds it: Rump 2006, Thm 2.3, with the trace ``<= n upper^2``) has a factor."""
    mu = upper * upper
    shift = mu - eta - 4 * (n + 1) * n * 2.0 ** -53 * mu
    return shift > 0 and ops.positive_definite(shift)


def _frobenius2(a) -> float:
    """``||a||_F^2`` (a numpy array or a tensor), its rounding (at most ``size * u`` relative)
    added: never below the exact value."""
    flat = a.reshape(-1)
    single = a.dtype in (np.float32, torch.float32)
    if isinstance(a, np.ndarray):
        blas = _scipy_blas()[0]
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


def widened(norm: Tensor, weight: Tensor) -> Tensor:
    """``norm (1 + d)``, ``d`` the certified norm's width for ``weight`` (``SLACK`` and the
    Gram matrix's rounding), from tensor operations alone: the ONNX export and torch.func's
    transforms run the bound with the Schatten and the SVD's norm widened so, as eager's
    certified norm is (to within the Schatten norm's factor)."""
    unit = 2.0 ** -24 if weight.dtype != torch.float64 else 2.0 ** -53
    eta = max(weight.shape) * unit * weight.pow(2).sum()
    return norm * (1 + SLACK + eta / (2 * norm * norm))


def _upper_bound(w, start, floor: float, frobenius2: float) -> tuple[float, float, object]:
    """``(s, lam, x)`` for the matrix ``w`` (a numpy array on the CPU, else a tensor; scaled so
    that its Gram matrix neither overflows nor underflows) of squared Frobenius norm
    ``frobenius2`` (from above): the certified ``s``, the estimate ``lam`` of ``||w||_2^2`` and
    its unit vector ``x`` (steps 1-3 of the module); ``start``, the power iteration's start."""
    ops = _Numpy(w) if isinstance(w, np.ndarray) else _Torch(w)
    n, inner = min(w.shape), max(w.shape)
    unit = 2.0 ** -24 if ops.single else 2.0 ** -53
    eta = inner * unit * frobenius2  # ||fl(G) - G||_2 <= n u || |V| ||_F^2
    lam, x, converged = _power(ops, start, SLACK)
    for attempt in range(0 if converged else 1, 2):
        if attempt:  # no convergence, or an estimate too low to certify: the eigensolver's pair
            lam, x = ops.top_pair()
        lam = max(lam, 0.0)
        d = SLACK + (eta / (2 * lam) if lam > 0 else 0.0)
        estimate = math.sqrt(lam)
        if estimate <= floor < estimate * (1 + d) and _on_the_ball(ops, w, floor, frobenius2):
            return floor, lam, x
        upper = estimate * (1 + d)
        if upper > 0 and _certify(ops, upper, eta, n):
            return upper, lam, x
    # the slack 4, 16, ... times as wide, then ||V||_F, which is never below ||V||_2
    for k in range(1, 6):
        upper = math.sqrt(lam) * (1 + d * 4 ** k)
        if upper > 0 and _certify(ops, upper, eta, n):
            return upper, lam, x
    return math.sqrt(frobenius2 + eta) * (1 + 1e-6), lam, x


def _round_up(value: float, dtype: torch.dtype) -> float:
    """``value`` as a float of ``dtype``, rounded up (never below ``value``)."""
    if dtype == torch.float64:
        return value
    t = np.float32(value) if dtype == torch.float32 else float(torch.tensor(value, dtype=dtype))
    if float(t) < value:
        t = np.nextafter(np.float32(t), np.float32(np.inf)) if dtype == torch.float32 \
            else float(torch.nextafter(torch.tensor(t, dtype=dtype),
                                       torch.tensor(math.inf, dtype=dtype)))
    return float(t)


def _solve(weight: Tensor, start: Tensor, bound: float) -> tuple[float, float, Tensor, Tensor,
                                                                  float]:
    """``(scale, s, u, v, factor)`` of :func:`_bounded_scale` as floats and vectors."""
    rows, cols = weight.shape
    left = _left(weight)
    n = min(rows, cols)
    w = weight.detach()
    if w.dtype not in (torch.float32, torch.float64):
        w = w.float()
    cpu = w.device.type == "cpu"
    a = np.ascontiguousarray(w.numpy()) if cpu else w.contiguous()
    if n == 0:
        return 0.0, 0.0, w.new_zeros(rows), w.new_zeros(cols), 0.0
    limit = on_the_ball(bound, weight) if math.isfinite(bound) else bound
    frobenius2 = _frobenius2(a)
    scale = 1.0
    if not 1e-20 < frobenius2 < 1e20:  # NaN, inf, or a Gram matrix that could under- or
        scale = float(max(a.max(), -a.min()) if cpu else a.abs().max())  # overflow: rescaled
        if not math.isfinite(scale):
            return math.nan, math.nan, w.new_full((rows,), math.nan), \
                w.new_full((cols,), math.nan), math.nan
        if scale == 0:
            return 1.0, 0.0, w.new_zeros(rows), w.new_zeros(cols), 1.0
        a = a / (a.dtype.type(scale) if cpu else scale)
        frobenius2 = _frobenius2(a)
    if cpu:
        x0 = start.detach().numpy() if start.shape == (n,) else np.zeros(n, a.dtype)
        with _OneBlasThread():
            upper, lam, x = _upper_bound(a, x0.astype(a.dtype, copy=False), limit / scale,
                                         frobenius2)
        sigma = math.sqrt(lam)
        other = (a.T @ x if left else a @ x) / sigma if sigma > 0 else np.zeros(max(rows, cols),
                                                                                 a.dtype)
        x, other = torch.from_numpy(np.asarray(x, a.dtype)), torch.from_numpy(np.asarray(other))
    else:
        x0 = start.detach().to(a.dtype) if start.shape == (n,) else a.new_zeros(n)
        upper, lam, x = _upper_bound(a, x0, limit / scale, frobenius2)
        sigma = math.sqrt(lam)
        other = (a.T @ x if left else a @ x) / sigma if sigma > 0 else a.new_zeros(max(rows, cols))
    u, v = (x, other) if left else (other, x)
    s = _round_up(math.nextafter(upper * scale, math.inf), weight.dtype)
    factor = upper / sigma if sigma > 0 else 1.0
    inside = upper <= limit / scale  # certified at or inside the ball's surface (in w's units)
    return (1.0 if inside else bound / s), s, u, v, factor


@torch.library.custom_op("linmem::bounded_scale", mutates_args=())
def _bounded_scale(weight: Tensor, start: Tensor, bound: float
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """``(scale, s, u, v, coefficients)``: ``s >= ||weight||_2`` certified (within the module's
    ``d``), ``scale = min(1, bound / s)`` (1 within a few units of rounding of the bound), the
    estimate's unit singular pair (``weight v ~ sigma u``; the Gram matrix's one is the next
    call's ``start``), and the gradients' coefficients ``[ds, dscale]``: ``d s / dweight =
    ds u v^T``, ``d scale / dweight = dscale u v^T``. NaN throughout for a non-finite matrix."""
    scale, s, u, v, coefficients = _bounded_scale_impl(weight, start, bound)
    return scale.clone(), s.clone(), u, v, coefficients.clone()


def _bounded_scale_impl(weight: Tensor, start: Tensor, bound: float
                        ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The operator's outputs (``scale``, ``s`` and the coefficients: views of one tensor)."""
    scale, s, u, v, factor = _solve(weight, start, bound)
    dscale = -bound * factor / (s * s) if scale != 1.0 and s > 0 else 0.0
    if not math.isfinite(s):
        dscale = math.nan
    values = torch.tensor([scale, s, factor, dscale], dtype=weight.dtype, device=weight.device)
    return values[0], values[1], u.to(weight), v.to(weight), values[2:]


@_bounded_scale.register_fake
def _bounded_scale_fake(weight, start, bound):
    rows, cols = weight.shape
    return (weight.new_empty(()), weight.new_empty(()), weight.new_empty(rows),
            weight.new_empty(cols), weight.new_empty(2))


def _setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[2], output[3], output[4])
    ctx.mark_non_differentiable(output[2], output[3], output[4])


def _backward(ctx, grad_scale, grad_s, grad_u=None, grad_v=None, grad_coefficients=None):
    """``(grad_s ds + grad_scale dscale) u v^T`` (a gradient not given: zero); under
    ``create_graph`` the same through a differentiable SVD's top pair, so that second
    derivatives exist too."""
    weight, u, v, coefficients = ctx.saved_tensors
    if grad_s is None and grad_scale is None:
        return None, None, None
    c = (0 if grad_s is None else grad_s * coefficients[0]) \
        + (0 if grad_scale is None else grad_scale * coefficients[1])
    if torch.is_grad_enabled():
        left, _, right = torch.linalg.svd(weight, full_matrices=False)
        return c * (left[:, :1] @ right[:1]), None, None
    return torch.outer(c * u, v), None, None


_bounded_scale.register_autograd(_backward, setup_context=_setup)


class _EagerBoundedScale(torch.autograd.Function):
    """The operator's implementation and backward in eager mode, without its dispatch (which
    costs about 0.25 ms a call, a third of a batch-1 LMN-B(50, 50) training step)."""

    @staticmethod
    def forward(ctx, weight, start, bound):
        out = _bounded_scale_impl(weight, start, bound)
        _setup(ctx, (weight, start, bound), out)
        ctx.set_materialize_grads(False)
        return out

    @staticmethod
    def backward(ctx, *grads):
        return _backward(ctx, *grads)


class _EagerBoundedWeight(torch.autograd.Function):
    """``weight * min(1, bound / s)`` in one node (eager mode: the fewest Python calls; the
    scalars stay Python floats): the bounded memory's matrix, its start moved on with
    ``update``."""

    @staticmethod
    def forward(ctx, weight, start, bound, update):
        scale, s, u, v, factor = _solve(weight, start, bound)
        if update:
            start.copy_(u if _left(weight) else v)
        ctx.scale, ctx.bound, ctx.factor = scale, bound, factor
        ctx.dscale = -bound * factor / (s * s) if scale != 1.0 and s > 0 else 0.0
        ctx.save_for_backward(weight, u.to(weight), v.to(weight))
        return weight * scale

    @staticmethod
    def backward(ctx, grad):
        """``scale grad + dscale <grad, weight> u v^T``; under ``create_graph`` the same through
        a differentiable SVD's top pair (the certificate's factor held), so that second
        derivatives exist too."""
        weight, u, v = ctx.saved_tensors
        if torch.is_grad_enabled():
            if ctx.dscale == 0.0:
                return grad * ctx.scale, None, None, None
            ref = weight * (ctx.bound / (torch.linalg.matrix_norm(weight, 2) * ctx.factor))
            (out,) = torch.autograd.grad(ref, weight, grad, create_graph=True)
            return out, None, None, None
        if ctx.dscale == 0.0:
            return grad * ctx.scale, None, None, None
        alpha = ctx.dscale * float(torch.vdot(grad.reshape(-1), weight.reshape(-1)))
        return torch.addr(grad, u, v, beta=ctx.scale, alpha=alpha), None, None, None


def bounded_weight(weight: Tensor, start: Tensor | None, bound: float,
                   update: bool = False) -> Tensor:
    """``weight * min(1, bound / s)``, ``s`` the certified norm of :func:`bounded_scale`:
    the matrix of the ball that :func:`linmem.ops.bound.bounded_memory` runs eq. (7) with;
    with ``update``, ``start`` overwritten with this call's vector."""
    if torch.compiler.is_compiling() or weight.device.type == "meta":  # the operator: traced,
        scale, _, vector = bounded_scale(weight, start, bound)       # or its fake on meta
        if update and start is not None:
            start.copy_(vector)  # not differentiable: no grad mode to set (export refuses one)
        return weight * scale
    if start is None:
        start, update = weight.new_zeros(min(weight.shape)), False
    return _EagerBoundedWeight.apply(weight, start, float(bound), update)


def bounded_scale(weight: Tensor, start: Tensor | None, bound: float
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """``(scale, s, vector)``: ``min(1, bound / s)`` (1 within a few units of rounding of
    ``bound``: a matrix on the ball is kept as it is) and ``s``, a certified upper bound of
    ``||weight||_2``, both differentiable; ``vector``, the Gram matrix's unit eigenvector the
    power iteration ended on, the next call's ``start`` (length ``min(weight.shape)``)."""
    if weight.dim() != 2:
        raise ValueError(f"the certified norm takes a matrix, got a tensor of shape "
                         f"{tuple(weight.shape)}")
    if start is None:
        start = weight.new_zeros(min(weight.shape))
    if torch.compiler.is_compiling() or weight.device.type == "meta":
        scale, s, u, v, _ = torch.ops.linmem.bounded_scale(weight, start, float(bound))
    else:
        scale, s, u, v, _ = _EagerBoundedScale.apply(weight, start, float(bound))
    return scale, s, (u if _left(weight) else v)


def certified_norm(weight: Tensor, start: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(s, vector)``: ``s``, an upper bound of ``||weight||_2`` certified by a Cholesky
    factorisation and within ``SLACK`` (plus the Gram matrix's rounding) of it, differentiable;
    ``vector``, the Gram matrix's unit eigenvector the power iteration ended on, to pass as the
    next call's ``start``."""
    _, s, vector = bounded_scale(weight, start, math.inf)
    return s, vector
