"""Configuration declared once: every field of TrainConfig (the training settings and the models'
option classes) carries its help and valid values; TrainConfig checks them, the command line's
options are made from them, and a model is built from its own options class."""

import json
import re
from dataclasses import asdict, fields

import pytest
import torch

from linmem.cli import commands as cli_module
from linmem.cli.commands import main
from linmem.model_options import (
    ModelOptions,
    NADEOptions,
    PretrainOptions,
    RBMOptions,
    TransferOptions,
)
from linmem.models import build_model, model_options, option_names
from linmem.registry import REGISTRY, ModelSpec, register, unregister
from linmem.training.config import (
    LEGACY_PROTOCOL,
    PROTOCOL_FIELDS,
    PROTOCOLS,
    TrainConfig,
    record_protocol,
)

# one value outside each field's declared range, and the words of the error it must raise
BAD = {
    "hidden": (0, "hidden must be a positive integer, got 0"),
    "memory": (-1, "memory must be a positive integer or None, got -1"),
    "num_layers": (0, "num_layers must be a positive integer"),
    "dropout": (1.0, r"dropout must be in \[0, 1\), got 1.0"),
    "nonlinearity": ("sigmoid", "nonlinearity must be one of"),
    "seed": (-1, "seed must be an integer >= 0, got -1"),
    "memory_bound": (0.0, "memory_bound must be > 0 or None, got 0.0"),
    "k": (0, "k must be a positive integer"),
    "la_window": (-1, "la_window must be an integer >= 0 or None"),
    "pretrain_epochs": (0, "pretrain_epochs must be a positive integer or None"),
    "ulm_nonlinearity": ("sigmoid", "ulm_nonlinearity must be one of"),
    "ulm_cache": (3, "ulm_cache must be a str or None"),
    "rbm_hidden": (0, "rbm_hidden must be a positive integer"),
    "cd_k": (0, "cd_k must be a positive integer"),
    "rbm_predict": ("exact", r"rbm_predict must be one of \['gibbs', 'mean-field'\]"),
    "ais_chains": (0, "ais_chains must be a positive integer"),
    "ais_betas": (0, "ais_betas must be a positive integer"),
    "ais_frames": (0, "ais_frames must be a positive integer or None"),
    "rbm_pretrain_epochs": (-1, "rbm_pretrain_epochs must be an integer >= 0"),
    "rnn_pretrain_epochs": (1.5, "rnn_pretrain_epochs must be an integer >= 0"),
    "nade_hidden": (0, "nade_hidden must be a positive integer"),
    "nade_samples": (0, "nade_samples must be a positive integer"),
    "protocol": ("authors", "protocol must be one of"),
    "data": ("mnist", "unknown data set 'mnist'"),
    "model": ("transformer", "unknown model 'transformer'"),
    "weight_decay": (-1e-5, "weight_decay must be >= 0"),
    "lr": (0.0, "lr must be > 0, got 0.0"),
    "optimizer": ("rmsprop", "optimizer must be one of"),
    "momentum": (1.0, r"momentum must be in \[0, 1\)"),
    "batch_size": (0, "batch_size must be a positive integer"),
    "chunk": (0, "chunk must be a positive integer or None"),
    "epochs": (0, "epochs must be a positive integer"),
    "patience": (2.5, "patience must be a positive integer"),
    "select": ("loss", "select must be one of"),
    "clip": (0.0, "clip must be > 0 or None, got 0.0"),
    "loss_reduction": ("sum", "loss_reduction must be one of"),
    "on_divergence": ("ignore", "on_divergence must be one of"),
    "init_bias": ("yes", "init_bias must be True or False"),
    "loop_bound": ("on", "loop_bound must be True, False or None"),
    "input_path": ("both", "input_path must be one of"),
    "transpose": (88, r"transpose must be an integer in \[0, 88\), got 88"),
    "device": ("tpu", "device must be cpu, cuda or cuda:N"),
    "data_dir": (3, "data_dir must be a str or None"),
    "eval_batch_size": (0, "eval_batch_size must be a positive integer"),
    "cpu_kernel": ("fast", "cpu_kernel must be one of"),
}

# a model that has each option of its own (the others refuse a set value of those defaulting to
# None, and ignore the rest)
OWNER = {name: model for model in ("pret-lmn-b", "rnn-rbm", "lstm-nade")
         for name in option_names(model)}


