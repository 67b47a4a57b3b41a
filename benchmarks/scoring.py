"""The validation that every training epoch runs: its scoring before and after commit ec82bde,
side by side in one run.

Until then each epoch's ``linmem.training.evaluation.evaluate`` counted the accuracy at every
threshold of
``linmem.metrics.THRESHOLD_GRID`` (10 of them), each with its own pass of
``linmem.metrics.frame_counts`` (flattening, checking and comparing the whole split again), though
only the final evaluation chooses a threshold. Now the epochs count at 0.5 alone
(``thresholds=()``), and the final evaluation counts every threshold in one pass (a histogram of
where each probability falls among the thresholds).

For each data set and model (LMN-B (100,250) and (250,500), sizes of the searches; weights at
their initialisation: the cost does not depend on them), this times on the validation split, in
interleaved rounds (median CPU seconds):

- ``before``: ``evaluate`` with the former scoring (:class:`PerThresholdScores`, the former
  ``FrameScores.update``) and its grid, as every epoch ran it;
- ``epoch``: ``evaluate(..., thresholds=())``, as every epoch runs it now;
- ``final``: ``evaluate`` with the grid, one pass (the run's last evaluation);
- ``forward``: the model's forward over the same batches alone, for scale,

and checks that the scorings agree: the same frames and accuracy, and the same accuracy at
every threshold for ``before`` and ``final``.

    OMP_NUM_THREADS=1 python benchmarks/scoring.py --json results/speed/scoring.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from unittest import mock

import torch

import linmem.training.trainer
from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.batching import iterate_batches
from linmem.data import data_checksum, load_polyphonic
from linmem.metrics import THRESHOLD_GRID, FrameScores, _flatten, frame_counts
from linmem.models import build_model
from linmem.training.evaluation import evaluate

MODELS = {"lmn-b 100,250": ("lmn-b", 100, 250), "lmn-b 250,500": ("lmn-b", 250, 500)}


class PerThresholdScores(FrameScores):
    """``FrameScores`` as it was before commit ec82bde: a pass of :func:`frame_counts` per
    threshold."""

    @torch.no_grad()
    def update(self, logits, targets, mask=None, nll_logits=None) -> None:
        z, y = _flatten(logits, targets, mask, "logits")
        zn = z if nll_logits is None else _flatten(nll_logits, targets, mask, "nll_logits")[0]
        probs = torch.sigmoid(z.to(torch.float64))
        tp, fp, fn = frame_counts(probs, y, None, self.threshold)
        denom = tp + fp + fn
        self.tp += int(tp.sum())
        self.denom += int(denom.sum())
        scored = denom > 0
        self.frame_ratio_sum += float((tp[scored].double() / denom[scored].double()).sum())
        self.scored_frames += int(scored.sum())
        self.nll_sum += float(torch.nn.functional.binary_cross_entropy_with_logits(
            zn.to(torch.float64), y.to(torch.float64), reduction="sum"))
        self.frames += z.shape[0]
        if not self.grid_tp:
            zeros = [0] * len(self.grid)
            self.grid_tp, self.grid_denom = list(zeros), list(zeros)
            self.grid_ratio_sum, self.grid_scored = [0.0] * len(self.grid), list(zeros)
        for i, t in enumerate(self.grid):
            g_tp, g_fp, g_fn = frame_counts(probs, y, None, t)
            g_denom = g_tp + g_fp + g_fn
            self.grid_tp[i] += int(g_tp.sum())
            self.grid_denom[i] += int(g_denom.sum())
            on = g_denom > 0  # the per-frame mean at each threshold, as the present one counts
            self.grid_ratio_sum[i] += float((g_tp[on].double() / g_denom[on].double()).sum())
            self.grid_scored[i] += int(on.sum())


def forward_only(model: torch.nn.Module, sequences) -> None:
    with torch.no_grad():
        for batch in iterate_batches(sequences, 64):
            model(batch.inputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", nargs="+", default=["musedata", "nottingham", "piano", "jsb"])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args()
    started = time.perf_counter()

    def before(model, valid):
        with mock.patch.object(linmem.training.trainer, "FrameScores", PerThresholdScores):
            return evaluate(model, valid)

    ways = {"before": before, "epoch": lambda m, v: evaluate(m, v, thresholds=()),
            "final": evaluate, "forward": forward_only}
    rows = []
    print(f"machine: {machine()}")
    for name in args.data:
        valid = load_polyphonic(name, root=args.data_dir, progress=False)["valid"]
        for label in args.models:
            model_name, hidden, memory = MODELS[label]
            torch.manual_seed(0)
            model = build_model(model_name, hidden, memory=memory, memory_bound=None)
            times: dict[str, list[float]] = {way: [] for way in ways}
            scores = {}
            for _ in range(args.rounds):
                for way, run in ways.items():
                    t0 = time.process_time()
                    scores[way] = run(model, valid)
                    times[way].append(time.process_time() - t0)
            same = (all((scores[w]["frames"], scores[w]["acc"], scores[w]["acc_frame"])
                        == (scores["before"]["frames"], scores["before"]["acc"],
                            scores["before"]["acc_frame"]) for w in ("epoch", "final"))
                    and scores["final"]["acc_at"] == scores["before"]["acc_at"]
                    and list(scores["before"]["acc_at"]) == list(THRESHOLD_GRID)
                    and scores["epoch"]["acc_at"] == {})
            cpu = {way: statistics.median(t) for way, t in times.items()}
            row = {"data": name, "model": label, "cpu_s": cpu, "same_scores": same,
                   "epoch_speedup": cpu["before"] / cpu["epoch"],
                   "scoring_before_s": cpu["before"] - cpu["forward"],
                   "scoring_epoch_s": cpu["epoch"] - cpu["forward"]}
            rows.append(row)
            print(f"{name:10s} {label:14s} before {cpu['before']:.2f} s, epoch {cpu['epoch']:.2f} s"
                  f" ({row['epoch_speedup']:.2f}x), final {cpu['final']:.2f} s, forward "
                  f"{cpu['forward']:.2f} s; scoring {row['scoring_before_s']:.2f} -> "
                  f"{row['scoring_epoch_s']:.2f} s; same scores: {same}", flush=True)
            if not same:
                raise SystemExit("the scorings disagree")
    if args.json:
        checksums = {name: data_checksum(name, root=args.data_dir) for name in args.data}
        write_json(args.json, {
            **provenance(command_line(), git_commit(), 0, checksums,
                         time.perf_counter() - started),
            "rounds": args.rounds, "grid": list(THRESHOLD_GRID), "rows": rows,
            "units": "CPU seconds of one evaluation of the validation split (median of rounds)"})
        print(json.dumps({"written": args.json}))


if __name__ == "__main__":
    main()
