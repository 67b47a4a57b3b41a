"""The LMN's recurrence as a registered operator (issue 44): ``torch.library.opcheck``, the
operator against its references, and PyTorch's tools around a model holding an LMN:
``torch.compile(fullgraph=True, dynamic=True)``, ``torch.export``, ``torch.func`` and double
backward."""

import pytest
import torch
from torch.export import Dim, export
from torch.func import functional_call, grad, jacrev, stack_module_state, vmap
from torch.library import opcheck

from linmem import LMN
from linmem.models import build_model
from linmem.ops.lmn import lmn_scan, lmn_scan_backward, lmn_scan_backward_ref, lmn_scan_ref
from linmem.ops.paths import use_cpu_kernel
from linmem.ops.toolkit import NONLINEARITIES
from linmem.ops.ulm import ulm_scan, ulm_scan_backward, ulm_scan_ref


def scan_case(steps, batch, hidden, memory, dtype=torch.float64, batch_major=False, seed=0):
    """Arguments of ``lmn_scan`` (requiring gradients), ``x_proj`` stored time- or
    batch-major."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).requires_grad_()

    x = (torch.randn(batch, steps, hidden, generator=g, dtype=dtype).transpose(0, 1)
         if batch_major else torch.randn(steps, batch, hidden, generator=g, dtype=dtype))
    return [x.requires_grad_(), rand(batch, memory), rand(hidden, memory, scale=0.4),
            rand(memory, hidden, scale=0.4), rand(memory, memory, scale=0.4), rand(memory)]


@pytest.mark.parametrize("nonlinearity", NONLINEARITIES)
@pytest.mark.parametrize("batch_major", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_passes_on_the_operators(nonlinearity, batch_major, dtype):
    """Schema, fake tensors (strides included), the autograd registration and AOT dispatch with
    dynamic shapes, for the operator and its backward."""
    args = scan_case(5, 3, 4, 6, dtype, batch_major)
    opcheck(lmn_scan, (*args, nonlinearity))
    # the backward operator is not differentiated (a graph of the gradient takes the
    # differentiable reference instead): checked on tensors that need no gradient
    plain = [a.detach() for a in args]
    hs, ms = lmn_scan(*plain, nonlinearity)
    grads = torch.randn_like(hs), torch.randn_like(ms)
    opcheck(lmn_scan_backward, (*grads, plain[1], hs, ms, *plain[2:5], nonlinearity))
    opcheck(lmn_scan_backward, (None, grads[1], plain[1], hs, ms, *plain[2:5], nonlinearity))


@pytest.mark.parametrize("path", ["kernel", "loop"])
@pytest.mark.parametrize("nonlinearity", NONLINEARITIES)
def test_the_operator_equals_its_references(path, nonlinearity):
    """Forward and every gradient of the operator (the compiled kernel, or the PyTorch loop)
    equal the per-step reference and autograd through it (float64, to 1e-10); the backward
    reference equals autograd through the forward reference."""
    args = scan_case(7, 3, 5, 4, batch_major=True, seed=2)
    with use_cpu_kernel(path == "kernel"):
        hs, ms = lmn_scan(*args, nonlinearity)
        g_hs, g_ms = torch.randn_like(hs), torch.randn_like(ms)
        got = torch.autograd.grad((hs * g_hs).sum() + (ms * g_ms).sum(), args)
    hs_r, ms_r = lmn_scan_ref(*args, nonlinearity)
    expected = torch.autograd.grad((hs_r * g_hs).sum() + (ms_r * g_ms).sum(), args)
    torch.testing.assert_close((hs, ms), (hs_r, ms_r), rtol=1e-10, atol=1e-10)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    ref_grads = lmn_scan_backward_ref(g_hs, g_ms, args[1], hs_r.detach(), ms_r.detach(),
                                      *args[2:5], nonlinearity)
    for a, b in zip(ref_grads, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("nonlinearity", ["tanh", "selu"])
def test_double_backward(nonlinearity):
    """gradcheck and gradgradcheck in float64: with a graph of the gradient asked for, the
    backward is differentiable."""
    args = scan_case(4, 3, 3, 2, seed=3)
    assert torch.autograd.gradcheck(lambda *a: lmn_scan(*a, nonlinearity), args)
    assert torch.autograd.gradgradcheck(lambda *a: lmn_scan(*a, nonlinearity), args)
    lmn = LMN(3, 4, 2, batch_first=True, nonlinearity=nonlinearity).double()
    x = torch.randn(2, 5, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(lambda x: lmn(x)[0], (x,))


def _equal_grads(model, out_a, out_b):
    params = list(model.parameters())
    for a, b in zip(torch.autograd.grad(out_a.sum(), params),
                    torch.autograd.grad(out_b.sum(), params), strict=True):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["lmn-a", "lmn-b", "pret-lmn-a", "pret-lmn-b", "ulm"])
def test_compile_fullgraph_dynamic_without_recompiling(name):
    """torch.compile(model, fullgraph=True, dynamic=True): one graph for every batch and length,
    outputs and gradients equal eager."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = build_model(name, 6, None if name == "ulm" else 5).double()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch, steps in [(3, 9), (5, 13), (2, 4), (4, 30)]:
        x = torch.rand(batch, steps, 88, dtype=torch.float64)
        got, expected = compiled(x), model(x)
        torch.testing.assert_close(got, expected)
        _equal_grads(model, got, expected)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["graph_break"]


