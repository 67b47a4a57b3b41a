"""Generation and MIDI: step-by-step sampling against re-running the whole prefix, determinism,
sampling frequencies; piano rolls through MIDI and back."""

import numpy as np
import pretty_midi
import pytest
import torch

from linmem.data import STEP_SECONDS, step_seconds
from linmem.generate import generate
from linmem.midi import midi_to_roll, roll_to_midi
from linmem.models import build_model


def models():
    torch.manual_seed(0)
    return {"lmn-b": build_model("lmn-b", 12, 9).double(),
            "lstm": build_model("lstm", 10).double(),
            "ulm": build_model("ulm", 8, k=3).double(),
            "rnn-rbm": build_model("rnn-rbm", 10, rbm_hidden=12).double()}


@pytest.mark.parametrize("name", ["lmn-b", "lstm", "ulm", "rnn-rbm"])
def test_each_step_equals_rerunning_the_whole_prefix(name, jsb):
    """The state carried from step to step gives what the model computes on the whole
    sequence: the same key probabilities (RNN-RBM: the same RBM biases) to 1e-6."""
    model = models()[name].eval()
    prime = torch.tensor(jsb["test"][3][:20], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    seq, state, step = prime, None, prime[None]
    with torch.no_grad():
        for _ in range(12):
            frame, state, params = model.generation_step(step, state, 1.0, gen)
            if name == "rnn-rbm":
                b_v, b_h = model.step_biases(seq[None])
                torch.testing.assert_close(params[0], b_v[:, -1], rtol=0, atol=1e-6)
                torch.testing.assert_close(params[1], b_h[:, -1], rtol=0, atol=1e-6)
            else:
                whole = torch.sigmoid(model(seq[None])[:, -1])
                torch.testing.assert_close(params, whole, rtol=0, atol=1e-6)
            assert set(frame.unique().tolist()) <= {0.0, 1.0}
            seq, step = torch.cat([seq, frame]), frame[:, None]


@pytest.mark.parametrize("name", ["lmn-b", "rnn-rbm"])
def test_generation_is_deterministic_per_seed(name, jsb):
    model = models()[name]
    prime = jsb["test"][0][:16]
    runs = [generate(model, prime, 25, generator=torch.Generator().manual_seed(s))
            for s in (7, 7, 8)]
    assert runs[0].shape == (25, 88) and runs[0].dtype == np.uint8
    assert np.array_equal(runs[0], runs[1]) and not np.array_equal(runs[0], runs[2])


def test_sampled_key_rates_match_the_model_probabilities(jsb):
    """At temperature 1 the keys switched on along a long continuation occur at the rate of the
    probabilities the model gave them along the same path (within 4 standard errors)."""
    model = models()["lmn-b"].eval()
    gen = torch.Generator().manual_seed(3)
    state, step = None, torch.tensor(jsb["test"][1][:10], dtype=torch.float64)[None]
    frames, probs = [], []
    with torch.no_grad():
        for _ in range(1500):
            frame, state, p = model.generation_step(step, state, 1.0, gen)
            frames.append(frame[0])
            probs.append(p[0])
            step = frame[:, None]
    frames, probs = torch.stack(frames), torch.stack(probs)
    n = frames.numel()
    se = float((probs * (1 - probs)).sum().sqrt() / n)
    assert abs(float(frames.mean() - probs.mean())) < 4 * se
    cold = generate(model, jsb["test"][1][:10], 300, temperature=0.3,
                    generator=torch.Generator().manual_seed(3))
    assert cold.mean() < frames.mean().item()  # a low temperature keeps fewer unlikely keys
    with pytest.raises(ValueError, match="temperature"):
        generate(model, jsb["test"][1][:10], 3, temperature=0)
    with pytest.raises(ValueError, match="prime"):
        generate(model, np.zeros((0, 88)), 3)


def test_roll_midi_round_trip_is_exact_on_the_data_sets(jsb, data_dir):
    from linmem.data import load_polyphonic

    for name, data in (("jsb", jsb), ("nottingham", load_polyphonic("nottingham",
                                                                    root=data_dir))):
        for roll in data["valid"][:5]:
            midi = roll_to_midi(roll, step_seconds(name))
            back = midi_to_roll(midi, STEP_SECONDS[name], n_steps=len(roll))
            assert np.array_equal(back, roll)


def test_a_file_written_by_pretty_midi_gives_the_expected_roll(tmp_path):
    """A MIDI file made with pretty_midi alone (not by roll_to_midi), at 0.25 s per frame."""
    midi = pretty_midi.PrettyMIDI()
    piano = pretty_midi.Instrument(program=0)
    piano.notes += [pretty_midi.Note(90, 60, 0.0, 0.5),      # C4, frames 0-1
                    pretty_midi.Note(90, 64, 0.49, 1.01),    # E4, rounded to frames 2-3
                    pretty_midi.Note(90, 21, 1.0, 1.05),     # A0, shorter than a frame: frame 4
                    pretty_midi.Note(90, 120, 0.0, 1.0)]     # above C8: left out
    drums = pretty_midi.Instrument(program=0, is_drum=True)
    drums.notes.append(pretty_midi.Note(90, 40, 0.0, 2.0))
    midi.instruments += [piano, drums]
    midi.write(str(tmp_path / "x.mid"))
    roll = midi_to_roll(tmp_path / "x.mid", 0.25)
    expected = np.zeros((5, 88), np.uint8)
    expected[0:2, 60 - 21] = 1
    expected[2:4, 64 - 21] = 1
    expected[4, 0] = 1
    assert np.array_equal(roll, expected)
    with pytest.raises(ValueError, match="roll must be"):
        roll_to_midi(np.zeros((3, 12)), 0.25)


def test_generate_command_writes_midi_png_wav_and_its_record(tmp_path, data_dir, capsys):
    import json
    import wave

    from linmem.cli.commands import main

    run = tmp_path / "run"
    main(["train", "--data", "jsb", "--data-dir", str(data_dir), "--model", "lstm", "--hidden",
          "8", "--epochs", "1", "--batch-size", "64", "--out", str(run), "--quiet"])
    files = {ext: tmp_path / f"sample.{ext}" for ext in ("mid", "png", "wav")}
    args = ["generate", str(run), "--prime", "test:3", "--prime-steps", "16", "--steps", "20",
            "--seed", "5", "--out", str(files["mid"]), "--png", str(files["png"]), "--wav",
            str(files["wav"])]
    main(args)
    assert "16 prime frames + 20 generated" in capsys.readouterr().out
    roll = midi_to_roll(files["mid"], STEP_SECONDS["jsb"], n_steps=36)
    assert np.array_equal(roll[:16], np.asarray(__import__("linmem").load_polyphonic(
        "jsb", root=data_dir)["test"][3][:16]))
    record = json.loads(files["mid"].with_suffix(".json").read_text())
    assert record["seed"] == 5 and record["prime"] == "test:3" and record["steps"] == 20
    assert files["png"].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with wave.open(str(files["wav"])) as w:
        assert w.getframerate() == 22050 and w.getnframes() > 36 * 0.5 * 22050 * 0.9
    first = files["mid"].read_bytes()
    main([*args, "--force"])  # the same seed: the same music (written over the first)
    assert files["mid"].read_bytes() == first
    alone = tmp_path / "alone.mid"
    main([*args[:-6], "--out", str(alone), "--without-prime"])  # same seed, no png/wav
    assert np.array_equal(midi_to_roll(alone, STEP_SECONDS["jsb"], n_steps=20), roll[16:])
    assert json.loads(alone.with_suffix(".json").read_text())["midi_holds_prime"] is False
    # a MIDI file of your own as the prime, read at the run's data set's frame duration
    own = tmp_path / "own.mid"
    theirs = np.asarray(__import__("linmem").load_polyphonic("jsb", root=data_dir)["valid"][0])
    roll_to_midi(theirs[:12], STEP_SECONDS["jsb"]).write(str(own))
    main(["generate", str(run), "--prime", str(own), "--steps", "5", "--out",
          str(tmp_path / "own-continued.mid")])
    continued = midi_to_roll(tmp_path / "own-continued.mid", STEP_SECONDS["jsb"], n_steps=17)
    assert np.array_equal(continued[:12], theirs[:12])


def test_import_midi_makes_a_data_set_that_trains(tmp_path, jsb, capsys):
    """Good files are imported, a corrupt one and an empty one are named and skipped, and the
    result loads and trains like the benchmark sets."""
    import json

    from linmem.cli.commands import main
    from linmem.data import load_polyphonic

    folder = tmp_path / "mine"
    (folder / "sub").mkdir(parents=True)
    songs = jsb["train"][:8]
    for i, roll in enumerate(songs):
        roll_to_midi(roll, 0.25).write(str(folder / ("sub" if i % 2 else ".") / f"s{i}.mid"))
    (folder / "broken.mid").write_bytes(b"MThd\x00\x00\x00\x06garbage")
    pretty_midi.PrettyMIDI().write(str(folder / "empty.midi"))
    out = tmp_path / "mine.pickle"
    main(["data", "import-midi", str(folder), "--out", str(out), "--split", "0.5,0.25,0.25"])
    stdout, stderr = capsys.readouterr()
    assert "4 train, 2 valid, 2 test sequences from 10 MIDI files (2 skipped)" in stdout
    assert "skipped" in stderr and "broken.mid" in stderr and "empty.midi" in stderr
    data = load_polyphonic(str(out))
    got = sorted(r.tobytes() for split in data.values() for r in split)
    assert got == sorted(np.asarray(r, np.uint8).tobytes() for r in songs)
    main(["train", "--data", str(out), "--model", "lstm", "--hidden", "6", "--epochs", "1",
          "--out", str(tmp_path / "run"), "--quiet"])
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["dataset"] == str(out.resolve()) and len(metrics["data_sha256"]) == 64
    (tmp_path / "few").mkdir()
    from linmem.data import DataError
    from linmem.midi import import_midi_folder

    with pytest.raises(DataError, match="0 usable MIDI files of 0"):
        import_midi_folder(tmp_path / "few", tmp_path / "x.pickle")


def test_plots_of_a_run(tmp_path, data_dir, capsys):
    """`linmem plot RUN` draws the three training curves (both accuracies, the one the run
    selected on named); `--prediction test:0` the truth, the probabilities and the outcome of
    each key at the run's threshold from validation, whose counts are those of the metric."""
    import json

    from linmem.cli.commands import main
    from linmem.experiments.plots import plot_run
    from linmem.generate import predict_sequence

    run = tmp_path / "run"
    main(["train", "--data", "jsb", "--data-dir", str(data_dir), "--model", "lmn-b", "--hidden",
          "6", "--memory", "5", "--epochs", "3", "--batch-size", "64", "--out", str(run),
          "--quiet"])
    main(["plot", str(run)])
    main(["plot", str(run), "--prediction", "test:0"])
    assert "curves.png" in capsys.readouterr().out
    for name in ("curves.png", "prediction-test-0.png"):
        assert (run / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot_run(run, tmp_path / "c.png") == [  # the default protocol's selection score
        "training nll", "validation NLL (nats per step)",
        "validation accuracy (%), per-frame mean selects"]
    config = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**config, "select": "acc"}))
    assert plot_run(run, tmp_path / "c.png")[2] == ("validation accuracy (%), global (Bay et "
                                                    "al.) selects")
    titles = predict_sequence(run, "test:0", tmp_path / "p.png")
    assert titles[0] == "truth (next frames)" and titles[1] == "predicted key probabilities"
    tuned = json.loads((run / "metrics.json").read_text())["valid_threshold"]
    assert titles[2].startswith(f"at threshold {tuned:g}: right")
    with pytest.raises(FileNotFoundError, match=r"log\.jsonl"):
        plot_run(tmp_path, tmp_path / "x.png")


