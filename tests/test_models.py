"""Next-step models: parameter counts against the paper's formulas, causality, readout wiring."""

import pytest
import torch

from linmem.models import (
    MODELS,
    architecture,
    build_model,
    count_parameters,
    recurrent_weight_count,
)

# the models with a recurrent core and a sigmoid readout (the RNN-RBM has its own tests)
PREDICTORS = [m for m in MODELS if m != "rnn-rbm"]


def recurrent_weights(model):
    """Weights of the recurrent core only (no biases, no readout)."""
    return sum(p.numel() for n, p in model.core.named_parameters() if n.startswith("weight"))


@pytest.mark.parametrize("name", PREDICTORS)
@pytest.mark.parametrize(("x", "h", "m"), [(88, 50, 50), (88, 100, 250), (10, 7, 3)])
def test_parameter_formulas(name, x, h, m):
    model = build_model(name, h, m, input_size=x)
    assert recurrent_weights(model) == recurrent_weight_count(name, x, h, m)
    arch = architecture(name)
    out = {"lmn-b": m, "ulm": 11 * h}.get(arch, h)  # the ULM reads h_t .. h_{t-10}
    biases = {"lstm": 8 * h, "gru": 6 * h, "rnn": 2 * h, "ulm": h}.get(arch, h + m)
    # a NADE readout (H = 150 hidden units) adds U_c s + c_0 and its weights W and V
    nade = out * 150 + 150 + 2 * 150 * x if name.endswith("-nade") else 0
    assert count_parameters(model) == recurrent_weight_count(name, x, h, m) + biases + \
        out * x + x + nade


def test_lmn_has_fewer_parameters_than_gated_models_with_the_same_units():
    """The paper's comparison section: with f + m = h, the LMN has fewer weights than LSTM and
    GRU of h units. Its claim that the LMN count is largest at m = f = h/2 does not hold: by
    brute force the maximum of (x + m)f + (f + m)m with f = h - m is at m = h - x/2."""
    x = 88
    for h in (100, 200, 500, 1000):
        counts = {m: recurrent_weight_count("lmn-b", x, h - m, m) for m in range(1, h)}
        best = max(counts, key=counts.get)
        assert best == max(1, min(h - 1, h - x // 2))
        assert counts[h // 2] == (x + h // 2) * h // 2 + h * h // 2  # the paper's expression
        assert max(counts.values()) < recurrent_weight_count("gru", x, h)
        assert max(counts.values()) < recurrent_weight_count("lstm", x, h)


@pytest.mark.parametrize("name", PREDICTORS)
def test_padding_does_not_change_valid_logits(name):
    torch.manual_seed(0)
    model = build_model(name, 12, 9).eval()
    x = (torch.rand(1, 10, 88) < 0.1).float()
    padded = torch.cat([x, torch.zeros(1, 5, 88)], 1)
    with torch.no_grad():
        torch.testing.assert_close(model(padded)[:, :10], model(x))
        # causal: changing a later frame leaves earlier logits unchanged
        y = x.clone()
        y[0, 7] = 1 - y[0, 7]
        torch.testing.assert_close(model(y)[:, :7], model(x)[:, :7])


def test_lmn_readouts_read_the_right_state():
    torch.manual_seed(1)
    a, b = build_model("lmn-a", 6, 4), build_model("lmn-b", 6, 4)
    assert a.readout.in_features == 6 and b.readout.in_features == 4
    b.core.load_state_dict(a.core.state_dict())
    x = torch.rand(2, 5, 88)
    hs, _ = a.core(x)
    ms, _ = b.core(x)
    torch.testing.assert_close(a(x), a.readout(hs))
    torch.testing.assert_close(b(x), b.readout(ms))


def test_output_bias_starts_at_base_rates():
    model = build_model("lstm", 8)
    rates = torch.linspace(0.0, 0.5, 88)
    model.init_output_bias(rates)
    p = torch.sigmoid(model.readout.bias)
    torch.testing.assert_close(p, rates.clamp(1e-3, 1 - 1e-3), rtol=1e-4, atol=1e-6)


def test_bad_model_arguments():
    with pytest.raises(ValueError, match="unknown model"):
        build_model("transformer", 10)
    with pytest.raises(ValueError, match="positive"):
        build_model("lstm", 0)
    with pytest.raises(ValueError, match="memory"):
        build_model("lmn-b", 10, -1)
    with pytest.raises(ValueError, match="dropout"):
        build_model("rnn", 10, dropout=1.5)
