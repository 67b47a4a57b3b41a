"""Reports are built from metrics.json files only."""

import glob
import json
import re
import shlex
from pathlib import Path

import pytest

from linmem.experiments.report import markdown_table
from linmem.experiments.run_costs import rerun_cpu_seconds
from linmem.training.runs import collect_metrics


def test_table_from_run_directories(tmp_path):
    for name, acc in (("b", 25.5), ("a", 31.25)):
        run = tmp_path / "runs" / name
        run.mkdir(parents=True)
        (run / "metrics.json").write_text(json.dumps({
            "dataset": "jsb", "model": "lmn-b", "hidden": 100, "memory": 100,
            "valid_acc": acc, "test_acc": acc - 1, "test_nll": 8.123456, "n_params": 10,
            "epochs": 3, "wall_time_s": 12.6, "command": f"linmem train --out {name}",
            "commit": "abc", "seed": 0, "data_sha256": "ff"}))
    log = [{"epoch": 1, "valid_acc": 20.0, "valid_nll": 9.0, "epoch_time_s": 30, "best": True},
           {"epoch": 2, "valid_acc": 22.5, "valid_nll": 8.5, "epoch_time_s": 60, "best": True},
           {"epoch": 3, "valid_acc": 31.25, "valid_nll": 11.0, "epoch_time_s": 90, "best": False}]
    (tmp_path / "runs" / "a" / "log.jsonl").write_text(
        "".join(json.dumps(e) + "\n" for e in log))
    (tmp_path / "runs" / "a" / "config.json").write_text(json.dumps({"batch_size": 4,
                                                                     "chunk": 100}))
    metrics_a = tmp_path / "runs" / "a" / "metrics.json"
    metrics_a.write_text(json.dumps({**json.loads(metrics_a.read_text()), "protocol": "paper",
                                     "weight_decay": 1e-5, "valid_acc_frame": 33.5}))
    records = collect_metrics([tmp_path / "runs"])
    assert [r["run"].rsplit("/", 1)[1] for r in records] == ["a", "b"]
    assert (records[0]["valid_nll_best"], records[0]["valid_acc_at_best_nll"],
            records[0]["best_nll_epoch"]) == (8.5, 22.5, 2)
    assert "valid_nll_best" not in records[1]  # no log: nothing made up
    table = markdown_table(records)
    lines = table.splitlines()
    # the checkpoint is epoch 2's (the last flagged best): 1.5 minutes of training to it
    assert lines[2] == ("| a | jsb | lmn-b | paper | 100 | 100 | 1e-05 | 31.25 | 33.50 | 30.25 | "
                        "8.123 |  |  |  | 8.500 | 22.50 | 10 | 4 | 100 | 3 |  | 1.5 | 13 |")
    # a run from before protocols had names: linmem's; no decay recorded: blank
    assert "| b | jsb | lmn-b | linmem | 100 | 100 |  | 25.50 |  |" in lines[3]
    assert lines[3].endswith("| 10 |  |  | 3 |  |  | 13 |")
    assert "`linmem train --out a` (commit abc, seed 0, data sha256 ff)" in table
    with pytest.raises(FileNotFoundError):
        collect_metrics([tmp_path / "empty"])


def _record(dataset, model, test_acc, complete=True, trials=()):
    return {"study": f"{dataset}-{model}-paper", "dataset": dataset, "model": model,
            "grid": "paper", "grid_points": 30, "points_done": 30 if complete else 7,
            "points_failed": 0, "grid_complete": complete, "trials_pruned": 2,
            "trials_run": list(trials), "hidden": 50, "memory": 100, "weight_decay": 0.0,
            "valid_acc": test_acc + 1, "test_acc": test_acc, "test_acc_frame": test_acc + 3,
            "test_nll": 8.0 + test_acc / 100,
            # the per-frame column's own selection: another point of the grid
            "frame_selection": {"point": "h100-m100-wd0", "valid_acc_frame": test_acc + 4,
                                "test_acc_frame": test_acc + 2.5}}


def test_table2_puts_ours_beside_the_paper():
    from linmem.experiments.table2 import table2_markdown

    records = [_record("jsb", "lmn-b", 35.123), _record("jsb", "lstm", 30.0, complete=False),
               {**_record("nottingham", "gru", 0.0), "test_acc": None},
               # every point failed (diverged in its first epoch): run, with no score
               {**_record("piano", "lmn-a", 0.0), "points_done": 0, "points_failed": 30,
                "trials_pruned": 0}]
    for r in records[2:]:
        r.pop("test_acc")  # nothing complete (yet) in those studies
    baseline = {"scores": {"jsb": {"test": {"acc": 22.2045, "acc_frame": 27.3419}},
                           "piano": {"test": {"acc": 35.21, "acc_frame": 36.84}}}}
    table = table2_markdown(records, command="linmem report", baseline=baseline)
    main, rest = table.split("selected on validation under this definition")
    per_frame, nll = rest.split("Test NLL in nats per time step")
    rows = {line.split(" | ")[0][2:]: line for line in main.splitlines() if line.startswith("| ")}
    # the same selected runs under the per-frame mean, beside the same published figures
    frame_rows = {line.split(" | ")[0][2:]: line for line in per_frame.splitlines()
                  if line.startswith("| ")}
    assert frame_rows["model"].startswith("| model | JSB Chorales (paper) | JSB Chorales (ours, "
                                          "per-frame mean) |")
    assert frame_rows["LMN-B"].startswith("| LMN-B | 33.98 | **37.62** | 35.56 | – |")
    assert frame_rows["LSTM"].startswith("| LSTM | 32.64 | 32.50† |")
    # the calibration row in both tables, no published figure beside it
    assert rows["previous frame (no training)"] == (
        "| previous frame (no training) | – | 22.20 | – | – | – | – | – | 35.21 |")
    assert frame_rows["previous frame (no training)"].endswith("| – | 27.34 | – | – | – | – | – "
                                                               "| 36.84 |")
    # the NLL of the runs of the first table, ours only, the lowest in bold
    nll_rows = {line.split(" | ")[0][2:]: line for line in nll.splitlines()
                if line.startswith("| ")}
    assert nll_rows["model"].startswith("| model | JSB Chorales (ours) | MuseData (ours) |")
    assert nll_rows["LSTM"].startswith("| LSTM | **8.30†** | – |")
    assert nll_rows["LMN-B"].startswith("| LMN-B | 8.35 | – |")
    assert "previous frame (no training)" not in nll_rows
    # LMN-B: paper 33.98 beside ours 35.12 (bold: the best of ours on JSB)
    assert rows["LMN-B"].startswith("| LMN-B | 33.98 | **35.12** | 35.56 | – |")
    assert rows["LSTM"].startswith("| LSTM | 32.64 | 30.00† |")  # incomplete grid marked
    assert "†: selected from a grid that is not complete yet." in main  # and the mark explained
    assert rows["pret-LMN-B"].startswith("| pret-LMN-B | **34.49** | – |")  # best published
    assert "| RNN-RBM* | 33.12 | – | 34.02 | – | **75.40** |" in rows["RNN-RBM*"]
    assert "- JSB Chorales: lmn-b (paper) 30/30 complete, 2 pruned; lstm (paper) 7/30" in table
    assert "- MuseData: nothing run yet." in table and "`linmem report`" in table
    # a grid whose every point failed: marked so in every table of ours, not as 'not run'
    assert rows["LMN-A"].endswith("| 26.69 | ✗ |") and frame_rows["LMN-A"].endswith("| ✗ |")
    assert nll_rows["LMN-A"].endswith("| – | ✗ |")
    assert "✗: every point of the grid failed with an error" in main
    assert "lmn-a (paper) 0/30 complete, 30 failed" in table
    assert "✗" not in table2_markdown(records[:3])  # and explained only where it is


