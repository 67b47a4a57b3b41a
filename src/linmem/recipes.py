"""Multi-step recipes above the trainer: pretraining, then training, and the pretraining analysis.

:func:`run` is the public training entry point (``linmem train``, the search): it trains a
model of the registry (:mod:`linmem.models`) with :func:`linmem.train.train`, after
initialising it by the model's recipe (:attr:`~linmem.models.ModelSpec.recipe`) when it has one:

- ``ulm-transfer`` (pret-LMN-A/B, paper section "Training and pretraining algorithm"): train the
  unrolled network (``RUN_DIR/ulm``, or an entry of ``ulm_cache`` shared by the runs whose
  unrolled network is the same), fit the linear autoencoder of its states
  (``RUN_DIR/memory.npz``), initialise the LMN by eqs. (12)-(15) (:mod:`linmem.pretrain`);
- ``la-rnn`` (pret-RNN, Pasa & Sperduti 2014): the Elman RNN from an autoencoder of the inputs;
- ``rnn-rbm`` (Boulanger-Lewandowski et al. 2012): the RBM by CD on all frames and the RNN from
  a next-step RNN (``RUN_DIR/rnn``), each when asked for.

The initial weights are kept in ``RUN_DIR/init.pt`` and what was done in
``RUN_DIR/pretraining.json``, so an interrupted recipe resumes where it stopped. The mathematics
stays in :mod:`linmem.pretrain` and :mod:`linmem.rnnrbm`; this module only orders the steps.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ._io import command_line, git_commit, machine, provenance, read_json, write_json
from .config import LEGACY_PROTOCOL, PLACE_FIELDS, TrainConfig
from .data import data_checksum, load_polyphonic
from .la import LinearAutoencoder
from .models import REGISTRY, build_model, default_nonlinearity, get_spec
from .nn import memory_loop_gains
from .pretrain import fit_memory, hidden_states, pretrain_rnn, transfer
from .rnnrbm import init_from_rnn, pretrain_rbm
from .runs import (
    CONFIG,
    DIVERGED,
    INIT,
    MEMORY,
    METRICS,
    PRETRAINING,
    ULM,
    rerun_cpu_seconds,
    save_checkpoint,
    training_cpu_seconds,
)
from .train import TrainingDiverged, evaluate, load_run_model, train, with_data_dir

try:
    import fcntl
except ImportError:  # not POSIX: runs do not share their unrolled networks
    fcntl = None

__all__ = [
    "RECIPES",
    "Recipe",
    "SeedsDiverged",
    "analyze",
    "analyze_pretraining",
    "lmn_window",
    "pretrain",
    "pretrained_models",
    "reseed",
    "run",
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
    its activation when it differs from the LMN's)."""
    return replace(config, model="ulm", memory=None,
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
    their defaults, but where it runs (:data:`linmem.train.PLACE_FIELDS`), so that a setting
    added to :class:`~linmem.config.TrainConfig` later leaves existing entries' names as they
    were; the defaults are those under :data:`~linmem.config.LEGACY_PROTOCOL`, as when the names
    were first made (linmem train's default protocol changed since)."""
    ulm = _ulm_named(config)
    defaults = asdict(type(ulm)(protocol=LEGACY_PROTOCOL))
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


def _train_ulm(config: TrainConfig, data: Data, run_dir: Path,
               progress: bool) -> tuple[Path, bool]:
    """The finished run of pret-LMN ``config``'s unrolled network: ``run_dir/ulm``, or with
    ``config.ulm_cache`` the cache entry :func:`ulm_key` names, trained by the first run that
    needs it and read by the others; and whether this call trained it (its last part at least).
    A run that finds the entry in training by another process trains its own in
    ``run_dir/ulm`` (nobody waits); a ``run_dir/ulm`` begun before (a run started without the
    cache, or beside a busy entry) is finished there and copied into the cache when the entry
    is not there yet. An entry named as before 2026-11-24 (:func:`_legacy_ulm_key`) is read when
    finished, else renamed and finished under its new name."""
    trained = False

    def finished(folder: Path) -> Path:
        nonlocal trained
        if not (folder / METRICS).is_file():
            train(ulm_config(config), folder, resume=True, progress=progress, data=data)
            trained = True
        return folder

    own = run_dir / ULM
    if config.ulm_cache is None or fcntl is None:
        return finished(own), trained
    entry = Path(config.ulm_cache) / ulm_key(config)
    legacy = entry.parent / _legacy_ulm_key(config)
    if not (entry / METRICS).is_file() and (legacy / METRICS).is_file():
        return legacy, trained  # finished before the names changed: never written again
    entry.parent.mkdir(parents=True, exist_ok=True)
    with open(entry.parent / f".{entry.name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another process trains it
            return finished(own), trained
        if (entry / METRICS).is_file():
            return entry, trained
        if not entry.is_dir() and legacy.is_dir():  # begun under the former name: go on there
            with open(entry.parent / f".{legacy.name}.lock", "a") as old_lock:
                try:
                    fcntl.flock(old_lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    os.replace(legacy, entry)
                except BlockingIOError:  # in training by a process that names it so
                    return finished(own), trained
        if not own.is_dir():
            return finished(entry), trained
        tmp = entry.parent / f".{entry.name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(finished(own), tmp)
        shutil.rmtree(entry, ignore_errors=True)  # an unfinished entry
        os.replace(tmp, entry)
        return entry, trained


def _ulm_transfer(model: torch.nn.Module, config: TrainConfig, data: Data, run_dir: Path,
                  progress: bool) -> dict[str, Any]:
    """pret-LMN: the ULM, the memory on its states, the transfer (eqs. 10-15); the ULM run and
    the memory are kept for resuming. The CPU time of the ULM's training is recorded for the
    run that trained it (``ulm_cpu_time_s``, every session's; 0 for a run that read it), with
    the part spent in this process (``ulm_cpu_here_s``, inside the recipe's ``cpu_time_s``): a
    ULM stage cut by a killed process counts in full (:func:`linmem.runs.run_cpu_seconds`)."""
    window = lmn_window(config)
    cpu_started = time.process_time()
    ulm_dir, trained = _train_ulm(config, data, run_dir, progress)
    ulm_here = time.process_time() - cpu_started
    ulm, _ = load_run_model(ulm_dir, "best", "cpu")
    ulm = ulm.double()
    memory_path = run_dir / MEMORY
    if memory_path.is_file():
        la = LinearAutoencoder.load(memory_path)
    else:
        la = fit_memory(hidden_states(ulm, data["train"]), config.memory, window, config.seed)
        la.save(memory_path)
    memory_facts = transfer(ulm, la, model)
    gains = memory_loop_gains(model.state_dict(), model.nonlinearity, model.memory_bound)
    if model.nonlinearity != "tanh" and max(gains) > 1:
        warnings.warn(f"the pretrained LMN's memory loop has gain {max(gains):.3f} > 1 with "
                      f"{model.nonlinearity}, an unbounded activation: its state may grow along a "
                      "sequence and the training diverge (a tanh LMN, --nonlinearity tanh, stays "
                      "bounded)", stacklevel=2)
    ulm_metrics = read_json(ulm_dir / METRICS)
    return {"method": "ulm -> linear autoencoder -> lmn (eqs. 10-15)", "k": config.k,
            "la_window": window, "la_components": int(la.n_components_),
            "la_solver": la.solver_, "ulm_nonlinearity": ulm.nonlinearity,
            "lmn_nonlinearity": model.nonlinearity, "lmn_loop_gain": gains, **memory_facts,
            "ulm_valid_acc": ulm_metrics["valid_acc"],
            "ulm_test_acc": ulm_metrics["test_acc"], "ulm_epochs": ulm_metrics["epochs"],
            "ulm_wall_time_s": ulm_metrics["wall_time_s"], "ulm_run": str(ulm_dir),
            "ulm_cpu_time_s": ulm_metrics.get("cpu_time_s", ulm_metrics["wall_time_s"])
            if trained else 0.0, "ulm_cpu_here_s": ulm_here if trained else 0.0}


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
        metrics = train(rnn_config, run_dir / "rnn", resume=True, progress=progress, data=data)
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
    if init_path.is_file() and info_path.is_file():
        model.load_state_dict(torch.load(init_path, weights_only=True))
        return read_json(info_path)
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


def reseed(run_dir: str | Path, seeds: Sequence[int], out_dir: str | Path,
           progress: bool = True, data_dir: str | None = None,
           command: str | None = None,
           changes: Mapping[str, Any] | None = None, stop_by: float | None = None,
           log: Callable[[str], None] | None = None) -> dict[int, dict[str, Any]]:
    """The run in ``run_dir`` again with each of ``seeds`` (everything else of its
    ``config.json`` unchanged: data, model, sizes, training settings, but the fields
    ``changes`` sets, e.g. ``{"nonlinearity": "tanh"}``), into ``out_dir/sSEED``, one after
    the other; resumable (a finished seed is not run again). The data are read from
    ``data_dir`` (default: the run's own folder). Returns the metrics of each seed's run by
    seed (issue 15: the spread between seeds).

    A seed whose training diverges with no epoch to keep does not stop the others: they all
    run, then :class:`SeedsDiverged` names the diverged seeds and carries the finished ones'
    metrics. Such a seed's ``diverged.json`` is its result: run again, ``reseed`` names it
    without training it again (delete the file to retry it).

    With a deadline ``stop_by`` (a Unix time; ``linmem reseed --stop-by``) a seed not finished
    yet starts, or resumes, only if it is projected to end by then: ``run_dir``'s CPU time
    (:func:`linmem.runs.rerun_cpu_seconds`, on the machine that ran it) less what the seed's
    folder has logged already. A seed left so is said to ``log`` and missing from the result:
    the same call later goes on with it, so that a machine's time limit cuts no run half-way
    whose folder would be lost with the machine."""
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    if not (run_dir / CONFIG).is_file():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    config = TrainConfig.from_run(run_dir)
    changes = dict(changes or {})
    unknown = sorted(set(changes) - {f.name for f in fields(TrainConfig)})
    if unknown or "seed" in changes:
        raise ValueError(f"cannot set {', '.join(unknown) or 'seed (pass the seeds)'}: the "
                         f"fields are {', '.join(f.name for f in fields(TrainConfig))}")
    config = replace(config, **changes)  # validated as any TrainConfig
    if len(set(seeds)) != len(seeds) or not seeds:
        raise ValueError(f"seeds must be distinct and at least one, got {list(seeds)}")
    # the seeds' configs name the folder their data came from
    config = with_data_dir(replace(config, data_dir=data_dir or config.data_dir))
    data = load_polyphonic(config.data, root=config.data_dir, progress=progress)
    finished: dict[int, dict[str, Any]] = {}
    diverged: dict[int, str] = {}
    projected = rerun_cpu_seconds(run_dir) if stop_by is not None else 0.0
    for seed in seeds:
        seed_dir, seed_config = out_dir / f"s{seed}", replace(config, seed=int(seed))
        if _diverged_before(seed_dir, seed_config):
            diverged[seed] = (f"{read_json(seed_dir / DIVERGED)['diverged']} (as "
                              f"{seed_dir / DIVERGED} records: delete it to run it again)")
            continue  # a result, as a finished seed is: not run again on resume
        if stop_by is not None and not (seed_dir / METRICS).is_file():
            left = max(projected - training_cpu_seconds(seed_dir), 0.0)
            if time.time() + left > stop_by:
                if log is not None:
                    end = time.strftime("%Y-%m-%d %H:%M", time.localtime(time.time() + left))
                    by = time.strftime("%Y-%m-%d %H:%M", time.localtime(stop_by))
                    log(f"seed {seed}: not started, projected to end at {end} "
                        f"({left / 3600:.2f} CPU h left), after the deadline {by}")
                continue
        try:
            finished[seed] = run(seed_config, seed_dir, resume=True, progress=progress,
                                 data=data, command=command)
        except TrainingDiverged as err:
            diverged[seed] = str(err)
    if diverged:
        raise SeedsDiverged("; ".join(f"seed {s}: {why}" for s, why in diverged.items()),
                            finished)
    return finished


def _diverged_before(run_dir: Path, config: TrainConfig) -> bool:
    """Whether ``run_dir`` holds ``config``'s run failed by diverging (``diverged.json``, no
    ``metrics.json``); a run of other settings there is left to :func:`run` to refuse."""
    if not (run_dir / DIVERGED).is_file() or (run_dir / METRICS).is_file() \
            or not (run_dir / CONFIG).is_file():
        return False
    saved = TrainConfig.from_run(run_dir)
    return saved.identity() == config.identity()


class SeedsDiverged(TrainingDiverged):
    """Seeds of :func:`reseed` whose training diverged with nothing kept; ``finished`` holds
    the metrics of the seeds that ran to the end."""

    def __init__(self, message: str, finished: dict[int, dict[str, Any]]):
        super().__init__(message)
        self.finished = finished


def run(config: TrainConfig, run_dir: str | Path, resume: bool = False, progress: bool = True,
        data: Data | None = None, on_epoch_end: Callable[[int, dict], None] | None = None,
        command: str | None = None) -> dict[str, Any]:
    """Train ``config`` in ``run_dir``, pretraining first when the model's recipe asks for it:
    the public training entry point (``linmem train``, ``linmem search``).

    Args:
        config: the run's settings; ``config.model`` names a registered model.
        run_dir: the run's directory (pretraining steps are kept in it too).
        resume: continue the run in ``run_dir`` (see :func:`linmem.train.train`). Default:
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
        return train(config, run_dir, resume=resume, progress=progress, data=data,
                     on_epoch_end=on_epoch_end, command=command)
    if data is None:
        data = load_polyphonic(config.data, root=config.data_dir, progress=progress)
        config = with_data_dir(config)
    loaded = data
    return train(config, run_dir, resume=resume, progress=progress, data=loaded,
                 on_epoch_end=on_epoch_end, command=command,
                 initialize=lambda model: pretrain(model, config, loaded, run_dir, progress))


# ------------------------------------------------------------------------ pretraining analysis


def analyze(data: Data, ulm: torch.nn.Module, memories: Sequence[int], window: int | None,
            first_memory: int = 1000, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """The paper's pretraining analysis (Figure 5) for a trained ULM:

    (a) ``reconstruction``: per memory size, the mean squared error per value of the training
        functional-state sequences, the optimal (truncated SVD) one and the autoencoder's
        recursive one (:meth:`LinearAutoencoder.reconstruction_error`, the window's blocks);
    (b) ``accuracy``: frame accuracy on train and validation of the ULM and of the LMN right
        after the transfer, before any fine-tuning;
    (c) ``first_sequence``: a full-length autoencoder with ``first_memory`` units (or the rank)
        on the training states; for the first training sequence, the relative error at each step
        ``t`` of decoding the whole prefix ``h_1 .. h_t`` from ``m_t``.
    """
    ulm_acc = {split: 100 * evaluate(ulm.float(), data[split], thresholds=())["acc"]  # as trained
               for split in ("train", "valid")}
    ulm = ulm.double()  # float64 for the states, the memory and the transfer
    states = hidden_states(ulm, data["train"])
    rows = []
    for p in tqdm(memories, desc="memory sizes", disable=None if progress else True):
        la = fit_memory(states, p, window, seed)
        errors = la.reconstruction_error(states)
        lmn = build_model("pret-lmn-b", ulm.hidden, int(la.n_components_),
                          input_size=ulm.input_size, nonlinearity=ulm.nonlinearity)
        transfer(ulm, la, lmn)
        rows.append({"memory": int(p), "components": int(la.n_components_),
                     "svd_error": errors["svd"], "la_error": errors["la"],
                     **{f"lmn_{split}_acc": 100 * evaluate(lmn, data[split], thresholds=())["acc"]
                        for split in ("train", "valid")}})
    la = LinearAutoencoder(first_memory, window=None, random_state=seed).fit(states)
    first = states[0]
    encoded = la.encode(first)
    per_step = []
    for t in range(len(first)):
        rec = la.decode(encoded[t], t + 1)
        per_step.append(float(((rec - first[: t + 1]) ** 2).sum() / (first[: t + 1] ** 2).sum()))
    return {"ulm_train_acc": ulm_acc["train"], "ulm_valid_acc": ulm_acc["valid"],
            "hidden": ulm.hidden, "k": ulm.k, "window": window, "memories": rows,
            "first_sequence": {"memory": int(la.n_components_), "asked": first_memory,
                               "solver": la.solver_, "relative_error": per_step}}


def analyze_pretraining(data: str = "jsb", hidden: int = 50, k: int = 10,
                        memories: Sequence[int] = (10, 25, 50, 100, 200, 300, 400, 550),
                        first_memory: int = 1000, ulm_run: str | Path | None = None,
                        epochs: int = 1000, patience: int = 50, seed: int = 0,
                        data_dir: str | None = None, progress: bool = True,
                        command: str | None = None,
                        protocol: str = LEGACY_PROTOCOL) -> dict[str, Any]:
    """Figure 5's analysis (:func:`analyze`) of the ULM in ``ulm_run``, trained there first if
    it is ``None`` (``runs/DATA-ulm-hHIDDEN-kK-sSEED``, resumable, under ``protocol``: linmem's
    by default, that of results/pretraining), with its provenance."""
    started = time.perf_counter()
    commit = git_commit()
    sizes = sorted({int(v) for v in memories})
    if not sizes or sizes[0] < 1:
        raise ValueError("memory sizes must be positive")
    config = TrainConfig(data=data, model="ulm", hidden=hidden, k=k, epochs=epochs,
                         patience=patience, seed=seed, data_dir=data_dir, protocol=protocol)
    dataset = load_polyphonic(config.data, root=data_dir, progress=progress)
    if ulm_run is None:
        ulm_run = f"runs/{config.data}-ulm-h{hidden}-k{k}-s{seed}"
        train(config, ulm_run, resume=True, progress=progress, data=dataset)
    ulm, trained = load_run_model(ulm_run)
    if trained.model != "ulm":
        raise ValueError(f"{ulm_run} is a {trained.model} run, not a ulm run")
    result = analyze(dataset, ulm, sizes, window=trained.k + 1, first_memory=first_memory,
                     seed=seed, progress=progress)
    record = provenance(command or command_line(), commit, seed,
                        data_checksum(config.data, data_dir), time.perf_counter() - started)
    return {**result, "dataset": config.data, "ulm_run": str(ulm_run),
            **{k: record[k] for k in ("command", "commit", "seed", "data_sha256",
                                      "wall_time_s", "machine")},
            "units": "accuracy in percent; errors: mean squared error per value (a), "
                     "relative squared error (c)"}
