"""Diagnostics of an LMN's linear memory from a ``state_dict``: what keeps eq. (7) finite.

:func:`memory_radii_of` is the spectral radius of ``W^mm`` per layer, :func:`memory_loop_gains`
that of the memory's linearised loop through the functional part (eqs. 6-7);
:func:`saturated_fraction`, from a layer and its input, how much of that part sits where tanh is
flat (a loop gain grown past one can drive it there and hold it: the functional units then pass
neither the input nor a gradient).
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from linmem.nn.lmn import LMN, _time_major_linear, lmn_recurrence
from linmem.ops.bound import bounded_memory
from linmem.ops.loop_bound import bounded_loop
from linmem.ops.toolkit import SELU_SCALE, check_nonlinearity

__all__ = ["memory_loop_gains", "memory_radii_of", "saturated_fraction"]

SATURATED = 0.99  # |h| above it: tanh's slope 1 - h^2 below 0.02


def _lmn_layers(state: dict[str, Tensor], memory_bound: float | None = None,
                loop: str | None = None) -> list[dict[str, Tensor]]:
    """The LMN layers' recurrent weights in a ``state_dict`` (keys ending ``weight_mm_lN``,
    ``weight_hm_lN``, ``weight_mh_lN``, any prefix; a reverse direction's ``..._lN_reverse``
    after its layer's forward one), in layer order, as float64 on the CPU; ``weight_mm`` (and
    ``weight_hm``) as eqs. (6)-(7) use them under ``memory_bound`` (the layer's,
    :mod:`linmem.ops.bound`), a loop bound where ``loop`` names the layer's activation
    (:mod:`linmem.ops.loop_bound`)."""
    weights = {k.rsplit(".", 1)[-1]: v for k, v in state.items()}
    layers = sorted((int(m[1]), m[2] or "") for k in weights
                    if (m := re.fullmatch(r"weight_mm_l(\d+)(_reverse)?", k)))
    out = [{n: weights[f"{n}_l{layer}{suffix}"].detach().double().cpu()
            for n in ("weight_mm", "weight_hm", "weight_mh")}
           for layer, suffix in layers]
    for w in out:
        if loop is not None and memory_bound is not None:
            w["weight_mm"], w["weight_hm"] = bounded_loop(
                w["weight_mm"], w["weight_hm"], w["weight_mh"], memory_bound, loop)
        else:
            w["weight_mm"] = bounded_memory(w["weight_mm"], memory_bound)
    return out


def _spectral_radius(matrix: Tensor) -> float:
    return float(torch.linalg.eigvals(matrix).abs().max())


def memory_radii_of(state: dict[str, Tensor], memory_bound: float | None = None,
                    loop: str | None = None) -> list[float]:
    """Per LMN layer (and direction) of a ``state_dict``, the spectral radius ``max |eig(W^mm)|``
    of its memory-to-memory matrix (eq. 7; under the layer's ``memory_bound``, and its loop
    bound where ``loop`` names its activation, the matrix it runs with); [] for a model without
    a linear memory. Above 1, the memory's state grows geometrically along a sequence."""
    return [_spectral_radius(w["weight_mm"]) for w in _lmn_layers(state, memory_bound, loop)]


def memory_loop_gains(state: dict[str, Tensor], nonlinearity: str,
                      memory_bound: float | None = None, loop_bound: bool = False
                      ) -> list[float]:
    """Per LMN layer (and direction) of a ``state_dict`` (keys ending ``weight_mm_lN``,
    ``weight_hm_lN``, ``weight_mh_lN``, any prefix; ``W^mm`` under ``memory_bound``, and
    ``W^hm`` too under a ``loop_bound``), the
    spectral radius of the memory's
    linearised recurrence with every functional unit on its unbounded side:
    ``rho(W^mm + s W^hm W^mh)`` (eqs. 6-7: ``m_t`` depends on ``m_{t-1}`` directly and through
    ``h_t``), ``s`` the activation's slope there (relu 1, selu its scale 1.0507; tanh, bounded,
    its slope at 0, 1).

    ``rho(W^mm) < 1`` alone does not keep the state finite when the activation is unbounded:
    above 1 here, units driven into their linear side feed the memory back with a gain above
    one, and the state can grow geometrically along a sequence. A tanh LMN's ``|h| <= 1`` keeps
    its memory bounded while ``rho(W^mm) < 1`` whatever this gain."""
    check_nonlinearity(nonlinearity)
    slope = SELU_SCALE if nonlinearity == "selu" else 1.0
    return [_spectral_radius(w["weight_mm"] + slope * w["weight_hm"] @ w["weight_mh"])
            for w in _lmn_layers(state, memory_bound, nonlinearity if loop_bound else None)]


@torch.no_grad()
def saturated_fraction(layer: torch.nn.Module, input: Tensor, mask: Tensor | None = None,
                       level: float = SATURATED) -> float | None:
    """The fraction of the first layer's functional activations ``h_t`` (eq. 6) with
    ``|h_t| > level`` over the valid steps of ``input`` (``mask``: ``(B, T)`` with
    ``batch_first``, else ``(T, B)``; None: every step), run from a zero memory; None for a layer
    that is not a tanh LMN (relu and selu have no flat side at both ends)."""
    if not isinstance(layer, LMN) or layer.nonlinearity != "tanh":
        return None
    x = input.transpose(0, 1) if layer.batch_first else input
    w = layer.layer_weights(0)
    x_proj = _time_major_linear(x, w["weight_xh"], w["bias_h"])  # as LMN.forward, eq. (6)
    m0 = x.new_zeros(x.shape[1], layer.memory_size)
    hs = lmn_recurrence(x_proj, m0, w["weight_mh"], w["weight_hm"], layer.memory_weight(0),
                        w["bias_m"], "tanh")[0]
    flat = hs.abs() > level
    if mask is None:
        return float(flat.float().mean())
    valid = (mask.transpose(0, 1) if layer.batch_first else mask).to(hs.device)
    count = int(valid.sum()) * hs.shape[-1]
    return float(flat[valid].sum()) / count if count else None
