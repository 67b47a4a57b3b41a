"""Training protocols (issue 43): a named unit of settings, overridable field by field, and what
each setting does to an update, checked against plain arithmetic on the same model."""

import copy
import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from linmem._io import PROVENANCE_FIELDS
from linmem.batching import collate
from linmem.models import build_model
from linmem.training.config import DEFAULT_PROTOCOL, PROTOCOL_FIELDS, PROTOCOLS, TrainConfig
from linmem.training.evaluation import build_run_model
from linmem.training.selection import selection_score, selection_scores
from linmem.training.trainer import train_loop
from linmem.training.updates import make_optimizer, train_step


def test_a_protocol_sets_its_fields_and_an_explicit_value_overrides_it():
    ours, paper = TrainConfig(protocol="linmem"), TrainConfig(protocol="paper")
    assert TrainConfig().protocol == DEFAULT_PROTOCOL
    assert (ours.batch_size, ours.loss_reduction, ours.clip, ours.init_bias, ours.patience,
            ours.select) == (4, "frame", 5.0, True, 50, "acc")
    assert (paper.batch_size, paper.loss_reduction, paper.clip, paper.init_bias,
            paper.patience, paper.select) == (1, "mean", 10.0, False, 50, "acc_frame")
    assert ours.protocol_overrides() == {} and paper.protocol_overrides() == {}
    mixed = TrainConfig(protocol="paper", batch_size=4, clip=None)
    assert (mixed.batch_size, mixed.clip, mixed.loss_reduction) == (4, None, "mean")
    assert mixed.protocol_overrides() == {"batch_size": 4, "clip": None}
    with pytest.raises(ValueError, match="protocol must be one of"):
        TrainConfig(protocol="authors")
    with pytest.raises(ValueError, match="loss_reduction must be one of"):
        TrainConfig(loss_reduction="sum")
    assert set(PROTOCOL_FIELDS) <= {f for f in asdict(ours)}


def test_a_config_saved_before_protocols_loads_as_linmem_and_round_trips():
    saved = asdict(TrainConfig(protocol="paper", batch_size=2))
    assert TrainConfig.from_dict(json.loads(json.dumps(saved))) == TrainConfig(
        protocol="paper", batch_size=2)
    # linmem train's default is the paper protocol now: a config that names none is still
    # linmem's, all of its fields (a field added since at linmem's value)
    old = {k: v for k, v in asdict(TrainConfig(protocol="linmem")).items()
           if k not in ("protocol", "loss_reduction")}
    loaded = TrainConfig.from_dict(old)
    assert DEFAULT_PROTOCOL != "linmem" and loaded.protocol == "linmem"
    assert loaded.identity() == TrainConfig(protocol="linmem").identity()  # --resume: unchanged
    assert TrainConfig.from_dict({"model": "lstm"}).batch_size == PROTOCOLS["linmem"].batch_size


def _one_update(reduction: str, lr: float, weight_decay: float, clip: float | None, batch):
    config = TrainConfig(model="lmn-b", hidden=6, memory=5, loss_reduction=reduction,
                         optimizer="sgd", lr=lr, weight_decay=weight_decay, clip=clip, seed=1)
    model = build_run_model(config, [np.zeros((3, 88))])
    optimizer = make_optimizer(model.parameters(), config)
    loss = train_step(model, optimizer, batch, config.clip, config.loss_scale(88))
    return loss, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("clip", [None, 1e-3])
def test_the_mean_loss_scales_the_gradient_against_decay_and_clip(small, clip):
    """Plain SGD makes the loss's scale visible: a step on the loss averaged over the 88 keys
    with learning rate lr, weight decay wd and clip c is the step on the NLL summed over the keys
    with lr / 88, wd * 88 and clip 88 c (the paper's 1e-5 is our 8.8e-4, its clip 10 our 880)."""
    torch.set_default_dtype(torch.float64)
    try:
        batch = collate(small["train"][:2], dtype=torch.float64)
        loss_m, mean = _one_update("mean", 0.1, 1e-3, clip, batch)
        loss_f, frame = _one_update("frame", 0.1 / 88, 88e-3,
                                    None if clip is None else 88 * clip, batch)
        loss_u, unscaled = _one_update("frame", 0.1, 1e-3, clip, batch)
    finally:
        torch.set_default_dtype(torch.float32)
    assert loss_m == pytest.approx(loss_f) == pytest.approx(loss_u)  # logged in nats per step
    # clip_grad_norm_ divides by (norm + 1e-6): the one term that does not scale
    tol = dict(rtol=1e-10, atol=1e-12) if clip is None else dict(rtol=1e-5, atol=1e-8)
    for a, b in zip(mean, frame, strict=True):
        torch.testing.assert_close(a, b, **tol)
    if clip is None:  # the same lr and decay on the unscaled loss: another step
        assert any(not torch.allclose(a, b) for a, b in zip(mean, unscaled, strict=True))


