"""linmem: Linear Memory Networks (Bacciu, Carta & Sperduti) in PyTorch.

Public API: :class:`LMN` and :class:`LMNCell` (``torch.nn.RNN``-style layers),
:class:`LinearAutoencoder` (the linear autoencoder for sequences), the polyphonic music data sets
(:func:`load_polyphonic`), the frame-level metrics, the next-step models and the trainer.
"""

__version__ = "0.1.0"

from .data import DataError, load_polyphonic
from .la import LinearAutoencoder
from .metrics import frame_accuracy, frame_nll
from .models import MODELS, build_model
from .nn import LMN, LMNCell, UnrolledNet

__all__ = [
    "LMN",
    "MODELS",
    "DataError",
    "LMNCell",
    "LinearAutoencoder",
    "UnrolledNet",
    "__version__",
    "build_model",
    "frame_accuracy",
    "frame_nll",
    "load_polyphonic",
]