def test_table2_gives_the_accuracy_at_the_threshold_chosen_on_validation():
    from linmem.experiments.table2 import table2_markdown

    records = [_record("jsb", "lmn-b", 27.0), _record("piano", "lstm", 23.0)]
    assert "threshold chosen on validation" not in table2_markdown(records)  # none recorded
    records[0].update(valid_threshold=0.2, test_acc_at_valid_threshold=29.604)
    baseline = {"scores": {"jsb": {"test": {"acc": 22.2045, "acc_frame": 27.3419}}}}
    table = table2_markdown(records, baseline=baseline)
    part = table.split("threshold chosen on validation")[1].split("Test NLL")[0]
    rows = {line.split(" | ")[0][2:]: line for line in part.splitlines() if line.startswith("| ")}
    assert "0.05, 0.1, 0.15" in part and "0.5) instead of 0.5" in part
    assert rows["model"].startswith("| model | JSB Chorales (ours, threshold from valid) |")
    assert rows["LMN-B"].startswith("| LMN-B | **29.60 (0.20)** | – | – | – |")
    assert rows["LSTM"].startswith("| LSTM | – | – | – | – |")  # its run recorded none
    # the previous frame predicts 0 or 1: the same at every threshold
    assert rows["previous frame (no training)"].startswith("| previous frame (no training) | "
                                                           "22.20 | – |")
    assert "the grid's top" not in part  # no model picked the grid's edge
    records[1].update(valid_threshold=0.5, test_acc_at_valid_threshold=23.0)
    part = table2_markdown(records).split("threshold chosen on validation")[1]
    assert "a model that picks 0.5, the grid's top, might score more above it:" in part


def test_figure4_takes_the_best_weight_decay_per_size_from_complete_trials():
    from linmem.experiments.report import figure4_data

    trials = [{"hidden": 50, "memory": 50, "weight_decay": wd, "state": state, "valid_acc": acc}
              for wd, state, acc in ((0.0, "complete", 20.0), (1e-5, "complete", 22.0),
                                     (1e-4, "pruned", 30.0))]
    trials.append({"hidden": 100, "memory": 250, "weight_decay": 0.0, "state": "complete",
                   "valid_acc": 25.0})
    data = figure4_data([_record("jsb", "lmn-b", 30.0, trials=trials),
                         _record("jsb", "lmn-a", 30.0, trials=trials),
                         _record("jsb", "lstm", 30.0, complete=False),  # nothing finished yet
                         _record("piano", "rnn", 30.0, trials=trials)])
    assert list(data["curves"]) == ["lmn-b"]  # lmn-a is not in the figure; piano is not jsb
    points = data["curves"]["lmn-b"]["points"]
    assert [(p["units"], p["valid_acc"], p["weight_decay"]) for p in points] == [
        (100, 22.0, 1e-5), (350, 25.0, 0.0)]
    # a size whose trials were all pruned is listed apart, at its best value before the stop
    trials.append({"hidden": 250, "memory": 500, "weight_decay": 0.0, "state": "pruned",
                   "valid_acc": 20.0, "best_intermediate_valid_acc": 21.5, "epochs": 50})
    data = figure4_data([_record("jsb", "lmn-b", 30.0, trials=trials)])
    assert [(p["units"], p["valid_acc"]) for p in data["curves"]["lmn-b"]["pruned"]] == [
        (750, 21.5)]
    assert [p["units"] for p in data["curves"]["lmn-b"]["points"]] == [100, 350]


def test_single_runs_join_the_table_selected_on_validation(tmp_path):
    from linmem.experiments.report import run_records, summary_records
    from linmem.experiments.table2 import table2_markdown
    from linmem.training.runs import collect_metrics

    for name, valid, test in (("a", 27.0, 28.0), ("b", 26.0, 30.0)):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps({
            "dataset": "jsb", "model": "rnn-rbm", "hidden": 100, "memory": None,
            "weight_decay": 1e-5, "valid_acc": valid, "test_acc": test, "test_nll": 7.5,
            "n_params": 5, "epochs": 9, "wall_time_s": 1.0, "command": f"train {name}",
            "commit": "c", "seed": 0, "data_sha256": "d"}))
    (tmp_path / "a" / "rnn").mkdir()  # a step inside run a (its RNN pretraining): not a run
    (tmp_path / "a" / "rnn" / "metrics.json").write_text(json.dumps({
        "dataset": "jsb", "model": "rnn", "valid_acc": 20.0, "test_acc": 20.0}))
    records = run_records(collect_metrics([tmp_path]))
    assert len(records) == 1 and records[0]["test_acc"] == 28.0  # a: the better validation
    assert records[0]["trials"] == 2 and records[0]["command"] == "train a"
    (tmp_path / "a" / "expected.json").write_text(json.dumps({  # linmem evaluate --out
        "checkpoint": "best",
        "test": {"acc": 28.0, "acc_expected": 27.3, "acc_expected_se": 0.02}}))
    records = run_records(collect_metrics([tmp_path]))
    assert records[0]["test_acc_expected"] == 27.3
    table = table2_markdown(records)
    assert "| RNN-RBM* | 33.12 | **28.00‡** |" in table
    assert "| RNN-RBM* | 33.12 | 27.30 ± 0.02 | 34.02 | – |" in table  # the expected accuracy
    assert "rnn-rbm (2 single runs, selected `" in table
    assert summary_records(records)[0]["grid"] == "runs"


