"""The loop bound (linmem.ops.loop_bound, ``LMN(loop_bound=...)``): the memory loop's gain
``||W^mm|| + L ||W^hm|| ||W^mh||`` held to the bound by the certified norms (checked against
float64 SVDs and the exact-norm reference), gradients against finite differences, the layer the
plain one with the scaled matrices, its buffers, compile and export; and no default LMN (every
activation, every model ``linmem train`` builds) whose memory can overflow over 20,000 steps."""

import pytest
import torch
from torch.export import Dim, export

from linmem import LMN, LMNCell
from linmem.nn.diagnostics import memory_loop_gains
from linmem.ops.bound import DEFAULT_MEMORY_BOUND, memory_norm_bound
from linmem.ops.certificates import SLACK
from linmem.ops.loop_bound import (
    LIPSCHITZ,
    bounded_loop,
    bounded_loop_ref,
    check_loop_bound,
    loop_norm_bound,
)
from linmem.registry import get_spec, model_names
from linmem.training.config import TrainConfig
from linmem.training.evaluation import model_of


def norm(w) -> float:
    return float(torch.linalg.matrix_norm(w.detach().double(), 2))


def gain(w_mm, w_hm, w_mh, nonlinearity) -> float:
    """The loop's gain of the matrices a layer runs with, from float64 SVDs."""
    return norm(w_mm) + LIPSCHITZ[nonlinearity] * norm(w_hm) * norm(w_mh)


def test_which_layers_bound_their_loop():
    """By default the layers whose activation does not saturate (relu, selu) bound their loop
    under a memory bound; tanh needs only the memory bound; a loop bound without a memory bound
    is refused in one line, as is a loop bound for a model without a memory."""
    assert check_loop_bound(None, "selu", 0.99) and check_loop_bound(None, "relu", 0.99)
    assert not check_loop_bound(None, "tanh", 0.99) and not check_loop_bound(None, "selu", None)
    assert check_loop_bound(True, "tanh", 0.5) and not check_loop_bound(False, "selu", 0.5)
    with pytest.raises(ValueError, match="needs a memory_bound"):
        LMN(4, 5, 6, nonlinearity="selu", memory_bound=None, loop_bound=True)
    with pytest.raises(ValueError, match="loop_bound must be True, False or None"):
        LMNCell(4, 5, 6, loop_bound="yes")
    with pytest.raises(ValueError, match="lstm has no linear memory: loop_bound"):
        TrainConfig(data="jsb", model="lstm", loop_bound=True)
    lmn = LMN(4, 5, 6, nonlinearity="selu")
    assert lmn.loop_bound and "loop_bound=True" in repr(lmn)
    assert lmn.bound_hm_vector_l0.shape == (5,) and lmn.bound_mh_anchor_l0.shape == (5, 6)
    assert not LMN(4, 5, 6).loop_bound and not hasattr(LMN(4, 5, 6), "bound_hm_vector_l0")
    # the configuration records what the layer does: the default resolved by the activation
    assert TrainConfig(data="jsb", model="pret-lmn-b").loop_bound is True
    assert TrainConfig(data="jsb", model="lmn-b").loop_bound is False
    assert TrainConfig.from_dict({"data": "jsb", "model": "pret-lmn-b", "protocol": "paper",
                                  "memory_bound": 0.99}).loop_bound is False  # an older record


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("nonlinearity", ["relu", "selu"])
def test_the_gain_is_held_to_the_bound_and_equals_the_exact_references(dtype, nonlinearity):
    """Outside the bound the scaled matrices' gain (float64 SVDs) is at most r and at most the
    certificate's slack below it, and equals the exact-norm reference's; inside, the matrices
    are the parameters themselves."""
    torch.manual_seed(1)
    for trial in range(20):
        m, h = (7, 5) if trial % 2 else (30, 45)
        scale = 10.0 ** torch.empty(()).uniform_(-1, 1).item()
        w_mm, w_hm, w_mh = (scale * torch.randn(*shape, dtype=dtype) / shape[1] ** 0.5
                            for shape in ((m, m), (m, h), (h, m)))
        if trial % 5 == 0:  # a rank-deficient W^hm, a clustered W^mm
            w_hm[:, 1:] = w_hm[:, :1]
            w_mm = scale * torch.eye(m, dtype=dtype)
        a, b = bounded_loop(w_mm, w_hm, w_mh, 0.9, nonlinearity)
        ra, rb = bounded_loop_ref(w_mm, w_hm, w_mh, 0.9, nonlinearity)
        g = gain(a, b, w_mh, nonlinearity)
        unit = torch.finfo(dtype).eps
        assert g <= 0.9 * (1 + 8 * unit), (trial, g)
        if gain(w_mm, w_hm, w_mh, nonlinearity) > 0.9:
            assert g >= 0.9 / (1 + 3 * SLACK + 100 * unit) ** 2, (trial, g)
            torch.testing.assert_close(a, ra, rtol=3 * SLACK, atol=0)
            torch.testing.assert_close(b, rb, rtol=3 * SLACK, atol=0)
        else:
            assert torch.equal(a, w_mm) and torch.equal(b, w_hm)


