"""The options a model is built from, each declared once with its default, ``--help`` text and
valid values (:func:`linmem._check.option`): the sizes every model has (:class:`ModelOptions`)
and the fields some models add (:attr:`linmem.registry.ModelSpec.options`). A training's
configuration (:class:`linmem.training.config.TrainConfig`) is made of them; ``linmem train``'s
options are built from them."""

from __future__ import annotations

from dataclasses import dataclass

from linmem._check import option
from linmem.nn.readout import INPUT_PATHS
from linmem.nn.rnnrbm import PREDICTIONS
from linmem.ops.bound import DEFAULT_MEMORY_BOUND
from linmem.ops.toolkit import NONLINEARITIES

__all__ = ["ModelOptions", "NADEOptions", "PretrainOptions", "RBMOptions", "TransferOptions"]


@dataclass
class ModelOptions:
    """What every model is built from (:attr:`ModelSpec.options` names a subclass that adds a
    model's own options). Each field is declared once (:func:`linmem._check.option`): its
    default, its ``--help`` and its valid values, from which ``linmem train`` makes its option;
    :class:`linmem.TrainConfig` holds them all, flat, as its ``config.json`` does."""

    hidden: int = option(100, "Hidden units (LMN: functional units).")
    memory: int | None = option(100, "LMN memory units (ignored by rnn, lstm, gru).",
                                none_ok=True)
    num_layers: int = option(1, "Stacked recurrent layers.")
    dropout: float = option(0.0, "Dropout on the recurrent output before the readout.",
                            minimum=0.0, below=1.0)
    nonlinearity: str | None = option(
        None, "Recurrent activation [default: selu for ulm and pret-lmn-*, else tanh].",
        kind=str, choices=NONLINEARITIES)
    seed: int = option(0, "Seed of the initial weights, the batches' order and the sampling.",
                       minimum=0)
    # linmem.ops.bound: None is the paper's unconstrained W^mm, which Adam at batch 1 takes past
    # spectral radius 1 and long sequences then overflow
    memory_bound: float | None = option(
        DEFAULT_MEMORY_BOUND,
        "LMN: hold the spectral norm of W^mm to at most R by a reparametrization (below 1 a tanh "
        "LMN's memory cannot overflow; 'none': the paper's unconstrained memory).",
        kind=float, above=0.0, none_ok=True)
    # linmem.ops.loop_bound: relu and selu are not bounded, so W^mm's bound alone leaves the
    # loop m -> W^hm sigma(W^mh m) free to grow the memory
    loop_bound: bool | None = option(
        None, "LMN: hold the memory loop's gain ||W^mm|| + L ||W^hm|| ||W^mh|| (L the "
              "activation's Lipschitz constant) to the --memory-bound R instead, so that a relu "
              "or selu LMN's memory cannot overflow either [default: on for relu and selu under "
              "a bound, off for tanh].", kind=bool)
    # linmem.nn.readout: the logits also from the current frame x_t (zero at the start)
    input_path: str = option(
        "none", "Readout: the logits also from the current input frame, 'gain' a per-key gain "
                "times x_t (the previous-frame path), 'skip' a full linear map of x_t (not the "
                "*-nade and rnn-rbm readouts).", choices=INPUT_PATHS)


@dataclass
class PretrainOptions(ModelOptions):
    """ulm, pret-rnn, ``pret-lmn-*``: the unrolled network and the autoencoder of the pretraining
    (:mod:`linmem.pretrain`)."""

    k: int = option(10, "Pretraining: past blocks of the unrolled network (ulm, pret-lmn-*).")
    la_window: int | None = option(
        None, "Pretraining: the linear autoencoder's window [default: k + 1 for pret-lmn-*, full "
              "length for pret-rnn; 0: full length].", kind=int, minimum=0)


@dataclass
class TransferOptions(PretrainOptions):
    """``pret-lmn-*``: the unrolled network trained first and its transfer to the LMN
    (eqs. 12-15)."""

    pretrain_epochs: int | None = option(
        None, "pret-lmn-*: epoch bound of the unrolled network [default: --epochs].", kind=int)
    # None: the LMN's (the transfer is then exact); "selu" with nonlinearity "tanh" is the
    # paper's text (SELU for the unrolled model only): the same weights, an approximate transfer
    ulm_nonlinearity: str | None = option(
        None, "pret-lmn-*: the unrolled network's activation [default: the LMN's, an exact "
              "transfer]; selu with --nonlinearity tanh is the paper's text.",
        kind=str, choices=NONLINEARITIES)
    # a grid's memory sizes share one unrolled network (linmem.training.recipes.ulm_key)
    ulm_cache: str | None = option(
        None, "pret-lmn-*: a folder of unrolled networks shared between runs (those of one "
              "grid's memory sizes are the same: trained once) [default: each run trains its own "
              "in RUN_DIR/ulm; linmem search: OUT/ulm-cache].", kind=str, folder=True)


@dataclass
class RBMOptions(ModelOptions):
    """rnn-rbm (:mod:`linmem.nn.rnnrbm`): ``hidden`` is the RNN's units."""

    rbm_hidden: int = option(150, "rnn-rbm: hidden units of each step's RBM (--hidden: the "
                                  "RNN's units).")
    cd_k: int = option(15, "rnn-rbm: Gibbs steps of contrastive divergence.")
    rbm_predict: str = option("gibbs", "rnn-rbm: how the key marginals (accuracy) are "
                                       "estimated.", choices=PREDICTIONS)
    ais_chains: int = option(100, "rnn-rbm: AIS chains per frame (test NLL).")
    ais_betas: int = option(1000, "rnn-rbm: AIS temperatures (test NLL).")
    ais_frames: int | None = option(500, "rnn-rbm: test frames drawn for the AIS NLL.",
                                    none_ok=True)  # None: every test frame
    rbm_pretrain_epochs: int = option(0, "rnn-rbm: first train W, b_v, b_h as one RBM on all "
                                         "frames (CD epochs).", minimum=0)
    rnn_pretrain_epochs: int = option(0, "rnn-rbm: first train a tanh RNN next-step predictor "
                                         "(epoch bound) and copy it into the RNN part.",
                                      minimum=0)


@dataclass
class NADEOptions(ModelOptions):
    """CORE-nade (:mod:`linmem.nn.nade`): the NADE over the keys."""

    nade_hidden: int = option(150, "*-nade: hidden units of the NADE over the keys.")
    nade_samples: int = option(100, "*-nade: frames drawn per step for the key marginals and "
                                    "the expected accuracy.")
