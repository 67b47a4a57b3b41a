"""A bounded linear memory: the memory matrix ``W^mm`` of eq. (7) held to a spectral-norm ball.

Nothing in the paper bounds ``W^mm``; trained by Adam at batch 1 its spectral radius passes 1
within tens of updates, and over a sequence of thousands of steps the memory then grows
geometrically until it overflows float32. With ``memory_bound=r`` the layer keeps its raw
parameter ``V`` (``weight_mm_l{k}``, any value the optimiser reaches) and runs eq. (7) with::

    W^mm = V * min(1, r / ||V||_2)                                              (7, bounded)

a reparametrization, not a clip after the step: ``||W^mm||_2 <= r`` for every ``V`` (a state
dict loaded, a large learning rate), ``W^mm = V`` exactly inside the ball (so a pretrained
memory with ``||B||_2 <= r`` transfers unchanged), and outside it the gradient is that of the
rescaled matrix. With ``r < 1`` and a bounded activation (``|h| <= 1``, tanh) the memory is
contractive: ``||m_t|| <= (||W^hm||_2 sqrt(H) + ||b^m||) / (1 - r)`` for every input and every
``t`` (:func:`memory_norm_bound`).

``||V||_2`` is computed once per forward (not per step), from above: ``s >= ||V||_2``, proven
in exact arithmetic, equal to it to about ``1e-7`` where the top singular value stands apart
(Temple's bound, as training makes it) and at most ``1 + d`` times it elsewhere (``d`` about
``5e-4``) (:mod:`linmem.ops.certified_norm`, the operator ``linmem::bounded_scale``; a layer's
buffers carry its state from one update to the next, so that most updates need only a few
matrix-vector products). So the bounded matrix is inside the ball to float32's rounding, and
at most ``d`` inside its surface. :func:`bounded_memory_ref` is the same rescaling by the
exact norm of the operator ``linmem::spectral_norm`` (:func:`spectral_norm`: the largest
eigenpair alone of ``V^T V``, LAPACK's ``syevr`` on the CPU, ``eigh`` elsewhere), the path of
every bounded run trained before 2026-12-07, and the certified norm's reference in the tests;
``benchmarks/memory_bound.py --part cost`` times both (``results/bounded-memory/cost.json``).
ONNX has no eigensolver: under ``torch.onnx.export`` the norm is the Schatten ``2p``-norm
``tr((V^T V)^p)^(1/2p)`` by repeated squaring (:func:`schatten_norm`), never below ``||V||_2``
and above it by at most ``M^(1/2p)`` (``p = 2^20``: ``1 + 3e-6`` at ``M = 1000``), so the
exported bound holds too, and the outputs equal eager's to float32 rounding where eager's is
Temple's.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from linmem.ops.certificates import on_the_ball
from linmem.ops.certified_norm import bounded_weight
from linmem.ops.eigen import top_eigenpair, top_eigenpair_lapack

__all__ = ["DEFAULT_MEMORY_BOUND", "bounded_memory", "bounded_memory_ref", "check_memory_bound",
           "memory_norm_bound", "schatten_norm", "spectral_norm", "spectral_norm_ref"]

_SQUARINGS = 20  # p = 2^20 in the ONNX path's Schatten norm

# the bound an LMN takes when none is given (the layers, the models, linmem train): 0.99, the
# decision of the rule of results/bounded-memory/README.md (linmem.experiments.bound_choice) on
# the bounded campaign's seeds, which a test holds it to; None (memory_bound=None,
# --memory-bound none) is the paper's unconstrained memory; a model without a memory takes None
# whatever this is
DEFAULT_MEMORY_BOUND: float | None = 0.99


def check_memory_bound(bound: float | None) -> float | None:
    """``bound`` as a float (``None``: the paper's unconstrained memory), or one line why not."""
    if bound is None:
        return None
    if isinstance(bound, bool) or not isinstance(bound, int | float) or not math.isfinite(bound) \
            or bound <= 0:
        raise ValueError(f"memory_bound must be a positive number (the largest spectral norm of "
                         f"W^mm; below 1 the memory is contractive) or None, got {bound!r}")
    return float(bound)


def schatten_norm(weight: Tensor, squarings: int = _SQUARINGS) -> Tensor:
    """``tr((W^T W)^p)^(1/2p)`` with ``p = 2^squarings``: an upper bound of ``||W||_2`` within
    a factor ``n^(1/2p)`` (``n`` the smaller side), from matrix products alone (each square
    normalised by its trace, the logs of the traces summed, so nothing overflows)."""
    a = weight.T @ weight if weight.shape[0] >= weight.shape[1] else weight @ weight.T
    log_norm = weight.new_zeros(())
    for j in range(squarings + 1):
        trace = torch.diagonal(a).sum().clamp_min(torch.finfo(a.dtype).tiny)
        log_norm = log_norm + trace.log() / 2 ** j
        a = a / trace
        if j < squarings:
            a = a @ a
    return torch.exp(log_norm / 2)


@torch.library.custom_op("linmem::spectral_norm", mutates_args=())
def _spectral_norm(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(sigma_1, u_1, v_1)`` of a matrix: its largest singular value and a unit pair of
    singular vectors (``weight @ v_1 = sigma_1 u_1``), from the largest eigenpair of the Gram
    matrix of its smaller side; NaN throughout for a matrix with a non-finite entry."""
    rows, cols = weight.shape
    tall = rows >= cols
    w = weight.detach()
    if w.dtype not in (torch.float32, torch.float64):
        w = w.float()
    n = min(rows, cols)
    if n == 0 or not bool(torch.isfinite(w).all()):
        fill = 0.0 if n == 0 else math.nan
        return (weight.new_full((), fill), weight.new_full((rows,), fill),
                weight.new_full((cols,), fill))
    scale = w.abs().max()  # the Gram matrix of the rescaled matrix neither overflows nor underflows
    if scale == 0:
        return weight.new_zeros(()), weight.new_zeros(rows), weight.new_zeros(cols)
    w = w / scale
    gram = w.T @ w if tall else w @ w.T
    lam, vec = (top_eigenpair_lapack if gram.device.type == "cpu" else top_eigenpair)(gram)
    sigma = math.sqrt(max(lam, 0.0))
    other = (w @ vec if tall else w.T @ vec) / sigma
    u, v = (other, vec) if tall else (vec, other)
    return (weight.new_full((), sigma * float(scale)), u.to(weight.dtype), v.to(weight.dtype))


@_spectral_norm.register_fake
def _spectral_norm_fake(weight):
    rows, cols = weight.shape
    return weight.new_empty(()), weight.new_empty(rows), weight.new_empty(cols)


def _spectral_norm_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0], output[1], output[2])
    ctx.mark_non_differentiable(output[1], output[2])


def _spectral_norm_backward(ctx, grad_sigma, grad_u, grad_v):
    """``d sigma_1 / dW = u_1 v_1^T``; under ``create_graph`` (``torch.is_grad_enabled()`` in
    a backward) the same gradient through a differentiable SVD, so that second derivatives
    are exact too."""
    weight, u, v = ctx.saved_tensors
    if torch.is_grad_enabled():
        left, _, right = torch.linalg.svd(weight, full_matrices=False)
        return grad_sigma * (left[:, :1] @ right[:1])
    return grad_sigma * torch.outer(u, v)


_spectral_norm.register_autograd(_spectral_norm_backward, setup_context=_spectral_norm_setup)


def spectral_norm_ref(weight: Tensor) -> Tensor:
    """The reference of :func:`spectral_norm`: PyTorch's ``matrix_norm(weight, 2)`` (a full
    SVD), which torch.func's transforms differentiate and map over (an operator's registered
    autograd is not theirs)."""
    return torch.linalg.matrix_norm(weight, 2)


def spectral_norm(weight: Tensor) -> Tensor:
    """``||W||_2`` of a matrix, exactly (to its dtype's rounding), differentiable; under
    ``torch.onnx.export`` the upper bound :func:`schatten_norm` (ONNX has no eigensolver), under
    torch.func's transforms (``grad``, ``vmap``, ``jacrev``) :func:`spectral_norm_ref`."""
    if weight.dim() != 2:
        raise ValueError(f"spectral_norm takes a matrix, got a tensor of shape "
                         f"{tuple(weight.shape)}")
    if torch.onnx.is_in_onnx_export():
        return schatten_norm(weight)
    if torch._C._are_functorch_transforms_active():
        return spectral_norm_ref(weight)
    return torch.ops.linmem.spectral_norm(weight)[0]


def bounded_memory(weight: Tensor, bound: float | None, state: tuple | None = None,
                   update: bool = False) -> Tensor:
    """The memory matrix eq. (7) runs with: ``weight`` itself without a bound, else ``weight``
    rescaled into the ball ``||W||_2 <= bound`` (unchanged inside it) by an upper bound of its
    norm certified by :mod:`linmem.ops.certified_norm` (never below the norm, at most ``SLACK``
    and the Gram matrix's rounding above it). ``state``: a layer's buffers (the power
    iteration's start and the last full certificate, :func:`linmem.ops.certified_norm.
    bounded_weight`), which make most calls cheap; with ``update`` it is overwritten with this
    call's (a layer in training mode). :func:`bounded_memory_ref` is the same with the exact
    norm."""
    if bound is None:
        return weight
    if torch._C._are_functorch_transforms_active():
        norm = spectral_norm_ref(weight)
    elif torch.onnx.is_in_onnx_export():
        norm = schatten_norm(weight)
    else:
        return bounded_weight(weight, state, bound, update)
    # as the certified norm: the matrix kept within rounding of the ball, else rescaled (by a
    # norm as tight as the certified one where the top singular value stands apart, Temple's)
    inside = norm <= on_the_ball(bound, weight)
    return weight * torch.where(inside, torch.ones_like(norm), bound / norm)


def bounded_memory_ref(weight: Tensor, bound: float | None) -> Tensor:
    """The reference of :func:`bounded_memory`: the same rescaling by the exact norm
    (:func:`spectral_norm`, LAPACK's top eigenpair of the Gram matrix), as every bounded run
    before the certified norm was trained."""
    if bound is None:
        return weight
    norm = spectral_norm(weight)
    # a norm within a few units of rounding of the bound is on it: the matrix is kept as it is
    # (a memory projected onto the ball, or B with ||B||_2 = 1, transfers exactly)
    inside = norm <= bound * (1 + 8 * torch.finfo(weight.dtype).eps)
    return weight * torch.where(inside, torch.ones_like(norm), bound / norm)


def memory_norm_bound(weight_hm: Tensor, bias_m: Tensor | None, bound: float,
                      m0_norm: float = 0.0) -> float:
    """The largest ``||m_t||`` a tanh layer with ``||W^mm||_2 <= bound < 1`` can reach from a
    memory ``||m_0|| <= m0_norm``: ``max(m0_norm, (||W^hm||_2 sqrt(H) + ||b^m||) / (1 - bound))``
    (``|h_t| <= 1`` entrywise, so ``||W^hm h_t|| <= ||W^hm||_2 sqrt(H)``)."""
    if not bound < 1:
        raise ValueError(f"the memory is contractive only for a bound below 1, got {bound}")
    drive = float(torch.linalg.matrix_norm(weight_hm.detach().double(), 2)) \
        * math.sqrt(weight_hm.shape[1])
    if bias_m is not None:
        drive += float(bias_m.detach().double().norm())
    return max(m0_norm, drive / (1 - bound))