@pytest.mark.parametrize("bound", [0.5, 100.0])  # active (scaled) and inactive (identity)
def test_gradients_match_finite_differences(bound):
    torch.manual_seed(3)
    weights = [torch.randn(*s, dtype=torch.float64, requires_grad=True)
               for s in ((6, 6), (6, 4), (4, 6))]
    assert torch.autograd.gradcheck(lambda *w: bounded_loop(*w, bound, "selu"), weights)
    assert torch.autograd.gradgradcheck(lambda *w: bounded_loop(*w, bound, "selu"), weights)
    # the layer's gradients through it: tests/test_bound.py's gradcheck, with selu


def test_the_gradient_is_the_exact_references_to_the_certificates_tolerance():
    """Where the top singular values stand apart (the certificate is the exact norm to about
    1e-7), the node's hand-written gradient equals autograd's through the exact reference."""
    torch.manual_seed(4)
    weights = []
    for shape in ((20, 20), (20, 30), (30, 20)):
        w = torch.randn(*shape, dtype=torch.float64) / 10
        w[0, 0] = 5.0  # a separated top singular value
        weights.append(w.requires_grad_())
    grads = [torch.randn(20, 20, dtype=torch.float64), torch.randn(20, 30, dtype=torch.float64)]
    got = torch.autograd.grad(bounded_loop(*weights, 0.9, "relu"), weights, grads)
    expected = torch.autograd.grad(bounded_loop_ref(*weights, 0.9, "relu"), weights, grads)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-6, atol=1e-9)


def test_a_loop_bounded_layer_equals_a_plain_one_with_the_scaled_matrices():
    """The loop bound changes W^mm and W^hm and nothing else: outputs and states equal the
    plain layer's with those set to the scaled matrices, and LMNCell's step equals LMN's."""
    torch.manual_seed(5)
    bounded = LMN(5, 6, 7, nonlinearity="relu", memory_bound=0.3, batch_first=True).double()
    with torch.no_grad():
        bounded.weight_hm_l0.mul_(4)
    plain = LMN(5, 6, 7, nonlinearity="relu", memory_bound=None, batch_first=True).double()
    w_mm, w_hm = bounded.recurrent_weights(0)
    assert torch.equal(bounded.memory_weight(0), w_mm)
    state = {k: v for k, v in bounded.state_dict().items() if not k.startswith("bound_")}
    plain.load_state_dict({**state, "weight_mm_l0": w_mm, "weight_hm_l0": w_hm})
    x = torch.rand(3, 11, 5, dtype=torch.float64)
    (a, (ha, ma)), (b, (hb, mb)) = bounded(x), plain(x)
    torch.testing.assert_close(a, b)
    torch.testing.assert_close(ha, hb)
    torch.testing.assert_close(ma, mb)
    assert gain(w_mm, w_hm, bounded.weight_mh_l0, "relu") <= 0.3 * (1 + 1e-12)
    cell = LMNCell(5, 6, 7, nonlinearity="relu", memory_bound=0.3).double()
    cell.load_state_dict({k.removesuffix("_l0"): p for k, p in bounded.state_dict().items()})
    _, m1 = cell(x[:, 0])
    torch.testing.assert_close(m1, bounded(x[:, :1])[0][:, 0])
    assert "loop_bound=True" in repr(cell)


