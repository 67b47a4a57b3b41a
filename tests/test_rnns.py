"""linmem.nn.rnns.RNN, GRU and LSTM against torch.nn.RNN, GRU and LSTM with the same weights:
outputs, final states and every gradient; and torch's autograd check of the explicit backward."""

import pytest
import torch
from torch import nn

from linmem.nn.rnns import GRU, LSTM, RNN, as_torch
from linmem.ops import cpu as _ext
from linmem.ops.paths import use_cpu_kernel
from linmem.ops.rnns import gru_recurrence, lstm_recurrence, rnn_recurrence

KINDS = [(GRU, nn.GRU, {}), (RNN, nn.RNN, {"nonlinearity": "tanh"}),
         (RNN, nn.RNN, {"nonlinearity": "relu"})]
IDS = ["gru", "rnn-tanh", "rnn-relu"]


def _pair(kind, seed: int, **kw):
    ours_cls, ref_cls, extra = kind
    torch.manual_seed(seed)
    ours = ours_cls(**extra, **kw)
    if isinstance(ours, LSTM):
        ours.min_kernel_hidden = 0  # the kernel at the tests' small sizes too
    torch.manual_seed(seed)
    ref = ref_cls(**extra, **kw)
    return ours, ref


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
def test_equals_torch(kind, batch_first, num_layers):
    ours, ref = _pair(kind, 0, input_size=5, hidden_size=7, num_layers=num_layers,
                      batch_first=batch_first)
    for (a, pa), (b, pb) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert a == b and torch.equal(pa, pb)  # same parameters, same initialisation
    g = torch.Generator().manual_seed(1)
    shape = (3, 9, 5) if batch_first else (9, 3, 5)
    x = torch.randn(shape, generator=g, requires_grad=True)
    h0 = torch.randn(num_layers, 3, 7, generator=g, requires_grad=True)
    weights = torch.randn((*shape[:2], 7), generator=g)
    results = []
    for model in (ours, ref):
        out, h_n = model(x, h0)
        loss = (out * weights).sum() + (h_n ** 2).sum()
        grads = torch.autograd.grad(loss, [x, h0, *model.parameters()])
        results.append((out, h_n, grads))
    (out, h_n, grads), (out_r, h_n_r, grads_r) = results
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h_n, h_n_r, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_r, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS, ids=IDS)
def test_no_initial_state_unbatched_and_fallbacks(kind):
    ours, ref = _pair(kind, 2, input_size=4, hidden_size=6, batch_first=True)
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(3))
    for a, b in zip(ours(x), ref(x), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(ours(x[0]), ref(x[0]), strict=True):  # unbatched (T, I)
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([8, 5]), batch_first=True)
    out, _ = ours(packed)  # torch's own path
    ref_out, _ = ref(packed)
    torch.testing.assert_close(out.data, ref_out.data)
    with pytest.raises(RuntimeError, match="input_size"):
        ours(torch.zeros(2, 8, 3))
    with pytest.raises(RuntimeError, match="hidden size"):
        ours(x, torch.zeros(1, 3, 6))


@pytest.mark.parametrize("kind", [*KINDS, (LSTM, nn.LSTM, {})], ids=[*IDS, "lstm"])
def test_dropout_between_layers_is_torchs(kind):
    ours, ref = _pair(kind, 4, input_size=3, hidden_size=5, num_layers=2, dropout=0.5)
    x = torch.randn(6, 2, 3, generator=torch.Generator().manual_seed(5))
    torch.manual_seed(6)
    out, _ = ours(x)
    torch.manual_seed(6)
    ref_out, _ = ref(x)
    assert not torch.equal(out, ours.eval()(x)[0])  # dropout acted in training mode
    torch.testing.assert_close(out, ref_out, rtol=1e-5, atol=1e-6)


def test_recurrences_gradcheck():
    g = torch.Generator().manual_seed(7)

    def args(width, steps=5):
        return [torch.randn(*s, dtype=torch.float64, generator=g, requires_grad=True)
                for s in ((steps, 2, width), (2, 3), (width, 3), (width,))]

    gru_args, rnn_args = args(9), args(3)
    assert torch.autograd.gradcheck(gru_recurrence, args(9, steps=1))  # no lagged states
    assert torch.autograd.gradcheck(rnn_recurrence, args(3, steps=1))
    assert torch.autograd.gradcheck(gru_recurrence, gru_args)
    assert torch.autograd.gradcheck(lambda *a: gru_recurrence(*a)[2], gru_args)  # some steps
    assert torch.autograd.gradcheck(rnn_recurrence, rnn_args)
    assert torch.autograd.gradcheck(lambda *a: rnn_recurrence(*a, "relu")[2], rnn_args)
    with pytest.raises(ValueError, match="nonlinearity"):
        rnn_recurrence(*rnn_args, "selu")


