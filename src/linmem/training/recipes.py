"""Multi-step recipes above the training loop: pretraining, then training.

:func:`train` (:func:`linmem.train`) is the one training entry point (``linmem train``, the
search): it trains a model of the registry (:mod:`linmem.models`) with
:func:`linmem.training.trainer.train_loop`, after initialising it by the model's recipe
(:attr:`~linmem.registry.ModelSpec.recipe`) when it has one:

- ``ulm-transfer`` (pret-LMN-A/B, paper section "Training and pretraining algorithm"): train the
  unrolled network (``RUN_DIR/ulm``, or an entry of ``ulm_cache`` shared by the runs whose
  unrolled network is the same), fit the linear autoencoder of its states
  (``RUN_DIR/memory.npz``), initialise the LMN by eqs. (12)-(15) (:mod:`linmem.pretrain`);
- ``la-rnn`` (pret-RNN, Pasa & Sperduti 2014): the Elman RNN from an autoencoder of the inputs;
- ``rnn-rbm`` (Boulanger-Lewandowski et al. 2012): the RBM by CD on all frames and the RNN from
  a next-step RNN (``RUN_DIR/rnn``), each when asked for.

The initial weights are kept in ``RUN_DIR/init.pt`` and what was done in
``RUN_DIR/pretraining.json``, so an interrupted recipe resumes where it stopped. The mathematics
stays in :mod:`linmem.pretrain` and :mod:`linmem.nn.rnnrbm`; this module only orders the steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from linmem._io import machine, read_json, write_json
from linmem.data import load_polyphonic
from linmem.la import LinearAutoencoder
from linmem.models import default_nonlinearity
from linmem.nn.diagnostics import memory_loop_gains
from linmem.nn.rnnrbm import init_from_rnn, pretrain_rbm
from linmem.pretrain import fit_memory, hidden_states, pretrain_rnn, transfer
from linmem.registry import REGISTRY, get_spec
from linmem.training.config import PLACE_FIELDS, TrainConfig
from linmem.training.evaluation import load_run_model
from linmem.training.runs import (
    BEST,
    DIVERGED,
    INIT,
    MEMORY,
    PRETRAINING,
    ULM,
    end_record,
    failed_on,
    has,
    read_record,
    records_only,
    save_checkpoint,
    trained,
)
from linmem.training.trainer import TrainingDiverged, train_loop, with_data_dir

try:
    import fcntl
except ImportError:  # not POSIX: runs do not share their unrolled networks
    fcntl = None

__all__ = [
    "RECIPES",
    "Recipe",
    "lmn_window",
    "pretrain",
    "pretrained_models",
    "train",
    "ulm_config",
    "ulm_key",
]

Data = dict[str, list[np.ndarray]]


@dataclass(frozen=True)
class Recipe:
    """An initialisation: ``apply(model, config, data, run_dir, progress)`` sets the model's
    weights in place and returns what it did; ``needed(config)`` says whether the run asks for it
    (the RNN-RBM's steps are options: ``optional`` recipes run only when asked for)."""

    apply: Callable[[torch.nn.Module, TrainConfig, Data, Path, bool], dict[str, Any]]
    optional: bool = False
    needed: Callable[[TrainConfig], bool] = lambda config: True


def ulm_config(config: TrainConfig) -> TrainConfig:
    """The trainer settings of the unrolled network: the LMN's, for the model ``ulm`` of the same
    functional size (``pretrain_epochs`` bounds its epochs when set, ``ulm_nonlinearity`` sets
    its activation when it differs from the LMN's). It has no linear memory, so no
    ``memory_bound``: a bounded LMN's memory is put into its ball at the transfer
    (:func:`linmem.pretrain.project_memory`), and its ULM is the unbounded one's (one cache
    entry for both)."""
    return replace(config, model="ulm", memory=None, memory_bound=None, loop_bound=False,
                   input_path="none",
                   epochs=config.pretrain_epochs or config.epochs, pretrain_epochs=None,
                   nonlinearity=config.ulm_nonlinearity or config.nonlinearity,
                   ulm_nonlinearity=None, ulm_cache=None)


def lmn_window(config: TrainConfig) -> int | None:
    """The autoencoder's window for pret-lmn: ``k + 1`` unless ``la_window`` says otherwise
    (0: full length)."""
    if config.la_window is None:
        return config.k + 1
    if config.la_window == 0:
        return None
    if config.la_window < config.k + 1:
        raise ValueError(f"--la-window must be at least k + 1 = {config.k + 1} (0: full length)")
    return config.la_window


def ulm_key(config: TrainConfig) -> str:
    """The name of the unrolled network of pret-LMN ``config`` in a ``ulm_cache`` folder: the
    same for every run whose ULM has the same settings (a grid's memory sizes), as the ULM does
    not depend on the memory size. It hashes the fields of :func:`ulm_config` that differ from
    their defaults, but where it runs (:data:`linmem.training.trainer.PLACE_FIELDS`), so that a
    setting added to :class:`~linmem.training.config.TrainConfig` later leaves existing entries'
    names as they were; the defaults are those under
    :data:`~linmem.training.config.LEGACY_PROTOCOL`, as when the names were first made (linmem
    train's default protocol changed since)."""
    ulm = _ulm_named(config)
    defaults = type(ulm).legacy_defaults()
    fields = {k: v for k, v in asdict(ulm).items() if k not in PLACE_FIELDS and v != defaults[k]}
    return _ulm_name(ulm, fields)


def _ulm_named(config: TrainConfig) -> TrainConfig:
    """:func:`ulm_config` with its activation spelt out, as the cache's names hash it."""
    ulm = ulm_config(config)
    return replace(ulm, nonlinearity=ulm.nonlinearity or default_nonlinearity("ulm"))


def _ulm_name(ulm: TrainConfig, fields: dict[str, Any]) -> str:
    digest = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:12]
    return f"{ulm.data}-h{ulm.hidden}-{ulm.nonlinearity}-s{ulm.seed}-{digest}"


