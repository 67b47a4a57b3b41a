"""linmem.experiments.analyses: the replay of a run's first updates, checked against the trainer's
own first epoch, Adam's closed-form first step and numpy's eigenvalues."""

import json

import numpy as np
import pytest
import torch

from linmem.cli.commands import main
from linmem.data import data_checksum
from linmem.experiments.analyses import first_updates, recurrent_radius, relative_change
from linmem.models import build_model
from linmem.training.config import TrainConfig
from linmem.training.evaluation import build_run_model, evaluate, load_run_model
from linmem.training.trainer import train_loop
from linmem.training.updates import epoch_plan, training_batch


@pytest.mark.parametrize("options", [{}, {"chunk": 40, "transpose": 2}])
def test_replaying_an_epoch_of_updates_gives_the_trainers_first_epoch(tmp_path, jsb, options,
                                                                     data_dir, monkeypatch):
    """The replay takes the trainer's batches in its order: replaying as many updates as the
    first epoch holds ends on the model the trainer had after it (the same validation
    scores), and the losses' frame-weighted mean is the epoch's training NLL. Data given in
    memory is vouched for by no file's checksum, even where $LINMEM_DATA holds the data set."""
    monkeypatch.setenv("LINMEM_DATA", str(data_dir))
    config = TrainConfig(data="jsb", model="rnn", hidden=8, batch_size=32, epochs=1,
                         **options)
    run = tmp_path / "run"
    train_loop(config, run, progress=False, data=jsb)
    epoch = json.loads((run / "log.jsonl").read_text().splitlines()[0])

    seqs = [s for s in jsb["train"] if len(s) >= 2]
    batches, shifts = epoch_plan(config, [len(s) for s in seqs], 1)
    frames = []  # each update's frames, counted here from the batches themselves
    for idx in batches:
        batch = training_batch(seqs, idx, shifts, config)
        parts = [batch] if config.chunk is None else list(batch.windows(config.chunk))
        frames += [float(part.mask.sum()) for part in parts]

    result = first_updates(run, updates=len(frames), start="random", data=jsb)
    (replay,) = result["replays"]
    assert len(replay["losses"]) == len(frames) and replay["finite"]
    assert replay["lr"] == config.lr
    mean = np.dot(replay["losses"], frames) / sum(frames)
    assert mean == pytest.approx(epoch["train_nll"], rel=1e-6)
    assert replay["valid_acc"] == pytest.approx(epoch["valid_acc"], rel=1e-6)
    assert replay["valid_nll"] == pytest.approx(epoch["valid_nll"], rel=1e-6)
    assert result["data_sha256"] is None  # data given in memory: no file to vouch for


def test_adams_first_update_moves_every_weight_by_the_learning_rate(tmp_path, jsb):
    """Adam's step 1 is lr * g / (|g| + eps): every weight with a gradient moves by lr, so a
    matrix of n entries moves by lr * sqrt(n) in Frobenius norm, whatever its own size."""
    config = TrainConfig(data="jsb", model="rnn", hidden=8, batch_size=32, epochs=1,
                         weight_decay=0.0)
    run = tmp_path / "run"
    train_loop(config, run, progress=False, data=jsb)
    lr = 3e-3
    result = first_updates(run, updates=1, lrs=[lr], start="random", data=jsb)
    start = build_run_model(config, [s for s in jsb["train"] if len(s) >= 2])
    change = result["replays"][0]["change_first"]
    assert set(change) == {name for name, _ in start.named_parameters()}
    # every entry of these has a gradient (W^ih's columns of keys no batch plays have none)
    for name in ("core.weight_hh_l0", "core.bias_ih_l0", "core.bias_hh_l0", "readout.weight",
                 "readout.bias"):
        weight = dict(start.named_parameters())[name]
        moved = change[name] * float(weight.detach().norm())
        assert moved == pytest.approx(lr * np.sqrt(weight.numel()), rel=1e-3), name


def test_recurrent_radius_is_numpys_spectral_radius():
    torch.manual_seed(0)
    rnn = build_model("rnn", 6, input_size=5)
    expected = np.abs(np.linalg.eigvals(rnn.core.weight_hh_l0.detach().double().numpy())).max()
    assert recurrent_radius(rnn) == pytest.approx(expected, rel=1e-10)
    lmn = build_model("lmn-b", 4, 7, input_size=5, memory_bound=None)
    expected = np.abs(np.linalg.eigvals(lmn.core.weight_mm_l0.detach().double().numpy())).max()
    assert recurrent_radius(lmn) == pytest.approx(expected, rel=1e-10)
    assert recurrent_radius(build_model("lstm", 6, input_size=5)) is None
    # a bounded memory: the matrix eq. (7) uses, W^mm * 0.5 / ||W^mm||_2, not the parameter
    bounded = build_model("lmn-b", 4, 7, input_size=5, memory_bound=0.5)
    with torch.no_grad():
        bounded.core.weight_mm_l0.mul_(10)
    raw = bounded.core.weight_mm_l0.detach().double().numpy()
    used = raw * 0.5 / np.linalg.norm(raw, 2)  # rescaled by the exact norm; the layer's
    exact_radius = np.abs(np.linalg.eigvals(used)).max()  # certified one is at most 1e-3 above
    assert exact_radius / (1 + 1e-3) <= recurrent_radius(bounded) <= exact_radius * (1 + 1e-6)
    assert recurrent_radius(bounded) < 0.5 * (1 + 1e-6) < np.abs(np.linalg.eigvals(raw)).max()