def test_compile_with_inductor_trains_like_eager():
    """The default backend (inductor) around the operator: the same loss and gradients."""
    torch._dynamo.reset()
    torch.manual_seed(1)
    model = build_model("lmn-b", 6, 5)
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for batch, steps in [(3, 9), (4, 15)]:
        x = torch.rand(batch, steps, 88)
        got, expected = compiled(x), model(x)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["lmn-b", "pret-lmn-b", "lstm"])
def test_torchscript_is_refused_in_one_line_that_names_what_to_use(name):
    """torch.jit.script (deprecated by PyTorch) fails deep in its compiler on these modules'
    Python; each says instead, from the model down to its recurrent layer, what to use."""
    from linmem import LMNCell, UnrolledNet

    model = build_model(name, 6, 5)
    layer = type(model.core).__name__
    for module, what in ((model, layer), (LMNCell(3, 4, 5), "LMNCell"),
                         (UnrolledNet(3, 4, k=2), "UnrolledNet")):
        with pytest.warns(DeprecationWarning), pytest.raises(RuntimeError, match=(
                f"^{what} does not support TorchScript .*: use torch.compile, "
                "torch.export.export or torch.onnx.export")):
            torch.jit.script(module)


def test_export_saves_loads_and_runs_at_another_length(tmp_path):
    """torch.export with batch and time dynamic: the program holds linmem::lmn_scan, runs,
    saves and loads, and gives eager's outputs at a batch and length it was not exported at."""
    torch.manual_seed(2)
    model = build_model("lmn-b", 6, 5).double()
    x = torch.rand(3, 9, 88, dtype=torch.float64)
    program = export(model, (x,), dynamic_shapes=({0: Dim("batch", min=2),
                                                   1: Dim("time", min=2)},))
    assert "linmem.lmn_scan" in str(program.graph)
    other = torch.rand(4, 17, 88, dtype=torch.float64)
    torch.testing.assert_close(program.module()(other), model(other))
    torch.export.save(program, tmp_path / "lmn.pt2")
    loaded = torch.export.load(tmp_path / "lmn.pt2")
    torch.testing.assert_close(loaded.module()(other), model(other))


def _lmn_b(bound):
    """A float64 LMN-B whose memory, with a ``bound``, lies well outside its ball."""
    model = build_model("lmn-b", 6, 5, memory_bound=bound).double()
    if bound is not None:
        with torch.no_grad():
            model.core.weight_mm_l0.mul_(5)
    return model


