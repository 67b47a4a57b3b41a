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

``||V||_2`` is computed once per forward (not per step), exactly, by
``torch.linalg.matrix_norm(V, 2)`` (an SVD; measured against the alternatives in
``benchmarks/memory_bound.py``). ONNX has no SVD: under ``torch.onnx.export`` the norm is the
Schatten ``2p``-norm ``tr((V^T V)^p)^(1/2p)`` by repeated squaring (:func:`schatten_norm`), never
below ``||V||_2`` and above it by at most ``M^(1/2p)`` (``p = 2^20``: ``1 + 3e-6`` at ``M =
1000``), so the exported bound holds too and the outputs equal eager's to float32 rounding.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["bounded_memory", "check_memory_bound", "memory_norm_bound", "schatten_norm"]

_SQUARINGS = 20  # p = 2^20 in the ONNX path's Schatten norm


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


def bounded_memory(weight: Tensor, bound: float | None) -> Tensor:
    """The memory matrix eq. (7) runs with: ``weight`` itself without a bound, else ``weight``
    rescaled into the ball ``||W||_2 <= bound`` (unchanged inside it)."""
    if bound is None:
        return weight
    norm = (schatten_norm(weight) if torch.onnx.is_in_onnx_export()
            else torch.linalg.matrix_norm(weight, 2))
    return weight * (bound / norm).clamp(max=1.0)


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
