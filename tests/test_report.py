"""Reports are built from metrics.json files only."""

import json

import pytest

from linmem.report import collect_metrics, markdown_table


def test_table_from_run_directories(tmp_path):
    for name, acc in (("b", 25.5), ("a", 31.25)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({
            "dataset": "jsb", "model": "lmn-b", "hidden": 100, "memory": 100,
            "valid_acc": acc, "test_acc": acc - 1, "test_nll": 8.123456, "n_params": 10,
            "epochs": 3, "wall_time_s": 12.6, "command": f"linmem train --out {name}",
            "commit": "abc", "seed": 0, "data_sha256": "ff"}))
    records = collect_metrics([tmp_path / "runs"])
    assert [r["run"].rsplit("/", 1)[1] for r in records] == ["a", "b"]
    table = markdown_table(records)
    lines = table.splitlines()
    assert lines[2].startswith("| a | jsb | lmn-b | 100 | 100 | 31.25 | 30.25 | 8.123 |")
    assert "`linmem train --out a` (commit abc, seed 0, data sha256 ff)" in table
    with pytest.raises(FileNotFoundError):
        collect_metrics([tmp_path / "empty"])
