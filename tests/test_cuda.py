"""The library on a CUDA device gives the CPU's numbers.

Every model's outputs and gradients, the LMN layer's options (layers, packed sequences, initial
state), the trainer, the pretraining recipes, resuming a run on another device and the command
line, each on CUDA against the same computation on the CPU (float64 where the comparison is
exact). The project's CI has no GPU, so these tests run only where one is:
``pytest tests/test_cuda.py``; the log of their last run is in ``results/cuda/``.
"""

import copy
import dataclasses
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from linmem.batching import collate
from linmem.models import MODELS, build_model, expected_accuracy
from linmem.nn.lmn import LMN
from linmem.registry import get_spec
from linmem.training import recipes
from linmem.training.config import TrainConfig
from linmem.training.evaluation import evaluate, load_run_model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")
# the options that make a model deterministic (the RNN-RBM's mean-field marginals) and small
OPTIONS = {"rnn-rbm": {"rbm_hidden": 16, "cd_k": 2, "rbm_predict": "mean-field"}}


def _sequences(lengths=(9, 6, 4), seed=1) -> list[np.ndarray]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(n, 88, generator=g) < 0.1).double().numpy() for n in lengths]


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}


def _model(name: str) -> torch.nn.Module:
    spec = get_spec(name)
    torch.manual_seed(0)
    small = {"k": 3, "nade_hidden": 9}  # the options of those models that have them
    own = {f.name for f in dataclasses.fields(spec.options)}
    return build_model(name, 12, 10 if spec.has_memory else None, **OPTIONS.get(name, {}),
                       **{k: v for k, v in small.items() if k in own}).double()


@pytest.mark.parametrize("name", MODELS)
def test_every_model_gives_the_cpu_numbers(name):
    """Outputs, training loss and every parameter's gradient to 1e-10 (float64): the same
    model copied to CUDA. The sampled outputs (the NADE's marginals, the RNN-RBM's Gibbs
    chains, its contrastive divergence) draw from each device's own generator; their
    deterministic parts are compared instead."""
    cpu = _model(name)
    gpu = copy.deepcopy(cpu).to(CUDA)
    batch = collate(_sequences(), dtype=torch.float64)
    gbatch = batch.to(CUDA)
    if name == "rnn-rbm":
        for a, b in zip(cpu.step_biases(batch.inputs), gpu.step_biases(gbatch.inputs),
                        strict=True):
            torch.testing.assert_close(b.cpu(), a, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(gpu(gbatch.inputs).cpu(), cpu(batch.inputs),
                                   rtol=1e-10, atol=1e-10)
        loss = gpu.training_loss(gbatch)
        loss.backward()
        assert math.isfinite(loss.item())
        assert all(torch.isfinite(g).all() for g in _grads(gpu).values()) and _grads(gpu)
        return
    if hasattr(cpu, "likelihood_logits"):
        torch.testing.assert_close(gpu.likelihood_logits(gbatch.inputs, gbatch.targets).cpu(),
                                   cpu.likelihood_logits(batch.inputs, batch.targets),
                                   rtol=1e-10, atol=1e-10)
    else:
        torch.testing.assert_close(gpu(gbatch.inputs).cpu(), cpu(batch.inputs),
                                   rtol=1e-10, atol=1e-10)
    expected = cpu.training_loss(batch)
    loss = gpu.training_loss(gbatch)
    torch.testing.assert_close(loss.cpu(), expected, rtol=1e-10, atol=1e-12)
    expected.backward()
    loss.backward()
    a, b = _grads(cpu), _grads(gpu)
    assert a.keys() == b.keys() and a
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-9, atol=1e-11, msg=key)


@pytest.mark.parametrize("output, bidirectional", [("memory", False), ("hidden", False),
                                                   ("memory", True)])
