"""The bounded memory beside the unbounded one: per data set and LMN model, the seeds of each
side's selected configuration (the campaign's, ``--memory-bound``, and the paper's unbounded
memory's) on the test split, the per-frame mean (the paper's metric) and the global accuracy,
the NLL, each as mean ± sd (range), and the change of the means.

A side with no seeds is named as such: for the unbounded memory it is a grid whose every point
diverged (nothing was selected to seed), or a cell not run. The decision on the layer's default
is :mod:`linmem.experiments.bound_choice`'s, on validation; this table reads the test split and
decides nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from linmem.data import DATASETS, dataset_title
from linmem.experiments.bound_choice import MODELS, bound_sides
from linmem.experiments.seed_groups import row_label, seeds_text, size_text, spread_text
from linmem.models import display_name

__all__ = ["bound_comparison_markdown"]

_METRICS = ("test_acc_frame", "test_acc", "test_nll")


def _change(bounded: dict, unbounded: dict) -> str:
    """Bounded minus unbounded, the means of the seeds that finished, per-frame then global."""
    parts = []
    for key, name in (("test_acc_frame", "per-frame"), ("test_acc", "global")):
        if key in bounded and key in unbounded:
            parts.append(f"{bounded[key]['mean'] - unbounded[key]['mean']:+.2f} {name}")
    return ", ".join(parts) or "–"


def _row(dataset: str, model: str, side: str, group: dict | None, change: str) -> str:
    """One side's row of a cell: its seeds (the failed named) and their spread per metric."""
    title = dataset_title(dataset)
    if group is None:
        return f"| {title} | {display_name(model)} | {side} | – | no seeds | – | – | – | – |"
    return (f"| {title} | {row_label(group)} | {side} | {size_text(group)}, "
            f"{group['weight_decay']:g} | {seeds_text(group)} | "
            + " | ".join(spread_text(group, k) for k in _METRICS) + f" | {change} |")


def bound_comparison_markdown(groups: Sequence[dict],
                              expected: Sequence[tuple[str, str]] | None = None) -> str:
    """The table of the bounded and unbounded seed groups (:func:`bound_sides` of
    :func:`linmem.experiments.seed_groups.seed_groups`) of every ``expected`` cell (default:
    every data set times :data:`MODELS`), the unbounded row first."""
    expected = [(d, m) for d in DATASETS for m in MODELS] if expected is None else expected
    sides = bound_sides(groups)
    lines = ["| data | model | memory | size, weight decay | seeds | test acc % (per-frame mean) "
             "| test acc % (global) | test NLL | change (bounded − unbounded) |",
             "|---|---|---|---|---|---:|---:|---:|---|"]
    for dataset, model in expected:
        cell = sides.get((dataset, model), {})
        unbounded, bounded = cell.get("unbounded"), cell.get("bounded")
        bound = (bounded or {}).get("memory_bound")
        lines.append(_row(dataset, model, "unbounded", unbounded, ""))
        change = _change(bounded, unbounded) if bounded and unbounded else "–"
        lines.append(_row(dataset, model, "bounded" + (f" ({bound:g})" if bound else ""),
                          bounded, change))
    lines += ["", "Mean ± standard deviation (minimum-maximum) over the seeds that finished; a "
              "failed seed (diverged, or its checkpoint gave NaN or inf outputs on a split) is "
              "named and has no score. The change is the difference of the finished seeds' "
              "means. No seeds: nothing selected to seed (for the unbounded memory, a grid whose "
              "every point diverged: ✗ in `results/paper-protocol/table2.md`), or not run yet. "
              "Test split: this table decides nothing (the default is chosen on validation, "
              "`linmem.experiments.bound_choice`)."]
    return "\n".join(lines) + "\n"
