"""Grid search on Optuna: every grid point runs exactly once, with SQLite and with PostgreSQL, even
when a worker is killed mid-trial; selection on validation only; the report's files."""

import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from linmem._io import machine
from linmem.experiments.grids import GRIDS, MAX_RETRY, Point, grid_points, point_states, trial_point
from linmem.experiments.progress import planned_record, progress_records
from linmem.experiments.projection import project_points
from linmem.experiments.search import SearchConfig, open_study, point_seconds, run_worker
from linmem.experiments.storage import default_storage, make_storage
from linmem.experiments.studies import search_records, select
from linmem.training.config import DEFAULT_PROTOCOL, LEGACY_PROTOCOL, TrainConfig

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_paper_grids():
    rnn, lmn = grid_points("lstm", "paper"), grid_points("pret-lmn-b", "paper")
    assert len(rnn) == 25 and len(lmn) == 30
    assert {p.hidden for p in rnn} == {50, 100, 250, 500, 750} and {p.memory for p in rnn} == {None}
    assert {(p.hidden, p.memory) for p in lmn} == {(50, 50), (50, 100), (100, 100), (100, 250),
                                                   (250, 250), (250, 500)}
    assert {p.weight_decay for p in lmn} == {1e-4, 1e-5, 1e-6, 1e-7, 0.0}
    assert len(set(lmn)) == 30
    assert Point(50, 100, 1e-5).name == "h50-m100-wd1e-05"
    assert Point.from_params(Point(50, None, 0.0).params) == Point(50, None, 0.0)


def test_bad_search_settings():
    with pytest.raises(ValueError, match="unknown grid"):
        SearchConfig(grid="huge")
    with pytest.raises(ValueError, match="unknown model"):
        SearchConfig(models=["transformer"])
    with pytest.raises(ValueError, match="unknown data set"):
        SearchConfig(data=["mnist"])


def _config(tmp_path, data_dir, storage=None, **kw) -> SearchConfig:
    # the protocol of linmem search's studies by default (linmem train's is the paper's); the
    # memory unbounded whatever the layer's default (DEFAULT_MEMORY_BOUND), so that the study
    # names these tests pin are the search's mechanics, not that default's
    base = TrainConfig(epochs=kw.pop("epochs", 2), patience=kw.pop("patience", 50),
                       cd_k=kw.pop("base_cd_k", 15), data_dir=str(data_dir),
                       protocol=kw.pop("protocol", LEGACY_PROTOCOL),
                       memory_bound=kw.pop("memory_bound", None))
    return SearchConfig(data=["jsb"], models=kw.pop("models", ["lmn-b"]), grid="tiny",
                        out_dir=str(tmp_path / "runs"), storage=storage, base=base, subset=6,
                        heartbeat_interval=1, grace_period=3, poll_s=0.2, progress=False, **kw)


def _complete_once(study, points):
    complete = [trial_point(t) for t in study.get_trials(states=(TrialState.COMPLETE,))]
    return sorted(complete, key=lambda p: p.name) == sorted(points, key=lambda p: p.name)


def test_sqlite_search_runs_each_point_once_and_selects_on_validation(tmp_path, data_dir):
    config = _config(tmp_path, data_dir, models=["lmn-b", "rnn"])
    counts = run_worker(config, command="test", log=lambda _: None)
    assert counts == {"jsb-lmn-b-tiny": {"done": 4}, "jsb-rnn-tiny": {"done": 4}}
    storage = default_storage(config.out_dir)
    assert storage.startswith("sqlite:///") and Path(storage[10:]).is_file()
    study = optuna.load_study(study_name="jsb-lmn-b-tiny", storage=storage)
    assert _complete_once(study, grid_points("lmn-b", "tiny"))
    # a finished study: the same command again runs nothing
    n_trials = len(study.get_trials())
    run_worker(config, command="test", log=lambda _: None)
    assert len(study.get_trials()) == n_trials
    # each trial is an ordinary run; the objective is its validation accuracy
    for t in study.get_trials():
        metrics = json.loads((Path(t.user_attrs["run_dir"]) / "metrics.json").read_text())
        assert t.value == pytest.approx(metrics["valid_acc"])
        assert t.user_attrs["test_acc"] == pytest.approx(metrics["test_acc"])
        assert metrics["command"] == "test" and metrics["epochs"] == 2
        assert t.user_attrs["pruner"] == "median"  # linmem's: what could have ended it sooner
    best, counts = select(study)
    values = {t.number: t.value for t in study.get_trials()}
    assert best.value == max(values.values()) and counts["complete"] == 4
    # selection never looks at the test split: flip test scores, the choice stays
    records = search_records(storage, "tiny")
    assert {r["model"] for r in records} == {"lmn-b", "rnn"}
    r = next(r for r in records if r["model"] == "lmn-b")
    assert r["grid_complete"] and r["trials"] == 4 and r["valid_acc"] == best.value
    assert r["test_acc"] == best.user_attrs["test_acc"] and r["command"] == "test"
    assert all("test_acc" not in t for t in r["trials_run"])
    # what the trial did not store comes from its run's metrics.json: the per-frame accuracies
    selected = json.loads((Path(best.user_attrs["run_dir"]) / "metrics.json").read_text())
    assert r["test_acc_frame"] == selected["test_acc_frame"] is not None
    # the per-frame column selects on its own validation score, among the same trials
    per_frame = [(json.loads((Path(t.user_attrs["run_dir"]) / "metrics.json").read_text())[
        "valid_acc_frame"], -t.number, t) for t in study.get_trials()]
    best_frame, _, top = max(per_frame, key=lambda x: x[:2])  # ties: the lower trial number
    assert r["frame_selection"]["valid_acc_frame"] == best_frame
    assert r["frame_selection"]["test_acc_frame"] == top.user_attrs["test_acc_frame"]
    assert r["frame_selection"]["point"] == trial_point(top).name

    # linmem report: summary.json, table2.md, figure4 from the same studies
    from linmem.cli.commands import main

    results = tmp_path / "results"
    main(["report", "--storage", storage, "--grid", "tiny", "--out", str(results)])
    summary = json.loads((results / "summary.json").read_text())
    assert [(s["dataset"], s["model"]) for s in summary] == [("jsb", "rnn"), ("jsb", "lmn-b")]
    mine = summary[1]
    assert mine["test_acc"] == r["test_acc"] and mine["valid_acc"] == best.value
    assert (mine["hidden"], mine["memory"]) == (trial_point(best).hidden, trial_point(best).memory)
    for key in ("test_nll", "n_params", "epochs", "wall_time_s", "trials", "command", "commit",
                "seed", "weight_decay"):
        assert mine[key] is not None, key
    table = (results / "table2.md").read_text()
    assert "| LMN-B | 33.98 |" in table and "JSB Chorales: lmn-b (tiny) 4/4 complete" in table
    assert (results / "figure4.png").stat().st_size > 0
    fig = json.loads((results / "figure4.json").read_text())
    assert set(fig["curves"]) == {"rnn", "lmn-b"}
    assert (results / "selected" / "jsb-lmn-b" / "metrics.json").is_file()
    trials = json.loads((results / "search_trials.json").read_text())
    assert "test_acc" not in json.dumps(trials)


def test_search_runs_the_rnn_rbm(tmp_path, data_dir):
    config = _config(tmp_path, data_dir, models=["rnn-rbm"], epochs=1)
    config.base = TrainConfig(**{**config.base.__dict__, "rbm_hidden": 6, "cd_k": 1,
                                 "ais_chains": 4, "ais_betas": 4, "ais_frames": 8})
    assert run_worker(config, command="test", log=lambda _: None) == {
        "jsb-rnn-rbm-tiny": {"done": 4}}
    record = search_records(default_storage(config.out_dir), "tiny")[0]
    assert record["model"] == "rnn-rbm" and record["grid_complete"]
    assert record["test_nll"] > 0 and record["hidden"] in (4, 8)


def test_other_settings_are_refused(tmp_path, data_dir):
    config = _config(tmp_path, data_dir)
    open_study(config, "jsb", "lmn-b")
    other = _config(tmp_path, data_dir, epochs=5)
    with pytest.raises(ValueError, match="other settings"):
        open_study(other, "jsb", "lmn-b")
    # a study made before a setting existed loads when that setting is at its default
    study = open_study(config, "jsb", "lmn-b")
    train = dict(study.user_attrs["train"])
    del train["cd_k"]
    study.set_user_attr("train", train)
    open_study(config, "jsb", "lmn-b")
    with pytest.raises(ValueError, match="other settings"):
        open_study(_config(tmp_path, data_dir, base_cd_k=3), "jsb", "lmn-b")
    # one made before protocols had names (linmem's), though linmem train's default is another
    for key in ("protocol", "loss_reduction", "init_bias", "select"):
        del train[key]
    study.set_user_attr("train", train)
    assert DEFAULT_PROTOCOL != "linmem"
    assert open_study(config, "jsb", "lmn-b").study_name == "jsb-lmn-b-tiny"


def test_a_departure_from_the_protocol_is_a_study_of_its_own_named_by_it(tmp_path, data_dir):
    storage = default_storage(tmp_path / "runs")
    plain = open_study(_config(tmp_path, data_dir), "jsb", "lmn-b")
    config = _config(tmp_path, data_dir)
    config.base = replace(config.base, clip=0.0568, patience=7)
    clipped = open_study(config, "jsb", "lmn-b")
    assert plain.study_name == "jsb-lmn-b-tiny"
    assert clipped.study_name == "jsb-lmn-b-tiny+clip=0.0568+patience=7"
    assert clipped.user_attrs["train"]["clip"] == 0.0568
    assert plain.user_attrs["train"]["clip"] == 5.0  # untouched beside it
    assert sorted(optuna.get_all_study_names(storage)) == [plain.study_name, clipped.study_name]
    bounded = open_study(replace(config, base=replace(config.base, memory_bound=0.99)), "jsb",
                         "lmn-b")
    assert bounded.study_name == "jsb-lmn-b-tiny+clip=0.0568+memory_bound=0.99+patience=7"
    assert bounded.user_attrs["train"]["memory_bound"] == 0.99
    optuna.delete_study(study_name=bounded.study_name, storage=storage)
    # a study of that departure made before names carried it keeps its old name
    attrs = clipped.user_attrs
    optuna.delete_study(study_name=plain.study_name, storage=storage)
    optuna.delete_study(study_name=clipped.study_name, storage=storage)
    old = optuna.create_study(storage=storage, study_name="jsb-lmn-b-tiny")
    for key, value in attrs.items():
        old.set_user_attr(key, value)
    assert open_study(config, "jsb", "lmn-b").study_name == "jsb-lmn-b-tiny"
    # ... and one with other settings under the old name gets the new name beside it
    assert open_study(replace(config, base=replace(config.base, clip=0.1)), "jsb",
                      "lmn-b").study_name == "jsb-lmn-b-tiny+clip=0.1+patience=7"