def test_lmn_layer_options_on_cuda(output, bidirectional):
    """Two layers (both directions too), an initial state and a packed batch of unequal
    lengths: outputs, final state and gradients (inputs, initial memory, weights) equal the
    CPU's in float64."""
    torch.manual_seed(0)
    cpu = LMN(7, 6, 5, num_layers=2, output=output, batch_first=True,
              bidirectional=bidirectional).double()
    gpu = copy.deepcopy(cpu).to(CUDA)
    g = torch.Generator().manual_seed(3)
    states = 4 if bidirectional else 2
    x = torch.randn(3, 8, 7, generator=g, dtype=torch.float64)
    h0 = torch.randn(states, 3, 6, generator=g, dtype=torch.float64)
    m0 = torch.randn(states, 3, 5, generator=g, dtype=torch.float64)
    lengths = torch.tensor([8, 5, 2])
    results = []
    for layer, device in ((cpu, "cpu"), (gpu, CUDA)):
        xs, h, m = (t.detach().to(device).requires_grad_() for t in (x, h0, m0))
        packed = pack_padded_sequence(xs, lengths, batch_first=True)
        out, (h_n, m_n) = layer(packed, (h, m))
        out, out_lengths = pad_packed_sequence(out, batch_first=True)
        assert torch.equal(out_lengths, lengths)
        (out.square().sum() + h_n.sum() + m_n.sum()).backward()
        assert h.grad is None  # eq. (6) reads the memory, not the previous hidden state
        results.append([t.detach().cpu() for t in (out, h_n, m_n, xs.grad, m.grad)]
                       + list(_grads(layer).values()))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)


def _config(**kw) -> TrainConfig:
    base = dict(model="lmn-b", hidden=12, memory=10, batch_size=6, epochs=3, patience=10,
                seed=3)
    return TrainConfig(**{**base, **kw})


@pytest.mark.parametrize("model", ["lmn-b", "lstm", "gru", "rnn", "lmn-a"])
def test_a_training_run_on_cuda_follows_the_cpu_run(tmp_path, small, model):
    """Three epochs in float32: the CUDA run's validation and test NLL follow the CPU run's
    (the devices round differently: 1e-3 relative), and the run records the GPU."""
    runs = {device: recipes.train(_config(model=model, device=device), tmp_path / device,
                                progress=False, data=small)
            for device in ("cpu", "cuda")}
    cpu, gpu = runs["cpu"], runs["cuda"]
    for key in ("valid_nll", "test_nll"):
        assert gpu[key] == pytest.approx(cpu[key], rel=1e-3), key
    for key in ("valid_acc", "test_acc"):
        assert gpu[key] == pytest.approx(cpu[key], abs=0.5), key
    assert gpu["device"] == "cuda" and gpu["machine"]["gpu"] == torch.cuda.get_device_name()
    model_gpu, _ = load_run_model(tmp_path / "cuda", "best", CUDA)
    assert next(model_gpu.parameters()).is_cuda
    again = evaluate(model_gpu, small["test"], 64, CUDA)
    assert again["nll"] == pytest.approx(gpu["test_nll"], rel=1e-5)


