"""A NADE readout: a joint distribution over the keys of a frame, conditioned on a recurrent state.

The neural autoregressive distribution estimator (Larochelle & Murray, AISTATS 2011) factorises
``P(v) = prod_i P(v_i | v_<i)`` over the ``D`` binary units of a frame, with one hidden layer of
``H`` units whose weights ``W`` are shared by every conditional::

    h_i = sigmoid(c + W[:, :i] v_:i)                 (H,)  hidden units of key i
    P(v_i = 1 | v_<i) = sigmoid(b_i + V[i] . h_i)         conditional of key i

As in RNN-NADE (Boulanger-Lewandowski, Bengio & Vincent, ICML 2012) the biases are set by a
context, the recurrent state ``s_t`` after frames ``0..t``: ``b = b_0 + U_b s``,
``c = c_0 + U_c s``. With ``V = 0`` the keys are independent Bernoullis of logits ``b``: the
factorised readout of the other models is the special case.

Likelihood: all ``D`` pre-activations ``c + W[:, :i] v_:i`` are one exclusive cumulative sum
over the keys (no loop over ``i``); the log-likelihood of a frame is minus the Bernoulli NLL of
the conditional logits, exact. Sampling is ancestral, key by key. Key marginals
``P(v_i = 1)``, which accuracy needs, have no closed form; :meth:`NADE.marginals` estimates them
from ``n`` ancestral samples by averaging each key's conditional probability along the sampled
paths (``E[P(v_i = 1 | v_<i)] = P(v_i = 1)``: unbiased, with a lower variance than averaging
the sampled 0/1 values), with the standard error ``sd / sqrt(n)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linmem._check import check_int

__all__ = ["NADE", "nade_marginals"]

_ROWS = 1 << 16  # frames x samples drawn at once by NADE.sample (bounds its memory)


class NADE(nn.Module):
    """A conditional NADE over ``n_visible`` binary units.

    Args:
        n_visible: ``D``, the units of a frame (88 keys).
        n_hidden: ``H``, the NADE's hidden units.
        n_context: size of the context ``s`` that sets the biases.
        n_samples: ancestral samples per frame of :meth:`forward`'s marginal estimate.
        seed: seed of :meth:`forward`'s samples (the same estimate on every call).

    Shape: ``context (..., n_context)``, frames ``v (..., n_visible)``; :meth:`forward` returns
    the logits of the estimated marginals ``(..., n_visible)``, so that the NADE can stand where
    a factorised ``Linear(n_context, n_visible)`` readout stood.
    """

    def __init__(self, n_visible: int, n_hidden: int, n_context: int, n_samples: int = 100,
                 seed: int = 0):
        super().__init__()
        for name, value in (("n_visible", n_visible), ("n_hidden", n_hidden),
                            ("n_context", n_context), ("n_samples", n_samples)):
            check_int(name, value)
        self.n_samples, self.seed = n_samples, seed
        self.visible_bias = nn.Linear(n_context, n_visible)  # b = b_0 + U_b s
        self.hidden_bias = nn.Linear(n_context, n_hidden)  # c = c_0 + U_c s
        bound = 1 / math.sqrt(n_hidden)
        self.W = nn.Parameter(torch.empty(n_hidden, n_visible).uniform_(-bound, bound))
        # V = 0: training starts from the factorised readout (keys independent given s)
        self.V = nn.Parameter(torch.zeros(n_visible, n_hidden))

    @property
    def n_visible(self) -> int:
        return self.W.shape[1]

    def _check(self, context: Tensor, v: Tensor | None = None) -> None:
        if context.shape[-1] != self.visible_bias.in_features:
            raise ValueError(f"context must be (..., {self.visible_bias.in_features}), "
                             f"got {tuple(context.shape)}")
        if v is not None and v.shape != (*context.shape[:-1], self.n_visible):
            raise ValueError(f"frames must be {(*context.shape[:-1], self.n_visible)} for this "
                             f"context, got {tuple(v.shape)}")

    def conditional_logits(self, context: Tensor, v: Tensor) -> Tensor:
        """The logits of ``P(v_i = 1 | v_<i, s)`` for every key ``i`` of the frames ``v``, all
        at once: ``h_i = sigmoid(c + sum_{j<i} W[:, j] v_j)`` is an exclusive cumulative sum
        over the keys. ``(..., n_visible)``."""
        self._check(context, v)
        steps = v.unsqueeze(-1) * self.W.T  # (..., D, H): W[:, j] v_j
        before = F.pad(torch.cumsum(steps[..., :-1, :], dim=-2), (0, 0, 1, 0))  # sum over j < i
        h = torch.sigmoid(self.hidden_bias(context).unsqueeze(-2) + before)
        return self.visible_bias(context) + (h * self.V).sum(-1)

    def log_prob(self, context: Tensor, v: Tensor) -> Tensor:
        """``log P(v | s)`` of each frame, exact: ``(...)``."""
        z = self.conditional_logits(context, v)
        return -F.binary_cross_entropy_with_logits(z, v.to(z.dtype), reduction="none").sum(-1)

    @torch.no_grad()
    def sample(self, context: Tensor, n: int = 1, temperature: float = 1.0,
               generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """``n`` ancestral samples per context: ``(v, p)``, each ``(n, ..., n_visible)``: the 0/1
        frames and each key's conditional probability ``P(v_i = 1 | v_<i, s)`` along its path,
        logits divided by ``temperature``."""
        self._check(context)
        check_int("n", n)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature!r}")
        lead = context.shape[:-1]
        flat = context.reshape(-1, context.shape[-1])
        v, p = _ancestral(self.visible_bias(flat), self.hidden_bias(flat), self.V, self.W, n,
                          temperature, generator)
        return v.reshape(n, *lead, -1), p.reshape(n, *lead, -1)

    @torch.no_grad()
    def marginals(self, context: Tensor, n: int | None = None,
                  generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Estimated key marginals ``P(v_i = 1 | s)`` and their standard errors, each
        ``(..., n_visible)``: the mean and ``sd / sqrt(n)`` over ``n`` (default
        ``n_samples``) ancestral paths of each key's conditional probability."""
        n = self.n_samples if n is None else n
        _, p = self.sample(context, n, generator=generator)
        se = p.std(0) / math.sqrt(n) if n > 1 else torch.full_like(p[0], float("nan"))
        return p.mean(0), se

    def forward(self, context: Tensor) -> Tensor:
        """Logits of the estimated marginals (:meth:`marginals`, ``n_samples`` paths drawn with
        ``seed``: the same figures on every call), for the accuracy of the key predictions.
        The sampling is the operator ``linmem::nade_marginals`` (a seeded generator that
        torch.compile cannot hold sits inside it)."""
        self._check(context)
        flat = context.reshape(-1, context.shape[-1])
        p = nade_marginals(self.visible_bias(flat).detach(), self.hidden_bias(flat).detach(),
                           self.V.detach(), self.W.detach(), self.n_samples, self.seed)
        p = p.reshape(*context.shape[:-1], -1).clamp(1e-6, 1 - 1e-6)
        return torch.log(p) - torch.log1p(-p)


