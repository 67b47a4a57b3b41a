"""Loading, verifying and downloading the data sets; next-step pairs and batching."""

import dataclasses
import functools
import hashlib
import http.server
import itertools
import os
import pickle
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest

from linmem import batching
from linmem import data as D
from linmem.data import DataError, load_polyphonic


@pytest.mark.parametrize("name", list(D.DATASETS))
def test_real_data_sets_match_the_published_table(name, data_dir):
    info = D.DATASETS[name]
    data = load_polyphonic(name, root=data_dir)
    for split, n_seq, n_frames in zip(D.SPLITS, info.n_sequences, info.n_frames, strict=True):
        assert len(data[split]) == n_seq
        assert sum(len(s) for s in data[split]) == n_frames
        assert all(s.dtype == np.uint8 and s.shape[1] == 88 for s in data[split])
    assert D.data_checksum(name, data_dir) == info.mat_sha256


def test_names_and_env_variable(data_dir, monkeypatch):
    for alias in ("JSB Chorales", "jsb_chorales", "Piano-midi.de", "MuseData", "nottingham"):
        assert D.resolve_name(alias) in D.DATASETS
    with pytest.raises(ValueError, match="unknown data set"):
        D.resolve_name("mnist")
    monkeypatch.setenv("LINMEM_DATA", str(data_dir))
    assert len(load_polyphonic("JSB Chorales")["valid"]) == 76


def test_missing_and_corrupt_files(tmp_path, data_dir):
    with pytest.raises(DataError, match="not found"):
        load_polyphonic("jsb", root=tmp_path, download=False)
    broken = tmp_path / "JSB_Chorales.mat"
    raw = bytearray((data_dir / "JSB_Chorales.mat").read_bytes())
    raw[5000] ^= 0xFF
    broken.write_bytes(bytes(raw))
    with pytest.raises(DataError, match=r"SHA-256 mismatch .*: a corrupt or other file; delete "
                                         "it: the next load downloads the data set again"):
        load_polyphonic("jsb", root=tmp_path)
    broken.unlink()  # a cached pickle that is not the published one: the same advice
    (tmp_path / "JSB Chorales.pickle").write_bytes(b"not the data set")
    with pytest.raises(DataError, match=r"JSB Chorales\.pickle: SHA-256 mismatch .*: a corrupt "
                                         "or other file; delete it"):
        load_polyphonic("jsb", root=tmp_path)


def test_pickle_round_trip_equals_mat(tmp_path, jsb):
    path = tmp_path / "JSB Chorales.pickle"
    D.write_pickle(jsb, path)
    again = D.read_pickle(path)
    assert D.content_digest(again) == D.content_digest(jsb)
    for split in D.SPLITS:
        assert all(np.array_equal(a, b) for a, b in zip(again[split], jsb[split], strict=True))


def test_pickle_with_numpy_scalars_and_out_of_range_notes(tmp_path):
    ok = {"train": [[[np.int64(21), np.float64(108.0)], []]], "valid": [], "test": []}
    (tmp_path / "ok.pickle").write_bytes(pickle.dumps(ok, protocol=2))
    roll = D.read_pickle(tmp_path / "ok.pickle")["train"][0]
    assert roll.shape == (2, 88) and roll[0, 0] == 1 and roll[0, 87] == 1 and roll.sum() == 2
    for bad in (20, 109, 60.5, -1, float("nan"), float("inf")):
        data = {"train": [[[60], [bad]]], "valid": [], "test": []}
        (tmp_path / "bad.pickle").write_bytes(pickle.dumps(data, protocol=2))
        with pytest.raises(DataError, match=r"bad\.pickle: train sequence 0, step 1: note "
                                            r".* is outside the piano range"):
            D.read_pickle(tmp_path / "bad.pickle")
    data = {"train": [], "valid": [[[60, "C4"]]], "test": []}  # not a number: named likewise
    (tmp_path / "bad.pickle").write_bytes(pickle.dumps(data, protocol=2))
    with pytest.raises(DataError, match=r"valid sequence 0, step 0: note 'C4' is not a MIDI"):
        D.read_pickle(tmp_path / "bad.pickle")


def test_pickle_cannot_run_code(tmp_path):
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    (tmp_path / "evil.pickle").write_bytes(pickle.dumps({"train": Evil()}))
    with pytest.raises(DataError, match="refusing to load"):
        D.read_pickle(tmp_path / "evil.pickle")


