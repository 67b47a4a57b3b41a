"""How much CPU time a search's points left will take (``linmem progress``'s projection): each
point at the cost its study's finished points give by size, else from short probe runs, else from
its model on other data sets, else from its data set (:func:`project_points`)."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

from linmem.experiments.search import size_cost, size_slope
from linmem.registry import get_spec
from linmem.training.runs import collect_metrics, log_rows

__all__ = ["epoch_slope", "probe_ratios", "project_points"]


def _family(model: str) -> str:
    """Which probes stand for a model's cost: an LMN's (a memory) or an RNN-like model's."""
    return "memory" if get_spec(model).has_memory else "recurrent"


def probe_ratios(paths: Sequence[str | os.PathLike]) -> dict[tuple[str, str, str], float]:
    """The probes under ``paths`` (short runs, ``linmem train ... --epochs 1``, of one
    configuration on several data sets): ``(here, there, family)`` -> the median CPU time of an
    epoch on data set ``here`` over that on ``there``, from the probes of one configuration
    (model and sizes) on both, averaged over the configurations of a family (:func:`_family`).
    ``ValueError`` for a probe without epochs' CPU times."""
    epochs: dict[tuple, dict[str, float]] = {}
    for r in collect_metrics(paths):
        rows = [row["epoch_cpu_s"] for row in log_rows(r["run"]) if "epoch_cpu_s" in row]
        if not rows:
            raise ValueError(f"--probe {r['run']}: no epoch CPU times in its log.jsonl")
        key = (r["model"], r.get("hidden"), r.get("memory"))
        epochs.setdefault(key, {})[r["dataset"]] = statistics.median(rows)
    pairs: dict[tuple[str, str, str], list[float]] = {}
    for (model, _, _), by_data in epochs.items():
        for here, cost in by_data.items():
            for there, other in by_data.items():
                if here != there:
                    pairs.setdefault((here, there, _family(model)), []).append(cost / other)
    return {k: sum(v) / len(v) for k, v in pairs.items()}


def epoch_slope(records: Sequence[dict], model: str, grid: str) -> float | None:
    """How an epoch's CPU time grows with the parameters for ``model``: the slope of log
    epoch time on log parameters over its studies' points of several sizes (the records'
    ``finished_epoch_cpu_s``, ``running_epoch_cpu_s`` beside their ``*_params``; each study's
    points against their own means, so that data sets of longer sequences do not count as
    larger models: :func:`linmem.experiments.search.size_slope`), its studies in ``grid`` (the same
    batch and sequences), else in any grid.
    An epoch's time is the machine's, not early stopping's: at batch 1 it grows faster than
    the parameters once the weights leave the cache (a 750-unit GRU's epoch on Nottingham
    costs 11 to 13 times a 250-unit one for 7 times the parameters). None where no study has run
    two sizes."""

    def slope(studies: list[dict]) -> float | None:
        return size_slope([(n, t) for k in ("finished", "running")
                           if f"{k}_epoch_cpu_s" in r  # a record made without them: none
                           for n, t in zip(r[f"{k}_params"], r[f"{k}_epoch_cpu_s"], strict=True)]
                          for r in studies)

    mine = [r for r in records if r["model"] == model]
    here = slope([r for r in mine if r["grid"] == grid])
    return here if here is not None else slope(mine)


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


