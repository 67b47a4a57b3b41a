"""The paper's tables from run directories and search records (``linmem report``,
:func:`build_report`): Table 2 (both accuracies, the NLL, the seeds' spread, the claims), the
seeds' table, both protocols side by side, the ablation's tables
(:mod:`linmem.experiments.ablation` computes them), Figure 4's data and the summary files. Every
number of a run comes from its ``metrics.json`` (:mod:`linmem.training.runs`); the previous-frame
baseline that the table quotes is computed from the data
(:func:`linmem.experiments.analyses.previous_frame_report`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from linmem._io import (
    PROVENANCE_FIELDS,
    atomic_write,
    command_line,
    read_json,
    write_json,
)
from linmem.experiments.both_protocols import both_protocols_lines, protocols_markdown
from linmem.experiments.paper import (
    TABLE2_DATASETS,
    TABLE2_MODELS,
)
from linmem.experiments.plots import plot_figure4
from linmem.experiments.protocol_choice import (
    protocol_choice,
    protocol_choice_markdown,
)
from linmem.experiments.publish import publish
from linmem.experiments.seed_groups import seed_groups
from linmem.experiments.table2 import table2_markdown
from linmem.registry import get_spec
from linmem.training.config import departures_text, record_protocol
from linmem.training.runs import (
    METRICS,
    RunsRoot,
    collect_metrics,
    ended,
    has,
    read_record,
    run_under,
)

__all__ = [
    "ANY_BOUND",
    "FIGURE4_MODELS",
    "RUN_COLUMNS",
    "SELECTED_RUN_FIELDS",
    "SUMMARY_FIELDS",
    "VARIANT_FIELDS",
    "build_report",
    "figure4_data",
    "markdown_table",
    "of_bound",
    "run_records",
    "selected_name",
    "summary_file_records",
    "summary_records",
    "with_selected_run_fields",
    "write_search_report",
]

RUN_COLUMNS = (
    ("dataset", "data", "{}"),
    ("model", "model", "{}"),
    ("protocol", "protocol", "{}"),
    ("hidden", "hidden", "{}"),
    ("memory", "memory", "{}"),
    ("weight_decay", "weight decay", "{:g}"),
    ("valid_acc", "valid acc %", "{:.2f}"),
    ("valid_acc_frame", "valid acc % (per-frame mean)", "{:.2f}"),
    ("test_acc", "test acc %", "{:.2f}"),
    ("test_nll", "test NLL", "{:.3f}"),
    ("test_acc_frame", "test acc % (per-frame mean)", "{:.2f}"),
    ("test_acc_at_valid_threshold", "test acc % (threshold from valid)", "{:.2f}"),
    ("valid_nll", "valid NLL (selected)", "{:.3f}"),
    ("valid_nll_best", "best valid NLL", "{:.3f}"),
    ("valid_acc_at_best_nll", "valid acc % at best NLL", "{:.2f}"),
    ("n_params", "params", "{}"),
    ("batch_size", "batch", "{}"),
    ("chunk", "chunk", "{}"),
    ("epochs", "epochs", "{}"),
    ("best_epoch", "selected epoch", "{}"),
    ("minutes_to_best", "min to selected", "{:.1f}"),
    ("wall_time_s", "wall s", "{:.0f}"),
)


def markdown_table(records: Sequence[dict], columns=RUN_COLUMNS) -> str:
    """A markdown table of ``records``, then one line per record with its command and commit."""
    lines = ["| run | " + " | ".join(title for _, title, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in records:
        cells = [Path(r["run"]).name]
        for key, _, fmt in columns:
            value = record_protocol(r) if key == "protocol" else r.get(key)
            cells.append("" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in records:
        lines.append(f"- `{r['run']}`: `{r.get('command')}` (commit {r.get('commit')}, seed "
                     f"{r.get('seed')}, data sha256 {r.get('data_sha256')})")
    return "\n".join(lines) + "\n"




SUMMARY_FIELDS = ("dataset", "model", "hidden", "memory", "weight_decay", "valid_acc", "test_acc",
                  "valid_acc_frame", "test_acc_frame", "valid_nll", "test_nll", "test_nll_se",
                  "test_acc_expected", "test_acc_expected_se", "selected_on", "frame_selection",
                  "valid_threshold", "test_acc_at_valid_threshold", "n_params",
                  "epochs", "wall_time_s", "trials", "grid_points", "grid_complete",
                  "points_done", "points_failed", "trials_pruned", "trials_failed", "grid",
                  "command", "commit", "seed",
                  "data_sha256", "search_wall_time_s", "run_dir")


# of_bound's: every memory bound, a report's default
ANY_BOUND = "any"

# what sets a study's configuration apart beyond its model (Table 2 labels its row with them)
VARIANT_FIELDS = ("memory_bound", "overrides")

# scores of a selected run that summary.json files written before them lack
SELECTED_RUN_FIELDS = ("valid_threshold", "test_acc_at_valid_threshold")


def summary_records(records: Sequence[dict]) -> list[dict]:
    """The records of :func:`linmem.experiments.studies.search_records` that have a selected
    configuration, reduced to the fields of ``results/summary.json`` (and the
    :data:`VARIANT_FIELDS` a record sets), sorted by data set and model."""
    order = {m: i for i, m in enumerate(TABLE2_MODELS)}
    rows = [{**{k: r.get(k) for k in SUMMARY_FIELDS},
             **{k: r[k] for k in VARIANT_FIELDS if r.get(k)}}  # where set: older files lack them
            for r in records if "test_acc" in r]
    return sorted(rows, key=lambda r: (TABLE2_DATASETS.index(r["dataset"])
                                       if r["dataset"] in TABLE2_DATASETS else 99,
                                       order.get(r["model"], 99), r["model"]))


def run_records(runs: Sequence[dict]) -> list[dict]:
    """Records like :func:`linmem.experiments.studies.search_records`'s from single runs
    (``metrics.json`` records of :func:`collect_metrics`) of models that had no grid search: per
    (data set, model) the run with the best validation score, ``grid`` ``"runs"``, ``trials`` the
    runs given. The score is the one the runs were selected on (``--select``): the accuracy, or
    the lowest NLL; runs of one model selected on different scores are refused."""
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in runs:
        groups.setdefault((r["dataset"], r["model"]), []).append(r)
    records = []
    for (dataset, model), rs in groups.items():
        selections = {r.get("selected_on", "valid acc") for r in rs}
        if len(selections) > 1:
            raise ValueError(f"runs of {model} on {dataset} were selected on different scores "
                             f"({', '.join(sorted(selections))}): report them apart")
        frame = None
        if selections == {"valid nll"}:
            best = min(rs, key=lambda r: r["valid_nll"])
        else:
            best = max(rs, key=lambda r: r["valid_acc"])
            if all(r.get("valid_acc_frame") is not None for r in rs):
                f = max(rs, key=lambda r: r["valid_acc_frame"])
                frame = {"valid_acc_frame": f["valid_acc_frame"],
                         "test_acc_frame": f["test_acc_frame"], "run_dir": f["run"]}
        records.append({
            **{k: best.get(k) for k in SUMMARY_FIELDS}, "study": None, "dataset": dataset,
            "model": model, "grid": "runs", "grid_points": len(rs), "points_done": len(rs),
            "points_failed": 0, "grid_complete": None, "trials": len(rs), "trials_pruned": 0,
            "trials_failed": 0, "run_dir": best["run"], "trials_run": [],
            "frame_selection": frame, "memory_bound": best.get("memory_bound"),
            "overrides": sorted((best.get("protocol_overrides") or {}).items())})
    return records


def selected_name(record: dict, per_frame: bool = False) -> str:
    """The folder under a report's ``selected/`` that holds a copy of ``record``'s selected run:
    ``DATA-MODEL``, then ``+FIELD=VALUE`` for its memory bound and each protocol field it departs
    from (:func:`linmem.training.config.departures_text`: a bounded selection never takes an
    unbounded one's folder), then ``-per-frame`` for the per-frame column's own selection."""
    departures = dict(record.get("overrides") or ())
    if record.get("memory_bound") is not None:
        departures["memory_bound"] = record["memory_bound"]
    return (f"{record['dataset']}-{record['model']}{departures_text(departures)}"
            + ("-per-frame" if per_frame else ""))


def with_selected_run_fields(record: dict, selected: str | os.PathLike) -> dict:
    """``record`` with the scores it lacks (:data:`SELECTED_RUN_FIELDS`) read from the
    ``metrics.json`` that an earlier report copied to ``selected/`` (:func:`selected_name`),
    when that run is the record's configuration (the same sizes, weight decay and scores): an
    older ``summary.json``, or a study imported from a machine where its run directories
    stayed."""
    m = read_record(Path(selected) / selected_name(record), METRICS)
    if all(record.get(k) is not None for k in SELECTED_RUN_FIELDS) or m is None:
        return record
    if any(m.get(k) != record.get(k) for k in ("hidden", "memory", "weight_decay", "valid_acc",
                                               "test_acc")):
        return record
    return {**record, **{k: m.get(k) for k in SELECTED_RUN_FIELDS if record.get(k) is None}}


def traceable_frame_selection(record: dict, selected: str | os.PathLike) -> dict:
    """``record`` without its per-frame selection (``frame_selection``) where that is another
    run than the global one whose provenance (:data:`linmem._io.PROVENANCE_FIELDS`)
    neither the selection records nor a copy of the run's files beside the summary does
    (``selected/DATA-MODEL-per-frame/metrics.json``, :func:`selected_name`): a score that no
    committed file traces is not shown, and the per-frame cell falls back to the global
    selection's, marked."""
    frame = record.get("frame_selection")
    if (not frame or frame.get("run_dir") == record.get("run_dir")
            or all(frame.get(k) is not None for k in PROVENANCE_FIELDS)):
        return record
    copy = Path(selected) / selected_name(record, per_frame=True)
    return record if has(copy, METRICS) else {**record, "frame_selection": None}


def summary_file_records(path: str | os.PathLike) -> list[dict]:
    """Records of an earlier report's ``summary.json`` (a search whose storage is not at hand),
    in the form of :func:`linmem.experiments.studies.search_records`' for
    :func:`table2_markdown`; marked ``from_summary``, with the trials of the
    ``search_trials.json`` beside it (figure 4). A record without ``frame_selection`` keeps
    none: its per-frame cell falls back to the global selection, marked as such; so does one
    whose per-frame selection's run was not kept (:func:`traceable_frame_selection`). Scores a
    record lacks (an older file) are read from its selected run's ``metrics.json`` that the
    report copied beside it (``selected/DATA-MODEL``), when that run is the record's
    configuration (:data:`SELECTED_RUN_FIELDS`). A complete grid whose every point failed
    selects nothing, so it is not in ``summary.json``: its record, with no score, comes from
    ``search_trials.json`` (:func:`_all_failed`)."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a summary.json ({err})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "dataset" in r
                                             and "model" in r for r in rows):
        raise ValueError(f"{path}: not a summary.json (a list of records with dataset, model)")
    trials_file = Path(path).parent / "search_trials.json"  # written beside it by the report
    studies = ([t for t in json.loads(trials_file.read_text())
                if isinstance(t, dict) and "study" in t] if trials_file.is_file() else [])
    trials = {t["study"]: t.get("trials_run", []) for t in studies}
    records = []
    for r in rows:
        study = r.get("study", f"{r['dataset']}-{r['model']}-{r.get('grid')}")
        done = r.get("points_done", r["grid_points"] if r.get("grid_complete") else None)
        # older files: no point count; a failed trial whose point was done again is no failure
        failed = r.get("points_failed", r.get("trials_failed") or 0)
        if "points_failed" not in r and done is not None:
            failed = min(failed, r["grid_points"] - done)
        r = with_selected_run_fields(r, Path(path).parent / "selected")
        r = traceable_frame_selection(r, Path(path).parent / "selected")
        records.append({
            **r, "study": None if r.get("grid") == "runs" else study,
            "points_done": done, "points_failed": failed,
            "trials_run": trials.get(study, []), "from_summary": str(path)})
    selected = {(r["dataset"], r["model"]) for r in records}
    for t in studies:
        run = t.get("trials_run") or []
        if (t.get("dataset"), t.get("model")) in selected or not t.get("grid_complete") or \
                not run or any(trial.get("state") != "fail" for trial in run):
            continue
        records.append({**{k: t.get(k) for k in ("study", "dataset", "model", "grid", "subset",
                                                  "grid_points", "grid_complete")},
                        "points_done": 0, "points_failed": len({trial.get("point")
                                                                for trial in run}),
                        "trials_run": run, "from_summary": str(path)})
    return records


FIGURE4_MODELS = ("rnn", "lstm", "lmn-b", "pret-lmn-b")


def figure4_data(records: Sequence[dict], dataset: str = "jsb",
                 models: Sequence[str] = FIGURE4_MODELS) -> dict:
    """Validation accuracy against total hidden units (LMN: functional + memory), the best over
    weight decays of the complete trials at each size, per model (the paper's Figure 4). Sizes
    whose every trial was pruned are listed apart (``pruned``), at the best validation accuracy
    reached before the pruner stopped them: a lower bound, not a final score. A model with no
    finished trial has no curve."""
    curves = {}
    for r in records:
        if r["dataset"] != dataset or r["model"] not in models:
            continue
        best: dict[int, dict] = {}
        stopped: dict[int, dict] = {}
        for t in r["trials_run"]:
            units = t["hidden"] + (t["memory"] or 0)
            point = {"units": units, "hidden": t["hidden"], "memory": t["memory"],
                     "weight_decay": t["weight_decay"]}
            if t["state"] == "complete" and t["valid_acc"] is not None:
                if units not in best or t["valid_acc"] > best[units]["valid_acc"]:
                    best[units] = {**point, "valid_acc": t["valid_acc"]}
            elif t["state"] == "pruned" and t.get("best_intermediate_valid_acc") is not None:
                acc = t["best_intermediate_valid_acc"]
                if units not in stopped or acc > stopped[units]["valid_acc"]:
                    stopped[units] = {**point, "valid_acc": acc, "epochs": t.get("epochs")}
        if not best and not stopped:
            continue  # nothing finished yet: no curve (nor a legend entry)
        curves[r["model"]] = {"grid": r["grid"], "grid_complete": r["grid_complete"],
                              "points": [best[u] for u in sorted(best)],
                              "pruned": [stopped[u] for u in sorted(stopped) if u not in best]}
    return {"dataset": dataset, "curves": {m: curves[m] for m in models if m in curves}}


def write_search_report(records: Sequence[dict], out_dir: str | os.PathLike, command: str,
                        runs_root: RunsRoot = ".", baseline: dict | None = None,
                        seeds: Sequence[dict] = (), protocols: Sequence[str] = (),
                        left_out: Sequence[str] = ()) -> None:
    """``out_dir``: ``summary.json``, ``table2.md``, ``figure4.json`` (and ``.png`` when it has a
    curve; JSB Chorales, as the paper's; ``figure4-DATA.json``/``.png`` for each other data set
    with a curve), ``search_trials.json`` (no test scores) and, under ``selected/``, the files
    of each selected run found (search runs under ``runs_root``, single runs where they are):
    ``DATA-MODEL`` the global column's, ``DATA-MODEL-per-frame`` the per-frame column's where
    that is another run, with the selection's bound and departures between
    (:func:`selected_name`). ``protocols``: table2.md's section on both training protocols;
    ``left_out``: the studies of another memory bound than the tables' (:func:`build_report`)."""

    out_dir = Path(out_dir)
    summary = summary_records(records)
    write_json(out_dir / "summary.json", summary)
    with atomic_write(out_dir / "table2.md", "w") as f:
        f.write(table2_markdown(records, command, baseline, seeds, protocols, left_out))
    if seeds:
        write_json(out_dir / "seeds.json", list(seeds))
    for dataset in TABLE2_DATASETS:  # JSB: figure4.png (the paper's); the others beside it
        fig = {**figure4_data(records, dataset), "command": command}
        name = "figure4" if dataset == "jsb" else f"figure4-{dataset}"
        if dataset == "jsb" or fig["curves"]:
            write_json(out_dir / f"{name}.json", fig)
        if fig["curves"]:
            plot_figure4(fig, out_dir / f"{name}.png")
    in_order = sorted(records, key=lambda r: (r.get("study") is None, str(r.get("study")),
                                              r["dataset"], r["model"]))  # not the storage's
    write_json(out_dir / "search_trials.json", [
        {k: v for k, v in r.items() if k in ("study", "dataset", "model", "grid", "subset",
                                              "grid_points", "points_done", "grid_complete",
                                              "trials_run")} for r in in_order])
    for r in summary:
        # the global column's selection, and the per-frame column's where it is another run
        frame_run = (r.get("frame_selection") or {}).get("run_dir")
        for run_dir, per_frame in ((r["run_dir"], False), (frame_run, True)):
            if run_dir is None or (per_frame and run_dir == r["run_dir"]):
                continue
            run = Path(run_dir) if r["grid"] == "runs" else run_under(runs_root, str(run_dir))
            if ended(run):  # its records, as `linmem publish` keeps them
                publish(run, out_dir / "selected" / selected_name(r, per_frame))


def _report_records(storage: str, grid: str | None, runs_root: RunsRoot,
                    out: str | os.PathLike, runs: Sequence[str | os.PathLike],
                    summaries: Sequence[str | os.PathLike], protocol: str | None,
                    memory_bound: float | str | None = ANY_BOUND
                    ) -> tuple[list[dict], list[str]]:
    """The selections a report tables: the studies' in ``storage``, the single ``runs``' and
    those of earlier ``summaries`` that neither has, those with a memory of another
    ``memory_bound`` left out (:func:`of_bound`); and what was left out (:func:`build_report`)."""
    from linmem.experiments.storage import sqlite_path  # optuna: slow to import
    from linmem.experiments.studies import search_records, storage_grids

    database = sqlite_path(storage)
    missing = database is not None and not database.is_file()
    if missing and not (summaries or runs):
        raise ValueError(f"no search database at {database} (run `linmem search` first, or "
                         "pass --storage)")
    records, left_out = of_bound(
        [] if missing else search_records(storage, grid, runs_root, protocol), memory_bound)
    _one_study_a_cell(records, storage)
    # a study imported from another machine: what its run directories held, from the last report
    records = [with_selected_run_fields(r, Path(out) / "selected") if "test_acc" in r else r
               for r in records]
    if not records and not (summaries or runs):
        others = [] if missing else storage_grids(storage)
        hint = (f" (it holds the grid{'s' if len(others) > 1 else ''} {', '.join(others)}: "
                f"pass --grid {others[0]}, or --grid all)" if others else "")
        raise ValueError(f"no study of grid {grid or 'all'!r} in {storage}{hint}")
    if runs:
        searched = {(r["dataset"], r["model"]) for r in records}
        singles, _ = of_bound(run_records(collect_metrics(runs)), memory_bound)
        clash = [f"{r['dataset']}/{r['model']}" for r in singles
                 if (r["dataset"], r["model"]) in searched]
        if clash:
            raise ValueError(f"--run {', '.join(clash)}: these have a search study already")
        records += singles
    for earlier in map(summary_file_records, summaries):
        have = {(r["dataset"], r["model"]) for r in records}
        records += [r for r in of_bound(earlier, memory_bound)[0]
                    if (r["dataset"], r["model"]) not in have]
    return records, left_out


def of_bound(records: Sequence[dict], memory_bound: float | str | None = ANY_BOUND
             ) -> tuple[list[dict], list[str]]:
    """``(kept, left out)``: the records of the models with a linear memory whose bound
    (``memory_bound``, ``None`` the paper's unbounded memory) is another than ``memory_bound``
    are left out (their study's name, else data set and model), every other record kept;
    :data:`ANY_BOUND` keeps them all."""
    if memory_bound == ANY_BOUND:
        return list(records), []
    kept, left_out = [], []
    for r in records:
        if get_spec(r["model"]).has_memory and r.get("memory_bound") != memory_bound:
            left_out.append(r.get("study") or f"{r['dataset']}-{r['model']}")
        else:
            kept.append(r)
    return kept, left_out


def _one_study_a_cell(records: Sequence[dict], storage: str) -> None:
    """Table 2 has one cell per data set and model: two studies of one (another grid, a bounded
    memory, a protocol's departure) would leave one of them out unnamed; refuse them instead."""
    studies: dict[tuple[str, str], list[str]] = {}
    for r in records:
        studies.setdefault((r["dataset"], r["model"]), []).append(r["study"])
    several = [", ".join(sorted(names)) for names in studies.values() if len(names) > 1]
    if several:
        raise ValueError(f"{storage} holds several studies of one data set and model "
                         f"({'; '.join(several)}): Table 2 has one cell for each; report them "
                         "from storages of their own, or choose one grid with --grid")


def _report_inputs(baseline: str | os.PathLike | None, seed_runs: Sequence[str | os.PathLike],
                   compare_seed_runs: Sequence[str | os.PathLike],
                   ablation: str | os.PathLike | None,
                   memory_bound: float | str | None = ANY_BOUND
                   ) -> tuple[dict | None, list[dict], list[dict], dict | None]:
    """``(baseline, seed groups, the other protocol's seed groups, ablation record)`` read
    from :func:`build_report`'s files (the seeds of another ``memory_bound`` left out,
    :func:`of_bound`), a ``ValueError`` naming the option of a bad one."""
    try:
        calibration = read_json(baseline) if baseline is not None else None
        if calibration is not None and "scores" not in calibration:
            raise ValueError("no 'scores' in it")
    except ValueError as err:  # JSONDecodeError is one
        raise ValueError(f"--baseline {baseline}: not a baseline file ({err})") from None
    try:
        seeds = (seed_groups(of_bound(collect_metrics(seed_runs, diverged=True),
                                      memory_bound)[0]) if seed_runs else [])
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"--seed-runs: {err}") from None
    try:
        other_seeds = (seed_groups(collect_metrics(compare_seed_runs, diverged=True))
                       if compare_seed_runs else [])
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"--compare-seed-runs: {err}") from None
    try:
        ablation_record = read_json(ablation) if ablation is not None else None
        if ablation_record is not None and not (ablation_record.get("factors")
                                                or ablation_record.get("pruner")):
            raise ValueError("neither 'factors' nor 'pruner' in it")
    except (ValueError, AttributeError) as err:  # JSONDecodeError is a ValueError
        raise ValueError(f"--ablation {ablation}: not `linmem ablation`'s ablation.json "
                         f"({err})") from None
    return calibration, seeds, other_seeds, ablation_record