@pytest.mark.parametrize("model", ["pret-lmn-b", "pret-rnn", "rnn-rbm", "lmn-b-nade"])
def test_recipes_and_sampled_models_train_on_cuda(tmp_path, small, model):
    """The pretraining recipes (the unrolled network trained on CUDA, the autoencoder fitted on
    the CPU, the weights transferred back), the RNN-RBM (CD training, AIS test NLL) and a NADE
    readout (sampled marginals, expected accuracy) run whole on CUDA, and where the run is
    deterministic (the pretrained LMN, pret-RNN) it follows the CPU run."""
    extra = {"pret-lmn-b": dict(k=3, pretrain_epochs=2),
             "pret-rnn": {},
             "rnn-rbm": dict(rbm_hidden=16, cd_k=2, ais_chains=8, ais_betas=50, ais_frames=40),
             "lmn-b-nade": dict(nade_hidden=9, nade_samples=10)}[model]
    cfg = dict(model=model, epochs=2, **extra)
    gpu = recipes.train(_config(device="cuda", **cfg), tmp_path / "cuda", progress=False,
                      data=small)
    assert gpu["device"] == "cuda"
    for key in ("valid_acc", "test_acc", "test_nll"):
        assert math.isfinite(gpu[key]), key
    # below the trivial code length: every key at probability 1/2 costs 88 ln 2 nats a frame
    assert 0 < gpu["test_nll"] < 88 * math.log(2)
    if model in ("pret-lmn-b", "pret-rnn"):
        cpu = recipes.train(_config(**cfg), tmp_path / "cpu", progress=False, data=small)
        assert gpu["valid_nll"] == pytest.approx(cpu["valid_nll"], rel=1e-3)
        assert gpu["test_nll"] == pytest.approx(cpu["test_nll"], rel=1e-3)


