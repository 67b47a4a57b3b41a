"""Music from a trained model: continue a prime, one step at a time through the model's state.

Every next-step model implements ``generation_step(frames, state, temperature, generator)``
(:class:`linmem.models.NextStepPredictor`: each key drawn from its Bernoulli;
:class:`linmem.nn.rnnrbm.RNNRBM`: a Gibbs chain of the step's RBM), so a continuation of ``n``
steps costs ``n`` steps of the recurrence, not a re-run of the whole prefix at every step.
:func:`plot_roll` and :func:`plot_prediction` draw a continuation and a sequence's predictions
as piano rolls (matplotlib, the ``plot`` extra).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from scipy.io import wavfile

from linmem._extras import require
from linmem._io import atomic_write, check_outputs, command_line, git_commit, provenance, write_json
from linmem.data import data_checksum, load_polyphonic, resolve_name, step_seconds
from linmem.training.evaluation import load_run_model, run_threshold

__all__ = ["continue_run", "generate", "load_prime", "plot_prediction", "plot_roll",
           "predict_sequence"]


@torch.no_grad()
def generate(model: torch.nn.Module, prime: np.ndarray | torch.Tensor, n_steps: int,
             temperature: float = 1.0, generator: torch.Generator | None = None
             ) -> np.ndarray:
    """Continue ``prime`` by ``n_steps`` frames sampled from ``model``.

    Args:
        model: a trained next-step model of the registry
            (:func:`linmem.training.evaluation.load_run_model`).
        prime: ``(T0, K)`` piano roll, ``T0 >= 1``, the music to continue.
        n_steps: frames to generate.
        temperature: divides the logits (Bernoulli readouts) or the energies (RNN-RBM); below
            1 the samples are more conservative, above 1 more adventurous. Default: 1.
        generator: the random generator of the samples; the same seed gives the same music.
            Default: torch's global one.

    Returns:
        ``(n_steps, K)`` uint8, the continuation alone.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature!r}")
    if n_steps < 0 or int(n_steps) != n_steps:
        raise ValueError(f"n_steps must be an integer >= 0, got {n_steps!r}")
    param = next(model.parameters())
    frames = torch.as_tensor(np.asarray(prime), dtype=param.dtype, device=param.device)
    if frames.dim() != 2 or len(frames) < 1:
        raise ValueError(f"prime must be a (T0 >= 1, keys) piano roll, got {tuple(frames.shape)}")
    model.eval()
    out, state, step = [], None, frames[None]
    for _ in range(n_steps):
        frame, state, _ = model.generation_step(step, state, temperature, generator)
        out.append(frame[0])
        step = frame[:, None]
    if not out:
        return np.zeros((0, frames.shape[1]), np.uint8)
    return torch.stack(out).cpu().numpy().astype(np.uint8)


def load_prime(spec: str, dataset: str, data_dir: str | None = None,
               seconds: float | None = None, option: str = "--prime"
               ) -> tuple[np.ndarray, str | None]:
    """A prime roll from ``DATA:SPLIT:INDEX`` (``jsb:test:3``; ``DATA`` may be left out for the
    run's data set: ``test:3``) or a MIDI file; returns it with the data checksum (``None`` for a
    file). ``seconds``: the MIDI file's seconds per frame (default: the run data set's);
    ``option``: the command-line option its errors name."""
    if Path(spec).suffix.lower() in (".mid", ".midi"):
        from linmem.midi import midi_to_roll, read_midi  # the [midi] extra

        return midi_to_roll(read_midi(spec), seconds or step_seconds(dataset)), None
    parts = spec.split(":")
    if len(parts) == 2:
        parts = [dataset, *parts]
    if len(parts) != 3 or parts[1] not in ("train", "valid", "test") or not parts[2].isdigit():
        raise ValueError(f"{option} {spec!r}: expected DATA:SPLIT:INDEX (jsb:test:3) or a "
                         ".mid file")
    name = resolve_name(parts[0])
    data = load_polyphonic(name, root=data_dir, progress=False)
    seqs, index = data[parts[1]], int(parts[2])
    if index >= len(seqs):
        raise ValueError(f"{option} {spec!r}: {name} {parts[1]} has {len(seqs)} sequences "
                         f"(0-{len(seqs) - 1})")
    return seqs[index], data_checksum(name, data_dir)