def test_relative_change():
    torch.manual_seed(0)
    a = build_model("rnn", 3, input_size=4)
    b = build_model("rnn", 3, input_size=4)
    b.load_state_dict(a.state_dict())
    assert all(v == 0 for v in relative_change(b, a).values())
    with torch.no_grad():
        b.core.weight_hh_l0.mul_(1.5)
        b.core.bias_hh_l0.zero_()
        a.core.bias_hh_l0.zero_()
        b.readout.bias.add_(1.0)
    change = relative_change(b, a)
    assert change["core.weight_hh_l0"] == pytest.approx(0.5)
    assert change["core.bias_hh_l0"] is None  # the reference is zero: no relative size
    expected = 1.0 * np.sqrt(a.readout.bias.numel()) / float(a.readout.bias.detach().norm())
    assert change["readout.bias"] == pytest.approx(expected, rel=1e-6)


def test_first_updates_of_a_pretrained_run_and_the_command(tmp_path, data_dir, jsb):
    run = tmp_path / "prnn"
    main(["pretrain", "--model", "pret-rnn", "--data", "jsb", "--data-dir", str(data_dir),
          "--hidden", "12", "--epochs", "1", "--batch-size", "32", "--out", str(run), "--quiet"])
    init, _ = load_run_model(run, "init")
    scores = evaluate(init, jsb["valid"], thresholds=())
    out = tmp_path / "onset"
    main(["first-updates", str(run), "--updates", "3", "--lr", "1e-3", "--lr", "1e-4",
          "--data-dir", str(data_dir), "--out", str(out)])
    (result,) = json.loads((out / "first-updates.json").read_text())
    assert result["start"] == "init" and result["model"] == "pret-rnn"
    assert result["initial"]["valid_acc"] == pytest.approx(100 * scores["acc"], rel=1e-9)
    assert result["initial"]["radius"] == pytest.approx(recurrent_radius(init), rel=1e-9)
    assert [r["lr"] for r in result["replays"]] == [1e-3, 1e-4]
    assert all(len(r["losses"]) == 3 == len(r["radii"]) for r in result["replays"])
    # a ten times smaller step changes the weights about ten times less
    ratio = (result["replays"][0]["change_first"]["core.weight_ih_l0"]
             / result["replays"][1]["change_first"]["core.weight_ih_l0"])
    assert ratio == pytest.approx(10, rel=0.05)
    assert result["data_sha256"] == data_checksum("jsb", data_dir)
    table = (out / "first-updates.md").read_text()
    assert table.count(f"| {tmp_path.name}/prnn | init |") == 2


def test_first_updates_refuses_what_it_cannot_replay(tmp_path, jsb, data_dir):
    run = tmp_path / "run"
    train_loop(TrainConfig(data="jsb", model="rnn", hidden=4, batch_size=64, epochs=1), run,
               progress=False, data=jsb)
    with pytest.raises(FileNotFoundError, match=r"has no init\.pt: only a pretrained run"):
        first_updates(run, data=jsb)
    with pytest.raises(ValueError, match="start must be one of"):
        first_updates(run, start="pretrained", data=jsb)
    with pytest.raises(ValueError, match="updates must be positive"):
        first_updates(run, updates=0, start="random", data=jsb)
    with pytest.raises(FileNotFoundError, match="not a run directory"):
        first_updates(tmp_path / "nothing", data=jsb)
    with pytest.raises(SystemExit) as exit_:  # the command's usage error: the same message
        main(["first-updates", str(run), "--data-dir", str(data_dir)])
    assert exit_.value.code == 2


