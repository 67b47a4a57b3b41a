"""Reports built from run directories: every number comes from a run's ``metrics.json``."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._io import atomic_write, command_line, git_commit, provenance, read_json, write_json
from .data import data_checksum, load_polyphonic
from .metrics import THRESHOLD_GRID, previous_frame_scores
from .models import REGISTRY
from .nn import memory_loop_gains, memory_radii_of
from .train import load_checkpoint

__all__ = ["PAPER_TABLE2", "collect_metrics", "display_name", "epochs_cpu_seconds",
           "expected_fields", "figure4_data", "first_updates_markdown", "markdown_table",
           "memory_markdown", "memory_radii", "patience_markdown",
           "patience_records", "plot_figure4", "plot_prediction", "plot_pretraining", "plot_roll",
           "plot_run", "previous_frame_report", "progress_markdown", "protocols_markdown",
           "rerun_cpu_seconds", "run_cpu_seconds", "run_machine", "run_records",
           "scoring_cpu_seconds", "seed_groups", "seeds_markdown", "stop_early",
           "summary_file_records", "summary_records", "table2_markdown", "training_cpu_seconds",
           "with_selected_run_fields", "write_search_report"]

RUN_COLUMNS = (
    ("dataset", "data", "{}"),
    ("model", "model", "{}"),
    ("hidden", "hidden", "{}"),
    ("memory", "memory", "{}"),
    ("valid_acc", "valid acc %", "{:.2f}"),
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


def _log_rows(run_dir: str | os.PathLike) -> list[dict]:
    """The per-epoch rows of a run's ``log.jsonl``; [] when it has none."""
    log = Path(run_dir) / "log.jsonl"
    if not log.is_file():
        return []
    rows = []
    for number, line in enumerate(log.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{log}: line {number} is not valid JSON ({err.msg}, column "
                                 f"{err.colno})") from None
    return rows


def _log_fields(run_dir: Path) -> dict:
    """From a run's per-epoch ``log.jsonl``: the best validation NLL of any epoch and the
    validation accuracy at that epoch (the selected checkpoint maximises accuracy instead)."""
    rows = _log_rows(run_dir)
    if not rows:
        return {}
    fields = {}
    selected = [r["epoch"] for r in rows if r.get("best")]
    if selected and all("epoch_time_s" in r for r in rows):  # training time to the checkpoint
        fields["minutes_to_best"] = sum(r["epoch_time_s"] for r in rows
                                        if r["epoch"] <= selected[-1]) / 60
    epochs = [e for e in rows if e.get("valid_nll") is not None and e.get("valid_acc") is not None]
    if epochs:
        best = min(epochs, key=lambda e: e["valid_nll"])
        fields.update(valid_nll_best=best["valid_nll"], valid_acc_at_best_nll=best["valid_acc"],
                      best_nll_epoch=best["epoch"])
    return fields


def _seconds(record: dict[str, Any], cpu: str, wall: str) -> float:
    """The CPU time ``record[cpu]`` where it was recorded (runs from commit 8b4fc25 on), else
    the wall time ``record[wall]`` (one thread per run: not below the CPU time, above it when
    other processes shared the cores)."""
    return record.get(cpu, record.get(wall, 0.0))


def run_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds a run's training took as its files record them: a finished run's
    (``metrics.json``: every session's training and the final scoring; ``diverged.json``: that
    of a run that failed by diverging, its last attempt's), else its epochs' in
    ``log.jsonl`` (training and validation; epochs cut short by a killed worker are not
    there), and the pretraining's (``pretraining.json``) once; 0 for a run that has written
    neither; and the scoring of its expected accuracy (``expected.json``, ``linmem evaluate
    --expected``), a process of its own. The CPU time where it is recorded, else the wall time
    (one thread per run).

    The unrolled network of a pret-LMN run counts for the run that trained it, every session's
    (:func:`_ulm_before_seconds`): in flight, ``run_dir/ulm``'s epochs; once pretrained, what
    its earlier, killed processes spent on it beside the recipe's own clock."""
    return training_cpu_seconds(run_dir) + scoring_cpu_seconds(run_dir)


def scoring_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds of a run's expected accuracy (``expected.json``; its wall time where it
    did not record them); 0 without one."""
    expected = Path(run_dir) / "expected.json"
    return _seconds(read_json(expected), "cpu_time_s", "wall_time_s") if expected.is_file() \
        else 0.0


def epochs_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds of a run's logged epochs (``log.jsonl``: training and validation; the
    wall time where they did not record it)."""
    return sum(_seconds(row, "epoch_cpu_s", "epoch_time_s") for row in _log_rows(Path(run_dir)))


def training_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """:func:`run_cpu_seconds` less the expected accuracy's scoring."""
    run_dir = Path(run_dir)
    epochs = epochs_cpu_seconds(run_dir)
    if (run_dir / "pretraining.json").is_file():
        record = read_json(run_dir / "pretraining.json")
        pretraining = _seconds(record, "cpu_time_s", "wall_time_s")
        before = _ulm_before_seconds(run_dir, record)
    else:  # not pretrained, or a ULM stage in flight
        ulm = run_dir / "ulm"
        pretraining, before = 0.0, run_cpu_seconds(ulm) if ulm.is_dir() else 0.0
    end = next((run_dir / n for n in ("metrics.json", "diverged.json")
                if (run_dir / n).is_file()), None)
    if end is None:
        return epochs + pretraining + before
    total = _seconds(read_json(end), "cpu_time_s", "wall_time_s")
    # the pretraining runs inside the training's clock when one session did both (its wall
    # time then exceeds the pretraining's and the epochs'); otherwise it is added
    return before + (total if total >= pretraining + epochs else total + pretraining)


def run_machine(run_dir: str | os.PathLike, unfinished: str | None = None) -> str | None:
    """The CPU a run ended on, as its ``metrics.json`` (or ``diverged.json``) records it
    (:func:`linmem._io.machine`: model name, x86 family and model); None for a run recorded
    before machines were, ``unfinished`` for a run with neither file (in flight, or killed:
    this machine's CPU, where the caller knows that the run is this machine's)."""
    for name in ("metrics.json", "diverged.json"):
        path = Path(run_dir) / name
        if path.is_file():
            cpu = (read_json(path).get("machine") or {}).get("cpu")
            return str(cpu) if cpu else None
    return unfinished


def rerun_cpu_seconds(run_dir: str | os.PathLike) -> float:
    """The CPU seconds a run of ``run_dir``'s configuration with another seed would take
    (``linmem reseed``'s projection), as ``run_dir``'s files record them: its training's
    (:func:`training_cpu_seconds`), and for a pretrained run that read its unrolled network
    from a cache, that network's too (``pretraining.json``'s ``ulm_cpu_time_s``, or
    ``ulm_wall_time_s`` in older records): another seed trains its own. The times are those of
    the machine that ran ``run_dir``."""
    run_dir = Path(run_dir)
    total = training_cpu_seconds(run_dir)
    if (run_dir / "pretraining.json").is_file():
        record = read_json(run_dir / "pretraining.json")
        ulm = record.get("ulm_cpu_time_s") or record.get("ulm_wall_time_s") or 0.0
        total = max(total, epochs_cpu_seconds(run_dir) + ulm)
    return total


def _ulm_before_seconds(run_dir: Path, record: dict[str, Any]) -> float:
    """The CPU seconds a pret-LMN run spent on its unrolled network in processes that ended
    before its pretraining did (the recipe's ``cpu_time_s`` holds the last one's): recorded
    since the fields ``ulm_cpu_time_s`` and ``ulm_cpu_here_s`` were; for earlier records whose
    ULM is the run's own (``run_dir/ulm``), the ULM's logged CPU time beyond the recipe's (a
    lower bound: the recipe's time also holds the autoencoder's fit); else 0."""
    if "ulm_cpu_time_s" in record:
        return max(record["ulm_cpu_time_s"] - record["ulm_cpu_here_s"], 0.0)
    own = run_dir / "ulm"  # a cache entry is named by its key (:func:`linmem.recipes.ulm_key`)
    if Path(record.get("ulm_run", "ulm")).name != "ulm" or not (own / "metrics.json").is_file():
        return 0.0
    ulm = _seconds(read_json(own / "metrics.json"), "cpu_time_s", "wall_time_s")
    return max(ulm - _seconds(record, "cpu_time_s", "wall_time_s"), 0.0)


def _made_by(command: str | None, at: str | None = None) -> list[str]:
    """A generated table's closing line: the command that made it, and when or at which commit
    (none without a command)."""
    return ["", f"Made by `{command}`" + (f" at {at}" if at else "") + "."] if command else []


def _hours_by_machine(studies: Sequence[dict], runs: Sequence[tuple[str, float]],
                      run_machines: dict[str, str | None]) -> str:
    """The sentence of :func:`progress_markdown` that splits the CPU hours logged by the CPU
    that ran them, the most first, those of no recorded CPU last."""
    hours: dict[str | None, float] = {}
    for r in studies:
        for cpu, seconds in (r.get("cpu_s_by_machine") or {None: r["cpu_s"]}).items():
            hours[cpu] = hours.get(cpu, 0.0) + seconds / 3600
    for name, seconds in runs:
        cpu = run_machines.get(name)
        hours[cpu] = hours.get(cpu, 0.0) + seconds / 3600
    parts = [f"{cpu} {h:.1f}" for cpu, h in sorted(hours.items(), key=lambda ch: -ch[1])
             if cpu is not None and h > 0]
    if hours.get(None, 0.0) > 0:
        parts.append(f"not recorded (runs and trials from before the record) {hours[None]:.1f}")
    return ("CPU hours logged by the CPU that ran them (machines differ between sessions; a run "
            "resumed on another machine counts on the one it ended on, a run in flight on this "
            "one): " + "; ".join(parts) + ".")


def progress_markdown(studies: Sequence[dict], runs: Sequence[tuple[str, float]] = (),
                      command: str | None = None, when: str | None = None,
                      run_machines: dict[str, str | None] | None = None) -> str:
    """The progress of the searches (:func:`linmem.search.progress_records`) and of single runs
    (``(name, cpu seconds)``) as a Markdown table with the totals: CPU hours logged, projected
    CPU hours left, and the hours logged by the CPU that ran them (a study's
    ``cpu_s_by_machine``, a single run's CPU in ``run_machines``; not recorded where neither
    says)."""

    def hours(s: float | None) -> str:
        return "?" if s is None else f"{s / 3600:.2f}"

    lines = ["| study | points done / grid | failed | running | CPU h | CPU h per finished "
             "point | projected CPU h left |", "|---|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(studies, key=lambda r: r["study"]):
        st = r["states"]
        per = hours(r["mean_point_cpu_s"]) + {"data set": " (data set's)",
                                              "model": " (model's, scaled)",
                                              "model, other grid": " (model's in another grid, "
                                                                   "scaled)",
                                              "selected run": " (selected run's)",
                                              "selected trial": " (selected run's, trial's "
                                                                "stored time)",
                                              "run, scaled": " (another data set's run, "
                                                             "scaled)"
                                              }.get(r["left_from"], "")
        if r["mean_point_cpu_s"] is None and r["left_cpu_s"] == 0.0:
            per = "–"  # nothing left, nothing to project from
        name = r["study"] + (f" ({r['points_from_trials']} points: trial's stored time)"
                             if r.get("points_from_trials") else "")
        lines.append(f"| {name} | {st.get('done', 0)} / {r['grid_points']} | "
                     f"{st.get('failed', 0)} | {st.get('running', 0) + st.get('waiting', 0)} | "
                     f"{hours(r['cpu_s'])} | {per} | {hours(r['left_cpu_s'])} |")
    for name, seconds in runs:
        lines.append(f"| {name} (single run) | – | – | – | {hours(seconds)} | – | – |")
    spent = sum(r["cpu_s"] for r in studies) + sum(s for _, s in runs)
    unknown = [r["study"] for r in studies if r["left_cpu_s"] is None]
    left = sum(r["left_cpu_s"] or 0.0 for r in studies)
    lines += ["", f"CPU hours logged: **{spent / 3600:.1f}**; projected CPU hours left for the "
              f"studies above: **{left / 3600:.1f}**"
              + (f" (and no estimate yet for {', '.join(unknown)})" if unknown else "") + "."]
    if spent > 0:
        lines += ["", _hours_by_machine(studies, runs, run_machines or {})]
    lines += ["", "CPU hours: each finished run's time (`metrics.json`), else the epochs' "
              "times in its `log.jsonl`, and its pretraining time: the CPU time where the run "
              "recorded it (from commit 8b4fc25 on), else the wall time, which is above it when "
              "processes shared the cores (one thread per run; epochs cut short by a killed "
              "worker are not counted; a study imported from another machine counts its finished "
              "trials' stored time where their runs are not here: their CPU time where they "
              "stored it, else their wall time). A pret-LMN run counts the "
              "training of its unrolled network, every session's, when it trained it, and none "
              "when it read it from the cache (`--ulm-cache`); runs recorded before commit "
              "3c1102d count what the network's own run logged beyond the recipe's clock when "
              "the network is their own, and nothing for a killed process's share of a cache "
              "entry. "
              "A study marked 'earlier' counts its trials' durations from `summary.json` (its "
              "storage and runs are gone): an upper bound, a trial whose worker died lasting "
              "until it was found dead. "
              "Projection: each point left at a cost c * n ** a of its n parameters, a fitted "
              "to the study's finished points (complete, pruned or failed; the column shows "
              "their mean) by least squares on the logs, within [0, 2], 1 when they are all of "
              "one size, and c such that they add up to their CPU time; for a study with none, "
              "its model's mean on the other data sets scaled by the two data sets' cost ratio "
              "over the models both have finished (\"model's, scaled\"), else the same from its "
              "model's points in another grid, the ratio then over the models finished in both "
              "grids (\"model's in another grid, scaled\"), else its data set's mean over "
              "every model. Seeds still to run (`--plan-seeds`): each at the CPU time of the "
              "study's selected run, with its unrolled network's when it read that from the "
              "cache (a seed trains its own), or at its trial's stored time when the run is "
              "on another machine (\"trial's stored time\"); the seeds run so far count as single "
              "runs. A single run still to make "
              "(`--plan-run`, an RNN-RBM): another data set's run of the same configuration, its "
              "epochs scaled by the two data sets' training and validation frames, its final "
              "scoring as it is (a fixed sample of frames for the AIS), its expected accuracy's "
              "scoring by the frames scored (\"another data set's run, scaled\"); a run's "
              "scoring (`expected.json`) counts in its CPU time."]
    return "\n".join(lines + _made_by(command, when)) + "\n"


def expected_fields(run_dir: str | os.PathLike) -> dict:
    """The expected accuracy (Boulanger-Lewandowski et al. 2012) of a run's best checkpoint
    where ``linmem evaluate RUN --expected N --out RUN/expected.json`` wrote it:
    ``test_acc_expected`` and its standard error (and the validation's); {} otherwise."""
    path = Path(run_dir) / "expected.json"
    if not path.is_file():
        return {}
    scores = read_json(path)
    if scores.get("checkpoint", "best") != "best":
        return {}
    return {f"{split}_acc_expected{suffix}": scores[split][f"acc_expected{suffix}"]
            for split in ("valid", "test") if "acc_expected" in scores.get(split, {})
            for suffix in ("", "_se")}


def _checkpoint_state(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """The model state in a checkpoint (``best.pt``, ``last.pt``) or a bare state dict
    (a pretrained run's ``init.pt``)."""
    state = load_checkpoint(path)
    return state.get("model", state)


def memory_radii(checkpoint: str | os.PathLike) -> list[float]:
    """The spectral radius ``max |eig(W^mm)|`` of each LMN layer's memory-to-memory matrix in a
    checkpoint (``best.pt`` or ``last.pt``, or a pretrained run's initial weights ``init.pt``;
    eq. 7's ``W^mm``), in layer order; [] for a model without a linear memory. Above 1, the
    memory's state grows geometrically along a sequence."""
    return memory_radii_of(_checkpoint_state(checkpoint))


def memory_markdown(runs: Sequence[dict], command: str | None = None,
                    commit: str | None = None) -> str:
    """A Markdown table of ended runs (``metrics.json`` and ``diverged.json`` records of
    :func:`collect_metrics`) with how they stopped, the spectral radius of their memory
    (:func:`memory_radii`) at the start (a pretrained run's initial weights, ``init.pt``), the
    selected epoch and the last one, and the gain of the memory's loop through the functional
    units (:func:`linmem.nn.memory_loop_gains`) at the start and the selected epoch: the
    evidence for a divergence."""

    def numbers(values: list[float]) -> str:
        return ", ".join(f"{v:.3f}" for v in values) or "–"

    def columns(run: Path, record: dict) -> str:
        """ρ(W^mm) at the start, the selected and the last epoch; the loop gain at the start
        and the selected epoch (each checkpoint read once)."""
        states = {name: _checkpoint_state(run / name) if (run / name).is_file() else None
                  for name in ("init.pt", "best.pt", "last.pt")}
        act = _activation(record)
        radii = [", ".join(f"{v:.3f}" for v in memory_radii_of(states[n]))
                 if states[n] is not None else "–" for n in ("init.pt", "best.pt", "last.pt")]
        gains = [numbers(memory_loop_gains(states[n], act))
                 if states[n] is not None and act is not None else "–"
                 for n in ("init.pt", "best.pt")]
        return " | ".join(radii + gains)

    lines = ["| run | model | batch | chunk | epochs | selected epoch | valid acc % | stop | "
             "ρ(W^mm) start | ρ(W^mm) selected | ρ(W^mm) last | loop gain start | "
             "loop gain selected |",
             "|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in runs:
        run = Path(r["run"])
        stop = str(r.get("stop_reason") or (f"failed: diverged: {r['diverged']}" if "diverged"
                                            in r else "–")).split(";")[0]
        acc = "–" if r.get("valid_acc") is None else f"{r['valid_acc']:.2f}"
        lines.append(f"| {run.parent.name}/{run.name} | {r.get('model')} | {r.get('batch_size')} | "
                     f"{r.get('chunk') or 'whole'} | {r.get('epochs')} | "
                     f"{r.get('best_epoch') or '–'} | {acc} | {stop} | {columns(run, r)} |")
    lines += ["", "Loop gain: rho(W^mm + s W^hm W^mh), the memory's recurrence with the functional "
              "units on the unbounded side of their activation (slope s: 1 for relu, 1.0507 for "
              "selu; tanh is bounded, s = 1 at 0): above 1, an unbounded activation lets the state "
              "grow along a sequence even with rho(W^mm) < 1."]
    return "\n".join(lines + _made_by(command, commit and f"commit {commit}")) + "\n"


def first_updates_markdown(results: Sequence[dict], command: str | None = None) -> str:
    """A Markdown table of :func:`linmem.onset.first_updates` results: for each run and
    learning rate, the validation scores and recurrent radius of the initial weights and after
    the replayed updates, the loss of each update, and the parameter that the first update
    changed most relative to its size."""

    def radius(value: float | None) -> str:
        return "–" if value is None else f"{value:.4f}"

    def loss(value: float | None) -> str:
        return "inf/NaN" if value is None else f"{value:.1f}"

    lines = ["| run | start | lr | valid acc % / NLL before | after | radius before | after | "
             "largest change by update 1 | loss of each update |",
             "|---|---|---:|---|---|---:|---:|---|---|"]
    for result in results:
        run = Path(result["run_dir"])
        first = result["initial"]
        for replay in result["replays"]:
            changes = {k: v for k, v in replay["change_first"].items() if v is not None}
            name = max(changes, key=changes.get) if changes else None
            most = f"{name} ×{changes[name]:.2f}" if name else "–"
            lines.append(
                f"| {run.parent.name}/{run.name} | {result['start']} | {replay['lr']:g} | "
                f"{first['valid_acc']:.2f} / {first['valid_nll']:.2f} | "
                f"{replay['valid_acc']:.2f} / {replay['valid_nll']:.2f} | "
                f"{radius(first['radius'])} | {radius(replay['radii'][-1])} | {most} | "
                + " ".join(loss(v) for v in replay["losses"]) + " |")
    lines += ["", "Change: ||W - W_0|| / ||W_0|| of the parameter after the first update. "
              "Radius: the first layer's recurrent matrix (W^mm of an LMN, W^hh of an RNN)."]
    return "\n".join(lines + _made_by(command)) + "\n"


def collect_metrics(paths: Iterable[str | os.PathLike], diverged: bool = False) -> list[dict]:
    """The ``metrics.json`` records under ``paths`` (run directories or folders holding them;
    a run's own steps, such as a pretraining run inside it, are not runs of their own),
    sorted by path, each with its ``run`` (the directory), its batch size and chunk (from
    ``config.json``) and, where the run's ``log.jsonl`` is there, the training minutes to the
    selected epoch, its best validation NLL and the validation accuracy at that epoch.
    ``diverged``: also the runs that failed by diverging (``diverged.json``, no scores; its
    ``diverged`` field says why)."""
    ends = ("metrics.json", "diverged.json")  # the files a run ends with
    names = ends if diverged else ends[:1]

    def is_run(folder: Path) -> bool:  # ended or not (config.json is its first file)
        return any((folder / n).is_file() for n in (*ends, "config.json"))

    records = []
    for root in paths:
        root = Path(root)
        folders = [root] if is_run(root) else sorted(
            {f.parent for n in ends for f in root.rglob(n)
             # a run, not a step inside a run (pretraining), whether that run has ended or not
             if not any(is_run(d) for d in f.parent.parents
                        if d.is_relative_to(root) and d != root)})
        for folder in folders:
            f = next((folder / n for n in names if (folder / n).is_file()), None)
            if f is None:  # a run that diverged, not asked for
                continue
            config = (json.loads((f.parent / "config.json").read_text())
                      if (f.parent / "config.json").is_file() else {})
            record = {**{k: config.get(k) for k in ("batch_size", "chunk", "nonlinearity")},
                      **json.loads(f.read_text()), **_log_fields(f.parent),
                      **expected_fields(f.parent)}
            record["run"] = str(f.parent)
            records.append(record)
    if not records:
        raise FileNotFoundError(f"no {' or '.join(names)} under " + ", ".join(map(str, paths)))
    return sorted(records, key=lambda r: r["run"])


def stop_early(history: Sequence[dict], patience: int) -> tuple[int | None, int]:
    """Where a run would have ended had it stopped after ``patience`` epochs without a better
    validation score: ``(index of its selected epoch, epochs run)``, from its ``log.jsonl`` rows
    (their ``best`` flags: the run's own criterion, as :func:`linmem.train.train` sets them)."""
    best, bad = None, 0
    for i, row in enumerate(history):
        if row.get("best"):
            best, bad = i, 0
        else:
            bad += 1
            if bad >= patience:
                return best, i + 1
    return best, len(history)


def patience_records(records: Sequence[dict], patiences: Sequence[int]) -> list[dict]:
    """What a shorter patience would have changed in the finished runs ``records`` (of
    :func:`collect_metrics`; those whose training ended by early stopping or at its epoch limit,
    each with its own ``patience`` from ``config.json``): per patience, over the runs whose
    own was longer, in how many the selected epoch changes, the validation accuracy lost at the
    selected epoch (percentage points, mean over the runs and maximum) and the share of the
    epochs' CPU time saved (their wall time where a log has no CPU time)."""
    runs = []
    for r in records:
        if not str(r.get("stop_reason", "")).startswith(("early stopping", "reached the epoch")):
            continue  # diverged, or stopped otherwise: not a full history to replay
        config = read_json(Path(r["run"]) / "config.json")
        rows = {row["epoch"]: row for row in _log_rows(r["run"])}  # a resumed epoch: its last
        history = [rows[e] for e in sorted(rows)]
        if history and all("best" in row and row.get("valid_acc") is not None
                           for row in history):
            runs.append((history, int(config.get("patience", 50))))
    out = []
    for patience in patiences:
        lost, changed, saved, total, n = [], 0, 0.0, 0.0, 0
        for history, own in runs:
            if patience >= own:
                continue  # its log cannot say what a longer patience would have done
            n += 1
            full, _ = stop_early(history, len(history) + 1)
            chosen, ran = stop_early(history, patience)
            seconds = [row.get("epoch_cpu_s", row.get("epoch_time_s", 0.0)) for row in history]
            total += sum(seconds)
            saved += sum(seconds[ran:])
            drop = history[full]["valid_acc"] - (history[chosen]["valid_acc"]
                                                if chosen is not None else 0.0)
            lost.append(drop)
            changed += chosen != full
        out.append({"patience": patience, "runs": n, "changed": changed,
                    "valid_acc_lost_mean": sum(lost) / n if n else None,
                    "valid_acc_lost_max": max(lost, default=None),
                    "cpu_saved": saved / total if total else None})
    return out


def patience_markdown(rows: Sequence[dict], command: str | None = None,
                      commit: str | None = None) -> str:
    """:func:`patience_records` as a Markdown table, with the command and commit that made it."""
    lines = ["| patience | runs | selected epoch changed | valid acc lost (points): mean, max "
             "| epochs' CPU time saved |", "|---:|---:|---:|---|---:|"]
    for r in rows:
        if not r["runs"]:
            lines.append(f"| {r['patience']} | 0 | – | – | – |")
            continue
        lines.append(f"| {r['patience']} | {r['runs']} | {r['changed']} | "
                     f"{r['valid_acc_lost_mean']:.2f}, {r['valid_acc_lost_max']:.2f} | "
                     + ("–" if r["cpu_saved"] is None else f"{100 * r['cpu_saved']:.0f} %")
                     + " |")
    lines += ["", "Each finished run's log replayed: the run stopped after that many epochs "
              "without a better validation score (its own criterion) instead of its own "
              "patience, the epoch it would have selected then, against the one it selected; "
              "only runs whose own patience was longer count, and runs that ended by "
              "diverging do not."]
    return "\n".join(lines + _made_by(command, commit and f"commit {commit}")) + "\n"


def markdown_table(records: Sequence[dict], columns=RUN_COLUMNS) -> str:
    """A markdown table of ``records``, then one line per record with its command and commit."""
    lines = ["| run | " + " | ".join(title for _, title, _ in columns) + " |",
             "|---|" + "---|" * len(columns)]
    for r in records:
        cells = [Path(r["run"]).name]
        for key, _, fmt in columns:
            value = r.get(key)
            cells.append("" if value is None else fmt.format(value))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    for r in records:
        lines.append(f"- `{r['run']}`: `{r.get('command')}` (commit {r.get('commit')}, seed "
                     f"{r.get('seed')}, data sha256 {r.get('data_sha256')})")
    return "\n".join(lines) + "\n"


def plot_pretraining(analysis: dict, path: str | os.PathLike) -> None:
    """The paper's Figure 5 from :func:`linmem.recipes.analyze`'s output, three panels, to a
    PNG written atomically (matplotlib is imported here only: ``pip install
    linear-memory-networks[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = analysis["memories"]
    mem = [r["components"] for r in rows]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    ax = axes[0]
    ax.plot(mem, [r["svd_error"] for r in rows], "o-", label="SVD (optimal)")
    ax.plot(mem, [r["la_error"] for r in rows], "s--", label="linear autoencoder")
    ax.set(xlabel="memory units", ylabel="MSE per value", yscale="log",
           title="(a) reconstruction of training states")
    ax.legend()
    ax = axes[1]
    for split, style in (("train", "-"), ("valid", "--")):
        ax.plot(mem, [r[f"lmn_{split}_acc"] for r in rows], "o" + style,
                label=f"pretrained LMN ({split})")
        ax.axhline(analysis[f"ulm_{split}_acc"], color="gray", linestyle=style,
                   label=f"ULM ({split})")
    ax.set(xlabel="memory units", ylabel="frame accuracy %",
           title="(b) before fine-tuning")
    ax.legend()
    ax = axes[2]
    first = analysis["first_sequence"]
    ax.plot(range(1, len(first["relative_error"]) + 1), first["relative_error"])
    ax.set(xlabel="time step t", ylabel="relative error of h_1..h_t from m_t", yscale="log",
           title=f"(c) first training sequence, {first['memory']} memory units")
    fig.suptitle(f"Pretraining analysis: ULM hidden {analysis['hidden']}, k {analysis['k']}")
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


# Table 2 of the paper: test frame accuracy (%); RNN-RBM quoted there from Boulanger-Lewandowski
# et al. (2012). Columns: jsb, musedata, nottingham, piano.
PAPER_TABLE2: dict[str, tuple[float, float, float, float]] = {
    "rnn": (31.00, 35.02, 72.29, 26.52),
    "pret-rnn": (30.55, 35.47, 71.70, 27.31),
    "lstm": (32.64, 34.40, 72.45, 25.08),
    "rnn-rbm": (33.12, 34.02, 75.40, 28.92),
    "lmn-a": (30.61, 33.15, 71.16, 26.69),
    "lmn-b": (33.98, 35.56, 72.71, 28.00),
    "pret-lmn-b": (34.49, 35.66, 74.16, 28.79),
}
TABLE2_DATASETS = ("jsb", "musedata", "nottingham", "piano")
TABLE2_TITLES = {"jsb": "JSB Chorales", "musedata": "MuseData", "nottingham": "Nottingham",
                 "piano": "Piano-midi.de"}
TABLE2_MODELS = ("rnn", "pret-rnn", "lstm", "gru", "rnn-rbm", "lmn-a", "lmn-b", "pret-lmn-b")


def display_name(model: str) -> str:
    """A model's name in tables and figures: its registry entry's (:mod:`linmem.models`)."""
    spec = REGISTRY.get(model)
    return spec.display if spec is not None else model

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
    """The records of :func:`linmem.search.search_records` that have a selected configuration,
    reduced to the fields of ``results/summary.json``, sorted by data set and model."""
    order = {m: i for i, m in enumerate(TABLE2_MODELS)}
    rows = [{k: r.get(k) for k in SUMMARY_FIELDS} for r in records if "test_acc" in r]
    return sorted(rows, key=lambda r: (TABLE2_DATASETS.index(r["dataset"])
                                       if r["dataset"] in TABLE2_DATASETS else 99,
                                       order.get(r["model"], 99), r["model"]))


def run_records(runs: Sequence[dict]) -> list[dict]:
    """Records like :func:`linmem.search.search_records`'s from single runs (``metrics.json``
    records of :func:`collect_metrics`) of models that had no grid search: per (data set, model)
    the run with the best validation score, ``grid`` ``"runs"``, ``trials`` the runs given. The
    score is the one the runs were selected on (``--select``): the accuracy, or the lowest NLL;
    runs of one model selected on different scores are refused."""
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
    run = Path(selected) / f"{record['dataset']}-{record['model']}" / "metrics.json"
    if all(record.get(k) is not None for k in SELECTED_RUN_FIELDS) or not run.is_file():
        return record
    m = read_json(run)
    if any(m.get(k) != record.get(k) for k in ("hidden", "memory", "weight_decay", "valid_acc",
                                               "test_acc")):
        return record
    return {**record, **{k: m.get(k) for k in SELECTED_RUN_FIELDS if record.get(k) is None}}


def summary_file_records(path: str | os.PathLike) -> list[dict]:
    """Records of an earlier report's ``summary.json`` (a search whose storage is not at hand),
    in the form of :func:`linmem.search.search_records`' for :func:`table2_markdown`; marked
    ``from_summary``, with the trials of the ``search_trials.json`` beside it (figure 4). A
    record without ``frame_selection`` keeps none: its per-frame cell falls back to the global
    selection, marked as such. Scores a record lacks (an older file) are read from its selected
    run's ``metrics.json`` that the report copied beside it (``selected/DATA-MODEL``), when that
    run is the record's configuration (:data:`SELECTED_RUN_FIELDS`)."""
    try:
        rows = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path}: not a summary.json ({err})") from None
    if not isinstance(rows, list) or not all(isinstance(r, dict) and "dataset" in r
                                             and "model" in r for r in rows):
        raise ValueError(f"{path}: not a summary.json (a list of records with dataset, model)")
    trials_file = Path(path).parent / "search_trials.json"  # written beside it by the report
    trials = ({t["study"]: t.get("trials_run", []) for t in json.loads(trials_file.read_text())
               if isinstance(t, dict) and "study" in t} if trials_file.is_file() else {})
    records = []
    for r in rows:
        study = r.get("study", f"{r['dataset']}-{r['model']}-{r.get('grid')}")
        done = r.get("points_done", r["grid_points"] if r.get("grid_complete") else None)
        # older files: no point count; a failed trial whose point was done again is no failure
        failed = r.get("points_failed", r.get("trials_failed") or 0)
        if "points_failed" not in r and done is not None:
            failed = min(failed, r["grid_points"] - done)
        r = with_selected_run_fields(r, Path(path).parent / "selected")
        records.append({
            **r, "study": None if r.get("grid") == "runs" else study,
            "points_done": done, "points_failed": failed,
            "trials_run": trials.get(study, []), "from_summary": str(path)})
    return records


SEED_METRICS = ("test_acc", "test_acc_frame", "test_nll", "valid_acc")


def _activation(record: dict) -> str | None:
    """The run's recurrent activation (its ``config.json``'s, else its model's default)."""
    spec = REGISTRY.get(record.get("model"))
    return record.get("nonlinearity") or (spec.default_nonlinearity if spec else None)


def _other_activation(group: dict) -> str | None:
    """The seed group's activation where it is not its model's default, else None."""
    act = group.get("nonlinearity")
    return None if act == _activation({"model": group["model"]}) else act


def _label(group: dict) -> str:
    """The model's display name, with its activation when not the model's default."""
    act = _other_activation(group)
    return display_name(group["model"]) + (f" ({act})" if act else "")


def seed_groups(runs: Sequence[dict]) -> list[dict]:
    """Runs (``metrics.json`` records of :func:`collect_metrics`) that differ only in their seed,
    grouped by (data set, model, activation, sizes, weight decay): per group the seeds that
    finished (``seeds``) and those that diverged (``diverged_seeds``: records with a
    ``diverged`` field and no scores), and the mean, standard deviation (``ddof = 1``), minimum
    and maximum of each of :data:`SEED_METRICS` over the finished ones."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        key = (r["dataset"], r["model"], _activation(r), r.get("hidden"), r.get("memory"),
               r.get("weight_decay"))
        groups.setdefault(key, []).append(r)
    out = []
    for (dataset, model, act, hidden, memory, wd), every in groups.items():
        seeds = [r.get("seed") for r in every]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{model} on {dataset}: seed {seeds} given twice")
        rs = [r for r in every if "diverged" not in r]
        group = {"dataset": dataset, "model": model, "nonlinearity": act, "hidden": hidden,
                 "memory": memory, "weight_decay": wd,
                 "seeds": sorted(r.get("seed") for r in rs),
                 "diverged_seeds": sorted(r.get("seed") for r in every if "diverged" in r),
                 "runs": sorted(r["run"] for r in every)}
        for key in SEED_METRICS:
            values = np.array([r[key] for r in rs if r.get(key) is not None], dtype=float)
            if len(values):
                group[key] = {"mean": float(values.mean()),
                              "sd": float(values.std(ddof=1)) if len(values) > 1 else None,
                              "min": float(values.min()), "max": float(values.max()),
                              "n": len(values)}
        out.append(group)
    return sorted(out, key=lambda g: (g["dataset"], g["model"], _label(g)))


MIN_CLAIM_SEEDS = 3  # seeds per model before the seeds' table says whether a claim holds


def seeds_markdown(groups: Sequence[dict]) -> str:
    """The table of :func:`seed_groups` (mean ± sd, range) and the paper's two claims where
    both sides of one are among the groups."""
    return "\n".join(_seeds_lines(groups)) + "\n"


def _seeds_lines(groups: Sequence[dict]) -> list[str]:
    def spread(g: dict, key: str) -> str:
        v = g.get(key)
        if v is None:
            return "–"
        sd = "" if v["sd"] is None else f" ± {v['sd']:.2f}"
        return f"{v['mean']:.2f}{sd} ({v['min']:.2f}-{v['max']:.2f})"

    lines = ["| data | model | size | weight decay | seeds | test acc % | test acc % (per-frame "
             "mean) | test NLL |", "|---|---|---|---|---|---:|---:|---:|"]
    for g in groups:
        size = f"{g['hidden']}" + (f", {g['memory']}" if g.get("memory") else "")
        seeds = " ".join(filter(None, [", ".join(map(str, g["seeds"])), (
            f"({', '.join(map(str, g['diverged_seeds']))} diverged)"
            if g.get("diverged_seeds") else "")]))
        lines.append(f"| {TABLE2_TITLES.get(g['dataset'], g['dataset'])} | "
                     f"{_label(g)} | {size} | {g['weight_decay']:g} | "
                     f"{seeds} | {spread(g, 'test_acc')} | "
                     f"{spread(g, 'test_acc_frame')} | {spread(g, 'test_nll')} |")
    lines += ["", "Mean ± standard deviation (minimum-maximum) over the seeds of the selected "
              "configuration (a seed whose training diverged, with no score, is named and left "
              "out of them). The paper's two claims per data set (test accuracy, global and "
              "per-frame mean): the difference of the means, and whether the seeds' ranges "
              "overlap:", ""]
    # against the model run as the paper's Table 2 has it (its default activation); the
    # challenger in each of its activations
    by = {(g["dataset"], g["model"]): g for g in groups if _other_activation(g) is None}
    for dataset in TABLE2_DATASETS:
        for model, other in (("pret-lmn-b", "lmn-b"), ("lmn-b", "lstm")):
            a = by.get((dataset, other))
            for b in [g for g in groups if (g["dataset"], g["model"]) == (dataset, model)]:
                if a is not None and "test_acc" in a and "test_acc" in b:
                    lines.append(_claim_line(TABLE2_TITLES[dataset], b, a))
    return lines


def _claim_line(title: str, b: dict, a: dict) -> str:
    """One of the paper's claims on one data set: seed group ``b`` against ``a``."""
    head = f"- {title}: {_label(b)} against {_label(a)}: "
    ran = {id(g): len(g["seeds"]) + len(g.get("diverged_seeds", [])) for g in (a, b)}
    if min(ran.values()) < MIN_CLAIM_SEEDS:
        return (f"{head}{ran[id(b)]} seed(s) of {_label(b)} and {ran[id(a)]} of "
                f"{_label(a)} so far; no verdict under {MIN_CLAIM_SEEDS} each.")
    failed = [f"{_label(g)}'s seed{'s' * (len(g['diverged_seeds']) > 1)} "
              f"{', '.join(map(str, g['diverged_seeds']))} diverged (no score)"
              for g in (b, a) if g.get("diverged_seeds")]
    note = (f" ({'; '.join(failed)}: the means and ranges are over the seeds that finished)"
            if failed else "")
    if min(len(a["seeds"]), len(b["seeds"])) < 2:
        return f"{head}fewer than 2 seeds of one finished; no verdict{note}."
    parts = []
    for key, metric in (("test_acc", "global"), ("test_acc_frame", "per-frame mean")):
        if key not in a or key not in b:
            continue
        x, y = a[key], b[key]
        apart = y["min"] > x["max"] or x["min"] > y["max"]
        parts.append(f"{y['mean'] - x['mean']:+.2f} points {metric}, the ranges "
                     + ("do not overlap (beyond the spread between seeds)" if apart
                        else "overlap (within the spread between seeds)"))
    return head + "; ".join(parts) + note + "."


def table2_markdown(records: Sequence[dict], command: str | None = None,
                    baseline: dict | None = None, seeds: Sequence[dict] = ()) -> str:
    """The paper's Table 2 with our test accuracy next to each published figure, under the
    global accuracy and the per-frame mean, each column's configuration selected on validation
    under its own definition; bold marks the best of each column pair's kind (published, ours)
    per data set. Then the test NLL of the selected runs, and how much of each grid was run.
    ``baseline``: the previous-frame baseline (``results/baseline.json``, :func:`
    previous_frame_report`), a row of its own. ``seeds``: :func:`seed_groups` of the selected
    configurations re-run with other seeds, a table of their spread."""
    ours = {(r["dataset"], r["model"]): r for r in records if "test_acc" in r}
    models = [m for m in TABLE2_MODELS if m in PAPER_TABLE2 or any(k[1] == m for k in ours)]
    models += sorted({m for _, m in ours} - set(models))

    def best(values: dict[str, float | None]) -> float | None:
        present = [v for v in values.values() if v is not None]
        return max(present) if present else None

    published = {d: {m: PAPER_TABLE2[m][i] if m in PAPER_TABLE2 else None for m in models}
                 for i, d in enumerate(TABLE2_DATASETS)}
    top_pub = {d: best(published[d]) for d in TABLE2_DATASETS}

    def cell(value: float | None, top: float | None, mark: str = "") -> str:
        if value is None:
            return "–"
        text = f"{value:.2f}" + mark
        reduced = "¶" in mark  # never bold beside the paper's figures
        return (f"**{text}**" if top is not None and round(value, 2) == round(top, 2)
                and not reduced else text)

    def score(r: dict, key: str) -> float | None:
        if key == "test_acc_frame" and r.get("frame_selection"):  # the column's own selection
            return r["frame_selection"]["test_acc_frame"]
        return r.get(key)  # per-frame without its own selection: the global one's, marked §

    def table(key: str, ours_title: str, paper: bool = True) -> list[str]:
        head = "| model | " + " | ".join(
            (f"{TABLE2_TITLES[d]} (paper) | " if paper else "") + f"{TABLE2_TITLES[d]} "
            f"({ours_title})" for d in TABLE2_DATASETS) + " |"
        rows = [head, "|---|" + "---:|" * ((2 if paper else 1) * len(TABLE2_DATASETS))]
        measured = {d: {m: score(ours[(d, m)], key) if (d, m) in ours else None
                        for m in models} for d in TABLE2_DATASETS}
        lower_is_better = key == "test_nll"
        top_ours = {d: (min if lower_is_better else max)(
            [v for v in measured[d].values() if v is not None], default=None)
            for d in TABLE2_DATASETS}
        for m in models:
            cells = []
            for d in TABLE2_DATASETS:
                r = ours.get((d, m))
                if paper:
                    cells.append(cell(published[d][m], top_pub[d]))
                mark = "" if r is None else ("‡" if r["grid"] == "runs" else
                                             "" if r["grid_complete"] else "†")
                if r is not None and r.get("reduced"):
                    mark += "¶"
                if r is not None and key == "test_acc_frame" and not r.get("frame_selection"):
                    mark += "§"
                if r is not None and key == "test_acc_at_valid_threshold" and \
                        r.get("valid_threshold") is not None:
                    mark += f" ({r['valid_threshold']:.2f})"
                cells.append(cell(measured[d][m], top_ours[d], mark))
            rows.append(f"| {display_name(m)} | " + " | ".join(cells) + " |")
        if baseline is not None and key in ("test_acc", "test_acc_frame",
                                            "test_acc_at_valid_threshold"):
            field = "acc_frame" if key == "test_acc_frame" else "acc"  # 0/1: any threshold
            cells = []
            for d in TABLE2_DATASETS:
                if paper:
                    cells.append("–")
                value = baseline["scores"].get(d, {}).get("test", {}).get(field)
                cells.append("–" if value is None else f"{value:.2f}")
            rows.append("| previous frame (no training) | " + " | ".join(cells) + " |")
        return rows

    lines = table("test_acc", "ours")
    frame_rows = table("test_acc_frame", "ours, per-frame mean")
    # a mark is explained only where a cell carries it
    incomplete, frame_from_global = any("†" in r for r in lines), any("§" in r for r in frame_rows)
    reductions = sorted({f"{r['model']} on {r['dataset']}: {', '.join(r['reduced'])}"
                         for r in ours.values() if r.get("reduced")})
    lines += ["", "Test frame accuracy in % (Bay et al. 2009, global, threshold 0.5; equal to "
              "mir_eval's multipitch accuracy: our headline) of the configuration selected on "
              "validation accuracy. *RNN-RBM: the paper quotes Boulanger-Lewandowski et al. "
              "(2012), whose figures are expected accuracies over samples of the model."
              + (" †: selected from a grid that is not complete yet." if incomplete else "")
              + (" ¶: from a reduced search (" + "; ".join(reductions) + "): not comparable "
                 "with the paper's figures, and never bold." if reductions else "")
              + " ‡: not a grid search: the best on "
              "validation of the runs listed below. –: not run. Bold: the best published and "
              "the best of ours per data set." + (" The previous-frame row predicts each frame "
              "to be the one before (no training): it calibrates every other row." if baseline
              else ""), "",
              "The per-frame mean of TP / (TP + FP + FN) (`frame_accuracy(..., "
              "average=\"frame\")`; the definition of the authors' code in the paper's period, "
              "see `results/search.md`: the figure to compare with the paper's), each "
              "configuration selected on validation under this definition"
              + (" (§: selected on the global accuracy instead, the grid's per-frame "
                 "validation scores not being kept)" if frame_from_global else "") + ":", "",
              *frame_rows]
    expected = [m for m in models if any(ours.get((d, m), {}).get("test_acc_expected")
                                         is not None for d in TABLE2_DATASETS)]
    if expected:
        lines += ["", "Expected accuracy (Boulanger-Lewandowski et al. 2012: the mean over frames "
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
                r = ours.get((d, m), {})
                quoted = published[d][m] if m == "rnn-rbm" else None
                cells.append("–" if quoted is None else f"{quoted:.2f}")
                cells.append("–" if r.get("test_acc_expected") is None else
                             f"{r['test_acc_expected']:.2f} ± {r['test_acc_expected_se']:.2f}")
            lines.append(f"| {display_name(m)} | " + " | ".join(cells) + " |")
    if any(r.get("test_acc_at_valid_threshold") is not None for r in ours.values()):
        grid = ", ".join(map(str, THRESHOLD_GRID))
        lines += ["", "The global accuracy of the first table's configurations with the "
                  f"decision threshold chosen on validation (in parentheses; one of {grid}) "
                  "instead of 0.5, the configurations unchanged: how much of the gap to the "
                  "previous-frame row is the threshold's (the test split takes no part in the "
                  "choice)" + (f"; a model that picks {max(THRESHOLD_GRID)}, the grid's top, "
                               "might score more above it" if any(
                                   r.get("valid_threshold") == max(THRESHOLD_GRID)
                                   for r in ours.values()) else "") + ":", ""]
        lines += table("test_acc_at_valid_threshold", "ours, threshold from valid", paper=False)
    lines += ["", "Test NLL in nats per time step of the configurations of the first table "
              "(the paper reports none; the RNN-RBM's is an AIS estimate):", ""]
    lines += table("test_nll", "ours", paper=False)
    if seeds:
        lines += ["", "Seeds (`linmem reseed`): the selected configurations trained again with "
                  "other seeds:", ""]
        lines += _seeds_lines(seeds)
    lines += ["", "Grid coverage (points run of the grid; pruned points were stopped early by the "
              "median pruner on validation accuracy):", ""]
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
    if command:
        lines += ["", f"Generated by `{command}` from the search studies; each selected run's "
                  "command, commit, seed and data checksum are in `summary.json`."]
    return "\n".join(lines) + "\n"


FIGURE4_MODELS = ("rnn", "lstm", "lmn-b", "pret-lmn-b")


def protocols_markdown(paper: Sequence[dict], linmem: Sequence[dict],
                       command: str | None = None) -> str:
    """Table 2 under both training protocols side by side (issue 43): per data set and model
    the paper's figure, ours under the paper's protocol (the per-frame mean first: the paper's
    metric; the global accuracy beside it) and ours under linmem's, each cell the test accuracy
    of the configuration selected on that accuracy's validation score. ``paper`` and ``linmem``
    are the two reports' records (:func:`linmem.search.search_records`,
    :func:`summary_file_records`)."""
    def by_key(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
        return {(r["dataset"], r["model"]): r for r in records if r.get("test_acc") is not None}

    def cells(r: dict | None) -> list[str]:
        if r is None:
            return ["–", "–"]
        mark = "" if r.get("grid") == "runs" or r.get("grid_complete") else "†"
        frame = (r.get("frame_selection") or {}).get("test_acc_frame")
        return [("–" if frame is None else f"{frame:.2f}{mark}"), f"{r['test_acc']:.2f}{mark}"]

    ours, theirs = by_key(paper), by_key(linmem)
    lines = ["| data set | model | paper | paper protocol: per-frame | global | "
             "linmem protocol: per-frame | global |", "|---|---|---:|---:|---:|---:|---:|"]
    for i, d in enumerate(TABLE2_DATASETS):
        for m in TABLE2_MODELS:
            if (d, m) not in ours and (d, m) not in theirs:
                continue
            published = PAPER_TABLE2[m][i] if m in PAPER_TABLE2 else None
            lines.append(f"| {TABLE2_TITLES[d]} | {display_name(m)} | "
                         + ("–" if published is None else f"{published:.2f}") + " | "
                         + " | ".join(cells(ours.get((d, m))) + cells(theirs.get((d, m))))
                         + " |")
    lines += ["", "Test frame accuracy in %: the per-frame mean of TP / (TP + FP + FN) (the "
              "metric of the paper's code) and the global one (Bay et al., mir_eval's), each of "
              "the configuration selected on that accuracy's validation score. The paper "
              "protocol: batch 1, BCE averaged over keys and frames, clip 10, the readout's "
              "default initialisation, early stopping on the per-frame accuracy, no pruning; "
              "linmem's: batch 4, the NLL summed over keys, clip 5, the readout bias at the keys' "
              "rates, early stopping on the global accuracy, the median pruner. †: selected "
              "from a grid that is not complete yet. –: not run."]
    return "\n".join(lines + _made_by(command)) + "\n"


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


def plot_roll(prime: np.ndarray, continuation: np.ndarray, path: str | os.PathLike,
              title: str = "") -> None:
    """The prime and its continuation as one piano roll (time across, keys up), a line where
    the continuation starts; a PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roll = np.concatenate([prime, continuation]).astype(float)
    fig, ax = plt.subplots(figsize=(max(6.0, min(18.0, len(roll) / 12)), 4.0))
    ax.imshow(roll.T, origin="lower", aspect="auto", cmap="Greys", interpolation="nearest",
              extent=(-0.5, len(roll) - 0.5, 20.5, 108.5))
    ax.axvline(len(prime) - 0.5, color="tab:red", lw=1.2, label="continuation starts")
    ax.set_xlabel("time step")
    ax.set_ylabel("MIDI note")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def plot_run(run_dir: str | os.PathLike, path: str | os.PathLike) -> list[str]:
    """A run's training curves from its ``log.jsonl``: the training loss, the validation NLL and
    (when it was measured) the validation accuracy per epoch, the selected epoch (the one
    ``best.pt`` holds) marked; a PNG written atomically. Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    log_file = Path(run_dir) / "log.jsonl"
    if not log_file.is_file():
        raise FileNotFoundError(f"{log_file} does not exist: not a run directory, or no epoch "
                                "finished yet")
    rows = _log_rows(run_dir)
    if not rows:
        raise ValueError(f"{log_file} holds no epoch")
    epochs = [r["epoch"] for r in rows]
    loss_key = next(k for k in rows[0] if k.startswith("train_"))
    nll_key = next(k for k in rows[0] if k.startswith("valid_nll"))
    flagged = [r["epoch"] for r in rows if r.get("best")]  # the epochs that made best.pt
    best = flagged[-1] if flagged else max(rows, key=lambda r: r["valid_acc"])["epoch"]
    panels = [(loss_key, f"training {loss_key.removeprefix('train_').replace('_', ' ')}"),
              (nll_key, "validation NLL (nats per step)"),
              ("valid_acc", "validation frame accuracy (%)")]
    if all(r.get("valid_acc") is None for r in rows):  # selected on NLL, no marginals drawn
        panels = panels[:2]
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (key, title) in zip(axes, panels, strict=True):
        ax.plot(epochs, [r[key] for r in rows], lw=1.2)
        ax.axvline(best, color="tab:red", lw=1, ls="--", label=f"selected epoch {best}")
        ax.set_title(title)
        ax.set_xlabel("epoch")
    axes[-1].legend(fontsize=8)
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return [title for _, title in panels]


def plot_prediction(truth: np.ndarray, probs: np.ndarray, path: str | os.PathLike,
                    title: str = "", threshold: float = 0.5) -> list[str]:
    """A sequence's next frames (``truth``, ``(T, 88)``) above the model's key probabilities
    (``probs``), and the frames' keys it got right, missed and added at ``threshold``, apart;
    a PNG written atomically. Returns the panels' titles."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    truth, pred = np.asarray(truth) > 0, np.asarray(probs) >= threshold
    outcome = np.zeros(truth.shape)
    outcome[truth & pred], outcome[truth & ~pred], outcome[~truth & pred] = 1, 2, 3
    titles = ["truth (next frames)", "predicted key probabilities",
              f"at threshold {threshold:g}: right (green), missed (red), added (blue)"]
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, min(18.0, len(truth) / 10)), 9),
                             sharex=True)
    extent = (-0.5, len(truth) - 0.5, 20.5, 108.5)
    axes[0].imshow(truth.T, origin="lower", aspect="auto", cmap="Greys", extent=extent,
                   interpolation="nearest")
    image = axes[1].imshow(np.asarray(probs).T, origin="lower", aspect="auto", cmap="viridis",
                           vmin=0, vmax=1, extent=extent, interpolation="nearest")
    fig.colorbar(image, ax=axes[1], fraction=0.02)
    colours = ListedColormap(["white", "tab:green", "tab:red", "tab:blue"])
    axes[2].imshow(outcome.T, origin="lower", aspect="auto", cmap=colours, vmin=0, vmax=3,
                   extent=extent, interpolation="nearest")
    for ax, panel in zip(axes, titles, strict=True):
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel("MIDI note")
    axes[2].set_xlabel("time step")
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return titles


def plot_figure4(data: dict, path: str | os.PathLike) -> None:
    """Figure 4 from :func:`figure4_data`, a PNG written atomically."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9.0, 4.4))
    for model, curve in data["curves"].items():
        pts = curve["points"]
        label = display_name(model)
        if not curve["grid_complete"]:
            label += " (grid incomplete)"
        line, = ax.plot([p["units"] for p in pts], [p["valid_acc"] for p in pts], "o-",
                        label=label)
        stopped = curve.get("pruned", [])
        if stopped:
            ax.plot([p["units"] for p in stopped], [p["valid_acc"] for p in stopped], "o",
                    mfc="none", color=line.get_color(),
                    label=f"{display_name(model)}: every trial pruned (best before)")
    ax.set(xlabel="hidden units (LMN: functional + memory)", ylabel="validation frame accuracy %",
           title=f"{TABLE2_TITLES.get(data['dataset'], data['dataset'])}: accuracy vs size")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def write_search_report(records: Sequence[dict], out_dir: str | os.PathLike, command: str,
                        runs_root: str | os.PathLike = ".", baseline: dict | None = None,
                        seeds: Sequence[dict] = ()) -> None:
    """``out_dir``: ``summary.json``, ``table2.md``, ``figure4.json`` (and ``.png`` when it has a
    curve; JSB Chorales, as the paper's; ``figure4-DATA.json``/``.png`` for each other data set
    with a curve), ``search_trials.json`` (no test scores) and, under ``selected/``, the files
    of each selected run found (search runs under ``runs_root``, single runs where they are):
    ``DATA-MODEL`` the global column's, ``DATA-MODEL-per-frame`` the per-frame column's where
    that is another run."""

    out_dir = Path(out_dir)
    summary = summary_records(records)
    write_json(out_dir / "summary.json", summary)
    with atomic_write(out_dir / "table2.md", "w") as f:
        f.write(table2_markdown(records, command, baseline, seeds))
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
            if run.is_dir():
                dest = out_dir / "selected" / f"{r['dataset']}-{r['model']}{suffix}"
                dest.mkdir(parents=True, exist_ok=True)
                for name in ("config.json", "log.jsonl", "metrics.json", "pretraining.json",
                             "expected.json"):
                    if (run / name).is_file():
                        shutil.copyfile(run / name, dest / name)


def previous_frame_report(datasets: Sequence[str], data_dir: str | None = None,
                          command: str | None = None) -> dict:
    """Table 2's calibration row (issue 15): the previous-frame baseline
    (:func:`linmem.metrics.previous_frame_scores`) on the validation and test splits of each data
    set, accuracies in percent under both definitions, with provenance."""
    started, commit = time.perf_counter(), git_commit()
    rows = {}
    for name in datasets:
        data = load_polyphonic(name, root=data_dir, progress=False)
        rows[name] = {}
        for split in ("valid", "test"):
            scores = previous_frame_scores(data[split])
            rows[name][split] = {"acc": 100 * scores["acc"],
                                 "acc_frame": 100 * scores["acc_frame"],
                                 "frames": scores["frames"]}
    checksums = {name: data_checksum(name, data_dir) for name in datasets}
    return {"baseline": "previous frame: frame t + 1 predicted to be frame t (no training)",
            "scores": rows,
            **provenance(command or command_line(), commit, None, checksums,
                         time.perf_counter() - started),
            "units": "accuracy in percent: acc (Bay et al. 2009, global), acc_frame (per-frame "
                     "mean); no NLL: the predictions are certain"}