class _Projection:
    """What :func:`project_points` projects each record from: the records' finished points,
    the probes' ratios and each (model, grid)'s epoch slope (measured once)."""

    def __init__(self, records: list[dict],
                 probes: dict[tuple[str, str, str], float] | None) -> None:
        self.records, self.probes = records, probes
        self.slopes: dict[tuple[str, str], float | None] = {}
        self.finished = {(r["dataset"], r["grid"], r["model"]): _mean(r["finished_cpu_s"])
                         for r in records if r["finished_cpu_s"]}

    def slope(self, model: str, grid: str) -> float | None:
        if (model, grid) not in self.slopes:
            self.slopes[(model, grid)] = epoch_slope(self.records, model, grid)
        return self.slopes[(model, grid)]

    def scaled(self, here: str, grid: str, model: str, same_grid: bool) -> float | None:
        """``model``'s mean point cost on the other data sets (in ``grid`` or in another),
        each scaled by the ratio of the two data sets' costs over the models both finished."""
        finished, estimates = self.finished, []
        for (other, g, m), cost in finished.items():
            if m != model or other == here or (g == grid) != same_grid:
                continue
            both = [n for (d, g2, n) in finished if d == here and g2 == grid
                    and (other, g, n) in finished]
            if both:
                estimates.append(cost * sum(finished[(here, grid, n)] for n in both)
                                 / sum(finished[(other, g, n)] for n in both))
        return _mean(estimates)

    def probed(self, r: dict) -> tuple[list[float], list[float]] | None:
        """The probes' costs of ``r``'s points to do and running (their sizes), or None."""
        if not self.probes or r.get("todo_params") is None:
            return None
        fits = []
        for q in self.records:
            ratio = self.probes.get((r["dataset"], q["dataset"], _family(r["model"])))
            if q["model"] == r["model"] and ratio is not None and q.get("finished_params"):
                fit = size_cost(q["finished_params"], q["finished_cpu_s"],
                                self.slope(q["model"], q["grid"]))
                if fit is not None:
                    fits.append((fit, ratio))
        running = r.get("running_params") or []
        if not fits or len(running) != len(r["running_cpu_s"]) or not (
                r["todo_params"] or running):
            return None

        def cost(n: float) -> float:
            return sum(f(n) * k for f, k in fits) / len(fits)

        return [cost(n) for n in r["todo_params"]], [cost(n) for n in running]

    def project(self, r: dict) -> None:
        """Set ``r``'s ``left_from``, ``mean_point_cpu_s``, ``left_cpu_s`` and
        ``dearest_point_cpu_s`` (:func:`project_points`)."""
        grid, here = r["grid"], r["dataset"]
        by_probe = self.probed(r)
        mates = [s for q in self.records if q["dataset"] == here and q["grid"] == grid
                 for s in q["finished_cpu_s"]]
        sources = (("study", _mean(r["finished_cpu_s"])),
                   ("probe", _mean(by_probe[0] + by_probe[1]) if by_probe else None),
                   ("model", self.scaled(here, grid, r["model"], True)),
                   ("model, other grid", self.scaled(here, grid, r["model"], False)),
                   ("data set", _mean(mates)))  # the first with something to project from
        r["left_from"], per = next(((how, v) for how, v in sources if v is not None),
                                   (None, None))
        r["mean_point_cpu_s"] = per
        todo, running = [per] * r["todo"], [per] * len(r["running_cpu_s"])
        sizes = [r.get(k) for k in ("finished_params", "running_params", "todo_params")]
        cost = (size_cost(sizes[0], r["finished_cpu_s"], self.slope(r["model"], grid))
                if r["left_from"] == "study" and None not in sizes
                and list(map(len, sizes)) == [len(r["finished_cpu_s"]), len(r["running_cpu_s"]),
                                              r["todo"]] else None)
        if cost is not None:
            running, todo = ([cost(n) for n in ns] for ns in sizes[1:])
            r["left_from"] = "study, by size"
        elif r["left_from"] == "probe":
            todo, running = by_probe
        # a running point costs its projection, or what it has logged and the epochs its early
        # stopping still has to run (``running_due_cpu_s``) when that is more
        due = r.get("running_due_cpu_s") or [0.0] * len(r["running_cpu_s"])
        ends = ([] if per is None else
                [max(c, s + d) for c, s, d in zip(running, r["running_cpu_s"], due, strict=True)])
        r["left_cpu_s"] = (None if per is None and (r["todo"] or r["running_cpu_s"]) else
                           0.0 if per is None else
                           sum(todo) + sum(e - s for e, s in zip(ends, r["running_cpu_s"],
                                                                 strict=True)))
        r["dearest_point_cpu_s"] = max([*r["finished_cpu_s"], *ends,
                                        *([] if per is None else todo)], default=None)


def project_points(records: list[dict],
                   probes: dict[tuple[str, str, str], float] | None = None) -> list[dict]:
    """Each study record's projected cost per point (``mean_point_cpu_s``) and of the points it
    has left (``left_cpu_s``: the points to do at that cost, the running ones at that cost less
    what they have logged, or at the least what their early stopping still holds them to,
    ``running_due_cpu_s``, where a record gives it:
    :func:`linmem.experiments.run_costs.epochs_due_cpu_seconds`), in place; ``left_from`` says
    where the per-point cost came from:

    - ``study``: the mean of its finished points; where the record gives every point's number
      of parameters (``finished_params``, ``running_params``, ``todo_params``, as
      :func:`progress_records` does), each point left costs instead what :func:`size_cost`
      fits to the finished points' sizes and CPU seconds (``study, by size``: a study whose
      small points finished first is not projected at their mean; where they are all of one
      size, at the slope :func:`epoch_slope` measures on its model's epochs, else 1);
    - ``probe``: none finished yet and ``probes`` given (:func:`probe_ratios`): each point
      left at what :func:`size_cost` fits to its model's finished points on another data set
      (of one size: at :func:`epoch_slope`'s slope),
      times the probes' ratio of the two data sets' epoch costs for its family (averaged over
      the data sets that have both); the record must give ``todo_params``. It comes before
      the whole runs' ratios below: a probe measures an epoch's cost, while a ratio of whole
      runs' costs carries how many epochs they ran (runs that diverge early on one data set
      make it look cheap for every model);
    - ``model``: else its model's finished points in the same grid on other data sets, each
      data set's mean scaled by the ratio of the two data sets' costs over the models both
      have finished (a data set with longer sequences costs more for every model), averaged
      over those data sets;
    - ``model, other grid``: else the same from its model's points in another grid (the
      ratio then over the models finished in both studies' grids: it carries the grids'
      difference in sizes too);
    - ``data set``: else the mean of its data set's finished points of every model (a
      pret-LMN point costs several of an RNN's: the coarsest estimate);
    - None: nothing finished to project from."""
    projection = _Projection(records, probes)
    for r in records:
        projection.project(r)
    return records