def continue_run(run_dir: str | os.PathLike, prime: str, out: str | os.PathLike,
                 steps: int = 64, prime_steps: int | None = None, temperature: float = 1.0,
                 seed: int = 0, png: str | os.PathLike | None = None,
                 wav: str | os.PathLike | None = None, data_dir: str | None = None,
                 command: str | None = None, with_prime: bool = True,
                 seconds: float | None = None, force: bool = False) -> dict[str, Any]:
    """``linmem generate``: the best checkpoint of ``run_dir`` continues ``prime`` (see
    :func:`load_prime`; its first ``prime_steps`` frames) by ``steps`` frames; writes the prime
    and the continuation as MIDI to ``out`` (and a piano-roll PNG, a WAV rendered by
    pretty_midi's sine synthesizer), with a JSON record beside ``out``; returns the record.
    ``with_prime=False``: the MIDI and the audio hold the generated frames only (a sample to
    share without the data set's music; the PNG still shows the prime). ``seconds``: one
    frame's duration in the MIDI written and in a ``.mid`` prime [default: the run's data set's,
    :func:`linmem.data.step_seconds`: the step a data set of your own was imported at].
    Existing outputs are overwritten only with ``force`` (checked before anything runs)."""
    from linmem.midi import roll_to_midi  # the [midi] extra: said before anything runs

    check_outputs({"--out": out, "the record": Path(out).with_suffix(".json"), "--png": png,
                   "--wav": wav}, force)
    started, commit = time.perf_counter(), git_commit()
    model, config = load_run_model(run_dir)
    if seconds is not None and not seconds > 0:
        raise ValueError(f"seconds must be > 0, got {seconds!r}")
    seconds = seconds or step_seconds(config.data)
    roll, checksum = load_prime(prime, config.data, data_dir or config.data_dir, seconds)
    if prime_steps is not None:
        roll = roll[:prime_steps]
    if len(roll) == 0:
        raise ValueError("the prime has no frame")
    continuation = generate(model, roll, steps, temperature,
                            torch.Generator().manual_seed(seed))
    midi = roll_to_midi(np.concatenate([roll, continuation]) if with_prime else continuation,
                        seconds)
    with atomic_write(out) as f:
        midi.write(f)
    if png is not None:
        plot_roll(roll, continuation, png, f"{config.model} ({Path(run_dir).name}): "
                  f"{prime}, {steps} steps at temperature {temperature:g}, seed {seed}")
    if wav is not None:
        rate = 22050
        audio = midi.synthesize(fs=rate)
        peak = float(np.abs(audio).max()) or 1.0
        with atomic_write(wav) as f:
            wavfile.write(f, rate, (0.8 * audio / peak * 32767).astype(np.int16))
    record = {"run": str(run_dir), "model": config.model, "prime": prime,
              "prime_frames": len(roll), "midi_holds_prime": with_prime, "steps": steps,
              "temperature": temperature,
              "seconds_per_frame": seconds, "notes_per_frame": float(continuation.sum(1).mean())
              if steps else 0.0, "midi": str(out), "png": str(png) if png else None,
              "wav": str(wav) if wav else None,
              **provenance(command or command_line(), commit, seed, checksum,
                           time.perf_counter() - started)}
    write_json(Path(out).with_suffix(".json"), record)
    return record


