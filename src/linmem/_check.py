"""Argument checks shared by the library's constructors and configurations."""

from __future__ import annotations

from typing import Any

__all__ = ["check_int"]


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
