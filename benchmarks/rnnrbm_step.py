"""The RNN-RBM's training step (CD-k): its Gibbs chain before and after commit 0ef9a21, side by side
in one run.

The chain of CD-k draws, at every step of every sequence, ``h ~ P(h | v)`` and ``v ~ P(v | h)``
``k`` times. It wrote each conditional out, ``sigmoid(b + beta * (x @ W))``, a new tensor per
operation (the product, ``beta`` times it even when ``beta`` is 1, the sum, the sigmoid), and
each draw as ``(rand < p).to(dtype)`` (a boolean tensor, then a copy). Now the conditional is
computed in the product's buffer and the draw written over the uniform numbers: the same
operations in the same order, the same numbers (checked here, and by
``tests/test_rnnrbm.py``).

For each data set, this times the training step (the CD-k cost, its backward) over the first
batches of its training split, both ways in interleaved rounds, median CPU seconds:

    OMP_NUM_THREADS=1 python benchmarks/rnnrbm_step.py --json results/speed/rnnrbm_step.json
"""

from __future__ import annotations

import argparse
import statistics
import time
from unittest import mock

import torch

import linmem.rnnrbm
from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.data import data_checksum, iterate_batches, load_polyphonic
from linmem.rnnrbm import RNNRBM


def former_bernoulli(p, generator=None):
    return (torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device) < p).to(
        p.dtype)


def former_gibbs_chain(v, w, b_v, b_h, k, generator=None, beta=1.0):
    """``linmem.rnnrbm.gibbs_chain`` as it was before commit 0ef9a21."""
    with torch.no_grad():
        for _ in range(k):
            h = former_bernoulli(torch.sigmoid(b_h + beta * (v @ w)), generator=generator)
            v = former_bernoulli(torch.sigmoid(b_v + beta * (h @ w.T)), generator=generator)
    return v


def step(model: RNNRBM, batches) -> tuple[torch.Tensor, list[torch.Tensor]]:
    torch.manual_seed(0)  # the chains' draws: the same for both ways
    total = 0.0
    for batch in batches:
        loss = model.training_loss(batch)
        model.zero_grad()
        loss.backward()
        total += float(loss.detach())
    return torch.tensor(total), [p.grad.clone() for p in model.parameters()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=["piano", "musedata", "nottingham", "jsb"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--sequences", type=int, default=12,
                        help="the first sequences of the training split (batches of 4)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    rows, checksums = [], {}
    print(f"machine: {machine()}")
    for name in args.data:
        train = load_polyphonic(name, root=args.data_dir, progress=False)["train"]
        checksums[name] = data_checksum(name, args.data_dir)
        batches = list(iterate_batches(train[: args.sequences], 4))
        torch.manual_seed(0)
        model = RNNRBM(n_recurrent=100, n_hidden=150)  # the size of the paper's quoted runs
        ways = {"before": lambda: mock.patch.object(linmem.rnnrbm, "gibbs_chain",
                                                    former_gibbs_chain),
                "now": lambda: mock.patch.object(linmem.rnnrbm, "gibbs_chain",
                                                 linmem.rnnrbm.gibbs_chain)}
        times: dict[str, list[float]] = {way: [] for way in ways}
        results = {}
        for _ in range(args.rounds):
            for way, patch in ways.items():
                with patch():
                    t0 = time.process_time()
                    results[way] = step(model, batches)
                    times[way].append(time.process_time() - t0)
        same = torch.equal(results["before"][0], results["now"][0]) and all(
            torch.equal(a, b) for a, b in zip(results["before"][1], results["now"][1],
                                              strict=True))
        cpu = {way: statistics.median(t) for way, t in times.items()}
        frames = sum(int(b.mask.sum()) for b in batches)
        row = {"data": name, "frames": frames, "cpu_s": cpu, "same_numbers": same,
               "speedup": cpu["before"] / cpu["now"]}
        rows.append(row)
        print(f"{name:10s} {frames} frames: before {cpu['before']:.3f} s, now {cpu['now']:.3f} s "
              f"({row['speedup']:.2f}x); same numbers: {same}")
    if args.json:
        write_json(args.json, {"rows": rows, "rounds": args.rounds, **provenance(
            command_line(), git_commit(), 0, checksums, time.perf_counter() - started)})


if __name__ == "__main__":
    main()
