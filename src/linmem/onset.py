"""The first updates of training: what the optimizer does to a run's initial weights.

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
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ._check import check_device
from ._io import command_line, git_commit, provenance, read_json
from .data import Batch, data_checksum, load_polyphonic
from .nn import memory_radii_of
from .train import (
    TrainConfig,
    batch_updates,
    build_run_model,
    epoch_plan,
    evaluate,
    load_run_model,
    make_optimizer,
    training_batch,
)

__all__ = ["STARTS", "first_updates", "recurrent_radius", "relative_change"]

STARTS = ("init", "random")  # the run's pretrained weights (init.pt), or the trainer's draw


def recurrent_radius(model: torch.nn.Module) -> float | None:
    """The spectral radius of the first layer's recurrent matrix: the LMN's memory ``W^mm``
    (:func:`linmem.nn.memory_radii_of`), the Elman RNN's ``W^hh``; None for a core without a
    square one (LSTM and GRU stack their gates' matrices)."""
    state = {k: v.detach().double().cpu() for k, v in model.state_dict().items()}
    radii = memory_radii_of(state)
    if radii:
        return radii[0]
    weight = state.get("core.weight_hh_l0")
    if weight is None or weight.shape[0] != weight.shape[1]:
        return None
    return float(torch.linalg.eigvals(weight).abs().max())


def _training_batches(config: TrainConfig, train_seqs: Sequence[np.ndarray],
                      device: str | torch.device) -> Iterator[Batch]:
    """The trainer's batches, epoch after epoch (:func:`linmem.train.epoch_plan`)."""
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
    if not (run_dir / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = TrainConfig.from_dict(read_json(run_dir / "config.json"))
    if start == "init" and not (run_dir / "init.pt").is_file():
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
        valid = evaluate(model, data["valid"], config.eval_batch_size, device, thresholds=())
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