def test_pret_lmn_points_that_differ_in_memory_share_their_unrolled_network(tmp_path,
                                                                             data_dir):
    """The tiny grid's 4 pret-LMN-B points have 2 unrolled networks (hidden 4 with each weight
    decay): the search trains those 2, in OUT/ulm-cache."""
    config = _config(tmp_path, data_dir, models=["pret-lmn-b", "lmn-b"], epochs=1)
    counts = run_worker(config, command="test", log=lambda _: None)
    assert counts["jsb-pret-lmn-b-tiny"] == {"done": 4}
    cache = tmp_path / "runs" / "ulm-cache"
    entries = sorted(p.name for p in cache.iterdir() if not p.name.startswith("."))
    assert len(entries) == 2
    study = optuna.load_study(study_name="jsb-pret-lmn-b-tiny", storage=default_storage(
        config.out_dir))
    used = {}
    for t in study.get_trials(states=(TrialState.COMPLETE,)):
        run_dir = Path(t.user_attrs["run_dir"])
        assert not (run_dir / "ulm").exists()
        ulm_run = json.loads((run_dir / "pretraining.json").read_text())["ulm_run"]
        used.setdefault(t.params["weight_decay"], set()).add(Path(ulm_run).name)
        assert json.loads((run_dir / "config.json").read_text())["ulm_cache"] == str(cache)
    assert sorted(n for names in used.values() for n in names) == entries
    assert all(len(names) == 1 for names in used.values())
    # the LMN-B study beside it takes no cache
    lmn = optuna.load_study(study_name="jsb-lmn-b-tiny", storage=default_storage(config.out_dir))
    run_dir = Path(lmn.get_trials()[0].user_attrs["run_dir"])
    assert json.loads((run_dir / "config.json").read_text())["ulm_cache"] is None


def test_duplicates_are_not_run(tmp_path, data_dir):
    """Two workers that enqueue the same point at once: the lower trial number runs it."""
    config = _config(tmp_path, data_dir)
    study = open_study(config, "jsb", "lmn-b")
    point = grid_points("lmn-b", "tiny")[0]
    study.enqueue_trial(point.params)
    study.enqueue_trial(point.params)
    states = point_states(study, grid_points("lmn-b", "tiny"))
    assert states[point] == "waiting" and list(states.values()).count("todo") == 3
    run_worker(config, command="test", log=lambda _: None)
    trials = study.get_trials()
    same = [t for t in trials if trial_point(t) == point]
    assert [t.state for t in same] == [TrialState.COMPLETE, TrialState.PRUNED]
    assert same[1].user_attrs["duplicate_of"] == same[0].number
    assert "run_dir" not in same[1].user_attrs  # never trained
    assert _complete_once(study, grid_points("lmn-b", "tiny"))


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_progress_counts_the_logged_cpu_time_and_projects_the_rest(tmp_path, data_dir):
    config = _config(tmp_path, data_dir)
    run_worker(config, command="test", log=lambda _: None)
    open_study(replace(config, models=["rnn"]), "jsb", "rnn")  # a study not started yet
    storage = default_storage(config.out_dir)
    records = {r["model"]: r for r in progress_records(storage, "tiny")}
    done = records["lmn-b"]
    assert done["states"] == {"done": 4} and done["grid_points"] == 4
    logged = sum(json.loads((run / "metrics.json").read_text())["cpu_time_s"]
                 for run in (tmp_path / "runs").glob("*/*"))
    assert done["cpu_s"] == pytest.approx(logged) and done["cpu_s"] > 0
    assert done["mean_point_cpu_s"] == pytest.approx(logged / 4) and done["left_cpu_s"] == 0
    here = machine()["cpu"]  # the runs ended here and recorded it
    assert done["cpu_s_by_machine"] == {here: pytest.approx(logged)}
    todo = records["rnn"]  # nothing finished: the data set's mean per point
    assert todo["states"] == {"todo": 4} and todo["cpu_s"] == 0
    assert todo["left_from"] == "data set" and todo["left_cpu_s"] == pytest.approx(logged)
    planned = project_points([*records.values(), planned_record("JSB", "pret-lmn-b", "tiny",
                                                                LEGACY_PROTOCOL)])[-1]
    assert planned["study"] == "jsb-pret-lmn-b-tiny (planned)" and planned["todo"] == 4
    assert planned["left_from"] == "data set" and planned["left_cpu_s"] == pytest.approx(logged)

    from linmem.cli.commands import main

    out = tmp_path / "progress.md"
    earlier = tmp_path / "summary.json"  # a search whose storage is gone: its trials' time
    earlier.write_text(json.dumps([
        {"dataset": "jsb", "model": "gru", "grid": "paper", "grid_points": 25,
         "grid_complete": True, "search_wall_time_s": 7200.0},
        {"dataset": "jsb", "model": "lmn-b", "grid": "paper", "grid_points": 30,
         "grid_complete": True, "search_wall_time_s": 1e6}]))  # in the storage: left out
    seed = tmp_path / "seeds" / "s1"  # a pretrained single run: its ULM counts inside it
    (seed / "ulm").mkdir(parents=True)
    (seed / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 3600.0}\n')
    (seed / "ulm" / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 1800.0}\n')
    (seed / "pretraining.json").write_text('{"cpu_time_s": 1800.0}')
    failed = tmp_path / "seeds" / "s2"  # diverged in its first epoch: no log, counted all the same
    failed.mkdir()
    (failed / "pretraining.json").write_text('{"cpu_time_s": 1800.0}')
    (failed / "diverged.json").write_text('{"cpu_time_s": 1900.0}')
    main(["progress", "--storage", storage, "--grid", "tiny", "--summary", str(earlier),
          "--run", str(tmp_path / "seeds"), "--out", str(out),
          "--plan", "jsb:pret-lmn-b", "--plan", "jsb:rnn:tiny"])  # rnn: started, counted once
    text = out.read_text()
    assert text.count("jsb-rnn-tiny") == 1 and "jsb-rnn-tiny (planned)" not in text
    per = logged / 4 / 3600  # not started: at the data set's mean per point, as jsb-rnn-tiny
    assert (f"| jsb-pret-lmn-b-tiny (planned) | 0 / 4 | 0 | 0 | 0.00 | {per:.2f} (data set's) "
            f"| {4 * per:.2f} |") in text
    assert f"projected CPU hours left for the studies above: **{8 * per:.1f}**" in text
    assert f"| {seed} (single run) | – | – | – | 1.50 |" in text and "ulm (single" not in text
    assert f"| {failed} (single run) | – | – | – | 0.53 |" in text
    assert "| jsb-lmn-b-tiny | 4 / 4 | 0 | 0 |" in text and "| jsb-rnn-tiny | 0 / 4 |" in text
    # by CPU: the runs here (the seed in flight too), the earlier study's trials and the
    # diverged seed that recorded no machine
    assert (f"ended on, a run in flight on this one): {here} {(logged + 5400) / 3600:.1f}; "
            f"not recorded (runs and trials from before the record) {9100 / 3600:.1f}.") in text
    assert "| jsb-gru-paper (earlier: trial wall time) | 25 / 25 | 0 | 0 | 2.00 |" in text
    assert f"CPU hours logged: **{(logged + 7200 + 5400 + 1900) / 3600:.1f}**" in text
    assert "Made by `" in text
    for bad in (["--plan", "jsb:rnn"], ["--grid", "tiny", "--plan", "jsb:rnn:huge"],
                ["--grid", "tiny", "--plan", "jsb:transformer"], ["--plan", "a:b:c:d"]):
        with pytest.raises(SystemExit) as exit_:  # one line, exit 2 (main's usage errors)
            main(["progress", "--storage", storage, *bad])
        assert exit_.value.code == 2, bad


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")
def test_progress_plans_the_seeds_of_the_selected_run(tmp_path, data_dir):
    """``--plan-seeds``: the seeds left (N less those finished among --run, in either layout),
    each at the selected run's CPU time plus its cached unrolled network's; no study needed
    once every seed is done; a missing study or a bad plan is a usage error."""
    from linmem.cli.commands import main
    from linmem.experiments.progress import seeds_record
    from linmem.experiments.studies import select

    config = _config(tmp_path, data_dir)
    run_worker(config, command="test", log=lambda _: None)
    storage = default_storage(config.out_dir)
    best, _ = select(optuna.load_study(study_name="jsb-lmn-b-tiny", storage=storage))
    run = Path(best.user_attrs["run_dir"])
    per = json.loads((run / "metrics.json").read_text())["cpu_time_s"]
    cached = tmp_path / "ulm-cache" / "jsb-h4-selu-s0-0123456789ab"  # a cache entry's ULM
    cached.mkdir(parents=True)
    (cached / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 900.0}\n')
    (run / "pretraining.json").write_text(json.dumps({"cpu_time_s": 0.0,
                                                      "ulm_run": str(cached)}))
    per += 900.0
    record = seeds_record(storage, "JSB", "lmn-b", "tiny", seeds=3, done=1)
    assert (record["todo"], record["states"], record["left_from"]) == (2, {"done": 1},
                                                                       "selected run")
    assert record["mean_point_cpu_s"] == pytest.approx(per)
    assert record["left_cpu_s"] == pytest.approx(2 * per)
    assert seeds_record(storage, "jsb", "gru", "tiny", done=3)["left_cpu_s"] == 0.0  # no study
    seeds = tmp_path / "seeds"
    for name in ("jsb-lmn-b/s1", "jsb-lmn-b-s2", "jsb-lmn-b/s9", "jsb-lstm-s1"):
        (seeds / name).mkdir(parents=True)
        (seeds / name / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 10.0}\n')
        if name != "jsb-lmn-b/s9":  # s9 is still training
            (seeds / name / "metrics.json").write_text('{"cpu_time_s": 10.0}')
    out = tmp_path / "progress.md"
    main(["progress", "--storage", storage, "--grid", "tiny", "--run", str(seeds),
          "--out", str(out), "--plan-seeds", "jsb:lmn-b:tiny:4"])
    text = out.read_text()
    assert (f"| jsb-lmn-b-tiny seeds | 2 / 4 | 0 | 0 | 0.00 | {per / 3600:.2f} (selected "
            f"run's) | {2 * per / 3600:.2f} |") in text
    for bad in ("jsb:lmn-b", "jsb:gru:tiny", "jsb:lmn-b:tiny:x"):
        with pytest.raises(SystemExit) as exit_:
            main(["progress", "--storage", storage, "--plan-seeds", bad])
        assert exit_.value.code == 2, bad
    # the seeds of a search not started yet but planned: a row of their own, at its dearest
    # point once that is projected (here nothing is: no GRU has finished a point)
    main(["progress", "--storage", storage, "--grid", "tiny", "--out", str(out),
          "--plan", "jsb:gru:tiny", "--plan-seeds", "jsb:gru:tiny"])
    assert "| jsb-gru-tiny (planned) seeds | 0 / 3 |" in out.read_text()
    # the selected run on another machine (an imported study): its trial's stored CPU time
    run.rename(tmp_path / "moved")
    elsewhere = seeds_record(storage, "jsb", "lmn-b", "tiny", seeds=3, done=1)
    assert elsewhere["left_from"] == "selected trial"
    assert best.user_attrs["cpu_time_s"] > 0
    assert elsewhere["mean_point_cpu_s"] == pytest.approx(best.user_attrs["cpu_time_s"])
    assert elsewhere["left_cpu_s"] == pytest.approx(2 * best.user_attrs["cpu_time_s"])
    main(["progress", "--storage", storage, "--grid", "tiny", "--out", str(out),
          "--plan-seeds", "jsb:lmn-b:tiny"])
    assert "(selected run's, trial's stored time)" in out.read_text()
    # a study whose name departs from the plain one (a bounded memory,
    # linmem.experiments.grids.study_name) is the plan's study all the same; two such are ambiguous,
    # and said to be
    bounded = "jsb-lmn-b-tiny+memory_bound=0.99"
    optuna.copy_study(from_study_name="jsb-lmn-b-tiny", from_storage=storage,
                      to_storage=storage, to_study_name=bounded)
    optuna.delete_study(study_name="jsb-lmn-b-tiny", storage=storage)
    found = seeds_record(storage, "jsb", "lmn-b", "tiny", seeds=3, done=1)
    assert found["study"] == f"{bounded} seeds"
    assert found["left_cpu_s"] == pytest.approx(elsewhere["left_cpu_s"])
    optuna.copy_study(from_study_name=bounded, from_storage=storage, to_storage=storage,
                      to_study_name="jsb-lmn-b-tiny+memory_bound=0.9")
    with pytest.raises(ValueError, match="2 studies of jsb-lmn-b-tiny in the storage"):
        seeds_record(storage, "jsb", "lmn-b", "tiny", seeds=3, done=1)


