"""RNN-RBM (Boulanger-Lewandowski, Bengio & Vincent, ICML 2012): a conditional RBM per time step
whose biases an RNN drives, the paper's strongest comparison model (its Table 2 quotes it).

With ``v_t`` the frame at step t and ``u`` the RNN state (a ``torch.nn.RNN`` with tanh, as
:class:`linmem.nn.rnns.RNN`: its explicit backward through time on the CPU)::

    u_t   = tanh(b_u + W_uu u_{t-1} + W_vu v_t)
    b_v^t = b_v + W_uv u_{t-1},    b_h^t = b_h + W_uh u_{t-1}
    P(v_t | v_<t) = sum_h exp(-E_t(v_t, h)) / Z_t,   E_t(v, h) = -b_v^t.v - b_h^t.h - v^T W h

``u`` depends on the data only, so the biases of every step come from one RNN pass and the RBMs of
all steps are sampled in parallel. Training is contrastive divergence (CD-k): the cost
``F_t(v_t) - F_t(v*_t)``, with ``F`` the free energy and ``v*`` the end of a k-step Gibbs chain
started at ``v_t`` (held constant), has the CD gradient for ``W`` and the biases, and
back-propagates through ``b_v^t, b_h^t`` into the RNN (the original paper's recipe).

Prediction (``forward``): the marginal ``P(v_t,i = 1 | v_<t)`` of each key, estimated by Gibbs
sampling (the mean of ``P(v | h)`` over the chain, after a burn-in) or by mean-field iterations,
returned as logits so that every metric is the one of the other models; each sequence's chains
are seeded by the model's seed and its frames (:func:`sequence_keys`), so that its prediction does
not depend on the batch it is scored in. Its log-likelihood needs
``log Z_t`` per step: :meth:`RNNRBM.log_likelihood` estimates it by annealed importance sampling
(Salakhutdinov & Murray 2008) and returns the estimate with its standard error.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linmem.batching import Batch, iterate_batches
from linmem.data import N_KEYS
from linmem.nn.rnns import RNN

__all__ = [
    "PREDICTIONS",
    "RNNRBM",
    "ais_log_partition",
    "estimate_nll",
    "frame_log_likelihood",
    "free_energy",
    "gibbs_chain",
    "init_from_rnn",
    "pretrain_rbm",
    "sequence_keys",
]

PREDICTIONS = ("gibbs", "mean-field")  # how RNNRBM.forward estimates the key marginals


def _bernoulli(p: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """0/1 draws with probabilities ``p`` (``rand < p``, written over the uniform draws: 2.5x
    faster than ``torch.bernoulli`` on the CPU)."""
    noise = torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device)
    return torch.lt(noise, p, out=noise)


def _conditional(bias: Tensor, x: Tensor, w: Tensor, beta: float = 1.0) -> Tensor:
    """``sigmoid(bias + beta * (x @ w))`` (no gradient), in the buffer of the product: the
    same numbers as written out, without a new tensor per operation."""
    z = x @ w
    if beta != 1.0:
        z.mul_(beta)
    if torch.broadcast_shapes(z.shape, bias.shape) != z.shape:
        return torch.sigmoid(z + bias)
    return z.add_(bias).sigmoid_()


def sequence_keys(inputs: Tensor, seed: int) -> list[int]:
    """One seed per sequence of a batch ``inputs (B, T, K)``, from ``seed`` and the sequence's
    frames up to its last sounding one: the same whatever the batch pads it to or holds beside
    it (trailing silence and padding look alike, and are left out alike)."""
    keys = []
    for row in (inputs > 0.5).cpu():
        sounding = row.any(1).nonzero()
        frames = row[: int(sounding[-1]) + 1] if len(sounding) else row[:0]
        digest = hashlib.blake2b(frames.numpy().tobytes() + f"{seed}:{row.shape[1]}".encode(),
                                 digest_size=8).digest()
        keys.append(int.from_bytes(digest, "little") >> 1)
    return keys


def _row_bernoulli(p: Tensor, keys: Sequence[int], draw: int) -> Tensor:
    """0/1 draws with probabilities ``p (B, T, D)``, row ``b`` from a generator seeded by
    ``keys[b]`` and the draw's number, filled step by step: a sequence's draws at its steps do
    not depend on the padding after them nor on the other rows."""
    noise = torch.empty(p.shape, dtype=p.dtype, device=p.device)
    for row, key in zip(noise, keys, strict=True):
        torch.rand(row.shape, generator=torch.Generator(device=p.device).manual_seed(
            (key + 1_000_003 * draw) % 2 ** 63), dtype=p.dtype, device=p.device, out=row)
    return torch.lt(noise, p, out=noise)


def free_energy(v: Tensor, w: Tensor, b_v: Tensor, b_h: Tensor) -> Tensor:
    """``F(v) = -b_v.v - sum_j softplus(b_h,j + (v W)_j)`` over the last dimension of ``v``
    (``-log sum_h exp(-E(v, h))``)."""
    return -(v * b_v).sum(-1) - F.softplus(b_h + v @ w).sum(-1)


def gibbs_chain(v: Tensor, w: Tensor, b_v: Tensor, b_h: Tensor, k: int,
                generator: torch.Generator | None = None, beta: float = 1.0) -> Tensor:
    """``k`` steps of block Gibbs sampling ``h ~ P(h | v)``, ``v ~ P(v | h)`` from ``v`` (no
    gradient); ``beta`` scales ``W`` (the annealed RBMs of AIS)."""
    with torch.no_grad():
        for _ in range(k):
            h = _bernoulli(_conditional(b_h, v, w, beta), generator=generator)
            v = _bernoulli(_conditional(b_v, h, w.T, beta), generator=generator)
    return v


def frame_log_likelihood(w: Tensor, b_v: Tensor, b_h: Tensor, v: Tensor, chains: int = 100,
                         betas: int = 1000, generator: torch.Generator | None = None
                         ) -> tuple[Tensor, Tensor]:
    """``log P(v[i])`` under the RBMs ``(W, b_v[i], b_h[i])``, ``-F(v) - log Z`` with AIS for
    ``log Z``, and the standard error of each (that of its ``log Z``)."""
    with torch.no_grad():
        log_z, se = ais_log_partition(w, b_v, b_h, chains, betas, generator)
        return -free_energy(v, w, b_v, b_h) - log_z, se


def ais_log_partition(w: Tensor, b_v: Tensor, b_h: Tensor, chains: int = 100,
                      betas: int = 1000, generator: torch.Generator | None = None
                      ) -> tuple[Tensor, Tensor]:
    """Annealed importance sampling estimate of ``log Z`` of the RBMs ``(W, b_v[i], b_h[i])``.

    The path goes from the RBM with ``W = 0`` (``log Z_0 = sum softplus(b_v) + sum
    softplus(b_h)``, sampled exactly) to ``W`` through ``beta W`` for ``betas`` equally spaced
    ``beta``, one Gibbs step per ``beta``. Returns ``(log Z, standard error of log Z)`` per RBM
    (the delta-method error of the log of the mean importance weight over ``chains`` chains).
    """
    with torch.no_grad():
        b_v, b_h = b_v.reshape(-1, 1, b_v.shape[-1]), b_h.reshape(-1, 1, b_h.shape[-1])
        n = b_v.shape[0]
        log_z0 = F.softplus(b_v).sum(-1) + F.softplus(b_h).sum(-1)  # (n, 1)
        v = _bernoulli(torch.sigmoid(b_v).expand(n, chains, -1).contiguous(),
                            generator=generator)
        log_w = torch.zeros(n, chains, dtype=w.dtype, device=w.device)
        grid = torch.linspace(0.0, 1.0, betas + 1, dtype=w.dtype).tolist()
        for prev, beta in itertools.pairwise(grid):
            vw = v @ w  # shared by the weight update and the Gibbs step at beta
            a = b_h + beta * vw
            log_w += F.softplus(a).sum(-1) - F.softplus(b_h + prev * vw).sum(-1)
            h = _bernoulli(torch.sigmoid(a), generator=generator)
            v = _bernoulli(_conditional(b_v, h, w.T, beta), generator=generator)
        m = log_w.max(-1, keepdim=True).values
        weights = torch.exp(log_w - m)
        log_mean = m.squeeze(-1) + torch.log(weights.mean(-1))
        se = weights.std(-1) / (weights.mean(-1) * math.sqrt(chains))
        return log_z0.squeeze(-1) + log_mean, se


class RNNRBM(nn.Module):
    """RNN-RBM next-step model over ``n_visible`` binary keys.

    Args:
        n_recurrent: units of the RNN state ``u``.
        n_hidden: hidden units of each step's RBM.
        cd_k: Gibbs steps of contrastive divergence in training.
        predict: ``"gibbs"`` or ``"mean-field"``: how ``forward`` estimates the key marginals.
        predict_steps: Gibbs steps (or mean-field iterations) per prediction; a Gibbs chain
            averages ``P(v | h)`` over its last ``predict_steps - burn_in`` steps.
        burn_in: Gibbs steps discarded before averaging.
        seed: seed of the prediction's Gibbs chains (each sequence's from this seed and its
            frames, :func:`sequence_keys`, so that a prediction does not depend on the batch
            the sequence is scored in) and of the test NLL's frame sample.
        ais_chains, ais_betas, ais_frames: the test NLL of :meth:`finalize_metrics`
            (:func:`estimate_nll`).

    Shape: ``forward(inputs)``: inputs ``(B, T, n_visible)`` (frames 0..T-1), returns logits
    ``(B, T, n_visible)`` of the frames 1..T.
    """

    def __init__(self, n_visible: int = N_KEYS, n_recurrent: int = 100, n_hidden: int = 150,
                 cd_k: int = 15, predict: str = "gibbs", predict_steps: int = 100,
                 burn_in: int = 20, seed: int = 0, ais_chains: int = 100, ais_betas: int = 1000,
                 ais_frames: int | None = 500):
        super().__init__()
        if predict not in PREDICTIONS:
            raise ValueError(f"predict must be 'gibbs' or 'mean-field', got {predict!r}")
        if min(n_visible, n_recurrent, n_hidden, cd_k, predict_steps) < 1:
            raise ValueError("sizes, cd_k and predict_steps must be positive")
        if predict == "gibbs" and not 0 <= burn_in < predict_steps:
            raise ValueError("burn_in must be in [0, predict_steps)")
        self.cd_k, self.predict, self.predict_steps, self.burn_in = cd_k, predict, predict_steps, \
            burn_in
        self.seed = seed
        self.ais_chains, self.ais_betas, self.ais_frames = ais_chains, ais_betas, ais_frames
        self.W = nn.Parameter(0.01 * torch.randn(n_visible, n_hidden))
        self.b_v = nn.Parameter(torch.zeros(n_visible))
        self.b_h = nn.Parameter(torch.zeros(n_hidden))
        self.rnn = RNN(n_visible, n_recurrent, batch_first=True)  # u_t (W_vu, W_uu, b_u)
        self.W_uv = nn.Linear(n_recurrent, n_visible, bias=False)
        self.W_uh = nn.Linear(n_recurrent, n_hidden, bias=False)
        self.u0 = nn.Parameter(torch.zeros(n_recurrent))
        for lin in (self.W_uv, self.W_uh):
            nn.init.normal_(lin.weight, std=0.01)

    @property
    def n_visible(self) -> int:
        return self.W.shape[0]

    def step_biases(self, inputs: Tensor, state: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
        """``(b_v^t, b_h^t)`` of the RBMs of frames 1..T, from ``u`` after frames 0..t-1 (the
        RNN started at ``state``, or at ``u_0``)."""
        return self._biases(inputs, state)[:2]

    def _biases(self, inputs: Tensor, state: Tensor | None = None
                ) -> tuple[Tensor, Tensor, Tensor]:
        if inputs.dim() != 3 or inputs.shape[-1] != self.n_visible:
            raise ValueError(f"inputs must be (batch, time, {self.n_visible}), "
                             f"got {tuple(inputs.shape)}")
        h0 = (torch.tanh(self.u0).expand(1, inputs.shape[0], -1).contiguous()
              if state is None else state)
        u, last = self.rnn(inputs, h0)  # u_t after frame t: conditions frame t + 1
        return self.b_v + self.W_uv(u), self.b_h + self.W_uh(u), last

    def cd_cost(self, inputs: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        """Training cost: mean over valid frames of ``F_t(v_t) - F_t(v*_t)`` (CD-k)."""
        return self._cd_cost(*self.step_biases(inputs), targets, mask)

    def _cd_cost(self, b_v: Tensor, b_h: Tensor, targets: Tensor, mask: Tensor) -> Tensor:
        negative = gibbs_chain(targets, self.W, b_v.detach(), b_h.detach(), self.cd_k)
        cost = (free_energy(targets, self.W, b_v, b_h) - free_energy(negative, self.W, b_v, b_h))
        return (cost * mask).sum() / mask.sum()

    # the trainer's protocol (linmem.models.NextStepPredictor): the training cost is the CD
    # cost, and the Bernoulli NLL of the estimated key marginals is not the model's likelihood
    train_loss_name = "train_cd_cost"
    valid_nll_name = "valid_nll_marginals"

    def training_loss(self, batch: Batch) -> Tensor:
        """The CD-k cost of the batch (:meth:`cd_cost`)."""
        return self.cd_cost(batch.inputs, batch.targets, batch.mask)

    def chunk_loss(self, batch: Batch, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Truncated backpropagation through time (``--chunk``; the original code trained on
        chunks of 100 steps): the CD-k cost of one window, the RNN continued from ``state``;
        ``(cost, state)``, the state detached."""
        b_v, b_h, last = self._biases(batch.inputs, state)
        return self._cd_cost(b_v, b_h, batch.targets, batch.mask), last.detach()

    def finalize_metrics(self, metrics: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
        """The test NLL by AIS (:func:`estimate_nll`) in place of the marginals' Bernoulli NLL,
        which is kept as ``*_nll_marginals``; accuracy stays that of the estimated marginals."""
        ais = estimate_nll(self, data["test"], self.ais_chains, self.ais_betas, self.ais_frames,
                           seed=self.seed)
        metrics = dict(metrics)
        metrics.update({
            "valid_nll_marginals": metrics.pop("valid_nll"),
            "test_nll_marginals": metrics["test_nll"], "test_nll": ais["nll"],
            "test_nll_se": ais["se"], "test_nll_frame_sd": ais["frame_sd"],
            "test_nll_method": f"AIS estimate of each step's log Z ({ais['chains']} chains, "
                               f"{ais['betas']} temperatures) on {ais['frames']} of "
                               f"{ais['total_frames']} test frames drawn at random (seed "
                               f"{ais['seed']}); se: AIS error, frame_sd: frame sampling error; "
                               "test_nll_marginals: Bernoulli NLL of the estimated marginals",
            "key_marginals": f"{self.predict} ({self.predict_steps} steps)"})
        return metrics

    def init_output_bias(self, key_rates: Tensor, eps: float = 1e-3) -> None:
        """``b_v`` at the logit of the keys' rates in the training split."""
        with torch.no_grad():
            p = key_rates.to(self.b_v).clamp(eps, 1 - eps)
            self.b_v.copy_(torch.log(p) - torch.log1p(-p))

    def marginals(self, inputs: Tensor) -> Tensor:
        """Estimated ``P(v_t,i = 1 | v_<t)`` for frames 1..T (see the class docstring)."""
        with torch.no_grad():
            b_v, b_h = self.step_biases(inputs)
            if self.predict == "mean-field":
                p = torch.sigmoid(b_v)
                for _ in range(self.predict_steps):
                    p = torch.sigmoid(b_v + torch.sigmoid(b_h + p @ self.W) @ self.W.T)
                return p
            keys = sequence_keys(inputs, self.seed)  # each sequence's chains its own
            v = _row_bernoulli(torch.sigmoid(b_v), keys, 0)
            total = torch.zeros_like(b_v)
            for step in range(self.predict_steps):
                h = _row_bernoulli(_conditional(b_h, v, self.W), keys, 2 * step + 1)
                p = _conditional(b_v, h, self.W.T)
                if step >= self.burn_in:
                    total += p
                v = _row_bernoulli(p, keys, 2 * step + 2)
            return total / (self.predict_steps - self.burn_in)

    @torch.no_grad()
    def sample_next(self, inputs: Tensor, mask: Tensor, n: int,
                    generator: torch.Generator | None = None) -> Tensor:
        """``n`` draws of the next frame at every valid step (``mask (B, T)``) from its RBM:
        independent Gibbs chains of ``predict_steps`` steps, each started at
        ``v ~ sigmoid(b_v)``. ``(n, valid steps, n_visible)`` 0/1."""
        b_v, b_h = self.step_biases(inputs)
        b_v, b_h = b_v[mask], b_h[mask]
        out = torch.empty((n, *b_v.shape), dtype=b_v.dtype, device=b_v.device)
        for s in range(n):  # one chain per sample at a time: memory of one (N, n_visible)
            v = _bernoulli(torch.sigmoid(b_v), generator=generator)
            out[s] = gibbs_chain(v, self.W, b_v, b_h, self.predict_steps, generator)
        return out

    def forward(self, inputs: Tensor) -> Tensor:
        """Logits of the estimated key marginals of frames 1..T (see :meth:`marginals`)."""
        p = self.marginals(inputs).clamp(1e-6, 1 - 1e-6)
        return torch.log(p) - torch.log1p(-p)

    def log_likelihood(self, inputs: Tensor, targets: Tensor, mask: Tensor, chains: int = 100,
                       betas: int = 1000, generator: torch.Generator | None = None
                       ) -> tuple[Tensor, Tensor]:
        """``log P(v_t | v_<t)`` of every valid frame (AIS estimate of ``log Z_t``) and its
        standard error, as two 1-D tensors over the valid frames."""
        with torch.no_grad():
            b_v, b_h = self.step_biases(inputs)
            valid = mask.bool()
            return frame_log_likelihood(self.W, b_v[valid], b_h[valid], targets[valid], chains,
                                        betas, generator)

    @torch.no_grad()
    def generation_step(self, frames: Tensor, state: Tensor | None = None,
                        temperature: float = 1.0, generator: torch.Generator | None = None,
                        gibbs_steps: int = 100) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor]]:
        """Consume ``frames`` ``(B, T, n_visible)`` from the RNN state ``state`` (``None``: the
        start, ``u_0``) and draw the next frame from its RBM by a ``gibbs_steps`` chain, with
        energies divided by ``temperature``: ``(frame (B, n_visible), state, (b_v, b_h))``."""
        h0 = (torch.tanh(self.u0).expand(1, frames.shape[0], -1).contiguous()
              if state is None else state)
        u, state = self.rnn(frames.to(self.W), h0)
        b_v, b_h = self.b_v + self.W_uv(u[:, -1]), self.b_h + self.W_uh(u[:, -1])
        w, bv, bh = self.W / temperature, b_v / temperature, b_h / temperature
        v = _bernoulli(torch.sigmoid(bv), generator=generator)
        return gibbs_chain(v, w, bv, bh, gibbs_steps, generator), state, (b_v, b_h)

    def sample(self, prefix: Tensor, n_steps: int, gibbs_steps: int = 100,
               generator: torch.Generator | None = None) -> Tensor:
        """Continue ``prefix`` ``(T0, n_visible)`` (at least one frame) by ``n_steps`` frames,
        each drawn by a ``gibbs_steps`` chain of its RBM; returns ``(T0 + n_steps, n_visible)``
        (0/1, the prefix unchanged)."""
        if prefix.dim() != 2 or prefix.shape[-1] != self.n_visible or len(prefix) < 1:
            raise ValueError(f"prefix must be (T0 >= 1, {self.n_visible}), "
                             f"got {tuple(prefix.shape)}")
        frames = [f for f in prefix.to(self.W)]
        h0 = torch.tanh(self.u0).reshape(1, 1, -1)
        _out, u = self.rnn(prefix.to(self.W)[None], h0)
        for _ in range(n_steps):
            b_v = self.b_v + self.W_uv(u[0, 0])
            b_h = self.b_h + self.W_uh(u[0, 0])
            v = _bernoulli(torch.sigmoid(b_v), generator=generator)
            v = gibbs_chain(v, self.W, b_v, b_h, gibbs_steps, generator)
            frames.append(v)
            _, u = self.rnn(v[None, None], u)
        return torch.stack(frames)


