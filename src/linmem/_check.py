"""Argument checks shared by the library's constructors and configurations."""

from __future__ import annotations

import math
import numbers
from dataclasses import field, fields
from typing import Any

import torch

__all__ = ["check_device", "check_fields", "check_int", "device_form", "option"]


def check_int(name: str, value: Any, minimum: int = 1, none_ok: bool = False) -> Any:
    """``value`` if it is an integer ``>= minimum`` (or ``None`` with ``none_ok``), else a
    ``ValueError`` naming ``name``: "hidden must be a positive integer, got 0". A float is no
    integer, whole or not (``torch.nn.RNN`` refuses it too; a size of 7.0 would fail later,
    in ``torch.empty``, with a message that names no argument)."""
    if value is None and none_ok:
        return value
    ok = (isinstance(value, numbers.Integral) and not isinstance(value, bool)
          and value >= minimum)
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


def option(default: Any, help: str, *, kind: type | None = None, choices: tuple | None = None,
           minimum: float | None = None, above: float | None = None, below: float | None = None,
           none_ok: bool = False, folder: bool = False) -> Any:
    """A configuration field declared once: its default, its ``--help`` text and its valid values.
    :func:`check_fields` checks a value against them; the command line builds its option from
    them (``linmem.cli.common.config_options``).

    ``kind`` defaults to the default's type; ``minimum`` is inclusive (integers: default 1),
    ``above`` and ``below`` are exclusive bounds; ``None`` is valid where the default is ``None``
    or ``none_ok``; ``folder`` marks a path to a folder."""
    kind = kind or type(default)
    return field(default=default, metadata={
        "help": help, "kind": kind, "choices": choices, "minimum": minimum, "above": above,
        "below": below, "none_ok": none_ok or default is None, "folder": folder})


def check_fields(obj: Any) -> None:
    """Check each field of dataclass ``obj`` declared by :func:`option` against its declaration;
    a ``ValueError`` naming the first field that is wrong ("dropout must be in [0, 1), got 2")."""
    for f in fields(obj):
        meta = f.metadata
        if "help" not in meta:
            continue
        value = getattr(obj, f.name)
        if value is None and meta["none_ok"]:
            continue
        _check_value(f.name, value, meta)


def _check_value(name: str, value: Any, meta: Any) -> None:
    kind, choices, minimum, above, below = (meta[k] for k in ("kind", "choices", "minimum",
                                                              "above", "below"))
    or_none = " or None" if meta["none_ok"] else ""
    if choices is not None:
        if value not in choices:
            raise ValueError(f"{name} must be one of {list(choices)}{or_none}, got {value!r}")
    elif kind is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be True or False, got {value!r}")
    elif kind is int:
        if below is None:
            check_int(name, value, minimum=1 if minimum is None else int(minimum),
                      none_ok=meta["none_ok"])
        elif (isinstance(value, bool) or not isinstance(value, (int, float))
              or int(value) != value or not (minimum or 0) <= value < below):
            raise ValueError(f"{name} must be an integer in [{minimum or 0}, {below}){or_none}, "
                             f"got {value!r}")
    elif kind is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = ok and math.isfinite(value) and (minimum is None or value >= minimum)
        ok = ok and (above is None or value > above) and (below is None or value < below)
        if not ok:
            if below is not None:
                what = f"in [{minimum:g}, {below:g})"
            elif above is not None:
                what = f"> {above:g}"
            else:
                what = f">= {minimum:g}" if minimum is not None else "a finite number"
            raise ValueError(f"{name} must be {what}{or_none}, got {value!r}")
    elif not isinstance(value, kind):
        raise ValueError(f"{name} must be a {kind.__name__}{or_none}, got {value!r}")
