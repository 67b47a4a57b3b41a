"""Where a batch-1 step's time goes outside the products (issue 77): the compiled kernel's cost
per call (packing the weights into its panels) against its cost per step, the share of a step
that its tanh takes (a forward step with tanh against the same step with relu, which the loop
applies itself), and one Adam update (torch's unfused loop against its fused kernel), for LMN-B
sizes, one thread.

A call's fixed cost is the time of a one-step call; a step's, the slope between a one-step and
a ``--steps``-step call. Runs under any linmem tree (``PYTHONPATH=TREE/src``, or that tree's
python): the provenance records the library's commit.

    OMP_NUM_THREADS=1 python benchmarks/batch1_parts.py --json results/speed/batch1-parts.json
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.models import build_model
from linmem.ops.cpu import kernel_variants, load_cpu_kernel


def best_seconds(fn, repeats: int = 5, min_time: float = 0.2) -> float:
    """The best of ``repeats`` mean times of ``fn`` over at least ``min_time`` seconds each."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_time or n < 3:
            fn()
            n += 1
        best = min(best, elapsed / n)
    return best


def call_seconds(kernel, variant: str, weights: list, steps: int, seed: int) -> list[float]:
    """Seconds of a ``steps``-step call: forward with tanh, forward with relu, backward."""
    size = weights[0].shape[0]
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps, 1, size, generator=g)
    bias, m0 = torch.zeros(size), torch.zeros(1, size)
    hs, ms = torch.empty(steps, 1, size), torch.empty(steps, 1, size)
    gh, gm = torch.randn(steps, 1, size, generator=g), torch.randn(steps, 1, size, generator=g)
    grads, g0 = torch.empty(steps, 1, 2 * size), torch.empty(1, size)
    forward = [best_seconds(lambda code=code: kernel.forward(x, m0, *weights, bias, code, hs, ms,
                                                             variant))
               for code in (0, 1)]  # the kernel's codes: tanh, relu
    return [*forward, best_seconds(lambda: kernel.backward(gh, gm, hs, *weights, 0, grads, g0,
                                                           variant))]


def loop_costs(kernel, variant: str, size: int, steps: int) -> dict:
    """Microseconds of a forward and a backward call of one step, of each further step, and of
    each further forward step with relu in place of tanh."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(size, size, generator=g) * size ** -0.5 for _ in range(3)]
    f1, r1, b1 = call_seconds(kernel, variant, weights, 1, 1)
    fn, rn, bn = call_seconds(kernel, variant, weights, steps, 1)
    return {"forward_call_us": 1e6 * f1, "backward_call_us": 1e6 * b1,
            "forward_step_us": 1e6 * (fn - f1) / (steps - 1),
            "forward_step_relu_us": 1e6 * (rn - r1) / (steps - 1),
            "backward_step_us": 1e6 * (bn - b1) / (steps - 1)}


def adam_costs(size: int) -> dict:
    """Milliseconds of one Adam update of LMN-B(size, size)'s parameters, unfused and fused."""
    model = build_model("lmn-b", size, size, memory_bound=None)
    params = list(model.parameters())
    for p in params:
        p.grad = torch.randn_like(p)
    out = {}
    for name, options in (("adam_ms", {}), ("adam_fused_ms", {"fused": True})):
        optimizer = torch.optim.Adam(params, lr=1e-3, **options)
        out[name] = 1e3 * best_seconds(optimizer.step)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[50, 100, 250, 500])
    p.add_argument("--steps", type=int, default=65)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    started, commit = time.perf_counter(), git_commit()
    kernel = load_cpu_kernel()
    variant = kernel_variants()[0]
    print(f"CPU: {machine()['cpu']}; torch {torch.__version__}, {torch.get_num_threads()} "
          f"threads; variant {variant}; linmem at {commit}", flush=True)
    rows = []
    for size in args.sizes:
        row = {"size": size, "variant": variant, **loop_costs(kernel, variant, size, args.steps),
               **adam_costs(size)}
        rows.append(row)
        print(f"LMN-B({size}, {size}), batch 1: a call forward {row['forward_call_us']:.1f} us + "
              f"{row['forward_step_us']:.2f} us a step ({row['forward_step_relu_us']:.2f} with "
              f"relu), backward {row['backward_call_us']:.1f} us + "
              f"{row['backward_step_us']:.2f} us a step; Adam {row['adam_ms']:.3f} ms, fused "
              f"{row['adam_fused_ms']:.3f} ms", flush=True)
    if args.json:
        write_json(args.json, {**provenance(command_line(), commit, 0, None,
                                            time.perf_counter() - started),
                               "rows": rows, "units": "us, ms as the names say"})
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
