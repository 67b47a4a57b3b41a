"""Piano rolls to and from MIDI, through ``pretty_midi`` (which reads and writes with ``mido``;
the ``[midi]`` extra installs it).

A roll is ``(T, 88)``, key ``k`` is MIDI note ``k + 21`` (A0 .. C8), one frame per time step. The
four data sets were made, in their authors' words, "by transposing each sequence in C major or
C minor and sampling frames every eighth note (quarter note for JSB chorales) following the beat
information present in the MIDI file" (Boulanger-Lewandowski et al. 2012, the data sets' page).
A frame is therefore a musical duration, not a time; :data:`linmem.data.STEP_SECONDS` plays
those durations at 120 beats per minute (a quarter note 0.5 s): 0.5 s per frame for JSB
Chorales, 0.25 s for the others. A data set of your own keeps the step it was imported at
(:func:`linmem.data.step_seconds`).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from linmem._extras import require
from linmem._io import check_outputs
from linmem.data import (
    DEFAULT_STEP_SECONDS,
    LOWEST_NOTE,
    N_KEYS,
    SPLITS,
    DataError,
    write_pickle,
)

pretty_midi = require("pretty_midi", "MIDI (linmem.midi)")

__all__ = ["import_midi_folder", "midi_to_roll", "notes_outside", "read_midi", "roll_to_midi"]


def roll_to_midi(roll: np.ndarray, step_seconds: float, program: int = 0, velocity: int = 80
                 ) -> pretty_midi.PrettyMIDI:
    """A one-instrument MIDI of ``roll`` ``(T, 88)``: a note spans each run of consecutive active
    frames of a key, ``step_seconds`` per frame; ``program`` is the General MIDI instrument
    (0: acoustic grand piano)."""
    roll = np.asarray(roll)
    if roll.ndim != 2 or roll.shape[1] != N_KEYS:
        raise ValueError(f"roll must be (T, {N_KEYS}), got {roll.shape}")
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    midi = pretty_midi.PrettyMIDI(initial_tempo=120.0)  # the tempo STEP_SECONDS assume
    instrument = pretty_midi.Instrument(program=program)
    active = np.pad(roll > 0, ((1, 1), (0, 0))).astype(np.int8)
    change = np.diff(active, axis=0)  # +1 where a run starts, -1 one past its end
    for key in range(N_KEYS):
        starts = np.flatnonzero(change[:, key] == 1)
        ends = np.flatnonzero(change[:, key] == -1)
        for start, end in zip(starts, ends, strict=True):
            instrument.notes.append(pretty_midi.Note(velocity, LOWEST_NOTE + key,
                                                     start * step_seconds, end * step_seconds))
    midi.instruments.append(instrument)
    return midi


def read_midi(path: str | os.PathLike) -> pretty_midi.PrettyMIDI:
    """A MIDI file; ``DataError`` naming it when it cannot be read (truncated, empty, not MIDI),
    ``FileNotFoundError`` when it does not exist."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path}: no such MIDI file")
    try:
        return pretty_midi.PrettyMIDI(os.fspath(path))
    except Exception as err:  # mido and pretty_midi raise many kinds (EOFError, KeyError, ...)
        why = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        if isinstance(err, EOFError) or not why:
            why = "the file ends early: truncated or empty"
        raise DataError(f"{path}: not a readable MIDI file: {why}") from None


def notes_outside(midi: pretty_midi.PrettyMIDI) -> int:
    """How many of ``midi``'s pitched notes lie outside the piano's A0-C8, which a roll leaves
    out."""
    return sum(not LOWEST_NOTE <= n.pitch < LOWEST_NOTE + N_KEYS
               for inst in midi.instruments if not inst.is_drum for n in inst.notes)


