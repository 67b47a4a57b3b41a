"""Training with the paper's protocol: Adam, L2 weight decay, early stopping on validation accuracy.

A run lives in one directory::

    config.json     the TrainConfig of the run
    log.jsonl       one line per epoch: train loss, validation accuracy and NLL, epoch wall
                    and CPU time
    last.pt         model, optimizer and loop state after the last finished epoch (for --resume)
    best.pt         model weights of the best validation accuracy so far
    metrics.json    final validation and test scores of best.pt, with provenance (the
                    machine of the timings included)
    diverged.json   instead of metrics.json, when the run failed by diverging (no epoch to
                    keep, or ``on_divergence="raise"``): why, the epochs kept, provenance

Every file is written atomically, so a run killed at any moment resumes from its last finished
epoch. The batch order of epoch ``e`` depends only on ``(seed, e)`` and the model and optimizer
states are restored exactly, so a resumed run ends with the same numbers as an uninterrupted one.
The test split is scored once, at the end, on the checkpoint chosen on the validation split.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from linmem._check import check_device
from linmem._io import (
    command_line,
    git_commit,
    provenance,
    write_json,
)
from linmem.data import (
    DataError,
    content_digest,
    data_checksum,
    data_root,
    is_data_file,
    load_polyphonic,
    step_seconds,
)
from linmem.models import (
    count_parameters,
)
from linmem.ops.paths import cpu_kernel_path, gpu_paths_taken, use_cpu_kernel
from linmem.training.config import TrainConfig
from linmem.training.evaluation import (
    NonFiniteOutputs,
    build_run_model,
    check_size,
    divergence_note,
    evaluate,
    load_run_model,
)
from linmem.training.runs import (
    BEST,
    CONFIG,
    DIVERGED,
    LAST,
    LOCK,
    MEMORY,
    METRICS,
    PRETRAINING,
    ULM,
    RunDirClaim,
    has,
    load_checkpoint,
    read_record,
    resume_checkpoint,
    save_checkpoint,
    save_last,
    write_log,
)
from linmem.training.selection import selection_score
from linmem.training.updates import (
    batch_updates,
    epoch_plan,
    make_optimizer,
    training_batch,
)

__all__ = ["SilentDataWarning", "TrainingDiverged", "train_loop", "with_data_dir"]


class SilentDataWarning(UserWarning):
    """A split of the data holds no note: its accuracy is 100 % for a silent model."""


class TrainingDiverged(RuntimeError):
    """The training loss, or the model's outputs on the validation sequences, became NaN or
    infinite; or the checkpoint chosen on validation gives such outputs on the test split.
    ``failed_on`` says which (:data:`linmem.training.runs.FAILURES`)."""

    def __init__(self, message: str, failed_on: str = "training"):
        super().__init__(message)
        self.failed_on = failed_on


class _LossNotFinite(ArithmeticError):
    """The training loss of an update was NaN or inf (inside :func:`train_loop`)."""


def _train_epoch(model: torch.nn.Module, optimizer: torch.optim.Optimizer, bar: Iterable,
                 train_seqs: Sequence[np.ndarray], shifts: np.ndarray, config: TrainConfig,
                 device: torch.device, epoch: int) -> tuple[float, float]:
    """One epoch of updates over the batches of indices ``bar``; returns the frame-weighted
    loss sum and the frame count. Raises :class:`_LossNotFinite` at a NaN/inf loss (the update
    is not made)."""
    loss_sum = frames = 0.0
    for idx in bar:
        batch = training_batch(train_seqs, idx, shifts, config).to(device)
        for loss, part in batch_updates(model, optimizer, batch, config):
            if loss is None:
                raise _LossNotFinite(f"the training loss became NaN or inf in epoch {epoch}"
                                     + divergence_note(model, part))
            n = float(part.mask.sum())
            loss_sum += loss * n
            frames += n
        bar.set_postfix(loss=f"{loss_sum / frames:.3f}")
    return loss_sum, frames


def _stop_diverged(run_dir: Path, state: dict[str, Any], why: str, elapsed: float,
                   cpu_elapsed: float) -> dict[str, Any]:
    """``on_divergence="stop"``: the run ends at its last good epoch (``state``, that of
    ``last.pt``, whose weights stay: the diverged ones are dropped) and keeps its best
    checkpoint, as early stopping does. Returns the new state, also written to ``last.pt``."""
    ckpt = load_checkpoint(run_dir / LAST)
    ckpt["state"] = {**state, "stop_reason": f"diverged: {why}; the best epoch before it is kept",
                     "elapsed": elapsed, "cpu_elapsed": cpu_elapsed}
    save_last(ckpt, run_dir)
    return ckpt["state"]


def train_loop(
    config: TrainConfig,
    run_dir: str | Path,
    resume: bool = False,
    progress: bool = True,
    data: dict[str, list[np.ndarray]] | None = None,
    on_epoch_end: Callable[[int, dict], None] | None = None,
    command: str | None = None,
    initialize: Callable[[torch.nn.Module], None] | None = None,
) -> dict[str, Any]:
    """The training loop: train ``config``'s model, as built (``initialize`` aside), in
    ``run_dir`` and return the final metrics (also in ``metrics.json``). It does not pretrain:
    :func:`linmem.train` is the entry point, which runs a model's pretraining recipe first.

    Args:
        resume: continue the run in ``run_dir`` from ``last.pt`` (its saved config must equal
            ``config`` but for the budget, :data:`BUDGET_FIELDS`, the device and the data
            folder: a larger ``epochs`` or ``patience`` continues a finished run), or start it if
            ``run_dir`` holds no run yet. Without it, ``run_dir`` must not hold a run already.
            A finished run that the budget does not extend is left as it is and its metrics
            returned.
        data: the data set as returned by :func:`linmem.data.load_polyphonic` (loaded from
            ``config.data_dir`` when None).
        on_epoch_end: called as ``f(epoch, log_row)`` after each epoch's checkpoint is written.
        command: the command to record (default: this process's command line).
        initialize: called once on the freshly built model (after the readout bias is set,
            before training; not when resuming from a checkpoint): the pretraining recipes of
            :mod:`linmem.training.recipes` initialise the model's weights through it.

    Raises:
        TrainingDiverged: the loss or the validation outputs became NaN/inf with
            ``config.on_divergence == "raise"``, or in the first epoch (no good epoch to keep);
            ``last.pt`` keeps the last good epoch, ``diverged.json`` records why. With
            ``"stop"`` the run ends there instead and stays ended on ``resume``.
    """
    if not str(run_dir).strip():
        raise ValueError("the run directory must be named (an empty name is the current folder)")
    created = not Path(run_dir).exists()
    with RunDirClaim(run_dir) as claim, use_cpu_kernel(config.cpu_kernel):
        try:
            return _train(config, Path(run_dir), claim, resume, progress, data, on_epoch_end,
                          command, initialize)
        except OSError as err:
            # a fault of the machine (a full disk) before anything could be kept: the start
            # failed, and leaves no half-made folder behind (which the error says: there is
            # nothing to resume)
            if created and Path(run_dir).is_dir() and not any(Path(run_dir).rglob(LAST)):
                shutil.rmtree(run_dir, ignore_errors=True)
                err.run_removed = str(run_dir)
            raise


def _recurrence_path(device: torch.device) -> str:
    """What ran the recurrences: the CPU path (a kernel variant, or the PyTorch loop), or on a
    GPU the paths the LMN's recurrence took in this process (the fused kernels, the loop)."""
    if device.type == "cpu":
        return cpu_kernel_path()
    return f"{'+'.join(gpu_paths_taken()) or 'loop'} ({device.type})"


def _check_run_dir(run_dir: Path) -> None:
    """``ValueError`` when ``run_dir`` holds files but no run of ours (no ``config.json``): a
    run never writes into a folder of someone else's files. A pretraining's own inputs put
    there before the run starts (another run's unrolled network ``ulm/`` and memory
    ``memory.npz``: the same initial weights) are ours."""
    others = sorted(p.name for p in run_dir.iterdir() if p.name not in (LOCK, ULM, MEMORY))
    if others and not has(run_dir, CONFIG):
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise ValueError(f"{run_dir} holds files that are not a linmem run ({shown}): choose a "
                         "new or empty folder")


class _Clock:
    """The wall and CPU seconds of a run so far, every session's: those its checkpoint kept
    (:meth:`resume_from`) plus this call's since the clock was made (its pretraining's too)."""

    def __init__(self) -> None:
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.before = (0.0, 0.0)

    def resume_from(self, state: dict[str, Any]) -> None:
        # older checkpoints did not keep the CPU time: their wall time stands in (an upper bound)
        self.before = (state["elapsed"], state.get("cpu_elapsed", state["elapsed"]))

    def spent(self) -> tuple[float, float]:
        return (self.before[0] + time.perf_counter() - self.started,
                self.before[1] + time.process_time() - self.cpu_started)


def _claim_existing(run_dir: Path, claim: RunDirClaim) -> None:
    """Claim ``run_dir`` before reading what it holds, when it exists (no other process writes
    it meanwhile), and check it is a run's folder."""
    if run_dir.is_dir():
        claim.acquire()
        _check_run_dir(run_dir)
    elif run_dir.exists():
        raise ValueError(f"{run_dir} is a file, not a folder")


def _check_resumable(config: TrainConfig, run_dir: Path, resume: bool) -> None:
    """Refuse to write over another run: with ``resume``, a saved config must be ``config``'s
    run (:meth:`TrainConfig.identity`); without it, ``run_dir`` must hold no run."""
    if resume and has(run_dir, CONFIG):
        saved = TrainConfig.from_run(run_dir)
        given = config.identity()
        diff = {k: (v, given[k]) for k, v in saved.identity().items() if given[k] != v}
        if diff:
            raise ValueError(f"--resume with a different config than {run_dir}/config.json: "
                             + ", ".join(f"{k}: saved {a!r}, given {b!r}"
                                         for k, (a, b) in diff.items()))
    elif (run_dir / CONFIG).exists():
        raise FileExistsError(f"{run_dir} already holds a run: pass --resume to continue it, "
                              "or choose another output directory")


def _start_state(config: TrainConfig, run_dir: Path, resume: bool, command: str,
                 device: torch.device, progress: bool
                 ) -> tuple[dict[str, Any], dict[str, Any] | None, dict[str, Any] | None]:
    """``(state, checkpoint, metrics)``: a new run's state, or the state and checkpoint of the
    run to resume; ``metrics`` when that run has finished and the budget does not extend it
    (nothing is then rewritten)."""
    state = {"epoch": 0, "best_score": -math.inf, "best_epoch": 0, "bad_epochs": 0,
             "history": [], "elapsed": 0.0, "cpu_elapsed": 0.0, "stop_reason": None,
             "command": command, "resumed": []}
    ckpt = resume_checkpoint(run_dir, device) if resume else None
    if ckpt is None:
        return state, None, None
    state = {"command": command, "resumed": [], **ckpt["state"]}
    state.setdefault("best_score", state.pop("best_acc", -math.inf))  # older checkpoints
    if state["stop_reason"] is not None:
        if _budget_left(state, config) and not state["stop_reason"].startswith("diverged"):
            state["stop_reason"] = None  # a larger budget: the run goes on
        elif has(run_dir, METRICS):
            return state, ckpt, read_record(run_dir, METRICS)
    state["resumed"] = [*state["resumed"], command]
    if progress:
        print(f"linmem: resuming {run_dir} after epoch {state['epoch']}", file=sys.stderr,
              flush=True)
    return state, ckpt, None


def _training_data(config: TrainConfig, data: dict[str, list[np.ndarray]] | None,
                   progress: bool) -> tuple[TrainConfig, dict[str, list[np.ndarray]], list]:
    """``(config, data, training sequences)``: the data set loaded when not given (the config
    then names its folder), the training sequences that have a next step; a split without a
    note is warned of (every model scores 100 % on it)."""
    if data is None:
        data = load_polyphonic(config.data, root=config.data_dir, progress=progress)
        config = with_data_dir(config)
    train_seqs = [s for s in data["train"] if len(s) >= 2]
    if not train_seqs:
        raise ValueError("the training split has no sequence of length >= 2")
    silent = [split for split in ("train", "valid", "test")
              if not any(np.asarray(seq).any() for seq in data[split])]
    if silent:
        warnings.warn(f"the {' and '.join(silent)} split{'s' if len(silent) > 1 else ''} of "
                      f"{config.data} hold no note: a model that predicts silence scores 100 % "
                      "there (frames silent in both truth and prediction count as correct, as "
                      "in mir_eval); the accuracy says nothing of such a split",
                      SilentDataWarning, stacklevel=4)
    return config, data, train_seqs


def _restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer, ckpt: dict[str, Any],
             device: torch.device) -> None:
    """The model, optimiser and random generators of a resumed run's checkpoint."""
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    if "rng" in ckpt:  # loaded onto the run's device; the CPU generator's state is CPU's
        torch.set_rng_state(ckpt["rng"].cpu())
    if "cuda_rng" in ckpt and device.type == "cuda":  # a run on CUDA continued on CUDA
        torch.cuda.set_rng_state(ckpt["cuda_rng"].cpu(), device)