def estimate_nll(model: RNNRBM, sequences, chains: int = 100, betas: int = 1000,
                 max_frames: int | None = 500, seed: int = 0, batch_size: int = 64,
                 chunk: int = 256) -> dict:
    """NLL per time step (nats) of next-step prediction over ``sequences``: the mean over valid
    frames of ``-log P(v_t | v_<t)`` with AIS for ``log Z_t``, on ``max_frames`` frames drawn at
    random (seeded; None: all). Returns ``nll``, its standard error ``se`` (AIS only; the frame
    sample adds its own spread, reported as ``frame_sd``), ``frames`` and ``total_frames``."""
    device, dtype = model.W.device, model.W.dtype
    b_vs, b_hs, vs = [], [], []
    with torch.no_grad():
        for batch in iterate_batches(sequences, batch_size, dtype=dtype):
            batch = batch.to(device)
            b_v, b_h = model.step_biases(batch.inputs)
            valid = batch.mask.bool()
            b_vs.append(b_v[valid])
            b_hs.append(b_h[valid])
            vs.append(batch.targets[valid])
    b_v, b_h, v = torch.cat(b_vs), torch.cat(b_hs), torch.cat(vs)
    total = len(v)
    gen = torch.Generator(device=device).manual_seed(seed)
    if max_frames is not None and max_frames < total:
        pick = torch.randperm(total, generator=torch.Generator().manual_seed(seed))[:max_frames]
        b_v, b_h, v = b_v[pick.to(device)], b_h[pick.to(device)], v[pick.to(device)]
    parts = [frame_log_likelihood(model.W, b_v[i:i + chunk], b_h[i:i + chunk], v[i:i + chunk],
                                  chains, betas, gen) for i in range(0, len(v), chunk)]
    ll = torch.cat([p[0] for p in parts]).double()
    se = torch.cat([p[1] for p in parts]).double()
    n = len(ll)
    return {"nll": float(-ll.mean()), "se": float(se.pow(2).sum().sqrt() / n),
            "frame_sd": float(ll.std() / math.sqrt(n)) if n > 1 else 0.0,
            "frames": n, "total_frames": total, "chains": chains, "betas": betas, "seed": seed}


