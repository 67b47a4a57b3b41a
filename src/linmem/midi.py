"""Piano rolls to and from MIDI, through ``pretty_midi`` (which reads and writes with ``mido``).

A roll is ``(T, 88)``, key ``k`` is MIDI note ``k + 21`` (A0 .. C8), one frame per time step. The
four data sets were made, in their authors' words, "by transposing each sequence in C major or
C minor and sampling frames every eighth note (quarter note for JSB chorales) following the beat
information present in the MIDI file" (Boulanger-Lewandowski et al. 2012, the data sets' page).
A frame is therefore a musical duration, not a time; :data:`STEP_SECONDS` plays those durations
at 120 beats per minute (a quarter note 0.5 s): 0.5 s per frame for JSB Chorales, 0.25 s for
the others.
"""

from __future__ import annotations

import os

import numpy as np
import pretty_midi

from .data import LOWEST_NOTE, N_KEYS, resolve_name

__all__ = ["STEP_SECONDS", "midi_to_roll", "roll_to_midi", "step_seconds"]

STEP_SECONDS = {"jsb": 0.5, "musedata": 0.25, "nottingham": 0.25, "piano": 0.25}


def step_seconds(dataset: str) -> float:
    """The duration of one frame of ``dataset`` at 120 beats per minute."""
    return STEP_SECONDS[resolve_name(dataset)]


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


def midi_to_roll(midi: str | os.PathLike | pretty_midi.PrettyMIDI, step_seconds: float,
                 n_steps: int | None = None) -> np.ndarray:
    """The ``(T, 88)`` uint8 roll of a MIDI file or object, ``step_seconds`` per frame: a note
    covers the frames from its rounded start to its rounded end (at least one); drums and notes
    outside A0-C8 are left out. ``n_steps`` fixes ``T`` (default: up to the last note's end)."""
    if not step_seconds > 0:
        raise ValueError(f"step_seconds must be > 0, got {step_seconds!r}")
    if not isinstance(midi, pretty_midi.PrettyMIDI):
        midi = pretty_midi.PrettyMIDI(os.fspath(midi))
    notes = [n for inst in midi.instruments if not inst.is_drum for n in inst.notes
             if LOWEST_NOTE <= n.pitch < LOWEST_NOTE + N_KEYS]
    spans = [(round(n.start / step_seconds), round(n.end / step_seconds), n.pitch)
             for n in notes]
    length = max((max(end, start + 1) for start, end, _ in spans), default=0)
    roll = np.zeros((length if n_steps is None else n_steps, N_KEYS), np.uint8)
    for start, end, pitch in spans:
        roll[start:max(end, start + 1), pitch - LOWEST_NOTE] = 1
    return roll