def test_run_cpu_seconds_adds_the_pretraining(tmp_path):
    from linmem.experiments.run_costs import run_cpu_seconds

    run = tmp_path / "run"
    run.mkdir()
    assert run_cpu_seconds(run) == 0.0
    (run / "log.jsonl").write_text('{"epoch": 1, "epoch_time_s": 1.5}\n'
                                   '{"epoch": 2, "epoch_time_s": 2.25}\n')
    (run / "pretraining.json").write_text('{"wall_time_s": 10.0, "ulm_wall_time_s": 9.0}')
    assert run_cpu_seconds(run) == 13.75  # a run still training: its epochs
    (run / "metrics.json").write_text('{"wall_time_s": 5.0}')
    assert run_cpu_seconds(run) == 15.0  # finished, pretrained in an earlier session: both
    (run / "metrics.json").write_text('{"wall_time_s": 14.0}')
    assert run_cpu_seconds(run) == 14.0  # one session did both: the pretraining counted once
    # the CPU time where a run recorded it (beside the wall time), else the wall time
    (run / "log.jsonl").write_text('{"epoch": 1, "epoch_time_s": 3.0, "epoch_cpu_s": 1.5}\n'
                                   '{"epoch": 2, "epoch_time_s": 2.25}\n')
    (run / "pretraining.json").write_text('{"wall_time_s": 10.0, "cpu_time_s": 4.0}')
    (run / "metrics.json").unlink()
    assert run_cpu_seconds(run) == 7.75
    (run / "metrics.json").write_text('{"wall_time_s": 20.0, "cpu_time_s": 9.0}')
    assert run_cpu_seconds(run) == 9.0
    # the scoring of its expected accuracy, a process of its own, counts too
    (run / "expected.json").write_text('{"wall_time_s": 6.0}')
    assert run_cpu_seconds(run) == 15.0
    (run / "expected.json").write_text('{"wall_time_s": 6.0, "cpu_time_s": 5.0}')
    assert run_cpu_seconds(run) == 14.0


def test_a_planned_single_run_is_projected_from_another_data_sets_run(tmp_path):
    """``--plan-run DATA:RUN``: RUN's epochs' CPU time scaled by the training and validation
    frames, the rest of its training as it is, its expected accuracy's by the test frames over
    those it scored; left out once a run of the model on DATA is among --run; a bad plan is a
    usage error."""
    from linmem.cli.commands import main
    from linmem.data import DATASETS
    from linmem.experiments.progress import planned_run_record

    run = tmp_path / "rnn-rbm" / "jsb-run"
    run.mkdir(parents=True)
    (run / "config.json").write_text('{"data": "jsb", "model": "rnn-rbm"}')
    (run / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 3000.0}\n')
    (run / "metrics.json").write_text('{"wall_time_s": 4000.0, "cpu_time_s": 3600.0}')
    (run / "expected.json").write_text(json.dumps(
        {"test": {"frames": 4648, "acc_expected": 27.3}, "valid": {"frames": 4526},
         "cpu_time_s": 200.0}))  # expected accuracy on the test split only
    jsb, muse = DATASETS["jsb"].n_frames, DATASETS["musedata"].n_frames
    record = planned_run_record("MuseData", run)
    # 3000 s of epochs scale, the 600 s of final scoring (a fixed AIS sample) do not
    per = 3000.0 * (muse[0] + muse[1]) / (jsb[0] + jsb[1]) + 600.0 + 200.0 * muse[2] / 4648
    assert record["left_cpu_s"] == pytest.approx(per) and per > 10 * 3600
    assert (record["dataset"], record["model"], record["todo"]) == ("musedata", "rnn-rbm", 1)
    with pytest.raises(ValueError, match="no run there"):
        planned_run_record("musedata", tmp_path)

    config = _config(tmp_path, tmp_path)
    storage = default_storage(config.out_dir)
    make_storage(storage)
    out = tmp_path / "progress.md"
    plan = ["--plan-run", f"musedata:{run}", "--plan-run", f"jsb:{run}"]
    main(["progress", "--storage", storage, "--run", str(tmp_path / "rnn-rbm"), *plan,
          "--out", str(out)])
    text = out.read_text()
    assert (f"| musedata-rnn-rbm (planned run, from {run}) | 0 / 1 | 0 | 0 | 0.00 | "
            f"{per / 3600:.2f} (another data set's run, scaled) | {per / 3600:.2f} |") in text
    assert "jsb-rnn-rbm (planned" not in text  # made: it is among --run
    assert f"projected CPU hours left for the studies above: **{per / 3600:.1f}**" in text
    assert f"CPU hours logged: **{3800 / 3600:.1f}**" in text  # training and scoring
    with pytest.raises(SystemExit) as exit_:
        main(["progress", "--storage", storage, "--plan-run", f"mnist:{run}"])
    assert exit_.value.code == 2


def test_run_cpu_seconds_counts_a_killed_ulm_stage_for_the_run_that_trained_it(tmp_path):
    from linmem.experiments.run_costs import run_cpu_seconds

    run, ulm = tmp_path / "run", tmp_path / "run" / "ulm"
    ulm.mkdir(parents=True)
    (ulm / "log.jsonl").write_text('{"epoch": 1, "epoch_time_s": 3.0, "epoch_cpu_s": 2.5}\n')
    assert run_cpu_seconds(run) == 2.5  # the ULM stage in flight
    (ulm / "metrics.json").write_text('{"wall_time_s": 30.0, "cpu_time_s": 12.0}')
    # an earlier record (no ulm_cpu fields), its own ULM: the part beyond the recipe's clock
    (run / "pretraining.json").write_text('{"cpu_time_s": 4.0}')
    assert run_cpu_seconds(run) == 12.0
    (run / "pretraining.json").write_text('{"cpu_time_s": 13.0, "ulm_run": "x/run/ulm"}')
    assert run_cpu_seconds(run) == 13.0  # one process trained it: counted once
    (run / "pretraining.json").write_text(
        '{"cpu_time_s": 4.0, "ulm_run": "cache/jsb-h6-selu-s0-0123456789ab"}')
    assert run_cpu_seconds(run) == 4.0  # read from a cache entry another run trained
    # recorded: the ULM's whole CPU time less the part inside the recipe's clock
    (run / "pretraining.json").write_text(
        '{"cpu_time_s": 4.0, "ulm_cpu_time_s": 10.0, "ulm_cpu_here_s": 3.0}')
    assert run_cpu_seconds(run) == 11.0
    (run / "log.jsonl").write_text('{"epoch": 1, "epoch_time_s": 2.0, "epoch_cpu_s": 1.0}\n')
    (run / "metrics.json").write_text('{"wall_time_s": 6.0, "cpu_time_s": 5.5}')
    assert run_cpu_seconds(run) == 12.5  # the recipe inside the training's clock: 7 + 5.5
    # failed by diverging in its first epoch (no log): the recipe and that attempt's clock
    (run / "metrics.json").unlink()
    (run / "log.jsonl").unlink()
    (run / "diverged.json").write_text('{"wall_time_s": 2.0, "cpu_time_s": 1.5}')
    assert run_cpu_seconds(run) == 7.0 + 4.0 + 1.5  # pretrained in an earlier process
    (run / "diverged.json").write_text('{"wall_time_s": 20.0, "cpu_time_s": 19.0}')
    assert run_cpu_seconds(run) == 7.0 + 19.0  # the same process: inside its clock


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_point_states_count_deaths_and_errors(tmp_path, data_dir):
    config = _config(tmp_path, data_dir)
    study = open_study(config, "jsb", "lmn-b")
    a, b, c = grid_points("lmn-b", "tiny")[:3]
    for point, error in ((a, None), (b, "diverged")):
        study.enqueue_trial(point.params)
        trial = study.ask()
        trial.suggest_categorical("hidden", [4, 8])
        if error:
            trial.set_user_attr("error", error)
        study.tell(trial, state=TrialState.FAIL)
    for _ in range(config.max_retry + 1):  # c's worker died more often than max_retry
        study.enqueue_trial(c.params)
        study.tell(study.ask(), state=TrialState.FAIL)
    states = point_states(study, grid_points("lmn-b", "tiny"), config.max_retry)
    assert states[a] == "todo" and states[b] == "failed" and states[c] == "failed"
    # one more try allowed: c is to run again; an error is final whatever the count
    states = point_states(study, grid_points("lmn-b", "tiny"), config.max_retry + 1)
    assert states[c] == "todo" and states[b] == "failed"
    assert config.max_retry == MAX_RETRY == 10  # a session's end kills: several tries by default
    # --retry-failed: a point an error failed is to do once more; its second error fails it
    states = point_states(study, grid_points("lmn-b", "tiny"), config.max_retry, True)
    assert states[b] == "todo" and states[a] == "todo" and states[c] == "failed"
    study.enqueue_trial(b.params)
    trial = study.ask()
    trial.set_user_attr("error", "diverged again")
    study.tell(trial, state=TrialState.FAIL)
    assert point_states(study, grid_points("lmn-b", "tiny"), config.max_retry, True)[b] == "failed"
    # `linmem progress --max-retry` counts the same way (b: failed by its error, c: by deaths)
    from linmem.cli.commands import main

    storage, out = default_storage(config.out_dir), tmp_path / "progress.md"
    for retries, failed in ((None, 2), (MAX_RETRY + 1, 1)):
        main(["progress", "--storage", storage, "--grid", "tiny", "--runs-root", str(tmp_path),
              "--out", str(out), *(["--max-retry", str(retries)] if retries else [])])
        assert f"| jsb-lmn-b-tiny | 0 / 4 | {failed} | 0 |" in out.read_text()


def _run_in_flight(run, config: TrainConfig, best: list[bool], seconds: float = 10.0) -> None:
    """A run directory as ``linmem train`` leaves it in flight: its config and one log row per
    epoch, ``best`` saying which improved, each epoch ``seconds`` of CPU time."""
    from dataclasses import asdict

    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps(asdict(config)))
    (run / "log.jsonl").write_text("".join(
        json.dumps({"epoch": e, "epoch_cpu_s": seconds, "epoch_time_s": 3 * seconds,
                    "best": b}) + "\n" for e, b in enumerate(best, 1)))