# ------------------------------------------------------------------------------ pretraining
# Boulanger-Lewandowski et al. (2012) initialise the RNN-RBM from its parts: W, b_v, b_h from an
# RBM trained by CD on all frames (as if independent), and the RNN from a network trained for
# next-step prediction. Both are options (TrainConfig.rbm_pretrain_epochs, rnn_pretrain_epochs).


def pretrain_rbm(model: RNNRBM, sequences, epochs: int, batch_size: int = 100, lr: float = 1e-3,
                 seed: int = 0) -> list[float]:
    """Train ``W, b_v, b_h`` of ``model`` as one RBM on every frame of ``sequences`` by CD-k
    (``model.cd_k``), Adam, ``epochs`` passes in shuffled mini-batches; returns the mean CD cost
    per epoch."""

    frames = torch.from_numpy(np.concatenate([np.asarray(s) for s in sequences])).to(model.W)
    params = [model.W, model.b_v, model.b_h]
    optimizer = torch.optim.Adam(params, lr=lr)
    gen = torch.Generator().manual_seed(seed)
    costs = []
    for _ in range(epochs):
        order = torch.randperm(len(frames), generator=gen).to(frames.device)
        total = 0.0
        for i in range(0, len(frames), batch_size):
            v = frames[order[i:i + batch_size]]
            negative = gibbs_chain(v, model.W, model.b_v, model.b_h, model.cd_k)
            cost = (free_energy(v, model.W, model.b_v, model.b_h)
                    - free_energy(negative, model.W, model.b_v, model.b_h)).mean()
            optimizer.zero_grad()
            cost.backward()
            optimizer.step()
            total += cost.item() * len(v)
        costs.append(total / len(frames))
    return costs


def init_from_rnn(model: RNNRBM, rnn_predictor: nn.Module, set_visible_bias: bool) -> None:
    """Copy a trained ``rnn`` next-step predictor (:class:`linmem.models.NextStepPredictor`)
    into the RNN part: its recurrence becomes ``W_vu, W_uu, b_u`` (``u_0 = 0``), its readout
    ``W_uv`` (and ``b_v`` if ``set_visible_bias``), so that with ``W = 0`` the RBM of each step
    predicts the keys exactly as the RNN did."""
    core, readout = rnn_predictor.core, rnn_predictor.readout
    if not isinstance(core, nn.RNN) or core.num_layers != 1 or core.nonlinearity != "tanh":
        raise ValueError("init_from_rnn needs a one-layer tanh rnn predictor")
    with torch.no_grad():
        model.rnn.load_state_dict(core.state_dict())
        model.u0.zero_()
        model.W_uv.weight.copy_(readout.weight)
        if set_visible_bias:
            model.b_v.copy_(readout.bias)