def test_plot_of_a_nade_run_selected_on_nll(tmp_path):
    """A run selected on NLL logs no accuracy per epoch: two panels, the selected epoch the one
    that wrote best.pt."""
    import json

    from linmem.experiments.plots import plot_run

    run = tmp_path / "run"
    run.mkdir()
    rows = [{"epoch": 1, "train_nll": 9.0, "valid_acc": None, "valid_nll": 8.0, "best": True},
            {"epoch": 2, "train_nll": 8.0, "valid_acc": None, "valid_nll": 7.5, "best": True},
            {"epoch": 3, "train_nll": 7.0, "valid_acc": None, "valid_nll": 7.7, "best": False}]
    (run / "log.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert plot_run(run, tmp_path / "c.png") == ["training nll",
                                                  "validation NLL (nats per step)"]
    assert (tmp_path / "c.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_your_own_music_keeps_its_tempo_from_import_to_generation(tmp_path, jsb, capsys):
    """Imported at 0.5 s a frame, a data set keeps that step: the runs on it record it, and
    `generate` writes its MIDI and reads a .mid prime at it (`--step-seconds` overrides it)."""
    import json

    from linmem.cli.commands import main

    folder = tmp_path / "mine"
    folder.mkdir()
    for i, roll in enumerate(jsb["train"][:6]):
        roll_to_midi(roll, 0.5).write(str(folder / f"s{i}.mid"))
    data = tmp_path / "mine.pickle"
    main(["data", "import-midi", str(folder), "--out", str(data), "--step-seconds", "0.5"])
    from linmem.data import load_polyphonic, step_seconds

    assert step_seconds(str(data)) == 0.5
    # the frames are the songs' own: read at the step they were written at
    imported = load_polyphonic(str(data))
    got = sorted(r.tobytes() for split in imported.values() for r in split)
    assert got == sorted(np.asarray(r, np.uint8).tobytes() for r in jsb["train"][:6])
    run = tmp_path / "run"
    main(["train", "--data", str(data), "--model", "lstm", "--hidden", "6", "--epochs", "1",
          "--out", str(run), "--quiet"])
    assert json.loads((run / "metrics.json").read_text())["step_seconds"] == 0.5
    prime = imported["test"][0][:12]
    main(["generate", str(run), "--prime", "test:0", "--prime-steps", "12", "--steps", "8",
          "--out", str(tmp_path / "a.mid")])
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["seconds_per_frame"] == 0.5
    song = pretty_midi.PrettyMIDI(str(tmp_path / "a.mid"))
    # every note starts on a multiple of 0.5 s, and the roll read back at 0.5 s is the prime
    starts = [n.start for inst in song.instruments for n in inst.notes]
    assert starts and all(abs(s / 0.5 - round(s / 0.5)) < 1e-6 for s in starts)
    assert np.array_equal(midi_to_roll(song, 0.5, n_steps=20)[:12], prime)
    assert song.get_end_time() <= 20 * 0.5 + 1e-6
    # a .mid prime is read at the data set's step: the same frames as the split's
    own = tmp_path / "own.mid"
    roll_to_midi(prime, 0.5).write(str(own))
    main(["generate", str(run), "--prime", str(own), "--steps", "4", "--out",
          str(tmp_path / "b.mid")])
    assert json.loads((tmp_path / "b.json").read_text())["prime_frames"] == 12
    # --step-seconds overrides the step: the same music at twice the speed
    main(["generate", str(run), "--prime", "test:0", "--prime-steps", "12", "--steps", "8",
          "--step-seconds", "0.25", "--out", str(tmp_path / "c.mid")])
    fast = pretty_midi.PrettyMIDI(str(tmp_path / "c.mid"))
    assert np.array_equal(midi_to_roll(fast, 0.25, n_steps=20)[:12], prime)
    assert fast.get_end_time() == pytest.approx(song.get_end_time() / 2)
    capsys.readouterr()
