"""The one-factor-at-a-time ablation of a training protocol (``linmem ablation``).

A protocol (:data:`linmem.training.config.PROTOCOLS`) is several choices at once; the ablation asks
which of them carry its result, at the configuration that its search selected:

- a part of training (the batch size, the loss's normalisation, the readout bias, the clip):
  that configuration's seeds trained again with that one field set as the other protocol sets it
  (``linmem reseed RUN --set FIELD=VALUE``), against its own seeds (:func:`ablation_groups`);
- the search's median pruner, which decides which runs finish, not how one trains: the grid's
  runs replayed through it (:func:`replay_pruner`): the points it would have stopped and the
  configuration selected among the others.

Their tables are drawn by :mod:`linmem.experiments.report` (:func:`ablation_record_markdown`), whose
Table 2 shows them too.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from linmem._io import atomic_write, command_line, git_commit, made_by, write_json
from linmem.experiments.both_protocols import (
    ablation_record_markdown,
)
from linmem.experiments.seed_groups import seed_groups
from linmem.training.config import PROTOCOLS, record_protocol
from linmem.training.runs import METRICS, collect_metrics, log_rows, read_record
from linmem.training.selection import selection_score

__all__ = ["ablation_groups", "grid_trials", "replay_pruner", "write_ablation"]


def _point(r: dict) -> tuple:
    """A configuration's identity but for the protocol's fields and the seed."""
    return (r["dataset"], r["model"], r.get("nonlinearity"), r.get("hidden"), r.get("memory"),
            r.get("weight_decay"), record_protocol(r), r.get("memory_bound"))


def _overrides(runs: Sequence[dict], what: str) -> dict[str, Any]:
    """The protocol fields that the seeds ``runs`` of one configuration set apart from their
    protocol (``metrics.json``'s ``protocol_overrides``), the same for each."""
    found = {json.dumps(r.get("protocol_overrides") or {}, sort_keys=True) for r in runs}
    if len(found) > 1:
        raise ValueError(f"{what}: seeds of one configuration with different protocol fields "
                         f"({'; '.join(sorted(found))})")
    return json.loads(found.pop())


def ablation_groups(base_runs: Sequence[dict], variant_runs: Sequence[dict]) -> list[dict]:
    """The seeds of each variant (runs of :func:`linmem.training.runs.collect_metrics`, diverged
    ones included) against those of its base, the configuration as its protocol trains it: per
    variant its ``factor`` (the protocol fields it sets otherwise than its base, with the
    base's value in ``base_values``), its :func:`linmem.experiments.seed_groups.seed_groups` record
    (``variant``) and its base's (``base``). Ordered by data set, model, then factor.
    ``ValueError`` for a variant with no base among ``base_runs``, or one that changes nothing."""
    by_point: dict[tuple, list[dict]] = {}
    for r in base_runs:
        by_point.setdefault(_point(r), []).append(r)
    bases: dict[tuple, dict] = {}
    for point, runs in by_point.items():
        overrides = _overrides(runs, "base")  # one configuration: its seeds alike
        (group,) = seed_groups(runs)
        bases[point] = {"group": group, "overrides": overrides}
    by_factor: dict[tuple, list[dict]] = {}
    for r in variant_runs:
        key = (*_point(r), json.dumps(r.get("protocol_overrides") or {}, sort_keys=True))
        by_factor.setdefault(key, []).append(r)
    out = []
    for key, runs in by_factor.items():
        point, overrides = key[:-1], json.loads(key[-1])
        base = bases.get(point)
        if base is None:
            raise ValueError(f"{runs[0]['run']}: no base seeds of {runs[0]['model']} "
                             f"({point[3]}, {point[4]}, weight decay {point[5]}) among the base "
                             "runs")
        spec = PROTOCOLS[point[6]]
        fields = sorted(set(overrides) | set(base["overrides"]))
        factor = {f: overrides.get(f, getattr(spec, f)) for f in fields
                  if overrides.get(f, getattr(spec, f))
                  != base["overrides"].get(f, getattr(spec, f))}
        if not factor:
            raise ValueError(f"{runs[0]['run']}: trained as its base (nothing changed)")
        (group,) = seed_groups(runs)
        out.append({"dataset": point[0], "model": point[1], "factor": factor,
                    "base_values": {f: base["overrides"].get(f, getattr(spec, f))
                                    for f in factor},
                    "variant": group, "base": base["group"]})
    return sorted(out, key=lambda a: (a["dataset"], a["model"],
                                      json.dumps(a["factor"], sort_keys=True)))


def grid_trials(storage: str, study_name: str, runs_root: str | os.PathLike = "."
                ) -> list[dict[str, Any]]:
    """The finished trials of one search study, for :func:`replay_pruner`: per point its trial
    number, its objective (the validation score its runs select on, ``value``), the test
    accuracies of its run (``test_acc_frame``, ``test_acc``, from ``metrics.json`` under
    ``runs_root``) and its validation score at every epoch of the run's ``log.jsonl`` (``curve``:
    epoch -> score; where the run is not there, the intermediate values of every trial that
    trained its run directory: a worker killed mid-run leaves a failed trial with the epochs up
    to then, and the trial that resumed the run reports only the epochs after)."""
    import optuna  # slow to import
    from optuna.trial import TrialState

    from linmem.experiments.grids import trial_point
    from linmem.experiments.studies import run_reports, study_protocol

    names = optuna.get_all_study_names(storage)
    if study_name not in names:
        raise ValueError(f"no study {study_name!r} in {storage} (it holds "
                         f"{', '.join(sorted(names)) or 'none'})")
    study = optuna.load_study(study_name=study_name, storage=storage)
    select = study.user_attrs.get("train", {}).get(
        "select", PROTOCOLS[study_protocol(study.user_attrs)].select)
    trials = study.get_trials(deepcopy=False)
    reported = run_reports(trials)  # run directory -> epoch -> score, all trials'
    out = []
    for t in trials:
        if t.state != TrialState.COMPLETE:
            continue
        point = trial_point(t)
        if point is None or "duplicate_of" in t.user_attrs or not math.isfinite(t.value):
            continue
        run = Path(runs_root) / t.user_attrs["run_dir"] if "run_dir" in t.user_attrs else None
        rows = log_rows(run) if run is not None else []
        curve = ({int(r["epoch"]): selection_score(r, select, "valid_") for r in rows} if rows else
                 dict(sorted(reported[t.user_attrs["run_dir"]].items())) if run is not None
                 else {int(k): v for k, v in t.intermediate_values.items()})
        metrics = (read_record(run, METRICS, t.user_attrs) if run is not None
                   else t.user_attrs)
        out.append({"number": t.number, "point": point.name, "value": t.value, "curve": curve,
                    "test_acc_frame": metrics.get("test_acc_frame"),
                    "test_acc": metrics.get("test_acc"), "select": select})
    return sorted(out, key=lambda t: t["number"])


def replay_pruner(trials: Sequence[dict], warmup: int = 50, percentile: float = 50.0
                  ) -> dict[str, Any]:
    """Optuna's median pruner (``MedianPruner(n_warmup_steps=warmup)``; ``percentile`` of a
    ``PercentilePruner``) replayed on finished trials (:func:`grid_trials`), each against every
    other one as if they had all finished before it: a trial is stopped at the first epoch
    ``e >= warmup`` where its best score up to ``e`` is below that percentile of the others'
    scores at ``e`` (those that ran to ``e``). Returns the trials stopped (``stopped``: point ->
    epoch), the selection on validation with every trial (``selected``) and among those not
    stopped (``selected_pruned``), and the share of the epochs that the stops save."""
    stopped: dict[str, int] = {}
    for t in trials:
        others = [o["curve"] for o in trials if o is not t]
        best = -math.inf
        for epoch in sorted(t["curve"]):
            best = max(best, t["curve"][epoch])
            at = [c[epoch] for c in others if epoch in c]
            if epoch < warmup or not at:
                continue
            if best < float(np.percentile(at, 100.0 - percentile)):
                stopped[t["point"]] = epoch
                break

    def pick(pool: Sequence[dict]) -> dict | None:
        return max(pool, key=lambda t: (t["value"], -t["number"]), default=None)

    epochs = sum(len(t["curve"]) for t in trials)
    saved = sum(len([e for e in t["curve"] if e > stopped[t["point"]]]) for t in trials
                if t["point"] in stopped)
    return {"trials": len(trials), "stopped": stopped, "selected": pick(trials),
            "selected_pruned": pick([t for t in trials if t["point"] not in stopped]),
            "epochs_saved": saved / epochs if epochs else None}


def write_ablation(out: str | os.PathLike, base_runs: Sequence[str | os.PathLike],
                   variant_runs: Sequence[str | os.PathLike], storage: str | None = None,
                   studies: Sequence[str] = (), runs_root: str | os.PathLike = ".",
                   warmup: int = 50, command: str | None = None) -> Path:
    """``linmem ablation``: ``out/ablation.md`` (the factors of training, :func:`ablation_groups`
    of the runs under ``base_runs`` and ``variant_runs``; the pruner, :func:`replay_pruner` of
    each of ``studies`` in ``storage``) and ``out/ablation.json``, the same as data. Returns
    the Markdown file's path."""
    command = command or command_line()
    commit = git_commit()
    at = f"commit {commit}" if commit else None
    record: dict[str, Any] = {"command": command, "commit": commit}
    if variant_runs:
        if not base_runs:
            raise ValueError("the variants' seeds need their base's (--base)")
        record["factors"] = ablation_groups(collect_metrics(base_runs, diverged=True),
                                            collect_metrics(variant_runs, diverged=True))
    if studies:
        if storage is None:
            raise ValueError("the pruner's replay needs the search's storage (--storage)")
        replays = [(s, replay_pruner(grid_trials(storage, s, runs_root), warmup))
                   for s in studies]
        record["pruner"] = {"warmup": warmup, "studies": [
            {"study": s, **{k: v for k, v in r.items() if k not in ("selected",
                                                                   "selected_pruned")},
             **{k: None if r[k] is None else {f: r[k][f] for f in (
                 "number", "point", "value", "test_acc_frame", "test_acc")}
                for k in ("selected", "selected_pruned")}} for s, r in replays]}
    if "factors" not in record and "pruner" not in record:
        raise ValueError("nothing to report: give variant runs, or --study for the pruner")
    parts = ["# One factor at a time", "", ablation_record_markdown(record)]
    parts += made_by(command, at)[1:]
    path = Path(out) / "ablation.md"
    with atomic_write(path, "w") as f:
        f.write("\n".join(parts) + "\n")
    write_json(Path(out) / "ablation.json", record)
    return path
