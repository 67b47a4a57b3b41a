"""Beyond the paper: the campaign's table, ``results/beyond.md`` and ``beyond.json``
(``results/beyond/README.md``: the best model of each set built on the LMN, against every
published figure and the trivial baselines).

One record per row, a seed group of the campaign (:func:`linmem.experiments.seed_groups.
seed_groups`: a data set, a model, its recipe): what it was selected on, its test accuracies
(global and per-frame, at 0.5 and at the threshold chosen on validation) and NLL, each as
``{mean, sd, min, max, n}`` over its seeds, and its CPU hours. Beside them the figures a row is
compared with: the best of the paper's Table 2 per set (:data:`linmem.experiments.paper.
PAPER_TABLE2`), the published likelihoods (:data:`PUBLISHED_NLL`), the paper-protocol row of
Table 2 (``results/paper-protocol/seeds.json``) and the calibration rows (``results/baseline.
json``: the previous frame, the per-key model of the previous frame). A claim counts only where
the seeds' range clears what it is compared with (:func:`clears`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from linmem.data import dataset_title
from linmem.experiments.paper import PAPER_TABLE2, TABLE2_DATASETS
from linmem.experiments.seed_groups import row_label, variant_text

__all__ = ["PUBLISHED_NLL", "best_published_accuracy", "beyond_markdown", "beyond_rows",
           "clears"]

# test NLL in nats per frame as published: RNN-NADE (Boulanger-Lewandowski et al. 2012, Table 1),
# its JSB figure as the SRNN paper (Fraccaro et al. 2016) cites it, SRNN's bound (ibid.), TCN
# (Bai et al. 2018)
PUBLISHED_NLL: dict[str, dict[str, float]] = {
    "RNN-NADE": {"jsb": 5.56, "musedata": 5.60, "nottingham": 2.31, "piano": 7.05},
    "RNN-NADE (as SRNN cites it)": {"jsb": 5.19},
    "SRNN (bound)": {"jsb": 4.74},
    "TCN": {"jsb": 8.10, "nottingham": 3.07},
}
METRICS = ("test_acc", "test_acc_frame", "test_nll", "test_acc_at_valid_threshold",
           "test_acc_frame_at_valid_threshold")


def best_published_accuracy(dataset: str) -> float:
    """The best per-frame test accuracy of the paper's Table 2 on ``dataset``."""
    return max(row[TABLE2_DATASETS.index(dataset)] for row in PAPER_TABLE2.values())


def _stats(values: Sequence[float]) -> dict[str, Any] | None:
    if not values:
        return None
    a = np.asarray(values, dtype=float)
    return {"mean": float(a.mean()), "sd": float(a.std(ddof=1)) if len(a) > 1 else None,
            "min": float(a.min()), "max": float(a.max()), "n": len(a)}


def beyond_rows(records: Sequence[dict], groups: Sequence[dict]) -> list[dict]:
    """One record per seed group (``groups`` of ``records``, the seeds' ``metrics.json``):
    ``dataset``, ``model``, ``recipe`` (what sets the group apart), ``selected_on``, each of
    :data:`METRICS` as ``{mean, sd, min, max, n}`` over the seeds that scored, the seeds that
    failed, and ``cpu_hours`` (every seed's ``cpu_time_s``)."""
    by_run = {r["run"]: r for r in records}
    rows = []
    for g in groups:
        seeds = [by_run[run] for run in g["runs"] if run in by_run]
        scored = [r for r in seeds if "diverged" not in r]
        selected = sorted({r.get("selected_on") for r in scored if r.get("selected_on")})
        rows.append({
            "dataset": g["dataset"], "model": g["model"], "label": row_label(g),
            "recipe": variant_text(g) or "the paper's protocol",
            "selected_on": selected[0] if len(selected) == 1 else selected,
            **{m: _stats([r[m] for r in scored if r.get(m) is not None]) for m in METRICS},
            "failed_seeds": g["diverged_seeds"],
            "cpu_hours": sum(r.get("cpu_time_s") or 0.0 for r in seeds) / 3600})
    return rows


