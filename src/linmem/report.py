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
