"""linmem: Linear Memory Networks (Bacciu, Carta & Sperduti) in PyTorch.

Public API: :class:`LMN` and :class:`LMNCell` (``torch.nn.RNN``-style layers),
:class:`LinearAutoencoder` (the linear autoencoder for sequences), the polyphonic music data sets
(:func:`load_polyphonic`; :class:`PolyphonicMusic` for a ``DataLoader``), the frame-level
metrics, the next-step models and what defines a training run (:class:`TrainConfig`;
:func:`train` trains one, pretraining first where the model asks for it).

The names are imported on first use (PEP 562), so that ``import linmem`` and ``linmem --help``
do not load torch.
"""

from __future__ import annotations

import importlib
from importlib import metadata
from typing import Any

try:
    __version__ = metadata.version("linear-memory-networks")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

_EXPORTS = {
    "DataError": "data", "PolyphonicMusic": "data", "load_polyphonic": "data",
    "LinearAutoencoder": "la",
    "frame_accuracy": "metrics", "frame_nll": "metrics",
    "MODELS": "models", "build_model": "models",
    "TrainConfig": "training.config", "train": "training.recipes",
    "LMN": "nn.lmn", "LMNCell": "nn.lmn", "UnrolledNet": "nn.ulm",
}

__all__ = sorted([*_EXPORTS, "__version__"])


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'linmem' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
