"""A bounded memory loop: eqs. (6)-(7) kept finite for an activation that does not saturate.

The memory bound (:mod:`linmem.ops.bound`) holds ``||W^mm||_2 <= r``. With tanh (``|h| <= 1``)
that keeps the memory finite; with relu or selu ``h`` is not bounded, and the memory also feeds
itself through the functional part, ``m -> W^hm sigma(W^mh m + ...)``. An activation with
``sigma(0) = 0`` and Lipschitz constant ``L`` (:data:`LIPSCHITZ`: relu 1, selu ``lambda alpha =
1.7581``) has ``||sigma(a)|| <= L ||a||``, so eqs. (6)-(7) give::

    ||m_t|| <= g ||m_{t-1}|| + L ||W^hm||_2 ||W^xh x_t + b^h|| + ||b^m||
    g = ||W^mm||_2 + L ||W^hm||_2 ||W^mh||_2                              (the loop's gain)

With a loop bound ``r`` the layer runs eqs. (6)-(7) with ``W^mm`` and ``W^hm`` both multiplied
by ``k = min(1, r / g^)``, ``g^ = s_mm + L s_hm s_mh`` from the certified upper norms of
:mod:`linmem.ops.certified_norm` (``s >= ||V||_2`` each, so ``g^ >= g``): the loop's gain is then
at most ``r`` whatever the parameters, and below 1 the memory stays within
:func:`loop_norm_bound` for every input. A tanh layer needs only the memory bound, and its loop
gain may exceed 1 without harm; ``LMN(loop_bound=None)`` (the default) bounds the loop exactly
for the activations that need it. :func:`bounded_loop_ref` is the same with the exact norms.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linmem.ops.bound import schatten_norm, spectral_norm, spectral_norm_ref
from linmem.ops.certified_norm import bounded_scale, solve_state

__all__ = ["LIPSCHITZ", "bounded_loop", "bounded_loop_ref", "check_loop_bound",
           "loop_norm_bound"]

# the activations' Lipschitz constants (each has sigma(0) = 0): selu's is its slope at 0 from
# below, scale * alpha (torch's constants), rounded up
LIPSCHITZ = {"tanh": 1.0, "relu": 1.0,
             "selu": math.nextafter(1.0507009873554804934193349852946
                                    * 1.6732632423543772848170429916717, math.inf)}


def check_loop_bound(loop_bound: bool | None, nonlinearity: str,
                     memory_bound: float | None) -> bool:
    """Whether a layer bounds its loop: ``loop_bound``, or where None, whether it has a memory
    bound and an activation that does not saturate (relu, selu); one line why not."""
    if loop_bound is None:
        return memory_bound is not None and nonlinearity != "tanh"
    if not isinstance(loop_bound, bool):
        raise ValueError(f"loop_bound must be True, False or None (bound the loop of a relu or "
                         f"selu layer), got {loop_bound!r}")
    if loop_bound and memory_bound is None:
        raise ValueError("loop_bound holds the memory loop's gain to memory_bound: it needs a "
                         "memory_bound, got None")
    return loop_bound


def _gain_above(norms: tuple[float, float, float], lipschitz: float) -> float:
    """``s_mm + L s_hm s_mh`` rounded up (two roundings of float64, each at most one ulp)."""
    s_mm, s_hm, s_mh = norms
    return (s_mm + lipschitz * s_hm * s_mh) * (1 + 4 * 2.0 ** -53)


class _EagerBoundedLoop(torch.autograd.Function):
    """``(W^mm k, W^hm k)`` in one node (eager mode), the three norms certified from the layer's
    buffers (moved on with ``update``); the scalars stay Python floats."""

    @staticmethod
    def forward(ctx, w_mm, w_hm, w_mh, states, bound, lipschitz, update):
        solved = [solve_state(w, state, math.inf, update)
                  for w, state in zip((w_mm, w_hm, w_mh), states, strict=True)]
        norms = tuple(x[1] for x in solved)
        gain = _gain_above(norms, lipschitz)
        k = 1.0 if gain <= bound else bound / gain
        ctx.k, ctx.bound, ctx.gain, ctx.lipschitz, ctx.norms = k, bound, gain, lipschitz, norms
        ctx.factors = tuple(x[4] for x in solved)
        vectors = [t.to(w) for x, w in zip(solved, (w_mm, w_hm, w_mh), strict=True)
                   for t in x[2:4]]
        ctx.save_for_backward(w_mm, w_hm, w_mh, *vectors)
        return w_mm * k, w_hm * k

    @staticmethod
    def backward(ctx, grad_mm, grad_hm):
        """``k G`` for the two scaled matrices, and where ``k < 1`` the scale's gradient,
        ``dk/dg <G, W>`` times each norm's ``dg/ds u v^T``; under ``create_graph`` the same
        through differentiable SVDs (the certificates' factors held)."""
        w_mm, w_hm, w_mh, *vectors = ctx.saved_tensors
        k = ctx.k
        if k == 1.0:
            return grad_mm * k, grad_hm * k, None, None, None, None, None
        if torch.is_grad_enabled():
            f_mm, f_hm, f_mh = ctx.factors
            gain = (f_mm * spectral_norm_ref(w_mm) + ctx.lipschitz * f_hm
                    * spectral_norm_ref(w_hm) * f_mh * spectral_norm_ref(w_mh))
            scale = ctx.bound / gain
            outs = torch.autograd.grad((w_mm * scale, w_hm * scale), (w_mm, w_hm, w_mh),
                                       (grad_mm, grad_hm), create_graph=True)
            return (*outs, None, None, None, None)
        dk = -ctx.bound / ctx.gain ** 2 * float(
            torch.vdot(grad_mm.reshape(-1), w_mm.reshape(-1))
            + torch.vdot(grad_hm.reshape(-1), w_hm.reshape(-1)))
        _, s_hm, s_mh = ctx.norms
        f_mm, f_hm, f_mh = ctx.factors
        u_mm, v_mm, u_hm, v_hm, u_mh, v_mh = vectors
        out_mm = torch.addr(grad_mm, u_mm, v_mm, beta=k, alpha=dk * f_mm)
        out_hm = torch.addr(grad_hm, u_hm, v_hm, beta=k, alpha=dk * ctx.lipschitz * s_mh * f_hm)
        out_mh = torch.outer(u_mh, v_mh) * (dk * ctx.lipschitz * s_hm * f_mh)
        return out_mm, out_hm, out_mh, None, None, None, None


def _composed(w_mm: Tensor, w_hm: Tensor, norms: tuple[Tensor, Tensor, Tensor], bound: float,
              lipschitz: float) -> tuple[Tensor, Tensor]:
    """``(W^mm k, W^hm k)`` from three differentiable norms, in tensor operations."""
    gain = norms[0] + lipschitz * norms[1] * norms[2]
    k = torch.where(gain <= bound, torch.ones_like(gain), bound / gain)
    return w_mm * k, w_hm * k


def bounded_loop(w_mm: Tensor, w_hm: Tensor, w_mh: Tensor, bound: float, nonlinearity: str,
                 states: tuple | None = None, update: bool = False) -> tuple[Tensor, Tensor]:
    """``(W^mm, W^hm)`` as eqs. (6)-(7) run them under a loop bound ``r``: both multiplied by
    ``min(1, r / (s_mm + L s_hm s_mh))``, the ``s`` certified upper bounds of the three norms
    (``w_mh``, ``W^mh``, enters the gain only). ``states``: the layer's buffers of the three
    matrices, each as :func:`linmem.ops.certified_norm.bounded_weight` takes them, or None;
    with ``update``, overwritten with this call's. Traced or on ``meta``, the registered
    operator runs from the vectors alone; under ONNX export the Schatten norm, under torch.func
    the SVD's (as :func:`linmem.ops.bound.bounded_memory`)."""
    lipschitz = LIPSCHITZ[nonlinearity]
    weights = (w_mm, w_hm, w_mh)
    if torch._C._are_functorch_transforms_active():
        return _composed(w_mm, w_hm, tuple(map(spectral_norm_ref, weights)), bound, lipschitz)
    if torch.onnx.is_in_onnx_export():
        return _composed(w_mm, w_hm, tuple(map(schatten_norm, weights)), bound, lipschitz)
    if torch.compiler.is_compiling() or w_mm.device.type == "meta":
        norms = []
        for w, state in zip(weights, states or (None,) * 3, strict=True):
            start = None if state is None else state[0]
            _, s, vector = bounded_scale(w, start, math.inf)
            if update and start is not None:
                start.copy_(vector)
            norms.append(s)
        return _composed(w_mm, w_hm, tuple(norms), bound, lipschitz)
    if states is None:
        states, update = tuple((w.new_zeros(min(w.shape)), None, None) for w in weights), False
    return _EagerBoundedLoop.apply(w_mm, w_hm, w_mh, states, float(bound), lipschitz, update)


def bounded_loop_ref(w_mm: Tensor, w_hm: Tensor, w_mh: Tensor, bound: float,
                     nonlinearity: str) -> tuple[Tensor, Tensor]:
    """The reference of :func:`bounded_loop`: the same scale from the exact norms
    (:func:`linmem.ops.bound.spectral_norm`)."""
    norms = tuple(spectral_norm(w) for w in (w_mm, w_hm, w_mh))
    return _composed(w_mm, w_hm, norms, bound, LIPSCHITZ[nonlinearity])


def loop_norm_bound(w_mm: Tensor, w_hm: Tensor, w_mh: Tensor, bias_m: Tensor | None,
                    drive: float, bound: float, nonlinearity: str, m0_norm: float = 0.0) -> float:
    """The largest ``||m_t||`` a layer running ``(w_mm, w_hm)`` (the matrices :func:`bounded_loop`
    gives, gain ``g <= bound < 1``) can reach from ``||m_0|| <= m0_norm`` when every step's
    ``||W^xh x_t + b^h|| <= drive``: ``max(m0_norm, (L ||W^hm||_2 drive + ||b^m||) / (1 - g))``,
    the norms exact (float64 SVDs)."""
    if not bound < 1:
        raise ValueError(f"the loop is contractive only for a bound below 1, got {bound}")
    norm = [float(torch.linalg.matrix_norm(w.detach().double(), 2)) for w in (w_mm, w_hm, w_mh)]
    lipschitz = LIPSCHITZ[nonlinearity]
    gain = norm[0] + lipschitz * norm[1] * norm[2]
    if not gain < 1:
        raise ValueError(f"the loop's gain is {gain:.6g}, not below 1: no finite bound")
    offset = lipschitz * norm[1] * drive
    if bias_m is not None:
        offset += float(bias_m.detach().double().norm())
    return max(m0_norm, offset / (1 - gain))
