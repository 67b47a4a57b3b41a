"""Whether the LMN's memory is bounded by default: the seeds of the selected configurations with
the bound and without it, compared on validation.

The rule, written before the bounded campaign's seeds (``results/bounded-memory/README.md``):

- a *cell* is a (data set, model) of :data:`MODELS` at the model's default activation, with
  seeds both bounded (``memory_bound`` set) and unbounded;
- each seed scores its per-frame validation accuracy (the paper's metric), a failed seed 0;
- the *cost* of the bound is the mean, over the cells whose unbounded seeds all finished (where
  there was no divergence to protect against), of the unbounded seeds' mean minus the bounded
  seeds' mean;
- the bound becomes the default when that cost is at most :data:`COST_LIMIT` points (the
  seeds' spread), else the default stays the paper's unbounded memory; decided once every data
  set has a counted cell and every cell :data:`MIN_SEEDS` seeds a side.

Validation only: the test scores are not read here.
"""

from __future__ import annotations

from collections.abc import Sequence

from linmem.data import DATASETS, dataset_title
from linmem.models import activation_of, display_name
from linmem.ops.bound import DEFAULT_MEMORY_BOUND

__all__ = ["COST_LIMIT", "MIN_SEEDS", "MODELS", "bound_choice", "bound_choice_markdown",
           "bound_sides", "group_score", "seeds_text"]

MODELS = ("lmn-a", "lmn-b", "pret-lmn-b")
MIN_SEEDS = 3
COST_LIMIT = 0.5  # points: JSB LMN-B's three bounded seeds' standard deviation in the pilot
METRIC = "valid_acc_frame"


def group_score(group: dict) -> float:
    """The mean of a seed group's per-frame validation accuracies, a failed seed counted 0."""
    finished = group.get(METRIC, {"mean": 0.0, "n": 0})
    return finished["mean"] * finished["n"] / max(finished["n"] + len(group["diverged_seeds"]), 1)


def bound_sides(groups: Sequence[dict]) -> dict[tuple[str, str], dict[str, dict]]:
    """(data set, model) -> {"unbounded": group, "bounded": group}, at the default activation;
    two groups on one side of a cell (two bounds, two sizes) are refused."""
    cells: dict[tuple[str, str], dict[str, dict]] = {}
    for g in groups:
        if g["model"] not in MODELS or g.get("nonlinearity") != activation_of(
                {"model": g["model"]}):
            continue
        side = "unbounded" if g.get("memory_bound") is None else "bounded"
        cell = cells.setdefault((g["dataset"], g["model"]), {})
        if side in cell:
            raise ValueError(f"{display_name(g['model'])} on {dataset_title(g['dataset'])}: two "
                             f"{side} seed groups; give the seeds of one configuration a side")
        cell[side] = g
    return cells