def _ancestral(b: Tensor, c: Tensor, V: Tensor, W: Tensor, n: int, temperature: float,
               generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """``n`` ancestral paths of the NADE with visible biases ``b`` ``(N, D)`` and hidden biases
    ``c`` ``(N, H)`` per context: ``(v, p)``, each ``(n, N, D)``."""
    d = V.shape[0]
    v = torch.empty(n, len(b), d, dtype=b.dtype, device=b.device)
    p = torch.empty_like(v)
    rows = max(1, _ROWS // n)
    for start in range(0, len(b), rows):
        part = slice(start, start + rows)
        a = c[part].expand(n, -1, -1).clone()  # (n, rows, H)
        for i in range(d):
            p_i = torch.sigmoid((b[part, i] + torch.sigmoid(a) @ V[i]) / temperature)
            v_i = (torch.rand(p_i.shape, generator=generator, dtype=p_i.dtype,
                              device=p_i.device) < p_i).to(p_i.dtype)
            a += v_i.unsqueeze(-1) * W[:, i]
            v[:, part, i], p[:, part, i] = v_i, p_i
    return v, p


@torch.library.custom_op("linmem::nade_marginals", mutates_args=())
def nade_marginals(b: Tensor, c: Tensor, V: Tensor, W: Tensor, n: int, seed: int) -> Tensor:
    """The key marginals ``(N, D)`` of a NADE (visible biases ``b`` ``(N, D)``, hidden biases
    ``c`` ``(N, H)``), each the mean over ``n`` ancestral paths drawn from a generator seeded
    with ``seed`` of the key's conditional probability along the path. Not differentiable."""
    generator = torch.Generator(device=b.device).manual_seed(seed)
    with torch.no_grad():
        return _ancestral(b, c, V, W, n, 1.0, generator)[1].mean(0)


@nade_marginals.register_fake
def _nade_marginals_fake(b, c, V, W, n, seed):
    return torch.empty_like(b)
