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


def test_readme_command_line_names_real_commands_and_options():
    """Every ``linmem ...`` line of the README's command-line summary names a command that
    exists, and every ``--option`` on it (or on its continuation lines) is one that command
    takes (``pretrain`` takes ``train``'s)."""
    import click

    from linmem.cli import cli, train_cmd

    block = README.read_text().split("## Command line", 1)[1]
    block = block.split("```bash\n", 1)[1].split("```", 1)[0]
    entries: list[tuple[list[str], set[str]]] = []
    for line in block.splitlines():
        code = line.split("#", 1)[0]  # a comment says what the line does
        if code.startswith("linmem "):
            entries.append((code.split()[1:], set()))
        entries[-1][1].update(re.findall(r"--[a-z][a-z0-9-]*", code))
    assert len(entries) >= 15
    for words, options in entries:
        command = cli
        while isinstance(command, click.Group) and words:
            _, command, words = command.resolve_command(click.Context(command), words)
        taken = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        if command.name == "pretrain":
            taken |= {o for p in train_cmd.params for o in (*p.opts, *p.secondary_opts)}
        assert options <= taken, (command.name, options - taken)


def test_every_make_target_the_docs_name_is_in_the_makefile():
    root = README.parent
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (root / "Makefile").read_text(), re.M))
    docs = [README, *sorted((root / "results").rglob("*.md"))]
    named = {t for doc in docs for t in re.findall(r"`make ([a-z][a-z0-9-]*)", doc.read_text())}
    assert len(named) >= 10 and named <= targets, sorted(named - targets)