def test_a_cpu_run_resumes_on_cuda(tmp_path, small):
    """The device is a place, not part of a run's identity: a run interrupted on the CPU
    continues on CUDA from its checkpoint and ends where the uninterrupted CPU run ends."""
    straight = recipes.train(_config(epochs=5), tmp_path / "straight", progress=False, data=small)

    def interrupt(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        recipes.train(_config(epochs=5), tmp_path / "moved", progress=False, data=small,
                    on_epoch_end=interrupt)
    moved = recipes.train(_config(epochs=5, device="cuda"), tmp_path / "moved", resume=True,
                        progress=False, data=small)
    assert moved["epochs"] == 5 and moved["device"] == "cuda"
    assert moved["valid_nll"] == pytest.approx(straight["valid_nll"], rel=1e-3)
    assert moved["test_nll"] == pytest.approx(straight["test_nll"], rel=1e-3)


@pytest.mark.parametrize("model", ["lmn-b", "rnn-rbm"])
def test_a_cuda_run_resumes_on_cuda_as_if_uninterrupted(tmp_path, small, model):
    """Dropout and the RNN-RBM's contrastive divergence draw from the GPU's generator: its
    state is checkpointed with the CPU's, and a resumed run repeats the uninterrupted one."""
    extra = (dict(dropout=0.3) if model == "lmn-b" else
             dict(rbm_hidden=16, cd_k=2, ais_chains=8, ais_betas=50, ais_frames=40))
    cfg = _config(model=model, epochs=4, device="cuda", **extra)
    straight = recipes.train(cfg, tmp_path / "straight", progress=False, data=small)

    def interrupt(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        recipes.train(cfg, tmp_path / "resumed", progress=False, data=small,
                    on_epoch_end=interrupt)
    resumed = recipes.train(cfg, tmp_path / "resumed", resume=True, progress=False, data=small)
    for key in ("valid_acc", "test_acc", "test_nll", "best_epoch"):
        assert resumed[key] == pytest.approx(straight[key], rel=1e-5), key
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)
    assert torch.equal(a["cuda_rng"], b["cuda_rng"])
    for key in a["model"]:
        torch.testing.assert_close(b["model"][key], a["model"][key], rtol=1e-5, atol=1e-6)


def test_expected_accuracy_on_cuda_agrees_with_the_cpu(small):
    """Boulanger-Lewandowski's expected accuracy draws from each device's own generator: the
    two estimates agree within their standard errors (4 sigma)."""
    torch.manual_seed(0)
    model = build_model("lmn-b", 12, 10)
    cpu = expected_accuracy(model, small["test"][:4], n_samples=200)
    gpu = expected_accuracy(copy.deepcopy(model).to(CUDA), small["test"][:4], n_samples=200,
                            device=CUDA)
    assert abs(gpu[0] - cpu[0]) < 4 * math.hypot(cpu[1], gpu[1])
    assert 0 < gpu[1] < 0.05


def test_command_line_trains_on_cuda(tmp_path, data_dir):
    """``linmem train --device cuda`` on the real data: the run records the device and the GPU,
    and ``linmem evaluate`` of it on CUDA gives its test NLL again."""
    out = tmp_path / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "linmem"]
    done = subprocess.run([*base, "train", "--data", "jsb", "--hidden", "20", "--memory", "20",
                           "--epochs", "2", "--device", "cuda", "--data-dir", str(data_dir),
                           "--out", str(out)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["device"] == "cuda" and metrics["epochs"] == 2
    assert metrics["machine"]["gpu"] == torch.cuda.get_device_name()
    done = subprocess.run([*base, "evaluate", str(out), "--device", "cuda", "--split", "test"],
                          env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    scored = json.loads(done.stdout)
    assert scored["test"]["nll"] == pytest.approx(metrics["test_nll"], rel=1e-5)
    assert scored["test"]["acc"] == pytest.approx(metrics["test_acc"], abs=1e-3)
    assert scored["machine"]["gpu"] == torch.cuda.get_device_name()


def test_autocast_on_cuda():
    """Under float16 autocast the LMN's recurrence stays in float32 (its outputs and gradients
    equal the float32 run's on the same GPU exactly) while cuDNN's RNNs and the readouts follow
    autocast; every model's training loss is then within 1e-2 of float32's."""
    torch.manual_seed(0)
    lmn = LMN(7, 6, 5, num_layers=2, batch_first=True).to(CUDA)
    x = torch.randn(3, 9, 7, device=CUDA)
    runs = []
    for enabled in (False, True):
        lmn.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16, enabled=enabled):
            out, (h_n, m_n) = lmn(x)
        (out.square().sum() + m_n.sum()).backward()
        runs.append([out, h_n, m_n, *(p.grad.clone() for p in lmn.parameters())])
    for a, b in zip(*runs, strict=True):
        assert b.dtype == torch.float32 and torch.equal(a, b)
    batch = collate(_sequences(), dtype=torch.float32).to(CUDA)
    for name in MODELS:
        torch.manual_seed(0)
        model = _model(name).float().to(CUDA)
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model.training_loss(batch)
        loss.backward()
        assert torch.isfinite(loss), name
        if name != "rnn-rbm":  # contrastive divergence samples: no float32 twin to compare
            assert loss.item() == pytest.approx(model.training_loss(batch).item(), rel=1e-2)


def test_the_bounded_memory_on_cuda_gives_the_cpu_numbers():
    """linmem::spectral_norm's CUDA path (eigh of the Gram matrix) against the CPU's (syevr),
    and a bounded layer's outputs and gradients, float64."""
    from linmem.ops.bound import spectral_norm

    g = torch.Generator().manual_seed(12)
    for shape in [(7, 7), (50, 50), (250, 250), (6, 9)]:
        w = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
        wc = w.detach().to(CUDA).requires_grad_()
        (grad,) = torch.autograd.grad(spectral_norm(w), w)
        (grad_cuda,) = torch.autograd.grad(spectral_norm(wc), wc)
        torch.testing.assert_close(spectral_norm(wc).cpu(), spectral_norm(w).detach())
        torch.testing.assert_close(grad_cuda.cpu(), grad)
    torch.manual_seed(13)
    lmn = LMN(5, 6, 7, memory_bound=0.3).double()
    with torch.no_grad():
        lmn.weight_mm_l0.mul_(4)  # outside the ball
    on_cuda = copy.deepcopy(lmn).to(CUDA)
    x = torch.rand(9, 3, 5, dtype=torch.float64)
    out, out_cuda = lmn(x)[0], on_cuda(x.to(CUDA))[0]
    torch.testing.assert_close(out_cuda.cpu(), out)
    out.sum().backward()
    out_cuda.sum().backward()
    torch.testing.assert_close(on_cuda.weight_mm_l0.grad.cpu(), lmn.weight_mm_l0.grad)