def test_the_paper_protocol_keeps_the_default_readout_and_selects_per_frame(tmp_path, small):
    paper = TrainConfig(protocol="paper", model="lmn-b", hidden=8, memory=6, epochs=6, seed=2)
    built = build_run_model(paper, small["train"])
    torch.manual_seed(2)
    reference = build_model("lmn-b", 8, 6)  # nn.Linear's own initialisation
    torch.testing.assert_close(built.readout.bias, reference.readout.bias, rtol=0, atol=0)
    ours = build_run_model(TrainConfig(protocol="linmem", model="lmn-b", hidden=8, memory=6,
                                       seed=2),
                           small["train"])
    rate = np.concatenate(small["train"]).mean(0).clip(1e-3, 1 - 1e-3)
    torch.testing.assert_close(ours.readout.bias,
                               torch.tensor(np.log(rate / (1 - rate)), dtype=torch.float32))

    metrics = train_loop(paper, tmp_path / "run", progress=False, data=small)
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert len(log) == 6 and all(r["valid_acc_frame"] is not None for r in log)
    best = max(log, key=lambda r: (r["valid_acc_frame"], -r["epoch"]))
    assert metrics["best_epoch"] == best["epoch"]
    assert metrics["valid_acc_frame"] == pytest.approx(best["valid_acc_frame"])
    assert metrics["protocol"] == "paper" and metrics["protocol_overrides"] == {}
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["protocol"] == "paper" and saved["batch_size"] == 1


def test_batch_one_visits_every_sequence_once_in_an_order_that_changes(small):
    from linmem.training.updates import epoch_plan

    config = TrainConfig(protocol="paper")
    lengths = [len(s) for s in small["train"]]
    first, _ = epoch_plan(config, lengths, 1)
    second, _ = epoch_plan(config, lengths, 2)
    assert all(len(b) == 1 for b in first)
    assert sorted(i for b in first for i in b) == list(range(len(lengths)))
    assert first != second
    # not sorted by length: at batch 1 the batches' shuffle is a shuffle of the sequences
    order = [lengths[b[0]] for b in first]
    assert order != sorted(order) and order != sorted(order, reverse=True)


def test_protocols_are_documented_as_one_unit():
    for name, protocol in PROTOCOLS.items():
        assert protocol.name == name and protocol.about
        assert protocol.pruner in ("median", "none")
        copy.deepcopy(TrainConfig(protocol=name))


def test_the_command_line_takes_a_protocol_and_overrides(tmp_path, data_dir, capsys):
    from linmem.cli.commands import main

    def run(*args: str) -> int:
        try:
            main(list(args))
        except SystemExit as exit_:
            return exit_.code
        return 0

    out = tmp_path / "run"
    assert run("train", "--data", "jsb", "--data-dir", str(data_dir), "--model", "lmn-b",
               "--hidden", "4", "--memory", "4", "--epochs", "1", "--protocol", "paper",
               "--batch-size", "16", "--clip", "none", "--out", str(out), "--quiet") == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["protocol"], saved["batch_size"], saved["clip"], saved["loss_reduction"],
            saved["init_bias"], saved["select"]) == ("paper", 16, None, "mean", False,
                                                     "acc_frame")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["protocol_overrides"] == {"batch_size": 16, "clip": None}
    # --resume without the options keeps the run's protocol and overrides
    assert run("train", "--out", str(out), "--resume", "--epochs", "2", "--quiet",
               "--data-dir", str(data_dir)) == 0
    assert json.loads((out / "config.json").read_text())["batch_size"] == 16
    capsys.readouterr()


