"""The choice of the CPU path (``linmem.ops.paths.measure_cpu_paths``) on a busy machine: the paths
timed one after the other on the wall clock (before commit af2e6b9) against timed in turns on
the process's CPU time (now, with one thread), side by side in one run.

The first use of the LMN on a machine times its recurrence through every kernel variant and
through the PyTorch loop, and keeps the fastest path that beats the loop at a small and a large
layer (``choice-<cpu>.json`` beside the build). Timed one path after the other on the wall
clock, a burst of load from another process falls on whichever path is being timed then, and
the choice can be the loop on a CPU where the kernel is faster. Now every round times each path
once (best of the rounds), and with one thread the clock is the process's CPU time, which the
other processes' share of the cores does not count.

This repeats both measurements ``--trials`` times, alternating, while ``--load`` busy processes
(one-thread matrix products) run beside it (0: the machine as it is, e.g. beside a search's
workers), and prints how often each picks each path and its speedups over the loop (the smallest
over the two sizes, which decides).

    OMP_NUM_THREADS=1 python benchmarks/path_choice.py --json results/speed/path_choice.json
"""

from __future__ import annotations

import argparse
import math
import multiprocessing
import statistics
import time
from collections import Counter

import torch

from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.nn.lmn import lmn_recurrence
from linmem.ops.cpu import LOOP, kernel_variants
from linmem.ops.paths import _PATH_PROBLEMS, _path_problem, measure_cpu_paths, use_cpu_kernel

PROBLEMS = _PATH_PROBLEMS  # the sizes measure_cpu_paths times


def one_after_the_other(variants: list[str], repeats: int = 5) -> dict:
    """``measure_cpu_paths`` as it was before commit af2e6b9: each path's repeats in a row, on
    the wall clock."""
    seconds: dict[str, dict[str, float]] = {}
    for size, shape in PROBLEMS.items():
        ops = [t.requires_grad_() for t in _path_problem(*shape)]
        for path in (*variants, LOOP):
            best = math.inf
            with use_cpu_kernel(path if path != LOOP else False):
                for _ in range(repeats + 1):
                    start = time.perf_counter()
                    hs, ms, _, _ = lmn_recurrence(*ops)
                    torch.autograd.grad((hs.sum(), ms.sum()), ops)
                    best = min(best, time.perf_counter() - start)
            seconds.setdefault(path, {})[size] = best
    speedup = {v: min(seconds[LOOP][s] / seconds[v][s] for s in PROBLEMS) for v in variants}
    fastest = max(variants, key=speedup.get)
    return {"choice": fastest if speedup[fastest] >= 1.0 else LOOP, "speedup_over_loop": speedup}


def busy(stop) -> None:
    """A one-thread process doing matrix products until ``stop`` is set."""
    torch.set_num_threads(1)
    a = torch.randn(512, 512)
    while not stop.is_set():
        a = torch.tanh(a @ a) * 0.1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--load", type=int, default=2,
                        help="busy one-thread processes beside the measurements (0: none)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    variants = kernel_variants()
    if not variants:
        raise SystemExit("no compiled kernel here: nothing to choose")
    ways = {"one after the other, wall clock": one_after_the_other,
            "in turns, CPU time": measure_cpu_paths}
    stop = multiprocessing.Event()
    workers = [multiprocessing.Process(target=busy, args=(stop,), daemon=True)
               for _ in range(args.load)]
    for w in workers:
        w.start()
    records: dict[str, list[dict]] = {way: [] for way in ways}
    try:
        for _ in range(args.trials):
            for way, measure in ways.items():
                records[way].append(measure(variants))
    finally:
        stop.set()
        for w in workers:
            w.join()
    lines = [f"CPU: {machine()['cpu']}, AVX-512: {machine()['avx512']}; torch "
             f"{torch.__version__}, 1 thread; {args.load} busy processes beside; "
             f"{args.trials} trials of each, alternating"]
    summary = {}
    for way, recs in records.items():
        chosen = Counter(r["choice"] for r in recs)
        speedups = {v: [r["speedup_over_loop"][v] for r in recs] for v in variants}
        summary[way] = {"choices": dict(chosen), "speedup_over_loop": speedups}
        lines.append(f"{way}: chose " + ", ".join(f"{p} {n}/{args.trials}"
                                                  for p, n in chosen.most_common())
                     + " | speedup over the loop, median (min-max): " + ", ".join(
                         f"{v} {statistics.median(s):.2f} ({min(s):.2f}-{max(s):.2f})"
                         for v, s in speedups.items()))
    print("\n".join(lines))
    if args.json:
        write_json(args.json, {"results": summary, "variants": variants, "load": args.load,
                               "trials": args.trials, "lines": lines, **provenance(
                                   command_line(), git_commit(), None, None,
                                   time.perf_counter() - started)})


if __name__ == "__main__":
    main()