def test_runs_selected_on_nll_are_chosen_by_their_lowest_validation_nll(tmp_path):
    from linmem.experiments.report import run_records
    from linmem.training.runs import collect_metrics

    for name, nll, acc, selected in (("a", 6.1, 24.0, "valid nll"), ("b", 5.9, 22.0, "valid nll"),
                                     ("c", 5.0, 30.0, "valid nll")):
        run = tmp_path / name
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps({
            "dataset": "jsb" if name != "c" else "muse", "model": "lstm-nade", "hidden": 8,
            "valid_acc": acc, "valid_nll": nll, "test_acc": acc, "test_nll": nll,
            "selected_on": selected, "command": name}))
    records = {r["dataset"]: r for r in run_records(collect_metrics([tmp_path]))}
    assert records["jsb"]["command"] == "b"  # the lower NLL, not the higher accuracy
    other = json.loads((tmp_path / "a" / "metrics.json").read_text())
    other["selected_on"] = "valid acc"
    (tmp_path / "a" / "metrics.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="selected on different scores"):
        run_records(collect_metrics([tmp_path]))


def test_records_of_an_earlier_summary_join_the_table(tmp_path):
    from linmem.experiments.report import summary_file_records
    from linmem.experiments.table2 import table2_markdown

    earlier = [{k: v for k, v in _record("jsb", "lmn-b", 28.0).items()
                if k not in ("study", "points_done", "points_failed", "trials_run",
                             "frame_selection")}]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(earlier))
    trials = [{"hidden": 50, "memory": 100, "weight_decay": 0.0, "state": "complete",
               "valid_acc": 29.0}]
    (tmp_path / "search_trials.json").write_text(json.dumps(
        [{"study": "jsb-lmn-b-paper", "trials_run": trials}]))
    records = summary_file_records(path)
    assert records[0]["points_done"] == 30 and records[0]["from_summary"] == str(path)
    assert records[0]["trials_run"] == trials  # figure 4 keeps its points
    table = table2_markdown(records)
    # no per-frame selection kept: the global selection's per-frame score, marked
    assert "| LMN-B | 33.98 | **31.00§** |" in table
    assert "(§: selected on the global accuracy instead" in table
    # with its own per-frame selection the cell is unmarked, and the mark is not explained
    selected = {**records[0], "frame_selection": {"test_acc_frame": 30.5}}
    table = table2_markdown([selected])
    assert "| LMN-B | 33.98 | **30.50** |" in table and "§" not in table
    assert "†" not in table  # a complete grid: no mark, no note
    assert "selected on validation under this definition:\n" in table
    assert f"lmn-b (paper) 30/30 complete, 2 pruned, from `{path}`" in table
    # a trial failed by a killed worker and done again is no failed point
    path.write_text(json.dumps([{**earlier[0], "trials_failed": 2}]))
    assert summary_file_records(path)[0]["points_failed"] == 0
    path.write_text(json.dumps([{**earlier[0], "trials_failed": 2, "points_done": 29,
                                 "grid_complete": True}]))
    assert summary_file_records(path)[0]["points_failed"] == 1
    # scores the file lacks come from the selected run's metrics.json the report copied beside
    # it, when that run is the record's configuration
    path.write_text(json.dumps(earlier))
    assert summary_file_records(path)[0].get("test_acc_at_valid_threshold") is None
    selected = tmp_path / "selected" / "jsb-lmn-b"
    selected.mkdir(parents=True)
    metrics = {k: earlier[0][k] for k in ("hidden", "memory", "weight_decay", "valid_acc",
                                          "test_acc")}
    (selected / "metrics.json").write_text(json.dumps(
        {**metrics, "valid_threshold": 0.3, "test_acc_at_valid_threshold": 31.5}))
    filled = summary_file_records(path)[0]
    assert (filled["valid_threshold"], filled["test_acc_at_valid_threshold"]) == (0.3, 31.5)
    (selected / "metrics.json").write_text(json.dumps(
        {**metrics, "hidden": 500, "valid_threshold": 0.3, "test_acc_at_valid_threshold": 31.5}))
    assert summary_file_records(path)[0].get("test_acc_at_valid_threshold") is None
    # a per-frame selection of another run counts only where that run's files were committed
    # beside the summary (its provenance); else the cell falls back to the global one, marked
    other = {"point": "h50-m50-wd0", "valid_acc_frame": 40.0, "test_acc_frame": 35.25,
             "run_dir": "runs/search/jsb-lmn-b-paper/h50-m50-wd0"}
    path.write_text(json.dumps([{**earlier[0], "frame_selection": other}]))
    assert summary_file_records(path)[0]["frame_selection"] is None
    assert "| LMN-B | 33.98 | **31.00§** |" in table2_markdown(summary_file_records(path))
    # a selection that records its run's provenance (a newer summary) is kept without a copy
    traced = {**other, "command": "linmem search", "commit": "abc", "seed": 0,
              "data_sha256": "d00d"}
    path.write_text(json.dumps([{**earlier[0], "frame_selection": traced}]))
    assert summary_file_records(path)[0]["frame_selection"] == traced
    path.write_text(json.dumps([{**earlier[0], "frame_selection": other}]))
    kept = tmp_path / "selected" / "jsb-lmn-b-per-frame"
    kept.mkdir()
    (kept / "metrics.json").write_text(json.dumps({"test_acc_frame": 35.25, "commit": "abc"}))
    assert summary_file_records(path)[0]["frame_selection"] == other
    assert "| LMN-B | 33.98 | **35.25** |" in table2_markdown(summary_file_records(path))
    own = "runs/search/jsb-lmn-b-paper/h50-m100-wd0"  # the global selection's own run
    same = {**other, "run_dir": own}
    path.write_text(json.dumps([{**earlier[0], "run_dir": own, "frame_selection": same}]))
    (kept / "metrics.json").unlink()
    assert summary_file_records(path)[0]["frame_selection"] == same
    path.write_text("{}")
    with pytest.raises(ValueError, match=r"not a summary\.json"):
        summary_file_records(path)


def test_seed_table_says_whether_pretraining_and_lmn_b_beat_the_spread():
    from linmem.experiments.seed_groups import seed_groups
    from linmem.experiments.table2 import table2_markdown

    def run(model, seed, acc):
        return {"dataset": "jsb", "model": model, "hidden": 250, "memory": 250,
                "weight_decay": 1e-5, "seed": seed, "test_acc": acc, "test_acc_frame": acc + 3,
                "test_nll": 8.0, "valid_acc": acc, "run": f"{model}-s{seed}"}

    groups = seed_groups([run("lmn-b", s, a) for s, a in ((1, 27.0), (2, 27.5), (3, 28.0))]
                         + [run("pret-lmn-b", s, a) for s, a in ((1, 28.5), (2, 29.0), (3, 29.5))])
    assert [g["model"] for g in groups] == ["lmn-b", "pret-lmn-b"]
    assert groups[0]["test_acc"] == {"mean": 27.5, "sd": 0.5, "min": 27.0, "max": 28.0, "n": 3}
    table = table2_markdown([_record("jsb", "lmn-b", 28.0)], seeds=groups)
    assert "| JSB Chorales | LMN-B | 250, 250 | 1e-05 | 1, 2, 3 | 27.50 ± 0.50 (27.00-28.00) |" \
        in table
    assert ("- JSB Chorales: pret-LMN-B against LMN-B: +1.50 points global, the ranges do not "
            "overlap (beyond the spread between seeds); +1.50 points per-frame mean, the ranges "
            "do not overlap (beyond the spread between seeds).") in table
    assert "against LSTM" not in table  # no LSTM seeds: no claim
    lstm = seed_groups([run("lmn-b", 1, 27.0), run("lmn-b", 2, 27.5), run("lmn-b", 3, 27.6),
                        run("lstm", 1, 26.0), run("lstm", 2, 27.2), run("lstm", 3, 27.8)])
    assert ("- JSB Chorales: LMN-B against LSTM: +0.37 points global, the ranges overlap"
            in table2_markdown([], seeds=lstm))
    overlapping = seed_groups([run("lmn-b", s, a) for s, a in ((1, 27.0), (2, 29.0), (3, 28))]
                              + [run("pret-lmn-b", s, a) for s, a in ((1, 28.0), (2, 28.5),
                                                                       (3, 28.2))])
    assert "overlap (within the spread" in table2_markdown([], seeds=overlapping)
    frame_apart = seed_groups([dict(run("lmn-b", 1, 27.0), test_acc_frame=20.0),
                               dict(run("lmn-b", 2, 29.0), test_acc_frame=20.5),
                               dict(run("lmn-b", 3, 28.0), test_acc_frame=20.25),
                               run("pret-lmn-b", 1, 28.0), run("pret-lmn-b", 2, 28.5),
                               run("pret-lmn-b", 3, 28.25)])
    assert ("+0.25 points global, the ranges overlap (within the spread between seeds); +11.00 "
            "points per-frame mean, the ranges do not overlap" in
            table2_markdown([], seeds=frame_apart))
    # fewer than three seeds of either model: the table says so and gives no verdict
    early = table2_markdown([], seeds=seed_groups([run("lmn-b", 1, 27.0),
                                                   run("pret-lmn-b", 1, 30.0),
                                                   run("pret-lmn-b", 2, 30.5)]))
    assert ("- JSB Chorales: pret-LMN-B against LMN-B: 2 seed(s) of pret-LMN-B and 1 of LMN-B "
            "so far; no verdict under 3 each.") in early
    assert "overlap" not in early.split("seeds' ranges overlap:")[1]
    with pytest.raises(ValueError, match="given twice"):
        seed_groups([run("lmn-b", 1, 27.0), run("lmn-b", 1, 27.5)])