def test_a_search_under_the_paper_protocol_has_its_own_studies_and_no_pruner():
    from linmem.experiments.grids import study_name
    from linmem.experiments.search import SearchConfig

    paper = SearchConfig(base=TrainConfig(protocol="paper"))
    assert paper.pruner == "none"
    # a search trains as linmem train does: its default protocol, the paper's
    assert SearchConfig().base.protocol == TrainConfig().protocol == "paper"
    assert SearchConfig().pruner == "none"
    assert SearchConfig(base=TrainConfig(protocol="linmem")).pruner == "median"
    assert SearchConfig(base=TrainConfig(protocol="paper"), pruner="median").pruner == "median"
    assert study_name("jsb", "lmn-b", "paper", "linmem") == "jsb-lmn-b-paper"  # the existing
    assert study_name("jsb", "lmn-b", "paper", "paper") == "jsb-lmn-b-paper@paper"
    assert study_name("piano", "lmn-b", "paper-long", "paper", {"clip": 0.0568}) == \
        "piano-lmn-b-paper-long@paper+clip=0.0568"
    assert study_name("piano", "lmn-b", "paper-long", "paper",  # the guide's, with the bound
                      {"clip": 0.0568, "memory_bound": 0.99}) == \
        "piano-lmn-b-paper-long@paper+clip=0.0568+memory_bound=0.99"
    assert study_name("jsb", "lstm", "paper", "paper", {"select": "nll", "batch_size": 4}) == \
        "jsb-lstm-paper@paper+batch_size=4+select=nll"


def test_paper_protocol_studies_are_reported_apart_and_selected_per_column(tmp_path, data_dir,
                                                                           capsys):
    """A storage holding both protocols' studies: each report sees its own; a paper study's
    runs stop on the per-frame accuracy, its global column is selected on the global validation
    accuracy and its per-frame column on the per-frame one, from the trials' own scores."""
    from linmem.cli.commands import main
    from linmem.experiments.studies import search_records, storage_protocol

    out = tmp_path / "s"
    for protocol in ("linmem", "paper"):
        main(["search", "--grid", "tiny", "--model", "lmn-b", "--subset", "6", "--epochs", "3",
              "--protocol", protocol, "--memory-bound", "none", "--data-dir", str(data_dir),
              "--out", str(out), "--quiet"])  # unbounded whatever the layer's default
    capsys.readouterr()
    storage = f"sqlite:///{out / 'search.db'}"
    ours, = search_records(storage, "tiny", protocol="linmem")
    paper, = search_records(storage, "tiny", protocol="paper")
    # a report or progress of a storage of both must be told which (each alone reads its own)
    with pytest.raises(ValueError, match="trained under linmem and paper: name one with"):
        storage_protocol(storage, "tiny")
    with pytest.raises(SystemExit) as exit_:
        main(["report", "--storage", storage, "--grid", "tiny", "--runs-root", str(tmp_path),
              "--out", str(tmp_path / "r")])
    assert exit_.value.code == 2 and "name one with --protocol" in capsys.readouterr().err
    assert ours["study"] == "jsb-lmn-b-tiny" and "protocol" not in ours
    assert paper["study"] == "jsb-lmn-b-tiny@paper" and paper["protocol"] == "paper"
    assert len(search_records(storage, "tiny", protocol=None)) == 2
    trials = paper["trials_run"]
    assert len(trials) == 4 and all(t["valid_acc_frame"] is not None for t in trials)
    best_global = max(trials, key=lambda t: (t["valid_acc"], -t["number"]))
    best_frame = max(trials, key=lambda t: (t["valid_acc_frame"], -t["number"]))
    assert paper["valid_acc"] == pytest.approx(best_global["valid_acc"])
    assert paper["frame_selection"]["valid_acc_frame"] == pytest.approx(
        best_frame["valid_acc_frame"])
    # with its run's provenance, as its metrics.json records it
    frame_metrics = json.loads((out / "jsb-lmn-b-tiny@paper" / best_frame["point"]
                                / "metrics.json").read_text())
    assert {k: paper["frame_selection"][k] for k in PROVENANCE_FIELDS} == {
        k: frame_metrics[k] for k in PROVENANCE_FIELDS}
    for t in trials:  # each run kept the epoch of its best per-frame validation accuracy
        run = out / "jsb-lmn-b-tiny@paper" / t["point"]
        log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
        metrics = json.loads((run / "metrics.json").read_text())
        assert metrics["best_epoch"] == max(log, key=lambda r: (r["valid_acc_frame"],
                                                                -r["epoch"]))["epoch"]
        assert json.loads((run / "config.json").read_text())["batch_size"] == 1
        # the best score the trial reported, named for what it is (a per-frame accuracy)
        assert t["best_intermediate_valid_acc_frame"] == pytest.approx(
            max(r["valid_acc_frame"] for r in log))
        assert t["best_intermediate_valid_nll"] is None and t["best_intermediate_valid_acc"] is None
    # the report keeps each column's selected run (the per-frame one apart where it differs)
    from linmem.experiments.report import write_search_report

    write_search_report([paper], tmp_path / "report", "test", runs_root=".")
    selected = tmp_path / "report" / "selected"
    assert (selected / "jsb-lmn-b" / "metrics.json").is_file()
    frame_run = paper["frame_selection"]["run_dir"]
    assert (selected / "jsb-lmn-b-per-frame").is_dir() == (frame_run != paper["run_dir"])