def clears(stats: dict | None, reference: float | None, higher: bool = True) -> bool | None:
    """Whether every seed is past ``reference`` (above it, or below with ``higher=False``: an
    NLL); None where either side is missing."""
    if stats is None or reference is None:
        return None
    return stats["min"] > reference if higher else stats["max"] < reference


def _cell(stats: dict | None, digits: int = 2) -> str:
    if stats is None:
        return "–"
    sd = f" ± {stats['sd']:.{digits}f}" if stats["sd"] is not None else ""
    return (f"{stats['mean']:.{digits}f}{sd} ({stats['min']:.{digits}f}-"
            f"{stats['max']:.{digits}f}, n={stats['n']})")


def beyond_markdown(rows: Sequence[dict], baseline: dict | None = None,
                    paper_rows: Sequence[dict] = ()) -> str:
    """The table of :func:`beyond_rows` per data set, with the figures each row is compared
    with: the paper's best (per-frame), the paper-protocol row of the same model
    (``paper_rows``: seed groups), the previous frame and the per-key model of it
    (``baseline``: ``results/baseline.json``) and the published NLLs; ✓ where every seed
    clears the paper's best and both previous-frame rows (accuracy) or RNN-NADE's NLL."""
    lines = []
    for dataset in TABLE2_DATASETS:
        here = [r for r in rows if r["dataset"] == dataset]
        if not here:
            continue
        best = best_published_accuracy(dataset)
        previous = (baseline or {}).get("scores", {}).get(dataset, {}).get("test", {})
        per_key = (baseline or {}).get("per_key_model", {}).get("scores", {}).get(
            dataset, {}).get("test", {})
        nade = PUBLISHED_NLL["RNN-NADE"].get(dataset)
        lines += [f"## {dataset_title(dataset)}", "",
                  f"The paper's best per-frame test accuracy: {best:.2f}; the previous frame: "
                  f"{previous.get('acc_frame', float('nan')):.2f} per-frame, "
                  f"{previous.get('acc', float('nan')):.2f} global; the per-key model of the "
                  f"previous frame: NLL {per_key.get('nll', float('nan')):.3f}; published NLL: "
                  + ", ".join(f"{name} {v[dataset]:.2f}" for name, v in PUBLISHED_NLL.items()
                              if dataset in v) + ".", "",
                  "| row | selected on | test acc % (per-frame) | test acc % (global) | "
                  "test NLL | above the paper's best and both previous frames | below "
                  "RNN-NADE's NLL | CPU h |", "|---|---|---|---|---|---|---|---:|"]
        for r in here:
            above = [clears(r["test_acc_frame"], best),
                     clears(r["test_acc_frame"], previous.get("acc_frame")),
                     clears(r["test_acc"], previous.get("acc"))]
            acc_claim = "✓" if all(above) else ("–" if None in above else "✗")
            nll_claim = {True: "✓", False: "✗", None: "–"}[clears(r["test_nll"], nade, False)]
            lines.append(f"| {r['label']} | {r['selected_on']} | {_cell(r['test_acc_frame'])} | "
                         f"{_cell(r['test_acc'])} | {_cell(r['test_nll'], 3)} | {acc_claim} | "
                         f"{nll_claim} | {r['cpu_hours']:.1f} |")
        for g in paper_rows:
            if g["dataset"] == dataset and any(g["model"] == r["model"] for r in here):
                lines.append(f"| Table 2, paper protocol: {row_label(g)} | valid acc_frame | "
                             f"{_cell(g.get('test_acc_frame'))} | {_cell(g.get('test_acc'))} | "
                             f"{_cell(g.get('test_nll'), 3)} |  |  |  |")
        lines.append("")
    return "\n".join(lines)