def build_report(storage: str, grid: str | None, runs_root: RunsRoot,
                 out: str | os.PathLike, runs: Sequence[str | os.PathLike] = (),
                 summaries: Sequence[str | os.PathLike] = (),
                 seed_runs: Sequence[str | os.PathLike] = (),
                 baseline: str | os.PathLike | None = None, protocol: str | None = None,
                 compare: str | os.PathLike | None = None,
                 command: str | None = None,
                 compare_seed_runs: Sequence[str | os.PathLike] = (),
                 ablation: str | os.PathLike | None = None,
                 memory_bound: float | str | None = ANY_BOUND) -> list[dict]:
    """``linmem report``: select each (data set, model) of the studies of ``grid`` (None: all)
    in ``storage`` trained under ``protocol`` (None: the one they were trained under,
    :func:`linmem.experiments.studies.storage_protocol`) on validation
    (:func:`linmem.experiments.studies.search_records`), add the single runs ``runs`` (data set
    and model without a study), the selections of earlier reports' ``summaries`` that the
    storage lacks, the seed runs
    ``seed_runs`` and the previous-frame ``baseline``, and write ``out``
    (:func:`write_search_report`; with ``compare``, another protocol's ``summary.json``, also
    ``protocols.md``; with ``compare_seed_runs``, the other protocol's seed runs, also
    ``protocol-choice.md``/``.json`` (not with a ``memory_bound``: the choice compares the
    paper's memory under both protocols), :mod:`linmem.experiments.protocol_choice`; either, or
    ``ablation``,
    ``linmem ablation``'s ``ablation.json``, adds the section on both protocols to
    ``table2.md``: :func:`both_protocols_lines`). ``memory_bound``: the LMNs' rows and seeds
    from the studies and runs of this bound (``None``: the paper's unbounded memory), the others
    left out and named (:func:`of_bound`; :data:`ANY_BOUND`: all, one study a cell). ``runs_root``:
    where the search ran, or several such folders searched in order. Returns the selections;
    ``ValueError`` names a bad input."""
    if protocol is None:
        from linmem.experiments.studies import storage_protocol  # optuna: slow to import

        protocol = storage_protocol(storage, grid)
    records, left_out = _report_records(storage, grid, runs_root, out, runs, summaries,
                                        protocol, memory_bound)
    calibration, seeds, other_seeds, ablation_record = _report_inputs(
        baseline, seed_runs, compare_seed_runs, ablation, memory_bound)
    other = summary_file_records(compare) if compare is not None else []
    paper, linmem = (records, other) if protocol == "paper" else (other, records)
    protocols = []
    if compare is not None or other_seeds or ablation_record:
        sources = "; ".join(f"{what} `{path}`" for what, path in (
            ("selections", compare), ("seeds", ", ".join(map(str, compare_seed_runs))),
            ("ablation", ablation)) if path)
        protocols = both_protocols_lines(paper, linmem, protocol, other_seeds,
                                         ablation_record, sources)
    command = command or command_line()
    write_search_report(records, Path(out), command, runs_root, calibration, seeds, protocols,
                        left_out)
    if compare is not None:  # the other protocol's selections beside these
        with atomic_write(Path(out) / "protocols.md", "w") as f:
            f.write(protocols_markdown(paper, linmem, command))
    # which protocol linmem train uses by default: a choice made on both protocols' seeds of
    # the paper's memory, never rewritten from one side's bounded seeds
    if compare_seed_runs and memory_bound in (ANY_BOUND, None):
        paper_seeds, linmem_seeds = ((seeds, other_seeds) if protocol == "paper"
                                     else (other_seeds, seeds))
        choice = {**protocol_choice(paper_seeds, linmem_seeds), "command": command}
        write_json(Path(out) / "protocol-choice.json", choice)
        with atomic_write(Path(out) / "protocol-choice.md", "w") as f:
            f.write(protocol_choice_markdown(choice, command))
    return records