def test_a_seed_that_diverged_counts_as_run_and_is_named(tmp_path):
    """A seed whose training diverged (``diverged.json``, no scores) is read with the seeds,
    named in the table and in the claim, left out of the means, and counted below every score
    in the claim's ranges: a model with a failed seed is never beyond the spread above another,
    and can be below it; the claim needs three seeds run per model."""
    from linmem.experiments.seed_groups import seed_groups
    from linmem.experiments.table2 import table2_markdown
    from linmem.training.runs import collect_metrics

    def run(model, seed, acc=None, why="NaN in epoch 1"):
        folder = tmp_path / f"{model}-s{seed}"
        (folder / "ulm").mkdir(parents=True, exist_ok=True)  # a step inside: not a run
        (folder / "ulm" / "metrics.json").write_text(json.dumps({"model": "ulm"}))
        record = {"dataset": "nottingham", "model": model, "hidden": 250, "memory": 250,
                  "weight_decay": 1e-5, "seed": seed}
        if acc is None:
            name, record = "diverged.json", {**record, "diverged": why}
        else:
            name, record = "metrics.json", {**record, "test_acc": acc, "test_acc_frame": acc,
                                            "test_nll": 3.0, "valid_acc": acc}
        (folder / name).write_text(json.dumps(record))

    for seed, acc in ((1, 71.5), (2, 71.7), (3, 71.6)):
        run("lmn-b", seed, acc)
    run("pret-lmn-b", 1)
    run("pret-lmn-b", 2, 73.0)
    run("pret-lmn-b", 3, 73.4)
    assert len(collect_metrics([tmp_path])) == 5  # scores only: the diverged seed left out
    in_flight = tmp_path / "pret-lmn-b-s4"  # a run still training its ULM: neither is a run yet
    (in_flight / "ulm").mkdir(parents=True)
    (in_flight / "config.json").write_text("{}")
    (in_flight / "ulm" / "metrics.json").write_text(json.dumps({"model": "ulm"}))
    records = collect_metrics([tmp_path], diverged=True)
    assert len(records) == 6 and all(r["model"] != "ulm" for r in records)
    groups = seed_groups(records)
    assert groups[1]["seeds"] == [2, 3] and groups[1]["diverged_seeds"] == [1]
    assert groups[1]["failed_on"] == {"1": "training"}
    assert groups[1]["test_acc"]["n"] == 2 and groups[1]["test_acc"]["mean"] == 73.2
    table = table2_markdown([], seeds=groups)
    assert "| Nottingham | pret-LMN-B | 250, 250 | 1e-05 | 2, 3 (seed 1 diverged) | 73.20 ± " \
        in table
    # both finished seeds are above LMN-B's range, the failed one is below it: within the spread
    assert ("- Nottingham: pret-LMN-B against LMN-B: +1.60 points global, the ranges overlap "
            "(within the spread between seeds); +1.60 points per-frame mean, the ranges overlap "
            "(within the spread between seeds) (pret-LMN-B's seed 1 diverged: no score, counted "
            "below every score in the ranges; the means are over the seeds that finished).") \
        in table
    (tmp_path / "pret-lmn-b-s3" / "metrics.json").unlink()
    # two of three failed, one of them when its selected checkpoint was scored on test (the
    # message of the records written before diverged.json said where)
    run("pret-lmn-b", 3, why="the checkpoint chosen on validation (epoch 2): the model's outputs "
                             "are NaN or inf on a batch of sequences of up to 510 steps")
    table = table2_markdown([], seeds=seed_groups(collect_metrics([tmp_path], diverged=True)))
    assert "| 2 (seed 1 diverged; seed 3 failed on test) |" in table
    assert ("- Nottingham: pret-LMN-B against LMN-B: global: pret-LMN-B only seed 2 finished "
            "(73.00), the ranges overlap (within the spread between seeds); per-frame mean: "
            "pret-LMN-B only seed 2 finished (73.00), the ranges overlap (within the spread "
            "between seeds) (pret-LMN-B's seed 1 diverged; seed 3 failed on test: no score") \
        in table
    # a model whose failed seeds and finished ones are all below the other's range: beyond the
    # spread, against it
    for seed, acc in ((1, 75.0), (2, 75.2), (3, 75.1)):
        run("lstm", seed, acc)
    (tmp_path / "lmn-b-s3" / "metrics.json").unlink()
    run("lmn-b", 3, why="its pretraining: the checkpoint chosen on validation (epoch 8): NaN")
    table = table2_markdown([], seeds=seed_groups(collect_metrics([tmp_path], diverged=True)))
    assert ("- Nottingham: LMN-B against LSTM: -3.50 points global, the ranges do not overlap "
            "(beyond the spread between seeds); -3.50 points per-frame mean, the ranges do not "
            "overlap (beyond the spread between seeds) (LMN-B's seed 3 failed on test in its "
            "pretraining: no score") in table
    (tmp_path / "lmn-b-s3" / "diverged.json").unlink()
    run("lmn-b", 3, 71.6)
    (tmp_path / "pret-lmn-b-s2" / "metrics.json").unlink()
    run("pret-lmn-b", 2)  # none finished: a row with no scores, and below LMN-B in the claim
    table = table2_markdown([], seeds=seed_groups(collect_metrics([tmp_path], diverged=True)))
    assert ("| Nottingham | pret-LMN-B | 250, 250 | 1e-05 | (seeds 1, 2 diverged; seed 3 failed "
            "on test) | – | – | – |") in table
    assert ("- Nottingham: pret-LMN-B against LMN-B: global: pret-LMN-B no seed finished, the "
            "ranges do not overlap (beyond the spread between seeds)") in table


def test_seed_groups_keep_activations_apart(tmp_path, capsys):
    """pret-LMN-B with tanh (the paper's text) beside the default SELU one: two groups, each
    against LMN-B; `linmem summarize --seeds` prints the same from run directories."""
    from linmem.experiments.seed_groups import seed_groups, seeds_markdown

    def run(model, seed, acc, act=None):
        return {"dataset": "jsb", "model": model, "hidden": 250, "memory": 250,
                "weight_decay": 1e-7, "seed": seed, "test_acc": acc, "test_acc_frame": acc + 3,
                "test_nll": 8.0, "valid_acc": acc, "run": f"{model}-{act}-s{seed}",
                "nonlinearity": act}

    runs = ([run("lmn-b", s, 28.0 + s / 10) for s in (1, 2, 3)]
            + [run("pret-lmn-b", s, 27.0 + s / 10) for s in (1, 2, 3)]
            + [run("pret-lmn-b", s, 27.5 + s / 10, "tanh") for s in (1, 2, 3)]
            + [run("lmn-b", 1, 20.0, "tanh")])  # tanh is LMN-B's default: the same group
    groups = seed_groups(runs[:-1])
    assert [(g["model"], g["nonlinearity"], g["seeds"]) for g in groups] == [
        ("lmn-b", "tanh", [1, 2, 3]), ("pret-lmn-b", "selu", [1, 2, 3]),
        ("pret-lmn-b", "tanh", [1, 2, 3])]
    text = seeds_markdown(groups)
    assert "| JSB Chorales | pret-LMN-B | 250, 250 | 1e-07 | 1, 2, 3 | 27.20 ± 0.10" in text
    assert "| JSB Chorales | pret-LMN-B (tanh) | 250, 250 | 1e-07 | 1, 2, 3 | 27.70 ± 0.10" in text
    assert "- JSB Chorales: pret-LMN-B against LMN-B: -1.00 points global" in text
    assert "- JSB Chorales: pret-LMN-B (tanh) against LMN-B: -0.50 points global" in text
    with pytest.raises(ValueError, match="given twice"):  # LMN-B's tanh is its default
        seed_groups(runs)
    for r in runs:
        d = tmp_path / r["run"]
        d.mkdir()
        (d / "metrics.json").write_text(json.dumps({k: v for k, v in r.items()
                                                    if k not in ("run", "nonlinearity")}))
        (d / "config.json").write_text(json.dumps({"nonlinearity": r["nonlinearity"]}))
    from linmem.cli.commands import main

    main(["summarize", "--seeds", *(str(tmp_path / r["run"]) for r in runs[:-1])])
    out = capsys.readouterr().out
    assert out.count("| pret-lmn-b-tanh-s") == 3 and text in out
    with pytest.raises(SystemExit) as exit_:  # a seed twice: one line, exit 2
        main(["summarize", "--seeds", str(tmp_path)])
    assert exit_.value.code == 2 and "given twice" in capsys.readouterr().err


