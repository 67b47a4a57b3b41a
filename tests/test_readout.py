"""The readout's input path (linmem.nn.readout, ``--input-path``): the logits' term equals its
equation, starts at zero (the plain model's logits), lets a model copy the previous frame exactly
(its accuracy the previous-frame baseline's) and runs in pieces as whole (through ``linmem
train``: tests/test_cli.py)."""

import numpy as np
import pytest
import torch

from linmem.metrics import frame_accuracy, previous_frame_scores
from linmem.models import build_model
from linmem.nn.readout import InputPath, check_input_path


def test_the_terms_are_their_equations():
    torch.manual_seed(0)
    x = (torch.rand(2, 5, 7) < 0.4).float()
    gain, skip = InputPath("gain", 7), InputPath("skip", 7)
    assert float(gain(x).abs().sum()) == 0 and float(skip(x).abs().sum()) == 0  # zero at start
    with torch.no_grad():
        gain.weight.normal_()
        skip.weight.normal_()
    torch.testing.assert_close(gain(x), x * gain.weight[None, None])
    expected = torch.einsum("btj,kj->btk", x, skip.weight)
    torch.testing.assert_close(skip(x), expected)
    with pytest.raises(ValueError, match=r"input_path must be one of \['none', 'gain', 'skip'\]"):
        check_input_path("both")


@pytest.mark.parametrize("kind", ["gain", "skip"])
def test_a_model_with_an_input_path_starts_as_the_plain_one_and_steps_as_whole(kind):
    torch.manual_seed(1)
    plain = build_model("lmn-b", 6, 5)
    model = build_model("lmn-b", 6, 5, input_path=kind)
    model.load_state_dict({**plain.state_dict(),
                           "input_path.weight": model.input_path.weight.detach()})
    x = (torch.rand(3, 9, 88) < 0.1).float()
    torch.testing.assert_close(model(x), plain(x))
    with torch.no_grad():
        model.input_path.weight.normal_()
    whole = model(x)
    first, state = model.step(x[:, :4])
    second, _ = model.step(x[:, 4:], state)
    torch.testing.assert_close(torch.cat([first, second], 1), whole)
    assert not torch.allclose(whole, plain(x))
    assert model.config()["input_path"] == kind and plain.config()["input_path"] == "none"


def test_the_gain_copies_the_previous_frame_exactly(jsb):
    """Readout zero, bias -b, gain 2b: key k is predicted on exactly when x_{t,k} is, so the
    model's accuracy (both definitions) is the previous-frame baseline's, to the digit."""
    model = build_model("lmn-b", 6, 5, input_path="gain").eval()
    with torch.no_grad():
        model.readout.weight.zero_()
        model.readout.bias.fill_(-10.0)
        model.input_path.weight.fill_(20.0)
    seqs = [s for s in jsb["valid"] if len(s) >= 2]
    probs, targets = [], []
    with torch.no_grad():
        for s in seqs:
            x = torch.from_numpy(np.asarray(s, dtype=np.float32))[None]
            probs.append(torch.sigmoid(model(x[:, :-1]))[0])
            targets.append(x[0, 1:])
    probs, targets = torch.cat(probs).double(), torch.cat(targets).double()
    baseline = previous_frame_scores(seqs)
    assert frame_accuracy(probs, targets) == baseline["acc"]
    assert frame_accuracy(probs, targets, average="frame") == baseline["acc_frame"]
