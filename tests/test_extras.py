"""The light install: the layer, the autoencoder, the data and ``linmem train`` need none of the
extras' packages, and a feature that needs a missing one says in one line which extra to
install (``linmem._extras``). The missing packages are simulated in a fresh interpreter
(``sys.modules[name] = None`` makes ``import name`` fail as an absent package does); the wheel
check (``.ci/wheel-check``) installs the bare wheel for real."""

import json
import subprocess
import sys

import pytest

from linmem._extras import EXTRAS, MissingExtra, extra_message, missing_extra, require

BLOCK = "import sys\nfor _name in {names!r}: sys.modules[_name] = None\n"


def _without_extras(code: str, *args: str, cwd=None) -> subprocess.CompletedProcess:
    """``code`` run by a fresh interpreter in which no package of an extra can be imported."""
    names = sorted({*EXTRAS, "optuna.trial", "optuna.storages"})
    return subprocess.run([sys.executable, "-c", BLOCK.format(names=names) + code, *args],
                          capture_output=True, text=True, cwd=cwd, timeout=300)


def _cli(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return _without_extras("from linmem.cli.launch import main\nsys.argv[1:] = sys.argv[1:]\n"
                           "main()", *args, cwd=cwd)


def test_require_names_the_extra(monkeypatch):
    assert require("optuna", "x").__name__ == "optuna"
    monkeypatch.setitem(sys.modules, "pretty_midi", None)
    with pytest.raises(MissingExtra) as err:
        require("pretty_midi", "MIDI")
    assert str(err.value) == ("MIDI needs pretty_midi, which is not installed: pip install "
                              "'linear-memory-networks[midi]'")
    assert err.value.name == "pretty_midi" and isinstance(err.value, ModuleNotFoundError)
    assert missing_extra("optuna", "x") is None
    assert extra_message("optuna", "linmem search").endswith("[search]'")


def _declared_dependencies() -> tuple[list[str], dict[str, list[str]]]:
    """``pyproject.toml``'s dependencies and optional dependencies (``tomllib``, Python 3.11+;
    on 3.10 the installed distribution's metadata, which the same file made)."""
    try:
        import tomllib
    except ImportError:  # Python 3.10
        from importlib import metadata

        core, extras = [], {}
        for line in metadata.metadata("linear-memory-networks").get_all("Requires-Dist") or []:
            spec, _, marker = line.partition(";")
            if "extra ==" in marker:
                extras.setdefault(marker.split("==")[1].strip(" \"'"), []).append(spec.strip())
            else:
                core.append(spec.strip())
        return core, extras
    from pathlib import Path

    meta = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    return meta["project"]["dependencies"], meta["project"]["optional-dependencies"]


def test_every_extra_is_declared_in_the_package_metadata():
    """Each extra :data:`EXTRAS` names is one of ``pyproject.toml``'s, none of their packages
    is a dependency of the bare install, and ``[all]`` holds the packages of the others."""
    core, extras = _declared_dependencies()
    assert set(EXTRAS.values()) <= set(extras)
    for name in ("optuna", "pretty_midi", "matplotlib", "psycopg2"):
        assert not any(dep.startswith(name) for dep in core), name
    packages = {p for extra in set(EXTRAS.values()) for p in extras[extra]}
    assert packages == set(extras["all"])


def test_the_layer_and_training_need_no_extra(tmp_path, data_dir):
    """Without Optuna, SQLAlchemy, pretty_midi and matplotlib: the README's imports run, and
    ``linmem train`` trains and scores a run."""
    code = ("import torch\nfrom linmem import LMN, LinearAutoencoder, load_polyphonic\n"
            "out, _ = LMN(88, 6, 5, batch_first=True)(torch.rand(2, 7, 88))\n"
            "la = LinearAutoencoder(3).fit([torch.rand(9, 4).numpy()])\n"
            f"data = load_polyphonic('jsb', root={str(data_dir)!r})\n"
            "print(tuple(out.shape), la.components_.shape[0], len(data['train']))")
    done = _without_extras(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(2,", "7,", "5)", "3", "229"]
    run = tmp_path / "run"
    done = _cli("train", "--data", "jsb", "--data-dir", str(data_dir), "--model", "lmn-b",
                "--hidden", "6", "--memory", "5", "--batch-size", "64", "--epochs", "1",
                "--out", str(run), "--quiet")
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 1
    assert _cli("--help").returncode == 0


@pytest.mark.parametrize(("args", "extra"), [
    (["search", "--data", "jsb", "--model", "lmn-b", "--grid", "quick"], "search"),
    (["progress"], "search"),
    (["data", "import-midi", ".", "--out", "x.pickle"], "midi"),
    (["generate", "run", "--prime", "test:0", "--out", "a.mid"], "midi"),
    (["plot", "run"], "plot"),
])
def test_a_feature_without_its_extra_says_which_to_install(tmp_path, args, extra):
    done = _cli(*args, cwd=tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"linmem: error: linmem {args[0]}") and "not installed" in lines[0]
    assert lines[0].endswith(f"pip install 'linear-memory-networks[{extra}]'")
    assert list(tmp_path.iterdir()) == []  # said before anything was written


@pytest.mark.parametrize(("code", "extra"), [
    ("from linmem.experiments import search", "search"),
    ("from linmem.experiments import studies", "search"),
    ("import linmem.midi", "midi"),
    ("from linmem.experiments.plots import plot_run\nplot_run('run', 'x.png')", "plot"),
])
def test_the_library_names_the_missing_extra(code, extra):
    """From Python too, a module or function that needs an extra raises ``MissingExtra`` (a
    ``ModuleNotFoundError``) whose message names the extra to install."""
    done = _without_extras(f"try:\n    {code.replace(chr(10), chr(10) + '    ')}\n"
                           "except ModuleNotFoundError as err:\n"
                           "    print(type(err).__name__, err)\n")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("MissingExtra ")
    assert done.stdout.strip().endswith(f"pip install 'linear-memory-networks[{extra}]'")
