"""The README's and the user guide's examples run as written (but for the data folder and the
training budget) and give what their comments say; the commands they name exist."""

import json
import re
from pathlib import Path

import click
import numpy as np
import torch

from linmem.cli.commands import cli, train_cmd
from linmem.models import build_model
from linmem.registry import unregister

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
GUIDE = ROOT / "docs" / "guide"


def _run(code: str, namespace: dict, source: Path, **replace: str) -> None:
    """``code`` with each key of ``replace`` (found in it) replaced by its value, executed."""
    for old, new in replace.items():
        assert old in code, f"the example of {source.name} no longer contains {old!r}"
        code = code.replace(old, new)
    exec(compile(code, str(source), "exec"), namespace)


def _python_blocks(path: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), re.S)


def test_readme_example_runs_and_says_what_it_gives(data_dir, tmp_path, monkeypatch):
    """As written, from a folder outside the checkout (the data from LINMEM_DATA)."""
    (block,) = _python_blocks(README)
    assert len(block.strip().splitlines()) <= 10
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LINMEM_DATA", str(data_dir))
    ns: dict = {}
    _run(block, ns, README)
    assert ns["out"].shape == (8, 50, 100) and ns["out2"].shape == (8, 20, 100)
    # LMN-B's output is its memory state: the last one is the returned m_n
    torch.testing.assert_close(ns["out"][:, -1], ns["m_n"][-1])
    assert set(ns["data"]) == {"train", "valid", "test"}
    roll = ns["data"]["train"][0]
    assert roll.dtype == np.uint8 and roll.shape[1] == 88
    assert ns["states"].shape == (len(roll), 100) and ns["la"].A_.shape == (100, 88)


def test_guide_examples_of_training_run(data_dir, tmp_path, monkeypatch):
    """The quick start's training from Python and the models page's model of your own (here the
    library's RNN under another name), each for one epoch."""
    monkeypatch.chdir(tmp_path)
    (quick,) = _python_blocks(GUIDE / "quickstart.md")
    ns: dict = {}
    _run(quick, ns, GUIDE / "quickstart.md", **{"memory=100)": f"memory=100, epochs=1, "
                                                               f"data_dir={str(data_dir)!r})"})
    assert 0 < ns["metrics"]["valid_acc"] < 100 and ns["metrics"]["epochs"] == 1

    (own,) = _python_blocks(GUIDE / "models.md")
    ns = {"MyRNN": lambda input_size, hidden: build_model("rnn", hidden, input_size=input_size)}
    try:
        _run(own, ns, GUIDE / "models.md", **{"hidden=64)": f"hidden=64, epochs=1, "
                                                            f"batch_size=64, "
                                                            f"data_dir={str(data_dir)!r})"})
    finally:
        unregister("my-rnn")
    metrics = json.loads((tmp_path / "runs" / "my-rnn" / "metrics.json").read_text())
    assert metrics["model"] == "my-rnn" and metrics["epochs"] == 1


def _check_command_lines(lines: list[str]) -> int:
    """Every ``linmem ...`` line names a command that exists, and every ``--option`` on it (or
    on its continuation lines) is one that command takes (``pretrain`` takes ``train``'s)."""
    entries: list[tuple[list[str], set[str]]] = []
    for line in lines:
        code = line.split("#", 1)[0]  # a comment says what the line does
        if code.startswith("linmem "):
            entries.append((code.split()[1:], set()))
        elif not entries:
            continue
        entries[-1][1].update(re.findall(r"--[a-z][a-z0-9-]*", code))
    for words, options in entries:
        command = cli
        while isinstance(command, click.Group) and words:
            _, command, words = command.resolve_command(click.Context(command), words)
        taken = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
        if command.name == "pretrain":
            taken |= {o for p in train_cmd.params for o in (*p.opts, *p.secondary_opts)}
        assert options <= taken, (command.name, options - taken)
    return len(entries)


def test_readme_and_guide_name_real_commands_and_options():
    table = README.read_text().split("## Commands", 1)[1].split("##", 1)[0]
    cells = [c.strip("` ") for row in table.splitlines() if row.startswith("| `linmem")
             for c in re.findall(r"`(linmem [^`]*)`", row)]
    assert _check_command_lines(cells) >= 15
    block = (GUIDE / "command_line.md").read_text().split("```bash\n", 1)[1].split("```", 1)[0]
    assert _check_command_lines(block.splitlines()) >= 15


def test_readme_is_read_in_five_minutes():
    assert len(README.read_text().splitlines()) <= 150
    for link in re.findall(r"\]\(((?:docs|results)/[^)#]*)\)", README.read_text()):
        assert (ROOT / link).exists(), link


def test_every_make_target_the_docs_name_is_in_the_makefile():
    root = ROOT
    targets = set(re.findall(r"^([a-z][a-z0-9-]*):", (root / "Makefile").read_text(), re.M))
    docs = [README, *sorted(GUIDE.glob("*.md")), *sorted((root / "results").rglob("*.md"))]
    named = {t for doc in docs for t in re.findall(r"`make ([a-z][a-z0-9-]*)", doc.read_text())}
    assert len(named) >= 10 and named <= targets, sorted(named - targets)