def _diverged(run_dir: Path, config: TrainConfig, state: dict[str, Any], why: str,
              commit: str, clock: _Clock, device: torch.device) -> dict[str, Any]:
    """An epoch that diverged: :class:`TrainingDiverged` under ``on_divergence="raise"`` or in
    the first epoch (``diverged.json`` records it: a seed that diverged counts as run), else
    the run stops at its last good epoch, whose state is returned."""
    if config.on_divergence == "raise" or state["epoch"] == 0:
        kept = (f"{run_dir / LAST} keeps epoch {state['epoch']}" if state["epoch"] else
                "no epoch had finished: nothing is kept (the initial weights, pretrained ones "
                "included, may diverge on long sequences already)")
        hint = "Lower --lr" + (" or set --clip" if config.clip is None else "")
        if config.batch_size == 1:  # Adam on one sequence's gradient
            hint += ", or average more sequences per update (--batch-size 4, as --protocol linmem)"
        _write_diverged(run_dir, config, state, why, commit, clock.spent(), device)
        raise TrainingDiverged(f"{why}; {kept}. {hint}.") from None
    return _stop_diverged(run_dir, state, why, *clock.spent())


def _record_epoch(run_dir: Path, config: TrainConfig, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, state: dict[str, Any], valid: dict,
                  train_loss: float, began: tuple[float, float], clock: _Clock,
                  device: torch.device) -> dict[str, Any]:
    """After an epoch (``state["epoch"] + 1``) scored ``valid``: ``best.pt`` when its
    :func:`~linmem.training.selection.selection_score` is the best so far, its log row (which
    is returned), the state with its stop reason, then ``last.pt`` and ``log.jsonl``."""
    epoch = state["epoch"] + 1
    score = selection_score(valid, config.select)
    improved = score > state["best_score"]
    if improved:
        state.update(best_score=score, best_epoch=epoch, bad_epochs=0)
        save_checkpoint({"model": model.state_dict(), "epoch": epoch}, run_dir / BEST)
    else:
        state["bad_epochs"] += 1
    row = {"epoch": epoch, model.train_loss_name: train_loss,
           "valid_acc": 100 * valid["acc"] if "acc" in valid else None,
           "valid_acc_frame": 100 * valid["acc_frame"] if "acc_frame" in valid else None,
           model.valid_nll_name: valid["nll"], "epoch_time_s": time.perf_counter() - began[0],
           "epoch_cpu_s": time.process_time() - began[1], "best": improved}
    state["history"].append(row)
    state["epoch"] = epoch
    state["stop_reason"] = _stop_reason(state, config)
    state["elapsed"], state["cpu_elapsed"] = clock.spent()
    # the RNG too: dropout and the RNN-RBM's Gibbs chains draw from it (on CUDA, from the
    # device's generator)
    rng = {"rng": torch.get_rng_state()}
    if device.type == "cuda":
        rng["cuda_rng"] = torch.cuda.get_rng_state(device)
    save_last({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "state": state, **rng}, run_dir)
    write_log(run_dir, state["history"])
    return row


