"""The package's structure: imports flow one way, and one registry entry adds a model."""

import ast
from pathlib import Path

import pytest
import torch
from torch import nn

import linmem
from linmem import models, recipes, search
from linmem.cli import cli
from linmem.metrics import masked_nll
from linmem.train import TrainConfig, load_run_model

PACKAGE = Path(linmem.__file__).parent


def package_imports() -> dict[str, set[str]]:
    """Every module of the package and the package modules it imports, at any level (inside
    functions and under ``TYPE_CHECKING`` too)."""
    graph = {}
    for path in sorted(PACKAGE.glob("*.py")):
        name = path.stem if path.stem != "__init__" else "linmem"
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                if node.level == 1 or (node.module or "").startswith("linmem"):
                    base = (node.module or "").removeprefix("linmem").lstrip(".")
                    if base:
                        edges.add(base.split(".")[0])
                    else:  # from . import x: a submodule, or a name of the package itself
                        for alias in node.names:
                            sub = alias.name
                            edges.add(sub if (PACKAGE / f"{sub}.py").is_file() else "linmem")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("linmem."):
                        edges.add(alias.name.split(".")[1])
        graph[name] = edges - {name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        state[node] = 2
        stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_imports_have_no_cycle():
    graph = package_imports()
    assert {"train", "recipes", "models", "nn", "cli"} <= set(graph)
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))
    # the layers of issue 14: the trainer knows no model module and no recipe
    assert not graph["train"] & {"pretrain", "rnnrbm", "recipes", "search", "cli"}
    assert not graph["pretrain"] & {"train", "recipes"}
    assert not graph["rnnrbm"] & {"train", "recipes", "models"}
    # the harness above the library (issue 47): a run directory is read in one module, which
    # reads nothing else of ours; the searches know no table, figure or diagnostic
    assert graph["runs"] <= {"_io", "_check"}
    assert not graph["search"] & {"report", "plots", "analyses", "progress", "cli"}
    assert not graph["report"] & {"search", "cli"}


def _string_constants(tree: ast.AST) -> list[str]:
    """The string literals of ``tree``, but the text between an f-string's fields."""
    fragments = {id(v) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                 for v in node.values}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in fragments]


def test_only_runs_names_the_files_of_a_run_directory():
    """``linmem.runs`` is the one owner of a run directory's file names: no other module of the
    package spells one as a string of its own (prose in messages and docstrings aside)."""
    from linmem import runs

    for path in PACKAGE.glob("*.py"):
        if path.stem == "runs":
            continue
        found = set(_string_constants(ast.parse(path.read_text()))) & set(runs.RUN_FILES)
        assert not found, f"{path.name} spells {sorted(found)}: use linmem.runs' names"


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def test_trainer_has_no_model_specific_code():
    source = (PACKAGE / "train.py").read_text()
    for name in (*models.MODELS, "RNNRBM", "NextStepPredictor", "isinstance"):
        assert f'"{name}"' not in source and f"{name}(" not in source, name


def test_every_module_declares_its_public_names():
    for path in PACKAGE.glob("*.py"):
        if path.stem in ("__main__",):
            continue
        tree = ast.parse(path.read_text())
        names = [t.id for node in tree.body if isinstance(node, ast.Assign)
                 for t in node.targets if isinstance(t, ast.Name)]
        assert "__all__" in names, path.name


class RunningMean(nn.Module):
    """A model written in a test: each key's running mean over the frames so far, through a
    per-key affine map and a sigmoid. Implements the trainer's protocol and nothing else."""

    train_loss_name = "train_nll"
    valid_nll_name = "valid_nll"

    def __init__(self, input_size: int, decay: float):
        super().__init__()
        self.decay = decay
        self.scale = nn.Parameter(torch.ones(input_size))
        self.bias = nn.Parameter(torch.zeros(input_size))

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        state, out = torch.zeros_like(inputs[:, 0]), []
        for t in range(inputs.shape[1]):
            state = self.decay * state + (1 - self.decay) * inputs[:, t]
            out.append(state)
        return self.scale * torch.stack(out, 1) + self.bias

    def training_loss(self, batch):
        return masked_nll(self(batch.inputs), batch.targets, batch.mask)

    def init_output_bias(self, key_rates, eps=1e-3):
        with torch.no_grad():
            p = key_rates.to(self.bias).clamp(eps, 1 - eps)
            self.bias.copy_(torch.log(p) - torch.log1p(-p))

    def finalize_metrics(self, metrics, data):
        return {**metrics, "decay": self.decay}


@pytest.fixture
def running_mean():
    def build(input_size, options):
        return RunningMean(input_size, decay=1 - 1 / options.hidden)

    spec = models.register(models.ModelSpec(
        "running-mean", "Running mean", "running-mean", build))
    yield spec
    models.unregister("running-mean")


def test_a_model_is_one_registry_entry(tmp_path, jsb, running_mean):
    """Registered here, the model trains through the public entry point, reloads from its run,
    is a command-line choice, has grid points and a display name in the report."""
    data = {split: seqs[:8] for split, seqs in jsb.items()}
    config = TrainConfig(model="running-mean", hidden=4, epochs=3, batch_size=4)
    metrics = recipes.run(config, tmp_path / "run", progress=False, data=data)
    assert metrics["model"] == "running-mean" and metrics["epochs"] == 3
    assert metrics["decay"] == 0.75 and metrics["memory"] is None  # its hook; no memory
    assert metrics["n_params"] == 2 * 88 and 0 < metrics["test_acc"] < 100
    model, saved = load_run_model(tmp_path / "run")
    assert isinstance(model, RunningMean) and saved.model == "running-mean"
    train_options = {p.name: p for p in cli.commands["train"].params}
    assert "running-mean" in train_options["model"].type.choices
    assert [p.hidden for p in search.grid_points("running-mean", "quick")] \
        == [h for h in search.GRIDS["quick"].hidden for _ in search.GRIDS["quick"].weight_decay]
    assert models.display_name("running-mean") == "Running mean"
    with pytest.raises(ValueError, match="registered already"):
        models.register(running_mean)


def test_registry_is_the_source_of_the_model_lists():
    assert linmem.MODELS == models.model_names() == tuple(models.REGISTRY)
    assert "rnn-rbm" in linmem.MODELS
    assert recipes.pretrained_models() == ["pret-lmn-a", "pret-lmn-b", "pret-rnn"]
    with pytest.raises(ValueError, match="unknown model 'mlp'"):
        models.get_spec("mlp")


def test_the_package_exports_what_its_docstring_promises():
    """Every name of ``linmem.__all__`` resolves (imported on first use), each to the object of
    the module that defines it."""
    from linmem.config import TrainConfig as config_class

    for name in linmem.__all__:
        assert getattr(linmem, name) is not None, name
    assert linmem.TrainConfig is config_class and linmem.LMN.__module__ == "linmem.nn"
