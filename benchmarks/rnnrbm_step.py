"""The RNN-RBM's training step (CD-k) and its predictions (the validation of every epoch):
their Gibbs chains before and after commits 0ef9a21 and 8ce753b, side by side in one run.

The chain of CD-k draws, at every step of every sequence, ``h ~ P(h | v)`` and ``v ~ P(v | h)``
``k`` times. It wrote each conditional out, ``sigmoid(b + beta * (x @ W))``, a new tensor per
operation (the product, ``beta`` times it even when ``beta`` is 1, the sum, the sigmoid), and
each draw as ``(rand < p).to(dtype)`` (a boolean tensor, then a copy). Now the conditional is
computed in the product's buffer and the draw written over the uniform numbers: the same
operations in the same order, the same numbers (checked here, and by
``tests/test_rnnrbm.py``). The predictions (the key marginals, estimated from 100 Gibbs steps
whose draws each sequence seeds for itself) stacked each row's draws into a new tensor; from
8ce753b they are drawn into one buffer, the conditionals computed in place as in the chain.

For each data set, this times the training step (the CD-k cost, its backward) over the first
batches of its training split and the predictions over the first sequences of its validation
split (in batches of 64, as an epoch's validation), both ways in interleaved rounds, median CPU
seconds:

    OMP_NUM_THREADS=1 python benchmarks/rnnrbm_step.py --json results/speed/rnnrbm_step.json
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from unittest import mock

import torch

import linmem.nn.rnnrbm
from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.batching import iterate_batches
from linmem.data import data_checksum, load_polyphonic
from linmem.nn.rnnrbm import RNNRBM


def former_bernoulli(p, generator=None):
    return (torch.rand(p.shape, generator=generator, dtype=p.dtype, device=p.device) < p).to(
        p.dtype)


def former_gibbs_chain(v, w, b_v, b_h, k, generator=None, beta=1.0):
    """``linmem.nn.rnnrbm.gibbs_chain`` as it was before commit 0ef9a21."""
    with torch.no_grad():
        for _ in range(k):
            h = former_bernoulli(torch.sigmoid(b_h + beta * (v @ w)), generator=generator)
            v = former_bernoulli(torch.sigmoid(b_v + beta * (h @ w.T)), generator=generator)
    return v


def former_row_bernoulli(p, keys, draw):
    noise = torch.stack([torch.rand(
        p.shape[1:], generator=torch.Generator(device=p.device).manual_seed(
            (key + 1_000_003 * draw) % 2 ** 63), dtype=p.dtype, device=p.device) for key in keys])
    return (noise < p).to(p.dtype)


def former_marginals(self, inputs):
    """``RNNRBM.marginals`` (Gibbs) as it was before commit 8ce753b."""
    with torch.no_grad():
        b_v, b_h = self.step_biases(inputs)
        keys = linmem.nn.rnnrbm.sequence_keys(inputs, self.seed)
        v = former_row_bernoulli(torch.sigmoid(b_v), keys, 0)
        total = torch.zeros_like(b_v)
        for step in range(self.predict_steps):
            h = former_row_bernoulli(torch.sigmoid(b_h + v @ self.W), keys, 2 * step + 1)
            p = torch.sigmoid(b_v + h @ self.W.T)
            if step >= self.burn_in:
                total += p
            v = former_row_bernoulli(p, keys, 2 * step + 2)
        return total / (self.predict_steps - self.burn_in)


@contextlib.contextmanager
def former():
    """The chain and the predictions as they were before commits 0ef9a21 and 8ce753b."""
    with mock.patch.object(linmem.nn.rnnrbm, "gibbs_chain", former_gibbs_chain), \
            mock.patch.object(RNNRBM, "marginals", former_marginals):
        yield


def predict(model: RNNRBM, batches) -> torch.Tensor:
    return torch.cat([model(batch.inputs)[batch.mask] for batch in batches])


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
    parser.add_argument("--valid-sequences", type=int, default=16,
                        help="the first sequences of the validation split (batches of 64)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    torch.set_num_threads(1)
    rows, checksums = [], {}
    print(f"machine: {machine()}")
    for name in args.data:
        data = load_polyphonic(name, root=args.data_dir, progress=False)
        checksums[name] = data_checksum(name, args.data_dir)
        batches = list(iterate_batches(data["train"][: args.sequences], 4))
        valid = list(iterate_batches(data["valid"][: args.valid_sequences], 64))
        torch.manual_seed(0)
        model = RNNRBM(n_recurrent=100, n_hidden=150)  # the size of the paper's quoted runs
        ways = {"before": former, "now": contextlib.nullcontext}
        times = {(part, way): [] for part in ("train", "valid") for way in ways}
        results = {}
        for _ in range(args.rounds):
            for way, patch in ways.items():
                with patch():
                    for part, run, data_batches in (("train", step, batches),
                                                    ("valid", predict, valid)):
                        t0 = time.process_time()
                        results[(part, way)] = run(model.train(part == "train"), data_batches)
                        times[(part, way)].append(time.process_time() - t0)
        same = (torch.equal(results[("train", "before")][0], results[("train", "now")][0])
                and all(torch.equal(a, b) for a, b in zip(
                    results[("train", "before")][1], results[("train", "now")][1], strict=True))
                and torch.equal(results[("valid", "before")], results[("valid", "now")]))
        cpu = {f"{part} {way}": statistics.median(t) for (part, way), t in times.items()}
        frames = {"train": sum(int(b.mask.sum()) for b in batches),
                  "valid": sum(int(b.mask.sum()) for b in valid)}
        row = {"data": name, "frames": frames, "cpu_s": cpu, "same_numbers": same,
               "train_speedup": cpu["train before"] / cpu["train now"],
               "valid_speedup": cpu["valid before"] / cpu["valid now"]}
        rows.append(row)
        print(f"{name:10s} training step ({frames['train']} frames): before "
              f"{cpu['train before']:.3f} s, now {cpu['train now']:.3f} s "
              f"({row['train_speedup']:.2f}x); predictions ({frames['valid']} frames): before "
              f"{cpu['valid before']:.3f} s, now {cpu['valid now']:.3f} s "
              f"({row['valid_speedup']:.2f}x); same numbers: {same}")
    if args.json:
        write_json(args.json, {"rows": rows, "rounds": args.rounds, **provenance(
            command_line(), git_commit(), 0, checksums, time.perf_counter() - started)})


if __name__ == "__main__":
    main()
