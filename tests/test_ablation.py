"""The one-factor-at-a-time ablation (linmem.experiments.ablation, ``linmem ablation``): the seeds
of a variant against its base's, and the median pruner's replay against Optuna's own pruner."""

import json

import numpy as np
import optuna
import pytest
from click.testing import CliRunner

from linmem.cli.commands import cli
from linmem.experiments.ablation import ablation_groups, grid_trials, replay_pruner
from linmem.experiments.both_protocols import ablation_markdown, ablation_record_markdown
from linmem.training.runs import collect_metrics


def _run(root, name, seed, frame, glob, overrides=None, wd=0.0, diverged=False):
    """A run directory as `linmem reseed` leaves it: config.json and metrics.json."""
    d = root / name
    d.mkdir(parents=True)
    (d / "config.json").write_text(json.dumps({"batch_size": 1, "chunk": None,
                                               "nonlinearity": "tanh"}))
    record = {"dataset": "jsb", "model": "lmn-b", "hidden": 250, "memory": 250,
              "weight_decay": wd, "protocol": "paper", "protocol_overrides": overrides or {},
              "seed": seed}
    if diverged:
        (d / "diverged.json").write_text(json.dumps({**record, "diverged": "NaN loss"}))
    else:
        (d / "metrics.json").write_text(json.dumps({**record, "test_acc_frame": frame,
                                                    "test_acc": glob, "test_nll": 8.0,
                                                    "valid_acc": glob}))
    return d


def _seeds(tmp_path):
    for s, (f, g) in enumerate([(33.0, 30.0), (34.0, 30.5), (33.5, 29.5)], 1):
        _run(tmp_path / "base", f"s{s}", s, f, g)
    for s, (f, g) in enumerate([(31.0, 28.0), (31.5, 28.5), (30.0, 27.0)], 1):
        _run(tmp_path / "var", f"batch4-s{s}", s, f, g, {"batch_size": 4})
    for s, (f, g) in enumerate([(33.2, 30.1), (34.4, 30.3)], 1):
        _run(tmp_path / "var", f"summed-s{s}", s, f, g,
             {"loss_reduction": "frame", "clip": 880.0})
    _run(tmp_path / "var", "summed-s3", 3, None, None, {"loss_reduction": "frame", "clip": 880.0},
         diverged=True)
    _run(tmp_path / "var", "noclip-s1", 1, 32.0, 29.0, {"clip": None})  # a value of None sorts


def test_each_variant_against_its_base(tmp_path):
    _seeds(tmp_path)
    rows = ablation_groups(collect_metrics([tmp_path / "base"], diverged=True),
                           collect_metrics([tmp_path / "var"], diverged=True))
    assert [r["factor"] for r in rows] == [{"batch_size": 4},
                                           {"clip": 880.0, "loss_reduction": "frame"},
                                           {"clip": None}]
    # the base's values are the paper protocol's (batch 1; the mean loss, clip 10)
    assert rows[0]["base_values"] == {"batch_size": 1}
    assert rows[1]["base_values"] == {"clip": 10.0, "loss_reduction": "mean"}
    batch4, summed, noclip = rows
    assert noclip["base_values"] == {"clip": 10.0} and noclip["variant"]["seeds"] == [1]
    assert batch4["base"]["test_acc_frame"]["mean"] == pytest.approx(33.5)
    assert batch4["variant"]["test_acc_frame"]["mean"] == pytest.approx((31 + 31.5 + 30) / 3)
    assert batch4["variant"]["test_acc_frame"]["sd"] == pytest.approx(
        np.std([31, 31.5, 30], ddof=1))
    assert summed["variant"]["seeds"] == [1, 2] and summed["variant"]["diverged_seeds"] == [3]
    text = ablation_markdown(rows, "linmem ablation ...")
    lines = text.splitlines()
    # the base once, then each factor; the change of the means, and whether the ranges part
    assert sum("– (as selected)" in line for line in lines) == 1
    (b4,) = [line for line in lines if "batch_size 1 → 4" in line]
    assert f"{(31 + 31.5 + 30) / 3 - 33.5:+.2f} (ranges apart)" in b4
    assert f"{(28 + 28.5 + 27) / 3 - 30.0:+.2f} (ranges apart)" in b4
    (sm,) = [line for line in lines if "loss_reduction mean → frame" in line]
    assert "clip 10.0 → 880.0" in sm and "1, 2 (seed 3 diverged)" in sm
    assert f"{(33.2 + 34.4) / 2 - 33.5:+.2f} |" in sm  # ranges overlap: no mark
    (nc,) = [line for line in lines if "clip 10.0 → None" in line]
    # one seed, outside the base's range: no range to part, it says so
    assert f"{32.0 - 33.5:+.2f} (one seed so far)" in nc and "apart" not in nc
    assert "Made by `linmem ablation ...`" in text