@torch.no_grad()
def predict_sequence(run_dir: str | os.PathLike, which: str, out: str | os.PathLike,
                     data_dir: str | None = None) -> list[str]:
    """``linmem plot RUN_DIR --prediction SPLIT:INDEX``: the best checkpoint's key
    probabilities for each next frame of that sequence of the run's data set, drawn under the
    truth (:func:`linmem.generate.plot_prediction`), its keys on and off at the threshold the
    run chose on validation (0.5 where it recorded none)."""
    model, config = load_run_model(run_dir)
    roll, _ = load_prime(which, config.data, data_dir or config.data_dir, option="--prediction")
    if len(roll) < 2:
        raise ValueError(f"{which}: a sequence of one frame has nothing to predict")
    model.eval()
    param = next(model.parameters())
    inputs = torch.as_tensor(roll[:-1], dtype=param.dtype, device=param.device)[None]
    probs = torch.sigmoid(model(inputs))[0].cpu().numpy()
    threshold = run_threshold(run_dir)
    return plot_prediction(roll[1:], probs, out, f"{config.model} ({Path(run_dir).name}): "
                           f"{which}", 0.5 if threshold is None else threshold)


def plot_roll(prime: np.ndarray, continuation: np.ndarray, path: str | os.PathLike,
              title: str = "") -> None:
    """The prime and its continuation as one piano roll (time across, keys up), a line where
    the continuation starts; a PNG written atomically."""
    matplotlib = require("matplotlib", "a figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    roll = np.concatenate([prime, continuation]).astype(float)
    fig, ax = plt.subplots(figsize=(max(6.0, min(18.0, len(roll) / 12)), 4.0))
    ax.imshow(roll.T, origin="lower", aspect="auto", cmap="Greys", interpolation="nearest",
              extent=(-0.5, len(roll) - 0.5, 20.5, 108.5))
    ax.axvline(len(prime) - 0.5, color="tab:red", lw=1.2, label="continuation starts")
    ax.set_xlabel("time step")
    ax.set_ylabel("MIDI note")
    ax.set_title(title)
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=110)
    plt.close(fig)


def plot_prediction(truth: np.ndarray, probs: np.ndarray, path: str | os.PathLike,
                    title: str = "", threshold: float = 0.5) -> list[str]:
    """A sequence's next frames (``truth``, ``(T, 88)``) above the model's key probabilities
    (``probs``), and the frames' keys it got right, missed and added at ``threshold``, apart;
    a PNG written atomically. Returns the panels' titles."""
    matplotlib = require("matplotlib", "a figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    truth, pred = np.asarray(truth) > 0, np.asarray(probs) >= threshold
    outcome = np.zeros(truth.shape)
    outcome[truth & pred], outcome[truth & ~pred], outcome[~truth & pred] = 1, 2, 3
    titles = ["truth (next frames)", "predicted key probabilities",
              f"at threshold {threshold:g}: right (green), missed (red), added (blue)"]
    fig, axes = plt.subplots(3, 1, figsize=(max(6.0, min(18.0, len(truth) / 10)), 9),
                             sharex=True)
    extent = (-0.5, len(truth) - 0.5, 20.5, 108.5)
    axes[0].imshow(truth.T, origin="lower", aspect="auto", cmap="Greys", extent=extent,
                   interpolation="nearest")
    image = axes[1].imshow(np.asarray(probs).T, origin="lower", aspect="auto", cmap="viridis",
                           vmin=0, vmax=1, extent=extent, interpolation="nearest")
    fig.colorbar(image, ax=axes[1], fraction=0.02)
    colours = ListedColormap(["white", "tab:green", "tab:red", "tab:blue"])
    axes[2].imshow(outcome.T, origin="lower", aspect="auto", cmap=colours, vmin=0, vmax=3,
                   extent=extent, interpolation="nearest")
    for ax, panel in zip(axes, titles, strict=True):
        ax.set_title(panel, fontsize=10)
        ax.set_ylabel("MIDI note")
    axes[2].set_xlabel("time step")
    fig.suptitle(title)
    fig.tight_layout()
    with atomic_write(path) as f:
        fig.savefig(f, format="png", dpi=100)
    plt.close(fig)
    return titles