def test_figure4_is_drawn_for_every_data_set_with_a_curve(tmp_path):
    from linmem.experiments.report import write_search_report

    trials = [{"hidden": h, "memory": m, "weight_decay": 0.0, "state": "complete",
               "valid_acc": acc} for h, m, acc in ((100, 250, 60.0), (250, 250, 62.0))]
    records = [_record("nottingham", "lmn-b", 70.0, trials=trials)]
    write_search_report(records, tmp_path, "linmem report")
    fig = json.loads((tmp_path / "figure4-nottingham.json").read_text())
    assert [p["units"] for p in fig["curves"]["lmn-b"]["points"]] == [350, 500]
    assert (tmp_path / "figure4-nottingham.png").read_bytes()[:4] == b"\x89PNG"
    # JSB has no curve: its json says so, no picture; no other data set gets files
    assert json.loads((tmp_path / "figure4.json").read_text())["curves"] == {}
    assert not (tmp_path / "figure4.png").exists()
    assert not (tmp_path / "figure4-musedata.json").exists()


def test_memory_radii_and_table(tmp_path):
    import torch

    from linmem.experiments.analyses import memory_markdown, memory_radii
    from linmem.models import build_model

    torch.manual_seed(0)
    model = build_model("lmn-b", 6, memory=3, num_layers=2)
    with torch.no_grad():  # eigenvalues 0.5, -2, 0.1 (triangular); then 0.3 +- 0.4i, 0.2
        model.core.weight_mm_l0.copy_(torch.tensor([[0.5, 0.0, 0.0], [0.0, -2.0, 1.0],
                                                    [0.0, 0.0, 0.1]]))
        model.core.weight_mm_l1.copy_(torch.tensor([[0.3, -0.4, 0.0], [0.4, 0.3, 0.0],
                                                    [0.0, 0.0, 0.2]]))
    run = tmp_path / "search" / "run"
    run.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "epoch": 3}, run / "best.pt")
    assert memory_radii(run / "best.pt") == pytest.approx([2.0, 0.5])
    torch.save({"model": build_model("lstm", 4).state_dict()}, tmp_path / "lstm.pt")
    assert memory_radii(tmp_path / "lstm.pt") == []
    record = {"run": str(run), "model": "lmn-b", "batch_size": 4, "chunk": None, "epochs": 5,
              "best_epoch": 3, "valid_acc": 28.0, "stop_reason": "diverged: in epoch 6; kept"}
    from linmem.nn.diagnostics import memory_loop_gains

    selected = ", ".join(f"{g:.3f}" for g in memory_loop_gains(model.state_dict(), "tanh"))
    table = memory_markdown([record], command="linmem memory x")
    assert "| search/run | lmn-b | 4 | whole | 5 | 3 | 28.00 | diverged: in epoch 6 | – | 2.000, " \
           f"0.500 | – | – | {selected} |" in table and "Made by `linmem memory x`." in table
    # a pretrained run that diverged in its first epoch: its initial weights' loop gain
    failed = tmp_path / "search" / "failed"
    failed.mkdir()
    pretrained = build_model("pret-lmn-b", 6, memory=3, nonlinearity="selu")
    torch.save(pretrained.state_dict(), failed / "init.pt")
    start = memory_loop_gains(pretrained.state_dict(), "selu")[0]
    eig = torch.linalg.eigvals(pretrained.core.weight_mm_l0.detach().double()).abs().max()
    assert memory_radii(failed / "init.pt") == pytest.approx([float(eig)])  # a bare state
    record = {"run": str(failed), "model": "pret-lmn-b", "nonlinearity": "selu",
              "batch_size": 4, "chunk": None, "epochs": 0, "diverged": "NaN loss in epoch 1"}
    radius = memory_radii(failed / "init.pt")[0]
    assert (f"| search/failed | pret-lmn-b | 4 | whole | 0 | – | – | failed: diverged: NaN loss "
            f"in epoch 1 | {radius:.3f} | – | – | {start:.3f} | – |") in memory_markdown([record])


def _replayable_run(folder, accs, patience=50, stop="early stopping (patience 50)"):
    """A finished run's files as the trainer writes them: ``best`` flags from strictly better
    validation accuracies, one CPU second per epoch."""
    folder.mkdir(parents=True)
    best, rows = -1.0, []
    for epoch, acc in enumerate(accs, 1):
        rows.append({"epoch": epoch, "valid_acc": acc, "epoch_cpu_s": 1.0, "best": acc > best})
        best = max(best, acc)
    (folder / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "config.json").write_text(json.dumps({"patience": patience}))
    (folder / "metrics.json").write_text(json.dumps({"dataset": "jsb", "model": "lmn-b",
                                                     "stop_reason": stop}))


def test_a_shorter_patience_is_replayed_from_the_runs_logs(tmp_path):
    """Stopping after P epochs without a better validation score, replayed on logged runs: the
    epoch each would have selected (checked by hand), the accuracy lost, the CPU time saved; a
    run whose own patience is not longer, or that diverged, is left out."""
    from linmem.experiments.analyses import patience_markdown, patience_records, stop_early
    from linmem.training.runs import collect_metrics

    late = [10, 20, 21, 19, 18, 17, 16, 25, 24, 23, 22, 21, 20]  # best at epoch 8, after 5 bad
    early = [10, 30, 29, 28, 27, 26, 25, 24, 23, 22, 21, 20, 19]  # best at epoch 2
    assert stop_early([{"best": a} for a in (True, False, True, False, False)], 2) == (2, 5)
    _replayable_run(tmp_path / "late", late, patience=6)
    _replayable_run(tmp_path / "early", early, patience=6)
    _replayable_run(tmp_path / "short", late, patience=3)  # its own patience: not longer than 4
    _replayable_run(tmp_path / "bad", late, stop="diverged: NaN loss at epoch 14")
    rows = patience_records(collect_metrics([tmp_path]), [4, 3, 10])
    p4, p3, p10 = rows
    # patience 4: "late" stops at epoch 7 with epoch 3 (21) instead of epoch 8 (25), having run 7
    # of 13 epochs; "early" stops at epoch 6, its selection unchanged (run 6 of 13)
    assert (p4["runs"], p4["changed"]) == (2, 1)
    assert p4["valid_acc_lost_mean"] == pytest.approx(2.0) and p4["valid_acc_lost_max"] == 4.0
    assert p4["cpu_saved"] == pytest.approx((6 + 7) / 26)
    assert p3["runs"] == 2 and p3["changed"] == 1  # "short" (own 3) is still not counted
    assert p10["runs"] == 0  # no run had a patience above 10
    table = patience_markdown(rows, "linmem patience x", "abc1234")
    assert "| 4 | 2 | 1 | 2.00, 4.00 | 50 % |" in table and "| 10 | 0 | – | – | – |" in table
    assert table.rstrip().endswith("Made by `linmem patience x` at commit abc1234.")
    untimed = dict(p4, cpu_saved=None)  # logs without epoch times
    assert "| 4 | 2 | 1 | 2.00, 4.00 | – |" in patience_markdown([untimed])