def test_a_variant_needs_its_base_and_a_change(tmp_path):
    _seeds(tmp_path)
    base = collect_metrics([tmp_path / "base"], diverged=True)
    other = [_run(tmp_path / "other", "s1", 1, 30.0, 27.0, {"batch_size": 4}, wd=1e-5)]
    with pytest.raises(ValueError, match="no base seeds of lmn-b \\(250, 250, weight decay"):
        ablation_groups(base, collect_metrics(other))
    same = [_run(tmp_path / "same", "s1", 1, 30.0, 27.0, {})]
    with pytest.raises(ValueError, match="trained as its base"):
        ablation_groups(base, collect_metrics(same))
    # a variant that sets the protocol's own value changes nothing either
    same = [_run(tmp_path / "same2", "s1", 1, 30.0, 27.0, {"batch_size": 1})]
    with pytest.raises(ValueError, match="trained as its base"):
        ablation_groups(base, collect_metrics(same))
    mixed = base + collect_metrics([_run(tmp_path / "mixed", "s4", 4, 30.0, 27.0,
                                         {"batch_size": 4})])
    mixed[-1]["weight_decay"] = 0.0  # the same point, seeds of it with other fields
    with pytest.raises(ValueError, match="different protocol fields"):
        ablation_groups(mixed, collect_metrics([tmp_path / "var"], diverged=True))


