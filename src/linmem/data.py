"""The four polyphonic music data sets (Boulanger-Lewandowski et al., ICML 2012) and their batching.

A data set is a dict ``{"train": [...], "valid": [...], "test": [...]}`` of ``uint8`` piano rolls of
shape ``(T_i, 88)``: column ``j`` is MIDI note ``21 + j`` (A0 .. C8), 1 where the key sounds.

Where the files come from, in order (like torchvision's data sets):

1. ``root`` if given, else the environment variable ``LINMEM_DATA``, else the user cache
   (``$XDG_CACHE_HOME/linmem`` or ``~/.cache/linmem``);
2. in that folder, the MATLAB ``.mat`` re-packaging (``JSB_Chorales.mat``, ...) or the original
   pickle (``JSB Chorales.pickle``, ...);
3. with ``download=True`` and neither file present, the original pickle is downloaded from its
   public address, verified, and written atomically into the folder.

Every file is verified before use: the ``.mat`` files and the pickles with a published SHA-256 by
that checksum, every file by its split sizes and frame counts. Pickles are read with a restricted
unpickler (plain containers and numpy scalars only), never with a bare ``pickle.load``.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import math
import os
import pickle
import tempfile
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from tqdm.auto import tqdm

from linmem._io import atomic_write

__all__ = [
    "DATASETS",
    "DEFAULT_STEP_SECONDS",
    "HIGHEST_NOTE",
    "LOWEST_NOTE",
    "N_KEYS",
    "SPLITS",
    "STEP_SECONDS",
    "DataError",
    "DatasetInfo",
    "PolyphonicMusic",
    "content_digest",
    "data_checksum",
    "data_root",
    "dataset_title",
    "default_root",
    "is_data_file",
    "load_polyphonic",
    "pickle_step_seconds",
    "read_pickle",
    "resolve_name",
    "sha256_file",
    "step_seconds",
    "write_pickle",
]

N_KEYS = 88
LOWEST_NOTE = 21  # MIDI number of A0, column 0
HIGHEST_NOTE = LOWEST_NOTE + N_KEYS - 1  # C8
SPLITS = ("train", "valid", "test")
_ORIGINAL = "http://www-etud.iro.umontreal.ca/~boulanni/"
_WAYBACK = "https://web.archive.org/web/{stamp}id_/http://www-etud.iro.umontreal.ca:80/~boulanni/"


class DataError(RuntimeError):
    """A data set cannot be found, downloaded, read or verified."""


@dataclass(frozen=True)
class DatasetInfo:
    """What is known of one data set: file names, addresses, checksums and sizes."""

    name: str
    title: str
    mat_file: str
    pickle_file: str
    urls: tuple[str, ...]
    mat_sha256: str
    pickle_sha256: str | None  # None where no verified copy of the original pickle is known
    n_sequences: tuple[int, int, int]  # train, valid, test
    n_frames: tuple[int, int, int]


def _urls(pickle_file: str, wayback_stamp: str | None) -> tuple[str, ...]:
    quoted = urllib.request.pathname2url(pickle_file)
    urls = [_ORIGINAL + quoted]
    if wayback_stamp:
        urls.append(_WAYBACK.format(stamp=wayback_stamp) + quoted)
    return tuple(urls)


DATASETS: dict[str, DatasetInfo] = {
    info.name: info
    for info in (
        DatasetInfo(
            "jsb", "JSB Chorales", "JSB_Chorales.mat", "JSB Chorales.pickle",
            _urls("JSB Chorales.pickle", "20141211164413"),
            "ac0e608527cc411c7e21ef7d38be47f0de7fb6b13b3ae168b8eccf1c2a9b18d4",
            "69dc4c3e52800959ac0ab3b82aa3e5f55285ce64f1705acb3e3a8ef77a5c051c",
            (229, 76, 77), (13807, 4602, 4725),
        ),
        DatasetInfo(
            "musedata", "MuseData", "MuseData.mat", "MuseData.pickle",
            _urls("MuseData.pickle", None),
            "e8d9eb422ec3833c25f43a9f854d4ee0b9118a20b45f2c183395cdc30ffa14ff",
            None,
            (524, 135, 124), (245202, 82755, 64339),
        ),
        DatasetInfo(
            "nottingham", "Nottingham", "Nottingham.mat", "Nottingham.pickle",
            _urls("Nottingham.pickle", None),
            "d154f7ca2e90799dc1dc011d8fc048f2fc6ef3f7c69d974b9cf27a471634fbea",
            None,
            (694, 173, 170), (176561, 45513, 44463),
        ),
        DatasetInfo(
            "piano", "Piano-midi.de", "Piano_midi.mat", "Piano-midi.de.pickle",
            _urls("Piano-midi.de.pickle", "20141211164423"),
            "990a8a71d5764a7eaa3e78d9e5023d1470380fe2db3a1448265a97a24c8b1c34",
            "273d593b13d9a348410d261c0223d47523e2a9b41702137aaab5922242518296",
            (87, 12, 25), (75911, 8540, 19036),
        ),
    )
}


def _normalise(name: str) -> str:
    return "".join(ch for ch in name.lower() if ch.isalnum())


_ALIASES = {
    _normalise(alias): key
    for key, aliases in {
        "jsb": ("jsb", "JSB Chorales", "JSB_Chorales", "jsb-chorales", "chorales"),
        "musedata": ("musedata", "MuseData", "muse"),
        "nottingham": ("nottingham", "Nottingham", "nott"),
        "piano": ("piano", "Piano-midi.de", "Piano_midi", "piano-midi", "pianomidi"),
    }.items()
    for alias in aliases
}


# the seconds one frame lasts, played at 120 beats per minute (linmem.midi): the data sets' frames
# are quarter notes (JSB Chorales) or eighth notes (the others)
STEP_SECONDS = {"jsb": 0.5, "musedata": 0.25, "nottingham": 0.25, "piano": 0.25}
DEFAULT_STEP_SECONDS = 0.25  # your own MIDI files: eighth notes at 120 beats per minute


def step_seconds(dataset: str) -> float:
    """The duration of one frame of ``dataset``: the four data sets' at 120 beats per minute
    (:data:`STEP_SECONDS`); a data set file of your own, the step it was imported at
    (:func:`pickle_step_seconds`), else :data:`DEFAULT_STEP_SECONDS`."""
    if is_data_file(dataset):
        return pickle_step_seconds(dataset) or DEFAULT_STEP_SECONDS
    return STEP_SECONDS[resolve_name(dataset)]


def is_data_file(name: str | os.PathLike) -> bool:
    """Whether ``name`` names a data set file of your own (a ``.pickle`` in the original
    format, as ``linmem data import-midi`` writes) rather than one of the four data sets."""
    return str(name).endswith(".pickle")


def dataset_title(name: str) -> str:
    """A data set's title in tables and figures ("JSB Chorales"); a name of no known set (a
    data set file of your own) as it is."""
    info = DATASETS.get(name)
    return info.title if info is not None else name


def resolve_name(name: str) -> str:
    """Canonical key (``jsb``, ``musedata``, ``nottingham``, ``piano``) of a data set name, or
    the absolute path of a data set file of your own (:func:`is_data_file`), which must exist."""
    if is_data_file(name):
        path = Path(name).expanduser()
        if not path.is_file():
            raise ValueError(f"data set file {name}: no such file")
        return str(path.resolve())
    key = _ALIASES.get(_normalise(str(name)))
    if key is None:
        raise ValueError(f"unknown data set {name!r}: choose one of {', '.join(DATASETS)} or "
                         "a .pickle file")
    return key


def data_root(root: str | os.PathLike | None = None) -> Path:
    """The folder the data is read from: ``root``, else :func:`default_root` (``DataError``
    when it is a file). A missing folder is created only by a download that succeeds."""
    folder = default_root() if root is None else Path(root).expanduser()
    if folder.is_file():
        raise DataError(f"{folder} is a file; the data root must be the folder holding it "
                        f"({folder.parent})")
    return folder


def default_root() -> Path:
    """``LINMEM_DATA`` if set, else the user cache directory for linmem."""
    env = os.environ.get("LINMEM_DATA")
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "linmem"


# ----------------------------------------------------------------------------- reading files


def sha256_file(path: str | os.PathLike) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _read_mat(path: Path) -> dict[str, list[np.ndarray]]:
    import scipy.io  # only needed for this format

    try:
        raw = scipy.io.loadmat(path)
    except Exception as err:  # scipy raises several types for broken files
        raise DataError(f"{path}: not a readable .mat file ({err})") from err
    data = {}
    for split in SPLITS:
        key = f"{split}data"
        if key not in raw:
            raise DataError(f"{path}: no '{key}' array in the .mat file")
        data[split] = [np.asarray(seq) for seq in raw[key].ravel()]
    return data


class _RestrictedUnpickler(pickle.Unpickler):
    """Allows plain containers and the numpy scalars/arrays the original (Python 2) pickles use."""

    _ALLOWED: ClassVar[set[tuple[str, str]]] = {
        ("numpy", "dtype"),
        ("numpy", "ndarray"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"),  # how protocol-2 pickles written by Python 3 store bytes
    }

    def find_class(self, module: str, name: str):
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data pickle")
        if module == "numpy.core.multiarray":  # numpy >= 2 moved it; the old path warns
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _roll_from_notes(steps: Sequence, where: str) -> np.ndarray:
    roll = np.zeros((len(steps), N_KEYS), dtype=np.uint8)
    for t, notes in enumerate(steps):
        for note in notes:
            try:
                value = float(note)
            except (TypeError, ValueError):
                raise DataError(f"{where}, step {t}: note {note!r} is not a MIDI number") from None
            if not math.isfinite(value) or value != int(value) \
                    or not LOWEST_NOTE <= value <= HIGHEST_NOTE:
                raise DataError(
                    f"{where}, step {t}: note {note!r} is outside the piano range "
                    f"{LOWEST_NOTE}..{HIGHEST_NOTE} (MIDI numbers)"
                )
            roll[t, int(value) - LOWEST_NOTE] = 1
    return roll


def _unpickle(path: Path) -> Any:
    """A data pickle's contents, read by the restricted unpickler; ``DataError`` naming the file
    when it cannot be read."""
    try:
        with open(path, "rb") as f:
            return _RestrictedUnpickler(io.BufferedReader(f), encoding="latin1").load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as err:
        raise DataError(f"{path}: not a readable data pickle ({err})") from err


def read_pickle(path: str | os.PathLike) -> dict[str, list[np.ndarray]]:
    """Read an original-format pickle: ``{split: [sequence]}``, a sequence a list of time steps,
    a time step a list of the MIDI note numbers (21..108) that sound."""
    path = Path(path)
    raw = _unpickle(path)
    if not isinstance(raw, dict) or any(split not in raw for split in SPLITS):
        raise DataError(f"{path}: expected a dict with keys {SPLITS}")
    return {
        split: [
            _roll_from_notes(seq, f"{path.name}: {split} sequence {i}")
            for i, seq in enumerate(raw[split])
        ]
        for split in SPLITS
    }


def write_pickle(data: dict[str, list[np.ndarray]], path: str | os.PathLike,
                 step_seconds: float | None = None) -> None:
    """Write piano rolls in the original pickle format (lists of MIDI note numbers), with the
    seconds one frame lasts under the key ``step_seconds`` when given (readers of the original
    format look only at the splits' keys; :func:`pickle_step_seconds` reads it)."""
    notes: dict[str, Any] = {
        split: [[[int(j) + LOWEST_NOTE for j in np.flatnonzero(frame)] for frame in seq]
                for seq in data[split]]
        for split in SPLITS
    }
    if step_seconds is not None:
        notes["step_seconds"] = float(step_seconds)
    with atomic_write(path) as f:
        pickle.dump(notes, f, protocol=2)


def pickle_step_seconds(path: str | os.PathLike) -> float | None:
    """The seconds per frame that ``linmem data import-midi`` stored in a data set file of your
    own; None for a pickle without it (the original four, or one written elsewhere)."""
    path = Path(path)
    raw = _unpickle(path)
    value = raw.get("step_seconds") if isinstance(raw, dict) else None
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not value > 0:
        raise DataError(f"{path}: step_seconds must be a positive number, got {value!r}")
    return float(value)


def content_digest(data: dict[str, list[np.ndarray]]) -> str:
    """SHA-256 of the piano rolls themselves, the same whichever file format they came from."""
    digest = hashlib.sha256()
    for split in SPLITS:
        digest.update(split.encode())
        for seq in data[split]:
            digest.update(np.asarray(seq.shape, dtype="<i8").tobytes())
            digest.update(np.packbits(np.asarray(seq, dtype=bool)).tobytes())
    return digest.hexdigest()


def _check(data: dict[str, list[np.ndarray]], info: DatasetInfo, path: Path) -> None:
    for split, n_seq, n_frames in zip(SPLITS, info.n_sequences, info.n_frames, strict=True):
        seqs = data[split]
        frames = sum(len(s) for s in seqs)
        if len(seqs) != n_seq or frames != n_frames:
            raise DataError(
                f"{path}: the {split} split has {len(seqs)} sequences and {frames} frames, "
                f"the published {info.title} has {n_seq} and {n_frames}; the file is corrupt "
                "or another data set"
            )
        for i, seq in enumerate(seqs):
            if seq.ndim != 2 or seq.shape[1] != N_KEYS or not np.isin(seq, (0, 1)).all():
                raise DataError(f"{path}: {split} sequence {i} is not a 0/1 roll of 88 keys")


# ----------------------------------------------------------------------------- writing files


def _download(url: str, dest: Path, info: DatasetInfo, progress: bool) -> None:
    """Download ``url`` to ``dest``, verify it, and only then move it into place."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=f"download {dest.name}",
                      disable=None if progress else True, leave=False) as bar:
                for block in iter(lambda: response.read(1 << 16), b""):
                    out.write(block)
                    bar.update(len(block))
            if total is not None and out.tell() != total:
                raise DataError(f"{url}: download truncated ({out.tell()} of {total} bytes)")
        if info.pickle_sha256 is not None and sha256_file(tmp) != info.pickle_sha256:
            raise DataError(
                f"{url}: SHA-256 mismatch (expected {info.pickle_sha256}); corrupt download"
            )
        _check(read_pickle(tmp), info, tmp)  # parses and verifies sizes before the rename
        os.replace(tmp, dest)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


_REFETCH = "delete it: the next load downloads the data set again (or put a good copy there)"


def load_polyphonic(
    name: str,
    root: str | os.PathLike | None = None,
    download: bool = True,
    progress: bool = True,
) -> dict[str, list[np.ndarray]]:
    """Load a data set as ``{"train", "valid", "test"}`` lists of ``(T_i, 88)`` uint8 piano rolls.

    Args:
        name: ``jsb``, ``musedata``, ``nottingham`` or ``piano`` (common spellings such as
            ``"JSB Chorales"`` or ``"Piano-midi.de"`` are accepted), or the path of a data set
            file of your own in the original pickle format (``linmem data import-midi``).
        root: folder holding the ``.mat`` or pickle file. Default: ``$LINMEM_DATA``, else the
            user cache (``~/.cache/linmem``).
        download: fetch the original pickle when neither file is in ``root``. Default: ``True``.
        progress: show a progress bar while downloading. Default: ``True``.

    Returns:
        ``{"train": [...], "valid": [...], "test": [...]}``, each a list of ``(T_i, 88)`` uint8
        arrays (key ``k`` is MIDI note ``k + 21``).

    Raises:
        ValueError: an unknown name.
        DataError: a missing, unreadable or unverifiable file.
    """
    if is_data_file(name):  # your own data set: read as it is, checked for shape only
        path = Path(resolve_name(name))
        data = read_pickle(path)
        for split in SPLITS:
            if not data[split]:
                raise DataError(f"{path}: the {split} split is empty")
        return {split: [np.ascontiguousarray(s, dtype=np.uint8) for s in data[split]]
                for split in SPLITS}
    info = DATASETS[resolve_name(name)]
    folder = data_root(root)
    mat, pkl = folder / info.mat_file, folder / info.pickle_file
    if mat.is_file():
        if sha256_file(mat) != info.mat_sha256:
            raise DataError(f"{mat}: SHA-256 mismatch (expected {info.mat_sha256}): a corrupt or "
                            f"other file; {_REFETCH}")
        data, path = _read_mat(mat), mat
    else:
        if not pkl.is_file():
            if not download:
                raise DataError(
                    f"{info.title} not found in {folder} (looked for {info.mat_file!r} and "
                    f"{info.pickle_file!r}); pass root=, set LINMEM_DATA, or allow download"
                )
            _download_any(info, pkl, progress)
        elif info.pickle_sha256 is not None and sha256_file(pkl) != info.pickle_sha256:
            raise DataError(f"{pkl}: SHA-256 mismatch (expected {info.pickle_sha256}): a "
                            f"corrupt or other file; {_REFETCH}")
        data, path = read_pickle(pkl), pkl
    _check(data, info, path)
    return {split: [np.ascontiguousarray(s, dtype=np.uint8) for s in data[split]]
            for split in SPLITS}


class PolyphonicMusic(torch.utils.data.Dataset):
    """One split of a data set as a map-style ``torch.utils.data.Dataset``, torchvision's way.

    Item ``i`` is sequence ``i``'s piano roll, a ``(T_i, 88)`` float32 tensor (after
    ``transform``, if given). :func:`collate` is its ``collate_fn``: it pads a list of items into
    one :class:`Batch` of next-step pairs::

        loader = DataLoader(PolyphonicMusic("jsb", "train"), batch_size=4, shuffle=True,
                            collate_fn=collate)

    Args:
        name, root, download, progress: as in :func:`load_polyphonic` (the same files, checked
            the same way).
        split: ``"train"``, ``"valid"`` or ``"test"``. Default: ``"train"``.
        transform: a callable applied to each item's tensor. Default: none.

    Attributes:
        sequences: the split's ``uint8`` piano rolls.  lengths: their numbers of frames.
    """

    def __init__(self, name: str, split: str = "train", root: str | os.PathLike | None = None,
                 download: bool = True, transform: Any = None, progress: bool = True):
        if split not in SPLITS:
            raise ValueError(f"split must be one of {list(SPLITS)}, got {split!r}")
        self.name, self.split, self.transform = name, split, transform
        self.sequences = load_polyphonic(name, root=root, download=download,
                                         progress=progress)[split]
        self.lengths = [len(s) for s in self.sequences]

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> torch.Tensor:
        roll = torch.from_numpy(self.sequences[index]).float()
        return roll if self.transform is None else self.transform(roll)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.name!r}, split={self.split!r}: {len(self)} "
                f"sequences, {sum(self.lengths)} frames)")


def _download_any(info: DatasetInfo, dest: Path, progress: bool) -> None:
    errors = []
    # the folders the download makes (a relative root such as ../shared/data/polyphonic, run
    # from elsewhere, makes three), deepest first
    created = [folder for folder in (dest.parent, *dest.parent.parents) if not folder.exists()]
    for url in info.urls:
        try:
            _download(url, dest, info, progress)
            return
        except (OSError, http.client.HTTPException, DataError) as err:
            errors.append(f"{url}: {err}")
    for folder in created:  # a failed download leaves no folder behind
        if not folder.is_dir() or any(folder.iterdir()):
            break
        folder.rmdir()
    raise DataError(f"could not download {info.title} into {dest.parent} ({errors[0]}"
                    + (f"; and {len(errors) - 1} other address" if len(errors) > 1 else "")
                    + f"); put {info.mat_file} there, set LINMEM_DATA or pass --data-dir to "
                    "the folder holding it")


def data_checksum(name: str, root: str | os.PathLike | None = None) -> str:
    """SHA-256 of the file ``load_polyphonic`` reads for ``name`` (for provenance records)."""
    if is_data_file(name):
        return sha256_file(resolve_name(name))
    info = DATASETS[resolve_name(name)]
    folder = data_root(root)
    for path in (folder / info.mat_file, folder / info.pickle_file):
        if path.is_file():
            return sha256_file(path)
    raise DataError(f"{info.title} not found in {folder}")
