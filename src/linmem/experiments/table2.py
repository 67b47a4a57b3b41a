"""Table 2 of the paper with our figures: the test accuracy (global and per-frame) and NLL of the
configuration selected on validation for each data set and model, beside the published figures,
with the marks that say how far each figure can be trusted (an incomplete grid, a reduced
search, a single run, a per-frame figure of the global selection) and the seeds' spread
(:func:`table2_markdown`; :func:`linmem.experiments.report.build_report` writes it)."""

from __future__ import annotations

from collections.abc import Sequence

from linmem.experiments.paper import PAPER_TABLE2, TABLE2_DATASETS, TABLE2_MODELS, TABLE2_TITLES
from linmem.experiments.seed_groups import row_label, seeds_lines, variant_text
from linmem.metrics import THRESHOLD_GRID
from linmem.models import display_name

__all__ = ["FAILED_MARK", "FAILED_TEXT", "all_failed", "table2_markdown"]


FAILED_MARK = "✗"
FAILED_TEXT = ("✗: every point of the grid failed with an error (a training that diverged "
               "before its first epoch ended keeps nothing): no score.")


def all_failed(records: Sequence[dict]) -> set[tuple[str, str]]:
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


def _row_labels(records: Sequence[dict], models: Sequence[str]) -> dict[str, str]:
    """Each model's row label: its name, with what sets its configurations apart (a memory
    bound, a protocol departure: :func:`variant_text`), which every data set's must share."""
    labels = {}
    for m in models:
        own = [r for r in records if r["model"] == m]
        variants = {variant_text(r) for r in own}
        if len(variants) > 1:
            raise ValueError(
                f"{display_name(m)}'s selections differ between the data sets ("
                + "; ".join(sorted(v or "the defaults" for v in variants)) + "): Table 2 has "
                "one row for it; choose one memory bound (--memory-bound), or report them apart")
        labels[m] = row_label(own[0]) if own else display_name(m)
    return labels


class _Table2:
    """What Table 2's tables share: our records by (data set, model), the grids where every
    point failed, the models in the table's order, the published figures and the
    previous-frame baseline."""

    def __init__(self, records: Sequence[dict], baseline: dict | None) -> None:
        self.ours = {(r["dataset"], r["model"]): r for r in records if "test_acc" in r}
        self.failed = all_failed(records)
        models = [m for m in TABLE2_MODELS
                  if m in PAPER_TABLE2 or any(k[1] == m for k in self.ours)]
        self.models = models + sorted({m for _, m in self.ours} - set(models))
        self.labels = _row_labels(records, self.models)
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
            rows.append(f"| {self.labels[m]} | " + " | ".join(cells) + " |")
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
            lines.append(f"| {self.labels[m]} | " + " | ".join(cells) + " |")
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
                 f"{r['model']} ({', '.join(filter(None, [r['grid'], variant_text(r)]))}) "
                 f"{r['points_done']}/{r['grid_points']}"
                 + (" complete" if r["grid_complete"] else "")
                 + (f", {r['trials_pruned']} pruned" if r.get("trials_pruned") else "")
                 + (f", {r['points_failed']} failed" if r.get("points_failed") else "")
                 + (f", from `{r['from_summary']}`" if r.get("from_summary") else "")
                 for r in rs]
        lines.append(f"- {TABLE2_TITLES[d]}: " + "; ".join(parts) + ".")
    return lines


def table2_markdown(records: Sequence[dict], command: str | None = None,
                    baseline: dict | None = None, seeds: Sequence[dict] = (),
                    protocols: Sequence[str] = (), left_out: Sequence[str] = ()) -> str:
    """The paper's Table 2 with our test accuracy next to each published figure, under the
    global accuracy and the per-frame mean, each column's configuration selected on validation
    under its own definition; bold marks the best of each column pair's kind (published, ours)
    per data set. Then the test NLL of the selected runs, and how much of each grid was run.
    ``baseline``: the previous-frame baseline (``results/baseline.json``, :func:`
    previous_frame_report`), a row of its own. ``seeds``: :func:`seed_groups` of the selected
    configurations re-run with other seeds, a table of their spread. ``protocols``: the
    section on both training protocols (:func:`both_protocols_lines`), after the grids'
    coverage. ``left_out``: the studies of another memory bound than the LMN rows', named under
    the coverage."""
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
    if left_out:
        lines += ["", "Left out of these tables, as of another memory bound than their LMN rows' "
                  "(`linmem report --memory-bound`): " + ", ".join(f"`{s}`" for s in left_out)
                  + "."]
    lines += protocols
    if command:
        lines += ["", f"Generated by `{command}` from the search studies; each selected run's "
                  "command, commit, seed and data checksum are in `summary.json`."]
    return "\n".join(lines) + "\n"
