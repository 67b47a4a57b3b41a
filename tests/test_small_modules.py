"""Every module of the package is imported by a test: the small ones that the larger tests only
reached through others are checked here on their own (the shared recurrent helpers, the command
line's entry and groups, ``python -m linmem``, the pretraining analysis of Figure 5)."""

import ast
import runpy
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import linmem
from linmem.cli import experiments as cli_experiments
from linmem.cli import searches as cli_searches
from linmem.cli.commands import cli
from linmem.cli.common import _needs_extra
from linmem.cli.launch import main as launch_main
from linmem.experiments.pretraining import analyze
from linmem.models import build_model
from linmem.nn.recurrent import check_dtype, in_parameter_precision, init_uniform, no_torchscript

PACKAGE = Path(linmem.__file__).parent
TESTS = Path(__file__).parent


def _modules() -> set[str]:
    names = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        names.add(".".join(parts) or "linmem")
    return names


def _imported_by_tests(modules: set[str]) -> set[str]:
    """The modules some test file imports (``from linmem.X import ...``, ``import linmem.X``,
    ``from linmem.P import X`` for a module X), or runs (``runpy.run_module("linmem")``: the
    package's ``__main__``)."""
    seen = set()
    for path in TESTS.glob("*.py"):
        text = path.read_text()
        if 'run_module("linmem"' in text:
            seen.add("__main__")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ImportFrom) and not node.level \
                    and (node.module or "").split(".")[0] == "linmem":
                base = node.module.removeprefix("linmem").lstrip(".")
                seen.add(base or "linmem")
                seen.update(f"{base}.{a.name}".lstrip(".") for a in node.names
                            if f"{base}.{a.name}".lstrip(".") in modules)
            elif isinstance(node, ast.Import):
                seen.update(a.name.removeprefix("linmem").lstrip(".") or "linmem"
                            for a in node.names if a.name.split(".")[0] == "linmem")
    return seen


def test_every_module_is_imported_by_a_test():
    modules = _modules()
    assert {"nn.recurrent", "cli.launch", "__main__", "ops.toolkit"} <= modules
    missing = sorted(modules - _imported_by_tests(modules))
    assert not missing, f"no test imports {missing}"


def test_python_dash_m_runs_the_command_line(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["linmem", "--version"])
    runpy.run_module("linmem", run_name="__main__")
    assert capsys.readouterr().out.startswith("linmem, version ")


def test_the_entry_point_prints_the_usage_without_torch_work(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["linmem", "--help"])
    launch_main()
    out = capsys.readouterr().out
    assert out.startswith("Usage: linmem") and "train" in out and "search" in out


def test_the_command_groups_are_the_command_lines():
    """The commands of the experiments' and the searches' modules are commands of ``linmem``."""
    for command in (*cli_experiments.COMMANDS, cli_searches.search_cmd, cli_searches.report_cmd):
        assert cli.commands[command.name] is command


def test_needs_extra_exits_in_one_line(monkeypatch):
    import click

    _needs_extra("optuna", "linmem search")  # installed here: nothing happens
    monkeypatch.setitem(sys.modules, "optuna", None)
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(click.ClickException, match=r"\[search\]'$"):
        _needs_extra("optuna", "linmem search")


def test_check_dtype_says_how_to_convert():
    weight = torch.zeros(2, dtype=torch.float64)
    check_dtype(torch.zeros(2, dtype=torch.float64), weight)
    with pytest.raises(TypeError, match=r"input is torch.float32, .*input.to\(torch.float64\)"):
        check_dtype(torch.zeros(2), weight)
    with pytest.raises(TypeError, match="to a floating dtype"):
        check_dtype(torch.zeros(2, dtype=torch.long), weight)


def test_init_uniform_is_torch_rnns():
    """The bound of ``torch.nn.RNN``'s initialisation, 1/sqrt(fan_in), and its spread."""
    torch.manual_seed(0)
    weight = torch.empty(400, 100)
    init_uniform(weight, fan_in=25)
    assert weight.abs().max() <= 0.2 and weight.abs().max() > 0.199
    assert abs(weight.var().item() - 0.2 ** 2 / 3) < 1e-3  # U(-a, a): a^2 / 3


def test_parameter_precision_under_autocast():
    """Under CPU autocast to bfloat16 the recurrence runs in the parameters' float32; outside it
    the input passes as it is."""

    class Echo(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.ones(1))

        @in_parameter_precision
        def forward(self, input, state=None):
            return input.dtype, None if state is None else state.dtype

    echo = Echo()
    x = torch.ones(2, dtype=torch.bfloat16)
    assert echo(x) == (torch.bfloat16, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert echo(x, x) == (torch.float32, torch.float32)


def test_torchscript_is_refused_in_one_line():
    with pytest.raises(RuntimeError, match="does not support TorchScript"):
        no_torchscript(nn.Linear(1, 1))


def test_pretraining_analysis_on_a_small_ulm(jsb):
    """Figure 5's analysis: the autoencoder's recursive error is never below the truncated SVD's
    (the optimum), both fall as the memory grows, and decoding the first sequence's whole prefix
    from a full-rank memory is exact (relative error at float64 rounding)."""
    torch.manual_seed(0)
    data = {split: [s[:20] for s in seqs[:6]] for split, seqs in jsb.items()}
    model = build_model("ulm", 4, k=3)  # as linmem.training.evaluation.load_run_model gives
    with pytest.warns(UserWarning, match="exceeds rank"):  # asked for more than the states hold
        result = analyze(data, model, [2, 8], window=4, first_memory=200, progress=False)
    rows = result["memories"]
    assert [r["memory"] for r in rows] == [2, 8]
    for r in rows:
        assert r["la_error"] >= r["svd_error"] - 1e-12
    assert rows[1]["svd_error"] <= rows[0]["svd_error"]
    errors = np.array(result["first_sequence"]["relative_error"])
    assert len(errors) == len(data["train"][0]) - 1 and errors.max() < 1e-8  # inputs: T - 1
