"""linmem.training.runs: a run directory's files, how a run ended, and what results/ keeps of it."""

import json
import subprocess
import sys

import pytest
import torch

from linmem.experiments.publish import publish
from linmem.training import runs


def _run(path, ended="metrics", ulm=False):
    path.mkdir(parents=True)
    (path / runs.CONFIG).write_text(json.dumps({"model": "lmn-b"}))
    (path / runs.LOG).write_text('{"epoch": 1}\n')
    (path / runs.BEST).write_bytes(b"weights")
    if ended == "metrics":
        (path / runs.METRICS).write_text(json.dumps({"test_acc": 30.0}))
    elif ended == "diverged":
        (path / runs.DIVERGED).write_text(json.dumps({"diverged": "nan"}))
    if ulm:
        (path / runs.ULM).mkdir()
        (path / runs.ULM / runs.METRICS).write_text("{}")
        (path / runs.ULM / runs.LAST).write_bytes(b"not published")
    return path


def test_how_a_run_ended(tmp_path):
    assert runs.end_record(_run(tmp_path / "a")) == tmp_path / "a" / runs.METRICS
    assert runs.end_record(_run(tmp_path / "b", "diverged")) == tmp_path / "b" / runs.DIVERGED
    assert not runs.ended(_run(tmp_path / "c", None)) and not runs.ended(tmp_path / "none")


def test_publish_copies_the_records_and_only_them(tmp_path):
    run = _run(tmp_path / "runs" / "a", ulm=True)
    dest = tmp_path / "results" / "a"
    written = publish(run, dest)
    assert sorted(p.relative_to(dest).as_posix() for p in written) == [
        "config.json", "log.jsonl", "metrics.json", "ulm/metrics.json"]
    for p in written:
        assert p.read_bytes() == (run / p.relative_to(dest)).read_bytes()
    assert not (dest / runs.BEST).exists() and not (dest / runs.ULM / runs.LAST).exists()
    assert (dest / runs.BEST) in publish(run, dest, checkpoint=True)


def test_publish_replaces_what_the_run_no_longer_has(tmp_path):
    """A seed published when it had scores, then run again and diverged: its folder in results/
    holds the divergence, not the stale scores."""
    run = _run(tmp_path / "s1")
    dest = tmp_path / "out"
    publish(run, dest)
    (run / runs.METRICS).unlink()
    (run / runs.DIVERGED).write_text(json.dumps({"diverged": "inf"}))
    publish(run, dest)
    assert (dest / runs.DIVERGED).is_file() and not (dest / runs.METRICS).exists()


def test_publish_refuses_a_run_that_has_not_ended(tmp_path):
    with pytest.raises(ValueError, match="not ended"):
        publish(_run(tmp_path / "a", None), tmp_path / "out")


def test_publish_command_names_seeds_and_leaves_out_unfinished_runs(tmp_path):
    """``linmem publish`` as the Makefile uses it: reseed's OUT/sK become OUT-sK."""
    for s in ("s1", "s2"):
        _run(tmp_path / "runs" / "jsb-lmn-b" / s)
    _run(tmp_path / "runs" / "jsb-lmn-b" / "s3", None)
    done = subprocess.run([sys.executable, "-m", "linmem", "publish",
                           *(str(tmp_path / "runs" / "jsb-lmn-b" / s) for s in ("s1", "s2", "s3")),
                           "--to", str(tmp_path / "results"), "--name", "seed"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["jsb-lmn-b-s1",
                                                                         "jsb-lmn-b-s2"]
    assert "s3: not ended, left out" in done.stderr


def test_where_a_failed_run_failed():
    """diverged.json says where a run failed; records written before the field name it in their
    message: a selected checkpoint scored on the test split, its pretraining's, or training."""
    from linmem.training.runs import FAILURES, failed_on

    assert failed_on({"diverged": "x", "failed_on": "valid"}) == "valid" and "valid" in FAILURES
    assert failed_on({"diverged": "the training loss became NaN or inf in epoch 3"}) == "training"
    assert failed_on({"diverged": "the checkpoint chosen on validation (epoch 2): NaN"}) == "test"
    assert failed_on({"diverged": "its pretraining: the checkpoint chosen on validation (epoch "
                                  "8): NaN"}) == "pretraining test"
    assert failed_on({"diverged": "its pretraining: the training loss became NaN"}) == \
        "pretraining training"


def test_a_ctrl_c_during_a_checkpoint_write_is_an_interrupt_and_keeps_the_file(tmp_path,
                                                                                monkeypatch):
    """A Ctrl-C that lands while torch.save writes (in the file's ``write``) is the
    ``KeyboardInterrupt`` it is, not torch's "unexpected pos" ``RuntimeError`` (which the
    command line would print as an error, exit 1, instead of "interrupted", exit 130); the
    checkpoint there keeps the previous one, whole."""
    import contextlib

    from linmem.training.runs import load_checkpoint, save_checkpoint

    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1, "w": torch.zeros(3)}, path)
    writes = []

    class Interrupted:  # the file torch.save writes to, a Ctrl-C landing in its second write
        def __init__(self, f):
            self.f = f

        def write(self, data):
            writes.append(len(data))
            if len(writes) == 2:
                raise KeyboardInterrupt
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    real = runs.atomic_write

    @contextlib.contextmanager
    def atomic_write(target, *args, **kwargs):
        with real(target, *args, **kwargs) as f:
            yield Interrupted(f)

    monkeypatch.setattr(runs, "atomic_write", atomic_write)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint({"epoch": 2, "w": torch.ones(1000)}, path)
    monkeypatch.undo()
    assert len(writes) == 2 and load_checkpoint(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]  # no temporary file left


def test_run_under_looks_in_each_root_in_order(tmp_path):
    """A trial's run directory under one runs root or several: the first that holds it, else
    the first root's path; no root at all is refused."""
    first, second = tmp_path / "a", tmp_path / "b"
    (second / "runs" / "x").mkdir(parents=True)
    assert runs.run_under(first, "runs/x") == first / "runs" / "x"
    assert runs.run_under([first, second], "runs/x") == second / "runs" / "x"
    (first / "runs" / "x").mkdir(parents=True)
    assert runs.run_under([first, second], "runs/x") == first / "runs" / "x"
    assert runs.run_under([first, second], "runs/y") == first / "runs" / "y"
    assert runs.run_under(str(second), "runs/x") == second / "runs" / "x"
    with pytest.raises(ValueError, match="no runs root"):
        runs.run_under([], "runs/x")