def test_the_buffers_move_in_training_only_and_older_state_dicts_load():
    torch.manual_seed(6)
    lmn = LMN(4, 5, 6, nonlinearity="selu")
    x = torch.rand(2, 7, 4)
    lmn.eval()
    lmn(x)
    assert all(float(v.abs().sum()) == 0 for k, v in lmn.state_dict().items()
               if k.startswith("bound_"))
    lmn.train()
    lmn(x)
    for infix in ("", "hm_", "mh_"):
        vector = getattr(lmn, f"bound_{infix}vector_l0")
        assert float(vector.norm()) == pytest.approx(1, rel=1e-5)
    # a state dict of a layer without the loop bound (before it, or loop_bound=False) loads:
    # the loop's buffers start cold; the outputs are the loop-bounded layer's
    older = LMN(4, 5, 6, nonlinearity="selu", loop_bound=False)
    fresh = LMN(4, 5, 6, nonlinearity="selu")
    fresh.load_state_dict(older.state_dict())
    assert float(fresh.bound_hm_vector_l0.abs().sum()) == 0
    older.load_state_dict(lmn.state_dict())  # and the other way: the extra buffers dropped
    assert torch.equal(older.weight_mm_l0, lmn.weight_mm_l0)


def test_compile_and_export_with_the_loop_bound(tmp_path):
    """torch.compile (one graph), torch.export and ONNX give eager's outputs with an active
    loop bound; the meta device runs the operator."""
    import onnxruntime

    torch._dynamo.reset()
    torch.manual_seed(7)
    lmn = LMN(6, 5, 4, nonlinearity="selu", memory_bound=0.4, batch_first=True).eval()
    with torch.no_grad():  # each top singular value apart: the certified norms are Temple's,
        for name in ("weight_mm_l0", "weight_hm_l0", "weight_mh_l0"):  # exact to about 1e-7
            getattr(lmn, name)[0, 0] = 3.0
    x = torch.rand(3, 9, 6)
    with torch.no_grad():
        expected = lmn(x)[0]
    compiled = torch.compile(lmn, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(x)[0], expected)
    shapes = ({0: Dim("batch", min=2), 1: Dim("time", min=2)},)
    program = export(lmn, (x,), dynamic_shapes=shapes)
    torch.testing.assert_close(program.module()(x)[0], expected)
    onnx_program = torch.onnx.export(lmn, (x,), dynamo=True, dynamic_shapes=shapes)
    onnx_program.save(tmp_path / "loop.onnx")
    session = onnxruntime.InferenceSession(tmp_path / "loop.onnx")
    got = session.run(None, {session.get_inputs()[0].name: x.numpy()})[0]
    torch.testing.assert_close(torch.from_numpy(got), expected, rtol=1e-5, atol=1e-5)
    with torch.device("meta"):
        meta = LMN(6, 5, 4, nonlinearity="relu", batch_first=True)
    assert meta(torch.empty(3, 9, 6, device="meta"))[0].shape == (3, 9, 4)