VARIANTS = _ext.kernel_variants()  # every variant of the compiled kernel this CPU runs


RECURRENCES = {"gru": (3, gru_recurrence), "tanh": (1, rnn_recurrence),
               "relu": (1, lambda *ops: rnn_recurrence(*ops, "relu"))}


def _case(kind, steps, batch, hidden, seed, batch_major=False):
    """A GRU's or RNN's recurrence operands in float64: gi (T, B, gates H) (a batch-major
    buffer seen time-major with ``batch_major``), h0, W_hh, b_hh, all requiring gradients."""
    gates = RECURRENCES[kind][0]
    g = torch.Generator().manual_seed(seed)
    gi = torch.randn(batch, steps, gates * hidden, generator=g, dtype=torch.float64)
    gi = (gi.transpose(0, 1) if batch_major else gi.transpose(0, 1).contiguous())
    ops = [gi, torch.randn(batch, hidden, generator=g, dtype=torch.float64),
           torch.randn(gates * hidden, hidden, generator=g, dtype=torch.float64)
           * hidden ** -0.5, torch.randn(gates * hidden, generator=g, dtype=torch.float64) * 0.1]
    return [t.detach().requires_grad_() for t in ops]


def _run(kind, ops, path, weights):
    with use_cpu_kernel(path):
        hs = RECURRENCES[kind][1](*ops)
        return (hs, *torch.autograd.grad((hs * weights).sum(), ops))


