"""``||V||_2`` from above, certified, and at most updates for a few matrix-vector products.

The bounded memory (:mod:`linmem.ops.bound`) runs eq. (7) with ``W^mm = V min(1, r / s)``; it
holds ``||W^mm||_2 <= r`` whenever ``s >= ||V||_2``. An exact ``s`` (the top eigenpair of
``V^T V`` by LAPACK, :func:`linmem.ops.bound.spectral_norm`) costs a tridiagonal reduction per
update, more than a batch-1 training step of LMN-B(250, 250) on JSB's 60-step sequences. Here
``G`` is the Gram matrix of ``V``'s smaller side, ``lambda_1 >= lambda_2 >= ...`` its
eigenvalues, and ``s`` comes from the cheapest of three certificates that holds:

1. **Temple's bound** (Temple 1928, Kato 1949): for a unit ``x`` with Rayleigh quotient
   ``rho = x^T G x`` and residual ``eps = ||G x - rho x||``, and any ``alpha`` with
   ``lambda_2 <= alpha < rho``, ``lambda_1 <= rho + eps^2 / (rho - alpha)``. ``x`` is a float64
   power iteration's (``G x`` as two products with ``V``, the Gram matrix never formed),
   warm-started from the last update's vector (a layer's buffer), run until ``eps <= RESIDUAL
   rho``; the bound is then the exact norm to about ``RESIDUAL^2``. ``alpha`` is carried from an
   *anchor*, an earlier matrix ``V0`` with certified ``alpha0 >= lambda_2(G0)`` and
   ``c0 >= ||V0||_2``, by Weyl's inequality: ``lambda_2(G) <= alpha0 + (2 c0 + delta) delta``,
   ``delta = ||V - V0||_F``. Training makes this the common case: the bound leaves the loss blind
   to the raw matrix's scale, Adam grows its top direction, and the top singular value stands
   apart (LMN-B(250, 250) on JSB Chorales: 2.7 against 1.1 after an epoch).
2. **A new anchor**, where the old one has drifted too far (or there is none): ``alpha`` for this
   matrix by Cauchy's interlacing, ``lambda_2(G) <= lambda_1(P G P)`` for ``P = I - x x^T``,
   which a float64 Cholesky factorisation of ``alpha I - P G P`` certifies (``G`` by BLAS
   ``syrk``), then Temple's bound.
3. **The direct certificate**, where the top of the spectrum is not separated (at
   initialisation, a cluster): ``c = sqrt(rho) (1 + d)`` is above ``||V||_2`` exactly when
   ``c^2 I - G`` has a Cholesky factor; ``d = SLACK + eta / (2 rho)``, ``eta`` the Gram matrix's
   rounding; the eigensolver's pair where the quotient is too low for it, ``||V||_F`` as the
   last resort. After a failed anchor, ``WAIT`` updates pass before one is tried again.

Every rounding is accounted for: the Gram matrix's (``|fl(G) - G| <= n u |V|^T |V|``, ``n`` the
inner dimension, any summation order: Jeannerod & Rump 2013), the products' in float64
(:mod:`linmem.ops.certificates`) and the factorisations' (Demmel 1989; Rump 2006), each subtracted
before a test, so that every ``s`` is proven ``>= ||V||_2`` in exact arithmetic, and at most
``||V||_2 (1 + d)`` (certificate 3) or the exact norm to rounding (1 and 2). A state that does
not belong together (loaded from elsewhere, a matrix replaced, a certificate cast from float64)
is sealed against (the anchor's ``||V0||_F^2``) and ignored, never believed. Where the estimate
is below the bound and ``s`` would be above it, the bound itself is certified in float64
(:func:`~linmem.ops.certificates.on_the_ball`), so that a matrix on the ball (a pretrained
memory projected onto it) is kept exactly. The gradient is ``(s / sqrt(rho)) u v^T`` from the
iteration's singular pair.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from linmem.ops.certificates import (
    KEEP,
    NO_CERTIFICATE,
    WAIT,
    Float64Products,
    OneBlasThread,
    certify_norm,
    frobenius2_above,
    left_gram,
    on_the_ball,
)

__all__ = ["STATE", "bounded_scale", "bounded_weight", "certified_norm"]

# a layer's buffers for its bounded matrix: name -> shape (n = min(rows, cols))
STATE = {"vector": lambda rows, cols: (min(rows, cols),), "anchor": lambda rows, cols: (rows, cols),
         "certificate": lambda rows, cols: (3,)}


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


def _solve(weight: Tensor, start: Tensor, bound: float, anchor: Tensor | None = None,
           certificate: Tensor | None = None) -> tuple[float, float, Tensor, Tensor, float,
                                                       object]:
    """``(scale, s, u, v, factor, anchored)`` of :func:`_bounded_scale` as floats and vectors;
    ``anchor`` and ``certificate`` (``[alpha0, c0, seal]``; ``c0 = 0``: none; ``c0 < 0``:
    ``alpha0`` updates to wait before trying the second eigenvalue again) the state of the last
    full certificate, and ``anchored`` what becomes of it (:func:`certify_norm`: ``KEEP``, a new
    ``(alpha, c)`` in ``weight``'s units, or None)."""
    rows, cols = weight.shape
    left = left_gram(weight)
    n = min(rows, cols)
    w = weight.detach()
    if w.dtype not in (torch.float32, torch.float64):
        w = w.float()
    cpu = w.device.type == "cpu"
    a = np.ascontiguousarray(w.numpy()) if cpu else w.contiguous()
    if n == 0:
        return 0.0, 0.0, w.new_zeros(rows), w.new_zeros(cols), 0.0, NO_CERTIFICATE
    limit = on_the_ball(bound, weight) if math.isfinite(bound) else bound
    frobenius2 = seal = frobenius2_above(a)  # the seal of an anchor made of this matrix
    scale = 1.0
    if not 1e-20 < frobenius2 < 1e20:  # NaN, inf, or a Gram matrix that could under- or
        scale = float(max(a.max(), -a.min()) if cpu else a.abs().max())  # overflow: rescaled
        if not math.isfinite(scale):
            return math.nan, math.nan, w.new_full((rows,), math.nan), \
                w.new_full((cols,), math.nan), math.nan, NO_CERTIFICATE
        if scale == 0:
            return 1.0, 0.0, w.new_zeros(rows), w.new_zeros(cols), 1.0, NO_CERTIFICATE
        a = a / (a.dtype.type(scale) if cpu else scale)
        frobenius2 = frobenius2_above(a)
    held, wait = None, 0
    # a certificate cast from float64 (module.float(), .half()) may belong to a rounded anchor
    if certificate is not None and certificate.dtype == torch.float64:
        alpha0, c0, sealed = certificate.tolist()
        if c0 > 0 and anchor is not None and anchor.shape == weight.shape:
            w0 = anchor.detach().to(w.dtype)
            w0 = np.ascontiguousarray(w0.numpy()) if cpu else w0
            # the seal: the anchor's squared Frobenius norm when it was certified; a state
            # loaded or set from elsewhere whose anchor is not the certified matrix is ignored
            if abs(frobenius2_above(w0) - sealed) <= 1e-9 * sealed:
                held = (w0 / (w0.dtype.type(scale) if cpu else scale) if scale != 1.0 else w0,
                        alpha0 / scale ** 2, c0 / scale)
        elif c0 < 0:  # [k, -1]: the second eigenvalue's certificate failed, k updates to wait
            wait = int(alpha0)
    products = Float64Products(a)  # a's float64 copy, for the power iteration and below
    if cpu:
        x0 = start.detach().numpy() if start.shape == (n,) else np.zeros(n)
        with OneBlasThread():
            upper, lam, x, anchored = certify_norm(a, x0, limit / scale, frobenius2, held,
                                                   wait == 0, products)
    else:
        x0 = start.detach().double() if start.shape == (n,) else a.new_zeros(n, dtype=torch.float64)
        upper, lam, x, anchored = certify_norm(a, x0, limit / scale, frobenius2, held, wait == 0,
                                               products)
    sigma = math.sqrt(lam)
    if sigma > 0:
        other = products.other(x) / sigma
    else:
        other = np.zeros(max(rows, cols)) if cpu else a.new_zeros(max(rows, cols),
                                                                   dtype=torch.float64)
    if cpu:
        x, other = torch.from_numpy(np.asarray(x)), torch.from_numpy(np.asarray(other))
    u, v = (x, other) if left else (other, x)
    s = _round_up(math.nextafter(upper * scale, math.inf), weight.dtype)
    factor = upper / sigma if sigma > 0 else 1.0
    if isinstance(anchored, tuple):
        anchored = (anchored[0] * scale ** 2, anchored[1] * scale, seal)
    elif anchored is None:  # wait before trying the second eigenvalue's certificate again
        anchored = (float(max(wait - 1, 0) if wait else WAIT), -1.0, 0.0)
    inside = upper <= limit / scale  # certified at or inside the ball's surface (in w's units)
    return (1.0 if inside else bound / s), s, u, v, factor, anchored


def solve_state(weight: Tensor, state: tuple, bound: float, update: bool
                ) -> tuple[float, float, Tensor, Tensor, float]:
    """``(scale, s, u, v, factor)`` of :func:`_solve` from a layer's buffers ``state``
    (:data:`STATE`'s, in its order; the anchor and certificate may be None), with ``update``
    overwritten with this call's (the start, and a new anchor where one was made)."""
    start, anchor, certificate = state
    scale, s, u, v, factor, anchored = _solve(weight, start, bound, anchor, certificate)
    if update:
        start.copy_(u if left_gram(weight) else v)
        if certificate is not None and anchored != KEEP:
            if anchored[1] > 0:  # a new anchor: this matrix (sealed by _solve)
                anchor.copy_(weight.detach())
            certificate.copy_(torch.tensor(anchored, dtype=torch.float64))
    return scale, s, u, v, factor


def _dscale(scale: float, s: float, bound: float, factor: float) -> float:
    """``d scale / d s`` times the certificate's factor: the coefficient of ``u v^T`` in the
    scale's gradient (0 inside the ball; a non-finite norm's ``u`` and ``v`` are NaN)."""
    return -bound * factor / (s * s) if scale != 1.0 and s > 0 else 0.0


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
    scale, s, u, v, factor, _ = _solve(weight, start, bound)
    values = torch.tensor([scale, s, factor, _dscale(scale, s, bound, factor)],
                          dtype=weight.dtype, device=weight.device)
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
    def forward(ctx, weight, state, bound, update):
        scale, s, u, v, factor = solve_state(weight, state, bound, update)
        ctx.scale, ctx.bound, ctx.factor = scale, bound, factor
        ctx.dscale = _dscale(scale, s, bound, factor)
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


def bounded_weight(weight: Tensor, state: tuple | None, bound: float,
                   update: bool = False) -> Tensor:
    """``weight * min(1, bound / s)``, ``s`` the certified norm of :func:`bounded_scale`:
    the matrix of the ball that :func:`linmem.ops.bound.bounded_memory` runs eq. (7) with.
    ``state``: a layer's buffers ``(vector, anchor, certificate)`` (:data:`STATE`: the power
    iteration's start; the matrix of the last full certificate and ``[alpha, c, seal]``, its
    Gram matrix's second eigenvalue and its norm bounded from above and its squared Frobenius
    norm, ``c = 0`` for none), or None;
    with ``update``, overwritten with this call's. Traced (torch.compile, torch.export) or on
    the ``meta`` device, the registered operator runs, from the vector alone."""
    start = None if state is None else state[0]
    if torch.compiler.is_compiling() or weight.device.type == "meta":  # the operator: traced,
        scale, _, vector = bounded_scale(weight, start, bound)       # or its fake on meta
        if update and start is not None:
            start.copy_(vector)  # not differentiable: no grad mode to set (export refuses one)
        return weight * scale
    if state is None:
        state, update = (weight.new_zeros(min(weight.shape)), None, None), False
    return _EagerBoundedWeight.apply(weight, state, float(bound), update)


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
    return scale, s, (u if left_gram(weight) else v)


def certified_norm(weight: Tensor, start: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """``(s, vector)``: ``s``, an upper bound of ``||weight||_2`` (certified as the module says:
    Temple's bound where the top singular value stands apart, else within ``SLACK`` and the Gram
    matrix's rounding), differentiable; ``vector``, the Gram matrix's unit eigenvector the power
    iteration ended on, to pass as the next call's ``start``."""
    _, s, vector = bounded_scale(weight, start, math.inf)
    return s, vector
