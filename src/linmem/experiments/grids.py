"""The grids of the paper's searches and their points, and how a grid's studies are read (the
storage that holds them is :mod:`linmem.experiments.storage`): one study per (data set, model,
grid), named ``DATA-MODEL-GRID`` (``@PROTOCOL`` for a protocol other than linmem's), one trial
per point, and the state of each point across the
workers that share a study (:func:`point_states`: the rules are :mod:`linmem.experiments.search`'s).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from linmem._extras import require
from linmem.registry import get_spec
from linmem.training.config import LEGACY_PROTOCOL, departures_text

TrialState = require("optuna", "a search").trial.TrialState

__all__ = [
    "FINISHED",
    "GRIDS",
    "MAX_RETRY",
    "PAPER_LMN_SIZES",
    "PAPER_WEIGHT_DECAYS",
    "Grid",
    "Point",
    "check_grid",
    "claimed_before",
    "grid_points",
    "point_states",
    "study_name",
    "trial_point",
]


FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


MAX_RETRY = 10  # a point whose worker died more often than this is failed (module docstring)


PAPER_LMN_SIZES = ((50, 50), (50, 100), (100, 100), (100, 250), (250, 250), (250, 500))


PAPER_WEIGHT_DECAYS = (1e-4, 1e-5, 1e-6, 1e-7, 0.0)


@dataclass(frozen=True)
class Grid:
    """A named grid: hidden sizes of the RNN-like models, (functional, memory) pairs of the LMNs,
    weight decays of every model."""

    hidden: tuple[int, ...]
    lmn_sizes: tuple[tuple[int, int], ...]
    weight_decay: tuple[float, ...]


GRIDS: dict[str, Grid] = {
    # the paper's grids (RNN, LSTM and, here, GRU; the LMN pairs), 25 and 30 points per model
    "paper": Grid((50, 100, 250, 500, 750), PAPER_LMN_SIZES, PAPER_WEIGHT_DECAYS),
    # the paper's grid without the sizes above 250 units: a quicker first pass
    "paper-small": Grid((50, 100, 250), PAPER_LMN_SIZES[:3], PAPER_WEIGHT_DECAYS),
    # the reduced grid for the three larger data sets (evidence in results/search.md):
    # each model's size selected on JSB Chorales' full grid with the paper's sizes around it,
    # and the two weight decays selected there (1e-5: five models; 1e-7: pret-LMN-B)
    "reduced": Grid((250, 500, 750), ((100, 250), (250, 250), (250, 500)), (1e-5, 1e-7)),
    # the paper protocol's grid for MuseData, Nottingham and Piano-midi.de
    # (results/paper-protocol/README.md): what JSB Chorales' full grid selected under that
    # protocol (RNN 250, LSTM 750 units; LMN-A (50, 50), LMN-B and pret-LMN-B (250, 250); no
    # decay, or 1e-6), one LMN pair between; 4 points per RNN-like model, 6 per LMN
    "paper-long": Grid((250, 750), ((50, 50), (100, 250), (250, 250)), (0.0, 1e-6)),
    # the NADE models on JSB Chorales: RNN-NADE's sizes (Boulanger-Lewandowski et al.
    # 2012: 150-300 recurrent units, a NADE of 150), two weight decays against overfitting
    "nade": Grid((150, 300), ((150, 150), (150, 300)), (1e-4, 1e-5)),
    "quick": Grid((50, 100), ((50, 50), (50, 100)), (1e-5, 0.0)),
    "tiny": Grid((4, 8), ((4, 4), (4, 8)), (1e-5, 0.0)),  # for tests
}


@dataclass(frozen=True)
class Point:
    """One grid point."""

    hidden: int
    memory: int | None
    weight_decay: float

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {"hidden": self.hidden, "weight_decay": self.weight_decay}
        if self.memory is not None:
            params["memory"] = self.memory
        return params

    @property
    def name(self) -> str:
        sizes = f"h{self.hidden}" + ("" if self.memory is None else f"-m{self.memory}")
        return f"{sizes}-wd{self.weight_decay:g}"

    @classmethod
    def from_params(cls, params: dict[str, Any]) -> Point:
        return cls(int(params["hidden"]),
                   None if params.get("memory") is None else int(params["memory"]),
                   float(params["weight_decay"]))


def check_grid(grid: str) -> None:
    if grid not in GRIDS:
        raise ValueError(f"unknown grid {grid!r}; choose from {', '.join(GRIDS)}")


def grid_points(model: str, grid: str | Grid) -> list[Point]:
    """The points of ``grid`` for ``model`` (LMNs: the size pairs; others: the hidden sizes)."""
    g = GRIDS[grid] if isinstance(grid, str) else grid
    if get_spec(model).has_memory:
        sizes: Sequence[tuple[int, int | None]] = g.lmn_sizes
    else:
        sizes = [(h, None) for h in g.hidden]
    return [Point(h, m, wd) for h, m in sizes for wd in g.weight_decay]


def study_name(data: str, model: str, grid: str, protocol: str,
               overrides: dict[str, Any] | None = None) -> str:
    """``DATA-MODEL-GRID``, ``@PROTOCOL`` after it for a protocol other than
    :data:`~linmem.training.config.LEGACY_PROTOCOL` (whose studies were named before protocols
    had names; the studies of both protocols share a storage), and ``+FIELD=VALUE`` for each
    field in which the study departs from its protocol (``TrainConfig.protocol_overrides``) or
    bounds the memory (``memory_bound``), so that a study with a departure never takes the name
    of one without it: ``piano-lmn-b-paper-long@paper+clip=0.0568``,
    ``jsb-lmn-a-paper@paper+memory_bound=0.99``."""
    suffix = "" if protocol == LEGACY_PROTOCOL else f"@{protocol}"
    return f"{data}-{model}-{grid}{suffix}" + departures_text(overrides or {})


def trial_point(trial) -> Point | None:
    """The grid point of a trial (its fixed parameters, set when it was enqueued), or None for a
    trial that was not enqueued (it ends at once, see :func:`_objective`)."""
    params = trial.system_attrs.get("fixed_params") or trial.params
    return Point.from_params(params) if "hidden" in params else None


def point_states(study, points: Sequence[Point], max_retry: int = MAX_RETRY,
                 retry_failed: bool = False) -> dict[Point, str]:
    """``done`` (complete or pruned), ``failed``, ``waiting``, ``running`` or ``todo`` per point.

    A point whose trial raised an error is failed; with ``retry_failed`` it is to do again once
    (its second error fails it): what ``linmem search --retry-failed`` gives a point that a
    since-mended fault failed."""

    rank = {"todo": 0, "running": 1, "waiting": 2, "failed": 3, "done": 4}
    states = dict.fromkeys(points, "todo")
    deaths: dict[Point, int] = {}
    errors: dict[Point, int] = {}
    for t in study.get_trials(deepcopy=False):
        p = trial_point(t)
        if "duplicate_of" in t.user_attrs or p not in states:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            s = "done"
        elif t.state == TrialState.FAIL:
            deaths[p] = deaths.get(p, 0) + 1
            if "error" in t.user_attrs:
                errors[p] = errors.get(p, 0) + 1
            given_up = errors.get(p, 0) > (1 if retry_failed else 0)
            s = "failed" if given_up or deaths[p] > max_retry else "todo"
        elif t.state == TrialState.WAITING:
            s = "waiting"
        else:
            s = "running"
        if rank[s] > rank[states[p]]:
            states[p] = s
    return states


def claimed_before(study, trial) -> int | None:
    """The number of another trial that owns ``trial``'s point, if any: a finished one, or a
    waiting or running one with a lower number."""

    point = trial_point(trial)
    for t in study.get_trials(deepcopy=False):
        if t.number == trial.number or "duplicate_of" in t.user_attrs or trial_point(t) != point:
            continue
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED):
            return t.number
        if t.state in (TrialState.WAITING, TrialState.RUNNING) and t.number < trial.number:
            return t.number
    return None
