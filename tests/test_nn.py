"""The LMN layer against independent references: an explicit loop, torch.nn.RNN, gradcheck."""

import contextlib
import copy
import json
import math
import platform
import warnings

import numpy as np
import pytest
import torch
from torch.nn.utils.rnn import PackedSequence, pack_sequence, pad_packed_sequence

from linmem import LMN, LMNCell
from linmem._io import cpu_description
from linmem.nn import diagnostics
from linmem.nn.lmn import lmn_recurrence
from linmem.ops import cpu as _ext
from linmem.ops import paths as ops_paths
from linmem.ops.lmn_fills import cpu_fills, loop_forward
from linmem.ops.paths import use_cpu_kernel


@pytest.fixture(autouse=True)
def float64():
    """These tests compare to 1e-12: run them in float64, then restore the default."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(previous)


def reference_lmn(x, weights, m0=None):
    """Eqs. (6)-(7) written out step by step, one sequence and one layer: x (T, F)."""
    w_xh, w_mh, w_hm, w_mm, b_h, b_m = (weights[k] for k in (
        "weight_xh", "weight_mh", "weight_hm", "weight_mm", "bias_h", "bias_m"))
    m = torch.zeros(w_mm.shape[0]) if m0 is None else m0
    hs, ms = [], []
    for x_t in x:
        h = torch.tanh(w_xh @ x_t + w_mh @ m + b_h)
        m = w_hm @ h + w_mm @ m + b_m
        hs.append(h)
        ms.append(m)
    return torch.stack(hs), torch.stack(ms)


def weights_used(lmn, k=0, reverse=False):
    """Layer ``k``'s parameters as eqs. (6)-(7) use them: ``W^mm`` through the layer's memory
    bound, and ``W^hm`` too under a loop bound (the parameters themselves without), so that the
    references hold whatever the default bound (``linmem.ops.bound.DEFAULT_MEMORY_BOUND``); a
    gradient through them reaches the parameters."""
    w_mm, w_hm = lmn.recurrent_weights(k, reverse)
    return {**lmn.layer_weights(k, reverse), "weight_mm": w_mm, "weight_hm": w_hm}


def randomise(module, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return module


@pytest.mark.parametrize("output", ["memory", "hidden"])
def test_layer_matches_explicit_loop(output):
    torch.manual_seed(0)
    lmn = randomise(LMN(5, 7, 4, output=output))
    x = torch.randn(9, 3, 5)
    out, (h_n, m_n) = lmn(x)
    for b in range(3):
        hs, ms = reference_lmn(x[:, b], weights_used(lmn))
        expected = ms if output == "memory" else hs
        torch.testing.assert_close(out[:, b], expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(h_n[0, b], hs[-1])
        torch.testing.assert_close(m_n[0, b], ms[-1])


def test_batch_first_unbatched_and_initial_state():
    torch.manual_seed(1)
    lmn = randomise(LMN(4, 6, 5), 1)
    x = torch.randn(8, 2, 4)
    m0 = torch.randn(1, 2, 5)
    out, (_h_n, _m_n) = lmn(x, m0)
    lmn_bf = randomise(LMN(4, 6, 5, batch_first=True), 1)
    out_bf, _ = lmn_bf(x.transpose(0, 1), (torch.zeros(1, 2, 6), m0))  # h_0 is accepted, unused
    torch.testing.assert_close(out_bf.transpose(0, 1), out)
    _, ms = reference_lmn(x[:, 1], weights_used(lmn), m0[0, 1])
    torch.testing.assert_close(out[:, 1], ms)
    out_u, (h_u, m_u) = lmn(x[:, 1], m0[:, 1])
    torch.testing.assert_close(out_u, ms)
    assert h_u.shape == (1, 6) and m_u.shape == (1, 5)
    # feeding the returned state back continues the sequence
    first, state = lmn(x[:4])
    second, _ = lmn(x[4:], state)
    torch.testing.assert_close(torch.cat([first, second]), lmn(x)[0])


def test_multilayer_reads_previous_output():
    torch.manual_seed(2)
    lmn = randomise(LMN(3, 5, 4, num_layers=2, output="hidden"), 2)
    x = torch.randn(6, 2, 3)
    out, (h_n, m_n) = lmn(x)
    assert h_n.shape == (2, 2, 5) and m_n.shape == (2, 2, 4)
    for b in range(2):
        w0 = weights_used(lmn, 0)
        w1 = weights_used(lmn, 1)
        hs0, _ = reference_lmn(x[:, b], w0)
        hs1, ms1 = reference_lmn(hs0, w1)
        torch.testing.assert_close(out[:, b], hs1)
        torch.testing.assert_close(m_n[1, b], ms1[-1])


def test_memory_equals_torch_rnn_when_memory_copies_hidden():
    """With W^hm = I, W^mm = 0, b^m = 0 the memory is h_t and the LMN is an Elman RNN."""
    torch.manual_seed(3)
    n = 6
    lmn = randomise(LMN(4, n, n), 3)
    rnn = torch.nn.RNN(4, n)
    with torch.no_grad():
        lmn.weight_hm_l0.copy_(torch.eye(n))
        lmn.weight_mm_l0.zero_()
        lmn.bias_m_l0.zero_()
        rnn.weight_ih_l0.copy_(lmn.weight_xh_l0)
        rnn.weight_hh_l0.copy_(lmn.weight_mh_l0)
        rnn.bias_ih_l0.copy_(lmn.bias_h_l0)
        rnn.bias_hh_l0.zero_()
    x = torch.randn(11, 3, 4)
    out, (_h_n, m_n) = lmn(x)
    expected, h_rnn = rnn(x)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(m_n, h_rnn)


def test_packed_sequence_matches_separate_calls():
    torch.manual_seed(4)
    lmn = randomise(LMN(3, 5, 4, num_layers=2), 4)
    seqs = [torch.randn(n, 3) for n in (4, 7, 2)]
    out, (h_n, m_n) = lmn(pack_sequence(seqs, enforce_sorted=False))
    padded, lengths = pad_packed_sequence(out)
    assert lengths.tolist() == [4, 7, 2]
    for b, s in enumerate(seqs):
        single, (h_b, m_b) = lmn(s.unsqueeze(1))
        torch.testing.assert_close(padded[: len(s), b], single[:, 0])
        assert torch.all(padded[len(s):, b] == 0)
        torch.testing.assert_close(h_n[:, b], h_b[:, 0])
        torch.testing.assert_close(m_n[:, b], m_b[:, 0])


def reference_bidirectional(seq, lmn, m0=None):
    """A bidirectional LMN written out from :func:`reference_lmn`, one sequence ``(T, F)``: each
    layer runs forward, and over the reversed sequence with its reverse weights (reversed back),
    and the next layer reads both outputs side by side. (output, h_n, m_n) as the LMN's."""
    h_n, m_n, layer_in = [], [], seq
    for k in range(lmn.num_layers):
        outs = []
        for d, reverse in enumerate((False, True)):
            start = None if m0 is None else m0[2 * k + d]
            run = layer_in.flip(0) if reverse else layer_in
            hs, ms = reference_lmn(run, weights_used(lmn, k, reverse), start)
            h_n.append(hs[-1])
            m_n.append(ms[-1])
            out = ms if lmn.output == "memory" else hs
            outs.append(out.flip(0) if reverse else out)
        layer_in = torch.cat(outs, -1)
    return layer_in, torch.stack(h_n), torch.stack(m_n)


