"""The readout's path from the current input frame: logits that also see ``x_t``.

A next-step model's logits are ``readout(state_t)``; with an input path they are::

    logits_t = readout(state_t) + g * x_t          (input_path="gain": a gain per key)
    logits_t = readout(state_t) + W x_t            (input_path="skip": a full linear map)

With the gain, the previous frame is one parameter a key away (a large ``g`` and a negative bias
copy ``x_t``), so a model that can copy the last frame need not lose to copying it; the skip
lets a key's frame also move the others'. Both start at zero: the model starts as the plain
readout.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["INPUT_PATHS", "InputPath", "check_input_path"]

INPUT_PATHS = ("none", "gain", "skip")


def check_input_path(kind: str) -> str:
    """``kind`` if it is one of :data:`INPUT_PATHS`, else one line why not."""
    if kind not in INPUT_PATHS:
        raise ValueError(f"input_path must be one of {list(INPUT_PATHS)}, got {kind!r}")
    return kind


class InputPath(nn.Module):
    """``g * x`` (``kind="gain"``, ``weight`` ``(K,)``) or ``x W^T`` (``"skip"``, ``weight``
    ``(K, K)``) for input frames ``x`` ``(..., K)``: the term the logits add; zero at the start.
    """

    def __init__(self, kind: str, size: int, device=None, dtype=None):
        super().__init__()
        if check_input_path(kind) == "none":
            raise ValueError("an InputPath is 'gain' or 'skip' ('none' is no module)")
        self.kind = kind
        shape = (size,) if kind == "gain" else (size, size)
        self.weight = nn.Parameter(torch.zeros(shape, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        return x * self.weight if self.kind == "gain" else nn.functional.linear(x, self.weight)

    def extra_repr(self) -> str:
        return f"{self.kind!r}, size={self.weight.shape[0]}"