def bound_choice(groups: Sequence[dict],
                 expected: Sequence[tuple[str, str]] | None = None) -> dict:
    """Apply the module's rule to seed groups (:func:`linmem.experiments.seed_groups.seed_groups`
    of the bounded and the unbounded seeds together): ``{"cells", "cost", "bound", "decision",
    "reason"}``; ``decision`` is the bound to make the default, ``None`` for the unbounded
    memory, or ``"undecided"`` until every ``expected`` cell (default: every data set times
    :data:`MODELS`) has its bounded seeds. A cell without unbounded seeds (its grid diverged at
    every point: nothing selected) is shown and not counted."""
    expected = [(d, m) for d in DATASETS for m in MODELS] if expected is None else expected
    order = {d: i for i, d in enumerate(DATASETS)}
    cells, counted = [], []
    sides = bound_sides(groups)
    for (dataset, model), cell in sorted(sides.items(),
                                         key=lambda kv: (order.get(kv[0][0], len(order)), kv[0])):
        row = {"dataset": dataset, "model": model}
        for side in ("unbounded", "bounded"):
            g = cell.get(side)
            row[side] = None if g is None else {
                "score": group_score(g), "finished": len(g["seeds"]),
                "failed": len(g["diverged_seeds"]), "memory_bound": g.get("memory_bound")}
        both = row["unbounded"] is not None and row["bounded"] is not None
        row["counted"] = both and row["unbounded"]["failed"] == 0
        if both:
            row["cost"] = row["unbounded"]["score"] - row["bounded"]["score"]
        if row["counted"]:
            counted.append(row)
        cells.append(row)
    bounds = {c["bounded"]["memory_bound"] for c in cells if c["bounded"] is not None}
    if len(bounds) > 1:
        raise ValueError(f"the bounded seeds hold several bounds ({sorted(bounds)}): the rule "
                         "compares one bound with none")
    bound = next(iter(bounds), None)
    cost = (sum(c["cost"] for c in counted) / len(counted)) if counted else None
    seeded = {(c["dataset"], c["model"]) for c in cells if c["bounded"] is not None
              and c["bounded"]["finished"] + c["bounded"]["failed"] >= MIN_SEEDS}
    short = [k for k in expected if k not in seeded] + [
        (c["dataset"], c["model"]) for c in cells if c["unbounded"] is not None
        and c["unbounded"]["finished"] + c["unbounded"]["failed"] < MIN_SEEDS]
    missing = [d for d in dict.fromkeys(d for d, _ in expected)
               if not any(c["dataset"] == d for c in counted)]
    if short or missing or cost is None:
        decision = "undecided"
        reason = (f"{len(short)} cells lack {MIN_SEEDS} seeds a side" if short else
                  f"no counted cell on {', '.join(dataset_title(d) for d in missing)}")
    elif cost <= COST_LIMIT:
        decision = bound
        reason = (f"the bound costs {cost:.2f} points per-frame on validation over "
                  f"{len(counted)} cells, within {COST_LIMIT}: bounded by default")
    else:
        decision = None
        reason = (f"the bound costs {cost:.2f} points per-frame on validation over "
                  f"{len(counted)} cells, more than {COST_LIMIT}: unbounded by default")
    return {"cells": cells, "cost": cost, "bound": bound, "decision": decision,
            "reason": reason}


def seeds_text(side: dict | None) -> str:
    """A cell's seeds as a table shows them: their score, and how many finished and failed."""
    if side is None:
        return "–"
    failed = f", {side['failed']} failed" if side["failed"] else ""
    return f"{side['score']:.2f} ({side['finished']} finished{failed})"


def bound_choice_markdown(choice: dict) -> str:
    """The rule's cells and decision as markdown."""
    lines = ["| data | model | unbounded | bounded | cost (points) | counted |",
             "|---|---|---:|---:|---:|---|"]
    for c in choice["cells"]:
        cost = f"{c['cost']:.2f}" if "cost" in c else "–"
        lines.append(f"| {dataset_title(c['dataset'])} | {display_name(c['model'])} | "
                     f"{seeds_text(c['unbounded'])} | {seeds_text(c['bounded'])} | {cost} | "
                     f"{'yes' if c['counted'] else 'no'} |")
    decision = choice["decision"]
    verdict = ("not decided yet" if decision == "undecided" else
               f"memory_bound={decision} by default" if decision is not None else
               "memory_bound=None (the paper's unbounded memory) by default")
    lines += ["", f"Mean per-frame validation accuracy of each side's seeds (a failed seed 0); "
              f"the cost is counted where every unbounded seed finished. Decision: **{verdict}**"
              f" ({choice['reason']}; `linmem.experiments.bound_choice`)."]
    default = ("The layer's default (`linmem.ops.bound.DEFAULT_MEMORY_BOUND`): "
               f"{DEFAULT_MEMORY_BOUND}")
    lines += ["", default + ("." if decision in ("undecided", DEFAULT_MEMORY_BOUND) else
                             f", not yet the decision's {decision}.")]
    return "\n".join(lines) + "\n"
