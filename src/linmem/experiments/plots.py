"""The experiments' figures, drawn with matplotlib (imported inside each function: the
``plot`` extra, ``pip install 'linear-memory-networks[plot]'``), each written atomically as a PNG:
a run's training curves, the paper's Figure 4 and Figure 5. The piano rolls of a continuation
and of a sequence's predictions are :mod:`linmem.generate`'s.
"""

from __future__ import annotations

import os
from pathlib import Path

from linmem._extras import require
from linmem._io import atomic_write
from linmem.data import dataset_title
from linmem.models import display_name
from linmem.training.runs import CONFIG, LOG, has, log_rows, read_record

__all__ = ["plot_figure4", "plot_pretraining", "plot_run"]


def plot_pretraining(analysis: dict, path: str | os.PathLike) -> None:
    """The paper's Figure 5 from :func:`linmem.experiments.pretraining.analyze`'s output, three
    panels, to a PNG written atomically (matplotlib is imported here only: ``pip install
    linear-memory-networks[plot]``)."""
    matplotlib = require("matplotlib", "a figure")
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


def plot_run(run_dir: str | os.PathLike, path: str | os.PathLike) -> list[str]:
    """A run's training curves from its ``log.jsonl``: the training loss, the validation NLL and
    (when they were measured) the validation accuracies per epoch, global and per-frame mean,
    the score the run selected on (its ``config.json``'s ``select``) named in the legend or the
    title, and the selected epoch (the one ``best.pt`` holds) marked; a PNG written atomically.
    Returns the panels' titles."""
    matplotlib = require("matplotlib", "a figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not has(run_dir, LOG):
        raise FileNotFoundError(f"{Path(run_dir) / LOG} does not exist: not a run directory, or "
                                "no epoch finished yet")
    rows = log_rows(run_dir)
    if not rows:
        raise ValueError(f"{Path(run_dir) / LOG} holds no epoch")
    select = read_record(run_dir, CONFIG, {}).get("select", "acc")
    epochs = [r["epoch"] for r in rows]
    loss_key = next(k for k in rows[0] if k.startswith("train_"))
    nll_key = next(k for k in rows[0] if k.startswith("valid_nll"))
    flagged = [r["epoch"] for r in rows if r.get("best")]  # the epochs that made best.pt
    best = flagged[-1] if flagged else max(rows, key=lambda r: r["valid_acc"])["epoch"]
    # each panel: its title and its curves (log key, legend); the selection score is named
    kinds = {"acc": ("valid_acc", "global (Bay et al.)"),
             "acc_frame": ("valid_acc_frame", "per-frame mean")}
    accuracies = [(key, label) for key, label in kinds.values()
                  if any(r.get(key) is not None for r in rows)]
    panels = [(f"training {loss_key.removeprefix('train_').replace('_', ' ')}",
               [(loss_key, None)]),
              ("validation NLL (nats per step)" + (", selects" if select == "nll" else ""),
               [(nll_key, None)])]
    if accuracies:  # none: selected on NLL, no marginals drawn
        panels.append(("validation accuracy (%)" + (f", {kinds[select][1]} selects"
                                                     if select in kinds else ""), accuracies))
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.8))
    for ax, (title, curves) in zip(axes, panels, strict=True):
        for key, label in curves:
            ax.plot(epochs, [r.get(key) for r in rows], lw=1.2, label=label)
        ax.axvline(best, color="tab:red", lw=1, ls="--", label=f"selected epoch {best}")
        ax.set_title(title)
        ax.set_xlabel("epoch")
        ax.legend(fontsize=8)
    fig.suptitle(str(Path(run_dir).name))
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return [title for title, _ in panels]


def plot_figure4(data: dict, path: str | os.PathLike) -> None:
    """Figure 4 from :func:`figure4_data`, a PNG written atomically."""
    matplotlib = require("matplotlib", "a figure")
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
           title=f"{dataset_title(data['dataset'])}: accuracy vs size")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)