def test_rerun_cpu_seconds_counts_an_unrolled_network_read_from_a_cache(tmp_path):
    """A seed of a pretrained run trains its own unrolled network: the projection adds the
    network's time where the run read it from a cache (not in its own CPU time), and does not
    add it twice where the run trained it (inside its recipe's and its metrics' time)."""
    def run(name, metrics, pretraining, epochs):
        run_dir = tmp_path / name
        run_dir.mkdir()
        (run_dir / "metrics.json").write_text(json.dumps(metrics))
        (run_dir / "pretraining.json").write_text(json.dumps(pretraining))
        (run_dir / "log.jsonl").write_text("".join(
            json.dumps({"epoch": e + 1, "epoch_cpu_s": s}) + "\n" for e, s in enumerate(epochs)))
        return run_dir

    read = run("read", {"cpu_time_s": 500.0},
               {"cpu_time_s": 50.0, "ulm_cpu_time_s": 0.0, "ulm_cpu_here_s": 0.0,
                "ulm_wall_time_s": 1000.0}, [200.0, 200.0])
    assert rerun_cpu_seconds(read) == pytest.approx(400.0 + 1000.0)
    older = run("older", {"cpu_time_s": 500.0}, {"cpu_time_s": 50.0, "ulm_wall_time_s": 900.0},
                [200.0, 200.0])
    assert rerun_cpu_seconds(older) == pytest.approx(400.0 + 900.0)
    trained = run("trained", {"cpu_time_s": 2000.0},
                  {"cpu_time_s": 1100.0, "ulm_cpu_time_s": 1000.0, "ulm_cpu_here_s": 1000.0,
                   "ulm_wall_time_s": 1010.0}, [400.0, 400.0])
    assert rerun_cpu_seconds(trained) == pytest.approx(2000.0)
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "metrics.json").write_text('{"cpu_time_s": 321.0}')
    assert rerun_cpu_seconds(plain) == pytest.approx(321.0)


def test_seed_table_says_whether_the_papers_figure_is_reached():
    """Per seed group of a model the paper ran: its Table 2 figure against the seeds' range of
    test accuracy, per-frame mean first (the paper's metric), global beside: reached inside the
    range, exceeded below it, not reached above it; no verdict before three seeds run; with fewer
    than two finished (the others diverged), the finished seed against the figure; no line
    where the paper has no figure (another model, or an activation neither the model's default
    nor the paper's tanh)."""
    from linmem.experiments.paper import PAPER_TABLE2
    from linmem.experiments.seed_groups import seed_groups, seeds_markdown

    def run(model, seed, frame, dataset="jsb", act=None):
        return {"dataset": dataset, "model": model, "hidden": 250, "memory": 250,
                "weight_decay": 0.0, "seed": seed, "test_acc": frame - 4, "test_acc_frame": frame,
                "test_nll": 8.0, "valid_acc": frame, "run": f"{dataset}-{model}-{act}-s{seed}",
                "nonlinearity": act}

    assert PAPER_TABLE2["lmn-b"][0] == 33.98 and PAPER_TABLE2["lstm"][0] == 32.64
    runs = ([run("lmn-b", s, f) for s, f in ((1, 33.32), (2, 34.11), (3, 33.9))]
            + [run("lstm", s, f) for s, f in ((1, 34.35), (2, 34.54), (3, 34.5))]
            + [run("pret-lmn-b", s, f) for s, f in ((1, 32.37), (2, 34.37), (3, 33.4))]
            + [run("pret-lmn-b", s, 40.0 + s / 10, act="tanh") for s in (1, 2, 3)]
            + [run("lmn-b", s, 40.0, act="relu") for s in (1, 2, 3)]
            + [run("gru", s, 33.0) for s in (1, 2, 3)]
            + [run("lmn-b", s, 27.0, dataset="piano") for s in (1, 2)])
    text = seeds_markdown(seed_groups(runs))
    assert ("- JSB Chorales, LMN-B: the paper's 33.98 against 33.32-34.11: reached (global "
            "29.32-30.11: not reached).") in text
    assert ("- JSB Chorales, LSTM: the paper's 32.64 against 34.35-34.54: exceeded (global "
            "30.35-30.54: not reached).") in text
    assert "- JSB Chorales, pret-LMN-B: the paper's 34.49 against 32.37-34.37: not reached" in text
    assert ("- Piano-midi.de, LMN-B: the paper's 28.00; 2 seed(s) run, 2 finished; no verdict "
            "until 3 have run.") in text
    two = seed_groups([run("lstm", 1, 33.0, dataset="musedata"),
                       {**run("lstm", 2, 0.0, dataset="musedata"), "diverged": "NaN"}])
    assert ("- MuseData, LSTM: the paper's 34.40; 2 seed(s) run, 1 finished; no verdict until 3 "
            "have run.") in seeds_markdown(two)
    # three run, fewer than two finished: no range, but a seed that diverged reaches nothing
    one = seed_groups([run("pret-lmn-b", 1, 31.28, dataset="musedata"),
                       *({**run("pret-lmn-b", s, 0.0, dataset="musedata"), "diverged": "NaN"}
                         for s in (2, 3))])
    assert one[0]["diverged_seeds"] == [2, 3]
    assert ("- MuseData, pret-LMN-B: the paper's 35.66; 2 of 3 seeds failed (seeds 2, 3 diverged; "
            "no score), the one finished 31.28 (global 27.28): not reached by any seed.") \
        in seeds_markdown(one)
    one[0]["test_acc_frame"]["max"] = 36.0
    assert "finished 36.00 (global 27.28): reached by that seed alone." in seeds_markdown(one)
    none = seed_groups([{**run("lmn-b", s, 0.0, dataset="musedata"), "diverged": "NaN"}
                        for s in (1, 2, 3)])
    assert ("- MuseData, LMN-B: the paper's 35.56; 3 of 3 seeds failed (seeds 1, 2, 3 diverged; "
            "no score): not reached.") in seeds_markdown(none)
    # a failed seed among finished ones: the range reaches down below every score, so a figure
    # under the finished seeds is reached, never exceeded
    mixed = seed_groups([run("lstm", 1, 34.35), run("lstm", 2, 34.54),
                         {**run("lstm", 3, 0.0), "diverged": "the checkpoint chosen on "
                          "validation (epoch 5) on the test split: NaN", "failed_on": "test"}])
    assert ("- JSB Chorales, LSTM: the paper's 32.64 against 34.35-34.54: reached (global "
            "30.35-30.54: not reached); seed 3 failed on test, counted below every score.") \
        in seeds_markdown(mixed)
    global_only = seed_groups([{k: v for k, v in run("rnn", s, 30.0).items()
                                if k != "test_acc_frame"} for s in (1, 2, 3)])
    assert ("- JSB Chorales, RNN: the paper's 31.00; no per-frame score in its seeds' records: "
            "no verdict.") in seeds_markdown(global_only)
    # pret-LMN-B with the paper's text's tanh (its default SELU) gets its line too; relu none
    assert ("- JSB Chorales, pret-LMN-B (tanh): the paper's 34.49 against 40.10-40.30: exceeded"
            in text)
    assert "GRU: the paper's" not in text and "(relu): the paper's" not in text
    assert seeds_markdown(seed_groups(runs[-3:-2])).count("the paper's") == 0  # a GRU alone


