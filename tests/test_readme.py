"""The README's Python examples run as written (but for the data folder and, in the last one,
the training budget) and give what their comments say."""

import json
import re
from pathlib import Path

import numpy as np
import torch

from linmem.models import build_model, unregister

README = Path(__file__).resolve().parents[1] / "README.md"


def _run(code: str, namespace: dict, **replace: str) -> None:
    """``code`` with each key of ``replace`` (found in it) replaced by its value, executed."""
    for old, new in replace.items():
        assert old in code, f"the README example no longer contains {old!r}"
        code = code.replace(old, new)
    exec(compile(code, str(README), "exec"), namespace)


def test_readme_examples_run_and_say_what_they_give(data_dir, tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert len(blocks) == 3
    monkeypatch.chdir(tmp_path)
    ns: dict = {}

    _run(blocks[0], ns, **{'"../shared/data/polyphonic"': repr(str(data_dir))})
    assert ns["out"].shape == (8, 50, 100) and ns["out2"].shape == (8, 20, 100)
    # LMN-B's output is its memory state: the last one is the returned m_n
    torch.testing.assert_close(ns["out"][:, -1], ns["m_n"][-1])
    assert set(ns["data"]) == {"train", "valid", "test"}
    roll = ns["roll"]
    assert roll.dtype == np.uint8 and roll.shape[1] == 88

    _run(blocks[1], ns)
    la = ns["la"]
    assert ns["states"].shape == (len(roll), 100) and ns["last10"].shape == (10, 88)
    assert la.A_.shape == (100, 88) and la.B_.shape == (100, 100)
    assert set(la.reconstruction_error(ns["data"]["train"][:5])) >= {"la", "svd"}

    # a model of your own: here the library's RNN under another name, trained for one epoch
    ns["MyRNN"] = lambda input_size, hidden: build_model("rnn", hidden, input_size=input_size)
    try:
        _run(blocks[2], ns, **{"hidden=64)": f"hidden=64, epochs=1, batch_size=64, "
                                              f"data_dir={str(data_dir)!r})"})
    finally:
        unregister("my-rnn")
    metrics = json.loads((tmp_path / "runs" / "my-rnn" / "metrics.json").read_text())
    assert metrics["model"] == "my-rnn" and metrics["epochs"] == 1