def _assert_kernel_equals_loop(kind, ops, variant, weights):
    for a, b in zip(_run(kind, ops, variant, weights), _run(kind, ops, False, weights),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", list(RECURRENCES))
@pytest.mark.parametrize("shape", [(9, 13, 17), (6, 1, 70), (4, 7, 33), (1, 2, 5)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_equals_the_loop(kind, shape, threads, variant):
    """The compiled GRU and RNN recurrences against their PyTorch loops: states and the
    gradients of gi, h0, W_hh and b_hh, float64 to 1e-12; sizes off every variant's lanes and
    6-row tiles, odd batches split over threads, time- and batch-major gi."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for batch_major in (False, True):
            ops = _case(kind, *shape, seed=sum(shape), batch_major=batch_major)
            if batch_major:  # h0 of rows that are not contiguous too (a transposed buffer)
                ops[1] = ops[1].detach().t().contiguous().t().requires_grad_()
            weights = torch.randn(shape, dtype=torch.float64,
                                  generator=torch.Generator().manual_seed(1))
            _assert_kernel_equals_loop(kind, ops, variant, weights)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("kind", list(RECURRENCES))
@pytest.mark.parametrize("variant", VARIANTS)
def test_kernel_reuses_its_buffers_and_matches_torch_in_float32(kind, variant):
    """A small problem after a large one (the packed weights and scratch rows are kept between
    calls) is still exact; and the module on the kernel equals torch's in float32."""
    for shape in ((5, 9, 40), (3, 2, 7), (5, 9, 40)):
        _assert_kernel_equals_loop(kind, _case(kind, *shape, seed=3), variant,
                                   torch.ones(shape, dtype=torch.float64))
    ours, ref = _pair(KINDS[IDS.index("gru" if kind == "gru" else f"rnn-{kind}")], 5,
                      input_size=88, hidden_size=50, batch_first=True)
    x = torch.randn(4, 30, 88, generator=torch.Generator().manual_seed(6), requires_grad=True)
    with use_cpu_kernel(variant):
        out, h_n = ours(x)
        grads = torch.autograd.grad(out.sum() + h_n.sum(), [x, *ours.parameters()])
    out_r, h_n_r = ref(x)
    grads_r = torch.autograd.grad(out_r.sum() + h_n_r.sum(), [x, *ref.parameters()])
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_r, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


# The LSTM: its state is the pair (h, c), its recurrence returns (hs, c_T).

def _lstm_pair(seed: int, **kw):
    return _pair((LSTM, nn.LSTM, {}), seed, **kw)


def _lstm_loss(model, x, state, weights):
    out, (h_n, c_n) = model(x, state)
    return out, h_n, c_n, (out * weights).sum() + (h_n ** 2).sum() + c_n.sin().sum()


@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("path", [True, False], ids=["kernel", "loop"])
def test_lstm_equals_torch(batch_first, num_layers, path):
    """Outputs, h_n, c_n and the gradients of the input, both initial states and every
    parameter, float64 to 1e-12, on the kernel and with the kernel off (then PyTorch's own
    forward: the module does not run its slower PyTorch loop)."""
    ours, ref = _lstm_pair(0, input_size=5, hidden_size=7, num_layers=num_layers,
                           batch_first=batch_first)
    ours, ref = ours.double(), ref.double()
    for (a, pa), (b, pb) in zip(ours.named_parameters(), ref.named_parameters(), strict=True):
        assert a == b and torch.equal(pa, pb)  # same parameters, same initialisation
    g = torch.Generator().manual_seed(1)
    shape = (3, 9, 5) if batch_first else (9, 3, 5)
    x = torch.randn(shape, generator=g, dtype=torch.float64, requires_grad=True)
    h0, c0 = (torch.randn(num_layers, 3, 7, generator=g, dtype=torch.float64,
                          requires_grad=True) for _ in range(2))
    weights = torch.randn((*shape[:2], 7), generator=g, dtype=torch.float64)
    results = []
    for model in (ours, ref):
        with use_cpu_kernel(path):
            *outs, loss = _lstm_loss(model, x, (h0, c0), weights)
            results.append((*outs, *torch.autograd.grad(loss, [x, h0, c0, *model.parameters()])))
    for a, b in zip(*results, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@use_cpu_kernel(True)  # the kernel whatever path this machine chose (none: torch's forward)
def test_lstm_no_initial_state_unbatched_and_fallbacks():
    ours, ref = _lstm_pair(2, input_size=4, hidden_size=6, batch_first=True)
    x = torch.randn(2, 8, 4, generator=torch.Generator().manual_seed(3))
    for inputs in ((x,), (x[0],), (x[0], (torch.ones(1, 6), torch.zeros(1, 6)))):  # unbatched
        (out, (h, c)), (out_r, (h_r, c_r)) = ours(*inputs), ref(*inputs)
        for a, b in ((out, out_r), (h, h_r), (c, c_r)):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    packed = nn.utils.rnn.pack_padded_sequence(x, torch.tensor([8, 5]), batch_first=True)
    torch.testing.assert_close(ours(packed)[0].data, ref(packed)[0].data)  # torch's own path
    with pytest.raises(RuntimeError, match="input_size"):
        ours(torch.zeros(2, 8, 3))
    with pytest.raises(RuntimeError, match="Expected hidden size" if VARIANTS else "hidden"):
        ours(x, (torch.zeros(1, 2, 6), torch.zeros(1, 3, 6)))


def _lstm_case(steps, batch, hidden, seed, batch_major=False):
    """An LSTM recurrence's operands in float64: gi (T, B, 4H), h0, c0, W_hh, b_hh."""
    g = torch.Generator().manual_seed(seed)
    gi = torch.randn(batch, steps, 4 * hidden, generator=g, dtype=torch.float64)
    gi = gi.transpose(0, 1) if batch_major else gi.transpose(0, 1).contiguous()
    ops = [gi, torch.randn(batch, hidden, generator=g, dtype=torch.float64),
           torch.randn(batch, hidden, generator=g, dtype=torch.float64),
           torch.randn(4 * hidden, hidden, generator=g, dtype=torch.float64) * hidden ** -0.5,
           torch.randn(4 * hidden, generator=g, dtype=torch.float64) * 0.1]
    return [t.detach().requires_grad_() for t in ops]


def test_lstm_recurrence_gradcheck():
    """torch's autograd check of the explicit backward, through the states and through c_T,
    on the kernel and on the loop."""
    for path in (True, False):
        with use_cpu_kernel(path):
            for steps in (1, 4):
                ops = _lstm_case(steps, 2, 3, seed=steps)
                assert torch.autograd.gradcheck(lstm_recurrence, ops)
                assert torch.autograd.gradcheck(lambda *a: lstm_recurrence(*a)[1], ops)


@pytest.mark.parametrize("shape", [(9, 13, 17), (6, 1, 70), (4, 7, 33), (1, 2, 5)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("variant", VARIANTS)
def test_lstm_kernel_equals_the_loop(shape, threads, variant):
    """The compiled LSTM recurrence against its PyTorch loop: hs, c_T and the gradients of gi,
    h0, c0, W_hh and b_hh, float64 to 1e-12; sizes off every variant's lanes and 6-row tiles,
    odd batches split over threads, time- and batch-major gi, initial states whose rows are
    not contiguous."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for batch_major in (False, True):
            ops = _lstm_case(*shape, seed=sum(shape), batch_major=batch_major)
            if batch_major:
                ops[1], ops[2] = (o.detach().t().contiguous().t().requires_grad_()
                                  for o in ops[1:3])
            g = torch.Generator().manual_seed(1)
            w_hs = torch.randn(shape, dtype=torch.float64, generator=g)
            w_c = torch.randn(shape[1:], dtype=torch.float64, generator=g)
            results = []
            for path in (variant, False):
                with use_cpu_kernel(path):
                    hs, c_n = lstm_recurrence(*ops)
                    loss = (hs * w_hs).sum() + (c_n * w_c).sum()
                    results.append((hs, c_n, *torch.autograd.grad(loss, ops)))
            for a, b in zip(*results, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    finally:
        torch.set_num_threads(previous)


@pytest.mark.parametrize("variant", VARIANTS)
def test_lstm_kernel_matches_torch_in_float32(variant):
    """A small problem after a large one (buffers kept between calls), then the module on the
    kernel against torch's fused LSTM in float32, gradients of c_n unused (None) too."""
    for shape in ((5, 9, 40), (3, 2, 7)):
        with use_cpu_kernel(variant):
            hs, c_n = lstm_recurrence(*_lstm_case(*shape, seed=3))
        with use_cpu_kernel(False):
            hs_r, c_n_r = lstm_recurrence(*_lstm_case(*shape, seed=3))
        torch.testing.assert_close(hs, hs_r, rtol=0, atol=1e-12)
        torch.testing.assert_close(c_n, c_n_r, rtol=0, atol=1e-12)
    ours, ref = _lstm_pair(5, input_size=88, hidden_size=50, batch_first=True)
    x = torch.randn(4, 30, 88, generator=torch.Generator().manual_seed(6), requires_grad=True)
    with use_cpu_kernel(variant):
        out, _ = ours(x)
        grads = torch.autograd.grad(out.sum(), [x, *ours.parameters()])
    out_r, _ = ref(x)
    grads_r = torch.autograd.grad(out_r.sum(), [x, *ref.parameters()])
    torch.testing.assert_close(out, out_r, rtol=1e-5, atol=1e-6)
    for a, b in zip(grads, grads_r, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_as_torch_is_pytorchs_module_with_the_same_weights():
    """The reference of each of ours: PyTorch's class, the same configuration, a copy of the
    weights (the same outputs), the training mode kept; anything else is refused."""
    x = torch.randn(2, 5, 4, generator=torch.Generator().manual_seed(8))
    for ours in (RNN(4, 6, 2, nonlinearity="relu", batch_first=True), GRU(4, 6),
                 LSTM(4, 6, batch_first=True, dropout=0.0).double().eval()):
        reference = as_torch(ours)
        assert type(reference) in (nn.RNN, nn.GRU, nn.LSTM) and type(reference) is not type(ours)
        assert isinstance(ours, type(reference)) and reference.training == ours.training
        assert str(reference) == str(ours)  # the same configuration
        xs = x.to(next(ours.parameters()).dtype)
        torch.testing.assert_close(reference(xs)[0], ours(xs)[0], rtol=1e-5, atol=1e-6)
        next(reference.parameters()).data.add_(1.0)  # a copy, not the same tensors
        assert not torch.equal(next(reference.parameters()), next(ours.parameters()))
    with pytest.raises(TypeError, match=r"expected a linmem\.nn\.rnns"):
        as_torch(nn.LSTM(4, 6))


def test_lstm_takes_the_kernel_only_where_it_is_faster(monkeypatch):
    """The module's recurrence runs on the kernel from min_kernel_hidden units on and with the
    kernel on; below, or on the PyTorch loop's path, it is PyTorch's own forward."""
    from linmem.nn import rnns
    from linmem.ops import rnns as ops_rnns

    calls = []
    monkeypatch.setattr(rnns, "lstm_recurrence",
                        lambda *a: calls.append(1) or tuple(ops_rnns.lstm_scan(*a)[:2]))
    x = torch.randn(5, 2, 3)
    for hidden, minimum, path, expected in ((8, 512, True, 0), (8, 8, True, 1),
                                            (8, 8, False, 0)):
        model = LSTM(3, hidden)
        model.min_kernel_hidden = minimum
        calls.clear()
        with use_cpu_kernel(path):
            model(x)
        assert len(calls) == (expected if VARIANTS else 0)
    assert LSTM(3, 4).min_kernel_hidden == 512
