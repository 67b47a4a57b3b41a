"""The command line: one-line errors with exit code 2, a tiny training run, evaluate, resume."""

import json
import subprocess
import sys

import pytest
import torch

from linmem.cli.commands import main
from linmem.data import load_polyphonic
from linmem.metrics import frame_accuracy
from linmem.training.config import DEFAULT_PROTOCOL, LEGACY_PROTOCOL
from linmem.training.evaluation import load_run_model


def run_cli(*args, capsys):
    """(exit code, stdout, stderr) of ``linmem ARGS`` run in this process."""
    try:
        main(list(args))
        code = 0
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args", [
    ["train", "--data", "mnist"],
    ["train", "--model", "transformer"],
    ["train", "--hidden", "-5"],
    ["train", "--weight-decay", "-1"],
    ["train", "--clip", "abc"],
    ["train", "--data-dir", "/no/such/dir"],
    ["train", "--resume"],
    ["evaluate", "/no/such/run"],
    ["reseed", "/no/such/run", "--set", "loop_bound=true"],
    ["train", "--input-path", "both"],
    ["train", "--model", "lstm", "--loop-bound"],
    ["train", "--nonlinearity", "selu", "--loop-bound", "--memory-bound", "none"],
    ["data", "mnist"],
    ["frobnicate"],
])
def test_bad_arguments_give_one_line_and_exit_2(args, capsys):
    code, _, err = run_cli(*args, capsys=capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("linmem: error:"), err
    assert "Traceback" not in err


def test_missing_data_is_a_usage_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    code, _, err = run_cli("data", "jsb", "--data-dir", str(tmp_path), "--no-download",
                           capsys=capsys)
    assert code == 2 and "not found" in err and len(err.strip().splitlines()) == 1


def test_train_evaluate_and_resume(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--model", "lmn-a", "--hidden", "8",
              "--memory", "6", "--batch-size", "32", "--out", str(out), "--quiet"]
    code, stdout, _ = run_cli("train", *common, "--epochs", "2", capsys=capsys)
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["protocol"] == DEFAULT_PROTOCOL  # no --protocol: train's default
    # both accuracies of both splits, as metrics.json holds them
    assert (f"lmn-a on jsb ({DEFAULT_PROTOCOL} protocol): valid acc {metrics['valid_acc']:.2f}% "
            f"(per-frame {metrics['valid_acc_frame']:.2f}%)  test acc {metrics['test_acc']:.2f}% "
            f"(per-frame {metrics['test_acc_frame']:.2f}%)") in stdout
    assert "metrics.json" in stdout
    assert metrics["epochs"] == 2 and metrics["model"] == "lmn-a"
    assert metrics["data_sha256"] == (
        "ac0e608527cc411c7e21ef7d38be47f0de7fb6b13b3ae168b8eccf1c2a9b18d4")
    code, stdout, _ = run_cli("evaluate", str(out), "--data-dir", str(data_dir),
                              "--split", "test", capsys=capsys)
    assert code == 0
    scored = json.loads(stdout)
    assert scored["test"]["acc"] == pytest.approx(metrics["test_acc"], rel=1e-9)
    assert scored["test"]["nll"] == pytest.approx(metrics["test_nll"], rel=1e-9)
    from linmem.experiments.rescore import score_run  # what the command calls, from Python

    direct = score_run(out, ["test"], data_dir=str(data_dir), command="python")
    assert direct["test"] == scored["test"] and direct["command"] == "python"
    with pytest.raises(ValueError, match="splits must be among"):
        score_run(out, ["dev"])
    code, stdout, _ = run_cli("evaluate", str(out), "--data-dir", str(data_dir), "--split",
                              "valid", "--expected", "20", "--seed", "4", "--out",
                              str(out / "expected.json"), capsys=capsys)
    assert code == 0
    written = json.loads((out / "expected.json").read_text())
    assert written == json.loads(stdout)
    expected = written["valid"]
    assert 0 < expected["acc_expected"] < 100 and 0 < expected["acc_expected_se"] < 5
    assert expected["expected_samples"] == 20 and expected["expected_seed"] == 4
    assert written["sampling_seed"] == 4 and written["data_sha256"] == metrics["data_sha256"]
    assert written["seed"] == scored["seed"] == metrics["seed"] is not None  # the run's own
    assert "sampling_seed" not in scored
    assert written["command"] and written["wall_time_s"] > 0  # (in-process: pytest's argv)
    assert 0 < written["cpu_time_s"] <= written["wall_time_s"] * 4  # its CPU time (progress)
    assert written["commit"] == metrics["commit"]
    from linmem.training.runs import collect_metrics

    (record,) = collect_metrics([out])  # what linmem report reads from the run
    assert record["valid_acc_expected"] == expected["acc_expected"]
    assert record["valid_acc_expected_se"] == expected["acc_expected_se"]
    # the accuracy at other thresholds, the one validation chooses, and every split's at it,
    # against frame_accuracy on the model's own probabilities
    code, stdout, _ = run_cli("evaluate", str(out), "--data-dir", str(data_dir), "--split", "all",
                              "--thresholds", "0.1:0.7:0.15", capsys=capsys)
    assert code == 0
    scored = json.loads(stdout)
    grid = ["0.1", "0.25", "0.4", "0.55", "0.7"]
    model, _ = load_run_model(out)
    data = load_polyphonic("jsb", root=data_dir)
    for split in ("valid", "test"):
        inputs = [torch.tensor(s[:-1], dtype=torch.float32)[None] for s in data[split]]
        with torch.no_grad():
            probs = torch.cat([torch.sigmoid(model(x)[0]) for x in inputs])
        targets = torch.cat([torch.tensor(s[1:]) for s in data[split]])
        assert list(scored[split]["acc_at"]) == grid
        for t in grid:
            assert scored[split]["acc_at"][t] == pytest.approx(
                100 * frame_accuracy(probs, targets, threshold=float(t)), rel=1e-9)
    valid_at = scored["valid"]["acc_at"]
    assert scored["valid_threshold"] == float(max(valid_at, key=valid_at.get))
    for split in ("train", "valid", "test"):
        assert scored[split]["acc_at_valid_threshold"] == \
            scored[split]["acc_at"][str(scored["valid_threshold"])]
    code, stdout, _ = run_cli("evaluate", str(out), "--data-dir", str(data_dir), "--split", "test",
                              "--thresholds", "0.5", capsys=capsys)
    test_only = json.loads(stdout)  # no validation split: no threshold is chosen
    assert "valid_threshold" not in test_only and "acc_at_valid_threshold" not in test_only["test"]
    assert test_only["test"]["acc_at"]["0.5"] == pytest.approx(test_only["test"]["acc"], rel=1e-12)
    code, stdout, _ = run_cli("evaluate", str(out), "--data-dir", str(data_dir), "--split", "test",
                              "--thresholds", "0.1:0.5:0.15", capsys=capsys)
    assert list(json.loads(stdout)["test"]["acc_at"]) == ["0.1", "0.25", "0.4"]  # none past 0.5
    for bad in ("0.5,1.5", "0:0.5:0.1", "0.2:0.1:0.1", "a,b", "0.1:0.5", "0.5:1.6:0.5"):
        code, _, err = run_cli("evaluate", str(out), "--thresholds", bad, capsys=capsys)
        assert code == 2 and "thresholds" in err and len(err.strip().splitlines()) == 1, err
    # a second run into the same directory is refused; --resume with a larger budget goes on
    code, _, err = run_cli("train", *common, "--epochs", "2", capsys=capsys)
    assert code == 2 and "--resume" in err
    code, _, err = run_cli("train", "--resume", "--out", str(out), "--hidden", "9",
                           "--quiet", capsys=capsys)
    assert code == 2 and "different config" in err
    code, stdout, _ = run_cli("train", "--resume", "--out", str(out), "--epochs", "3",
                              "--data-dir", str(data_dir), "--quiet", capsys=capsys)
    longer = json.loads((out / "metrics.json").read_text())
    assert code == 0 and longer["epochs"] == 3 and "3 epochs" in stdout
    assert longer["command"] == metrics["command"] and len(longer["resumed_with"]) == 1
    code, stdout, _ = run_cli("summarize", str(tmp_path), capsys=capsys)
    assert code == 0 and stdout.startswith("| run | data |")
    assert f"{metrics['test_acc']:.2f}" in stdout


def test_the_commands_that_train_share_one_default_protocol_and_the_readers_read_theirs():
    """Every command that trains and takes ``--protocol`` (``train``, ``search``,
    ``analyze-pretraining``; ``pretrain`` trains under the same default)
    defaults to TrainConfig's protocol, linmem train's; ``report`` and ``progress`` default to
    the protocol their storage's studies were trained under (None here, resolved by
    :func:`linmem.experiments.studies.storage_protocol`)."""
    from linmem.cli.commands import cli

    def default(command: str) -> str:
        (param,) = [p for p in cli.commands[command].params if p.name == "protocol"]
        return param.default

    for command in ("train", "search", "analyze-pretraining"):
        assert default(command) == DEFAULT_PROTOCOL != LEGACY_PROTOCOL, command
    for command in ("report", "progress"):
        assert default(command) is None, command


@pytest.mark.slow
def test_console_script_runs(data_dir):
    result = subprocess.run([sys.executable, "-m", "linmem", "--help"], capture_output=True,
                            text=True, check=False)
    assert result.returncode == 0 and "train" in result.stdout
    result = subprocess.run([sys.executable, "-m", "linmem", "data", "jsb", "--data-dir",
                             str(data_dir)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["train"]["sequences"] == 229 and info["valid"]["frames"] == 4602


def test_fast_usage_is_the_real_help(capsys, monkeypatch):
    """``linmem --help`` answers without torch from linmem.cli.usage: the same text as click's."""
    from linmem.cli.usage import USAGE

    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = run_cli("--help", capsys=capsys)
    assert code == 0
    assert out == USAGE, "regenerate src/linmem/cli/usage.py from `COLUMNS=80 linmem --help`"
    code, out, _ = run_cli(capsys=capsys)
    assert code == 0 and out == USAGE


def test_help_and_version_load_no_torch():
    code = ("import sys, linmem.cli.launch as l\n"
            "for args in ([], ['--help'], ['--version']):\n"
            "    sys.argv = ['linmem', *args]; l.main()\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("Usage: linmem") == 2 and "linmem, version" in result.stdout


def test_baseline_command(tmp_path, data_dir, capsys):
    out = tmp_path / "baseline.json"
    code, stdout, err = run_cli("baseline", "--data", "jsb", "--data-dir", str(data_dir),
                                "--out", str(out), capsys=capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    assert round(result["scores"]["jsb"]["test"]["acc"], 2) == 22.20
    assert result["data_sha256"]["jsb"].startswith("ac0e6085") and "commit" in result
    assert "jsb: test acc 22.20% (per-frame mean 27.34%)" in stdout
    fitted = result["per_key_model"]["scores"]["jsb"]
    assert round(fitted["test"]["nll"], 2) == 10.49 and fitted["valid"]["nll"] > 0
    assert "the per-key model of the previous frame: test NLL 10.492" in stdout


def test_recorded_command_names_the_tool(monkeypatch):
    from linmem._io import command_line

    monkeypatch.setattr(sys, "argv", ["/venv/lib/site-packages/linmem/__main__.py", "train",
                                      "--out", "a b"])
    assert command_line() == "linmem train --out 'a b'"
    monkeypatch.setattr(sys, "argv", ["/venv/bin/linmem", "data", "jsb"])
    assert command_line() == "linmem data jsb"


def test_reseed_trains_the_same_configuration_with_other_seeds(tmp_path, data_dir, capsys):
    """linmem reseed: the run's config with each seed (nothing else changed), resumable; the
    report's seed table gives their spread."""
    out = tmp_path / "run"
    code, _, _ = run_cli("train", "--data", "jsb", "--data-dir", str(data_dir), "--model",
                         "lmn-b", "--hidden", "6", "--memory", "5", "--batch-size", "64",
                         "--epochs", "1", "--out", str(out), "--quiet", capsys=capsys)
    assert code == 0
    code, stdout, _ = run_cli("reseed", str(out), "--seeds", "1,2", "--quiet", capsys=capsys)
    assert code == 0 and "seed 2: valid acc" in stdout
    base = json.loads((out / "config.json").read_text())
    metrics = []
    for seed in (1, 2):
        config = json.loads((tmp_path / "run-seeds" / f"s{seed}" / "config.json").read_text())
        assert config == {**base, "seed": seed}
        metrics.append(json.loads((tmp_path / "run-seeds" / f"s{seed}" / "metrics.json")
                                  .read_text()))
    assert metrics[0]["test_nll"] != metrics[1]["test_nll"]  # the seed changes the numbers
    # again: both seeds are finished, nothing is trained
    code, stdout, _ = run_cli("reseed", str(out), "--seeds", "1,2", "--quiet", capsys=capsys)
    assert code == 0
    assert json.loads((tmp_path / "run-seeds" / "s1" / "metrics.json").read_text()) == \
        metrics[0]
    code, _, err = run_cli("reseed", str(out), "--seeds", "1,x", capsys=capsys)
    assert code == 2 and "--seeds" in err

    from linmem.experiments.seed_groups import seed_groups
    from linmem.training.runs import collect_metrics

    (group,) = seed_groups(collect_metrics([tmp_path / "run-seeds"]))
    accs = [m["test_acc"] for m in metrics]
    assert group["seeds"] == [1, 2] and group["test_acc"]["n"] == 2
    assert group["test_acc"]["mean"] == pytest.approx(sum(accs) / 2)
    assert group["test_acc"]["sd"] == pytest.approx(abs(accs[0] - accs[1]) / 2 ** 0.5)


def test_reseed_runs_every_seed_when_one_diverges(tmp_path, data_dir, capsys, monkeypatch):
    """A seed that diverges with nothing kept does not cost the seeds after it: they run, the
    command prints them, names the diverged seed and exits 1."""
    import dataclasses

    from linmem.experiments import seeds
    from linmem.training.config import TrainConfig
    from linmem.training.trainer import TrainingDiverged

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = TrainConfig(data="jsb", model="lmn-b", hidden=6, memory=5, data_dir=str(data_dir))
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    ran = []

    def fake_run(config, run_dir, **kwargs):
        ran.append(config.seed)
        if config.seed == 2:  # as train() does: config.json, and diverged.json records it
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
            (run_dir / "diverged.json").write_text('{"diverged": "NaN in epoch 1"}')
            raise TrainingDiverged("the training loss became NaN or inf in epoch 1")
        return {"valid_acc": 10.0 + config.seed, "test_acc": 20.0, "test_nll": 5.0}

    monkeypatch.setattr(seeds, "train", fake_run)
    code, stdout, err = run_cli("reseed", str(run_dir), "--seeds", "1,2,3", "--quiet",
                                capsys=capsys)
    assert ran == [1, 2, 3] and code == 1
    assert "seed 1: valid acc 11.00%" in stdout and "seed 3: valid acc 13.00%" in stdout
    assert "seed 2:" not in stdout and "seed 2: the training loss became NaN" in err
    with pytest.raises(seeds.SeedsDiverged) as caught:
        seeds.reseed(run_dir, [2, 3], tmp_path / "again", progress=False)
    assert list(caught.value.finished) == [3]
    # run again: the diverged seed is a result, named from its record and not trained again
    ran.clear()
    code, _, err = run_cli("reseed", str(run_dir), "--seeds", "1,2,3", "--quiet",
                           "--out", str(tmp_path / "again"), capsys=capsys)
    assert ran == [1, 3] and code == 1 and "seed 2: NaN in epoch 1 (as " in err
    # other settings in the same folder: not that result, so the seed runs (train() would
    # refuse the folder; the fake one does not)
    ran.clear()
    code, _, err = run_cli("reseed", str(run_dir), "--seeds", "2", "--quiet", "--set",
                           "weight_decay=0.001", "--out", str(tmp_path / "again"),
                           capsys=capsys)
    assert ran == [2] and code == 1


def test_reseed_stop_by_starts_only_the_seeds_that_fit(tmp_path, data_dir, capsys,
                                                      monkeypatch):
    """--stop-by: a seed starts or resumes only if the run's CPU time, less what the seed has
    logged, ends by the deadline; the others are named on stderr and left for a later call
    (exit 0); a finished seed is reported whatever the deadline."""
    import dataclasses

    from linmem.experiments import seeds
    from linmem.training.config import TrainConfig

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = TrainConfig(data="jsb", model="lmn-b", hidden=6, memory=5, data_dir=str(data_dir))
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    (run_dir / "metrics.json").write_text('{"cpu_time_s": 3600.0, "wall_time_s": 3700.0}')
    out = tmp_path / "seeds"
    (out / "s1").mkdir(parents=True)
    (out / "s1" / "metrics.json").write_text("{}")  # finished
    (out / "s2").mkdir()
    (out / "s2" / "log.jsonl").write_text("".join(  # 3500 of its 3600 s logged
        json.dumps({"epoch": e, "epoch_cpu_s": 700.0, "epoch_time_s": 900.0}) + "\n"
        for e in range(1, 6)))
    ran = []

    def fake_run(config, run_dir, **kwargs):
        ran.append(config.seed)
        return {"valid_acc": 10.0 + config.seed, "test_acc": 20.0, "test_nll": 5.0}

    monkeypatch.setattr(seeds, "train", fake_run)
    code, stdout, err = run_cli("reseed", str(run_dir), "--seeds", "1,2,3,4", "--out", str(out),
                                "--stop-by", "30m", "--quiet", capsys=capsys)
    assert code == 0 and ran == [1, 2]
    assert "seed 1: valid acc 11.00%" in stdout and "seed 2: valid acc 12.00%" in stdout
    assert "seed 3:" not in stdout and "seed 4:" not in stdout
    assert "seed 3: not started, projected to end at" in err and "(1.00 CPU h left)" in err
    assert "seed 4: not started" in err
    # a deadline far enough, or none: every seed runs
    ran.clear()
    assert run_cli("reseed", str(run_dir), "--seeds", "3,4", "--out", str(out), "--stop-by",
                   "1h5m", "--quiet", capsys=capsys)[0] == 0 and ran == [3, 4]
    ran.clear()
    assert run_cli("reseed", str(run_dir), "--seeds", "3", "--out", str(out), "--quiet",
                   capsys=capsys)[0] == 0 and ran == [3]
    code, _, err = run_cli("reseed", str(run_dir), "--stop-by", "soon", capsys=capsys)
    assert code == 2 and "--stop-by" in err and "2h30m" in err


def test_reseed_set_changes_fields_of_the_run(tmp_path, data_dir, capsys, monkeypatch):
    """--set FIELD=VALUE: the seeds train the run's config with those fields changed (values
    read as JSON, else text); unknown fields, the seed and invalid values are refused."""
    import dataclasses

    from linmem.experiments import seeds
    from linmem.training.config import TrainConfig
    from linmem.training.trainer import with_data_dir

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    config = with_data_dir(TrainConfig(data="jsb", model="pret-lmn-b", hidden=6, memory=5,
                                       weight_decay=1e-5, data_dir=str(data_dir)))
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(config)))
    ran = []

    def fake_run(config, run_dir, **kwargs):
        ran.append(config)
        return {"valid_acc": 1.0, "test_acc": 2.0, "test_nll": 3.0}

    monkeypatch.setattr(seeds, "train", fake_run)
    code, _, _ = run_cli("reseed", str(run_dir), "--seeds", "1,2", "--set", "nonlinearity=tanh",
                         "--set", "ulm_nonlinearity=selu", "--set", "weight_decay=1e-7",
                         "--set", "chunk=null", "--quiet", capsys=capsys)
    assert code == 0
    assert ran == [dataclasses.replace(config, seed=s, nonlinearity="tanh",
                                       ulm_nonlinearity="selu", weight_decay=1e-7)
                   for s in (1, 2)]
    for bad, said in (("colour=red", "cannot set colour"), ("seed=4", "cannot set seed"),
                      ("hidden=1.5", "hidden"), ("nonlinearity=cosh", "cosh"),
                      ("hidden", "FIELD=VALUE")):
        code, _, err = run_cli("reseed", str(run_dir), "--set", bad, "--quiet", capsys=capsys)
        assert code == 2 and said in err, (bad, err)
    assert len(ran) == 2
    # a run that did not name its data folder (results/selected): the seeds name --data-dir
    (run_dir / "config.json").write_text(json.dumps({**dataclasses.asdict(config),
                                                     "data_dir": None}))
    assert run_cli("reseed", str(run_dir), "--seeds", "3", "--data-dir", str(data_dir),
                   "--quiet", capsys=capsys)[0] == 0
    assert ran[-1] == dataclasses.replace(config, seed=3)


def test_patience_command(tmp_path, capsys):
    """`linmem patience`: the replay table of the runs under PATHS, also written with --out;
    bad --values and a folder without runs are one line each, exit 2."""
    run = tmp_path / "runs" / "a"
    run.mkdir(parents=True)
    rows = [{"epoch": e, "valid_acc": a, "epoch_cpu_s": 1.0, "best": b}
            for e, (a, b) in enumerate([(10, True), (12, True), (11, False), (13, True),
                                        (12, False), (11, False)], 1)]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.json").write_text(json.dumps({"patience": 2}))
    (run / "metrics.json").write_text(json.dumps({"stop_reason": "early stopping (patience 2)"}))
    out = tmp_path / "patience.md"
    code, stdout, _ = run_cli("patience", str(tmp_path / "runs"), "--values", "1", "--out",
                              str(out), capsys=capsys)
    # patience 1 stops after epoch 3 with epoch 2 (12) against epoch 4 (13): 3 of 6 epochs saved
    assert code == 0 and "| 1 | 1 | 1 | 1.00, 1.00 | 50 % |" in stdout
    assert out.read_text() == stdout
    for args in (["--values", "a,b"], ["--values", "0"]):
        code, _, err = run_cli("patience", str(tmp_path / "runs"), *args, capsys=capsys)
        assert code == 2 and err.count("\n") == 1 and "--values" in err
    (tmp_path / "empty").mkdir()
    code, _, err = run_cli("patience", str(tmp_path / "empty"), capsys=capsys)
    assert code == 2 and "no metrics.json" in err


def test_the_threshold_chosen_on_validation_is_stored_and_used(tmp_path, data_dir, capsys):
    """metrics.json stores the threshold chosen on validation with the test accuracies at it
    (global and per-frame, against a sequence-by-sequence recomputation); linmem evaluate
    scores every split at it too, and plot --prediction draws the keys at it."""
    import numpy as np

    from linmem.generate import predict_sequence

    out = tmp_path / "run"
    code, _, err = run_cli("train", "--data", "jsb", "--data-dir", str(data_dir), "--model",
                           "lmn-b", "--hidden", "8", "--memory", "6", "--batch-size", "32",
                           "--epochs", "2", "--out", str(out), "--quiet", capsys=capsys)
    assert code == 0, err
    metrics = json.loads((out / "metrics.json").read_text())
    tuned = metrics["valid_threshold"]
    assert tuned != 0.5  # two epochs in, the key rates are low: a lower threshold wins
    model, _ = load_run_model(out)
    test = load_polyphonic("jsb", root=data_dir)["test"]
    with torch.no_grad():
        probs = [torch.sigmoid(model(torch.from_numpy(np.asarray(s[:-1], np.float32))[None]))[0]
                 for s in test if len(s) >= 2]
    targets = torch.cat([torch.from_numpy(np.asarray(s[1:], np.float32))
                         for s in test if len(s) >= 2]).double()
    probs = torch.cat(probs).double()
    assert metrics["test_acc_frame_at_valid_threshold"] == pytest.approx(
        100 * frame_accuracy(probs, targets, threshold=tuned, average="frame"), rel=1e-6)
    assert metrics["test_acc_at_valid_threshold"] == pytest.approx(
        100 * frame_accuracy(probs, targets, threshold=tuned), rel=1e-6)
    code, stdout, err = run_cli("evaluate", str(out), "--data-dir", str(data_dir), "--split",
                                "test", capsys=capsys)
    assert code == 0, err
    scored = json.loads(stdout)
    assert scored["run_threshold"] == tuned
    assert scored["test"]["acc_at_run_threshold"] == pytest.approx(
        metrics["test_acc_at_valid_threshold"], rel=1e-9)
    assert scored["test"]["acc_frame_at_run_threshold"] == pytest.approx(
        metrics["test_acc_frame_at_valid_threshold"], rel=1e-9)
    lines = predict_sequence(out, "test:0", tmp_path / "p.png", str(data_dir))
    assert any(f"at threshold {tuned:g}" in line for line in lines)


def test_linmem_train_trains_saves_and_evaluates_the_input_path(tmp_path, data_dir, capsys):
    out = tmp_path / "run"
    common = ["--data", "jsb", "--data-dir", str(data_dir), "--hidden", "8", "--memory", "6",
              "--batch-size", "32", "--epochs", "2", "--quiet"]
    code, _, err = run_cli("train", *common, "--input-path", "gain", "--out", str(out),
                           capsys=capsys)
    assert code == 0, err
    assert json.loads((out / "config.json").read_text())["input_path"] == "gain"
    state = torch.load(out / "best.pt", weights_only=True)
    weights = state["model"] if "model" in state else state
    gain = next(v for k, v in weights.items() if k.endswith("input_path.weight"))
    assert gain.shape == (88,) and float(gain.abs().max()) > 0  # trained
    metrics = json.loads((out / "metrics.json").read_text())
    code, stdout, err = run_cli("evaluate", str(out), "--data-dir", str(data_dir),
                                "--split", "test", capsys=capsys)
    assert code == 0, err
    assert json.loads(stdout)["test"]["acc"] == pytest.approx(metrics["test_acc"], rel=1e-9)
    code, _, err = run_cli("train", *common, "--model", "lmn-b-nade", "--input-path",
                           "skip", "--out", str(tmp_path / "refused"), capsys=capsys)
    assert code == 2 and "input_path applies to the linear readouts" in err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "refused").exists()