def _epoch_line(config: TrainConfig, model: torch.nn.Module, state: dict[str, Any],
                row: dict[str, Any], valid_nll: float) -> str:
    """The line printed after an epoch: its losses, its validation scores, the best so far."""
    if config.select == "nll":
        best_text = f"nll {-state['best_score']:.3f}"
    else:
        best_text = (f"{100 * state['best_score']:.2f}%"
                     + (" per-frame" if config.select == "acc_frame" else ""))
    since = ("  * best so far" if row["best"] else
             f"  (best {best_text} at {state['best_epoch']}; "
             f"{state['bad_epochs']}/{config.patience} without a better one)")
    acc_text = "" if row["valid_acc"] is None else (
        f"acc {row['valid_acc']:.2f}% (per-frame {row['valid_acc_frame']:.2f}%)  ")
    loss_name = model.train_loss_name.removeprefix("train_").replace("_", " ")
    marginal = " (marginals)" if model.valid_nll_name != "valid_nll" else ""
    return (f"epoch {row['epoch']:4d}/{config.epochs}  train {loss_name} "
            f"{row[model.train_loss_name]:.3f}  valid {acc_text}nll {valid_nll:.3f}{marginal}  "
            f"({row['epoch_time_s']:.1f}s){since}")


def _final_metrics(run_dir: Path, config: TrainConfig, state: dict[str, Any],
                   data: dict[str, list[np.ndarray]], commit: str, clock: _Clock,
                   device: torch.device) -> dict[str, Any]:
    """Score ``best.pt`` on validation and test and write ``metrics.json``; a checkpoint whose
    outputs are not finite on a split is a failed seed (``diverged.json``)."""
    best, _ = load_run_model(run_dir, "best", device)
    scores = {}
    for split in ("valid", "test"):
        try:
            scores[split] = evaluate(best, data[split], config.eval_batch_size, device)
        except NonFiniteOutputs as err:  # finite on validation when chosen: a failed seed
            why = (f"the checkpoint chosen on validation (epoch {state['best_epoch']}) on the "
                   f"{split} split: {err}")
            _write_diverged(run_dir, config, state, why, commit, clock.spent(), device, split)
            raise TrainingDiverged(f"{why}; it cannot be scored", split) from None
    valid, test = scores["valid"], scores["test"]
    metrics = {
        **_run_fields(config),
        "valid_acc": 100 * valid["acc"], "valid_nll": valid["nll"],
        "test_acc": 100 * test["acc"], "test_nll": test["nll"],
        "valid_acc_frame": 100 * valid["acc_frame"], "test_acc_frame": 100 * test["acc_frame"],
        # diagnostic, not the reported score: the decision threshold chosen on validation
        "valid_threshold": (tuned := max(valid["acc_at"], key=valid["acc_at"].get)),
        "test_acc_at_valid_threshold": 100 * test["acc_at"][tuned],
        "test_acc_frame_at_valid_threshold": 100 * test["acc_frame_at"][tuned],
        "selected_on": f"valid {config.select}",
        "n_params": count_parameters(best), "epochs": state["epoch"],
        "best_epoch": state["best_epoch"], "stop_reason": state["stop_reason"],
        **provenance(state["command"], commit, config.seed, _checksum_or_none(config),
                     clock.spent()[0], device),
        "data_digest": content_digest(data), "device": str(device),
        "step_seconds": _step_or_none(config),
        # the order of the floating-point operations: a figure depends on it to rounding
        "recurrence_path": _recurrence_path(device),
        "pretraining": read_record(run_dir, PRETRAINING),
        "units": "accuracies in percent (Bay et al. 2009, global, threshold 0.5 unless named), "
                 "NLL in nats per time step",
    }
    if state["resumed"]:
        metrics["resumed_with"] = state["resumed"]
    metrics = best.finalize_metrics(metrics, data)  # what only the model can score
    # the CPU time of every thread: below the wall time when other processes share the cores
    metrics["wall_time_s"], metrics["cpu_time_s"] = clock.spent()
    write_json(run_dir / METRICS, metrics)
    (run_dir / DIVERGED).unlink(missing_ok=True)  # an earlier attempt's
    return metrics