def test_a_running_point_is_projected_at_least_to_its_early_stopping(tmp_path):
    """A run in flight still has at the least the epochs its early stopping holds it to:
    ``patience`` after its best so far (early stopping ends a run once ``bad_epochs`` reaches
    ``patience``), at most to its epoch limit, each at its logged epochs' mean CPU time.
    Nottingham's GRU of 750 units was projected at 0.33 CPU h a point from its 250-unit point
    while it ran at 155 s an epoch with its best epoch the last."""
    from linmem.experiments.run_costs import epochs_due_cpu_seconds

    config = TrainConfig(epochs=100, patience=5)
    run = tmp_path / "run"
    _run_in_flight(run, config, [True, False, True, True, False, True, False, False], 10.0)
    assert epochs_due_cpu_seconds(run) == pytest.approx((5 - 2) * 10.0)  # best 6, last 8
    near_end = tmp_path / "near_end"
    _run_in_flight(near_end, replace(config, epochs=9), [True] * 6 + [False] * 2, 10.0)
    assert epochs_due_cpu_seconds(near_end) == pytest.approx(10.0)  # the limit: one epoch
    (run / "metrics.json").write_text("{}")  # ended: nothing due
    assert epochs_due_cpu_seconds(run) == 0.0
    assert epochs_due_cpu_seconds(tmp_path / "nowhere") == 0.0
    record = {"dataset": "muse", "model": "lstm", "grid": "reduced", "finished_cpu_s": [30.0],
              "running_cpu_s": [20.0, 90.0], "todo": 0}
    plain = project_points([dict(record)])[0]  # 30 each: 10 left of the first, none of the other
    assert plain["left_cpu_s"] == pytest.approx(10.0)
    held = project_points([{**record, "running_due_cpu_s": [5.0, 40.0]}])[0]
    assert held["left_cpu_s"] == pytest.approx(10.0 + 40.0)  # max(30, 20 + 5), max(30, 90 + 40)
    assert held["dearest_point_cpu_s"] == pytest.approx(130.0)


def test_a_study_of_one_size_is_scaled_at_its_models_epoch_slope(tmp_path):
    """Nottingham's pret-RNN had finished one point of 250 units: its 750-unit points were
    projected in proportion to their parameters (slope 1), while an epoch of the model's
    750-unit runs costs 9.3 times a 250-unit one for 6.5 times the parameters (Piano-midi.de:
    11.7 s against 1.26). The slope of log epoch time on log parameters comes from the model's
    studies of several sizes (each against its own mean; its grid first) and scales a study of
    one size; a study of several sizes keeps its own fit of whole runs."""
    from linmem.experiments.projection import epoch_slope
    from linmem.experiments.run_costs import mean_epoch_cpu_seconds
    from linmem.experiments.search import size_cost

    run = tmp_path / "run"
    _run_in_flight(run, TrainConfig(), [True, False, True], 10.0)
    with (run / "log.jsonl").open("a") as log:  # a row from before CPU time was logged: wall
        log.write(json.dumps({"epoch": 4, "epoch_time_s": 50.0, "best": False}) + "\n")
    assert mean_epoch_cpu_seconds(run) == pytest.approx((3 * 10.0 + 50.0) / 4)
    assert mean_epoch_cpu_seconds(tmp_path / "nowhere") is None

    one = size_cost([100, 100], [10.0, 30.0], slope=1.5)  # 20 at 100: 20 * 4 ** 1.5 at 400
    assert one(400) == pytest.approx(160.0)
    assert size_cost([100, 400], [10.0, 20.0], slope=1.5)(1600) == pytest.approx(
        size_cost([100, 400], [10.0, 20.0])(1600))  # two sizes: their own fit

    def study(data, grid, params, epochs, running=((), ())):
        return {"dataset": data, "model": "pret-rnn", "grid": grid, "finished_cpu_s":
                [100.0 * t for t in epochs], "finished_params": list(params),
                "finished_epoch_cpu_s": list(epochs), "running_cpu_s": [50.0] * len(running[0]),
                "running_params": list(running[0]), "running_epoch_cpu_s": list(running[1]),
                "todo": 0, "todo_params": []}

    piano = study("piano", "long", [100, 400, 400], [1.0, 8.0, 8.0])  # slope 1.5
    muse = study("muse", "long", [100], [20.0], running=([400], [None]))  # no epoch yet: none
    jsb = study("jsb", "short", [100, 400], [1.0, 2.0])  # slope 0.5: another grid
    assert epoch_slope([piano, muse, jsb], "pret-rnn", "long") == pytest.approx(1.5)
    assert epoch_slope([muse, jsb], "pret-rnn", "long") == pytest.approx(0.5)  # any grid
    assert epoch_slope([muse], "pret-rnn", "long") is None
    assert epoch_slope([piano], "rnn", "long") is None  # another model's
    # a data set of longer sequences costs more at every size: not a larger model's slope
    notts = study("notts", "long", [400], [80.0], running=([100], [10.0]))
    assert epoch_slope([piano, notts], "pret-rnn", "long") == pytest.approx(1.5)

    left = {**study("notts", "long", [100], [4.0]), "todo": 1, "todo_params": [400]}
    alone = project_points([dict(left)])[0]  # 400 s at 100: in proportion at 400
    assert alone["left_cpu_s"] == pytest.approx(1600.0)
    scaled = next(r for r in project_points([dict(left), piano]) if r["dataset"] == "notts")
    assert scaled["left_from"] == "study, by size"
    assert scaled["left_cpu_s"] == pytest.approx(400.0 * 4 ** 1.5)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
@pytest.mark.parametrize(("protocol", "pruner", "held"), [
    ("paper", None, True), ("linmem", None, False), ("linmem", "none", True),
    ("paper", "median", False)])
def test_progress_holds_a_running_point_to_its_early_stopping_without_a_pruner(
        tmp_path, data_dir, protocol, pruner, held):
    """Under ``paper`` (no pruner) a running point's due epochs count; under ``linmem`` the
    median pruner may end it sooner, so they do not; a trial that says which pruner it ran
    under (``linmem search --pruner``) is held by that one."""
    config = _config(tmp_path, data_dir, models=["rnn"])
    config = replace(config, base=TrainConfig(epochs=2, protocol=protocol, data_dir=str(data_dir)),
                     pruner=None)
    study = open_study(config, "jsb", "rnn")
    point = grid_points("rnn", "tiny")[0]
    run = tmp_path / "runs" / study.study_name / point.name
    _run_in_flight(run, TrainConfig.from_dict({**study.user_attrs["train"], "data": "jsb",
                                                "model": "rnn", "epochs": 1000}),
                   [True] * 3 + [False] * 10, 7.0)
    study.enqueue_trial(point.params)
    trial = study.ask()
    trial.suggest_categorical("hidden", [point.hidden])
    trial.set_user_attr("run_dir", str(run.relative_to(tmp_path)))
    if pruner is not None:
        trial.set_user_attr("pruner", pruner)
    (record,) = progress_records(default_storage(config.out_dir), "tiny", runs_root=tmp_path,
                                 protocol=protocol)
    assert record["states"] == {"running": 1, "todo": len(grid_points("rnn", "tiny")) - 1}
    assert record["running_cpu_s"] == [pytest.approx(13 * 7.0)]
    assert record["running_due_cpu_s"] == [pytest.approx((50 - 10) * 7.0 if held else 0.0)]
    assert record["running_epoch_cpu_s"] == [pytest.approx(7.0)]  # its epochs' mean
    assert record["finished_epoch_cpu_s"] == []


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_a_point_that_diverged_in_its_first_epoch_is_no_cost_sample(tmp_path, data_dir):
    """Piano-midi.de's LMN-A (250, 250) diverged in its first epoch in 1 s: its study's points
    left had been projected at 1 s each (0.00 CPU h) instead of from other data sets."""
    config = _config(tmp_path, data_dir)
    run_worker(config, command="test", log=lambda _: None)  # lmn-b: the data set's mean
    storage = default_storage(config.out_dir)
    logged = progress_records(storage, "tiny")[0]["cpu_s"]
    study = open_study(replace(config, models=["rnn"]), "jsb", "rnn")
    first, second = grid_points("rnn", "tiny")[:2]
    for point, rows in ((first, ""), (second, '{"epoch": 1, "epoch_cpu_s": 40.0}\n')):
        run = tmp_path / "runs" / study.study_name / point.name
        run.mkdir(parents=True)
        (run / "diverged.json").write_text(f'{{"cpu_time_s": {42.0 if rows else 2.0}}}')
        if rows:  # diverged later: its epochs logged (inside its end's clock)
            (run / "log.jsonl").write_text(rows)
        study.enqueue_trial(point.params)
        trial = study.ask()
        trial.suggest_categorical("hidden", [point.hidden])
        trial.set_user_attr("run_dir", str(run.relative_to(tmp_path)))
        trial.set_user_attr("error", "diverged")
        study.tell(trial, state=TrialState.FAIL)
        rnn = next(r for r in progress_records(storage, "tiny", runs_root=tmp_path)
                   if r["model"] == "rnn")
        if not rows:  # its 2 s counted, not made a sample: the data set's mean per point
            assert rnn["states"] == {"failed": 1, "todo": 3} and rnn["cpu_s"] == 2.0
            assert rnn["finished_cpu_s"] == [] and rnn["left_from"] == "data set"
            assert rnn["left_cpu_s"] == pytest.approx(3 * logged / 4)
    # the one that logged an epoch is a sample
    assert rnn["cpu_s"] == 2.0 + 42.0 and rnn["finished_cpu_s"] == [42.0]
    per_param = 42.0 / rnn["finished_params"][0]  # one size: the cost linear in the parameters
    assert rnn["left_from"] == "study, by size" and len(rnn["todo_params"]) == 2
    assert rnn["left_cpu_s"] == pytest.approx(per_param * sum(rnn["todo_params"]))