@pytest.fixture
def server(tmp_path):
    """An HTTP server on loopback serving files from a temporary folder."""
    folder = tmp_path / "www"
    folder.mkdir()
    handler = functools.partial(QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve_jsb(monkeypatch, folder, base, payload, sha=True):
    (folder / "JSB Chorales.pickle").write_bytes(payload)
    info = dataclasses.replace(
        D.DATASETS["jsb"], urls=(base + "JSB%20Chorales.pickle",),
        pickle_sha256=hashlib.sha256(payload).hexdigest() if sha else None)
    monkeypatch.setitem(D.DATASETS, "jsb", info)
    return info


def test_download_verifies_and_caches(tmp_path, server, jsb, monkeypatch):
    folder, base = server
    D.write_pickle(jsb, tmp_path / "built.pickle")
    serve_jsb(monkeypatch, folder, base, (tmp_path / "built.pickle").read_bytes())
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    monkeypatch.delenv("LINMEM_DATA", raising=False)
    data = load_polyphonic("jsb", progress=False)
    assert D.content_digest(data) == D.content_digest(jsb)
    cached = cache / "linmem" / "JSB Chorales.pickle"
    assert cached.is_file() and sorted(p.name for p in cached.parent.iterdir()) == [cached.name]
    (folder / "JSB Chorales.pickle").unlink()  # a second load reads the cache, not the server
    assert D.content_digest(load_polyphonic("jsb", progress=False)) == D.content_digest(jsb)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "wrong-content"])
