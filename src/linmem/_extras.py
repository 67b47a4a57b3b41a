"""The optional parts of the install: which extra brings which package, and one line that says
which to install when a feature needs one that is missing.

``pip install linear-memory-networks`` brings what the layers, the autoencoder, the data and
``linmem train/evaluate`` need; the searches (Optuna, the PostgreSQL driver), MIDI and the figures
are extras (``pyproject.toml``'s ``[search]``, ``[midi]``, ``[plot]``, all three in ``[all]``).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

__all__ = ["EXTRAS", "MissingExtra", "extra_message", "missing_extra", "require"]

# the top-level module a feature imports -> the extra that installs it
EXTRAS = {
    "optuna": "search", "sqlalchemy": "search", "alembic": "search", "psycopg2": "search",
    "pretty_midi": "midi", "mido": "midi",
    "matplotlib": "plot",
}


class MissingExtra(ModuleNotFoundError):
    """A package of an extra is not installed; the message names the extra to install."""


def extra_message(module: str, what: str) -> str:
    """One line: ``what`` needs ``module``, and the extra that installs it."""
    extra = EXTRAS[module]
    return (f"{what} needs {module}, which is not installed: pip install "
            f"'linear-memory-networks[{extra}]'")


def require(module: str, what: str) -> ModuleType:
    """``import module`` (a key of :data:`EXTRAS`), or a :class:`MissingExtra` saying that
    ``what`` needs it and which extra installs it. Another package missing under it is
    raised as it is."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise
        raise MissingExtra(extra_message(module, what), name=module) from None


def missing_extra(module: str, what: str) -> MissingExtra | None:
    """The :class:`MissingExtra` ``require`` would raise, without importing ``module`` (a check
    made before any work starts), or None when it is installed."""
    if importlib.util.find_spec(module) is None:
        return MissingExtra(extra_message(module, what), name=module)
    return None