def test_without_the_loop_bound_a_selu_memory_overflows_and_with_it_stays_bounded():
    """The memory bound alone needs a bounded activation: with selu the loop m -> W^hm selu(W^mh
    m) has gain 2 x 1.5 x 1.05 > 1 here and the memory overflows; the default loop bound keeps
    the same weights within loop_norm_bound."""
    def layer(loop_bound):
        lmn = LMN(88, 20, 30, nonlinearity="selu", memory_bound=0.99, loop_bound=loop_bound)
        with torch.no_grad():
            for p in lmn.parameters():
                p.zero_()
            lmn.weight_mh_l0[:, :20].copy_(2 * torch.eye(20))
            lmn.weight_hm_l0[:20].copy_(1.5 * torch.eye(20))
            lmn.bias_h_l0.fill_(1.0)
        return lmn
    x = torch.rand(2000, 1, 88)
    with torch.no_grad():
        free, _ = layer(False)(x)
        bounded_layer = layer(None)
        bounded, _ = bounded_layer(x)
    assert not torch.isfinite(free).all()
    w_mm, w_hm = bounded_layer.recurrent_weights(0)
    limit = loop_norm_bound(w_mm, w_hm, bounded_layer.weight_mh_l0, None, 20 ** 0.5, 0.99,
                            "selu")
    assert torch.isfinite(bounded).all()
    assert float(bounded.norm(dim=-1).max()) <= limit


@torch.no_grad()
def _memory_limit(lmn: LMN, x: torch.Tensor) -> float:
    """The closed-form bound of ``||m_t||`` the layer's default guarantees on ``x`` ``(T, 1,
    K)``: tanh's (memory bound) or the loop's (relu, selu; the drive from the inputs)."""
    if not lmn.loop_bound:
        return memory_norm_bound(lmn.weight_hm_l0, lmn.bias_m_l0, lmn.memory_bound)
    w_mm, w_hm = lmn.recurrent_weights(0)
    drive = float(torch.nn.functional.linear(x[:, 0].double(), lmn.weight_xh_l0.double(),
                                             lmn.bias_h_l0.double()).norm(dim=-1).max())
    return loop_norm_bound(w_mm, w_hm, lmn.weight_mh_l0, lmn.bias_m_l0, drive,
                           lmn.memory_bound, lmn.nonlinearity)


@pytest.mark.parametrize("nonlinearity", ["tanh", "relu", "selu"])
def test_20000_steps_with_every_parameter_scaled_by_10_stay_finite_and_bounded(nonlinearity):
    """Under the default (``memory_bound=0.99``, ``loop_bound=None``) every activation's memory
    stays finite and within its stated bound, the parameters 10x their initial scale."""
    torch.manual_seed(8)
    lmn = LMN(88, 20, 30, nonlinearity=nonlinearity)
    assert lmn.memory_bound == DEFAULT_MEMORY_BOUND
    with torch.no_grad():
        for p in lmn.parameters():
            p.uniform_(-1, 1).mul_(10 / 20 ** 0.5)
    x = (torch.rand(20000, 1, 88) < 0.1).float()
    with torch.no_grad():
        ms, _ = lmn(x)
    assert torch.isfinite(ms).all()
    limit = _memory_limit(lmn, x)
    norms = ms.norm(dim=-1)
    assert float(norms.max()) <= limit * (1 + 1e-5)
    assert float(norms.max()) > 1e-3 * limit  # the bound is not vacuous
    w_mm, w_hm = lmn.recurrent_weights(0)
    if lmn.loop_bound:
        assert gain(w_mm, w_hm, lmn.weight_mh_l0, nonlinearity) <= 0.99 * (1 + 1e-6)
        gains = memory_loop_gains(lmn.state_dict(), nonlinearity, 0.99, loop_bound=True)
        assert max(gains) <= 0.99 * (1 + 1e-6)


@pytest.mark.parametrize("name", [m for m in model_names() if get_spec(m).has_memory])
def test_no_default_lmn_model_can_overflow(name):
    """Every LMN model as ``linmem train --model NAME`` builds it by default (its activation, its
    bound): 20,000 steps with every parameter of its core 10x its scale stay finite and within
    the default's stated bound."""
    torch.manual_seed(9)
    config = TrainConfig(data="jsb", model=name, hidden=20, memory=30)
    core = model_of(config).core
    assert core.memory_bound == DEFAULT_MEMORY_BOUND
    assert core.loop_bound == (core.nonlinearity != "tanh")
    with torch.no_grad():
        for p in core.parameters():
            p.uniform_(-1, 1).mul_(10 / 20 ** 0.5)
    x = (torch.rand(20000, 1, 88) < 0.1).float()
    reader = LMN(88, 20, 30, nonlinearity=core.nonlinearity)  # the memory, whatever the output
    reader.load_state_dict(core.state_dict())
    with torch.no_grad():
        ms, _ = reader(x)
    assert torch.isfinite(ms).all()
    assert float(ms.norm(dim=-1).max()) <= _memory_limit(reader, x) * (1 + 1e-5)


