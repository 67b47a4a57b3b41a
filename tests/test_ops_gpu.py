"""The fused Triton kernels of the LMN's recurrence (linmem.ops.gpu) against the per-step
reference.

Without a GPU they run on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set by
conftest.py before Triton loads), as in CI; on a machine with a GPU the same tests run them
compiled on CUDA, and the training runs at the end compare the fused path with the loop.
"""

import math

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from linmem.nn.lmn import LMN
from linmem.ops import gpu as ops_gpu
from linmem.ops import paths as ops_paths
from linmem.ops.lmn import lmn_scan_backward_ref, lmn_scan_ref
from linmem.ops.lmn_fills import backward_buffers, scan_buffers

HAS_CUDA = torch.cuda.is_available()
DEVICE = torch.device("cuda" if HAS_CUDA else "cpu")


def test_the_kernels_run_here():
    """Triton is installed (the ``test`` extra) and, without a GPU, interprets: nothing below
    is skipped in CI."""
    assert ops_gpu.available()
    assert HAS_CUDA or ops_gpu.interpreting()


def _problem(steps, batch, hidden, memory, batch_major, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (batch, steps, hidden) if batch_major else (steps, batch, hidden)
    x = torch.randn(*shape, generator=g)
    x = x.transpose(0, 1) if batch_major else x
    args = [x, torch.randn(batch, memory, generator=g),
            torch.randn(hidden, memory, generator=g) * memory ** -0.5,
            torch.randn(memory, hidden, generator=g) * 0.5 * hidden ** -0.5,
            torch.randn(memory, memory, generator=g) * 0.5 * memory ** -0.5,
            torch.randn(memory, generator=g) * 0.1]
    return [a.to(DEVICE) for a in args]


# (T, B, H, M, nonlinearity, batch-major, dL/dh given, dL/dm given): batch 1, 3, 37; sizes 50,
# 100, 250, 500 and some that are no multiple of a block (37, 70); T = 1, 2, 129
CASES = [
    (1, 1, 50, 50, "tanh", False, True, True),
    (2, 3, 100, 250, "relu", True, True, False),       # LMN-A: the loss reads h only
    (2, 37, 500, 70, "selu", False, True, True),
    (2, 1, 250, 500, "tanh", False, False, True),      # LMN-B: the loss reads m only
    (129, 3, 37, 50, "tanh", True, True, True),
    (3, 37, 70, 37, "relu", True, False, True),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "T{}-B{}-H{}-M{}-{}-{}".format(
    *c[:5], "bf" if c[5] else "tf"))
def test_fused_states_and_state_gradients_match_the_reference(case):
    """Forward states and the backward's state gradients ``[dL/da_t, dL/dm_t]`` and ``dL/dm0``
    from one launch each, against the per-step reference, in float32 (products in IEEE
    float32: to a few units of rounding)."""
    steps, batch, hidden, memory, act, batch_major, has_gh, has_gm = case
    x, m0, w_mh, w_hm, w_mm, b_m = _problem(steps, batch, hidden, memory, batch_major)
    hs, ms, layout = scan_buffers(x, memory)
    assert layout == (batch_major and batch > 1)
    ops_gpu.forward(x, m0, w_mh, w_hm, w_mm, b_m, act, hs, ms)
    ref_h, ref_m = lmn_scan_ref(x.double(), m0.double(), w_mh.double(), w_hm.double(),
                                w_mm.double(), b_m.double(), act)
    torch.testing.assert_close(hs.double(), ref_h, rtol=0, atol=2e-5)
    torch.testing.assert_close(ms.double(), ref_m, rtol=0, atol=2e-5)

    g = torch.Generator().manual_seed(1)
    grad_hs = torch.randn(hs.shape, generator=g).to(DEVICE) if has_gh else None
    grad_ms = torch.randn(ms.shape, generator=g).to(DEVICE) if has_gm else None
    grads, grad_m0, _ = backward_buffers(hs, memory)
    ops_gpu.backward_states(grad_hs, grad_ms, hs, w_mh, w_hm, w_mm, act, grads, grad_m0)
    ref = lmn_scan_backward_ref(*(None if t is None else t.double() for t in (grad_hs, grad_ms)),
                                m0.double(), hs.double(), ms.double(), w_mh.double(),
                                w_hm.double(), w_mm.double(), act)
    torch.testing.assert_close(grads[..., :hidden].double(), ref[0], rtol=0, atol=5e-5)
    torch.testing.assert_close(grad_m0.double(), ref[1], rtol=0, atol=5e-5)
    if steps > 1:  # dL/dm_t of every step but the last came from the kernel
        dm = grads[:-1, :, hidden:].double()
        assert dm.abs().max() > 0.1


@pytest.mark.parametrize("tiles", ["4,32,32,0", "16,32,32,1", "8,64,16,0", "1,64,128,0,8"])
def test_both_forms_of_the_product_give_the_same_states(tiles, monkeypatch):
    """A few rows summed as products or padded into ``tl.dot``'s tile, and other tile sizes
    (``LINMEM_GPU_TILES``), give the reference's states and gradients."""
    monkeypatch.setenv("LINMEM_GPU_TILES", tiles)
    x, m0, w_mh, w_hm, w_mm, b_m = _problem(3, 5, 40, 70, True)
    hs, ms, _ = scan_buffers(x, 70)
    ops_gpu.forward(x, m0, w_mh, w_hm, w_mm, b_m, "selu", hs, ms)
    ref_h, ref_m = lmn_scan_ref(x, m0, w_mh, w_hm, w_mm, b_m, "selu")
    torch.testing.assert_close(hs, ref_h, rtol=0, atol=2e-5)
    torch.testing.assert_close(ms, ref_m, rtol=0, atol=2e-5)
    grads, grad_m0, _ = backward_buffers(hs, 70)
    ops_gpu.backward_states(None, torch.ones_like(ms), hs, w_mh, w_hm, w_mm, "selu", grads,
                            grad_m0)
    ref = lmn_scan_backward_ref(None, torch.ones_like(ms), m0, hs, ms, w_mh, w_hm, w_mm, "selu")
    torch.testing.assert_close(grads[..., :40], ref[0], rtol=0, atol=5e-5)
    torch.testing.assert_close(grad_m0, ref[1], rtol=0, atol=5e-5)


@pytest.mark.parametrize("output", ["memory", "hidden"])
def test_the_layer_through_the_fused_path_gives_the_loops_numbers(output):
    """``LMN`` (two layers, batch-first, packed sequences of unequal lengths, an initial state)
    with the fused kernels against the same layer through the PyTorch loop: outputs, final
    states and every parameter's gradient."""
    torch.manual_seed(0)
    layer = LMN(7, 37, 50, num_layers=2, output=output, batch_first=True).to(DEVICE)
    layer.eval()  # the certified norm's state held, so that the two runs are comparable
    x = torch.randn(3, 9, 7, device=DEVICE)
    lengths = torch.tensor([9, 4, 6])
    m0 = torch.randn(2, 3, 50, device=DEVICE)

    def run(fused: bool):
        layer.zero_grad()
        with ops_paths.use_gpu_kernel(fused):
            packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
            out, (h_n, m_n) = layer(packed, m0)
            out, _ = pad_packed_sequence(out, batch_first=True)
            (out.square().sum() + m_n.sum() + h_n.sum()).backward()
        return [out, h_n, m_n, *(p.grad.clone() for p in layer.parameters())]

    fused, loop = run(True), run(False)
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


def test_what_the_fused_kernels_do_not_take_runs_the_loop(monkeypatch):
    """float64 runs the loop on the GPU; ``LINMEM_GPU_KERNEL=0`` turns the kernels off (and
    asking for them then says why); the loop stays available inside ``use_gpu_kernel(False)``."""
    x = torch.zeros(2, 3, 5, device=DEVICE)
    if HAS_CUDA:
        assert ops_paths.gpu_kernel_path(x.double(), 4) == "loop"
    with ops_paths.use_gpu_kernel(False):
        assert ops_paths.gpu_kernel_path(x, 4) == "loop"
    with ops_paths.use_gpu_kernel(True):
        assert ops_paths.gpu_kernel_path(x, 4) == ops_paths.FUSED
    monkeypatch.setenv(ops_gpu.GPU_KERNEL_ENV, "0")
    assert not ops_gpu.available()
    assert ops_paths.gpu_kernel_path(x, 4) == "loop"
    with pytest.raises(RuntimeError, match="LINMEM_GPU_KERNEL"):
        with ops_paths.use_gpu_kernel(True):
            pass


def test_the_kernels_refuse_what_they_cannot_compute():
    x, m0, w_mh, w_hm, w_mm, b_m = _problem(2, 1, 8, 8, False)
    hs, ms, _ = scan_buffers(x.double(), 8)
    with pytest.raises(TypeError, match="float32"):
        ops_gpu.forward(x.double(), m0.double(), w_mh, w_hm, w_mm, b_m, "tanh", hs, ms)


def test_choices_are_recorded_and_read_back(tmp_path, monkeypatch):
    """The measured choices of a GPU, keyed by size class, survive the process: written beside
    Triton's cache and read back for the same Triton version only."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    key = ("Some GPU", 8, 256, 256)
    record = {"choice": "fused", "seconds": {"fused": 0.001, "loop": 0.004}}
    ops_gpu.write_choices("Some GPU", {key: record, ("Other GPU", 8, 256, 256): record})
    back = ops_gpu.read_choices("Some GPU")
    assert list(back) == [key] and back[key]["choice"] == "fused"
    assert ops_gpu.read_choices("Other GPU") == {}
    classes = [ops_paths._size_class(n) for n in (1, 2, 3, 50, 64, 65, 250)]
    assert classes == [1, 2, 4, 64, 64, 128, 256]


def test_tiles_give_a_program_a_row_while_the_programs_fit_the_gpu():
    """The tilings measured fastest on an H100 (results/cuda/tiles.txt): a row per program up
    to one program per multiprocessor, then 2 or 4 rows summed, then tl.dot's 16 and 32."""
    rows = {b: (ops_gpu.tiles(b, 250, 250)["BLOCK_B"], ops_gpu.tiles(b, 250, 250)["USE_DOT"])
            for b in (1, 4, 132, 133, 264, 265, 528, 529, 2112, 2113)}
    assert rows == {1: (1, False), 4: (1, False), 132: (1, False), 133: (2, False),
                    264: (2, False), 265: (4, False), 528: (4, False), 529: (16, True),
                    2112: (16, True), 2113: (32, True)}
    assert ops_gpu.tiles(100, 250, 250, sms=50)["BLOCK_B"] == 2
    assert ops_gpu.tiles(4, 50, 50)["BLOCK_N"] == 32 and ops_gpu.tiles(4, 50, 100)["BLOCK_N"] == 64
    assert ops_gpu.tiles(4, 250, 250)["num_warps"] == 4


def test_tiles_forced_with_and_without_warps(monkeypatch):
    monkeypatch.setenv("LINMEM_GPU_TILES", "2,64,128,0,8")
    assert ops_gpu.tiles(4, 250, 250) == {"BLOCK_B": 2, "BLOCK_N": 64, "BLOCK_K": 128,
                                          "USE_DOT": False, "num_warps": 8}
    monkeypatch.setenv("LINMEM_GPU_TILES", "16,64,64,1")
    assert ops_gpu.tiles(4, 250, 250)["num_warps"] == 4


def test_the_paths_are_timed_in_float32_whatever_the_default_dtype():
    """The fused kernels take float32: the problem the paths are timed on stays float32 where a
    program set float64 as the default (a first use on a GPU once failed so)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        problem = ops_paths._path_problem(3, 2, 5, 4)
    finally:
        torch.set_default_dtype(previous)
    assert [t.dtype for t in problem] == [torch.float32] * 6
    assert not any(t.requires_grad for t in problem)  # timed under no_grad, as fills


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_the_first_use_on_a_gpu_measures_the_paths():
    record = ops_paths.measure_gpu_paths(DEVICE, 4, 250, 250, steps=16, repeats=2)
    assert record["choice"] in (ops_paths.FUSED, "loop")
    assert all(math.isfinite(s) and s > 0 for s in record["seconds"].values())


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("model", ["lmn-b", "lmn-a"])
def test_a_training_run_on_the_fused_path_follows_the_loops(tmp_path, small, model):
    """Whole (short) training runs on CUDA through the fused kernels and through the loop: the
    same losses and accuracies within float32 rounding."""
    from linmem.training import recipes
    from linmem.training.config import TrainConfig

    runs = {}
    for fused in (True, False):
        config = TrainConfig(model=model, hidden=24, memory=20, batch_size=6, epochs=3,
                             patience=10, seed=3, device="cuda")
        with ops_paths.use_gpu_kernel(fused):
            runs[fused] = recipes.train(config, tmp_path / str(fused), progress=False, data=small)
    for key in ("valid_nll", "test_nll"):
        assert runs[True][key] == pytest.approx(runs[False][key], rel=1e-4), key
    for key in ("valid_acc", "test_acc"):
        assert runs[True][key] == pytest.approx(runs[False][key], abs=0.2), key
    assert runs[True]["recurrence_path"] == "fused (cuda)"
    assert runs[False]["recurrence_path"] == "loop (cuda)"


_COMPILE = r"""
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from linmem.ops import triton_lmn as kernels
from linmem.ops.gpu import tiles

out = []
for arch in (80, 90):
    for batch in (1, 300, 600, 3000):  # one row, four, tl.dot's 16 and 32 on 132 SMs
        for name in ("forward", "backward"):
            fn = getattr(kernels, name)
            form = tiles(batch, 250, 250)
            warps = form.pop("num_warps")
            consts = {"ACT": 0, "PRECISION": "ieee", **form}
            if name == "backward":
                consts.update(HAS_GH=True, HAS_GM=False)
            signature = {a: "constexpr" if a in consts else "*fp32" if a.endswith("_ptr")
                         else "i32" for a in fn.arg_names}
            source = ASTSource(fn=fn, signature=signature, constexprs={
                (fn.arg_names.index(k),): v for k, v in consts.items()})
            ptx = triton.compile(source, target=GPUTarget("cuda", arch, 32),
                                 options={"num_warps": warps}).asm["ptx"]
            out.append({"arch": arch, "batch": batch, "kernel": name,
                        "nc_loads": len(re.findall(r"ld\.global\.nc", ptx)),
                        "barriers": len(re.findall(r"bar\.sync|barrier\.sync", ptx)),
                        "local": len(re.findall(r"\.local", ptx))})
json.dump(out, sys.stdout)
"""


def test_the_kernels_compile_for_the_gpus_we_target():
    """Each form of both kernels compiles for an A100 (sm_80) and an H100 (sm_90) on this
    machine, without a GPU (Triton ships its compiler): what the interpreter cannot check
    (types, the barriers, loads through the coherent cache: the state written one phase before
    is read back, so no ``ld.global.nc``; no spills to local memory)."""
    import json
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_DEFAULT_FP_FUSION": "1"}
    done = subprocess.run([sys.executable, "-c", _COMPILE], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    forms = json.loads(done.stdout)
    assert len(forms) == 16
    for form in forms:
        assert form["nc_loads"] == 0 and form["barriers"] >= 2 and form["local"] == 0, form


def test_a_compiled_model_runs_the_fused_kernels(monkeypatch):
    """``torch.compile(fullgraph=True)`` sees the operator whatever path runs inside it: the
    compiled LMN-B on the fused kernels (both launched, counted) gives the eager loop's outputs
    and gradients."""
    from linmem.models import build_model

    launched = []
    for name in ("forward", "backward_states"):
        real = getattr(ops_gpu, name)
        monkeypatch.setattr(ops_gpu, name, lambda *a, _f=real, _n=name: (launched.append(_n),
                                                                          _f(*a))[1])

    torch.manual_seed(0)
    model = build_model("lmn-b", 20, 24).to(DEVICE)
    x = torch.rand(3, 7, 88, device=DEVICE)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with ops_paths.use_gpu_kernel(True):
        out = compiled(x)
        out.sum().backward()
    assert launched == ["forward", "backward_states"]
    fused = [out.detach(), *(p.grad.clone() for p in model.parameters())]
    model.zero_grad()
    with ops_paths.use_gpu_kernel(False):
        out = model(x)
        out.sum().backward()
    loop = [out.detach(), *(p.grad.clone() for p in model.parameters())]
    for a, b in zip(fused, loop, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5)


def test_the_kernels_are_triton_programs():
    """:mod:`linmem.ops.triton_lmn` holds the forward and backward programs :mod:`linmem.ops.gpu`
    launches (its tests above run them under the interpreter)."""
    triton = pytest.importorskip("triton")
    from linmem.ops import triton_lmn

    assert triton_lmn.__all__ == ["backward", "forward"]
    from triton.runtime.interpreter import InterpretedFunction  # under TRITON_INTERPRET=1

    for kernel in (triton_lmn.forward, triton_lmn.backward):
        assert isinstance(kernel, triton.runtime.JITFunction | InterpretedFunction)