def _finished_elsewhere(study, point, seconds: float) -> None:
    """``point`` of a tiny RNN grid complete in ``study`` as an imported trial (no run here)
    that took ``seconds``."""
    study.enqueue_trial(point.params)
    trial = study.ask()
    trial.suggest_categorical("hidden", [4, 8])
    trial.set_user_attr("wall_time_s", seconds)
    study.tell(trial, 30.0)


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_stop_by_starts_only_the_points_projected_to_end_in_time(tmp_path, data_dir):
    """``stop_by``: a point's projected time is its study's finished points' stored time scaled
    to its own parameters (one size finished: in proportion); a worker starts no point that
    would end too late, says which it left, and leaves; a study with nothing finished has
    nothing to project from: its points are run, unless the deadline has passed."""
    from linmem.training.evaluation import check_size

    config = _config(tmp_path, data_dir, models=["rnn", "gru"])
    study = open_study(config, "jsb", "rnn")
    points = grid_points("rnn", "tiny")
    assert point_seconds(config, study, "rnn", points) == dict.fromkeys(points)
    done = points[0]  # 4 units, finished elsewhere in 1e6 s (stored), as an imported trial
    _finished_elsewhere(study, done, 1e6)
    n = {p: check_size(replace(config.base, model="rnn", hidden=p.hidden)) for p in points}
    assert n[points[2]] > n[done]  # 8 units against 4
    projected = point_seconds(config, study, "rnn", points)
    assert projected == {p: pytest.approx(1e6 * n[p] / n[done]) for p in points}
    # a deadline already past: nothing starts, not even the points with no projection
    counts = run_worker(replace(config, stop_by=time.time() - 1), command="test",
                        log=lambda _: None)
    assert counts == {"jsb-rnn-tiny": {"done": 1, "todo": 3}, "jsb-gru-tiny": {"todo": 4}}
    lines: list[str] = []
    counts = run_worker(replace(config, stop_by=time.time() + 1000), command="test",
                        log=lines.append)
    assert counts == {"jsb-rnn-tiny": {"done": 1, "todo": 3}, "jsb-gru-tiny": {"done": 4}}
    assert sum("projected" in line for line in lines) == 1
    assert lines[-1].startswith("[jsb-rnn-tiny] 3 point(s) left, none projected to end by ")
    assert lines[-1].endswith(": not started")
    # a deadline the points fit (the largest projected at 1.93e6 s) runs them
    counts = run_worker(replace(config, stop_by=time.time() + 3e6), command="test",
                        log=lambda _: None)
    assert counts == {"jsb-rnn-tiny": {"done": 4}, "jsb-gru-tiny": {"done": 4}}


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_stop_by_starts_a_study_with_nothing_finished_at_its_smallest_point(tmp_path, data_dir):
    """With a deadline and nothing finished to project from, the next point is one of the
    fewest parameters (4 units, at either decay), never an 8-unit one; without a deadline, or
    once a point has finished, any point can be drawn."""
    from linmem.experiments.search import next_point

    config = _config(tmp_path, data_dir, models=["rnn"])
    deadline = replace(config, stop_by=time.time() + 1e9)
    study = open_study(config, "jsb", "rnn")
    points = grid_points("rnn", "tiny")  # 4 units at two decays, then 8
    small = {p for p in points if p.hidden == 4}
    assert len(small) == 2

    def drawn(cfg, todo):
        rng = np.random.default_rng(0)
        return {next_point(cfg, study, "rnn", todo, rng) for _ in range(40)}

    assert drawn(deadline, points) == small
    assert drawn(deadline, points[2:]) == set(points[2:])  # only 8-unit points left
    assert drawn(config, points) == set(points)
    _finished_elsewhere(study, points[0], 10.0)  # a projection now exists: every point drawn
    assert drawn(deadline, points[1:]) == set(points[1:])


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_stop_by_scales_one_finished_size_at_its_runs_epoch_slope(tmp_path, data_dir):
    """With the finished points all of one size, ``stop_by``'s projection of another size
    takes the slope of log epoch CPU time on log parameters that the study's runs here show
    (a finished and a killed run of two sizes), not the parameters' proportion."""
    from linmem.experiments.search import point_run_dir, size_slope
    from linmem.training.evaluation import check_size

    assert size_slope([[(100, 1.0), (400, 8.0), (400, None)]]) == pytest.approx(1.5)
    assert size_slope([[(100, 1.0), (400, 8.0)], [(100, 50.0), (100, 70.0)]]) == pytest.approx(
        1.5)  # a group of one size (another data set) adds nothing
    assert size_slope([[(100, 1.0)], [(400, 8.0)]]) is None  # no group has two sizes

    config = _config(tmp_path, data_dir, models=["rnn"])
    study = open_study(config, "jsb", "rnn")
    points = grid_points("rnn", "tiny")  # 4 units at two decays, then 8
    done, big = points[0], points[2]
    _finished_elsewhere(study, done, 1e6)
    n = {p: check_size(replace(config.base, model="rnn", hidden=p.hidden)) for p in points}
    assert point_seconds(config, study, "rnn", [big])[big] == pytest.approx(1e6 * n[big] / n[done])
    ratio = n[big] / n[done]
    for p, epoch_s in ((done, 2.0), (big, 2.0 * ratio ** 1.7)):  # the runs' epochs: slope 1.7
        _run_in_flight(point_run_dir(config, study, p), config.base, [True, False], epoch_s)
    assert point_seconds(config, study, "rnn", [big])[big] == pytest.approx(1e6 * ratio ** 1.7)


def test_stop_by_counts_what_a_killed_points_run_has_logged(tmp_path, data_dir):
    """A point whose run a killed worker left resumes from its last epoch: with a deadline it
    starts if what is left of its projection (less its run's logged CPU time) fits, where the
    whole projection would not (a long point then spans sessions on a machine that is kept)."""
    from linmem.experiments.search import _late, point_run_dir

    config = _config(tmp_path, data_dir, models=["rnn"])
    study = open_study(config, "jsb", "rnn")
    points = grid_points("rnn", "tiny")  # 4 units at two decays, then 8
    study.enqueue_trial(points[0].params)
    trial = study.ask()
    trial.suggest_categorical("hidden", [4, 8])
    trial.set_user_attr("wall_time_s", 1e6)  # so each 4-unit point is projected at 1e6 s
    study.tell(trial, 30.0)
    run = point_run_dir(config, study, points[1])
    assert run == tmp_path / "runs" / "jsb-rnn-tiny" / points[1].name
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text("".join(
        json.dumps({"epoch": e, "epoch_cpu_s": 3e5, "epoch_time_s": 3.1e5}) + "\n"
        for e in (1, 2, 3)))  # 9e5 of its 1e6 s done
    deadline = replace(config, stop_by=time.time() + 2e5)
    assert _late(deadline, study, "rnn", points[1:]) == {points[2], points[3]}
    assert _late(replace(config, stop_by=time.time() + 5e4), study, "rnn", points[1:]) == set(
        points[1:])


def test_stop_by_holds_a_killed_points_run_to_its_early_stopping_without_a_pruner(
        tmp_path, data_dir):
    """What is left of a resumed point is not less than the epochs its early stopping still
    holds it to, where no pruner may end it sooner: 9e5 of its 1e6 s logged, but its best epoch
    its last, so 5 more epochs of 3e5 s; with the median pruner the projection alone counts."""
    from linmem.experiments.search import _late, point_run_dir

    config = _config(tmp_path, data_dir, models=["rnn"], pruner="none")
    study = open_study(config, "jsb", "rnn")
    points = grid_points("rnn", "tiny")
    study.enqueue_trial(points[0].params)
    trial = study.ask()
    trial.suggest_categorical("hidden", [4, 8])
    trial.set_user_attr("wall_time_s", 1e6)
    study.tell(trial, 30.0)
    run = point_run_dir(config, study, points[1])
    _run_in_flight(run, replace(config.base, model="rnn", hidden=4, patience=5, epochs=100),
                   [True, True, True], 3e5)
    soon, later = time.time() + 2e5, time.time() + 2e6
    assert points[1] in _late(replace(config, stop_by=soon), study, "rnn", points[1:2])
    assert not _late(replace(config, stop_by=later), study, "rnn", points[1:2])  # 1.5e6 fits
    median = replace(config, pruner="median", stop_by=soon)
    assert not _late(median, study, "rnn", points[1:2])  # 1e6 - 9e5 fits


def test_search_cli_passes_max_retry_and_wait(tmp_path, data_dir, monkeypatch, capsys):
    import linmem.experiments.search
    from linmem.cli.commands import main

    seen = []
    monkeypatch.setattr(linmem.experiments.search, "run_search",
                        lambda config, jobs, command, **kw: seen.append(config) or {})
    for extra, expected, wait in (([], MAX_RETRY, True), (["--max-retry", "0"], 0, True),
                                  (["--no-wait"], MAX_RETRY, False)):
        main(["search", "--grid", "tiny", "--out", str(tmp_path), "--data-dir", str(data_dir),
              *extra])
        config = seen.pop()
        assert (config.max_retry, config.wait, config.stop_by) == (expected, wait, None)
    from datetime import datetime

    for when, at in (("2h30m", time.time() + 9000), ("45s", time.time() + 45),
                     ("2026-11-25T07:10", datetime(2026, 11, 25, 7, 10).timestamp())):
        main(["search", "--grid", "tiny", "--out", str(tmp_path), "--data-dir", str(data_dir),
              "--stop-by", when])
        assert seen.pop().stop_by == pytest.approx(at, abs=5)
    for bad in ("tomorrow", "", "2h30"):
        with pytest.raises(SystemExit) as exit_:
            main(["search", "--grid", "tiny", "--out", str(tmp_path), "--stop-by", bad])
        assert exit_.value.code == 2 and not seen
    for command in ("search", "progress"):  # the help names the default it falls back to
        main([command, "--help"])
        assert f"[default: {MAX_RETRY}]" in " ".join(capsys.readouterr().out.split())


# ---------------------------------------------------------------- killed worker, both storages


@pytest.fixture(scope="module")
def postgres_url():
    """A throwaway PostgreSQL server on loopback from ``.ci/postgres`` (which installs the server
    when it is missing), or $LINMEM_TEST_POSTGRES, a running server's URL."""
    if os.environ.get("LINMEM_TEST_POSTGRES"):
        yield os.environ["LINMEM_TEST_POSTGRES"]
        return
    script = str(Path(__file__).resolve().parents[1] / ".ci" / "postgres")
    folder = tempfile.mkdtemp(prefix="linmem-pg-")
    started = subprocess.run([script, "start", folder], capture_output=True, text=True)
    if started.returncode != 0:
        subprocess.run([script, "stop", folder], capture_output=True)
        pytest.fail(f"could not start PostgreSQL with .ci/postgres ({started.stderr.strip()}); "
                    "install it (apt-get install postgresql) or set LINMEM_TEST_POSTGRES to a "
                    "server URL")
    try:
        yield started.stdout.strip()
    finally:
        subprocess.run([script, "stop", folder], capture_output=True)


WORKER_STUDY = "jsb-lmn-b-tiny+patience=120"  # _worker's study: its patience departs from linmem's


