"""The evaluation's batching: batches of up to 64 sequences sorted by length, padded to the
longest (``max_ratio=None``, until 2026-11-24), against the same with no batch longer than
``max_ratio`` times its shortest sequence (``--ratios``; default ``linmem.batching.EVAL_MAX_RATIO``,
the evaluation's), side by side in one run.

For each data set and model (LMN-B (250,500) and an LSTM of 750 units, the sizes the searches
select on the long data sets; weights at their initialisation: the cost does not depend on
them), this times ``linmem.training.evaluation.evaluate`` on the validation split, which
every epoch of training runs, in interleaved rounds (median CPU seconds reported), and checks
that the batchings give the same frame counts and accuracy. It prints the padded steps each batching
computes (as a multiple of the frames) and the speed-up over no bound.

    OMP_NUM_THREADS=1 python benchmarks/eval_batching.py --json results/speed/eval_batching.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from linmem._io import command_line, git_commit, provenance, write_json
from linmem.batching import EVAL_MAX_RATIO, bucket_batches
from linmem.data import data_checksum, load_polyphonic
from linmem.models import build_model
from linmem.training.evaluation import evaluate

MODELS = {"lmn-b 250,500": ("lmn-b", 250, 500), "lstm 750": ("lstm", 750, None)}


def padded_steps(lengths: list[int], batch_size: int, max_ratio: float | None) -> int:
    """The steps a batching computes: each batch's longest next-step pairs times its size."""
    return sum(len(b) * (max(lengths[i] for i in b) - 1)
               for b in bucket_batches(lengths, batch_size, False, max_ratio=max_ratio))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=["musedata", "piano", "nottingham", "jsb"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ratios", type=float, nargs="+", default=[EVAL_MAX_RATIO],
                        help="max_ratio values timed beside no bound (None)")
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()
    rows = []
    for name in args.data:
        data = load_polyphonic(name, root=args.data_dir, progress=False)
        valid = data["valid"]
        lengths = [len(s) for s in valid if len(s) >= 2]
        steps = sum(n - 1 for n in lengths)
        for label in args.models:
            model_name, hidden, memory = MODELS[label]
            torch.manual_seed(0)
            model = build_model(model_name, hidden, memory=memory, memory_bound=None)
            ratios: list[float | None] = [None, *args.ratios]
            times: dict[float | None, list[float]] = {r: [] for r in ratios}
            scores = {}
            for _ in range(args.rounds):
                for ratio in ratios:
                    t0 = time.process_time()
                    scores[ratio] = evaluate(model, valid, args.batch_size, max_ratio=ratio)
                    times[ratio].append(time.process_time() - t0)
            same = all((s["frames"], s["acc"]) == (scores[None]["frames"], scores[None]["acc"])
                       for s in scores.values())
            base = statistics.median(times[None])
            row = {"data": name, "model": label, "frames": steps, "same_accuracy": same,
                   "by_ratio": [{"max_ratio": r,
                                 "padded_steps": padded_steps(lengths, args.batch_size, r),
                                 "cpu_s": statistics.median(times[r]),
                                 "speedup": base / statistics.median(times[r])}
                                for r in ratios]}
            rows.append(row)
            print(f"{name:10s} {label:14s} " + "; ".join(
                f"{r['max_ratio'] or 'none'}: x{r['padded_steps'] / steps:.2f} steps, "
                f"{r['cpu_s']:.2f} s ({r['speedup']:.2f}x)" for r in row["by_ratio"])
                + f"; same accuracy: {same}", flush=True)
            if not same:
                raise SystemExit("the batchings disagree")
    if args.json:
        checksums = {name: data_checksum(name, root=args.data_dir) for name in args.data}
        write_json(args.json, {
            **provenance(command_line(), git_commit(), 0, checksums,
                         time.perf_counter() - started),
            "batch_size": args.batch_size, "default_max_ratio": EVAL_MAX_RATIO,
            "rounds": args.rounds,
            "rows": rows, "units": "CPU seconds of one evaluation of the validation split"})
        print(json.dumps({"written": args.json}))


if __name__ == "__main__":
    main()