@pytest.mark.parametrize("bound", [None, 0.4])
def test_torch_func_grad_vmap_and_jacrev(bound):
    """grad of a loss over the parameters, vmap over a stack of parameter sets (an ensemble)
    and jacrev of the output with respect to the input, each against plain autograd; with a
    memory bound too (its norm's operator has an autograd the transforms cannot take: under them
    the norm is its reference)."""
    torch.manual_seed(3)
    model = _lmn_b(bound)
    x = torch.rand(2, 7, 88, dtype=torch.float64)
    params = {k: v.detach() for k, v in model.named_parameters()}

    def loss(p, x):
        return functional_call(model, p, (x,)).pow(2).mean()

    got = grad(loss)(params, x)
    expected = torch.autograd.grad(loss(dict(model.named_parameters()), x),
                                   list(model.parameters()))
    for a, b in zip(got.values(), expected, strict=True):
        torch.testing.assert_close(a, b)

    models = [_lmn_b(bound) for _ in range(3)]
    stacked, buffers = stack_module_state(models)
    skeleton = _lmn_b(bound).to("meta")
    out = vmap(lambda p, b, x: functional_call(skeleton, (p, b), (x,)),
               in_dims=(0, 0, None))(stacked, buffers, x)
    for i, m in enumerate(models):
        torch.testing.assert_close(out[i], m(x))

    lmn = LMN(3, 4, 2, memory_bound=bound).double()
    if bound is not None:
        with torch.no_grad():
            lmn.weight_mm_l0.mul_(10)
    xs = torch.rand(5, 3, dtype=torch.float64)
    jac = jacrev(lambda x: lmn(x)[0])(xs)
    torch.testing.assert_close(jac, torch.autograd.functional.jacobian(lambda x: lmn(x)[0], xs))
    assert jac.shape == (5, 2, 5, 3)


@pytest.mark.parametrize("name", ["lmn-b", "lmn-a"])
def test_onnx_export_runs_in_onnxruntime_at_another_length(tmp_path, name):
    """torch.onnx.export(dynamo=True): the recurrence becomes one ONNX Scan over time, and
    onnxruntime gives eager's outputs (to 1e-5) at a batch and length other than the
    exported ones."""
    import onnx
    import onnxruntime

    torch.manual_seed(4)
    model = build_model(name, 6, 5)
    program = torch.onnx.export(model, (torch.rand(3, 9, 88),), dynamo=True,
                                dynamic_shapes=({0: Dim("batch", min=2),
                                                 1: Dim("time", min=2)},))
    program.save(tmp_path / "lmn.onnx")
    assert "Scan" in {node.op_type for node in onnx.load(tmp_path / "lmn.onnx").graph.node}
    session = onnxruntime.InferenceSession(tmp_path / "lmn.onnx")
    other = torch.rand(4, 23, 88)
    got = session.run(None, {session.get_inputs()[0].name: other.numpy()})[0]
    with torch.no_grad():
        torch.testing.assert_close(torch.from_numpy(got), model(other), rtol=1e-5, atol=1e-5)


def ulm_case(steps, batch, hidden, k, dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(steps, batch, hidden, generator=g, dtype=dtype).requires_grad_(),
            torch.randn(batch, k * hidden, generator=g, dtype=dtype).requires_grad_(),
            (torch.randn(hidden, k * hidden, generator=g, dtype=dtype) * 0.4).requires_grad_()]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_opcheck_passes_on_the_unrolled_operators(dtype):
    """The unrolled network's recurrence (eq. 10) as registered operators."""
    args = ulm_case(5, 3, 4, 2, dtype)
    opcheck(ulm_scan, (*args, "tanh"))
    plain = [a.detach() for a in args]
    hs, buf = ulm_scan(*plain, "tanh")
    opcheck(ulm_scan_backward, (torch.randn_like(hs), buf, plain[2], "tanh"))
    opcheck(ulm_scan_backward, (None, buf, plain[2], "tanh"))