def test_bad_download_leaves_nothing(tmp_path, server, jsb, monkeypatch, damage):
    folder, base = server
    D.write_pickle(jsb, tmp_path / "built.pickle")
    good = (tmp_path / "built.pickle").read_bytes()
    info = serve_jsb(monkeypatch, folder, base, good)  # the checksum is that of the good file
    if damage == "truncated":
        (folder / "JSB Chorales.pickle").write_bytes(good[: len(good) // 2])
        match = "SHA-256 mismatch"
    elif damage == "flipped":
        (folder / "JSB Chorales.pickle").write_bytes(good[:-100] + bytes(100))
        match = "SHA-256 mismatch"
    else:  # no published checksum (as for Nottingham): the contents are checked instead
        fewer = {**jsb, "train": jsb["train"][:-1]}
        D.write_pickle(fewer, tmp_path / "fewer.pickle")
        serve_jsb(monkeypatch, folder, base, (tmp_path / "fewer.pickle").read_bytes(), sha=False)
        match = "229"
    root = tmp_path / "root"
    with pytest.raises(DataError, match=match):
        load_polyphonic("jsb", root=root, progress=False)
    assert not root.exists()  # nothing is left, not even the folder the download made
    assert info.name == "jsb"


def test_truncated_pickle_without_checksum(tmp_path, server, jsb, monkeypatch):
    folder, base = server
    D.write_pickle(jsb, tmp_path / "built.pickle")
    serve_jsb(monkeypatch, folder, base, (tmp_path / "built.pickle").read_bytes()[:5000],
              sha=False)
    with pytest.raises(DataError, match="not a readable data pickle"):
        load_polyphonic("jsb", root=tmp_path / "root", progress=False)
    assert not (tmp_path / "root").exists()  # the folder the failed download made is gone


def test_unreachable_server_is_a_clear_error(tmp_path, monkeypatch):
    info = dataclasses.replace(D.DATASETS["piano"], urls=("http://127.0.0.1:9/x.pickle",))
    monkeypatch.setitem(D.DATASETS, "piano", info)
    with pytest.raises(DataError, match=r"could not download Piano-midi\.de"):
        load_polyphonic("piano", root=tmp_path, progress=False)
    # a relative root that names folders not there (the README's, run outside the checkout):
    # every folder the attempt made is removed again, the ones that were there are kept
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kept").mkdir()
    with pytest.raises(DataError, match="could not download"):
        load_polyphonic("piano", root="kept/shared/data/polyphonic", progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept"]
    assert not any((tmp_path / "kept").iterdir())


def test_local_pickle_is_read(tmp_path, jsb, data_dir):
    D.write_pickle(jsb, tmp_path / "JSB Chorales.pickle")
    info = dataclasses.replace(D.DATASETS["jsb"], pickle_sha256=None)
    D.DATASETS["jsb"], saved = info, D.DATASETS["jsb"]
    try:
        data = load_polyphonic("jsb", root=tmp_path, download=False)
    finally:
        D.DATASETS["jsb"] = saved
    assert D.content_digest(data) == D.content_digest(jsb)
    shutil.copy(data_dir / "JSB_Chorales.mat", tmp_path)  # the .mat wins when both are there
    assert D.data_checksum("jsb", tmp_path) == saved.mat_sha256


def test_next_step_pairs_and_collate():
    seqs = [np.eye(88, dtype=np.uint8)[:n] for n in (5, 3, 1)]
    pairs = batching.next_step_pairs(seqs)
    assert len(pairs) == 2  # the length-1 sequence has no pair
    np.testing.assert_array_equal(pairs[0][0], seqs[0][:-1])
    np.testing.assert_array_equal(pairs[0][1], seqs[0][1:])
    batch = batching.collate(seqs)
    assert batch.inputs.shape == (2, 4, 88)
    assert batch.lengths.tolist() == [4, 2]
    assert batch.mask.tolist() == [[True] * 4, [True, True, False, False]]
    assert batch.inputs[1, 2:].abs().sum() == 0 and batch.targets[1, 2:].abs().sum() == 0
    np.testing.assert_array_equal(batch.targets[1, :2].numpy(), seqs[1][1:])
    with pytest.raises(ValueError, match="length >= 2"):
        batching.collate([seqs[2]])


def test_polyphonic_music_is_a_dataset_for_a_data_loader(data_dir, jsb, tmp_path):
    """``PolyphonicMusic`` serves one split's rolls as float tensors (transformed if asked), and
    a ``DataLoader`` with ``collate_fn=collate`` gives the batches ``collate`` gives the arrays."""
    import torch
    from torch.utils.data import DataLoader

    from linmem import PolyphonicMusic

    valid = PolyphonicMusic("JSB Chorales", "valid", root=data_dir)
    assert len(valid) == 76 and valid.lengths == [len(s) for s in jsb["valid"]]
    assert valid[3].dtype == torch.float32 and valid[3].shape == (len(jsb["valid"][3]), 88)
    assert torch.equal(valid[3], torch.from_numpy(jsb["valid"][3]).float())
    assert repr(valid) == (f"PolyphonicMusic('JSB Chorales', split='valid': 76 sequences, "
                           f"{sum(valid.lengths)} frames)")
    batches = list(DataLoader(valid, batch_size=5, collate_fn=batching.collate))
    assert len(batches) == 16
    first, expected = batches[0], batching.collate(jsb["valid"][:5])
    for field in ("inputs", "targets", "mask", "lengths"):
        assert torch.equal(getattr(first, field), getattr(expected, field))
    flipped = PolyphonicMusic("jsb", "test", root=data_dir, transform=lambda r: r.flip(-1))
    assert torch.equal(flipped[0], torch.from_numpy(jsb["test"][0]).float().flip(-1))
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'valid', 'test'\]"):
        PolyphonicMusic("jsb", "validation", root=data_dir)
    with pytest.raises(DataError, match="not found"):
        PolyphonicMusic("jsb", root=tmp_path, download=False)


def test_bucket_batches_cover_every_sequence_once(jsb):
    lengths = [len(s) for s in jsb["train"]]
    for shuffle in (False, True):
        batches = batching.bucket_batches(lengths, 16, shuffle=shuffle, seed=3)
        flat = sorted(i for b in batches for i in b)
        assert flat == list(range(len(lengths)))
        assert all(1 <= len(b) <= 16 for b in batches)
    bucket = batching.bucket_batches
    assert bucket(lengths, 16, True, 3) == bucket(lengths, 16, True, 3)
    assert bucket(lengths, 16, True, 3) != bucket(lengths, 16, True, 4)
    # padding: brute force over the batches, and much less than random batching
    batches = batching.bucket_batches(lengths, 16, True, 0)
    padded = sum(len(b) * max(lengths[i] for i in b) for b in batches)
    assert batching.padding_fraction(lengths, batches) == pytest.approx(1 - sum(lengths) / padded)
    rng = np.random.default_rng(0)
    order = rng.permutation(len(lengths))
    random_batches = [order[i: i + 16].tolist() for i in range(0, len(order), 16)]
    assert batching.padding_fraction(lengths, batches) < 0.5 * batching.padding_fraction(lengths,
                                                                          random_batches)


def test_bucket_batches_bound_the_padding_without_shuffle(jsb):
    lengths = [len(s) for s in jsb["valid"]] + [2000, 2100, 5000]  # MuseData's long tail
    batches = batching.bucket_batches(lengths, 16, shuffle=False, max_ratio=1.25)
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    # consecutive in length order, at most 16, none beyond 1.25x its shortest
    flat = [i for b in batches for i in b]
    assert [lengths[i] for i in flat] == sorted(lengths)
    assert all(1 <= len(b) <= 16 for b in batches)
    assert all(max(lengths[i] for i in b) <= 1.25 * min(lengths[i] for i in b) for b in batches)
    # each batch ends for a reason: full, or the next sequence too long for it
    for b, nxt in itertools.pairwise(batches):
        assert len(b) == 16 or lengths[nxt[0]] > 1.25 * lengths[b[0]]
    assert batches[-1] == [len(lengths) - 1]  # 5000 alone at the end
    assert batching.bucket_batches(lengths, 16, False) == [flat[i: i + 16]
                                                   for i in range(0, len(flat), 16)]
    assert batching.bucket_batches([], 4, False, max_ratio=1.5) == []
    for bad in (dict(shuffle=True, max_ratio=1.25), dict(shuffle=False, max_ratio=0.9)):
        with pytest.raises(ValueError, match="max_ratio"):
            batching.bucket_batches(lengths, 16, **bad)


def test_iterate_batches_yields_all_frames(jsb):
    frames = sum(int(b.mask.sum()) for b in batching.iterate_batches(jsb["valid"], 8))
    assert frames == sum(len(s) - 1 for s in jsb["valid"])
    assert Path(D.default_root()).name in ("linmem", Path(os.environ.get("LINMEM_DATA",
                                                                           "linmem")).name)
