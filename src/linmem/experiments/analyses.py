"""Diagnostics of training runs: how they stopped and why, and what the first updates do.

- :func:`memory_markdown` (``linmem memory``): how runs ended, the spectral radius of their linear
  memory and the loop gain through the functional units at the start, the selected and the last
  epoch: the evidence for a divergence.
- :func:`patience_records` (``linmem patience``): what a shorter early-stopping patience would
  have selected, from the runs' logs.
- :func:`first_updates` (``linmem first-updates``): the first updates of training replayed from a
  run's initial weights.
- :func:`epoch_replay` (``linmem replay-epoch``): the epoch after a run's last checkpoint (the
  one a diverged run stopped in) replayed update by update, with the gradient's norm before
  clipping: where a divergence starts, and whether another clip would have stopped it.
- :func:`previous_frame_report` (``linmem baseline``): predicting each frame by the one before,
  computed from the data.

A pretrained recurrent network can start where a small step is a large change. pret-RNN's
``W^hh`` is the linear autoencoder's ``B``, whose eigenvalues lie near the unit circle (the
memory forgets almost nothing), and its input weights are the autoencoder's ``A`` scaled into
tanh's near-linear range: small. Adam's first update moves every weight by about the learning
rate whatever its size (after the bias correction, step 1 is ``lr * g / |g|``): weights smaller
than the learning rate change several times over in one update, an ``n x n`` recurrent matrix
can move by up to ``lr * n`` in spectral norm (when its gradient's signs line up, as an outer
product's do), which can push a radius near 1 past it, and dynamics that forget nothing carry
the change through every later step of a long sequence.

:func:`first_updates` measures this for a run: it replays the first updates of the run's training
(the trainer's own batches, in its order) from the run's initial weights at one or more learning
rates, and records the loss of each update, the recurrent matrix's spectral radius after it, and
each parameter's relative change and the validation scores before and after.
``linmem first-updates RUN_DIR`` runs it.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from linmem._check import check_device
from linmem._io import command_line, git_commit, made_by, provenance
from linmem.batching import Batch
from linmem.data import data_checksum, load_polyphonic
from linmem.metrics import previous_frame_model, previous_frame_model_scores, previous_frame_scores
from linmem.models import activation_of
from linmem.nn.diagnostics import memory_loop_gains, memory_radii_of, saturated_fraction
from linmem.nn.lmn import LMN
from linmem.training.config import TrainConfig
from linmem.training.evaluation import NonFiniteOutputs, build_run_model, evaluate, load_run_model
from linmem.training.runs import (
    BEST,
    CONFIG,
    INIT,
    LAST,
    has,
    load_checkpoint,
    log_rows,
    read_record,
)
from linmem.training.updates import batch_updates, epoch_plan, make_optimizer, training_batch

__all__ = [
    "STARTS",
    "epoch_replay",
    "epoch_replay_markdown",
    "first_updates",
    "first_updates_markdown",
    "memory_markdown",
    "memory_radii",
    "patience_markdown",
    "patience_records",
    "previous_frame_report",
    "recurrent_radius",
    "relative_change",
    "stop_early",
]


STARTS = ("init", "random")  # the run's pretrained weights (init.pt), or the trainer's draw


def recurrent_radius(model: torch.nn.Module) -> float | None:
    """The spectral radius of the first layer's recurrent matrix: the LMN's memory ``W^mm`` as
    eq. (7) uses it, through the model's memory bound
    (:func:`linmem.nn.diagnostics.memory_radii_of`), the Elman RNN's ``W^hh``; None for a core
    without a square one (LSTM and GRU stack their gates' matrices)."""
    state = {k: v.detach().double().cpu() for k, v in model.state_dict().items()}
    loop = model.core.nonlinearity if getattr(model, "loop_bound", None) else None
    radii = memory_radii_of(state, getattr(model, "memory_bound", None), loop)
    if radii:
        return radii[0]
    weight = state.get("core.weight_hh_l0")
    if weight is None or weight.shape[0] != weight.shape[1]:
        return None
    return float(torch.linalg.eigvals(weight).abs().max())


def _training_batches(config: TrainConfig, train_seqs: Sequence[np.ndarray],
                      device: str | torch.device) -> Iterator[Batch]:
    """The trainer's batches, epoch after epoch (:func:`linmem.training.updates.epoch_plan`)."""
    lengths, epoch = [len(s) for s in train_seqs], 0
    while True:
        epoch += 1
        batches, shifts = epoch_plan(config, lengths, epoch)
        for idx in batches:
            yield training_batch(train_seqs, idx, shifts, config).to(device)


def relative_change(model: torch.nn.Module, reference: torch.nn.Module) -> dict[str, float | None]:
    """``||W - W_ref|| / ||W_ref||`` (Frobenius) for each parameter of ``model``, against the
    same-named one of ``reference`` (None where the reference is all zero)."""
    ref = dict(reference.named_parameters())
    out: dict[str, float | None] = {}
    for name, weight in model.named_parameters():
        size = float(ref[name].detach().norm())
        out[name] = float((weight.detach() - ref[name].detach()).norm()) / size if size else None
    return out


def _replay(initial: torch.nn.Module, config: TrainConfig, train_seqs: Sequence[np.ndarray],
            updates: int, device: str | torch.device) -> tuple[torch.nn.Module, dict[str, Any]]:
    """``updates`` updates of ``config``'s training from a copy of ``initial``: the model and
    each update's loss (None where it was not finite: the replay stops there, as training
    does), the radius after each update, and each parameter's relative change
    (:func:`relative_change`) after the first update and after the last."""
    torch.manual_seed(config.seed)  # dropout draws repeat from replay to replay (not the run's)
    model = copy.deepcopy(initial)
    model.train()
    optimizer = make_optimizer(model.parameters(), config)
    trace: dict[str, Any] = {"losses": [], "radii": []}
    for batch in _training_batches(config, train_seqs, device):
        for loss, _ in batch_updates(model, optimizer, batch, config):
            trace["losses"].append(loss)
            trace["radii"].append(recurrent_radius(model))
            if len(trace["losses"]) == 1:
                trace["change_first"] = relative_change(model, initial)
            if loss is None or len(trace["losses"]) == updates:
                trace["change_last"] = relative_change(model, initial)
                return model, trace
    raise AssertionError("unreachable: the batches never end")


def first_updates(run_dir: str | Path, updates: int = 20, lrs: Sequence[float] = (),
                  start: str = "init", data: dict[str, list[np.ndarray]] | None = None,
                  data_dir: str | None = None, device: str | torch.device = "cpu",
                  command: str | None = None) -> dict[str, Any]:
    """Replay the first ``updates`` updates of ``run_dir``'s training from its initial weights,
    once at each learning rate of ``lrs`` (none: the run's own).

    Args:
        start: ``"init"``, the run's initial weights (``init.pt``: a pretrained run's), or
            ``"random"``, those the trainer draws for the run's configuration (the control).
        data: the data set (:func:`linmem.data.load_polyphonic`'s; loaded when None).

    Returns the initial weights' validation accuracy (global, %), NLL and recurrent radius
    (:func:`recurrent_radius`), and for each learning rate the loss of every update
    (``losses``), the radius after it (``radii``), each parameter's relative change after the
    first update and the last (``change_first``, ``change_last``, :func:`relative_change`) and
    the validation scores after the last update, with the provenance.
    """
    started = time.perf_counter()
    if start not in STARTS:
        raise ValueError(f"start must be one of {STARTS}, not {start!r}")
    if updates < 1:
        raise ValueError(f"updates must be positive, not {updates}")
    if any(not lr > 0 for lr in lrs):
        raise ValueError(f"learning rates must be positive: {list(lrs)}")
    run_dir, device = Path(run_dir), check_device(device)
    if not has(run_dir, CONFIG):
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = TrainConfig.from_run(run_dir)
    if start == "init" and not has(run_dir, INIT):
        raise FileNotFoundError(
            f"{run_dir} has no init.pt: only a pretrained run keeps its initial weights "
            "(use start 'random' for the trainer's draw)")
    root = data_dir or config.data_dir
    from_file = data is None  # data given in memory: no file to vouch for
    if from_file:
        data = load_polyphonic(config.data, root=root)
    train_seqs = [s for s in data["train"] if len(s) >= 2]
    if start == "init":
        initial = load_run_model(run_dir, "init", device)[0]
    else:
        initial = build_run_model(config, train_seqs).to(device)

    def scores(model: torch.nn.Module) -> dict[str, Any]:
        """Validation accuracy and NLL, None where the outputs overflow (a memory whose radius
        passed 1 on a sequence longer than the training batches')."""
        try:
            valid = evaluate(model, data["valid"], config.eval_batch_size, device, thresholds=())
        except NonFiniteOutputs as err:
            return {"valid_acc": None, "valid_nll": None, "valid_not_finite": str(err)}
        return {"valid_acc": 100 * valid["acc"], "valid_nll": valid["nll"]}

    replays = []
    for lr in lrs or (config.lr,):
        model, trace = _replay(initial, replace(config, lr=lr), train_seqs, updates, device)
        replays.append({"lr": lr, **trace, "finite": trace["losses"][-1] is not None,
                        **scores(model)})
    checksum = data_checksum(config.data, root) if from_file else None
    record = provenance(command or command_line(), git_commit(), config.seed, checksum,
                        time.perf_counter() - started, device)
    return {"run_dir": str(run_dir), "dataset": config.data, "model": config.model,
            "hidden": config.hidden, "memory": config.memory, "start": start,
            "updates": updates,
            "initial": {**scores(initial), "radius": recurrent_radius(initial)},
            "replays": replays, **record,
            "units": "accuracy in percent; NLL in nats per step; loss: the training loss of "
                     "each update (nats per step)"}


REPLAY_UNITS = (
    "loss: the training loss of each update in nats per step (summed over the keys); grad_norm: "
    "the norm of the gradient of the loss that is minimised (loss_reduction), before clipping; "
    "steps: the batch's longest sequence; saturated: the fraction of the first layer's "
    "functional units with |h| > 0.99 on the batch before the update (a tanh LMN's); loop gain: "
    "rho(W^mm + W^hm W^mh) after the update")


class _UpdateProbe:
    """What :func:`epoch_replay` records of a tanh LMN around each update: its first layer's
    saturated functional units on the batch before it, the memory's loop gain after it; nothing
    for another model."""

    def __init__(self, model: torch.nn.Module):
        self.model, core = model, getattr(model, "core", None)
        self.core = core if isinstance(core, LMN) and core.nonlinearity == "tanh" else None

    def before(self, batch: Batch) -> dict[str, float | None]:
        if self.core is None:
            return {}
        return {"saturated": saturated_fraction(self.core, batch.inputs, batch.mask)}

    def after(self) -> dict[str, float | None]:
        if self.core is None:
            return {}
        state = {k: v.detach() for k, v in self.model.state_dict().items()}
        return {"loop_gain": memory_loop_gains(state, "tanh", self.core.memory_bound)[0]}


def epoch_replay(run_dir: str | Path, clips: Sequence[float | None] = (),
                 data: dict[str, list[np.ndarray]] | None = None, data_dir: str | None = None,
                 device: str | torch.device = "cpu", command: str | None = None,
                 skip: Sequence[int] = ()) -> dict[str, Any]:
    """Replay the epoch after the one ``run_dir``'s ``last.pt`` holds, from its weights and
    optimizer state, with the trainer's batches in the trainer's order, once per gradient-norm
    clip of ``clips`` (None: no clipping; none given: the run's own). For a run that stopped
    diverged this is the epoch it diverged in. ``skip``: updates (numbered from 1 in the epoch)
    not taken, their batches left out (the counterfactual of one outlying update); only for a
    training with one update per batch (``chunk`` None).

    Returns for each clip every update's training loss (nats per step, unscaled; None where it
    was not finite), the gradient's norm before clipping (of the loss that is minimised), the
    recurrent radius after the update (:func:`recurrent_radius`), the longest sequence of its
    batch and the frames the loss averaged over, and for a tanh LMN the fraction of its first
    layer's functional units saturated on the batch before the update
    (:func:`~linmem.nn.diagnostics.saturated_fraction`) and the memory's loop gain after it
    (:func:`~linmem.nn.diagnostics.memory_loop_gains`: ``rho(W^mm + W^hm W^mh)``); a skipped
    update's row says ``skipped``. A replay stops at the first non-finite loss or gradient
    (training stops at the first; the second would leave NaN weights). With the provenance.
    """
    started = time.perf_counter()
    run_dir, device = Path(run_dir), check_device(device)
    if not has(run_dir, LAST):
        raise FileNotFoundError(f"{run_dir} has no {LAST}: nothing to replay from")
    config = TrainConfig.from_run(run_dir)
    if any(c is not None and not c > 0 for c in clips):
        raise ValueError(f"clips must be positive (or None: no clipping): {list(clips)}")
    skip = sorted(set(skip))
    if skip and config.chunk is not None:
        raise ValueError("skip names updates of a training with one update per batch; this run "
                         f"takes one per window of {config.chunk} steps (chunk)")
    checkpoint = load_checkpoint(run_dir / LAST, device)
    epoch = checkpoint["state"]["epoch"] + 1
    root = data_dir or config.data_dir
    from_file = data is None
    if from_file:
        data = load_polyphonic(config.data, root=root, progress=False)
    train_seqs = [s for s in data["train"] if len(s) >= 2]
    batches, shifts = epoch_plan(config, [len(s) for s in train_seqs], epoch)
    if skip and skip[-1] > len(batches):
        raise ValueError(f"skip: epoch {epoch} has {len(batches)} updates, not {skip[-1]}")
    model = load_run_model(run_dir, "last", device)[0]
    model.train()
    probe = _UpdateProbe(model)

    def updates(run_config: TrainConfig) -> Iterator[dict[str, Any]]:
        """The epoch's updates from last.pt's weights and Adam's state, one row each."""
        model.load_state_dict(checkpoint["model"])  # copied into the parameters
        optimizer = make_optimizer(model.parameters(), run_config)
        # a copy: Adam's moments would be the checkpoint's own tensors, updated in place
        optimizer.load_state_dict(copy.deepcopy(checkpoint["optimizer"]))
        torch.manual_seed(config.seed + epoch)  # dropout draws repeat from replay to replay
        for number, idx in enumerate(batches, 1):
            batch = training_batch(train_seqs, idx, shifts, run_config).to(device)
            if number in skip:
                yield {"steps": int(batch.mask.sum(1).max()), "frames": int(batch.mask.sum()),
                       "skipped": True}
                continue
            before = probe.before(batch)
            norms: list[float] = []
            for loss, part in batch_updates(model, optimizer, batch, run_config, norms):
                yield {"steps": int(part.mask.sum(1).max()), "frames": int(part.mask.sum()),
                       "loss": loss, "grad_norm": None if loss is None else norms[-1],
                       "radius": recurrent_radius(model), **before, **probe.after()}

    replays = [{"clip": clip, "skipped": skip,
                **_rows_until_not_finite(updates(replace(config, clip=clip)))}
               for clip in clips or (config.clip,)]
    checksum = data_checksum(config.data, root) if from_file else None
    record = provenance(command or command_line(), git_commit(), config.seed, checksum,
                        time.perf_counter() - started, device)
    return {"run_dir": str(run_dir), "dataset": config.data, "model": config.model,
            "hidden": config.hidden, "memory": config.memory, "epoch": epoch,
            "run_clip": config.clip, "loss_reduction": config.loss_reduction,
            "replays": replays, **record, "units": REPLAY_UNITS}


def _rows_until_not_finite(updates: Iterator[dict[str, Any]]) -> dict[str, Any]:
    """A replay's rows, numbered, up to its first non-finite loss or gradient (a skipped
    update's row aside), and whether it stayed finite."""
    rows: list[dict[str, Any]] = []
    for number, row in enumerate(updates, 1):
        rows.append({"update": number, **row})
        if not row.get("skipped") and (row["loss"] is None or not np.isfinite(row["grad_norm"])):
            return {"updates": rows, "finite": False}
    return {"updates": rows, "finite": bool(rows)}


def epoch_replay_markdown(results: Sequence[dict], command: str | None = None,
                          spikes: int = 5, tail: int = 20) -> str:
    """:func:`epoch_replay`'s results: per run and clip, how the epoch ended, the median
    gradient norm and the updates with the ``spikes`` largest, in order, and the first and the
    last ``tail`` updates' mean loss, saturated units and loop gain."""
    lines = ["| run | epoch | clip | updates | ended | median gradient norm | largest gradient "
             "norms (update: steps, loss, norm, radius after) | first updates: loss, saturated, "
             "loop gain | last updates: loss, saturated, loop gain |",
             "|---|---:|---:|---:|---|---:|---|---|---|"]
    for r in results:
        for rep in r["replays"]:
            rows = rep["updates"]
            ok = [u for u in rows if u.get("grad_norm") is not None]
            top = sorted(sorted(ok, key=lambda u: -u["grad_norm"])[:spikes],
                         key=lambda u: u["update"])
            cells = "; ".join(
                f"{u['update']}: {u['steps']}, {u['loss']:.3g}, {u['grad_norm']:.3g}, "
                + ("–" if u["radius"] is None else f"{u['radius']:.3f}") for u in top)
            last = rows[-1] if rows else None
            ended = ("the epoch's end" if rep["finite"] else
                     f"not finite at update {last['update']} ({last['steps']} steps: "
                     + ("loss" if last["loss"] is None else "gradient") + ")")
            clip = "none" if rep["clip"] is None else f"{rep['clip']:g}"
            if rep.get("skipped"):
                clip += f" (update{'s' * (len(rep['skipped']) > 1)} " + ", ".join(
                    map(str, rep["skipped"])) + " left out)"
            median = f"{np.median([u['grad_norm'] for u in ok]):.3g}" if ok else "–"
            lines.append(f"| {r['run_dir']} | {r['epoch']} | {clip} | {len(rows)} | {ended} | "
                         f"{median} | {cells} | {_updates_text(ok[:tail])} | "
                         f"{_updates_text(ok[-tail:])} |")
    if results:
        lines += ["", f"{results[0]['units']}."]
    return "\n".join(lines + made_by(command)) + "\n"


def _updates_text(rows: Sequence[dict]) -> str:
    """The mean loss (frame-weighted), saturated fraction and loop gain of some updates (the
    first or the last of a replay); – where the model has none."""
    if not rows:
        return "–"
    loss = sum(u["loss"] * u["frames"] for u in rows) / sum(u["frames"] for u in rows)
    parts = [f"{loss:.3g}"]
    for key, fmt in (("saturated", "{:.1%}"), ("loop_gain", "{:.2f}")):
        values = [u[key] for u in rows if u.get(key) is not None]
        parts.append(fmt.format(sum(values) / len(values)) if values else "–")
    return ", ".join(parts)


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
    units (:func:`linmem.nn.diagnostics.memory_loop_gains`) at the start and the selected epoch: the
    evidence for a divergence."""

    def numbers(values: list[float]) -> str:
        return ", ".join(f"{v:.3f}" for v in values) or "–"

    def columns(run: Path, record: dict) -> str:
        """ρ(W^mm) at the start, the selected and the last epoch; the loop gain at the start
        and the selected epoch (each checkpoint read once)."""
        states = {name: _checkpoint_state(run / name) if (run / name).is_file() else None
                  for name in (INIT, BEST, LAST)}
        act = activation_of(record)
        radii = [", ".join(f"{v:.3f}" for v in memory_radii_of(states[n]))
                 if states[n] is not None else "–" for n in (INIT, BEST, LAST)]
        gains = [numbers(memory_loop_gains(states[n], act))
                 if states[n] is not None and act is not None else "–"
                 for n in (INIT, BEST)]
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
    return "\n".join(lines + made_by(command, commit and f"commit {commit}")) + "\n"


def first_updates_markdown(results: Sequence[dict], command: str | None = None) -> str:
    """A Markdown table of :func:`first_updates` results: for each run and
    learning rate, the validation scores and recurrent radius of the initial weights and after
    the replayed updates, the loss of each update, and the parameter that the first update
    changed most relative to its size."""

    def radius(value: float | None) -> str:
        return "–" if value is None else f"{value:.4f}"

    def loss(value: float | None) -> str:
        return "inf/NaN" if value is None else f"{value:.1f}"

    def valid(scores: dict) -> str:
        return ("not finite" if scores["valid_acc"] is None else
                f"{scores['valid_acc']:.2f} / {scores['valid_nll']:.2f}")

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
                f"{valid(first)} | {valid(replay)} | "
                f"{radius(first['radius'])} | {radius(replay['radii'][-1])} | {most} | "
                + " ".join(loss(v) for v in replay["losses"]) + " |")
    lines += ["", "Change: ||W - W_0|| / ||W_0|| of the parameter after the first update. "
              "Radius: the first layer's recurrent matrix (W^mm of an LMN, W^hh of an RNN). "
              "Not finite: the model's outputs overflow on a validation sequence."]
    return "\n".join(lines + made_by(command)) + "\n"


def stop_early(history: Sequence[dict], patience: int) -> tuple[int | None, int]:
    """Where a run would have ended had it stopped after ``patience`` epochs without a better
    validation score: ``(index of its selected epoch, epochs run)``, from its ``log.jsonl`` rows
    (their ``best`` flags: the run's own criterion, as
    :func:`linmem.training.trainer.train_loop` sets them)."""
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
        config = read_record(r["run"], CONFIG)
        rows = {row["epoch"]: row for row in log_rows(r["run"])}  # a resumed epoch: its last
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
    return "\n".join(lines + made_by(command, commit and f"commit {commit}")) + "\n"


def previous_frame_report(datasets: Sequence[str], data_dir: str | None = None,
                          command: str | None = None) -> dict:
    """Table 2's calibration rows on the validation and test splits of each data set: the
    previous frame (:func:`linmem.metrics.previous_frame_scores`, accuracies in percent under
    both definitions) and the per-key model of the previous frame fitted on the training split
    (:func:`linmem.metrics.previous_frame_model`, its NLL and accuracies), with provenance."""
    started, commit = time.perf_counter(), git_commit()
    rows, per_key = {}, {}
    for name in datasets:
        data = load_polyphonic(name, root=data_dir, progress=False)
        model = previous_frame_model(data["train"])
        rows[name], per_key[name] = {}, {}
        for split in ("valid", "test"):
            scores = previous_frame_scores(data[split])
            rows[name][split] = {"acc": 100 * scores["acc"],
                                 "acc_frame": 100 * scores["acc_frame"],
                                 "frames": scores["frames"]}
            fitted = previous_frame_model_scores(model, data[split])
            per_key[name][split] = {**{k: 100 * fitted[k] for k in ("acc", "acc_frame")},
                                    "nll": fitted["nll"]}
    checksums = {name: data_checksum(name, data_dir) for name in datasets}
    return {"baseline": "previous frame: frame t + 1 predicted to be frame t (no training)",
            "scores": rows,
            "per_key_model": {
                "model": "p(x_{t+1,k} = 1 | x_{t,k}): two probabilities a key, counted on the "
                         "training split (add-one smoothing); NLL in nats per frame, accuracies "
                         "at 0.5", "scores": per_key},
            **provenance(command or command_line(), commit, None, checksums,
                         time.perf_counter() - started),
            "units": "accuracy in percent: acc (Bay et al. 2009, global), acc_frame (per-frame "
                     "mean); the previous frame has no NLL (its predictions are certain), the "
                     "per-key model has"}