def _train(config: TrainConfig, run_dir: Path, claim: RunDirClaim, resume: bool, progress: bool,
           data: dict[str, list[np.ndarray]] | None,
           on_epoch_end: Callable[[int, dict], None] | None, command: str | None,
           initialize: Callable[[torch.nn.Module], None] | None) -> dict[str, Any]:
    """:func:`train_loop`, with ``run_dir`` claimed (:class:`linmem.training.runs.RunDirClaim`) as
    soon as it exists."""
    _claim_existing(run_dir, claim)
    clock = _Clock()
    gpu_paths_taken(clear=True)  # metrics.json records the GPU paths of this run's steps
    commit = git_commit()  # the code that runs, whatever happens to the tree meanwhile
    command = command or command_line()
    device = check_device(config.device)
    _check_resumable(config, run_dir, resume)
    state, ckpt, finished = _start_state(config, run_dir, resume, command, device, progress)
    if finished is not None:
        return finished
    check_size(config)
    config, data, train_seqs = _training_data(config, data, progress)
    model = build_run_model(config, train_seqs)
    if config.chunk is not None and not hasattr(model, "chunk_loss"):
        raise ValueError(f"{config.model} cannot train on windows (--chunk): it has no "
                         "chunk_loss")
    if device.type == "cpu":  # a bad LINMEM_CPU_KERNEL is refused here, before the folder is
        _recurrence_path(device)
    # the run exists once its data and model do: a start that failed before leaves nothing
    run_dir.mkdir(parents=True, exist_ok=True)
    claim.acquire()
    write_json(run_dir / CONFIG, asdict(config))
    clock.resume_from(state)
    if initialize is not None and ckpt is None:
        try:
            initialize(model)
        except TrainingDiverged as err:  # a network that the pretraining trains diverged
            why, failed_on = f"its pretraining: {err}", f"pretraining {err.failed_on}"
            # a result as the run's own divergence is (a seed that diverged counts as run)
            _write_diverged(run_dir, config, state, why, commit, clock.spent(), device,
                            failed_on)
            raise TrainingDiverged(why, failed_on) from None
    model = model.to(device)
    optimizer = make_optimizer(model.parameters(), config)
    if ckpt is not None:
        _restore(model, optimizer, ckpt, device)
    if state["stop_reason"] is None and not _budget_left(state, config):
        state["stop_reason"] = _stop_reason(state, config)  # a smaller budget: stop here

    lengths = [len(s) for s in train_seqs]
    while state["stop_reason"] is None:
        epoch = state["epoch"] + 1
        t0, c0 = time.perf_counter(), time.process_time()
        model.train()
        batches, shifts = epoch_plan(config, lengths, epoch)
        # the bar only on a terminal (None); the per-epoch line below is printed everywhere
        bar = tqdm(batches, desc=f"epoch {epoch}", leave=False,
                   disable=None if progress else True, file=sys.stderr, dynamic_ncols=True)
        try:
            loss_sum, frames = _train_epoch(model, optimizer, bar, train_seqs, shifts, config,
                                            device, epoch)
            valid = evaluate(model, data["valid"], config.eval_batch_size, device,
                             accuracy=config.select != "nll", thresholds=())
        except _LossNotFinite as err:
            why = str(err)
        except NonFiniteOutputs as err:  # a finite training loss, a diverged model all the same
            why = f"{err} after epoch {epoch}"
        else:
            why = None
        if why is not None:
            bar.close()
            state = _diverged(run_dir, config, state, why, commit, clock, device)
            if progress:
                tqdm.write(f"linmem: {state['stop_reason']}", file=sys.stderr)
            break
        row = _record_epoch(run_dir, config, model, optimizer, state, valid, loss_sum / frames,
                            (t0, c0), clock, device)
        if progress:
            tqdm.write(_epoch_line(config, model, state, row, valid["nll"]), file=sys.stderr)
        if on_epoch_end is not None:
            on_epoch_end(epoch, row)
    return _final_metrics(run_dir, config, state, data, commit, clock, device)


