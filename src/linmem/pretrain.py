"""Pretraining (paper, section "Training and pretraining algorithm"), and pret-RNN.

The mathematics of pretraining; :mod:`linmem.training.recipes` runs the steps (and keeps each in the
run directory, so that an interrupted run resumes). pret-LMN, three steps:

1. ``ulm/``: the unrolled network (:class:`linmem.nn.ulm.UnrolledNet`, eqs. 10-11) trained as a
   next-step predictor by the normal trainer (Adam, early stopping on validation).
2. ``memory.npz``: a :class:`~linmem.la.LinearAutoencoder` fitted, without centering, on the ULM's
   functional-state sequences ``h_1 .. h_T`` of the training split, with window ``k + 1`` (the
   blocks the transfer needs) and ``n_components`` = the LMN's memory size.
3. ``init.pt``: the LMN initialised by eqs. (12)-(15). With the decoder blocks
   ``U_i = A^T (B^T)^i`` (``m_t`` decodes to ``h_{t-i}`` ~ ``U_i m_t``)::

       W^xh, b^h = the ULM's           W^hm = A      W^mm = B      b^m = 0
       W^mh = [W^hh_1 ... W^hh_k] [U_0; ...; U_{k-1}]     (m_{t-1} -> h_{t-1} .. h_{t-k})
       W^mo = [W^o_0 ... W^o_k] [U_0; ...; U_k]          (m_t -> h_t .. h_{t-k}),  b^o = ULM's

   When the memory is exact (``n_components`` = the rank of the windowed state matrix) the LMN
   computes exactly what the ULM computed; below that rank it is the best linear compression.
   The LMN uses the ULM's activation (SELU by default) so that the two are the same function,
   unless ``ulm_nonlinearity`` sets the ULM's apart: the paper's text trains the unrolled model
   with SELU and the final LMN with tanh (the same weights; the transfer is then approximate).
   With the LMN-A readout (``pret-lmn-a``) only ``W^o_0`` can be transferred (its readout sees
   ``h_t`` alone): an approximation.

Then the trainer fine-tunes the initialised LMN (``linmem train --model pret-lmn-b``).

pret-RNN (Pasa & Sperduti, 2014): a linear autoencoder with centering is fitted on the input
sequences; an Elman RNN gets ``W^ih = s A``, ``W^hh = B``, ``b^h = -s A mu`` (its states, before
the tanh, are the autoencoder's states times ``s``; ``s`` puts 99% of the training states in
``[-0.5, 0.5]``, tanh's near-linear range, which the linear dynamics allow since they are
scale-free) and a readout fitted by ridge least squares from those states to the next frame,
mapped to logits by linearising the sigmoid at each key's base rate.

If the autoencoder keeps fewer components than asked (the rank), the extra units start with zero
incoming weights (so the initialised function is unchanged) and random outgoing ones (so that
fine-tuning can use them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from linmem.batching import EVAL_MAX_RATIO, bucket_batches, collate
from linmem.la import LinearAutoencoder
from linmem.models import NextStepPredictor
from linmem.nn.lmn import LMN
from linmem.nn.ulm import UnrolledNet

__all__ = ["fit_memory", "hidden_states", "lag_decoder", "pretrain_rnn", "project_memory",
           "transfer"]


def lag_decoder(la: LinearAutoencoder, n_blocks: int) -> np.ndarray:
    """``[U_0; U_1; ...; U_{n-1}]``, ``(n_blocks a, p)`` with ``U_i = A^T (B^T)^i``: row block
    ``i`` maps a state ``y_t`` to the reconstruction of ``x_{t-i}``."""
    blocks, cur = [], la.A_.T
    for _ in range(n_blocks):
        blocks.append(cur)
        cur = cur @ la.B_.T
    return np.concatenate(blocks, 0)


@torch.no_grad()
def hidden_states(ulm: NextStepPredictor, sequences: Sequence[np.ndarray],
                  batch_size: int = 64) -> list[np.ndarray]:
    """The ULM's functional states ``h_1 .. h_{T-1}`` (float64) for every next-step input
    sequence (frames ``0 .. T-2``), in the order of ``sequences`` (those of length >= 2); in
    the evaluation's batches (no sequence padded beyond ``EVAL_MAX_RATIO`` of its length)."""
    ulm.eval()
    param = next(ulm.parameters())
    usable = [s for s in sequences if len(s) >= 2]
    out: list[np.ndarray] = [np.empty(0)] * len(usable)
    for idx in bucket_batches([len(s) for s in usable], batch_size, shuffle=False,
                              max_ratio=EVAL_MAX_RATIO):
        batch = collate([usable[i] for i in idx], param.dtype)
        _, hs = ulm.core(batch.inputs.to(param.device))
        for row, i in enumerate(idx):
            out[i] = hs[row, : batch.lengths[row]].double().cpu().numpy()
    return out