@pytest.mark.parametrize("path", ["kernel", "loop"])
@pytest.mark.parametrize("nonlinearity", NONLINEARITIES)
def test_the_unrolled_operator_equals_its_reference(path, nonlinearity):
    """States and every gradient of ulm_scan against the per-step reference (float64), and
    gradgradcheck: with a graph of the gradient asked for, its backward is differentiable."""
    args = ulm_case(6, 3, 4, 3, seed=5)
    weights = torch.randn(6, 3, 4, dtype=torch.float64)
    with use_cpu_kernel(path == "kernel"):
        hs = ulm_scan(*args, nonlinearity)[0]
        got = torch.autograd.grad((hs * weights).sum(), args)
    expected_hs = ulm_scan_ref(*args, nonlinearity)
    expected = torch.autograd.grad((expected_hs * weights).sum(), args)
    torch.testing.assert_close(hs, expected_hs, rtol=1e-10, atol=1e-10)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    small = ulm_case(3, 2, 2, 2, seed=6)
    assert torch.autograd.gradgradcheck(lambda *a: ulm_scan(*a, nonlinearity)[0], small)
    from linmem.ops.ulm import ulm_states

    assert torch.autograd.gradgradcheck(lambda *a: ulm_states(*a, nonlinearity), small)
    with use_cpu_kernel(path == "kernel"):
        torch.testing.assert_close(ulm_states(*args, nonlinearity), expected_hs, rtol=1e-10,
                                   atol=1e-10)


def _baseline_cases(dtype=torch.float64, seed=7):
    """``(op, arguments, extra, forward-to-states)`` of the RNN, GRU and LSTM operators."""
    from linmem.ops import rnns

    g = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, dtype=dtype) * scale).requires_grad_()

    steps, batch, hidden = 5, 3, 4
    return {
        "rnn": (rnns.rnn_scan, [rand(steps, batch, hidden), rand(batch, hidden),
                                rand(hidden, hidden, scale=0.4), rand(hidden)], ("tanh",),
                lambda out: (out,), rnns.rnn_scan_ref),
        "gru": (rnns.gru_scan, [rand(steps, batch, 3 * hidden), rand(batch, hidden),
                                rand(3 * hidden, hidden, scale=0.4), rand(3 * hidden)], (),
                lambda out: out[:1], rnns.gru_scan_ref),
        "lstm": (rnns.lstm_scan, [rand(steps, batch, 4 * hidden), rand(batch, hidden),
                                  rand(batch, hidden), rand(4 * hidden, hidden, scale=0.4),
                                  rand(4 * hidden)], (), lambda out: out[:2],
                 rnns.lstm_scan_ref),
    }


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_the_baselines_recurrences_are_registered_operators(name):
    """opcheck of the RNN, GRU and LSTM operators; states and gradients against their
    references on the kernel and the loop (float64); gradgradcheck."""
    from linmem.ops import rnns

    op, args, extra, states, reference = _baseline_cases()[name]
    opcheck(op, (*args, *extra))
    plain = [a.detach() for a in args]  # the backward operators, on what needs no gradient
    out = op(*plain, *extra)
    out = out if isinstance(out, tuple) else (out,)
    grad = torch.randn_like(out[0])
    if name == "rnn":
        opcheck(rnns.rnn_scan_backward, (grad, plain[1], out[0], plain[2], *extra))
    elif name == "gru":
        opcheck(rnns.gru_scan_backward, (grad, plain[1], *out, plain[2]))
    else:
        hs, c_n, cs, tcs, gates = out
        opcheck(rnns.lstm_scan_backward, (grad, torch.randn_like(c_n), plain[1], plain[2], hs,
                                          cs, tcs, gates, plain[3]))
    expected = reference(*args, *extra)
    expected = expected if isinstance(expected, tuple) else (expected,)
    weights = [torch.randn_like(e) for e in expected]
    want = torch.autograd.grad(sum((e * w).sum() for e, w in zip(expected, weights,
                                                                   strict=True)), args)
    for path in (True, False):
        with use_cpu_kernel(path):
            got = states(op(*args, *extra))
            grads = torch.autograd.grad(sum((o * w).sum() for o, w in zip(got, weights,
                                                                            strict=True)), args)
        for a, b in zip((*got, *grads), (*expected, *want), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert torch.autograd.gradgradcheck(lambda *a: states(op(*a, *extra)), args)
    # the eager path (the operator's implementations without its dispatch) likewise
    public = {"rnn": lambda *a: rnns.rnn_recurrence(*a, *extra),
              "gru": rnns.gru_recurrence, "lstm": rnns.lstm_recurrence}[name]
    assert torch.autograd.gradgradcheck(public, args)
    with use_cpu_kernel(True):
        eager = public(*args)
    for a, b in zip(eager if isinstance(eager, tuple) else (eager,), expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["rnn", "gru", "lstm"])
def test_the_baselines_compile_in_one_graph_with_allow_rnn(name):
    """With PyTorch's switch for RNN modules on (torch.nn.LSTM needs it too), a baseline model
    compiles in one graph for every batch and length, equal to eager."""
    torch._dynamo.reset()
    torch.manual_seed(5)
    model = build_model(name, 6, None).double()
    if name == "lstm":
        model.core.min_kernel_hidden = 1  # the fast path at this size too
    # one eager call first: under compile the LSTM takes the path eager mode last found
    # (linmem.nn.rnns._kernel_available), which otherwise depends on the tests run before
    model(torch.rand(1, 2, 88, dtype=torch.float64))
    counters = torch._dynamo.utils.counters
    counters.clear()
    with torch._dynamo.config.patch(allow_rnn=True):
        compiled = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
        for batch, steps in [(3, 9), (5, 13), (2, 4)]:
            x = torch.rand(batch, steps, 88, dtype=torch.float64)
            got, expected = compiled(x), model(x)
            torch.testing.assert_close(got, expected)
            _equal_grads(model, got, expected)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])