@pytest.mark.parametrize("output", ["memory", "hidden"])
def test_bidirectional_matches_explicit_loops(output):
    """Two layers, both directions, packed sequences of different lengths and an initial state:
    each sequence's outputs and final states equal the loops run on it alone."""
    lmn = randomise(LMN(3, 5, 4, num_layers=2, output=output, bidirectional=True), 5)
    width = 4 if output == "memory" else 5
    assert lmn.weight_xh_l1.shape == (5, 2 * width) and lmn.weight_mm_l1_reverse.shape == (4, 4)
    g = torch.Generator().manual_seed(5)
    seqs = [torch.randn(n, 3, generator=g) for n in (4, 7, 2)]
    m0 = torch.randn(4, 3, 4, generator=g)
    out, (h_n, m_n) = lmn(pack_sequence(seqs, enforce_sorted=False), m0)
    padded, _ = pad_packed_sequence(out)
    assert padded.shape == (7, 3, 2 * width) and h_n.shape == (4, 3, 5) and m_n.shape == (4, 3, 4)
    for b, s in enumerate(seqs):
        expected, h_b, m_b = reference_bidirectional(s, lmn, m0[:, b])
        torch.testing.assert_close(padded[: len(s), b], expected, rtol=1e-12, atol=1e-12)
        assert torch.all(padded[len(s):, b] == 0)
        torch.testing.assert_close(h_n[:, b], h_b, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(m_n[:, b], m_b, rtol=1e-12, atol=1e-12)
    # equal lengths: a plain tensor, batch first and unbatched give the same numbers
    x = torch.randn(6, 2, 3, generator=g)
    out, (h_n, m_n) = lmn(x)
    lmn.batch_first = True
    out_bf, _ = lmn(x.transpose(0, 1))
    lmn.batch_first = False
    torch.testing.assert_close(out_bf.transpose(0, 1), out)
    out_u, (h_u, m_u) = lmn(x[:, 1])
    expected, h_b, m_b = reference_bidirectional(x[:, 1], lmn)
    for got in (out[:, 1], out_u):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(h_u, h_b)
    torch.testing.assert_close(m_n[:, 1], m_b)
    assert m_u.shape == (4, 4)


def _lmn_as_elman_rnn(n: int, num_layers: int = 1, bidirectional: bool = False, seed: int = 6):
    """An LMN-B and a ``torch.nn.RNN`` that compute the same function: W^hm = I, W^mm = 0,
    b^m = 0 make the memory a copy of the functional state."""
    lmn = randomise(LMN(3, n, n, num_layers=num_layers, bidirectional=bidirectional), seed)
    rnn = torch.nn.RNN(3, n, num_layers=num_layers, bidirectional=bidirectional)
    with torch.no_grad():
        for k in range(num_layers):
            for reverse in (False, True)[: 1 + bidirectional]:
                w = lmn.layer_weights(k, reverse)
                w["weight_hm"].copy_(torch.eye(n))
                w["weight_mm"].zero_()
                w["bias_m"].zero_()
                suffix = "_reverse" * reverse
                for mine, torch_name in (("weight_xh", "weight_ih"), ("weight_mh", "weight_hh"),
                                         ("bias_h", "bias_ih")):
                    getattr(rnn, f"{torch_name}_l{k}{suffix}").copy_(w[mine])
                getattr(rnn, f"bias_hh_l{k}{suffix}").zero_()
    return lmn, rnn


@pytest.mark.parametrize("lengths,enforce_sorted", [
    ((4, 4), True), ((4, 4), False), ((6,), True), ((6,), False), ((5, 5, 2), False),
    ((2, 5, 5), False), ((3, 7, 3, 7), False)])
@pytest.mark.parametrize("bidirectional", [False, True])
def test_packed_input_returns_what_torch_rnn_returns(lengths, enforce_sorted, bidirectional):
    """Equal lengths, a single sequence and ties included: the output is a PackedSequence with
    torch.nn.RNN's data, batch sizes and sorting indices, and the same final state."""
    lmn, rnn = _lmn_as_elman_rnn(4, bidirectional=bidirectional)
    g = torch.Generator().manual_seed(sum(lengths))
    seqs = [torch.randn(t, 3, generator=g) for t in lengths]
    packed = pack_sequence(seqs, enforce_sorted=enforce_sorted)
    out, (_h_n, m_n) = lmn(packed)
    expected, h_rnn = rnn(packed)
    assert isinstance(out, PackedSequence)
    torch.testing.assert_close(out.data, expected.data)
    for field in ("batch_sizes", "sorted_indices", "unsorted_indices"):
        a, b = getattr(out, field), getattr(expected, field)
        assert (a is None and b is None) or torch.equal(a, b), field
    torch.testing.assert_close(m_n, h_rnn)


def test_bidirectional_equals_torch_rnn_when_memory_copies_hidden():
    """With W^hm = I, W^mm = 0, b^m = 0 in both directions of both layers, a bidirectional
    LMN-B is torch's bidirectional Elman RNN, packed input included."""
    lmn, rnn = _lmn_as_elman_rnn(5, num_layers=2, bidirectional=True)
    g = torch.Generator().manual_seed(6)
    seqs = [torch.randn(t, 3, generator=g) for t in (5, 8, 3)]
    packed = pack_sequence(seqs, enforce_sorted=False)
    out, (_h_n, m_n) = lmn(packed)
    expected, h_rnn = rnn(packed)
    torch.testing.assert_close(pad_packed_sequence(out)[0], pad_packed_sequence(expected)[0])
    torch.testing.assert_close(m_n, h_rnn)


def test_bidirectional_gradients_and_its_errors():
    lmn = randomise(LMN(2, 3, 2, num_layers=2, bidirectional=True), 7)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(5, 2, 2, generator=g, requires_grad=True)
    m0 = torch.randn(4, 2, 2, generator=g, requires_grad=True)
    lengths = torch.tensor([5, 3])

    def run(x, m0, *params):
        packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
        out, (_, m_n) = torch.func.functional_call(
            lmn, dict(zip(names, params, strict=True)), (packed, m0))
        return pad_packed_sequence(out)[0], m_n

    names = [name for name, _ in lmn.named_parameters()]
    assert sum(name.endswith("_reverse") for name in names) == 12
    assert torch.autograd.gradcheck(run, (x, m0, *lmn.parameters()))
    with pytest.raises(ValueError, match=r"memory state must have shape \(4, 2, 2\)"):
        lmn(x, torch.zeros(2, 2, 2))
    with pytest.raises(ValueError, match="not bidirectional"):
        LMN(2, 3, 2).layer_weights(0, reverse=True)
    radii = diagnostics.memory_radii_of({f"core.{k}": v for k, v in lmn.state_dict().items()})
    assert radii == pytest.approx([float(torch.linalg.eigvals(
        getattr(lmn, f"weight_mm_l{k}{s}").detach()).abs().max())
        for k in (0, 1) for s in ("", "_reverse")])
    assert "bidirectional=True" in repr(lmn)


def test_cell_matches_layer():
    torch.manual_seed(5)
    lmn = randomise(LMN(3, 4, 5), 5)
    cell = LMNCell(3, 4, 5)
    cell.load_state_dict({k.removesuffix("_l0"): v for k, v in lmn.state_dict().items()})
    x = torch.randn(5, 2, 3)
    out, _ = lmn(x)
    m = None
    for t in range(5):
        _h, m = cell(x[t], m)
        torch.testing.assert_close(m, out[t])
    h1, m1 = cell(x[0, 0])
    assert h1.shape == (4,) and m1.shape == (5,)


def autograd_loop(x, weights, m0, nonlinearity="tanh"):
    """The straightforward layer: batched eqs. (6)-(7), one autograd op per term and step.
    SELU is written out from its definition (Klambauer et al. 2017), not torch's."""
    scale, alpha = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717
    act = {"tanh": torch.tanh, "relu": torch.relu,
           "selu": lambda a: scale * torch.where(a > 0, a, alpha * torch.expm1(a))
           }[nonlinearity]
    m, hs, ms = m0, [], []
    for x_t in x:
        h = act(x_t @ weights["weight_xh"].t() + m @ weights["weight_mh"].t() + weights["bias_h"])
        m = h @ weights["weight_hm"].t() + m @ weights["weight_mm"].t() + weights["bias_m"]
        hs.append(h)
        ms.append(m)
    return torch.stack(hs), torch.stack(ms)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


VARIANTS = _ext.kernel_variants()  # every variant of the compiled kernel this CPU runs


@pytest.fixture(params=[*VARIANTS, False], ids=[*VARIANTS, "torch-loop"])
def kernel(request):
    """Run a test through each variant of the compiled CPU kernel and through the PyTorch loop."""
    with use_cpu_kernel(request.param):
        yield request.param


def test_cpu_kernel_is_built():
    """The fast path is the default: on this project's machines the kernel must build, with the
    portable variant and, on x86-64, every instruction set the CPU has."""
    assert _ext.load_cpu_kernel() is not None
    assert VARIANTS[-1] == "generic"
    if platform.machine() == "x86_64":
        flags = cpu_description()
        expected = [name for name, needs in (("avx512", ("avx512f", "avx512bw", "avx512vl")),
                                             ("avx2", ("avx2", "fma")))
                    if all(f" {flag} " in f" {flags[:-1]} " for flag in needs)]
        assert VARIANTS == [*expected, "generic"]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu", "selu"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_fast_path_equals_straightforward_loop(device, nonlinearity, batch_first, kernel):
    """Forward to 1e-6 in float32; every gradient (inputs, m0, weights) to 1e-10 in float64.
    Batch-first input runs the recurrence in batch-major buffers: both layouts are checked.
    The memory's states reach a few units (SELU's more), where float32 resolves 2.4e-7: the
    float32 tolerance is scaled by the largest value compared (the rounding of sums of such
    values; the fused GPU kernel's tanh and its order of summation differ from the loop's by
    such units)."""
    for dtype, tol in ((torch.float32, 1e-6), (torch.float64, 1e-10)):
        g = torch.Generator().manual_seed(8)
        lmn = LMN(6, 9, 7, nonlinearity=nonlinearity, batch_first=batch_first).to(device, dtype)
        with torch.no_grad():
            for p in lmn.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=dtype) * 0.3)
        x = torch.randn(40, 5, 6, generator=g, dtype=dtype).to(device).requires_grad_()
        m0 = torch.randn(1, 5, 7, generator=g, dtype=dtype).to(device).requires_grad_()
        if batch_first:
            out, (h_n, m_n) = lmn(x.transpose(0, 1).contiguous(), m0)
            out = out.transpose(0, 1)
        else:
            out, (h_n, m_n) = lmn(x, m0)
        hs, ms = autograd_loop(x, weights_used(lmn), m0[0], nonlinearity)
        if dtype is torch.float32:
            tol *= max(1.0, float(ms.detach().abs().max()), float(hs.detach().abs().max()))
        torch.testing.assert_close(out, ms, rtol=0, atol=tol)
        torch.testing.assert_close(h_n[0], hs[-1], rtol=0, atol=tol)
        torch.testing.assert_close(m_n[0], ms[-1], rtol=0, atol=tol)
        if dtype is torch.float64:
            w_out = torch.randn(7, generator=g, dtype=dtype).to(device)
            w_h = torch.randn(9, generator=g, dtype=dtype).to(device)
            inputs = (x, m0, *lmn.parameters())
            fast = torch.autograd.grad((out @ w_out).pow(2).sum() + (h_n @ w_h).sum(), inputs)
            ref = torch.autograd.grad((ms @ w_out).pow(2).sum() + (hs[-1] @ w_h).sum(), inputs)
            for a, b in zip(fast, ref, strict=True):
                # SELU's gradients reach 1e4 here: held to 1e-10 relative to the largest
                scale = max(1.0, float(b.abs().max())) if nonlinearity == "selu" else 1.0
                torch.testing.assert_close(a, b, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("batch_first", [False, True])
def test_fast_path_hidden_output_gradients(batch_first, kernel):
    """LMN-A (output = h_t): the gradient enters through h_t at every step."""
    torch.manual_seed(9)
    lmn = randomise(LMN(4, 6, 5, output="hidden", batch_first=batch_first), 9)
    x = torch.randn(12, 3, 4, requires_grad=True)
    if batch_first:
        out = lmn(x.transpose(0, 1).contiguous())[0].transpose(0, 1)
    else:
        out, _ = lmn(x)
    hs, _ = autograd_loop(x, weights_used(lmn), torch.zeros(3, 5))
    inputs = (x, *lmn.parameters())
    fast = torch.autograd.grad(out.sin().sum(), inputs)
    ref = torch.autograd.grad(hs.sin().sum(), inputs)
    for a, b in zip(fast, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_gradcheck(kernel):
    torch.manual_seed(6)
    lmn = randomise(LMN(3, 4, 3, num_layers=2), 6)
    x = torch.randn(5, 2, 3, requires_grad=True)
    m0 = torch.randn(2, 2, 3, requires_grad=True)
    params = tuple(lmn.parameters())

    def f(x, m0, *weights):
        state = dict(zip([n for n, _ in lmn.named_parameters()], weights, strict=True))
        out, (h_n, m_n) = torch.func.functional_call(lmn, state, (x, m0))
        return out, h_n, m_n

    assert torch.autograd.gradcheck(f, (x, m0, *params))


def kernel_case(steps, batch, hidden, memory, dtype, seed, batch_major=False):
    """Operands of ``lmn_recurrence`` with contracting random weights, requiring gradients."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return torch.randn(*shape, generator=g, dtype=dtype) * scale

    x = rand(batch, steps, hidden).transpose(0, 1) if batch_major else rand(steps, batch, hidden)
    ops = (x, rand(batch, memory), rand(hidden, memory, scale=memory ** -0.5),
           rand(memory, hidden, scale=0.5 * hidden ** -0.5),
           rand(memory, memory, scale=0.5 * memory ** -0.5), rand(memory, scale=0.1))
    return tuple(t.requires_grad_() for t in ops)


@contextlib.contextmanager
def num_threads(n):
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def assert_kernel_equals_loop(ops, nonlinearity="tanh", variant=True):
    """Outputs, final states and every operand's gradient through ``h`` alone and through ``m``
    alone (so each backward input is also absent once): kernel against PyTorch loop, 1e-12."""
    results = []
    for enabled in (variant, False):
        with use_cpu_kernel(enabled):
            hs, ms, h_n, m_n = lmn_recurrence(*ops, nonlinearity)
            grads = [torch.autograd.grad(out.tanh().sum(), ops, retain_graph=True)
                     for out in (hs, ms)]
            results.append((hs, ms, h_n, m_n, *grads[0], *grads[1]))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("shape", [(9, 13, 70, 130), (6, 1, 17, 33), (4, 7, 250, 64)])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu", "selu"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_on_awkward_shapes(shape, nonlinearity, threads, variant):
    """Sizes off every variant's lanes (16/8/4/2) and 6-row tiles, odd batches split over
    threads, both layouts, each output alone: kernel against the PyTorch loop, float64 to
    1e-12."""
    with num_threads(threads):
        for batch_major in (False, True):
            assert_kernel_equals_loop(kernel_case(*shape, torch.float64, 3, batch_major),
                                      nonlinearity, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_reuses_its_buffers_safely(variant):
    """The kernel keeps its packed weights and scratch rows between calls: a small problem after
    a large one (stale values beyond the small one's padding) and back must still be exact."""
    for shape in ((5, 9, 100, 140), (3, 2, 17, 9), (1, 4, 33, 70), (5, 9, 100, 140)):
        assert_kernel_equals_loop(kernel_case(*shape, torch.float64, 6), variant=variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_float32_and_thread_count(variant):
    """float32 against the float64 loop to 2.5e-6; the kernel's result does not depend on the
    number of threads (each row's sums run in the same order), bit for bit. Measured on an AVX2
    AMD EPYC: 1.88e-6 (avx2), 2.03e-6 (generic, no FMA) with the kernel's own tanh, 1.98e-6
    (generic) with ATen's before it; the float32 PyTorch loop 6.8e-7. The sums over the 250
    products of a column, in order in one accumulator (what makes a sequence's row the same
    alone or in a batch), weigh more than the tanh's rounding."""
    ops64 = kernel_case(128, 32, 250, 250, torch.float64, 4)
    ops32 = tuple(t.detach().float() for t in ops64)
    with use_cpu_kernel(False), torch.no_grad():
        reference = lmn_recurrence(*ops64)[1]
    outs = []
    for threads in (1, 2):
        with num_threads(threads), torch.no_grad(), use_cpu_kernel(variant):
            outs.append(lmn_recurrence(*ops32)[1])
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(outs[0].double(), reference, rtol=0, atol=2.5e-6)


def test_kernel_variants_differ_only_by_rounding():
    """The variants are the same function: on one problem their float64 results agree to 1e-13
    (the sums run in the same order; only FMA contraction differs)."""
    ops = kernel_case(20, 7, 37, 45, torch.float64, 8)
    outs = []
    for variant in VARIANTS:
        with use_cpu_kernel(variant), torch.no_grad():
            outs.append(lmn_recurrence(*ops)[1])
    for out in outs[1:]:
        torch.testing.assert_close(out, outs[0], rtol=0, atol=1e-13)


def test_kernel_switch_and_fallback(monkeypatch, tmp_path):
    """``use_cpu_kernel(False)`` runs the PyTorch loop; an unbuildable kernel warns once and
    falls back; ``LINMEM_CPU_KERNEL=0`` disables it."""
    # a build's first use measures every path, the loop's among them: done before counting
    _ext.cpu_path(ops_paths.measure_cpu_paths)
    calls = []
    loop = ops_paths.loop_forward
    monkeypatch.setattr(ops_paths, "loop_forward", lambda *a: calls.append(1) or loop(*a))
    ops = kernel_case(3, 2, 4, 5, torch.float64, 5)
    lmn_recurrence(*ops)
    assert calls == []
    with use_cpu_kernel(False):
        lmn_recurrence(*ops)
    assert calls == [1]

    def broken(**kwargs):
        raise RuntimeError("no compiler")

    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    # the failure is remembered beside the build: here, not beside this checkout's real one
    monkeypatch.setattr(_ext, "_build_directory", lambda name: tmp_path / name)
    _ext.load_cpu_kernel.cache_clear()
    try:
        with pytest.warns(RuntimeWarning, match="no compiler"):
            assert _ext.load_cpu_kernel() is None
        lmn_recurrence(*ops)
        assert calls == [1, 1]
        _ext.load_cpu_kernel.cache_clear()
        monkeypatch.setenv("LINMEM_CPU_KERNEL", "0")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert _ext.load_cpu_kernel() is None
    finally:
        _ext.load_cpu_kernel.cache_clear()
        _ext.cpu_path.cache_clear()
        monkeypatch.undo()
    assert _ext.load_cpu_kernel() is not None


def test_a_failed_build_is_tried_once_per_toolchain_and_said_in_one_line(monkeypatch, tmp_path):
    """Without a compiler nothing is built and one line says so; a build that fails is
    remembered beside it with its toolchain, so that the next process does not try again (nor
    print torch's warnings) until the compiler or ninja changes or the record is deleted."""
    calls = []

    def broken(**kwargs):
        calls.append(1)
        warnings.warn("torch: Error checking compiler version for c++ (six lines)", stacklevel=2)
        raise RuntimeError("c++: fatal error: no input files\n  compilation terminated.")

    monkeypatch.setattr("torch.utils.cpp_extension.load", broken)
    monkeypatch.setattr(_ext, "_build_directory", lambda name: tmp_path / name)
    monkeypatch.delenv("LINMEM_CPU_KERNEL", raising=False)
    marker = tmp_path / _ext._build_name() / _ext.FAILED_MARKER
    try:
        for attempt in range(2):
            _ext.load_cpu_kernel.cache_clear()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert _ext.load_cpu_kernel() is None
            assert len(caught) == 1 and caught[0].category is RuntimeWarning, caught
            text = str(caught[0].message)
            assert "\n" not in text and "fatal error: no input files compilation" in text
            assert f"delete {marker}" in text and calls == [1]  # the second: not tried again
            if attempt:
                assert "it failed before with this compiler" in text
        assert json.loads(marker.read_text())["toolchain"] == _ext._toolchain()
        # another toolchain (a compiler installed since) tries again
        monkeypatch.setattr(_ext, "_toolchain", lambda: {"c++": ["/new/c++", 1.0]})
        _ext.load_cpu_kernel.cache_clear()
        with pytest.warns(RuntimeWarning, match="no input files"):
            assert _ext.load_cpu_kernel() is None
        assert calls == [1, 1]
        # no compiler at all: nothing is run, one line says so
        monkeypatch.setattr(_ext, "_toolchain", lambda: {"c++": None, "ninja": None})
        marker.unlink()
        _ext.load_cpu_kernel.cache_clear()
        with pytest.warns(RuntimeWarning, match="no C\\+\\+ compiler: 'c\\+\\+' is not on PATH"):
            assert _ext.load_cpu_kernel() is None
        assert calls == [1, 1]
    finally:
        monkeypatch.undo()
        _ext.load_cpu_kernel.cache_clear()
        _ext.cpu_path.cache_clear()
    assert _ext.load_cpu_kernel() is not None


def test_each_checkout_builds_the_kernel_in_a_folder_of_its_own(monkeypatch, tmp_path):
    """The build's commands name the sources by path: a second checkout of the same sources
    (a worktree, CI's clone) gets another build name, so that neither rebuilds the other's."""
    import shutil

    here = _ext._build_name()
    copy = tmp_path / "csrc"
    shutil.copytree(_ext.CSRC, copy)
    monkeypatch.setattr(_ext, "CSRC", copy)
    _ext._build_name.cache_clear()
    try:
        other = _ext._build_name()
        assert other != here and other.startswith("linmem_lmn_cpu_")
        assert _ext._build_name() == other  # the same folder: the same build
    finally:
        _ext._build_name.cache_clear()
        monkeypatch.undo()
    assert _ext._build_name() == here


def test_measured_choice_is_recorded_and_env_forces_a_path(monkeypatch, tmp_path):
    """The first use measures every variant against the loop and records the choice beside the
    build; later uses read it without measuring; ``LINMEM_CPU_KERNEL`` overrides it."""
    record = tmp_path / "choice.json"
    monkeypatch.setattr(_ext, "_choice_file", lambda: record)
    monkeypatch.delenv("LINMEM_CPU_KERNEL", raising=False)
    calls = []

    def fake(variants):
        calls.append(list(variants))
        return {"choice": "loop"}

    try:
        _ext.cpu_path.cache_clear()
        assert _ext.cpu_path(fake) == "loop"
        assert calls == [VARIANTS]
        assert json.loads(record.read_text())["choice"] == "loop"
        _ext.cpu_path.cache_clear()
        assert _ext.cpu_path(fake) == "loop" and len(calls) == 1  # read back, not measured
        record.write_text("{not json")  # a damaged record is measured again
        _ext.cpu_path.cache_clear()
        assert _ext.cpu_path(fake) == "loop" and len(calls) == 2
        for value, expected in (("1", VARIANTS[0]), ("generic", "generic"), ("auto", "loop")):
            monkeypatch.setenv("LINMEM_CPU_KERNEL", value)
            _ext.cpu_path.cache_clear()
            assert _ext.cpu_path(fake) == expected
        monkeypatch.setenv("LINMEM_CPU_KERNEL", "sse9")
        _ext.cpu_path.cache_clear()
        with pytest.raises(ValueError, match="LINMEM_CPU_KERNEL='sse9'"):
            _ext.cpu_path(fake)
    finally:
        _ext.cpu_path.cache_clear()


def test_measurement_picks_a_path_not_slower_than_the_loop():
    """The record of :func:`measure_cpu_paths`: a time for every path and size, and a choice
    that is the loop or a variant at least as fast as the loop at both sizes."""
    rec = ops_paths.measure_cpu_paths(VARIANTS, repeats=1)
    assert set(rec["seconds"]) == {*VARIANTS, "loop"}
    assert all(set(t) == {"small", "large"} for t in rec["seconds"].values())
    assert rec["choice"] in (*VARIANTS, "loop")
    if rec["choice"] != "loop":
        times = rec["seconds"]
        assert all(times[rec["choice"]][s] <= times["loop"][s] for s in ("small", "large"))
        assert rec["speedup_over_loop"][rec["choice"]] == max(rec["speedup_over_loop"].values())
    with pytest.raises(ValueError, match="unknown CPU kernel 'sse9'"):
        with use_cpu_kernel("sse9"):
            pass


def test_measurement_with_no_variant_chooses_the_loop():
    """No kernel variant to time (no compiler, or ``LINMEM_CPU_KERNEL=loop``): the loop alone is
    timed and chosen (it raised "max() arg is an empty sequence")."""
    rec = ops_paths.measure_cpu_paths([], repeats=1)
    assert rec["choice"] == "loop" and set(rec["seconds"]) == {"loop"}
    assert rec["speedup_over_loop"] == {}


def test_measurement_times_the_paths_in_turns(monkeypatch):
    """Each round times every path once (a burst of load from another process slows them alike,
    not the one path timed then), after a round that warms them up and is not counted."""
    order = []
    timed = ops_paths._forward_backward
    module = _ext.load_cpu_kernel()
    names = {cpu_fills(module, v)[0]: v for v in VARIANTS} if VARIANTS else {}
    names[loop_forward] = "loop"

    def recorded(ops, forward, backward):
        order.append(names[forward])
        return timed(ops, forward, backward)

    monkeypatch.setattr(ops_paths, "_forward_backward", recorded)
    rec = ops_paths.measure_cpu_paths(VARIANTS, repeats=2)
    paths = [*VARIANTS, "loop"]
    assert order == paths * 3 * 2  # three rounds, two sizes
    assert rec["clock"] == ("cpu" if torch.get_num_threads() == 1 else "wall")
    assert all(0 < t < math.inf for times in rec["seconds"].values() for t in times.values())


def test_initial_memory_stays_bounded():
    """At initialisation the memory is a contraction: no blow-up over thousands of steps."""
    torch.manual_seed(7)
    lmn = LMN(88, 250, 500).float()
    x = (torch.rand(3000, 2, 88) < 0.05).float()
    with torch.no_grad():
        out, _ = lmn(x)
    norms = out.norm(dim=-1)
    assert torch.isfinite(norms).all()
    assert norms[-500:].max() < 3 * norms[:500].max()
    eig = torch.linalg.eigvals(lmn.weight_mm_l0.double()).abs().max()
    assert eig < 0.75


@pytest.mark.parametrize("nonlinearity, slope", [("selu", 1.0507009873554805), ("relu", 1.0)])
def test_memory_loop_gain_is_the_growth_rate_of_the_state(nonlinearity, slope):
    """With positive weights, inputs and biases every functional unit stays on the linear side
    of its activation, so the memory grows by the Perron root of W^mm + s W^hm W^mh per step:
    the ratio of successive state norms of the layer itself, over many steps, is the loop gain
    (while rho(W^mm) < 1). A tanh layer with the same weights stays bounded."""
    torch.manual_seed(3)
    # without the loop bound, which holds this gain below the memory bound (test_loop_bound)
    lmn = LMN(4, 5, 3, nonlinearity=nonlinearity, loop_bound=False).double()
    with torch.no_grad():
        for name, p in lmn.named_parameters():
            p.copy_(torch.rand_like(p) * (0.2 if name.startswith("weight_mm") else 0.5))
    gain = diagnostics.memory_loop_gains(lmn.state_dict(), nonlinearity)[0]
    w = {k: v.detach() for k, v in lmn.state_dict().items()}
    perron = torch.linalg.eigvals(w["weight_mm_l0"] + slope * w["weight_hm_l0"]
                                  @ w["weight_mh_l0"]).abs().max()
    assert torch.linalg.eigvals(w["weight_mm_l0"]).abs().max() < 1 < gain
    assert gain == pytest.approx(float(perron), rel=1e-12)
    with torch.no_grad():
        out, _ = lmn(torch.ones(200, 1, 4, dtype=torch.float64))
    norms = out[:, 0].norm(dim=-1)
    assert float(norms[-1] / norms[-2]) == pytest.approx(gain, rel=1e-9)
    bounded = LMN(4, 5, 3, nonlinearity="tanh").double()
    bounded.load_state_dict(lmn.state_dict())
    with torch.no_grad():
        out, _ = bounded(torch.ones(2000, 1, 4, dtype=torch.float64))
    assert out.abs().max() < 1e3
    assert diagnostics.memory_loop_gains(bounded.state_dict(), "tanh")[0] > 1


@pytest.mark.parametrize("batch_first", [False, True])
def test_saturated_fraction_counts_flat_tanh_units_over_valid_steps(batch_first):
    """The fraction of |h_t| > 0.99 over the valid steps, against eqs. (6)-(7) run by hand on a
    bounded layer with large weights (so that some units saturate and some do not); padding
    steps and a relu layer do not count."""
    torch.manual_seed(5)
    lmn = LMN(3, 6, 4, memory_bound=0.9, batch_first=batch_first).double()
    with torch.no_grad():
        for p in lmn.parameters():
            p.mul_(4)
    x = torch.randn(7, 2, 3, dtype=torch.float64)
    mask = torch.ones(7, 2, dtype=torch.bool)
    mask[5:, 1] = False
    w = {k: v.detach() for k, v in lmn.state_dict().items()}
    w_mm = w["weight_mm_l0"] * min(1.0, 0.9 / float(torch.linalg.matrix_norm(w["weight_mm_l0"], 2)))
    flat = valid = 0
    for b in range(2):
        m = torch.zeros(4, dtype=torch.float64)
        for t in range(7):
            h = torch.tanh(w["weight_xh_l0"] @ x[t, b] + w["bias_h_l0"] + w["weight_mh_l0"] @ m)
            m = w["weight_hm_l0"] @ h + w_mm @ m + w["bias_m_l0"]
            if mask[t, b]:
                flat += int((h.abs() > 0.99).sum())
                valid += 6
    assert 0 < flat < valid
    inputs, m_in = (x.transpose(0, 1), mask.t()) if batch_first else (x, mask)
    assert diagnostics.saturated_fraction(lmn, inputs, m_in) == pytest.approx(flat / valid,
                                                                               abs=1e-12)
    everything = diagnostics.saturated_fraction(lmn, inputs)
    assert everything != pytest.approx(flat / valid) and 0 < everything < 1
    relu = LMN(3, 6, 4, nonlinearity="relu")
    assert diagnostics.saturated_fraction(relu, torch.randn(7, 2, 3)) is None
    assert diagnostics.saturated_fraction(torch.nn.RNN(3, 4), torch.randn(7, 2, 3)) is None


def test_memory_loop_gains_per_layer_of_a_model_state():
    from linmem.models import build_model

    model = build_model("lmn-b", 6, memory=4, num_layers=2, nonlinearity="selu")
    # keys "core.weight_mm_l0", ...
    gains = diagnostics.memory_loop_gains(model.state_dict(), "selu")
    assert len(gains) == 2 and all(g > 0 for g in gains)
    assert diagnostics.memory_loop_gains(build_model("lstm", 4).state_dict(), "tanh") == []
    with pytest.raises(ValueError, match="nonlinearity"):
        diagnostics.memory_loop_gains(model.state_dict(), "cosh")


def test_bad_input_is_rejected():
    lmn = LMN(3, 4, 5)
    with pytest.raises(ValueError, match="features"):
        lmn(torch.randn(5, 2, 4))
    with pytest.raises(ValueError, match="shape"):
        lmn(torch.randn(5, 2, 3, 1))
    with pytest.raises(ValueError, match="memory state"):
        lmn(torch.randn(5, 2, 3), torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="output"):
        LMN(3, 4, 5, output="both")
    with pytest.raises(ValueError, match="positive"):
        LMNCell(3, 0, 5)
    with pytest.raises(ValueError, match=r"hidden_size must be a positive integer, got 4\.0"):
        LMN(3, 4.0, 5)  # as torch.nn.RNN: a size is an int (not left to fail in torch.empty)
    with pytest.raises(ValueError, match=r"num_layers must be a positive integer, got 2\.0"):
        LMN(3, 4, 5, num_layers=2.0)
    assert LMN(np.int64(3), np.int64(4), 5).weight_xh_l0.shape == (4, 3)  # numpy's ints are ints
    with pytest.raises(ValueError, match="nonlinearity"):
        LMN(3, 4, 5, nonlinearity="sigmoid")


def test_parameter_names_and_shapes():
    lmn = LMN(88, 50, 70, num_layers=2, output="memory")
    shapes = {n: tuple(p.shape) for n, p in lmn.named_parameters()}
    # torch.nn.RNN's API: all_weights per layer and direction, flatten_parameters a no-op
    assert [[id(p) for p in ps] for ps in lmn.all_weights] == [
        [id(p) for n, p in lmn.named_parameters() if n.endswith(f"_l{k}")] for k in (0, 1)]
    assert lmn.flatten_parameters() is None and len(list(lmn.parameters())) == 12
    both = LMN(3, 4, 5, bidirectional=True, bias=False)
    assert [[tuple(p.shape) for p in ps] for ps in both.all_weights] == 2 * [
        [(4, 3), (4, 5), (5, 4), (5, 5)]]
    assert both.all_weights[1][0] is both.weight_xh_l0_reverse
    assert shapes["weight_xh_l0"] == (50, 88) and shapes["weight_xh_l1"] == (50, 70)
    assert shapes["weight_mh_l0"] == (50, 70) and shapes["weight_hm_l0"] == (70, 50)
    assert shapes["weight_mm_l1"] == (70, 70)
    assert shapes["bias_h_l1"] == (50,) and shapes["bias_m_l0"] == (70,)
    assert all(torch.all(getattr(lmn, f"bias_{w}_l{k}") == 0) for w in "hm" for k in (0, 1))


def _autocast_cases():
    """(module, input, state) for every recurrent module of the library, batch first."""
    from linmem.nn.rnns import GRU, LSTM, RNN
    from linmem.nn.ulm import UnrolledNet

    torch.manual_seed(0)
    x = torch.randn(3, 9, 7)
    cases = {"lmn": (LMN(7, 6, 5, num_layers=2, batch_first=True), x,
                     torch.randn(2, 3, 5)),
             "lmn-packed": (LMN(7, 6, 5, batch_first=True),
                            pack_sequence([x[0], x[1, :5], x[2, :2]]), None),
             "cell": (LMNCell(7, 6, 5), x[:, 0], (torch.randn(3, 6), torch.randn(3, 5))),
             "unrolled": (UnrolledNet(7, 6, 3, batch_first=True), x, None)}
    for name, cls in (("rnn", RNN), ("gru", GRU), ("lstm", LSTM)):
        cases[name] = (cls(7, 6, num_layers=2, batch_first=True), x, None)
    for name in ("lmn", "lmn-packed", "cell"):
        # in training mode a bounded LMN's every call moves its certified norm's start on
        # (linmem.ops.certified_norm), so two calls agree to rounding, not bit for bit: held
        cases[name][0].eval()
    return cases


def _outputs_and_grads(call, module, x, state) -> list[torch.Tensor]:
    """``call(x, state)``'s output (a packed sequence's data) and final states, then the
    gradients of ``module``'s parameters (set afresh) from a loss over them."""
    module.zero_grad()
    out, final = call(x, state)
    data = out.data if hasattr(out, "batch_sizes") else out
    finals = list(final) if isinstance(final, tuple) else [final]
    (data.square().sum() + sum(f.sum() for f in finals)).backward()
    return [data, *finals, *(p.grad.clone() for p in module.parameters() if p.grad is not None)]


@pytest.mark.parametrize("name", ["lmn", "lmn-packed", "cell", "unrolled", "rnn", "gru",
                                  "lstm"])
def test_recurrences_keep_their_precision_under_autocast(name):
    """Under ``torch.autocast`` (bfloat16 on the CPU) every recurrent module runs in its
    parameters' precision: outputs, final states and gradients equal the float32 run's exactly
    (the module's input products included), instead of failing on mixed dtypes."""
    torch.set_default_dtype(torch.float32)  # autocast lowers float32 (the fixture restores)
    module, x, state = _autocast_cases()[name]

    def run(autocast: bool):
        def call(x, state):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                return module(x, state)

        return _outputs_and_grads(call, module, x, state)

    plain, cast = run(False), run(True)
    assert len(plain) == len(cast) > 3
    for a, b in zip(plain, cast, strict=True):
        assert b.dtype == torch.float32 and torch.equal(a, b)


@pytest.mark.parametrize("name", ["lmn", "lmn-packed", "cell", "unrolled", "rnn", "gru",
                                  "lstm"])
def test_meta_device_gives_the_shapes_of_a_real_run(name):
    """On the ``meta`` device (shape inference, deferred initialisation) every recurrent module
    runs forward and backward, its outputs, final states and gradients shaped as on the CPU
    (autocast, which knows no ``meta`` device, is not asked)."""
    module, x, state = _autocast_cases()[name]

    def to_meta(t):  # a tensor, a packed sequence, a tuple of tensors or None
        if t is None or hasattr(t, "batch_sizes"):
            return t if t is None else t.to("meta")
        return tuple(map(to_meta, t)) if isinstance(t, tuple) else t.to("meta")

    real = _outputs_and_grads(module, module, x, state)
    meta = copy.deepcopy(module).to("meta")
    shaped = _outputs_and_grads(meta, meta, to_meta(x), to_meta(state))
    assert len(real) == len(shaped) > 3
    for a, b in zip(real, shaped, strict=True):
        assert b.device.type == "meta" and b.shape == a.shape and b.dtype == a.dtype


@pytest.mark.parametrize("name", ["lmn", "lmn-packed", "cell", "unrolled", "rnn", "gru",
                                  "lstm-kernel"])
def test_torch_compile_gives_the_eager_results(name):
    """Under ``torch.compile`` (dynamo, eager backend) every recurrent module gives its eager
    outputs, final states and gradients, its recurrence running as it is (a graph break): dynamo
    is not left to trace the kernel's loading and path choice (its warnings about ``lru_cache``
    and C++ extensions)."""
    cases = _autocast_cases()
    if name == "lstm-kernel":  # the LSTM's kernel path, which asks for the kernel up front
        module, x, state = cases["lstm"]
        module.min_kernel_hidden = 1
    else:
        module, x, state = cases[name]

    def run(call):
        return _outputs_and_grads(call, module, x, state)

    eager = run(module)  # first, as a user's first calls are: it finds the kernel
    torch._dynamo.reset()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled = run(torch.compile(module, backend="eager"))
    for a, b in zip(eager, compiled, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)
    traced = [str(w.message) for w in caught
              if "lru_cache" in str(w.message) or "C/C++" in str(w.message)]
    assert not traced, traced[0]


def test_every_model_trains_under_autocast():
    """A model's recurrence stays in float32 while its readout follows autocast: each
    registered model's training loss under bfloat16 autocast is within 1e-3 of float32's and
    backpropagates to every parameter that float32 reaches."""
    from linmem.batching import collate
    from linmem.models import MODELS, build_model, option_names

    torch.set_default_dtype(torch.float32)  # autocast lowers float32 (the fixture restores)
    g = torch.Generator().manual_seed(1)
    batch = collate([(torch.rand(n, 88, generator=g) < 0.1).float().numpy() for n in (9, 6)])
    for name in MODELS:
        torch.manual_seed(0)
        options = {"rbm_predict": "mean-field"} if name == "rnn-rbm" else {}
        if "k" in option_names(name):
            options["k"] = 3
        model = build_model(name, 12, 10, **options)
        sampled = name == "rnn-rbm"  # its CD cost draws Gibbs chains: no float32 twin
        if not sampled:
            reference = model.training_loss(batch)
            reference.backward()
            reached = {n for n, p in model.named_parameters() if p.grad is not None}
            model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model.training_loss(batch)
        loss.backward()
        assert torch.isfinite(loss), name
        if not sampled:
            assert loss.item() == pytest.approx(reference.item(), rel=1e-3), name
            assert {n for n, p in model.named_parameters() if p.grad is not None} == reached


def test_dropout_on_one_layer_warns_as_torch_does():
    """torch.nn.RNN warns that dropout between layers does nothing on one layer; so does LMN."""
    with pytest.warns(UserWarning, match="dropout=0.5 with num_layers=1 drops nothing"):
        LMN(3, 4, 5, dropout=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        LMN(3, 4, 5, num_layers=2, dropout=0.5)
        LMN(3, 4, 5)


@pytest.mark.parametrize(("output", "state"), [("memory", 1), ("hidden", 0)])
def test_the_last_output_is_the_state_its_wiring_reads(output, state):
    """LMN-B's last output is m_n[-1], LMN-A's h_n[-1] (the docstring's and the guide's note)."""
    torch.manual_seed(0)
    lmn = LMN(6, 4, 3, num_layers=2, output=output, batch_first=True)
    out, states = lmn(torch.rand(2, 7, 6))
    torch.testing.assert_close(out[:, -1], states[state][-1], rtol=0, atol=0)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("size", [50, 100, 250, 500, 77])
@pytest.mark.parametrize("nonlinearity", ["tanh", "relu", "selu"])
def test_batch_one_is_each_row_of_a_batch_bit_for_bit(variant, size, nonlinearity):
    """At batch 1 the products take their one-row path (several panels at once): every state
    and gradient of a sequence run alone equals, bit for bit, its row in a batch (the tiles'
    path), at the sizes of a layer and one off every variant's lanes, T = 1, 2, 129, with an
    initial state; and equals the PyTorch loop to float64 rounding."""
    for steps in (1, 2, 129):
        ops = kernel_case(steps, 3, size, size, torch.float64, size + steps)
        with use_cpu_kernel(variant), num_threads(1):
            hs, ms, _, _ = lmn_recurrence(*ops, nonlinearity)
            together = torch.autograd.grad((hs.tanh().sum() + ms.tanh().sum()), ops)
            for row in range(3):
                alone = [ops[0][:, row:row + 1].detach().requires_grad_(),
                         ops[1][row:row + 1].detach().requires_grad_(), *ops[2:]]
                hs1, ms1, _, _ = lmn_recurrence(*alone, nonlinearity)
                assert torch.equal(hs1[:, 0], hs[:, row]) and torch.equal(ms1[:, 0], ms[:, row])
                grads = torch.autograd.grad(hs1.tanh().sum() + ms1.tanh().sum(), alone[:2])
                assert torch.equal(grads[0][:, 0], together[0][:, row])
                assert torch.equal(grads[1][0], together[1][row])
        assert_kernel_equals_loop(kernel_case(steps, 1, size, size, torch.float64, 7),
                                  nonlinearity, variant)


@pytest.mark.parametrize("variant", VARIANTS)
def test_stream_read_reads_every_value(variant):
    """The benchmark's streaming bound reads what it is given, every repeat (its sum)."""
    from linmem.ops.cpu import load_cpu_kernel

    kernel = load_cpu_kernel()
    data = torch.ones(8 * 16 * 100, dtype=torch.float32)  # whole blocks of 8 vectors, any variant
    assert kernel.stream_read(data, 3, variant) == 3 * data.numel()
    data[::7] = 2.0
    assert kernel.stream_read(data, 1, variant) == float(data.sum())


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_kernels_tanh_is_within_one_and_a_half_units_of_the_exact_one(variant):
    """The float32 loops' own tanh (in place of a call into ATen's per step) against tanh in
    float64 rounded to float32, over every 61st float32 of [2^-30, 20] and their negatives (both
    branches, the switch at 0.625 and the clamp at 20): within 1.5 units in the last place
    (measured 1.32), odd, and exact at the specials: +-0 keep their sign, +-inf give +-1, NaN
    stays NaN, denormals are themselves, from 9.02 on it is 1."""
    kernel = _ext.load_cpu_kernel()
    lo, hi = np.float32(2.0 ** -30).view(np.int32), np.float32(20.0).view(np.int32)
    x = np.arange(lo, hi + 1, 61, dtype=np.int32).view(np.float32)
    x = np.concatenate([x, -x])
    got = torch.from_numpy(x.copy())
    kernel.tanh_(got, variant)
    exact = np.tanh(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact.astype(np.float32))).astype(np.float64)
    error = np.abs(got.numpy().astype(np.float64) - exact) / ulp
    assert error.max() <= 1.5, (error.max(), x[error.argmax()])
    half = len(x) // 2
    assert torch.equal(got[half:], -got[:half])
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 9.02, 1e30],
                            dtype=torch.float32)
    out = specials.clone()
    kernel.tanh_(out, variant)
    assert out[:2].tolist() == [0.0, 0.0] and math.copysign(1, out[1]) == -1
    assert out[2:4].tolist() == [1.0, -1.0] and math.isnan(out[4])
    assert torch.equal(out[5:7], specials[5:7])  # the smallest denormals
    assert out[7:].tolist() == [1.0, 1.0]


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_float32_recurrence_applies_the_kernels_tanh(variant):
    """From m_0 = 0 the first pre-activation is x_1 exactly, so the float32 kernel's h_1 is its
    tanh of x_1 bit for bit, every row (a batch of 3 and one alone) and every column of a size
    off every variant's lanes (the row's last, partial vector included)."""
    ops = [t.detach().float() for t in kernel_case(3, 3, 77, 45, torch.float64, 11)]
    ops[1] = torch.zeros_like(ops[1])
    expected = ops[0][0].contiguous().clone()
    _ext.load_cpu_kernel().tanh_(expected, variant)
    with use_cpu_kernel(variant), torch.no_grad():
        hs = lmn_recurrence(*ops, "tanh")[0]
        alone = lmn_recurrence(ops[0][:, 1:2], ops[1][1:2], *ops[2:], "tanh")[0]
    assert torch.equal(hs[0], expected)
    assert torch.equal(alone[0, 0], expected[1])


def test_one_vocabulary_names_the_cpu_path_everywhere(monkeypatch):
    """``TrainConfig.cpu_kernel``, :func:`use_cpu_kernel` and ``LINMEM_CPU_KERNEL`` take the
    names of :data:`CPU_KERNELS` and mean the same path by each: ``best`` the first variant
    this CPU runs, ``loop`` the PyTorch loop, a variant itself, ``auto`` the measured choice."""
    from linmem.training.config import TrainConfig

    field = next(f for f in TrainConfig.__dataclass_fields__.values() if f.name == "cpu_kernel")
    assert tuple(field.metadata["choices"]) == _ext.CPU_KERNELS
    expected = {"best": VARIANTS[0] if VARIANTS else "loop", "loop": "loop",
                **{v: v for v in VARIANTS}}
    for name, path in expected.items():
        assert _ext.resolve_cpu_kernel(name) == path
        with use_cpu_kernel(name):
            assert ops_paths.cpu_kernel_path() == path
        monkeypatch.setenv("LINMEM_CPU_KERNEL", name)
        _ext.cpu_path.cache_clear()
        try:
            assert _ext.cpu_path() == path
        finally:
            monkeypatch.delenv("LINMEM_CPU_KERNEL")
            _ext.cpu_path.cache_clear()
    assert _ext.resolve_cpu_kernel("auto") is None
    with use_cpu_kernel(True):
        assert ops_paths.cpu_kernel_path() == expected["best"]
    with use_cpu_kernel(False):
        assert ops_paths.cpu_kernel_path() == "loop"
    for missing in sorted(set(_ext.VARIANTS) - set(VARIANTS)):  # variants this CPU lacks
        with pytest.raises(ValueError, match="does not run here"):
            _ext.resolve_cpu_kernel(missing)