def _worker(storage: str, out: Path, data_dir: Path) -> subprocess.Popen:
    # the paper's memory named (the default's bound would name the study too)
    cmd = [sys.executable, "-m", "linmem", "search", "--protocol", "linmem", "--data", "jsb",
           "--model", "lmn-b", "--memory-bound", "none",
           "--grid", "tiny", "--subset", "6", "--epochs", "120", "--patience", "120",
           "--pruner", "none", "--storage", storage, "--out", str(out), "--heartbeat", "1",
           "--grace", "3", "--poll", "0.3", "--data-dir", str(data_dir), "--quiet"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _running_trial_of(storage: str, pid: int, out: Path):
    try:
        study = optuna.load_study(study_name=WORKER_STUDY, storage=storage)
    except KeyError:  # not created yet
        return None
    for t in study.get_trials(states=(TrialState.RUNNING,)):
        if t.user_attrs.get("worker", "").endswith(f":{pid}"):
            log = Path(t.user_attrs["run_dir"]) / "log.jsonl"
            if log.is_file() and len(log.read_text().splitlines()) >= 3:
                return t
    return None


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_killed_worker_trial_is_retried_and_every_point_completes_once(
        backend, tmp_path, data_dir, request):
    storage = (default_storage(tmp_path / "runs") if backend == "sqlite"
               else request.getfixturevalue("postgres_url"))
    if backend == "postgresql":  # a reused server: start from no study
        try:
            optuna.delete_study(study_name=WORKER_STUDY, storage=storage)
        except KeyError:
            pass
    out = tmp_path / "runs"
    out.mkdir()
    victim = _worker(storage, out, data_dir)
    time.sleep(1.0)
    survivor = _worker(storage, out, data_dir)
    killed = None
    deadline = time.monotonic() + 120
    while killed is None and time.monotonic() < deadline and victim.poll() is None:
        killed = _running_trial_of(storage, victim.pid, out)
        time.sleep(0.05)
    assert killed is not None, "the first worker never ran a trial past its third epoch"
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    output = survivor.communicate(timeout=300)[0].decode()
    assert survivor.returncode == 0, output

    study = optuna.load_study(study_name=WORKER_STUDY, storage=storage)
    points = grid_points("lmn-b", "tiny")
    assert _complete_once(study, points), [(t.number, t.state, trial_point(t))
                                           for t in study.get_trials()]
    dead = study.get_trials()[killed.number]
    assert dead.state == TrialState.FAIL  # failed by the survivor once its heartbeat stopped
    retry = [t for t in study.get_trials() if t.system_attrs.get("failed_trial") == killed.number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert trial_point(retry[0]) == trial_point(dead)
    # the retry resumed the dead worker's run: every epoch is in the log exactly once, and the
    # retry reported only the epochs after the last one the dead worker finished
    run = Path(retry[0].user_attrs["run_dir"])
    epochs = [json.loads(line)["epoch"] for line in (run / "log.jsonl").read_text().splitlines()]
    assert epochs == list(range(1, 121))
    assert min(retry[0].intermediate_values) > 3
    assert all(s == "done" for s in point_states(study, points).values())


def test_storage_and_grids_are_usable_objects(tmp_path):
    storage = make_storage(default_storage(tmp_path), heartbeat_interval=5)
    assert storage.get_heartbeat_interval() == 5
    assert set(GRIDS) >= {"paper", "quick", "tiny"}


def test_search_of_a_nade_model_selects_on_validation_nll(tmp_path, data_dir):
    """--select nll: each trial's objective is minus its validation NLL (exact for a NADE), the
    selected point is the lowest NLL, and no marginals are drawn at the epochs."""
    config = _config(tmp_path, data_dir, models=["lstm-nade"], epochs=2)
    config.base = TrainConfig(**{**config.base.__dict__, "select": "nll", "nade_hidden": 5,
                                 "nade_samples": 4})
    lines: list[str] = []
    assert run_worker(config, command="test", log=lines.append) == {
        "jsb-lstm-nade-tiny+select=nll": {"done": 4}}  # a departure from linmem's protocol
    assert any(", valid nll " in line for line in lines), lines  # not "valid acc -8.1%"
    storage = default_storage(config.out_dir)
    study = optuna.load_study(study_name="jsb-lstm-nade-tiny+select=nll", storage=storage)
    for t in study.get_trials():
        metrics = json.loads((Path(t.user_attrs["run_dir"]) / "metrics.json").read_text())
        assert t.value == pytest.approx(-metrics["valid_nll"])
        assert metrics["selected_on"] == "valid nll" and "test_acc_expected" in metrics
        log = (Path(t.user_attrs["run_dir"]) / "log.jsonl").read_text().splitlines()
        assert all(json.loads(row)["valid_acc"] is None for row in log)
    record = search_records(storage, "tiny")[0]
    nlls = [t["valid_nll"] for t in record["trials_run"]]
    assert record["selected_on"] == "valid nll" and record["valid_nll"] == min(nlls)
    assert record["test_acc_expected"] is not None


def test_export_and_import_move_a_search_between_machines(tmp_path, data_dir):
    """The finished trials go through a text journal into a fresh storage; there, with the runs
    gone, the report's records are the same, the search runs nothing again, a second import adds
    nothing, the CPU time is the trials' own, and a point whose trial was still running is run
    again."""
    import shutil

    from linmem.cli.commands import main
    from linmem.experiments.studies import export_studies, import_studies

    config = _config(tmp_path, data_dir, models=["lmn-b"])
    run_worker(config, command="test", log=lambda _: None)
    storage = default_storage(config.out_dir)
    rnn = open_study(replace(config, models=["rnn"]), "jsb", "rnn")
    point = grid_points("rnn", "tiny")[0]
    rnn.enqueue_trial(point.params)
    with pytest.warns(UserWarning, match="Heartbeat"):  # (Optuna: ask() outside optimize())
        running = rnn.ask()  # a trial in flight on the first machine: not exported
    assert trial_point(rnn.get_trials()[0]) == point
    before = search_records(storage, "tiny")
    export = tmp_path / "export" / "studies.jsonl"
    assert export_studies(storage, export) == {"jsb-lmn-b-tiny": 4, "jsb-rnn-tiny": 0}
    assert all(isinstance(json.loads(line), dict) for line in export.read_text().splitlines())
    again = tmp_path / "again.jsonl"  # the same trials give the same text (a file to commit)
    export_studies(storage, again)
    assert again.read_bytes() == export.read_bytes()
    rnn.tell(running, state=TrialState.FAIL)  # its worker died: a finished trial, exported
    assert export_studies(storage, export) == {"jsb-lmn-b-tiny": 4, "jsb-rnn-tiny": 1}
    for run in (tmp_path / "runs").glob("jsb-*"):  # the runs stay on the first machine
        shutil.rmtree(run)

    elsewhere = tmp_path / "elsewhere"
    storage2 = default_storage(elsewhere / "runs")
    assert import_studies(export, make_storage(storage2)) == {"jsb-lmn-b-tiny": 4,
                                                              "jsb-rnn-tiny": 1}
    assert import_studies(export, make_storage(storage2)) == {"jsb-lmn-b-tiny": 0,
                                                              "jsb-rnn-tiny": 0}
    back = tmp_path / "back.jsonl"  # exported from where it was imported: the same text
    export_studies(storage2, back)
    assert back.read_bytes() == export.read_bytes()
    after = search_records(storage2, "tiny", runs_root=elsewhere)
    for a, b in zip(before, after, strict=True):
        assert a["trials_run"] == b["trials_run"] or a["model"] == "rnn"
        for key in ("study", "hidden", "memory", "weight_decay", "valid_acc", "test_acc",
                    "test_nll", "frame_selection", "command", "search_wall_time_s"):
            assert a.get(key) == b.get(key), key
    # CPU time: the trials' stored CPU times and CPUs, their runs being on the first machine
    progress = {r["model"]: r for r in progress_records(storage2, "tiny", runs_root=elsewhere)}
    moved_study = optuna.load_study(study_name="jsb-lmn-b-tiny", storage=storage2)
    stored = sum(t.user_attrs["cpu_time_s"] for t in moved_study.get_trials())
    assert progress["lmn-b"]["cpu_s"] == pytest.approx(stored) and stored > 0
    assert progress["lmn-b"]["points_from_trials"] == 4
    assert {t.user_attrs["machine"]["cpu"] for t in moved_study.get_trials()} == \
        {machine()["cpu"]}
    assert progress["lmn-b"]["cpu_s_by_machine"] == {machine()["cpu"]: pytest.approx(stored)}
    out = tmp_path / "progress.md"
    main(["progress", "--storage", storage2, "--grid", "tiny", "--runs-root", str(elsewhere),
          "--out", str(out)])
    assert "| jsb-lmn-b-tiny (4 points: trial's stored time) | 4 / 4 |" in out.read_text()
    # the search goes on from the import: the finished points are not run again, every point
    # of the other study is (the one in flight included)
    moved = replace(config, models=["lmn-b", "rnn"], out_dir=str(elsewhere / "runs"))
    assert run_worker(moved, command="test", log=lambda _: None) == {
        "jsb-lmn-b-tiny": {"done": 4}, "jsb-rnn-tiny": {"done": 4}}
    assert not (elsewhere / "runs" / "jsb-lmn-b-tiny").exists()
    assert len(moved_study.get_trials()) == 4
    assert (elsewhere / "runs" / "jsb-rnn-tiny" / point.name / "metrics.json").is_file()
    moved_rnn = optuna.load_study(study_name="jsb-rnn-tiny", storage=storage2)
    assert sorted(t.state.name for t in moved_rnn.get_trials()) == ["COMPLETE"] * 4 + ["FAIL"]

    # the command line, and a file that is not an export
    export2 = tmp_path / "cli.jsonl"
    main(["search-export", str(export2), "--storage", storage2, "--grid", "tiny"])
    storage3 = default_storage(tmp_path / "third")
    main(["search-import", str(export2), "--storage", storage3])
    assert [r["points_done"] for r in search_records(storage3, "tiny")] == [4, 4]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"op_code": 0, "worker_id": "x"\n')
    with pytest.raises(SystemExit) as exc:
        main(["search-import", str(bad), "--storage", storage3])
    assert exc.value.code == 2


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # ask()/tell() outside optimize()
def test_export_gives_a_killed_trial_the_time_its_run_logged(tmp_path, data_dir):
    """A trial failed with its worker stored no time; its duration lasts until a worker found it
    dead. Exported with --runs-root, it carries its run's logged CPU time and this machine's CPU,
    which the other machine's progress counts; without, it has neither."""
    from linmem.cli.commands import main
    from linmem.experiments.studies import import_studies

    config = _config(tmp_path, data_dir)
    storage = default_storage(config.out_dir)
    study = open_study(config, "jsb", "lmn-b")
    point = grid_points("lmn-b", "tiny")[0]
    study.enqueue_trial(point.params)
    trial = study.ask()
    trial.set_user_attr("run_dir", f"runs/{study.study_name}/{point.name}")
    run = tmp_path / "runs" / study.study_name / point.name  # killed after two epochs
    run.mkdir(parents=True)
    (run / "log.jsonl").write_text('{"epoch": 1, "epoch_cpu_s": 120.0, "epoch_time_s": 130.0}\n'
                                   '{"epoch": 2, "epoch_cpu_s": 80.0, "epoch_time_s": 90.0}\n')
    time.sleep(0.2)  # its duration: not its run's time
    study.tell(trial, state=TrialState.FAIL)
    plain, timed = tmp_path / "plain.jsonl", tmp_path / "timed.jsonl"
    main(["search-export", str(plain), "--storage", storage])
    main(["search-export", str(timed), "--storage", storage, "--runs-root", str(tmp_path)])
    for export, seconds, cpu in ((plain, None, None), (timed, 200.0, machine()["cpu"])):
        elsewhere = default_storage(tmp_path / export.stem)
        import_studies(export, make_storage(elsewhere))
        (moved,) = optuna.load_study(study_name=study.study_name, storage=elsewhere).get_trials()
        assert moved.state == TrialState.FAIL
        assert moved.user_attrs.get("cpu_time_s") == seconds
        assert (moved.user_attrs.get("machine") or {}).get("cpu") == cpu
        (record,) = progress_records(elsewhere, "tiny", runs_root=tmp_path / "nowhere")
        if seconds is None:  # the trial's duration
            assert 0.2 <= record["cpu_s"] < 60 and record["cpu_s_by_machine"] == {
                None: record["cpu_s"]}
        else:
            assert record["cpu_s"] == seconds and record["cpu_s_by_machine"] == {cpu: seconds}
        back = tmp_path / f"{export.stem}-back.jsonl"  # exported again from there: the same
        main(["search-export", str(back), "--storage", elsewhere])  # text, the run's time added
        assert back.read_bytes() == export.read_bytes()  # after the trial's own attributes too


def test_a_resumed_pruned_trial_is_scored_on_its_runs_every_epoch(tmp_path, data_dir):
    """A worker killed mid-run leaves a failed trial with the epochs up to then; the trial that
    resumes the run reports only the epochs after. The best validation accuracy that a pruned
    trial reached (the hidden-size figure's lower bound) is over both trials' reports."""
    config = _config(tmp_path, data_dir)
    study = open_study(config, "jsb", "lmn-b")
    point = grid_points("lmn-b", "tiny")[0]
    run_dir = f"runs/{study.study_name}/{point.name}"
    for state, reports in ((TrialState.FAIL, {1: 10.0, 2: 24.0}),  # killed after epoch 2
                           (TrialState.FAIL, {3: 30.0}),  # resumed, killed again
                           (TrialState.PRUNED, {4: 20.0, 5: 21.0})):  # resumed, then pruned
        study.enqueue_trial(point.params)
        trial = study.ask()
        trial.set_user_attr("run_dir", run_dir)
        for epoch, acc in reports.items():
            trial.report(acc, epoch)
        study.tell(trial, state=state)
    record, = search_records(default_storage(config.out_dir), "tiny")
    first, second, pruned = record["trials_run"]
    assert [t["state"] for t in record["trials_run"]] == ["fail", "fail", "pruned"]
    assert pruned["best_intermediate_valid_acc"] == 30.0  # the trial's own reports: 21.0
    # each killed trial: what its run held when it was killed, not what came after
    assert (first["best_intermediate_valid_acc"], second["best_intermediate_valid_acc"]) == (
        24.0, 30.0)
    assert pruned["epochs"] is None and record["points_done"] == 1


def test_report_of_an_imported_study_keeps_what_its_runs_held(tmp_path, data_dir):
    """A study imported from another machine, its trials older than the threshold attributes
    (dropped from the journal), its runs left there: `linmem report` into the same results
    keeps the selected run's threshold scores from the ``selected/`` copy of the last report
    (none without it); ``search_trials.json`` lists the studies by name whatever the storage's
    order."""
    import shutil

    from linmem.cli.commands import main
    from linmem.experiments.studies import export_studies

    config = _config(tmp_path, data_dir, models=["rnn", "gru"])
    run_worker(config, command="test", log=lambda _: None)
    storage, results = default_storage(config.out_dir), tmp_path / "results"
    main(["report", "--storage", storage, "--grid", "tiny", "--out", str(results)])
    first = json.loads((results / "summary.json").read_text())
    assert all(r["valid_threshold"] is not None for r in first)
    names = [t["study"] for t in json.loads((results / "search_trials.json").read_text())]
    assert names == ["jsb-gru-tiny", "jsb-rnn-tiny"]  # the storage made rnn's first
    export = tmp_path / "studies.jsonl"
    export_studies(storage, export)
    lines = [json.loads(line) for line in export.read_text().splitlines()]
    for line in lines:  # trials stored before the threshold attributes
        for key in ("valid_threshold", "test_acc_at_valid_threshold"):
            line.get("user_attrs", {}).pop(key, None)
    assert "valid_threshold" in export.read_text()
    export.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert "valid_threshold" not in export.read_text()
    shutil.rmtree(tmp_path / "runs")
    storage2 = default_storage(tmp_path / "elsewhere")
    main(["search-import", str(export), "--storage", storage2])
    main(["report", "--storage", storage2, "--grid", "tiny", "--out", str(results)])
    assert json.loads((results / "summary.json").read_text()) == first
    shutil.rmtree(results / "selected")
    main(["report", "--storage", storage2, "--grid", "tiny", "--out", str(results)])
    assert all(r["valid_threshold"] is None
               for r in json.loads((results / "summary.json").read_text()))


def test_projection_scales_a_models_cost_from_other_data_sets():
    """A study with no finished point is projected from its model's points on other data sets,
    scaled by the data sets' cost ratio over the models both have finished, those of its own
    grid first, then those of another grid; without any, from its data set's mean; a study's
    own finished points come first."""
    from linmem.experiments.projection import project_points

    def study(dataset, model, finished, todo=0, running=(), grid="reduced"):
        return {"dataset": dataset, "model": model, "grid": grid, "finished_cpu_s": finished,
                "todo": todo, "running_cpu_s": list(running)}

    records = project_points([
        study("piano", "lmn-b", [10.0, 30.0]), study("piano", "gru", [4.0, 8.0]),
        study("muse", "lmn-b", [60.0]), study("muse", "lstm", [90.0, 90.0]),
        study("muse", "gru", [], todo=2, running=[5.0]),  # piano: gru 6, lmn-b 20; muse lmn-b 60
        study("muse", "rnn", [], todo=3),  # rnn on jsb only (another grid)
        study("muse", "lmn-a", [], todo=1),  # no lmn-a anywhere: the data set's mean, 240 / 3
        study("piano", "lstm", [], todo=1),  # lstm on muse: 90 x (20 / 60) = 30
        study("jsb", "gru", [], todo=1, grid="paper"),  # nothing in its grid finished
        study("jsb", "lmn-b", [5.0, 15.0], grid="paper"),  # 10: muse 60 / 10, piano 20 / 10
        study("jsb", "rnn", [1.5], grid="paper"),
        study("piano", "rnn", [], todo=2),  # rnn only in the other grid: 1.5 x 20 / 10 = 3
        study("nottingham", "gru", [], todo=1),  # finished nothing anywhere: nothing
    ])
    by = {(r["dataset"], r["model"]): r for r in records}
    assert by[("piano", "gru")]["left_from"] == "study" and by[("piano", "gru")]["left_cpu_s"] == 0
    gru = by[("muse", "gru")]
    assert gru["left_from"] == "model" and gru["mean_point_cpu_s"] == pytest.approx(18.0)
    assert gru["left_cpu_s"] == pytest.approx(2 * 18.0 + 13.0)
    rnn = by[("muse", "rnn")]  # rnn on jsb: 1.5 x (60 / 10) = 9
    assert rnn["left_from"] == "model, other grid" and rnn["left_cpu_s"] == pytest.approx(27.0)
    lmn_a = by[("muse", "lmn-a")]
    assert lmn_a["left_from"] == "data set" and lmn_a["left_cpu_s"] == pytest.approx(80.0)
    piano_rnn = by[("piano", "rnn")]
    assert piano_rnn["left_from"] == "model, other grid"
    assert piano_rnn["mean_point_cpu_s"] == pytest.approx(3.0)
    assert by[("piano", "lstm")]["mean_point_cpu_s"] == pytest.approx(30.0)
    jsb = by[("jsb", "gru")]  # gru finished on piano only: 6 x (10 / 20) = 3
    assert jsb["left_from"] == "model, other grid" and jsb["left_cpu_s"] == pytest.approx(3.0)
    notts = by[("nottingham", "gru")]
    assert notts["left_from"] is None and notts["left_cpu_s"] is None


def test_projection_scales_a_studys_points_left_by_their_parameters():
    """Where a record gives its points' sizes, each point left costs c * n ** a of its n
    parameters, fitted to the finished points (a: the slope of numpy's fit of log seconds on
    log parameters, within [0, 2], 1 for one size): a study whose small points finished first
    is not projected at their mean."""
    import torch

    from linmem.experiments.projection import project_points
    from linmem.experiments.search import point_params, size_cost

    record = {"dataset": "muse", "model": "lstm", "grid": "reduced",
              "finished_cpu_s": [10.0, 50.0], "finished_params": [100, 500],  # 0.1 s / param
              "running_cpu_s": [5.0, 90.0], "running_params": [200, 750], "todo": 1,
              "todo_params": [1000]}
    sized = project_points([record])[0]
    assert sized["left_from"] == "study, by size"
    assert sized["mean_point_cpu_s"] == pytest.approx(30.0)  # the finished points' mean, shown
    assert sized["left_cpu_s"] == pytest.approx(100.0 + (20.0 - 5.0) + 0.0)  # 75 - 90: none
    slower = project_points([{**record, "finished_cpu_s": [10.0, 20.0],  # a = 0.5: 20 at 400
                              "finished_params": [100, 400], "todo_params": [900]}])[0]
    assert slower["left_cpu_s"] == pytest.approx(30.0 + (math.sqrt(200) - 5.0) + 0.0)
    unsized = {k: v for k, v in record.items() if not k.endswith("_params")}
    plain = project_points([unsized])[0]  # the study's mean per point, as before
    assert plain["left_from"] == "study"
    assert plain["left_cpu_s"] == pytest.approx(30.0 + (30.0 - 5.0) + 0.0)

    one_size = size_cost([100, 100], [10.0, 30.0])  # in proportion, at their mean
    assert one_size(100) == pytest.approx(20.0) and one_size(300) == pytest.approx(60.0)
    flat = size_cost([100, 400, 400], [50.0, 10.0, 0.0])  # slope < 0 kept at 0: their mean
    assert flat(1000) == pytest.approx(30.0) and size_cost([100], [0.0]) is None
    steep = size_cost([100, 200], [1.0, 64.0])  # slope 6 kept at 2
    assert steep(200) / steep(100) == pytest.approx(4.0)
    sizes, seconds = [100, 200, 400], [3.0, 9.0, 20.0]  # not on one line: numpy's fit
    slope = np.polyfit(np.log(sizes), np.log(seconds), 1)[0]
    fit = size_cost(sizes, seconds)
    assert fit(800) / fit(400) == pytest.approx(2 ** slope)
    assert sum(map(fit, sizes)) == pytest.approx(sum(seconds))  # they add up to their time

    base = TrainConfig()
    small, big = (point_params(base, "jsb", "lstm", Point(h, None, 0.0)) for h in (10, 20))
    lstm = torch.nn.LSTM(88, 20)  # the count is the model's: 4 gates' weights and the readout
    assert big == sum(p.numel() for p in lstm.parameters()) + 20 * 88 + 88 and small < big


@pytest.mark.filterwarnings("ignore:Heartbeat of storage")  # the fake workers' study.ask
def test_a_worker_without_wait_leaves_live_workers_their_points_and_takes_over_the_dead(
        tmp_path, data_dir):
    """``wait=False``: the worker runs the points left to start, takes over the point of a
    worker whose heartbeat stopped, and leaves, after a grace period, the point of a worker
    still beating (it would otherwise wait for it)."""
    import threading

    config = _config(tmp_path, data_dir, wait=False)
    study = open_study(config, "jsb", "lmn-b")
    points = grid_points("lmn-b", "tiny")
    live, dead = points[0], points[1]
    trials = {}
    for point in (live, dead):
        study.enqueue_trial(point.params)
        trials[point] = study.ask()
        study._storage.record_heartbeat(trials[point]._trial_id)
    stop = threading.Event()

    def beat():  # the live worker's heartbeat
        while not stop.wait(0.3):
            study._storage.record_heartbeat(trials[live]._trial_id)

    beating = threading.Thread(target=beat)
    beating.start()
    started = time.monotonic()
    try:
        run_worker(config, command="test", log=lambda _: None)
    finally:
        stop.set()
        beating.join()
    states = point_states(study, points)
    assert states[live] == "running"
    assert [states[p] for p in points if p != live] == ["done"] * (len(points) - 1)
    retry = [t for t in study.get_trials() if t.system_attrs.get("failed_trial")
             == trials[dead].number]
    assert len(retry) == 1 and retry[0].state == TrialState.COMPLETE
    assert time.monotonic() - started > config.grace_period
    assert study.get_trials()[trials[live].number].state == TrialState.RUNNING


@pytest.mark.slow
def test_the_documented_postgresql_url_works_with_the_extra(postgres_url):
    """Issue 46, row 10: `--storage postgresql://...` as the README writes it (SQLAlchemy 2 maps
    it to psycopg 3; the postgres extra installs psycopg2) opens the server and holds a study."""
    from linmem.experiments.storage import check_storage

    plain = "postgresql://" + postgres_url.split("://", 1)[1]
    url = check_storage(plain)
    study = optuna.create_study(storage=make_storage(plain), study_name="documented-url",
                                load_if_exists=True)
    study.set_user_attr("ok", True)
    assert optuna.load_study(study_name="documented-url", storage=url).user_attrs["ok"]
    optuna.delete_study(study_name="documented-url", storage=url)


def test_progress_projects_a_planned_study_from_the_probes(tmp_path):
    """With probes (short runs of one configuration on two data sets), a planned study on a data
    set with nothing finished takes its model's points on the other set, fitted by size
    (c * n ** a), times the probes' ratio of an epoch's CPU time for its family; an LMN's probes
    stand for the LMNs only, and a study the probes cannot reach stays unprojected."""
    import json

    from linmem.experiments.projection import probe_ratios, project_points

    def probe(name, data, model, hidden, memory, epochs):
        d = tmp_path / "probes" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"data": data, "model": model}))
        (d / "metrics.json").write_text(json.dumps({"dataset": data, "model": model,
                                                    "hidden": hidden, "memory": memory}))
        (d / "log.jsonl").write_text("".join(json.dumps({"epoch": i + 1, "epoch_cpu_s": s}) + "\n"
                                             for i, s in enumerate(epochs)))

    probe("jsb-lmn", "jsb", "lmn-b", 250, 250, [1.0, 1.2, 1.1])  # median 1.1
    probe("piano-lmn", "piano", "lmn-b", 250, 250, [2.2])
    probe("jsb-lstm", "jsb", "lstm", 750, None, [10.0, 14.0])  # median 12
    probe("piano-lstm", "piano", "lstm", 750, None, [36.0])
    ratios = probe_ratios([tmp_path / "probes"])
    assert ratios[("piano", "jsb", "memory")] == pytest.approx(2.0)
    assert ratios[("jsb", "piano", "recurrent")] == pytest.approx(1 / 3)
    assert ("piano", "jsb", "memory") in ratios and len(ratios) == 4

    jsb = {"dataset": "jsb", "grid": "paper", "finished_cpu_s": [10.0, 40.0],
           "finished_params": [100, 400], "running_cpu_s": [], "todo": 0}  # a = 1: 0.1 s/param
    planned = {"dataset": "piano", "grid": "paper-long", "finished_cpu_s": [],
               "running_cpu_s": [], "todo": 2, "todo_params": [200, 1000]}
    records = project_points([{**jsb, "model": "lmn-b"}, {**jsb, "model": "lstm"},
                              {**planned, "model": "lmn-b"}, {**planned, "model": "lstm"},
                              {**planned, "model": "gru"}], ratios)
    lmn, lstm, gru = records[2:]
    assert lmn["left_from"] == "probe" and lstm["left_from"] == "probe"
    assert lmn["left_cpu_s"] == pytest.approx((20.0 + 100.0) * 2.0)
    assert lstm["left_cpu_s"] == pytest.approx((20.0 + 100.0) * 3.0)
    assert lmn["mean_point_cpu_s"] == pytest.approx(60.0 * 2.0)
    # no GRU finished anywhere: the probes have nothing to scale, the data set nothing either
    assert gru["left_from"] is None and gru["left_cpu_s"] is None
    # without probes, as before: nothing to project the planned LMN from
    assert project_points([{**jsb, "model": "lmn-b"}, {**planned, "model": "lmn-b"}]
                          )[1]["left_from"] is None