def test_table2_carries_both_protocols(tmp_path):
    """``linmem report`` of linmem's protocol with ``--compare`` (the paper protocol's
    summary.json, its search_trials.json beside it), ``--compare-seed-runs`` and ``--ablation``:
    table2.md ends with both protocols side by side, each column from its own protocol's
    selection (a grid whose every point failed is ✗, read from search_trials.json), the paper
    protocol's seeds against the paper's figures, and the ablation's tables."""
    from linmem.experiments.paper import PAPER_TABLE2
    from linmem.experiments.report import build_report

    ours, paper = tmp_path / "ours", tmp_path / "paper"
    ours.mkdir()
    (paper / "seeds").mkdir(parents=True)
    (ours / "summary.json").write_text(json.dumps([{
        "dataset": "jsb", "model": "lmn-b", "hidden": 250, "memory": 250, "weight_decay": 1e-5,
        "valid_acc": 28.0, "test_acc": 28.20, "grid": "runs", "run_dir": "x", "trials": 1,
        "frame_selection": {"test_acc_frame": 31.51, "run_dir": "x"}}]))
    (paper / "summary.json").write_text(json.dumps([{
        "study": "jsb-lmn-b-paper@paper", "dataset": "jsb", "model": "lmn-b", "hidden": 250,
        "memory": 250, "weight_decay": 0.0, "valid_acc": 29.0, "test_acc": 29.82,
        "grid": "paper", "grid_points": 30, "points_done": 30, "grid_complete": True,
        "run_dir": "y", "frame_selection": {"test_acc_frame": 33.78, "run_dir": "y"}}]))
    failed = [{"number": i, "point": f"h{h}-m{h}-wd0", "state": "fail"}
              for i, h in enumerate((50, 100, 50))]  # two points, one tried twice
    (paper / "search_trials.json").write_text(json.dumps([
        {"study": "jsb-lmn-b-paper@paper", "dataset": "jsb", "model": "lmn-b",
         "grid": "paper", "grid_points": 30, "points_done": 30, "grid_complete": True,
         "trials_run": []},
        {"study": "piano-lmn-a-paper-long@paper", "dataset": "piano", "model": "lmn-a",
         "grid": "paper-long", "grid_points": 2, "points_done": 0, "grid_complete": True,
         "trials_run": failed},
        {"study": "piano-gru-paper-long@paper", "dataset": "piano", "model": "gru",
         "grid": "paper-long", "grid_points": 4, "points_done": 0, "grid_complete": False,
         "trials_run": failed[:1]}]))  # not complete: not run yet, not ✗
    for seed, frame in enumerate((33.0, 34.5, 33.5), 1):
        run = paper / "seeds" / f"jsb-lmn-b-s{seed}"
        run.mkdir()
        (run / "metrics.json").write_text(json.dumps({
            "dataset": "jsb", "model": "lmn-b", "hidden": 250, "memory": 250,
            "weight_decay": 0.0, "seed": seed, "protocol": "paper", "valid_acc_frame": frame,
            "valid_acc": frame - 4, "test_acc": frame - 4, "test_acc_frame": frame,
            "test_nll": 9.0}))
        (run / "config.json").write_text(json.dumps({"model": "lmn-b", "seed": seed}))
    base = {"dataset": "jsb", "model": "lmn-b", "hidden": 250, "memory": 250,
            "weight_decay": 0.0, "seeds": [1, 2, 3], "runs": ["a", "b", "c"],
            "test_acc_frame": {"mean": 33.7, "sd": 0.8, "min": 33.0, "max": 34.5, "n": 3}}
    variant = {**base, "runs": ["d", "e", "f"],
               "test_acc_frame": {"mean": 31.0, "sd": 0.5, "min": 30.5, "max": 31.5, "n": 3}}
    factor = {"dataset": "jsb", "model": "lmn-b", "base": base, "variant": variant}
    (paper / "ablation.json").write_text(json.dumps({
        "command": "linmem ablation --base s", "commit": "abc123", "factors": [
            {**factor, "factor": {"batch_size": 4}, "base_values": {"batch_size": 1}},
            {**factor, "factor": {"clip": 0.0568}, "base_values": {"clip": 10.0}}]}))
    build_report("sqlite:///" + str(tmp_path / "none.db"), None, tmp_path, tmp_path / "out",
                 summaries=[ours / "summary.json"], protocol="linmem",
                 compare=paper / "summary.json", compare_seed_runs=[paper / "seeds"],
                 ablation=paper / "ablation.json", command="linmem report ...")
    text = (tmp_path / "out" / "table2.md").read_text()
    section = text[text.index("## Both training protocols"):]
    assert text.index("Grid coverage") < text.index("## Both") < text.index("Generated by")
    assert "trained under linmem's protocol" in section
    rows = {tuple(c.strip() for c in line.split("|")[1:3]): line
            for line in section[:section.index("Seeds under")].splitlines()
            if line.startswith(("| JSB", "| Piano"))}
    # the paper protocol's columns from --compare, linmem's from the report's own records
    assert rows["JSB Chorales", "LMN-B"] == (f"| JSB Chorales | LMN-B | "
                                             f"{PAPER_TABLE2['lmn-b'][0]:.2f} | 33.78 | 29.82 | "
                                             "31.51 | 28.20 |")
    assert rows["Piano-midi.de", "LMN-A"].endswith("| ✗ | ✗ | – | – |")
    assert ("Piano-midi.de", "GRU") not in rows
    assert "Seeds under the paper's protocol" in section
    assert (f"- JSB Chorales, LMN-B: the paper's {PAPER_TABLE2['lmn-b'][0]:.2f} against "
            "33.00-34.50: reached") in section
    assert "made by `linmem ablation --base s` at commit abc123" in section
    assert "### A part of training changed alone" in section
    assert sum("– (as selected)" in line for line in section.splitlines()) == 1
    assert "| batch_size 1 → 4 | 1, 2, 3 | 31.00 ± 0.50 (30.50-31.50) | -2.70 (ranges apart)" \
        in section
    # protocols.md has the paper protocol's columns first whichever protocol the report is of
    assert "| 33.78 | 29.82 | 31.51 | 28.20 |" in (tmp_path / "out" / "protocols.md").read_text()
    # bad input
    (tmp_path / "bad.json").write_text(json.dumps({"command": "x"}))
    with pytest.raises(ValueError, match=r"--ablation .*bad\.json: not `linmem ablation`"):
        build_report("sqlite:///" + str(tmp_path / "none.db"), None, tmp_path,
                     tmp_path / "out2", summaries=[ours / "summary.json"],
                     ablation=tmp_path / "bad.json")


def test_the_committed_summarize_tables_are_what_their_makefile_commands_print(capsys,
                                                                                monkeypatch):
    """Each ``results/*/table.md`` that the Makefile makes with ``linmem summarize`` is that
    command's output on the committed runs, so a run published later or a column added to
    the table cannot leave the file stale."""
    from linmem.cli.commands import main

    root = Path(__file__).resolve().parents[1]
    makefile = (root / "Makefile").read_text().replace("\\\n", " ")
    made = re.findall(r"\$\(VENV\)/bin/linmem summarize (.+?) > (results/\S+/table\.md)", makefile)
    monkeypatch.chdir(root)
    checked = 0
    for args, table in made:
        if not (root / table).is_file():  # a target not run yet (a campaign under way)
            continue
        words = [w for a in shlex.split(args) for w in (sorted(glob.glob(a)) or [a])]
        main(["summarize", *words])
        assert capsys.readouterr().out == (root / table).read_text(), table
        # the file says the command that made it, whose arguments are the Makefile's
        last = (root / table).read_text().rstrip().splitlines()[-1]
        assert last == f"Made by `{shlex.join(['linmem', 'summarize', *words])}`.", table
        checked += 1
    assert checked >= 7


def test_seed_groups_keep_bounds_and_protocol_departures_apart():
    """Seeds of one configuration trained with and without a memory bound, and with and
    without a protocol field changed (the bounded-memory pilot's 2 x 2): four groups, each
    labelled by what sets it apart."""
    from linmem.experiments.seed_groups import seed_groups, seeds_markdown

    def run(seed, bound, overrides, acc):
        return {"dataset": "piano", "model": "lmn-a", "hidden": 250, "memory": 250,
                "weight_decay": 0.0, "seed": seed, "memory_bound": bound,
                "protocol_overrides": overrides, "test_acc": acc, "test_acc_frame": acc,
                "test_nll": 8.0, "valid_acc": acc, "run": f"{bound}-{overrides}-{seed}"}

    records = [run(s, b, o, 20.0 + s) for s in (1, 2) for b in (None, 0.99)
               for o in ({}, {"init_bias": True})]
    groups = seed_groups(records)
    assert len(groups) == 4 and all(g["seeds"] == [1, 2] for g in groups)
    table = seeds_markdown(groups)
    for label in ("| LMN-A |", "| LMN-A (init_bias true) |", "| LMN-A (bound 0.99) |",
                  "| LMN-A (bound 0.99, init_bias true) |"):
        assert label in table, label
    # their validation side (linmem summarize --valid), what a choice between them is made on
    from linmem.experiments.seed_groups import valid_seeds_markdown

    for r in records:
        r["valid_acc"], r["valid_acc_frame"] = 30.0 + 2 * r["seed"], 25.0 + r["seed"]
    valid = valid_seeds_markdown(seed_groups(records))
    assert ("| Piano-midi.de | LMN-A (bound 0.99) | 250, 250 | 0 | 1, 2 | "
            "33.00 ± 1.41 (32.00-34.00) | 26.50 ± 0.71 (26.00-27.00) |") in valid
    assert len(valid.strip().splitlines()) == 2 + 4