def _write_diverged(run_dir: Path, config: TrainConfig, state: dict[str, Any], why: str,
                    commit: str | None, spent: tuple[float, float], device: torch.device,
                    failed_on: str = "training") -> None:
    """``diverged.json``: a run that failed by divergence is a result too (a seed that diverged
    counts as run), with its provenance and where it failed
    (:data:`linmem.training.runs.FAILURES`)."""
    write_json(run_dir / DIVERGED, {
        **_run_fields(config), "diverged": why, "failed_on": failed_on,
        "epochs": state["epoch"],
        **provenance(state["command"], commit, config.seed, _checksum_or_none(config),
                     spent[0], device),
        "cpu_time_s": spent[1], "pretraining": read_record(run_dir, PRETRAINING)})


def _run_fields(config: TrainConfig) -> dict[str, Any]:
    """What a run's result files say of the configuration first."""
    return {"dataset": config.data, "model": config.model, "hidden": config.hidden,
            "memory": config.memory, "memory_bound": config.memory_bound,
            "loop_bound": config.loop_bound, "input_path": config.input_path,
            "num_layers": config.num_layers,
            "weight_decay": config.weight_decay, "protocol": config.protocol,
            "protocol_overrides": config.protocol_overrides()}



def with_data_dir(config: TrainConfig) -> TrainConfig:
    """``config`` with the folder its data is read from made explicit (absolute), so that the
    run can be re-scored from anywhere (a data set file of your own names itself)."""
    if is_data_file(config.data):
        return config
    return replace(config, data_dir=str(data_root(config.data_dir).resolve()))


def _stop_reason(state: dict[str, Any], config: TrainConfig) -> str | None:
    if state["bad_epochs"] >= config.patience:
        return f"early stopping (patience {config.patience})"
    if state["epoch"] >= config.epochs:
        return f"reached the epoch limit ({config.epochs})"
    return None


def _budget_left(state: dict[str, Any], config: TrainConfig) -> bool:
    return _stop_reason(state, config) is None


def _step_or_none(config: TrainConfig) -> float | None:
    """The seconds one frame of the run's data lasts (a data set file of your own: the step it
    was imported at); None for data given in memory under a name that is neither."""
    try:
        return step_seconds(config.data)
    except (ValueError, DataError, OSError):
        return None


def _checksum_or_none(config: TrainConfig) -> str | None:
    try:
        return data_checksum(config.data, config.data_dir)
    except Exception:  # data given in memory, not from a file
        return None