def test_every_field_is_declared_once_with_help_and_is_checked():
    declared = {f.name for f in fields(TrainConfig)}
    assert declared == set(BAD)  # a new field needs its row here
    for f in fields(TrainConfig):
        assert f.metadata["help"].strip(), f.name
    for name, (value, words) in BAD.items():
        with pytest.raises(ValueError, match=words):
            TrainConfig(**{"model": OWNER.get(name, "lmn-b"), name: value})


def test_the_models_option_classes_partition_the_model_fields():
    sizes = [f.name for f in fields(ModelOptions)]
    assert sizes == ["hidden", "memory", "num_layers", "dropout", "nonlinearity", "seed",
                     "memory_bound", "loop_bound", "input_path"]
    assert option_names("lmn-b") == option_names("lstm") == ()
    assert option_names("ulm") == option_names("pret-rnn") == ("k", "la_window")
    assert option_names("pret-lmn-a") == ("k", "la_window", "pretrain_epochs",
                                          "ulm_nonlinearity", "ulm_cache")
    assert option_names("rnn-rbm") == tuple(f.name for f in fields(RBMOptions)
                                            if f.name not in sizes)
    assert all(REGISTRY[f"{core}-nade"].options is NADEOptions
               for core in ("lmn-a", "lmn-b", "rnn", "lstm", "gru"))
    assert issubclass(TransferOptions, PretrainOptions)
    config = TrainConfig(model="rnn-rbm", hidden=7, cd_k=3, seed=5, nade_hidden=9)
    options = config.model_options()
    assert type(options) is RBMOptions  # the NADE's field stays the config's, unread
    assert (options.hidden, options.cd_k, options.seed, options.memory) == (7, 3, 5, None)
    assert not hasattr(options, "nade_hidden")


def test_a_model_is_built_from_its_input_size_and_options():
    seen = {}

    def build(input_size, options):
        seen["args"] = (input_size, options)
        return torch.nn.Linear(input_size, options.hidden)

    register(ModelSpec("probe-nade", "Probe", "probe", build, NADEOptions, has_memory=True))
    try:
        model = build_model("probe-nade", 6, input_size=5, nade_samples=7)
        input_size, options = seen["args"]
        assert isinstance(model, torch.nn.Linear) and input_size == 5
        assert options == NADEOptions(hidden=6, memory=6, nade_samples=7, nonlinearity="tanh")
        with pytest.raises(ValueError, match="probe-nade has no option k"):
            build_model("probe-nade", 6, k=3)
        with pytest.raises(ValueError, match="nade_samples must be a positive integer"):
            model_options("probe-nade", nade_samples=0)
    finally:
        unregister("probe-nade")
    # a registered model's own options reach it: the NADE's sizes, the RBM's chains
    nade = build_model("lstm-nade", 8, nade_hidden=11, nade_samples=3)
    assert nade.readout.W.shape == (11, 88) and nade.readout.n_samples == 3
    rbm = build_model("rnn-rbm", 8, rbm_hidden=13, cd_k=4, ais_chains=6)
    assert rbm.W.shape == (88, 13) and (rbm.cd_k, rbm.ais_chains) == (4, 6)


def test_the_command_line_options_are_made_from_the_declarations(capsys):
    params = {p.name: p for p in cli_module.cli.commands["train"].params}
    defaults = TrainConfig()
    for f in fields(TrainConfig):
        option = params[f.name]  # one option per field, named after it
        assert option.opts[0] == "--" + f.name.replace("_", "-")
        assert f.metadata["help"].rstrip(".") in option.help
        if f.name in PROTOCOL_FIELDS:  # unset: the protocol's value
            assert option.default is None and "the protocol's" in option.help
        elif f.name == "loop_bound":  # None: resolved by the activation, as the config does
            assert option.default is None and defaults.loop_bound is False
            assert TrainConfig(model="pret-lmn-b").loop_bound is True
        else:
            assert option.default == getattr(defaults, f.name), f.name
        if f.metadata["choices"] is not None:
            assert list(option.type.choices) == list(f.metadata["choices"])
    search = {p.name for p in cli_module.cli.commands["search"].params}
    assert {"lr", "epochs", "protocol", "clip", "seed", "k", "nade_samples"} <= search
    assert not {"hidden", "memory", "weight_decay"} & search  # the grid's