def test_torch_func_grad_through_the_baselines_and_the_unrolled_network():
    """torch.func.grad of a loss of the GRU, LSTM and unrolled-network models equals autograd
    (their references run under the transforms)."""
    torch.manual_seed(6)
    x = torch.rand(2, 6, 88, dtype=torch.float64)
    for name in ("gru", "lstm", "rnn", "ulm"):
        model = build_model(name, 5, None).double()
        if name == "lstm":
            model.core.min_kernel_hidden = 1
        params = {k: v.detach() for k, v in model.named_parameters()}

        def loss(p, model=model):
            return functional_call(model, p, (x,)).pow(2).mean()

        got = grad(loss)(params)
        expected = torch.autograd.grad(loss(dict(model.named_parameters())),
                                       list(model.parameters()))
        for a, b in zip(got.values(), expected, strict=True):
            torch.testing.assert_close(a, b)


def test_a_nade_readout_trains_in_one_compiled_graph():
    """An LMN-B with a NADE over the keys: its exact likelihood (what it trains on) and its
    sampled key marginals (forward; the seeded sampling is the operator
    linmem::nade_marginals) each compile in one graph, equal to eager."""
    torch._dynamo.reset()
    torch.manual_seed(8)
    model = build_model("lmn-b-nade", 6, 5, nade_hidden=7).double()
    counters = torch._dynamo.utils.counters
    counters.clear()
    compiled = torch.compile(model.likelihood_logits, fullgraph=True, dynamic=True,
                             backend="aot_eager")
    for batch, steps in [(3, 9), (5, 13)]:
        x = (torch.rand(batch, steps, 88) < 0.1).double()
        y = (torch.rand(batch, steps, 88) < 0.1).double()
        got, expected = compiled(x, y), model.likelihood_logits(x, y)
        torch.testing.assert_close(got, expected)
        _equal_grads(model, got, expected)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    from linmem.nn.nade import nade_marginals

    opcheck(nade_marginals, (torch.rand(4, 5, dtype=torch.float64),
                             torch.rand(4, 3, dtype=torch.float64),
                             torch.randn(5, 3, dtype=torch.float64),
                             torch.randn(3, 5, dtype=torch.float64), 6, 0),
            test_utils=("test_schema", "test_faketensor", "test_aot_dispatch_dynamic"))
    torch._dynamo.reset()
    counters.clear()
    forward = torch.compile(model, fullgraph=True, dynamic=True, backend="aot_eager")
    for batch, steps in [(3, 9), (5, 13)]:
        x = (torch.rand(batch, steps, 88) < 0.1).double()
        torch.testing.assert_close(forward(x), model(x))
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
