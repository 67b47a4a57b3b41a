"""Reports built from run directories: every number comes from a run's ``metrics.json``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

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
    ("n_params", "params", "{}"),
    ("epochs", "epochs", "{}"),
    ("wall_time_s", "wall s", "{:.0f}"),
)


def collect_metrics(paths: Iterable[str | os.PathLike]) -> list[dict]:
    """The ``metrics.json`` records under ``paths`` (run directories or folders holding them),
    sorted by path, each with its ``run`` (the directory)."""
    records = []
    for root in paths:
        root = Path(root)
        files = [root / "metrics.json"] if (root / "metrics.json").is_file() else sorted(
            root.rglob("metrics.json"))
        for f in files:
            record = json.loads(f.read_text())
            record["run"] = str(f.parent)
            records.append(record)
    if not records:
        raise FileNotFoundError("no metrics.json under " + ", ".join(map(str, paths)))
    return sorted(records, key=lambda r: r["run"])


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
    """The paper's Figure 5 from :func:`linmem.pretrain.analyze`'s output, three panels, to a
    PNG written atomically (matplotlib is imported here only: ``pip install
    linear-memory-networks[plot]``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ._io import atomic_write

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
