"""The score a run chooses its checkpoint on and a search its point on: one rule for both.

``select`` (a :class:`~linmem.training.config.TrainConfig` field, set by the protocol) names
it: the validation accuracy, global (``"acc"``, Bay et al.'s) or the per-frame mean
(``"acc_frame"``, the paper's), or the NLL (``"nll"``). The score is maximised, so the NLL's is
negated. A run's epochs are scored on what :func:`~linmem.training.evaluation.evaluate` returns
(``nll``, ``acc``, ``acc_frame``), a search's trials on the ``valid_*`` fields of a log row or
of ``metrics.json``: the rule is the same, only the names' prefix differs.
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["SELECTIONS", "selection_score", "selection_scores"]

# the global accuracy (Bay et al.), the per-frame mean accuracy (the metric of the paper's code),
# or the NLL (a likelihood goal; for a joint readout it also spares sampling the marginals at
# every epoch)
SELECTIONS = ("acc", "acc_frame", "nll")


def selection_score(scores: Mapping[str, float], select: str, prefix: str = "") -> float:
    """The score (maximised) that ``select`` chooses on, from ``scores``' ``prefix + name``."""
    if select not in SELECTIONS:
        raise ValueError(f"select must be one of {', '.join(SELECTIONS)}, got {select!r}")
    return -scores[f"{prefix}nll"] if select == "nll" else scores[f"{prefix}{select}"]


def selection_scores(value: float, select: str, prefix: str = "valid_") -> dict[str, float]:
    """The scores whose :func:`selection_score` is ``value`` (its inverse: a search's stored
    objective back as the validation score it came from)."""
    return {f"{prefix}nll": -value} if select == "nll" else {f"{prefix}{select}": value}