def _curves(rng, n):
    """Validation curves of different lengths, with plateaus and collapses."""
    out = []
    for _ in range(n):
        length = int(rng.integers(30, 120))
        curve = np.cumsum(rng.normal(0.3, 1.5, length)) + rng.normal(0, 3)
        curve[rng.integers(0, length, 3)] -= 15  # collapses
        out.append({e + 1: float(v) for e, v in enumerate(curve)})
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("warmup", [10, 50])
def test_pruner_replay_stops_where_optunas_median_pruner_does(seed, warmup):
    """Each trial, reported epoch by epoch to an Optuna study holding all the others as
    complete, is pruned by MedianPruner at the epoch where the replay stops it."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    rng = np.random.default_rng(seed)
    curves = _curves(rng, 12)
    trials = [{"number": i, "point": f"p{i}", "value": max(c.values()), "curve": c,
               "test_acc": None, "test_acc_frame": None} for i, c in enumerate(curves)]
    replay = replay_pruner(trials, warmup=warmup)
    assert replay["stopped"], "a test that no trial is stopped in checks nothing"
    for i, curve in enumerate(curves):
        study = optuna.create_study(direction="maximize", pruner=optuna.pruners.MedianPruner(
            n_startup_trials=0, n_warmup_steps=warmup))
        for j, other in enumerate(curves):
            if j != i:
                study.add_trial(optuna.trial.create_trial(
                    state=optuna.trial.TrialState.COMPLETE, value=max(other.values()),
                    intermediate_values=other))
        trial = study.ask()
        pruned_at = None
        for epoch in sorted(curve):
            trial.report(curve[epoch], epoch)
            if trial.should_prune():
                pruned_at = epoch
                break
        assert replay["stopped"].get(f"p{i}") == pruned_at, i
    kept = [t for t in trials if t["point"] not in replay["stopped"]]
    assert replay["selected_pruned"] is max(kept, key=lambda t: t["value"], default=None)
    assert replay["selected"] is max(trials, key=lambda t: t["value"])
    saved = sum(len([e for e in curves[int(p[1:])] if e > at])
                for p, at in replay["stopped"].items())
    assert replay["epochs_saved"] == pytest.approx(saved / sum(map(len, curves)))


def _study(tmp_path):
    """A finished search study: three points, one run directory with its log."""
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    study = optuna.create_study(study_name="jsb-lstm-paper@paper", storage=storage,
                                direction="maximize")
    study.set_user_attr("train", {"select": "acc_frame", "protocol": "paper"})
    dist = {"hidden": optuna.distributions.CategoricalDistribution([50, 100, 250]),
            "weight_decay": optuna.distributions.CategoricalDistribution([0.0])}
    run = tmp_path / "runs" / "h250-wd0"
    run.mkdir(parents=True)
    log = [{"epoch": e, "valid_acc": 20.0, "valid_acc_frame": v}
           for e, v in enumerate([10.0, 24.0, 30.0, 31.0], 1)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    (run / "metrics.json").write_text(json.dumps({"test_acc_frame": 32.5, "test_acc": 29.0}))
    for hidden, curve, attrs in (
            (50, {1: 15.0, 2: 16.0, 3: 16.5, 4: 17.0}, {"test_acc_frame": 17.0, "test_acc": 15.0}),
            (100, {1: 12.0, 2: 25.0, 3: 28.0, 4: 29.0}, {"test_acc_frame": 28.0,
                                                          "test_acc": 26.0}),
            (250, {1: 0.0}, {"run_dir": "runs/h250-wd0"})):
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.COMPLETE, value=max(curve.values()) if hidden != 250
            else 31.0, params={"hidden": hidden, "weight_decay": 0.0}, distributions=dist,
            intermediate_values=curve, user_attrs=attrs))
    return storage


def test_grid_trials_read_the_runs_logs_and_the_storage(tmp_path):
    storage = _study(tmp_path)
    trials = grid_trials(storage, "jsb-lstm-paper@paper", tmp_path)
    assert [t["point"] for t in trials] == ["h50-wd0", "h100-wd0", "h250-wd0"]
    # the run's log (the per-frame score, the study's), not the trial's intermediate values
    assert trials[2]["curve"] == {1: 10.0, 2: 24.0, 3: 30.0, 4: 31.0}
    assert trials[2]["test_acc_frame"] == 32.5
    assert trials[0]["curve"] == {1: 15.0, 2: 16.0, 3: 16.5, 4: 17.0}  # no run: the storage's
    assert trials[1]["test_acc"] == 26.0
    replay = replay_pruner(trials, warmup=2)
    # epoch 2: h50's best 16 against the others' 25 and 24 (median 24.5): stopped; h100's 25
    # against 16 and 24, h250's 24 against 16 and 25 (later the same) are not
    assert replay["stopped"] == {"h50-wd0": 2}
    with pytest.raises(ValueError, match=r"no study 'jsb-gru-paper@paper'.*jsb-lstm-paper@paper"):
        grid_trials(storage, "jsb-gru-paper@paper", tmp_path)


def test_grid_trials_without_the_runs_join_a_resumed_runs_trials(tmp_path):
    """With the run directory gone (another machine's), a run that a killed worker left and a
    later trial resumed has its epochs in two trials' intermediate values: the curve joins them
    (the later trial's report of an epoch wins), as the run's log would have it."""
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    study = optuna.create_study(study_name="jsb-lstm-paper@paper", storage=storage,
                                direction="maximize")
    study.set_user_attr("train", {"select": "acc_frame", "protocol": "paper"})
    dist = {"hidden": optuna.distributions.CategoricalDistribution([50, 250]),
            "weight_decay": optuna.distributions.CategoricalDistribution([0.0])}
    for state, hidden, curve, value in (
            ("FAIL", 250, {1: 10.0, 2: 24.0, 3: 26.0}, None),  # killed after epoch 3
            ("COMPLETE", 50, {1: 15.0, 2: 16.0, 3: 16.5, 4: 17.0, 5: 17.5}, 17.5),
            ("COMPLETE", 250, {3: 27.0, 4: 30.0, 5: 31.0}, 31.0)):  # resumed from epoch 2
        study.add_trial(optuna.trial.create_trial(
            state=getattr(optuna.trial.TrialState, state), value=value,
            params={"hidden": hidden, "weight_decay": 0.0}, distributions=dist,
            intermediate_values=curve, user_attrs={"run_dir": f"runs/h{hidden}-wd0"}))
    trials = grid_trials(storage, "jsb-lstm-paper@paper", tmp_path)
    assert [t["point"] for t in trials] == ["h50-wd0", "h250-wd0"]
    assert trials[1]["curve"] == {1: 10.0, 2: 24.0, 3: 27.0, 4: 30.0, 5: 31.0}
    assert trials[0]["curve"] == {1: 15.0, 2: 16.0, 3: 16.5, 4: 17.0, 5: 17.5}
    # epoch 2: h50's best 16 against h250's 24: with the resumed run's second trial alone,
    # h250 had no score before epoch 3 and h50 would have been compared with nothing
    assert replay_pruner(trials, warmup=2)["stopped"] == {"h50-wd0": 2}


def test_the_ablation_command(tmp_path, monkeypatch):
    _seeds(tmp_path)
    storage = _study(tmp_path)
    out = tmp_path / "out"
    args = ["ablation", "--base", str(tmp_path / "base"), "--runs", str(tmp_path / "var"),
            "--storage", storage, "--study", "jsb-lstm-paper@paper", "--runs-root",
            str(tmp_path), "--warmup", "2", "--out", str(out)]
    monkeypatch.setattr("sys.argv", ["linmem", *args])
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    text = (out / "ablation.md").read_text()
    assert "batch_size 1 → 4" in text
    assert "| jsb-lstm-paper@paper | 3 | 1 | " in text
    assert "h250-wd0: 32.50 (29.00) | the same |" in text
    record = json.loads((out / "ablation.json").read_text())
    assert record["pruner"]["studies"][0]["stopped"] == {"h50-wd0": 2}
    assert len(record["factors"]) == 3 and record["command"].startswith("linmem ablation --base")
    assert f"Made by `{record['command']}` at commit" in text
    # the record alone renders the same tables (the report's section on both protocols reads
    # it): each base once, the pruner's "the same" from the selections' trial numbers
    assert ablation_record_markdown(record) in text
    # bad input: one line, exit 2, nothing written
    bad = CliRunner().invoke(cli, ["ablation", "--runs", str(tmp_path / "var"), "--out",
                                   str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "--base" in bad.output and not (tmp_path / "bad").exists()
    bad = CliRunner().invoke(cli, ["ablation", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "nothing to report" in bad.output
