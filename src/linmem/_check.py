"""Argument checks shared by the library's constructors and configurations."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["check_device", "check_int", "device_form"]


def check_int(name: str, value: Any, minimum: int = 1, none_ok: bool = False) -> Any:
    """``value`` if it is an integer ``>= minimum`` (or ``None`` with ``none_ok``), else a
    ``ValueError`` naming ``name``: "hidden must be a positive integer, got 0"."""
    if value is None and none_ok:
        return value
    try:
        ok = not isinstance(value, bool) and int(value) == value and value >= minimum
    except (TypeError, ValueError, OverflowError):
        ok = False
    if not ok:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"{name} must be {what}{' or None' if none_ok else ''}, got {value!r}")
    return value


def device_form(device: str | torch.device) -> torch.device:
    """``device`` parsed: ``cpu``, ``cuda`` or ``cuda:N``, else a ``ValueError`` ("device must be
    cpu, cuda or cuda:N, got 'tpu'"). Says nothing of whether this machine has it (a config may
    be written here for another machine: :func:`check_device` says that)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    if parsed is None or parsed.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be cpu, cuda or cuda:N, got {str(device)!r}")
    return torch.device("cpu") if parsed.type == "cpu" else parsed


def check_device(device: str | torch.device) -> torch.device:
    """``device`` (:func:`device_form`) if this machine has it, else a one-line ``ValueError``
    before anything is built or loaded: CUDA not available, or no GPU of that number."""
    parsed = device_form(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device {str(device)!r} was asked for, but CUDA is not available "
                             "here")
        count = torch.cuda.device_count()
        if parsed.index is not None and parsed.index >= count:
            raise ValueError(f"device {str(device)!r} was asked for, but this machine has "
                             f"{count} CUDA device{'s' if count != 1 else ''} "
                             f"(cuda:0{f' to cuda:{count - 1}' if count > 1 else ''})")
    return parsed