def test_the_claims_compare_seeds_under_the_same_bound():
    """Bounded and unbounded seeds in one table (the campaign's one-factor comparison): the
    bounded pret-LMN-B's claim is against the bounded LMN-B, the unbounded one's against the
    unbounded, and each LMN-B's against the one LSTM (no memory, no bound)."""
    from linmem.experiments.seed_groups import seed_groups, seeds_markdown

    def run(model, seed, bound, acc):
        return {"dataset": "jsb", "model": model, "hidden": 50,
                "memory": None if model == "lstm" else 50, "weight_decay": 0.0, "seed": seed,
                "memory_bound": bound, "protocol_overrides": {}, "test_acc": acc,
                "test_acc_frame": acc, "test_nll": 8.0, "valid_acc": acc,
                "run": f"{model}-{bound}-{seed}"}

    records = [run("lstm", s, None, 30.0 + s) for s in (1, 2, 3)]
    for bound, base in ((None, 20.0), (0.99, 40.0)):
        records += [run("lmn-b", s, bound, base + s) for s in (1, 2, 3)]
        records += [run("pret-lmn-b", s, bound, base + 1 + s) for s in (1, 2, 3)]
    table = seeds_markdown(seed_groups(records))
    claims = [line for line in table.splitlines() if line.startswith("- JSB Chorales: ")]
    assert sorted(claims) == sorted([
        "- JSB Chorales: pret-LMN-B against LMN-B: +1.00 points global, the ranges overlap "
        "(within the spread between seeds); +1.00 points per-frame mean, the ranges overlap "
        "(within the spread between seeds).",
        "- JSB Chorales: pret-LMN-B (bound 0.99) against LMN-B (bound 0.99): +1.00 points "
        "global, the ranges overlap (within the spread between seeds); +1.00 points per-frame "
        "mean, the ranges overlap (within the spread between seeds).",
        "- JSB Chorales: LMN-B against LSTM: -10.00 points global, the ranges do not overlap "
        "(beyond the spread between seeds); -10.00 points per-frame mean, the ranges do not "
        "overlap (beyond the spread between seeds).",
        "- JSB Chorales: LMN-B (bound 0.99) against LSTM: +10.00 points global, the ranges do "
        "not overlap (beyond the spread between seeds); +10.00 points per-frame mean, the "
        "ranges do not overlap (beyond the spread between seeds)."])


def test_table2_rows_name_what_sets_their_configurations_apart():
    """A model's row carries its selections' memory bound and protocol departures (as the seeds'
    rows do); selections of one model that differ in them between data sets are refused (one row
    cannot say both), and of_bound keeps one bound's LMNs, naming the others, every other model
    kept; the table with both protocols names each side's where they differ."""
    from linmem.experiments.both_protocols import protocols_markdown
    from linmem.experiments.report import ANY_BOUND, of_bound
    from linmem.experiments.table2 import table2_markdown

    bounded = {"memory_bound": 0.99, "overrides": [("init_bias", True)]}
    records = [{**_record("jsb", "lmn-a", 30.0), **bounded},
               {**_record("piano", "lmn-a", 26.0), **bounded},
               _record("jsb", "lstm", 31.0)]
    table = table2_markdown(records)
    assert table.count("| LMN-A (bound 0.99, init_bias true) | 30.61 | 30.00 |") == 1
    assert "| LSTM | 32.64 | **31.00** |" in table
    assert "lmn-a (paper, bound 0.99, init_bias true) 30/30 complete" in table
    mixed = [*records, _record("musedata", "lmn-a", 33.0)]
    with pytest.raises(ValueError, match=r"LMN-A's selections differ between the data sets "
                                         r"\(bound 0.99, init_bias true; the defaults\)"):
        table2_markdown(mixed)
    kept, left = of_bound(mixed, 0.99)
    assert kept == records and left == ["musedata-lmn-a-paper"]
    kept, left = of_bound(mixed, None)
    assert [r["dataset"] for r in kept] == ["jsb", "musedata"]
    assert left == ["jsb-lmn-a-paper", "piano-lmn-a-paper"]
    assert of_bound(mixed, ANY_BOUND) == (mixed, [])
    both = protocols_markdown(records, [_record("jsb", "lmn-a", 29.0)])
    # the side without a bound is the paper's unbounded memory, not the layer's default
    assert ("| JSB Chorales | LMN-A (paper protocol: bound 0.99, init_bias true; linmem "
            "protocol: unbounded) | 30.61 |") in both
    departs = [{**r, "memory_bound": None} for r in records]
    assert ("| JSB Chorales | LMN-A (paper protocol: init_bias true; linmem protocol: the "
            "defaults) | 30.61 |") in protocols_markdown(departs, [_record("jsb", "lmn-a", 29.0)])
    assert "| JSB Chorales | LSTM | 32.64 |" in both


def test_a_selection_with_a_bound_or_a_departure_has_a_folder_of_its_own():
    """selected_name: a bounded or departing selection's copy never takes the folder of one
    without them (a report of bounded LMN rows into the unbounded report's folder keeps both),
    named as the study is (the same +FIELD=VALUE text)."""
    from linmem.experiments.grids import study_name
    from linmem.experiments.report import selected_name

    plain = _record("jsb", "lmn-a", 30.0)
    bounded = {**plain, "memory_bound": 0.99, "overrides": [("init_bias", True)]}
    assert selected_name(plain) == "jsb-lmn-a"
    assert selected_name(plain, per_frame=True) == "jsb-lmn-a-per-frame"
    assert selected_name(bounded) == "jsb-lmn-a+init_bias=True+memory_bound=0.99"
    assert selected_name(bounded, per_frame=True).endswith("+memory_bound=0.99-per-frame")
    assert study_name("jsb", "lmn-a", "paper", "paper", {"init_bias": True, "memory_bound": 0.99}
                      ).endswith(selected_name(bounded).removeprefix("jsb-lmn-a"))


def test_seed_groups_keep_the_ablations_configurations_apart():
    """Runs that differ in dropout, input path or loop bound (the ablation's and the loop
    choice's levels) are seed groups of their own, named by what sets them apart; the same
    configuration's seeds are one group."""
    from linmem.experiments.seed_groups import row_label, seed_groups

    def run(seed, **extra):
        return {"run": f"r{seed}{sorted(extra.items())}", "dataset": "jsb", "model": "lmn-b",
                "hidden": 250, "memory": 250, "weight_decay": 0.0, "memory_bound": 0.99,
                "seed": seed, "valid_acc_frame": 30.0 + seed, **extra}

    records = [run(s, **extra) for s in (1, 2)
               for extra in ({}, {"dropout": 0.3}, {"input_path": "gain"}, {"loop_bound": True},
                             {"transpose": 6})]
    with pytest.raises(ValueError, match="given twice"):  # the defaults spelt out: the same
        seed_groups([*records, run(1, dropout=0.0, input_path="none", loop_bound=False,
                                   transpose=0)])
    groups = seed_groups(records)
    assert len(groups) == 5 and all(g["seeds"] == [1, 2] for g in groups)
    assert sorted(row_label(g) for g in groups) == [
        "LMN-B (bound 0.99)", "LMN-B (bound 0.99, dropout 0.3)", "LMN-B (bound 0.99, input gain)",
        "LMN-B (bound 0.99, loop bound)", "LMN-B (bound 0.99, transpose 6)"]
