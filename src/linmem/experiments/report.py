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
    made_by,
    read_json,
    write_json,
)
from linmem.experiments.paper import (
    PAPER_TABLE2,
    TABLE2_DATASETS,
    TABLE2_MODELS,
    TABLE2_TITLES,
)
from linmem.experiments.plots import plot_figure4
from linmem.experiments.protocol_choice import (
    protocol_choice,
    protocol_choice_markdown,
    ranges_apart,
)
from linmem.experiments.seed_groups import failures_text, seed_groups, seeds_lines, spread_text
from linmem.metrics import THRESHOLD_GRID
from linmem.models import display_name
from linmem.training.config import LEGACY_PROTOCOL
from linmem.training.runs import METRICS, collect_metrics, ended, has, publish, read_record

__all__ = [
    "FIGURE4_MODELS",
    "PROTOCOL_TITLES",
    "RUN_COLUMNS",
    "SELECTED_RUN_FIELDS",
    "SUMMARY_FIELDS",
    "ablation_markdown",
    "ablation_record_markdown",
    "both_protocols_lines",
    "build_report",
    "figure4_data",
    "markdown_table",
    "protocols_markdown",
    "pruner_markdown",
    "run_records",
    "summary_file_records",
    "summary_records",
    "table2_markdown",
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


# what a run's record without the field held: a run from before protocols had names trained
# under linmem's
RUN_DEFAULTS = {"protocol": LEGACY_PROTOCOL}


def markdown_table(records: Sequence[dict], columns=RUN_COLUMNS) -> str:
    """A markdown table of ``records``, then one line per record with its command and commit."""
    lines = ["| run | " + " | ".join(title for _, title, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in records:
        cells = [Path(r["run"]).name]
        for key, _, fmt in columns:
            value = r.get(key)
            value = RUN_DEFAULTS.get(key) if value is None else value
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


# scores of a selected run that summary.json files written before them lack
SELECTED_RUN_FIELDS = ("valid_threshold", "test_acc_at_valid_threshold")


def summary_records(records: Sequence[dict]) -> list[dict]:
    """The records of :func:`linmem.experiments.studies.search_records` that have a selected
    configuration,
    reduced to the fields of ``results/summary.json``, sorted by data set and model."""
    order = {m: i for i, m in enumerate(TABLE2_MODELS)}
    rows = [{k: r.get(k) for k in SUMMARY_FIELDS} for r in records if "test_acc" in r]
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
            "frame_selection": frame})
    return records


def with_selected_run_fields(record: dict, selected: str | os.PathLike) -> dict:
    """``record`` with the scores it lacks (:data:`SELECTED_RUN_FIELDS`) read from the
    ``metrics.json`` that an earlier report copied to ``selected/DATA-MODEL``, when that run is
    the record's configuration (the same sizes, weight decay and scores): an older
    ``summary.json``, or a study imported from a machine where its run directories stayed."""
    m = read_record(Path(selected) / f"{record['dataset']}-{record['model']}", METRICS)
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
    (``selected/DATA-MODEL-per-frame/metrics.json``): a score that no committed file traces is
    not shown, and the per-frame cell falls back to the global selection's, marked."""
    frame = record.get("frame_selection")
    if (not frame or frame.get("run_dir") == record.get("run_dir")
            or all(frame.get(k) is not None for k in PROVENANCE_FIELDS)):
        return record
    copy = Path(selected) / f"{record['dataset']}-{record['model']}-per-frame"
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


FAILED_MARK = "✗"
FAILED_TEXT = ("✗: every point of the grid failed with an error (a training that diverged "
               "before its first epoch ended keeps nothing): no score.")


def _all_failed(records: Sequence[dict]) -> set[tuple[str, str]]:
    """The (data set, model) of the complete grids with no score because every point failed
    with an error: not 'not run'."""
    return {(r["dataset"], r["model"]) for r in records
            if r.get("test_acc") is None and r.get("grid_complete") and r.get("points_failed")
            and not r.get("points_done")}


def _cell(value: float | None, top: float | None, mark: str = "") -> str:
    """A figure of Table 2 with its marks, bold where it is the column's best (never a reduced
    search's, ``¶``)."""
    if value is None:
        return "–"
    text = f"{value:.2f}" + mark
    reduced = "¶" in mark  # never bold beside the paper's figures
    return (f"**{text}**" if top is not None and round(value, 2) == round(top, 2)
            and not reduced else text)


def _column_score(r: dict, key: str) -> float | None:
    """A record's figure for column ``key``: the per-frame column's own selection where it has
    one, else the record's (the per-frame mean of the global selection, marked §)."""
    if key == "test_acc_frame" and r.get("frame_selection"):  # the column's own selection
        return r["frame_selection"]["test_acc_frame"]
    return r.get(key)


def _cell_mark(r: dict | None, key: str) -> str:
    """The marks of a record's cell: ‡ single runs, † an incomplete grid, ¶ a reduced search,
    § a per-frame figure of the global selection, and the threshold chosen on validation."""
    if r is None:
        return ""
    mark = "‡" if r["grid"] == "runs" else "" if r["grid_complete"] else "†"
    if r.get("reduced"):
        mark += "¶"
    if key == "test_acc_frame" and not r.get("frame_selection"):
        mark += "§"
    if key == "test_acc_at_valid_threshold" and r.get("valid_threshold") is not None:
        mark += f" ({r['valid_threshold']:.2f})"
    return mark


class _Table2:
    """What Table 2's tables share: our records by (data set, model), the grids where every
    point failed, the models in the table's order, the published figures and the
    previous-frame baseline."""

    def __init__(self, records: Sequence[dict], baseline: dict | None) -> None:
        self.ours = {(r["dataset"], r["model"]): r for r in records if "test_acc" in r}
        self.failed = _all_failed(records)
        models = [m for m in TABLE2_MODELS
                  if m in PAPER_TABLE2 or any(k[1] == m for k in self.ours)]
        self.models = models + sorted({m for _, m in self.ours} - set(models))
        self.published = {d: {m: PAPER_TABLE2[m][i] if m in PAPER_TABLE2 else None
                              for m in self.models} for i, d in enumerate(TABLE2_DATASETS)}
        self.baseline = baseline

    def table(self, key: str, ours_title: str, paper: bool = True) -> list[str]:
        """The table of our ``key`` per model and data set, beside the published figures
        (``paper``), the previous-frame row under it for an accuracy."""
        head = "| model | " + " | ".join(
            (f"{TABLE2_TITLES[d]} (paper) | " if paper else "") + f"{TABLE2_TITLES[d]} "
            f"({ours_title})" for d in TABLE2_DATASETS) + " |"
        rows = [head, "|---|" + "---:|" * ((2 if paper else 1) * len(TABLE2_DATASETS))]
        measured = {d: {m: _column_score(self.ours[(d, m)], key) if (d, m) in self.ours
                        else None for m in self.models} for d in TABLE2_DATASETS}
        pick = min if key == "test_nll" else max
        top_ours = {d: pick([v for v in measured[d].values() if v is not None], default=None)
                    for d in TABLE2_DATASETS}
        top_pub = {d: max([v for v in self.published[d].values() if v is not None],
                          default=None) for d in TABLE2_DATASETS}
        for m in self.models:
            cells = []
            for d in TABLE2_DATASETS:
                r = self.ours.get((d, m))
                if paper:
                    cells.append(_cell(self.published[d][m], top_pub[d]))
                cells.append(FAILED_MARK if r is None and (d, m) in self.failed else
                             _cell(measured[d][m], top_ours[d], _cell_mark(r, key)))
            rows.append(f"| {display_name(m)} | " + " | ".join(cells) + " |")
        if self.baseline is not None and key in ("test_acc", "test_acc_frame",
                                                 "test_acc_at_valid_threshold"):
            field = "acc_frame" if key == "test_acc_frame" else "acc"  # 0/1: any threshold
            cells = []
            for d in TABLE2_DATASETS:
                if paper:
                    cells.append("–")
                value = self.baseline["scores"].get(d, {}).get("test", {}).get(field)
                cells.append("–" if value is None else f"{value:.2f}")
            rows.append("| previous frame (no training) | " + " | ".join(cells) + " |")
        return rows

    def accuracy_lines(self) -> list[str]:
        """The global accuracy's table, what its marks mean, then the per-frame mean's."""
        lines = self.table("test_acc", "ours")
        frame_rows = self.table("test_acc_frame", "ours, per-frame mean")
        # a mark is explained only where a cell carries it
        incomplete = any("†" in r for r in lines)
        frame_from_global = any("§" in r for r in frame_rows)
        reductions = sorted({f"{r['model']} on {r['dataset']}: {', '.join(r['reduced'])}"
                             for r in self.ours.values() if r.get("reduced")})
        return [
            *lines, "",
            "Test frame accuracy in % (Bay et al. 2009, global, threshold 0.5; equal to "
            "mir_eval's multipitch accuracy: our headline) of the configuration selected on "
            "validation accuracy. *RNN-RBM: the paper quotes Boulanger-Lewandowski et al. "
            "(2012), whose figures are expected accuracies over samples of the model."
            + (" †: selected from a grid that is not complete yet." if incomplete else "")
            + (" ¶: from a reduced search (" + "; ".join(reductions) + "): not comparable "
               "with the paper's figures, and never bold." if reductions else "")
            + " ‡: not a grid search: the best on validation of the runs listed below. "
            + (FAILED_TEXT + " " if self.failed else "") + "–: not run. Bold: the best "
            "published and the best of ours per data set." + (
                " The previous-frame row predicts each frame to be the one before (no "
                "training): it calibrates every other row." if self.baseline else ""), "",
            "The per-frame mean of TP / (TP + FP + FN) (`frame_accuracy(..., "
            "average=\"frame\")`; the definition of the authors' code in the paper's period, "
            "see `results/search.md`: the figure to compare with the paper's), each "
            "configuration selected on validation under this definition"
            + (" (§: selected on the global accuracy instead: the grid's per-frame "
               "validation scores were not kept, or the run they select was not committed "
               "with its provenance)" if frame_from_global else "") + ":", "",
            *frame_rows]

    def expected_lines(self) -> list[str]:
        """The expected accuracies (sampled from the model) where a record has them."""
        expected = [m for m in self.models if any(
            self.ours.get((d, m), {}).get("test_acc_expected") is not None
            for d in TABLE2_DATASETS)]
        if not expected:
            return []
        lines = ["", "Expected accuracy (Boulanger-Lewandowski et al. 2012: the mean over frames "
                 "drawn from the model at each step of TP / (TP + FP + FN), the definition of "
                 "the RNN-RBM figures the paper quotes; `linmem evaluate RUN --expected N`), "
                 "test, ± its standard error over the draws, of the configurations of the "
                 "first table:", "",
                 "| model | " + " | ".join(f"{TABLE2_TITLES[d]} (quoted) | {TABLE2_TITLES[d]} "
                                          "(ours, expected)" for d in TABLE2_DATASETS) + " |",
                 "|---|" + "---:|" * (2 * len(TABLE2_DATASETS))]
        for m in expected:
            cells = []
            for d in TABLE2_DATASETS:
                r = self.ours.get((d, m), {})
                quoted = self.published[d][m] if m == "rnn-rbm" else None
                cells.append("–" if quoted is None else f"{quoted:.2f}")
                cells.append("–" if r.get("test_acc_expected") is None else
                             f"{r['test_acc_expected']:.2f} ± {r['test_acc_expected_se']:.2f}")
            lines.append(f"| {display_name(m)} | " + " | ".join(cells) + " |")
        return lines

    def threshold_lines(self) -> list[str]:
        """The global accuracy at the threshold chosen on validation, where records have it."""
        if not any(r.get("test_acc_at_valid_threshold") is not None
                   for r in self.ours.values()):
            return []
        grid = ", ".join(map(str, THRESHOLD_GRID))
        at_top = any(r.get("valid_threshold") == max(THRESHOLD_GRID) for r in self.ours.values())
        return ["", "The global accuracy of the first table's configurations with the "
                f"decision threshold chosen on validation (in parentheses; one of {grid}) "
                "instead of 0.5, the configurations unchanged: how much of the gap to the "
                "previous-frame row is the threshold's (the test split takes no part in the "
                "choice)" + (f"; a model that picks {max(THRESHOLD_GRID)}, the grid's top, "
                             "might score more above it" if at_top else "") + ":", "",
                *self.table("test_acc_at_valid_threshold", "ours, threshold from valid",
                            paper=False)]


def _coverage_lines(records: Sequence[dict]) -> list[str]:
    """How much of each grid was run, per data set."""
    lines = ["", "Grid coverage (points run of the grid; pruned points were stopped early by "
             "the median pruner on validation accuracy):", ""]
    by_data: dict[str, list[dict]] = {}
    for r in records:
        by_data.setdefault(r["dataset"], []).append(r)
    for d in TABLE2_DATASETS:
        rs = sorted(by_data.get(d, []), key=lambda r: r["model"])
        if not rs:
            lines.append(f"- {TABLE2_TITLES[d]}: nothing run yet.")
            continue
        parts = [f"{r['model']} ({r['trials']} single run{'s' if r['trials'] > 1 else ''}, "
                 f"selected `{r['run_dir']}`)" if r["grid"] == "runs" else
                 f"{r['model']} ({r['grid']}) {r['points_done']}/{r['grid_points']}"
                 + (" complete" if r["grid_complete"] else "")
                 + (f", {r['trials_pruned']} pruned" if r.get("trials_pruned") else "")
                 + (f", {r['points_failed']} failed" if r.get("points_failed") else "")
                 + (f", from `{r['from_summary']}`" if r.get("from_summary") else "")
                 for r in rs]
        lines.append(f"- {TABLE2_TITLES[d]}: " + "; ".join(parts) + ".")
    return lines


def table2_markdown(records: Sequence[dict], command: str | None = None,
                    baseline: dict | None = None, seeds: Sequence[dict] = (),
                    protocols: Sequence[str] = ()) -> str:
    """The paper's Table 2 with our test accuracy next to each published figure, under the
    global accuracy and the per-frame mean, each column's configuration selected on validation
    under its own definition; bold marks the best of each column pair's kind (published, ours)
    per data set. Then the test NLL of the selected runs, and how much of each grid was run.
    ``baseline``: the previous-frame baseline (``results/baseline.json``, :func:`
    previous_frame_report`), a row of its own. ``seeds``: :func:`seed_groups` of the selected
    configurations re-run with other seeds, a table of their spread. ``protocols``: the
    section on both training protocols (:func:`both_protocols_lines`), after the grids'
    coverage."""
    tables = _Table2(records, baseline)
    lines = tables.accuracy_lines() + tables.expected_lines() + tables.threshold_lines()
    lines += ["", "Test NLL in nats per time step of the configurations of the first table "
              "(the paper reports none; the RNN-RBM's is an AIS estimate):", ""]
    lines += tables.table("test_nll", "ours", paper=False)
    if seeds:
        lines += ["", "Seeds (`linmem reseed`): the selected configurations trained again with "
                  "other seeds:", ""]
        lines += seeds_lines(seeds)
    lines += _coverage_lines(records)
    lines += protocols
    if command:
        lines += ["", f"Generated by `{command}` from the search studies; each selected run's "
                  "command, commit, seed and data checksum are in `summary.json`."]
    return "\n".join(lines) + "\n"


FIGURE4_MODELS = ("rnn", "lstm", "lmn-b", "pret-lmn-b")


def protocols_markdown(paper: Sequence[dict], linmem: Sequence[dict],
                       command: str | None = None) -> str:
    """Table 2 under both training protocols side by side: per data set and model
    the paper's figure, ours under the paper's protocol (the per-frame mean first: the paper's
    metric; the global accuracy beside it) and ours under linmem's, each cell the test accuracy
    of the configuration selected on that accuracy's validation score. ``paper`` and ``linmem``
    are the two reports' records (:func:`linmem.experiments.studies.search_records`,
    :func:`summary_file_records`)."""
    return "\n".join(_protocols_lines(paper, linmem) + made_by(command)) + "\n"


def _protocols_lines(paper: Sequence[dict], linmem: Sequence[dict]) -> list[str]:
    def by_key(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
        return {(r["dataset"], r["model"]): r for r in records if r.get("test_acc") is not None}

    def cells(r: dict | None, failed: bool) -> list[str]:
        if r is None:
            return [FAILED_MARK if failed else "–"] * 2
        mark = "" if r.get("grid") == "runs" or r.get("grid_complete") else "†"
        frame = (r.get("frame_selection") or {}).get("test_acc_frame")
        return [("–" if frame is None else f"{frame:.2f}{mark}"), f"{r['test_acc']:.2f}{mark}"]

    ours, theirs = by_key(paper), by_key(linmem)
    ours_failed, theirs_failed = _all_failed(paper), _all_failed(linmem)
    failed = ours_failed | theirs_failed
    lines = ["| data set | model | paper | paper protocol: per-frame | global | "
             "linmem protocol: per-frame | global |", "|---|---|---:|---:|---:|---:|---:|"]
    for i, d in enumerate(TABLE2_DATASETS):
        for m in TABLE2_MODELS:
            if (d, m) not in ours and (d, m) not in theirs and (d, m) not in failed:
                continue
            published = PAPER_TABLE2[m][i] if m in PAPER_TABLE2 else None
            lines.append(f"| {TABLE2_TITLES[d]} | {display_name(m)} | "
                         + ("–" if published is None else f"{published:.2f}") + " | "
                         + " | ".join(cells(ours.get((d, m)), (d, m) in ours_failed)
                                      + cells(theirs.get((d, m)), (d, m) in theirs_failed))
                         + " |")
    lines += ["", "Test frame accuracy in %: the per-frame mean of TP / (TP + FP + FN) (the "
              "metric of the paper's code) and the global one (Bay et al., mir_eval's), each of "
              "the configuration selected on that accuracy's validation score. The paper "
              "protocol: batch 1, BCE averaged over keys and frames, clip 10, the readout's "
              "default initialisation, early stopping on the per-frame accuracy, no pruning; "
              "linmem's: batch 4, the NLL summed over keys, clip 5, the readout bias at the keys' "
              "rates, early stopping on the global accuracy, the median pruner. †: selected "
              "from a grid that is not complete yet. " + (FAILED_TEXT + " " if failed else "")
              + "–: not run."]
    return lines


def _ablation_delta(a: dict, key: str) -> str:
    """The variant's mean against the base's, and whether their seeds' ranges overlap."""
    x, y = a["base"].get(key), a["variant"].get(key)
    if x is None or y is None:
        return "–"
    change = f"{y['mean'] - x['mean']:+.2f}"
    if min(x["n"], y["n"]) < 2:  # a single seed has no range to part from another
        return f"{change} (one seed so far)"
    return change + (" (ranges apart)" if ranges_apart(x, y) else "")


def _ablation_seeds(g: dict) -> str:
    text = ", ".join(map(str, g["seeds"]))
    if g.get("diverged_seeds"):
        text += f" ({failures_text(g)})"
    return text


def ablation_markdown(rows: Sequence[dict], command: str | None = None,
                      at: str | None = None) -> str:
    """:func:`linmem.experiments.ablation.ablation_groups` as a table: each configuration's own
    seeds, then one row per factor changed alone; test accuracy per-frame mean (the paper's
    metric) and global."""
    lines = ["| data | model | size, weight decay | changed alone | seeds | test acc % "
             "(per-frame mean) | change | test acc % (global) | change |",
             "|---|---|---|---|---|---:|---:|---:|---:|"]
    shown: set[str] = set()  # each base once (rows read back from ablation.json share none)
    for a in rows:
        b, v = a["base"], a["variant"]
        size = f"({b['hidden']}" + (f", {b['memory']}" if b.get("memory") else "") + ")"
        head = (f"| {TABLE2_TITLES.get(a['dataset'], a['dataset'])} | {a['model']} | "
                f"{size}, {b['weight_decay']:g} |")
        if (key := json.dumps(b, sort_keys=True)) not in shown:
            shown.add(key)
            lines.append(f"{head} – (as selected) | {_ablation_seeds(b)} | "
                         f"{spread_text(b, 'test_acc_frame')} | | {spread_text(b, 'test_acc')} | |")
        change = ", ".join(f"{f} {a['base_values'][f]} → {value}"
                           for f, value in a["factor"].items())
        lines.append(f"{head} {change} | {_ablation_seeds(v)} | "
                     f"{spread_text(v, 'test_acc_frame')} | "
                     f"{_ablation_delta(a, 'test_acc_frame')} | {spread_text(v, 'test_acc')} | "
                     f"{_ablation_delta(a, 'test_acc')} |")
    lines += ["", "Mean ± standard deviation (minimum-maximum) over the seeds; a change is the "
              "difference of the means, \"ranges apart\" where the seeds' ranges do not overlap "
              "(two seeds or more on each side; a seed that diverged, with no score, is named "
              "and left out)."]
    return "\n".join(lines + made_by(command, at)) + "\n"


def pruner_markdown(replays: Sequence[tuple[str, dict]], warmup: int,
                    command: str | None = None, at: str | None = None) -> str:
    """The :func:`linmem.experiments.ablation.replay_pruner` of each ``(study, replay)``: the
    selection with and without the stops."""
    lines = ["| study | trials | stopped | epochs saved | selected, every run to its end: "
             "point, test acc % per-frame (global) | selected with the pruner |",
             "|---|---:|---:|---:|---|---|"]

    def sel(t: dict | None) -> str:
        if t is None:
            return "–"
        glob = "–" if t["test_acc"] is None else f"{t['test_acc']:.2f}"
        frame = "–" if t["test_acc_frame"] is None else f"{t['test_acc_frame']:.2f}"
        return f"{t['point']}: {frame} ({glob})"

    for study, r in replays:
        same = (r["selected"] or {}).get("number") == (r["selected_pruned"] or {}).get("number")
        saved = "–" if r["epochs_saved"] is None else f"{100 * r['epochs_saved']:.0f} %"
        lines.append(f"| {study} | {r['trials']} | {len(r['stopped'])} | {saved} | "
                     f"{sel(r['selected'])} | "
                     f"{'the same' if same else sel(r['selected_pruned'])} |")
    lines += ["", f"The median pruner (from epoch {warmup}) replayed on the grid's finished runs, "
              "each against all the others as if they had finished before it (a search's "
              "pruner sees only those finished by then, after its first few): a run stops at "
              "the first epoch where its best validation score so far is below the median of "
              "the others' at that epoch. The selection is on validation (the runs' own "
              "score), among the runs that were not stopped."]
    return "\n".join(lines + made_by(command, at)) + "\n"


def ablation_record_markdown(record: dict, heading: str = "##") -> str:
    """An ablation's record (``ablation.json``,
    :func:`linmem.experiments.ablation.write_ablation`) as Markdown, its command left out: the
    factors' table (:func:`ablation_markdown`) and the pruner's (:func:`pruner_markdown`), each
    under a ``heading`` of its own."""
    parts = []
    if record.get("factors"):
        parts += [f"{heading} A part of training changed alone", "",
                  ablation_markdown(record["factors"])]
    if record.get("pruner"):
        pruner = record["pruner"]
        parts += [f"{heading} The median pruner", "", pruner_markdown(
            [(s["study"], s) for s in pruner["studies"]], pruner["warmup"])]
    return "\n".join(parts)


PROTOCOL_TITLES = {"paper": "the paper's protocol", "linmem": "linmem's protocol"}


def both_protocols_lines(paper: Sequence[dict], linmem: Sequence[dict], protocol: str,
                         other_seeds: Sequence[dict] = (), ablation: dict | None = None,
                         sources: str = "") -> list[str]:
    """Table 2's section on both training protocols, in the report of ``protocol``
    ('paper' or 'linmem'): each protocol's records side by side
    (:func:`protocols_markdown`), the other protocol's seeds (:func:`seed_groups`: their spread,
    the paper's claims and whether its figures are reached) and an ablation's record (``linmem
    ablation``'s ``ablation.json``) of the paper protocol's parts; ``sources`` names where
    they come from."""
    if protocol not in PROTOCOL_TITLES:
        raise ValueError(f"both protocols side by side: the report's protocol must be one of "
                         f"{', '.join(PROTOCOL_TITLES)}, not {protocol!r}")
    other_title = PROTOCOL_TITLES["linmem" if protocol == "paper" else "paper"]
    lines = ["", "## Both training protocols", "",
             f"The tables above were trained under {PROTOCOL_TITLES[protocol]}; here they are "
             f"beside {other_title}'s" + (f" ({sources})" if sources else "") + ":", "",
             *_protocols_lines(paper, linmem)]
    if other_seeds:
        lines += ["", f"Seeds under {other_title}: its selected configurations trained again "
                  "with other seeds:", "", *seeds_lines(other_seeds)]
    if ablation:
        made = f" (made by `{ablation['command']}`" + (
            f" at commit {ablation['commit']}" if ablation.get("commit") else "") + ")"
        lines += ["", "Which parts of the paper's protocol carry its result, one factor at a "
                  f"time{made}:", "", ablation_record_markdown(ablation, "###").rstrip("\n")]
    return lines


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
                        runs_root: str | os.PathLike = ".", baseline: dict | None = None,
                        seeds: Sequence[dict] = (), protocols: Sequence[str] = ()) -> None:
    """``out_dir``: ``summary.json``, ``table2.md``, ``figure4.json`` (and ``.png`` when it has a
    curve; JSB Chorales, as the paper's; ``figure4-DATA.json``/``.png`` for each other data set
    with a curve), ``search_trials.json`` (no test scores) and, under ``selected/``, the files
    of each selected run found (search runs under ``runs_root``, single runs where they are):
    ``DATA-MODEL`` the global column's, ``DATA-MODEL-per-frame`` the per-frame column's where
    that is another run. ``protocols``: table2.md's section on both training protocols."""

    out_dir = Path(out_dir)
    summary = summary_records(records)
    write_json(out_dir / "summary.json", summary)
    with atomic_write(out_dir / "table2.md", "w") as f:
        f.write(table2_markdown(records, command, baseline, seeds, protocols))
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
        for run_dir, suffix in ((r["run_dir"], ""), (frame_run, "-per-frame")):
            if run_dir is None or (suffix and run_dir == r["run_dir"]):
                continue
            run = Path(run_dir) if r["grid"] == "runs" else Path(runs_root) / str(run_dir)
            if ended(run):  # its records, as `linmem publish` keeps them
                publish(run, out_dir / "selected" / f"{r['dataset']}-{r['model']}{suffix}")


def _report_records(storage: str, grid: str | None, runs_root: str | os.PathLike,
                    out: str | os.PathLike, runs: Sequence[str | os.PathLike],
                    summaries: Sequence[str | os.PathLike], protocol: str | None) -> list[dict]:
    """The selections a report tables: the studies' in ``storage``, the single ``runs``' and
    those of earlier ``summaries`` that neither has (:func:`build_report`)."""
    from linmem.experiments.grids import sqlite_path  # optuna: slow to import
    from linmem.experiments.studies import search_records, storage_grids

    database = sqlite_path(storage)
    missing = database is not None and not database.is_file()
    if missing and not (summaries or runs):
        raise ValueError(f"no search database at {database} (run `linmem search` first, or "
                         "pass --storage)")
    records = [] if missing else search_records(storage, grid, runs_root, protocol)
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
        singles = run_records(collect_metrics(runs))
        clash = [f"{r['dataset']}/{r['model']}" for r in singles
                 if (r["dataset"], r["model"]) in searched]
        if clash:
            raise ValueError(f"--run {', '.join(clash)}: these have a search study already")
        records += singles
    for earlier in map(summary_file_records, summaries):
        have = {(r["dataset"], r["model"]) for r in records}
        records += [r for r in earlier if (r["dataset"], r["model"]) not in have]
    return records


def _report_inputs(baseline: str | os.PathLike | None, seed_runs: Sequence[str | os.PathLike],
                   compare_seed_runs: Sequence[str | os.PathLike],
                   ablation: str | os.PathLike | None
                   ) -> tuple[dict | None, list[dict], list[dict], dict | None]:
    """``(baseline, seed groups, the other protocol's seed groups, ablation record)`` read
    from :func:`build_report`'s files, a ``ValueError`` naming the option of a bad one."""
    try:
        calibration = read_json(baseline) if baseline is not None else None
        if calibration is not None and "scores" not in calibration:
            raise ValueError("no 'scores' in it")
    except ValueError as err:  # JSONDecodeError is one
        raise ValueError(f"--baseline {baseline}: not a baseline file ({err})") from None
    try:
        seeds = seed_groups(collect_metrics(seed_runs, diverged=True)) if seed_runs else []
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


def build_report(storage: str, grid: str | None, runs_root: str | os.PathLike,
                 out: str | os.PathLike, runs: Sequence[str | os.PathLike] = (),
                 summaries: Sequence[str | os.PathLike] = (),
                 seed_runs: Sequence[str | os.PathLike] = (),
                 baseline: str | os.PathLike | None = None, protocol: str | None = None,
                 compare: str | os.PathLike | None = None,
                 command: str | None = None,
                 compare_seed_runs: Sequence[str | os.PathLike] = (),
                 ablation: str | os.PathLike | None = None) -> list[dict]:
    """``linmem report``: select each (data set, model) of the studies of ``grid`` (None: all)
    in ``storage`` trained under ``protocol`` (None: the one they were trained under,
    :func:`linmem.experiments.studies.storage_protocol`) on validation
    (:func:`linmem.experiments.studies.search_records`), add the single runs ``runs`` (data set
    and model without a study), the selections of earlier reports' ``summaries`` that the
    storage lacks, the seed runs
    ``seed_runs`` and the previous-frame ``baseline``, and write ``out``
    (:func:`write_search_report`; with ``compare``, another protocol's ``summary.json``, also
    ``protocols.md``; with ``compare_seed_runs``, the other protocol's seed runs, also
    ``protocol-choice.md``/``.json``: :mod:`linmem.experiments.protocol_choice`; either, or
    ``ablation``,
    ``linmem ablation``'s ``ablation.json``, adds the section on both protocols to
    ``table2.md``: :func:`both_protocols_lines`). Returns the selections; ``ValueError`` names
    a bad input."""
    if protocol is None:
        from linmem.experiments.studies import storage_protocol  # optuna: slow to import

        protocol = storage_protocol(storage, grid)
    records = _report_records(storage, grid, runs_root, out, runs, summaries, protocol)
    calibration, seeds, other_seeds, ablation_record = _report_inputs(
        baseline, seed_runs, compare_seed_runs, ablation)
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
    write_search_report(records, Path(out), command, runs_root, calibration, seeds, protocols)
    if compare is not None:  # the other protocol's selections beside these
        with atomic_write(Path(out) / "protocols.md", "w") as f:
            f.write(protocols_markdown(paper, linmem, command))
    if compare_seed_runs:  # which protocol linmem train uses by default
        paper_seeds, linmem_seeds = ((seeds, other_seeds) if protocol == "paper"
                                     else (other_seeds, seeds))
        choice = {**protocol_choice(paper_seeds, linmem_seeds), "command": command}
        write_json(Path(out) / "protocol-choice.json", choice)
        with atomic_write(Path(out) / "protocol-choice.md", "w") as f:
            f.write(protocol_choice_markdown(choice, command))
    return records