def midi_to_roll(midi: str | os.PathLike | pretty_midi.PrettyMIDI, step_seconds: float,
                 n_steps: int | None = None) -> np.ndarray:
    """The ``(T, 88)`` uint8 roll of a MIDI file or object, ``step_seconds`` per frame: a note
    covers the frames from its rounded start to its rounded end (at least one); drums and notes
    outside A0-C8 are left out. ``n_steps`` fixes ``T`` (default: up to the last note's end)."""
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    if not isinstance(midi, pretty_midi.PrettyMIDI):
        midi = read_midi(midi)
    notes = [n for inst in midi.instruments if not inst.is_drum for n in inst.notes
             if LOWEST_NOTE <= n.pitch < LOWEST_NOTE + N_KEYS]
    spans = [(round(n.start / step_seconds), round(n.end / step_seconds), n.pitch)
             for n in notes]
    length = max((max(end, start + 1) for start, end, _ in spans), default=0)
    roll = np.zeros((length if n_steps is None else n_steps, N_KEYS), np.uint8)
    for start, end, pitch in spans:
        roll[start:max(end, start + 1), pitch - LOWEST_NOTE] = 1
    return roll


def import_midi_folder(folder: str | os.PathLike, out: str | os.PathLike,
                       step_seconds: float = DEFAULT_STEP_SECONDS,
                       split: tuple[float, float, float] = (0.8, 0.1, 0.1), seed: int = 0,
                       force: bool = False) -> dict:
    """A data set of your own: every ``.mid``/``.midi`` file under ``folder`` as a piano roll
    (:func:`midi_to_roll`), shuffled by ``seed`` and split into train, valid and test by the
    fractions ``split``, written to ``out`` in the original pickle format (which
    :func:`linmem.data.load_polyphonic` and ``linmem train --data OUT`` read). A file that cannot
    be read, or holds no note, is skipped and named in the result (``skipped``: name -> why),
    and notes outside the piano's range (A0-C8) are counted (``notes_outside``: name -> count);
    an existing ``out`` is overwritten only with ``force``;
    ``DataError`` when fewer files than splits remain. Returns the counts per split."""
    if len(split) != 3 or any(not f > 0 for f in split) or not abs(sum(split) - 1) < 1e-9:
        raise ValueError(f"split must be three fractions above 0 summing to 1 (every split "
                         f"needs a sequence), got {split!r}")
    check_outputs({"the output": out}, force)
    paths = sorted(p for p in Path(folder).rglob("*") if p.suffix.lower() in (".mid", ".midi"))
    rolls, skipped, outside = [], {}, {}
    for path in paths:
        try:
            midi = read_midi(path)
            roll = midi_to_roll(midi, step_seconds)
        except DataError as err:
            skipped[str(path)] = str(err).removeprefix(f"{path}: ")
            continue
        if notes_outside(midi):
            outside[str(path)] = notes_outside(midi)
        if len(roll) < 2 or not roll.any():
            skipped[str(path)] = "no note (or a single frame)"
            continue
        rolls.append(roll)
    if len(rolls) < 3:
        raise DataError(f"{folder}: {len(rolls)} usable MIDI files of {len(paths)}; a data set "
                        "needs at least 3 (one per split)"
                        + (f"; skipped: {', '.join(Path(p).name for p in skipped)}"
                           if skipped else ""))
    order = np.random.default_rng(seed).permutation(len(rolls))
    n_valid = max(1, round(split[1] * len(rolls)))
    n_test = max(1, round(split[2] * len(rolls)))
    n_train = len(rolls) - n_valid - n_test
    if n_train < 1:
        raise DataError(f"{folder}: {len(rolls)} files leave no training sequence with {split}")
    parts = np.split(order, [n_train, n_train + n_valid])
    data = {name: [rolls[i] for i in part] for name, part in zip(SPLITS, parts, strict=True)}
    write_pickle(data, out, step_seconds)
    return {"files": len(paths), "sequences": {k: len(v) for k, v in data.items()},
            "frames": {k: int(sum(len(r) for r in v)) for k, v in data.items()},
            "skipped": skipped, "notes_outside": outside, "step_seconds": step_seconds,
            "split": list(split),
            "seed": seed, "out": str(out)}
