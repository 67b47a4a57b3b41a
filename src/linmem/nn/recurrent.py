"""What the recurrent modules share (:mod:`linmem.nn.lmn`, :mod:`linmem.nn.ulm`,
:mod:`linmem.nn.rnns`): the parameters' precision kept under ``torch.autocast``, the input's dtype
checked against the parameters', torch.nn.RNN's initialisation, and the refusal of TorchScript
in one line."""

from __future__ import annotations

import functools
import math

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import PackedSequence

__all__ = ["autocast_enabled", "check_dtype", "in_parameter_precision", "init_uniform",
           "no_torchscript", "to_dtype"]


def check_dtype(t: Tensor, weight: Tensor, what: str = "input") -> None:
    """A tensor of the parameters' floating dtype, or one line saying how to get there."""
    if t.dtype != weight.dtype:
        how = (f"one of them ({what.split()[-1]}.to({weight.dtype}) or lmn.to({t.dtype}))"
               if t.is_floating_point() else
               f"it to a floating dtype ({what.split()[-1]}.to({weight.dtype}))")
        raise TypeError(f"{what} is {t.dtype}, the LMN's parameters are {weight.dtype}: "
                        f"convert {how}")


def autocast_enabled(device_type: str) -> bool:
    """Whether ``torch.autocast`` is on for ``device_type`` ("cpu", "cuda") here; never for a
    device autocast does not know (``meta``: shape inference, deferred initialisation)."""
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4: no device argument
        return (torch.is_autocast_enabled() if device_type == "cuda"
                else torch.is_autocast_cpu_enabled())
    except RuntimeError:  # "unknown device type for autocast"
        return False


def to_dtype(value, dtype: torch.dtype):
    """``value`` (a tensor, a packed sequence, a tuple of them or None) with its floating
    tensors in ``dtype``."""
    if value is None:
        return None
    if isinstance(value, PackedSequence):  # a tuple too: its data; sizes and indices stay
        return value.to(dtype)
    if isinstance(value, tuple | list):
        return type(value)(to_dtype(v, dtype) for v in value)
    return value.to(dtype) if value.is_floating_point() else value


def in_parameter_precision(forward):
    """Run a recurrent module's ``forward(input, state)`` under ``torch.autocast`` with autocast
    off and ``input`` and ``state`` cast to the parameters' dtype (their output is then in that
    dtype; the layers around them follow autocast). A recurrence compounds its rounding over
    thousands of steps, and the paper's linear memory is unbounded: it keeps the parameters'
    precision, as autocast's float32 operations do. Without autocast this changes nothing."""

    @functools.wraps(forward)
    def wrapped(self, input, state=None):
        data = input.data if isinstance(input, PackedSequence) else input
        if not isinstance(data, Tensor) or not autocast_enabled(data.device.type):
            return forward(self, input, state)
        dtype = next(self.parameters()).dtype
        with torch.autocast(data.device.type, enabled=False):
            return forward(self, to_dtype(input, dtype), to_dtype(state, dtype))

    return wrapped


def init_uniform(weight: Tensor, fan_in: int) -> None:
    """``weight`` drawn from U(-1/sqrt(fan_in), 1/sqrt(fan_in)), torch.nn.RNN's initialisation."""
    bound = 1.0 / math.sqrt(fan_in)
    nn.init.uniform_(weight, -bound, bound)


def no_torchscript(self: nn.Module) -> nn.Module:
    """``torch.jit.script``'s hook (``__prepare_scriptable__``): one line that says what to use,
    where TorchScript would fail deep in its compiler on the Python this module runs."""
    raise RuntimeError(
        f"{type(self).__name__} does not support TorchScript (torch.jit.script, deprecated by "
        "PyTorch): use torch.compile, torch.export.export or torch.onnx.export, which see its "
        "recurrence as one registered operator")