@pytest.mark.parametrize("args, words", [
    (["train", "--dropout", "1"], r"--dropout must be in \[0, 1\), got 1.0"),
    (["train", "--epochs", "0"], "--epochs must be a positive integer, got 0"),
    (["train", "--la-window", "3"], "--la-window applies to ulm, pret-lmn-a, pret-lmn-b, "
                                    "pret-rnn, not to lmn-b"),
    (["train", "--model", "rnn-rbm", "--ais-frames", "0"], "--ais-frames must be a positive"),
    (["search", "--lr", "0", "--out", "never"], "--lr must be > 0, got 0.0"),
])
def test_a_bad_value_is_one_line_naming_its_option(args, words, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(args)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("linmem: error: ")
    assert re.search(words, err), err
    assert not (tmp_path / "runs").exists() and not (tmp_path / "never").exists()


def test_a_saved_config_loads_back_equal(tmp_path):
    config = TrainConfig(model="pret-lmn-b", protocol="paper", hidden=12, memory=9, k=4,
                         ulm_nonlinearity="tanh", clip=None)
    (tmp_path / "config.json").write_text(json.dumps(asdict(config)))
    assert TrainConfig.from_run(tmp_path) == config


def test_a_record_from_before_protocols_had_names_is_read_under_the_legacy_protocol():
    """One reader of a saved record's protocol (config.json, a study's settings, a report row):
    a record naming none trained under LEGACY_PROTOCOL's settings, whatever today's default."""
    assert record_protocol({"protocol": "paper"}) == "paper"
    assert record_protocol({}) == record_protocol({"protocol": None}) == LEGACY_PROTOCOL
    old = TrainConfig.from_dict({"data": "jsb", "model": "lmn-b", "hidden": 10})
    assert old.protocol == LEGACY_PROTOCOL
    assert old.batch_size == PROTOCOLS[LEGACY_PROTOCOL].batch_size
    assert TrainConfig.from_dict({**asdict(old), "protocol": "paper"}).protocol == "paper"
    defaults = TrainConfig.legacy_defaults()
    assert defaults["protocol"] == LEGACY_PROTOCOL
    assert defaults["batch_size"] == PROTOCOLS[LEGACY_PROTOCOL].batch_size
    assert defaults["clip"] == PROTOCOLS[LEGACY_PROTOCOL].clip


def test_a_record_from_before_the_memory_bound_has_the_unbounded_memory():
    """A config.json saved before memory_bound existed trained the paper's unbounded memory: it
    reads as None whatever the field's default (the bound may become the LMN's default); a
    record that names a bound keeps it."""
    old = TrainConfig.from_dict({"data": "jsb", "model": "lmn-b", "hidden": 10,
                                 "protocol": "paper"})
    assert old.memory_bound is None
    assert TrainConfig.legacy_defaults()["memory_bound"] is None
    bounded = TrainConfig.from_dict({"data": "jsb", "model": "lmn-b", "memory_bound": 0.99})
    assert bounded.memory_bound == 0.99
    assert TrainConfig.from_dict({"data": "jsb", "model": "lstm"}).memory_bound is None


def test_the_configuration_is_split_by_concern():
    """TrainConfig is the training's own settings, those its protocol names (ProtocolSettings:
    exactly what a Protocol sets, PROTOCOL_FIELDS), where and how it runs (RunSettings, where a
    resumed run may change what does not alter its numbers), and the models' options; every
    field belongs to one of them, and config.json stays flat (a saved config loads back)."""
    from linmem.model_options import ModelOptions
    from linmem.training.config import (
        MODEL_OPTION_FIELDS,
        PLACE_FIELDS,
        PROTOCOL_FIELDS,
        Protocol,
        ProtocolSettings,
        RunSettings,
    )

    protocol = {f.name for f in fields(ProtocolSettings)}
    run = {f.name for f in fields(RunSettings)}
    assert protocol == set(PROTOCOL_FIELDS) <= {f.name for f in fields(Protocol)}
    assert {"device", "data_dir"} <= run and set(PLACE_FIELDS) - run == {"ulm_cache"}
    sizes = {f.name for f in fields(ModelOptions)}
    own = {"protocol", "data", "model", "weight_decay", "lr", "optimizer", "momentum", "chunk",
           "epochs", "on_divergence", "transpose"}
    groups = [protocol, run, sizes, set(MODEL_OPTION_FIELDS), own]
    every = [f.name for f in fields(TrainConfig)]
    assert sorted(every) == sorted(n for g in groups for n in g)  # each field in one group
    config = TrainConfig(protocol="linmem", batch_size=8, device="cpu", hidden=7)
    assert TrainConfig.from_dict(asdict(config)) == config
    assert all(not isinstance(v, dict) for v in asdict(config).values())  # flat