def _candidate_record(dataset, name, seed, acc):
    """A seed's record of the loop choice's candidate ``name`` (None: a seed with no score)."""
    act, loop, bound = {"selu-loop": ("selu", True, 0.99), "tanh": ("tanh", False, 0.99),
                        "tanh-r1": ("tanh", False, 1.0), "selu": ("selu", False, 0.99)}[name]
    r = {"run": f"{dataset}-{name}-s{seed}", "dataset": dataset, "model": "pret-lmn-b",
         "nonlinearity": act, "loop_bound": loop, "memory_bound": bound, "hidden": 250,
         "memory": 250, "weight_decay": 0.0, "seed": seed}
    if acc is None:
        return {**r, "diverged": "the loss became NaN"}
    return {**r, "valid_acc_frame": acc}


def test_the_loop_choice_applies_its_rule_on_validation():
    """linmem.experiments.loop_choice against the rule worked by hand: a seed with no score is 0,
    a candidate's score is the mean of its data sets' seed means, SELU stays only with a lead
    above 0.5, r = 1 only with a lead above 0.5 over the chosen one; undecided below 3 seeds;
    the SELU seeds without the loop bound are not a candidate."""
    from linmem.experiments.loop_choice import loop_choice, loop_choice_markdown
    from linmem.experiments.seed_groups import seed_groups

    def decide(accs):
        return loop_choice(seed_groups([_candidate_record(d, name, s + 1, acc)
                                        for (d, name), values in accs.items()
                                        for s, acc in enumerate(values)]))

    accs = {("jsb", "selu-loop"): [33.0, 33.0, 33.0], ("piano", "selu-loop"): [28.0, 28.0, None],
            ("jsb", "tanh"): [32.0, 32.5, 33.0], ("piano", "tanh"): [27.0, 27.0, 27.0],
            ("jsb", "tanh-r1"): [32.0, 32.0, 32.0], ("piano", "tanh-r1"): [28.0, 28.0, 28.0],
            ("jsb", "selu"): [40.0, 40.0, 40.0], ("piano", "selu"): [40.0, 40.0, 40.0]}
    choice = decide(accs)
    # selu-loop: (33 + 56/3) / 2 = 25.83; tanh: (32.5 + 27) / 2 = 29.75: tanh, by 3.92
    assert choice["scores"]["selu-loop"] == pytest.approx((33 + 56 / 3) / 2)
    assert choice["scores"]["tanh"] == pytest.approx(29.75)
    assert choice["activation"] == "tanh" and choice["bound"] == 0.99  # r1: 30 - 29.75 = 0.25
    assert "activation tanh, its bound 0.99" in loop_choice_markdown(choice)
    accs[("piano", "selu-loop")] = [28.0, 28.0, 28.0]  # selu-loop 30.5: leads tanh by 0.75
    choice = decide(accs)
    assert choice["activation"] == "selu" and choice["bound"] == 0.99  # r1 trails 30.5
    accs[("piano", "tanh-r1")] = [30.0, 30.0, 30.0]    # tanh-r1 31.0: leads by 0.5, not more
    assert decide(accs)["bound"] == 0.99
    accs[("piano", "tanh-r1")] = [30.2, 30.2, 30.2]    # 31.1: leads by 0.6
    assert decide(accs)["bound"] == 1.0
    del accs[("jsb", "tanh")][2]
    choice = decide(accs)
    assert choice["activation"] == "undecided" and "tanh on JSB Chorales" in choice["reason"]
