"""What a second core could gain for one training run at batch 1 (the paper protocol), measured
side by side: the bound on splitting the LSTM's recurrence by hidden units across two threads.

At batch 1 the recurrence's loop (``linmem.nn.rnns.LSTM``, the compiled kernel) does two products
per step with ``W_hh`` (``4H x H``): ``h_{t-1} W_hh^T`` forward and ``da_t W_hh`` backward. At
750 units ``W_hh`` is 9 MB, beyond the L2 cache, so each step streams it twice; the kernel splits
a batch's rows over threads and at batch 1 uses one. A kernel that split the hidden units
instead would have each of two threads stream half of ``W_hh`` per product, with a barrier per
step. This script times, in one run, with one torch thread in each process:

- ``step``: a training step of the model ``lstm`` as the searches train it (readout, loss,
  Adam; the kernel's path), timed by ``benchmarks/baselines.py``'s ``train_fps`` on one random
  sequence of ``--steps`` frames at batch 1, per frame;
- ``one``: the two products of a step on one thread, the whole ``W_hh`` (``torch.mv``);
- ``two``: the same two products split in halves (by hidden units) in two processes at once:
  no barrier, no gate arithmetic, so the most such a split could gain.

``one / two`` is that bound; ``one / step`` sets torch's products against the kernel's whole
step (near 1 or above: the step is its products, as a memory-bound loop's is). Run it with nothing
else busy (the search workers paused): two busy processes on two cores measure each other.

    python benchmarks/batch1_two_cores.py --json results/speed/batch1_two_cores.json \\
        > results/speed/batch1_two_cores.txt
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

import torch

from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.models import build_model

sys.path.insert(0, str(Path(__file__).parent))
from baselines import random_batch, train_fps  # the baselines' training step, timed alike


def per_call(fn, calls: int) -> float:
    """Microseconds per call of ``fn`` over ``calls`` calls, after a warm-up."""
    for _ in range(max(calls // 10, 1)):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def training_step_us(hidden: int, steps: int, min_time: float) -> float:
    """A training step of ``lstm`` on one sequence of ``steps`` frames, microseconds per frame."""
    torch.manual_seed(0)
    return 1e6 / train_fps(build_model("lstm", hidden), random_batch(1, steps), min_time)


def products_us(w_fwd: torch.Tensor, w_bwd: torch.Tensor, calls: int) -> float:
    """``w_fwd h`` and ``w_bwd^T g`` (the forward's and the backward's products, both matrices
    row-major with the gates' rows, as ``W_hh`` lies), microseconds per pair."""
    h, g = torch.randn(w_fwd.shape[1]), torch.randn(w_bwd.shape[0])
    return per_call(lambda: (torch.mv(w_fwd, h), torch.mv(w_bwd.t(), g)), calls)


def split(w: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                        torch.Tensor]]:
    """``W_hh`` (``4H x H``, gates ``i, f, g, o``) split by hidden units in two halves, each
    ``(units, gate_rows, forward, backward)``: ``forward @ h`` is ``(W_hh h)[gate_rows]`` (its
    units' four gates) and ``backward.t() @ da`` is ``(W_hh^T da)[units]``."""
    hidden = w.shape[1]
    halves = [torch.arange(0, hidden // 2), torch.arange(hidden // 2, hidden)]
    out = []
    for units in halves:
        rows = torch.cat([units + k * hidden for k in range(4)])
        out.append((units, rows, w[rows].contiguous(), w[:, units].contiguous()))
    return out


def _time_part(part: tuple[torch.Tensor, torch.Tensor], calls: int, barrier, results) -> None:
    torch.set_num_threads(1)
    barrier.wait()
    results.put(products_us(*part, calls))


def split_us(w: torch.Tensor, calls: int) -> float:
    """The two products of ``w`` split by hidden units (:func:`split`) in two processes at once
    (threads would wait on each other for Python's lock between products); microseconds per
    pair, the slower process's."""
    ctx = mp.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_time_part, args=((fwd, bwd), calls, barrier, results))
             for _, _, fwd, bwd in split(w)]
    for proc in procs:
        proc.start()
    times = [results.get() for _ in procs]
    for proc in procs:
        proc.join()
    return max(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=750)
    parser.add_argument("--steps", type=int, default=500,
                        help="frames of the training step's sequence")
    parser.add_argument("--calls", type=int, default=2000, help="product pairs per measurement")
    parser.add_argument("--min-time", type=float, default=1.0,
                        help="seconds of training steps per measurement")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    print(f"CPU: {machine()['cpu']}; batch 1; LSTM {args.hidden} units; one torch thread per "
          "process", flush=True)
    torch.manual_seed(0)
    w = torch.randn(4 * args.hidden, args.hidden)
    rows = {"step": [], "one": [], "two": []}
    for _ in range(args.repeats):  # interleaved, so that drift hits all three alike
        rows["step"].append(training_step_us(args.hidden, args.steps, args.min_time))
        rows["one"].append(products_us(w, w, args.calls))
        rows["two"].append(split_us(w, args.calls))
    med = {k: statistics.median(v) for k, v in rows.items()}
    for k, v in rows.items():
        print(f"{k:5s} median {med[k]:7.1f} us  ({', '.join(f'{x:.1f}' for x in v)})")
    print(f"one / two = {med['one'] / med['two']:.2f}: the most two threads could gain on the "
          f"products; one / step = {med['one'] / med['step']:.2f}: the products against the "
          "kernel's whole step")
    if args.json:
        write_json(args.json, {
            **provenance(command_line(), git_commit(), 0, None, time.perf_counter() - started),
            "hidden": args.hidden, "steps": args.steps, "calls": args.calls, "rows": rows,
            "median_us": med, "one_over_two": med["one"] / med["two"],
            "units": "microseconds: per frame (step), per pair of products (one, two)"})
        print(json.dumps({"written": args.json}))


if __name__ == "__main__":
    main()
