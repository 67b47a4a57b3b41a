"""What the recurrences' operators share (:mod:`linmem.ops.lmn`, :mod:`linmem.ops.ulm`,
:mod:`linmem.ops.rnns`): the activations and their slopes, the layout of the step buffers
(time- or batch-major, as the input came), the large products over all steps that turn state
gradients into weight gradients, and the eager calls of an operator without its dispatch."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "KERNEL_CODES",
    "NONLINEARITIES",
    "SELU_ALPHA",
    "SELU_SCALE",
    "activate",
    "activation_grad",
    "by_device",
    "check_nonlinearity",
    "eager_function",
    "flat",
    "is_batch_major",
    "lagged_product",
    "new_steps",
    "rows",
    "through_reference",
]


NONLINEARITIES = ("tanh", "relu", "selu")


def check_nonlinearity(name: str) -> None:
    """A ``ValueError`` naming the choices unless ``name`` is one of :data:`NONLINEARITIES`."""
    if name not in NONLINEARITIES:
        raise ValueError(f"nonlinearity must be one of {list(NONLINEARITIES)}, got {name!r}")


SELU_SCALE, SELU_ALPHA = 1.0507009873554804934193349852946, 1.6732632423543772848170429916717


KERNEL_CODES = {"tanh": 0, "relu": 1, "selu": 2}  # csrc/lmn_kernel_api.h's Nonlinearity


def rows(t: Tensor | None) -> Tensor | None:
    """``t`` with a contiguous last dimension (the kernel's only layout requirement)."""
    return t if t is None or t.stride(-1) == 1 else t.contiguous()


def is_batch_major(steps: Tensor) -> bool:
    """Whether a ``(T, B, n)`` tensor is a view of ``(B, T, n)`` memory (``batch_first``)."""
    return steps.shape[1] > 1 and steps.transpose(0, 1).is_contiguous()


def new_steps(like: Tensor, width: int, batch_major: bool) -> Tensor:
    """An uninitialised ``(T, B, width)`` buffer, stored ``(B, T, width)`` when ``batch_major``."""
    steps, batch = like.shape[:2]
    if batch_major:
        return like.new_empty(batch, steps, width).transpose(0, 1)
    return like.new_empty(steps, batch, width)


def flat(steps: Tensor, batch_major: bool) -> Tensor:
    """``(T, B, n)`` -> ``(T * B, n)`` in memory order, a view for buffers of :func:`new_steps`."""
    return (steps.transpose(0, 1) if batch_major else steps).reshape(-1, steps.shape[2])


def lagged_product(g: Tensor, ms: Tensor, m0: Tensor, batch_major: bool) -> Tensor:
    """``sum_t g_t^T m_{t-1}`` with ``m_{-1} = m0``: large products over all steps at once.

    In memory order the row before ``(t, b)`` is ``(t - 1, b)`` for time-major buffers (shift by
    ``B`` rows); for batch-major ones it is ``(t - 1, b)`` except at ``t = 0``, where it is the
    last step of sequence ``b - 1``: those ``B - 1`` pairs are subtracted again.
    """
    steps, batch = g.shape[:2]
    out = g[0].t() @ m0
    if steps == 1:
        return out
    gf, mf = flat(g, batch_major), flat(ms, batch_major)
    if batch_major:
        out += gf[1:].t() @ mf[:-1]
        out -= g[0, 1:].t() @ ms[-1, :-1]
    else:
        out += gf[batch:].t() @ mf[:-batch]
    return out


def activation_grad(h: Tensor, nonlinearity: str) -> Tensor:
    """``sigma'(a)`` of ``h = sigma(a)``, from ``h`` (differentiable)."""
    if nonlinearity == "tanh":
        return 1 - h * h
    if nonlinearity == "relu":
        return (h > 0).to(h.dtype)
    return torch.where(h > 0, torch.full_like(h, SELU_SCALE), h + SELU_SCALE * SELU_ALPHA)


def activate(a: Tensor, nonlinearity: str) -> Tensor:
    return {"tanh": torch.tanh, "relu": torch.relu, "selu": torch.selu}[nonlinearity](a)


def through_reference(reference, inputs, grads):
    """The gradients of ``reference(*inputs)`` with respect to its tensor inputs, given those of
    its outputs ``grads`` (None: zero), as a differentiable graph: the backward of an operator
    when a graph of the gradient is asked for (double backward)."""
    tensors = [t for t in inputs if isinstance(t, Tensor)]
    with torch.enable_grad():
        out = reference(*inputs)
    out = out if isinstance(out, tuple) else (out,)
    grads = [torch.zeros_like(o) if g is None else g for o, g in zip(out, grads, strict=False)]
    return torch.autograd.grad(out, tensors, grads, create_graph=True, allow_unused=True,
                               materialize_grads=True)


def by_device(cpu_impl, other_impl):
    """An implementation that runs ``cpu_impl`` (the compiled kernel's) when its first tensor
    argument is on the CPU, else ``other_impl`` (the PyTorch loop)."""

    def call(*args):
        first = next(a for a in args if isinstance(a, Tensor))
        return (cpu_impl if first.device.type == "cpu" else other_impl)(*args)

    return call


def eager_function(name: str, forward, setup_context, backward, backward_impl):
    """An ``autograd.Function`` that runs a registered operator's implementations in eager mode
    without the operator's dispatch (its Python wrappers cost 50-200 us a call, a tenth of a
    small layer's training step): ``forward``, the operator's ``setup_context``, and its
    ``backward`` with ``backward_impl`` in place of the backward operator. Old-style
    ``forward(ctx, ...)``: ``Function.apply`` then binds no signature per call (about 40 us);
    torch.func's transforms take the references instead."""

    def fwd(ctx, *args):
        out = forward(*args)
        setup_context(ctx, args, out)
        ctx.set_materialize_grads(False)  # an output not used (LMN-B's hs): no zeros to read
        return out

    def bwd(ctx, *grads):
        return backward(ctx, *grads, backward_op=backward_impl)

    return type(name, (torch.autograd.Function,), {
        "forward": staticmethod(fwd), "backward": staticmethod(bwd),
        "__doc__": f"The eager path of an operator ({name}; :func:`eager_function`)."})