def test_seeds_of_a_study_that_selected_nothing_yet_cost_its_dearest_point():
    """A study's seeds while it has selected nothing: each at its dearest point, finished,
    running (what it has logged, when above its projection) or to do (projected by size); a
    study with nothing to project from leaves them unprojected, and a selection's own
    projection is kept."""
    from linmem.experiments.progress import _project_unselected_seeds
    from linmem.experiments.projection import project_points

    study = {"study": "muse-lstm-g@paper", "dataset": "muse", "model": "lstm", "grid": "g",
             "finished_cpu_s": [10.0, 20.0], "finished_params": [100, 200],  # 0.1 s/param
             "running_cpu_s": [70.0, 5.0], "running_params": [300, 400], "todo": 1,
             "todo_params": [600]}
    empty = {"study": "muse-gru-g@paper", "dataset": "nowhere", "model": "gru", "grid": "h",
             "finished_cpu_s": [], "running_cpu_s": [], "todo": 2}
    records = project_points([study, empty])
    assert records[0]["left_from"] == "study, by size"
    assert records[0]["left_cpu_s"] == pytest.approx(0.0 + 35.0 + 60.0)
    assert records[0]["dearest_point_cpu_s"] == pytest.approx(70.0)  # running, past 30
    records[0]["todo_params"] = [900]
    assert project_points([records[0]])[0]["dearest_point_cpu_s"] == pytest.approx(90.0)

    def seeds(name, per=None):
        return {"study": f"{name} seeds", "of_study": name, "todo": 3, "mean_point_cpu_s": per,
                "left_from": "selected run", "left_cpu_s": None if per is None else 3 * per}

    record = seeds("muse-lstm-g@paper")
    _project_unselected_seeds(record, records)
    assert (record["left_from"], record["mean_point_cpu_s"], record["left_cpu_s"]) == (
        "dearest point", pytest.approx(90.0), pytest.approx(270.0))
    unknown = seeds("muse-gru-g@paper")
    _project_unselected_seeds(unknown, records)
    assert unknown["left_cpu_s"] is None and unknown["left_from"] == "selected run"
    chosen = seeds("muse-lstm-g@paper", per=5.0)
    _project_unselected_seeds(chosen, records)
    assert chosen["left_cpu_s"] == 15.0