def _legacy_ulm_key(config: TrainConfig) -> str:
    """The name :func:`ulm_key` gave until 2026-11-24: a hash of every field but the device and
    the data folder, which any field added to TrainConfig changed. A finished entry of that name
    (a cache made before) is read, not trained again."""
    ulm = _ulm_named(config)
    return _ulm_name(ulm, {k: v for k, v in asdict(ulm).items()
                           if k not in ("device", "data_dir")})


def _ulm_ready(folder: Path) -> bool:
    """Whether an unrolled network's run can be transferred: trained (its checkpoint here), or
    ended because the checkpoint chosen on validation is not finite on the test split. The
    transfer reads that checkpoint as chosen; the network's test score is a diagnostic of the
    pretraining, and the LMN is scored on its own. A network that failed in training or on
    validation has no usable choice."""
    if trained(folder):
        return True
    record = read_record(folder, DIVERGED)
    return record is not None and has(folder, BEST) and failed_on(record) == "test"


def _train_ulm(config: TrainConfig, data: Data, run_dir: Path,
               progress: bool) -> tuple[Path, bool]:
    """The finished run of pret-LMN ``config``'s unrolled network: ``run_dir/ulm``, or with
    ``config.ulm_cache`` the cache entry :func:`ulm_key` names, trained by the first run that
    needs it and read by the others; and whether this call trained it (its last part at least).
    A run that finds the entry in training by another process trains its own in
    ``run_dir/ulm`` (nobody waits); a ``run_dir/ulm`` begun before (a run started without the
    cache, or beside a busy entry) is finished there and copied into the cache when the entry
    is not there yet. An entry named as before 2026-11-24 (:func:`_legacy_ulm_key`) is read when
    finished, else renamed and finished under its new name. Finished means with its checkpoint
    (:func:`_ulm_ready`: one that fails on the test split alone counts): an entry that holds only a
    finished network's records (published, then copied onto this machine without checkpoints) is
    trained again in their place, and says so."""
    trained_here = False

    def finished(folder: Path) -> Path:
        nonlocal trained_here
        if not _ulm_ready(folder):
            if records_only(folder):
                warnings.warn(f"{folder} holds a finished unrolled network's records but not its "
                              "checkpoint (copied from another machine): training it again",
                              stacklevel=2)
                shutil.rmtree(folder)
            try:
                train_loop(ulm_config(config), folder, resume=True, progress=progress, data=data)
            except TrainingDiverged as err:
                if not _ulm_ready(folder):
                    raise
                warnings.warn(f"the unrolled network's checkpoint is not finite on the test "
                              f"split ({err}); the transfer uses it as chosen on validation",
                              stacklevel=2)
            trained_here = True
        return folder

    own = run_dir / ULM
    if config.ulm_cache is None or fcntl is None:
        return finished(own), trained_here
    entry = Path(config.ulm_cache) / ulm_key(config)
    legacy = entry.parent / _legacy_ulm_key(config)
    if not _ulm_ready(entry) and _ulm_ready(legacy):
        return legacy, trained_here  # finished before the names changed: never written again
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process trains it
            return finished(own), trained_here
        if _ulm_ready(entry):
            return entry, trained_here
        if not entry.is_dir() and legacy.is_dir():  # begun under the former name: go on there
            with open(entry.parent / f".{legacy.name}.lock", "a") as old_lock:
                try:
                    fcntl.flock(old_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.replace(legacy, entry)
                except BlockingIOError:  # in training by a process that names it so
                    return finished(own), trained_here
        if not own.is_dir():
            return finished(entry), trained_here
        tmp = entry.parent / f".{entry.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(finished(own), tmp)
        shutil.rmtree(entry, ignore_errors=True)  # an unfinished entry
        os.replace(tmp, entry)
        return entry, trained_here


def _ulm_transfer(model: torch.nn.Module, config: TrainConfig, data: Data, run_dir: Path,
                  progress: bool) -> dict[str, Any]:
    """pret-LMN: the ULM, the memory on its states, the transfer (eqs. 10-15); the ULM run and
    the memory are kept for resuming. The CPU time of the ULM's training is recorded for the
    run that trained it (``ulm_cpu_time_s``, every session's; 0 for a run that read it), with
    the part spent in this process (``ulm_cpu_here_s``, inside the recipe's ``cpu_time_s``): a
    ULM stage cut by a killed process counts in full
    (:func:`linmem.experiments.run_costs.run_cpu_seconds`)."""
    window = lmn_window(config)
    cpu_started = time.process_time()
    ulm_dir, ulm_trained = _train_ulm(config, data, run_dir, progress)
    ulm_here = time.process_time() - cpu_started
    ulm, _ = load_run_model(ulm_dir, "best", "cpu")
    ulm = ulm.double()
    memory_path = run_dir / MEMORY
    if has(run_dir, MEMORY):
        la = LinearAutoencoder.load(memory_path)
    else:
        la = fit_memory(hidden_states(ulm, data["train"]), config.memory, window, config.seed)
        la.save(memory_path)
    memory_facts = transfer(la, ulm.core, model.core, ulm.readout, model.readout)
    gains = memory_loop_gains(model.state_dict(), model.nonlinearity, model.memory_bound,
                              bool(model.loop_bound))
    if model.nonlinearity != "tanh" and max(gains) > 1:
        warnings.warn(f"the pretrained LMN's memory loop has gain {max(gains):.3f} > 1 with "
                      f"{model.nonlinearity}, an unbounded activation: its state may grow along a "
                      "sequence and the training diverge (--memory-bound with the loop bound, "
                      "relu's and selu's default, holds the gain below 1; a tanh LMN, "
                      "--nonlinearity tanh, stays bounded)", stacklevel=2)
    ulm_metrics = read_json(end_record(ulm_dir))  # metrics.json, or diverged.json on test
    return {"method": "ulm -> linear autoencoder -> lmn (eqs. 10-15)", "k": config.k,
            "la_window": window, "la_components": int(la.n_components_),
            "la_solver": la.solver_, "ulm_nonlinearity": ulm.nonlinearity,
            "lmn_nonlinearity": model.nonlinearity, "lmn_loop_gain": gains, **memory_facts,
            "ulm_valid_acc": ulm_metrics.get("valid_acc"),
            "ulm_test_acc": ulm_metrics.get("test_acc"),
            "ulm_failed_on": ulm_metrics.get("failed_on"), "ulm_epochs": ulm_metrics["epochs"],
            "ulm_wall_time_s": ulm_metrics["wall_time_s"], "ulm_run": str(ulm_dir),
            "ulm_cpu_time_s": ulm_metrics.get("cpu_time_s", ulm_metrics["wall_time_s"])
            if ulm_trained else 0.0, "ulm_cpu_here_s": ulm_here if ulm_trained else 0.0}


def _la_rnn(model: torch.nn.Module, config: TrainConfig, data: Data, run_dir: Path,
            progress: bool) -> dict[str, Any]:
    """pret-RNN: :func:`linmem.pretrain.pretrain_rnn` on the training split."""
    return pretrain_rnn(model, data["train"], window=config.la_window or None, seed=config.seed)


def _rnn_rbm(model: torch.nn.Module, config: TrainConfig, data: Data, run_dir: Path,
             progress: bool) -> dict[str, Any]:
    """The RNN-RBM's optional steps (``rbm_pretrain_epochs``, ``rnn_pretrain_epochs``), the RNN
    run kept in ``run_dir/rnn`` for resuming."""
    info: dict = {"method": "RNN-RBM initialisation (Boulanger-Lewandowski et al. 2012)"}
    if config.rbm_pretrain_epochs:
        costs = pretrain_rbm(model, data["train"], config.rbm_pretrain_epochs, lr=config.lr,
                             seed=config.seed)
        info["rbm"] = {"epochs": config.rbm_pretrain_epochs, "cd_k": model.cd_k,
                       "cd_cost": costs}
    if config.rnn_pretrain_epochs:
        rnn_config = replace(config, model="rnn", epochs=config.rnn_pretrain_epochs,
                             rbm_pretrain_epochs=0, rnn_pretrain_epochs=0)
        metrics = train_loop(rnn_config, run_dir / "rnn", resume=True, progress=progress, data=data)
        rnn, _ = load_run_model(run_dir / "rnn", "best")
        init_from_rnn(model, rnn, set_visible_bias=not config.rbm_pretrain_epochs)
        info["rnn"] = {"run": str(run_dir / "rnn"), "epochs": metrics["epochs"],
                       "valid_acc": metrics["valid_acc"]}
    return info


RECIPES: dict[str, Recipe] = {
    "ulm-transfer": Recipe(_ulm_transfer),
    "la-rnn": Recipe(_la_rnn),
    "rnn-rbm": Recipe(_rnn_rbm, optional=True,
                      needed=lambda c: c.rbm_pretrain_epochs + c.rnn_pretrain_epochs > 0),
}


def pretrained_models() -> list[str]:
    """The registered models that are always pretrained (``linmem pretrain``'s choices)."""
    return [name for name, spec in REGISTRY.items()
            if spec.recipe is not None and not RECIPES[spec.recipe].optional]


def pretrain(model: torch.nn.Module, config: TrainConfig, data: Data, run_dir: str | Path,
             progress: bool = True) -> dict[str, Any]:
    """Initialise ``model`` in place by its registry entry's recipe, resumably: the initial
    weights are kept in ``run_dir/init.pt``, what was done in ``run_dir/pretraining.json``."""
    run_dir = Path(run_dir)
    init_path, info_path = run_dir / INIT, run_dir / PRETRAINING
    if has(run_dir, INIT) and has(run_dir, PRETRAINING):
        model.load_state_dict(torch.load(init_path, weights_only=True))
        return read_record(run_dir, PRETRAINING)
    recipe = get_spec(config.model).recipe
    if recipe is None:
        raise ValueError(f"{config.model} has no pretraining recipe")
    started, cpu_started = time.perf_counter(), time.process_time()
    info = RECIPES[recipe].apply(model, config, data, run_dir, progress)
    info["wall_time_s"], info["machine"] = time.perf_counter() - started, machine(config.device)
    info["cpu_time_s"] = time.process_time() - cpu_started
    save_checkpoint(model.state_dict(), init_path)
    write_json(info_path, info)
    return info


def train(config: TrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True,
          data: Data | None = None, on_epoch_end: Callable[[int, dict], None] | None = None,
          command: str | None = None) -> dict[str, Any]:
    """Train ``config`` in ``run_dir``, pretraining first when the model's recipe asks for it:
    the one training entry point (:func:`linmem.train`; ``linmem train``, ``linmem search``).

    Args:
        config: the run's settings; ``config.model`` names a registered model.
        run_dir: the run's directory (pretraining steps are kept in it too).
        resume: continue the run in ``run_dir`` (see :func:`linmem.training.trainer.train_loop`).
        Default:
            ``False``.
        progress: progress bars and per-epoch lines on stderr. Default: ``True``.
        data: the data set as :func:`linmem.data.load_polyphonic` returns it. Default: loaded
            from ``config.data_dir``.
        on_epoch_end: called as ``f(epoch, log_row)`` after each epoch. Default: ``None``.
        command: the command to record. Default: this process's command line.

    Returns:
        The run's final metrics (also in ``run_dir/metrics.json``).
    """
    recipe = get_spec(config.model).recipe
    if recipe is None or not RECIPES[recipe].needed(config):
        return train_loop(config, run_dir, resume=resume, progress=progress, data=data,
                          on_epoch_end=on_epoch_end, command=command)
    if data is None:
        data = load_polyphonic(config.data, root=config.data_dir, progress=progress)
        config = with_data_dir(config)
    loaded = data
    return train_loop(config, run_dir, resume=resume, progress=progress, data=loaded,
                      on_epoch_end=on_epoch_end, command=command,
                      initialize=lambda model: pretrain(model, config, loaded, run_dir, progress))