def test_replaying_the_epoch_after_the_last_checkpoint_is_the_trainers_next_epoch(
        tmp_path, jsb, data_dir):
    """epoch_replay starts from last.pt's weights and Adam's state and takes the trainer's
    batches of the next epoch: its losses' frame-weighted mean is the training NLL the trainer
    logged for that epoch when the run went on, and its first gradient norm is the one
    computed here by hand from last.pt's model. Another clip leaves the first update's
    gradient as it is and changes the later ones."""
    from linmem.experiments.analyses import epoch_replay
    from linmem.training.runs import LAST, load_checkpoint

    config = TrainConfig(data="jsb", model="lmn-b", hidden=6, memory=6, batch_size=32,
                         epochs=1, protocol="paper", clip=0.01, loss_reduction="mean")
    run, longer = tmp_path / "run", tmp_path / "longer"
    train_loop(config, run, progress=False, data=jsb)
    train_loop(config, longer, progress=False, data=jsb)
    train_loop(TrainConfig(**{**config.__dict__, "epochs": 2}), longer, resume=True, progress=False,
               data=jsb)
    second = json.loads((longer / "log.jsonl").read_text().splitlines()[1])
    assert second["epoch"] == 2

    result = epoch_replay(run, clips=(0.01, None), data=jsb)
    assert result["epoch"] == 2 and result["data_sha256"] is None
    own, free = result["replays"]
    assert own["finite"] and free["finite"] and own["clip"] == 0.01 and free["clip"] is None
    rows = own["updates"]
    assert len(rows) == len(epoch_plan(config, [len(s) for s in jsb["train"]], 2)[0])
    mean = sum(r["loss"] * r["frames"] for r in rows) / sum(r["frames"] for r in rows)
    assert mean == pytest.approx(second["train_nll"], rel=1e-6)

    model, _ = load_run_model(run, "last")
    seqs = [s for s in jsb["train"] if len(s) >= 2]
    batches, shifts = epoch_plan(config, [len(s) for s in seqs], 2)
    batch = training_batch(seqs, batches[0], shifts, config)
    model.train()
    (model.training_loss(batch) / 88).backward()
    norm = np.sqrt(sum(float((p.grad.double() ** 2).sum()) for p in model.parameters()))
    assert rows[0]["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert free["updates"][0]["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert rows[0]["grad_norm"] > 0.01  # so the clip acted, and the replays part after it
    assert free["updates"][1]["grad_norm"] != pytest.approx(rows[1]["grad_norm"], rel=1e-6)
    # the checkpoint is untouched by the replays (Adam's moments are copied, not shared)
    state = load_checkpoint(run / LAST, "cpu")["optimizer"]["state"]
    assert int(state[0]["step"]) == len(rows)


def test_replay_epoch_command_and_a_diverging_epoch(tmp_path, jsb, data_dir):
    """The command writes every update and the table; an epoch whose loss or gradient stops
    being finite ends there, and the table says at which update and which of the two."""
    from linmem.experiments.analyses import epoch_replay, epoch_replay_markdown

    run = tmp_path / "run"
    train_loop(TrainConfig(data="jsb", model="lmn-b", hidden=8, memory=8, batch_size=64, epochs=1,
                      clip=None, memory_bound=None), run, progress=False, data=jsb)
    out = tmp_path / "replay"
    main(["replay-epoch", str(run), "--clip", "none", "--clip", "2", "--data-dir",
          str(data_dir), "--out", str(out)])
    (result,) = json.loads((out / "replay-epoch.json").read_text())
    assert [r["clip"] for r in result["replays"]] == [None, 2.0]
    assert result["data_sha256"] == data_checksum("jsb", data_dir)
    table = (out / "replay-epoch.md").read_text()
    assert "| none |" in table and "| 2 |" in table and table.count("the epoch's end") == 2

    # a memory that doubles every step overflows float32 within JSB's longer sequences
    ckpt = torch.load(run / "last.pt", weights_only=False)
    ckpt["model"]["core.weight_mm_l0"] = 2 * torch.eye(8)
    torch.save(ckpt, run / "last.pt")
    blown = epoch_replay(run, data=jsb)
    (replay,) = blown["replays"]
    assert not replay["finite"] and len(replay["updates"]) >= 1
    text = epoch_replay_markdown([blown])
    assert f"not finite at update {len(replay['updates'])}" in text

    with pytest.raises(SystemExit) as exit_:
        main(["replay-epoch", str(run), "--clip", "-1", "--data-dir", str(data_dir)])
    assert exit_.value.code == 2
    with pytest.raises(FileNotFoundError, match=r"no last\.pt"):
        epoch_replay(tmp_path / "nothing", data=jsb)


def test_replay_epoch_leaves_out_an_update_and_probes_the_functional_units(tmp_path, jsb,
                                                                            data_dir):
    """With update 1 left out, update 2 starts from last.pt's model: its loss and saturated
    units are those computed by hand on the second batch. Without it, the loop gain after
    update 1 is that of the model one Adam step taken by hand leaves."""
    from linmem.experiments.analyses import epoch_replay, epoch_replay_markdown
    from linmem.nn.diagnostics import memory_loop_gains, saturated_fraction
    from linmem.training.runs import LAST, load_checkpoint
    from linmem.training.updates import batch_updates, make_optimizer

    config = TrainConfig(data="jsb", model="lmn-a", hidden=6, memory=5, batch_size=32,
                         epochs=1, protocol="paper", loss_reduction="mean", memory_bound=0.5)
    run = tmp_path / "run"
    train_loop(config, run, progress=False, data=jsb)
    seqs = [s for s in jsb["train"] if len(s) >= 2]
    batches, shifts = epoch_plan(config, [len(s) for s in seqs], 2)
    first, second = (training_batch(seqs, b, shifts, config) for b in batches[:2])

    left_out = epoch_replay(run, data=jsb, skip=[1])
    (replay,) = left_out["replays"]
    rows = replay["updates"]
    assert replay["finite"] and replay["skipped"] == [1] and len(rows) == len(batches)
    assert rows[0] == {"update": 1, "skipped": True, "steps": int(first.mask.sum(1).max()),
                       "frames": int(first.mask.sum())}
    model, _ = load_run_model(run, "last")
    model.train()
    with torch.no_grad():
        loss = float(model.training_loss(second))
    assert rows[1]["loss"] == pytest.approx(loss, rel=1e-6)
    saturated = saturated_fraction(model.core, second.inputs, second.mask)
    assert rows[1]["saturated"] == pytest.approx(saturated, abs=1e-12)

    optimizer = make_optimizer(model.parameters(), config)
    optimizer.load_state_dict(load_checkpoint(run / LAST, "cpu")["optimizer"])
    list(batch_updates(model, optimizer, first, config))
    gain = memory_loop_gains(model.state_dict(), "tanh", 0.5)[0]
    assert gain != pytest.approx(memory_loop_gains(model.state_dict(), "tanh")[0], rel=1e-3)
    taken = epoch_replay(run, data=jsb)["replays"][0]["updates"]
    assert "skipped" not in taken[0] and taken[0]["loop_gain"] == pytest.approx(gain, rel=1e-9)
    assert taken[1]["loss"] != pytest.approx(rows[1]["loss"], rel=1e-6)
    text = epoch_replay_markdown([left_out], tail=3)
    assert "(update 1 left out)" in text
    median = np.median([u["grad_norm"] for u in rows[1:]])
    first = rows[1:4]  # the first three updates taken: frame-weighted loss, mean saturation
    loss = sum(u["loss"] * u["frames"] for u in first) / sum(u["frames"] for u in first)
    saturated = sum(u["saturated"] for u in first) / 3
    assert f"| {median:.3g} |" in text and f"| {loss:.3g}, {saturated:.1%}, " in text

    with pytest.raises(ValueError, match=r"epoch 2 has \d+ updates, not 99"):
        epoch_replay(run, data=jsb, skip=[99])
    chunked = tmp_path / "chunked"
    train_loop(TrainConfig(**{**config.__dict__, "chunk": 50}), chunked, progress=False, data=jsb)
    with pytest.raises(ValueError, match="one update per batch"):
        epoch_replay(chunked, data=jsb, skip=[1])
    with pytest.raises(SystemExit) as exit_:
        main(["replay-epoch", str(run), "--skip-update", "0", "--data-dir", str(data_dir)])
    assert exit_.value.code == 2


def test_first_updates_say_where_the_validation_overflows(tmp_path, jsb):
    """Piano-midi.de's LMN-A diverged in its first epoch: replayed, its memory's radius passes 1
    and the validation's long sequences overflow. The scores are then None and the table says
    'not finite', where the replay had ended with an error."""
    from linmem.experiments.analyses import first_updates_markdown

    long = {"train": jsb["train"][:24], "valid": [np.concatenate(jsb["valid"][:30])],
            "test": jsb["test"][:2]}  # one validation sequence of 1792 steps
    run = tmp_path / "lmna"
    train_loop(TrainConfig(protocol="linmem", data="jsb", model="lmn-a", hidden=4, memory=4,
                      batch_size=64, epochs=1, memory_bound=None),  # as that run: unbounded
               run, progress=False, data=long)
    calm, steep = (first_updates(run, updates=1, lrs=[lr], start="random", data=long)
                   for lr in (0.3, 1.0))
    assert calm["replays"][0]["radii"][0] < 1 and calm["replays"][0]["valid_acc"] is not None
    (replay,) = steep["replays"]  # Adam's first step of 1.0 a weight: the radius past 1
    assert replay["radii"][0] > 1.2 and replay["losses"][0] is not None  # the training finite
    assert replay["valid_acc"] is None and replay["valid_nll"] is None
    assert "NaN or inf on a batch of sequences of up to 1791 steps" in replay["valid_not_finite"]
    assert steep["initial"]["valid_acc"] is not None  # the initial weights score
    row = first_updates_markdown([steep]).splitlines()[2]
    assert f"| {run.parent.name}/lmna | random | 1 | 0.00 / 10.34 | not finite | 0.4331 | " in row
