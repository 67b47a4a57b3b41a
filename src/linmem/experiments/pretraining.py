"""The paper's pretraining analysis (Figure 5): the autoencoder of a trained ULM's states.

:func:`analyze` measures, per memory size, the reconstruction error and the accuracy of the LMN
right after the transfer (eqs. 12-15), and the relative error of decoding a whole prefix;
:func:`analyze_pretraining` trains the ULM first where needed and records the provenance.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from linmem._io import command_line, git_commit, provenance
from linmem.data import data_checksum, load_polyphonic
from linmem.la import LinearAutoencoder
from linmem.models import build_model
from linmem.pretrain import fit_memory, hidden_states, transfer
from linmem.training.config import DEFAULT_PROTOCOL, TrainConfig
from linmem.training.evaluation import evaluate, load_run_model
from linmem.training.trainer import train_loop

__all__ = ["analyze", "analyze_pretraining"]

Data = dict[str, list[np.ndarray]]


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
        transfer(la, ulm.core, lmn.core, ulm.readout, lmn.readout)
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
                        protocol: str = DEFAULT_PROTOCOL) -> dict[str, Any]:
    """Figure 5's analysis (:func:`analyze`) of the ULM in ``ulm_run``, trained there first if
    it is ``None`` (``runs/DATA-ulm-hHIDDEN-kK-sSEED``, resumable, under ``protocol``;
    results/pretraining's was linmem's), with its provenance."""
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
        train_loop(config, ulm_run, resume=True, progress=progress, data=dataset)
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