def fit_memory(states: Sequence[np.ndarray], memory: int, window: int | None,
               random_state: int = 0) -> LinearAutoencoder:
    """Step 2: the linear autoencoder of the functional states, no centering."""
    return LinearAutoencoder(memory, window=window, center=False,
                             random_state=random_state).fit(states)


def _pad_units(weight_in: np.ndarray, n_units: int, *axes: int) -> np.ndarray:
    """Zero-pad ``weight_in`` along ``axes`` to ``n_units`` (extra units' incoming weights)."""
    pad = [(0, 0)] * weight_in.ndim
    for axis in axes:
        pad[axis] = (0, n_units - weight_in.shape[axis])
    return np.pad(weight_in, pad)


def project_memory(weight_mm: np.ndarray, bound: float | None) -> tuple[np.ndarray, dict]:
    """The memory matrix a layer with ``memory_bound`` (:mod:`linmem.ops.bound`) starts from:
    ``weight_mm`` itself where ``||weight_mm||_2 <= bound`` (the layer then runs with it
    exactly), else the nearest matrix of the ball in the spectral and Frobenius norms, its
    singular values above ``bound`` set to ``bound``. Returns it with the facts: the norm, and the
    relative change ``||W - B||_F / ||B||_F`` (0: exact)."""
    norm = float(np.linalg.norm(weight_mm, 2)) if weight_mm.size else 0.0
    facts = {"memory_norm": norm, "memory_bound": bound, "memory_change": 0.0}
    if bound is None or norm <= bound:
        return weight_mm, facts
    u, s, vt = np.linalg.svd(weight_mm)
    projected = (u * np.minimum(s, bound)) @ vt
    facts["memory_change"] = float(np.linalg.norm(projected - weight_mm)
                                   / np.linalg.norm(weight_mm))
    return projected, facts