def test_the_protocols_table_sets_both_selections_side_by_side():
    """protocols.md: per data set and model the paper's figure, ours under each protocol (the
    per-frame column from its own selection, the global one from the record's), incomplete
    grids marked, models run under neither protocol left out."""
    from linmem.experiments.both_protocols import protocols_markdown
    from linmem.experiments.paper import PAPER_TABLE2

    def record(model, test, frame, complete=True):
        return {"dataset": "jsb", "model": model, "test_acc": test, "grid": "paper",
                "grid_complete": complete, "frame_selection": {"test_acc_frame": frame}}

    diverged = {"dataset": "jsb", "model": "lmn-a", "grid": "paper", "grid_complete": True,
                "points_done": 0, "points_failed": 30}  # every point failed: no score
    text = protocols_markdown([record("lmn-b", 29.82, 33.78), record("lstm", 29.25, 33.52,
                                                                     complete=False), diverged],
                              [record("lmn-b", 28.20, 31.51), record("rnn", 26.67, 29.40)],
                              "linmem report --compare x")
    rows = {line.split("|")[2].strip(): line for line in text.splitlines()
            if line.startswith("| JSB Chorales")}
    assert set(rows) == {"LMN-B", "LSTM", "RNN", "LMN-A"}
    assert rows["LMN-A"].endswith("| ✗ | ✗ | – | – |") and "✗: every point of the grid" in text
    assert rows["LMN-B"] == (f"| JSB Chorales | LMN-B | {PAPER_TABLE2['lmn-b'][0]:.2f} | 33.78 | "
                             "29.82 | 31.51 | 28.20 |")
    assert "| 33.52† | 29.25† | – | – |" in rows["LSTM"]
    assert "| – | – | 29.40 | 26.67 |" in rows["RNN"]
    assert text.rstrip().endswith("Made by `linmem report --compare x`.")
    # these LMN records carry no bound: the table says they are the paper's unbounded memory
    assert "An LMN row whose name gives no bound has the paper's unbounded memory" in text
    bounded = [{**record("lmn-b", 29.82, 33.78), "memory_bound": 0.99}]
    assert "unbounded memory" not in protocols_markdown(bounded, [record("rnn", 26.67, 29.40)])


@pytest.mark.parametrize("select", ["acc", "acc_frame", "nll"])
def test_one_rule_chooses_a_runs_checkpoint_and_a_searchs_point(tmp_path, small, select):
    """The epoch a run keeps (``best.pt``) is the one whose log row has the highest
    :func:`selection_score` (the NLL's negated), the score a search's trial reports; and its
    inverse gives the search's stored objective back as that validation score."""
    config = TrainConfig(protocol="linmem", model="lmn-b", hidden=6, memory=6, batch_size=6,
                         epochs=4, patience=10, seed=1, lr=0.02, select=select)
    metrics = train_loop(config, tmp_path / "run", progress=False, data=small)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    scores = [selection_score(r, select, "valid_") for r in rows]
    assert len(set(scores)) > 1  # the epochs differ, so the choice means something
    assert metrics["best_epoch"] == rows[int(np.argmax(scores))]["epoch"]
    name = f"valid_{select}"
    assert scores[0] == (-rows[0][name] if select == "nll" else rows[0][name])
    assert selection_scores(scores[0], select) == {name: rows[0][name]}
    with pytest.raises(ValueError, match="select must be one of"):
        selection_score(rows[0], "loss", "valid_")
