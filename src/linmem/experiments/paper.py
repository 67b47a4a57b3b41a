"""The paper's Table 2 as published: the figures our tables are set beside, the data sets and
models in its order, and the activation of the models it trained."""

from __future__ import annotations

from linmem.data import DATASETS

__all__ = ["PAPER_ACTIVATION", "PAPER_TABLE2", "TABLE2_DATASETS", "TABLE2_MODELS",
           "TABLE2_TITLES"]

# Table 2 of the paper: test frame accuracy (%); RNN-RBM quoted there from Boulanger-Lewandowski
# et al. (2012). Columns: jsb, musedata, nottingham, piano.
PAPER_TABLE2: dict[str, tuple[float, float, float, float]] = {
    "rnn": (31.00, 35.02, 72.29, 26.52),
    "pret-rnn": (30.55, 35.47, 71.70, 27.31),
    "lstm": (32.64, 34.40, 72.45, 25.08),
    "rnn-rbm": (33.12, 34.02, 75.40, 28.92),
    "lmn-a": (30.61, 33.15, 71.16, 26.69),
    "lmn-b": (33.98, 35.56, 72.71, 28.00),
    "pret-lmn-b": (34.49, 35.66, 74.16, 28.79),
}
# the paper's activation for the models it trained ("Other models, including the final LMN,
# use a tanh activation function"; SELU in the pretraining's unrolled network alone)
PAPER_ACTIVATION = "tanh"
TABLE2_DATASETS = ("jsb", "musedata", "nottingham", "piano")
TABLE2_TITLES = {name: info.title for name, info in DATASETS.items()}
TABLE2_MODELS = ("rnn", "pret-rnn", "lstm", "gru", "rnn-rbm", "lmn-a", "lmn-b", "pret-lmn-b")