def transfer(la: LinearAutoencoder, ulm: UnrolledNet, lmn: LMN,
             ulm_readout: nn.Linear | None = None, lmn_readout: nn.Linear | None = None) -> dict:
    """Step 3, eqs. (12)-(15): initialise the layer ``lmn`` (one layer of the ULM's functional
    size; LMN-B's ``output="memory"`` or LMN-A's ``"hidden"``) in place from the unrolled
    network ``ulm`` and the autoencoder ``la`` of its states; with the readouts (``nn.Linear``,
    both or neither) the LMN's readout from the ULM's too: LMN-B's reads ``m_t`` and takes every
    lag's block, LMN-A's reads ``h_t`` and takes lag 0's. Under a memory bound ``W^mm = B``
    where ``||B||_2`` is within it, else the nearest matrix that is (:func:`project_memory`,
    whose facts it returns; ``||B||_2 <= 1`` in exact arithmetic)."""
    k, h = ulm.k, ulm.hidden_size
    if lmn.hidden_size != h or lmn.num_layers != 1:
        raise ValueError(f"the LMN must have one layer of {h} functional units like the ULM")
    if la.n_features_in_ != h or la.window_ < k + 1:
        raise ValueError(f"the memory must encode {h}-dim states with window >= {k + 1}")
    if (ulm_readout is None) != (lmn_readout is None):
        raise ValueError("give both readouts (the ULM's and the LMN's) or neither")
    p, m = la.n_components_, lmn.memory_size
    if p > m:
        raise ValueError(f"the autoencoder has {p} components, the LMN only {m} memory units")
    weight_mm, facts = project_memory(_pad_units(la.B_, m, 0, 1), lmn.memory_bound)
    u = lag_decoder(la, k + 1)  # ((k + 1) h, p)
    w_hh = ulm.weight_hh.detach().double().cpu().numpy()
    with torch.no_grad():  # copy_ and slice assignment convert to the LMN's dtype
        lmn.weight_xh_l0.copy_(ulm.weight_xh)
        lmn.bias_h_l0.copy_(ulm.bias_h)
        lmn.bias_m_l0.zero_()
        lmn.weight_hm_l0.copy_(torch.from_numpy(_pad_units(la.A_, m, 0)))
        lmn.weight_mm_l0.copy_(torch.from_numpy(weight_mm))
        # extra units (columns p..m) keep their random outgoing weights
        lmn.weight_mh_l0[:, :p] = torch.from_numpy(w_hh @ u[: k * h])
        if ulm_readout is not None:
            w_o = ulm_readout.weight.detach().double().cpu().numpy()  # (K, (k + 1) h)
            if lmn.output == "memory":
                lmn_readout.weight[:, :p] = torch.from_numpy(w_o @ u)
            else:  # LMN-A reads h_t: only the lag-0 block transfers
                lmn_readout.weight.copy_(torch.from_numpy(w_o[:, :h]))
            lmn_readout.bias.copy_(ulm_readout.bias)
    return facts


def pretrain_rnn(model: NextStepPredictor, sequences: Sequence[np.ndarray],
                 window: int | None = None, ridge: float = 1e-3, seed: int = 0) -> dict:
    """pret-RNN (module docstring): initialise the Elman ``model`` in place from a centred
    linear autoencoder of the next-step inputs. Returns the autoencoder's facts."""
    usable = [np.asarray(s, np.float64) for s in sequences if len(s) >= 2]
    inputs = [s[:-1] for s in usable]
    hidden = model.hidden
    # tol 1e-2: the optimal reconstruction error within 1e-3 of the exact SVD's
    # (benchmarks/la_solvers.py, results/la); the default 1e-8 ran the randomized solver's 30
    # iterations for nothing
    la = LinearAutoencoder(hidden, window=window, center=True, random_state=seed,
                           tol=1e-2).fit(inputs)
    p = la.n_components_
    states = np.concatenate([la.encode(x) for x in inputs])  # (N, p), before scaling
    scale = 0.5 / max(float(np.quantile(np.abs(states), 0.99)), 1e-12)
    states *= scale
    targets = np.concatenate([s[1:] for s in usable])
    design = np.concatenate([states, np.ones((len(states), 1))], 1)
    gram = design.T @ design
    gram += ridge * np.trace(gram) / len(gram) * np.eye(len(gram))
    coef = np.linalg.solve(gram, design.T @ targets)  # (p + 1, K): least-squares probabilities
    rate = targets.mean(0).clip(1e-3, 1 - 1e-3)
    slope = rate * (1 - rate)  # sigmoid'(logit(rate))
    w_out = (coef[:p] / slope).T
    b_out = np.log(rate / (1 - rate)) + (coef[p] - rate) / slope
    core = model.core
    with torch.no_grad():
        core.weight_ih_l0.copy_(torch.from_numpy(_pad_units(scale * la.A_, hidden, 0)))
        core.weight_hh_l0.copy_(torch.from_numpy(_pad_units(la.B_, hidden, 0, 1)))
        core.bias_ih_l0.copy_(torch.from_numpy(_pad_units(-scale * la.A_ @ la.mean_, hidden,
                                                          0)))
        core.bias_hh_l0.zero_()
        model.readout.weight[:, :p] = torch.from_numpy(w_out)
        model.readout.bias.copy_(torch.from_numpy(b_out))
    return {"la_components": int(p), "la_window": window, "state_scale": scale,
            "la_solver": la.solver_}