def test_the_probes_come_before_whole_runs_ratios_that_divergences_distort(tmp_path):
    """A planned study with nothing finished is projected from the probes (an epoch's measured
    cost) before the whole runs' ratio of two data sets' costs: runs that diverged early on one
    set make that ratio say the set is cheap for every model (here muse's LMN points stopped
    after a few epochs, so the ratio of finished totals is 1 where an epoch costs 4 times
    piano's); a running point is projected at its own size."""
    import json

    from linmem.experiments.projection import probe_ratios, project_points

    for name, data, model, hidden, epochs in (("piano-lmn", "piano", "lmn-b", 250, [2.0]),
                                              ("muse-lmn", "muse", "lmn-b", 250, [8.0]),
                                              ("piano-lstm", "piano", "lstm", 750, [30.0]),
                                              ("muse-lstm", "muse", "lstm", 750, [120.0])):
        d = tmp_path / "probes" / name
        d.mkdir(parents=True)
        (d / "config.json").write_text(json.dumps({"data": data, "model": model}))
        (d / "metrics.json").write_text(json.dumps({"dataset": data, "model": model,
                                                    "hidden": hidden, "memory": None}))
        (d / "log.jsonl").write_text("".join(json.dumps({"epoch": i + 1, "epoch_cpu_s": c})
                                             + "\n" for i, c in enumerate(epochs)))
    ratios = probe_ratios([tmp_path / "probes"])
    assert ratios[("muse", "piano", "recurrent")] == pytest.approx(4.0)

    def study(data, model, finished=(), params=(), todo=(), running=(), running_params=()):
        return {"dataset": data, "model": model, "grid": "paper-long",
                "finished_cpu_s": list(finished), "finished_params": list(params),
                "running_cpu_s": list(running), "running_params": list(running_params),
                "todo": len(todo), "todo_params": list(todo)}

    records = project_points([
        study("piano", "lmn-b", [100.0, 100.0], [1000, 1000]),
        study("muse", "lmn-b", [100.0, 100.0], [1000, 1000]),  # cut short: the same totals
        study("piano", "lstm", [30.0, 60.0], [100, 200]),  # a = 1: 0.3 s per parameter
        study("muse", "lstm", todo=[100, 300], running=[50.0], running_params=[400]),
    ], ratios)
    lstm = records[3]
    assert lstm["left_from"] == "probe"
    assert lstm["mean_point_cpu_s"] == pytest.approx((30.0 + 90.0 + 120.0) / 3 * 4.0)
    assert lstm["left_cpu_s"] == pytest.approx((30.0 + 90.0) * 4.0 + (120.0 * 4.0 - 50.0))
    # every point started, none to do: still the probes, each running point at its size
    started = project_points([*records[:3], study("muse", "lstm", running=[50.0, 10.0],
                                                  running_params=[100, 400])], ratios)[3]
    assert started["left_from"] == "probe"
    assert started["left_cpu_s"] == pytest.approx((120.0 - 50.0) + (480.0 - 10.0))
    # without the probes the whole runs' ratio (1) projects it at piano's cost
    plain = project_points([study("piano", "lmn-b", [100.0], [1000]),
                            study("muse", "lmn-b", [100.0], [1000]),
                            study("piano", "lstm", [30.0, 60.0], [100, 200]),
                            study("muse", "lstm", todo=[100, 300])])[3]
    assert plain["left_from"] == "model" and plain["mean_point_cpu_s"] == pytest.approx(45.0)


def test_the_seed_folders_have_one_owner():
    """A reseed's seed K lies in OUT/sK, results/ keeps it as OUT-sK; both read back as seed K
    of their configuration, nothing else does."""
    from linmem.experiments.seeds import published_seed_name, seed_dir, seed_folder_of

    run = seed_dir("runs/bound-seeds/jsb-lmn-b", 2)
    assert run == Path("runs/bound-seeds/jsb-lmn-b/s2")
    assert published_seed_name(run) == "jsb-lmn-b-s2"
    assert seed_folder_of(run, "jsb-lmn-b") == 2
    assert seed_folder_of(Path("results/seeds") / published_seed_name(run), "jsb-lmn-b") == 2
    for other in ("runs/jsb-lmn-b/x2", "runs/jsb-lmn-b/s", "results/jsb-lmn-b-s2x",
                  "results/jsb-lmn-a-s2", "runs/jsb-lmn-b-tanh/s2"):
        assert seed_folder_of(Path(other), "jsb-lmn-b") is None, other
