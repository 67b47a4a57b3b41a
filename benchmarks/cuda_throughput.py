"""The LMN on a GPU against cuDNN's RNNs and against the LMN on the same machine's CPU.

Side by side in one run, on random piano-roll-like sequences of ``--steps`` steps, frames per
second of training (forward, masked next-step NLL, backward, Adam step) and of inference for

- ``lmn``: the LMN-B predictor on ``--device`` (on CUDA its recurrence is the PyTorch loop of
  the ``linmem::lmn_scan`` operator (``linmem.ops``): one small kernel launch per product and step);
- ``naive-loop``: the same LMN as the straightforward per-step autograd loop
  (``throughput.NaiveLMN``), on the same device;
- ``rnn``, ``lstm``, ``gru``: ``torch.nn.RNN``/``LSTM``/``GRU`` (cuDNN's fused kernels on
  CUDA) with ``hidden = functional + memory``;
- ``lmn-cpu``: the LMN-B on this machine's CPU with one thread (the compiled kernel, the
  setting of the project's searches: a run per core).

``--epochs`` then times one training epoch on real data sets with the trainer's batching, for
LMN-B and LSTM on the device and LMN-B on one CPU thread. The GPU is fast at large batches; the
trainer's default batch is 4 sequences, where a step is a chain of small products.

    python benchmarks/cuda_throughput.py --json results/cuda/throughput.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))  # throughput.py beside this file

from throughput import NaiveLMN, epoch_batches, median_rates, random_batch, torch_rnns

from linmem._check import check_device
from linmem._io import command_line, git_commit, provenance, write_json
from linmem.data import load_polyphonic
from linmem.models import build_model
from linmem.rnns import as_torch
from linmem.train import train_step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def frames_per_second(step, frames: int, min_time: float, device: torch.device) -> float:
    """Run ``step`` twice to warm up, then for at least ``min_time`` seconds, waiting for the
    device's queued work before reading the clock."""
    step()
    step()
    _sync(device)
    n, t0 = 0, time.perf_counter()
    while True:
        step()
        n += 1
        _sync(device)
        elapsed = time.perf_counter() - t0
        if elapsed >= min_time and n >= 2:
            return frames * n / elapsed


def measure(model: nn.Module, batch, min_time: float, device: torch.device
            ) -> tuple[float, float]:
    """(training, inference) frames per second of ``model`` on ``batch``, both on ``device``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    frames = int(batch.mask.sum())
    train = frames_per_second(lambda: train_step(model, optimizer, batch), frames, min_time,
                              device)

    def infer():
        with torch.inference_mode():
            model(batch.inputs)

    return train, frames_per_second(infer, frames, min_time, device)


def _one_thread(fn, *args):
    """``fn(*args)`` with torch on one CPU thread (the searches' setting), the count restored."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def _epoch(model: nn.Module, batches: list, device: torch.device) -> float:
    """Seconds of one pass of Adam steps over ``batches`` (already on ``device``)."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    _sync(device)
    t0 = time.perf_counter()
    for b in batches:
        train_step(model, optimizer, b, clip=5.0)
    _sync(device)
    return time.perf_counter() - t0


def bench_sizes(args, device: torch.device) -> list[dict]:
    cpu = torch.device("cpu")
    rows = []
    for size in args.sizes:
        f, m = (int(v) for v in size.split("x"))
        for batch_size in args.batches:
            batch = random_batch(batch_size, args.steps)
            torch.manual_seed(0)
            lmn = build_model("lmn-b", f, m)
            models = {"lmn": (lmn.to(device), device),
                      "naive-loop": (NaiveLMN(lmn).to(device), device),
                      **{name: (model.to(device), device)  # cuDNN's on CUDA
                         for name, model in torch_rnns(f + m).items()}}
            models["lmn-cpu"] = (build_model("lmn-b", f, m), cpu)
            runs = {name: [] for name in models}
            for _ in range(args.rounds):  # interleaved rounds: drift hits every model alike
                for name, (model, where) in models.items():
                    timing = (model, batch.to(where), args.min_time, where)
                    runs[name].append(_one_thread(measure, *timing) if where.type == "cpu"
                                      else measure(*timing))
            row = {"functional": f, "memory": m, "batch": batch_size, "steps": args.steps,
                   **median_rates(runs)}
            for mode in ("train", "infer"):
                fps = row[f"lmn_{mode}_fps"]
                for other in ("lstm", "naive-loop", "lmn-cpu"):
                    row[f"{mode}_vs_{other}"] = fps / row[f"{other}_{mode}_fps"]
            rows.append(row)
            print_row(row, device)
    return rows


def print_row(r: dict, device: torch.device) -> None:
    k = 1e3
    print(f"LMN ({r['functional']},{r['memory']}) batch {r['batch']}, {r['steps']} steps:",
          flush=True)
    for mode in ("train", "infer"):
        print(f"  {mode}: on {device.type}: lmn {r[f'lmn_{mode}_fps'] / k:8.1f}k  naive loop "
              f"{r[f'naive-loop_{mode}_fps'] / k:7.1f}k  rnn {r[f'rnn_{mode}_fps'] / k:7.1f}k  "
              f"lstm {r[f'lstm_{mode}_fps'] / k:7.1f}k  gru {r[f'gru_{mode}_fps'] / k:7.1f}k | "
              f"on one CPU thread: lmn {r[f'lmn-cpu_{mode}_fps'] / k:7.1f}k frames/s | "
              f"lmn/lstm {r[f'{mode}_vs_lstm']:.2f}x  lmn/naive {r[f'{mode}_vs_naive-loop']:.2f}x"
              f"  lmn {device.type}/cpu {r[f'{mode}_vs_lmn-cpu']:.2f}x", flush=True)


def bench_epochs(args, device: torch.device) -> list[dict]:
    """One training epoch with the trainer's batching (length buckets, padding)."""
    f, m = (int(v) for v in args.epoch_size.split("x"))
    cpu = torch.device("cpu")
    rows = []
    for name in args.epochs:
        data = load_polyphonic(name, root=args.data_dir, progress=False)
        for batch_size in args.epoch_batches:
            row, padded = epoch_batches(data, name, batch_size, args.data_dir)
            row.update(functional=f, memory=m)
            for label, model_name, size, where in (("lmn-b", "lmn-b", (f, m), device),
                                                   ("lstm", "lstm", (f + m, None), device),
                                                   ("lmn-b-cpu", "lmn-b", (f, m), cpu)):
                torch.manual_seed(0)
                model = build_model(model_name, *size)
                if model_name == "lstm":
                    model.core = as_torch(model.core)
                timing = (model.to(where), [b.to(where) for b in padded], where)
                seconds = (_one_thread(_epoch, *timing) if where.type == "cpu"
                           else _epoch(*timing))
                row[f"{label}_epoch_s"] = seconds
                row[f"{label}_train_fps"] = row["frames"] / seconds
            row["lmn_vs_lstm"] = row["lmn-b_train_fps"] / row["lstm_train_fps"]
            row["lmn_device_vs_cpu"] = row["lmn-b_train_fps"] / row["lmn-b-cpu_train_fps"]
            rows.append(row)
            print(f"epoch on {name} ({row['frames']} frames, batch {batch_size}, "
                  f"{row['batches']} batches): on {device.type}: LMN-B({f},{m}) "
                  f"{row['lmn-b_epoch_s']:.1f}s, LSTM({f + m}) {row['lstm_epoch_s']:.1f}s; "
                  f"LMN-B on one CPU thread {row['lmn-b-cpu_epoch_s']:.1f}s | lmn/lstm "
                  f"{row['lmn_vs_lstm']:.2f}x  lmn {device.type}/cpu "
                  f"{row['lmn_device_vs_cpu']:.2f}x", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N (cpu: a smoke test)")
    p.add_argument("--sizes", nargs="+", default=["50x50", "100x100", "250x250", "250x500"])
    p.add_argument("--batches", nargs="+", type=int, default=[4, 32, 128])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; median reported")
    p.add_argument("--min-time", type=float, default=0.3, help="seconds per measurement")
    p.add_argument("--epochs", nargs="*", default=["jsb", "nottingham", "musedata"],
                   help="data sets to time a training epoch on (none to skip)")
    p.add_argument("--epoch-size", default="250x250")
    p.add_argument("--epoch-batches", nargs="+", type=int, default=[4, 32],
                   help="batch sizes of the epochs (the trainer's default is 4)")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    try:
        device = check_device(args.device)
    except ValueError as err:
        sys.exit(f"cuda_throughput.py: {err} (--device cpu runs it as a smoke test)")
    started = time.perf_counter()
    commit = git_commit()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    print(f"device: {gpu or device}; torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}", flush=True)
    sizes = bench_sizes(args, device)
    epochs = bench_epochs(args, device) if args.epochs else []
    if args.json:
        checksums = {row["dataset"]: row["data_sha256"] for row in epochs} or None
        write_json(args.json, {
            **provenance(command_line(), commit, 0, checksums, time.perf_counter() - started,
                         device),
            "sizes": sizes, "epochs": epochs,
            "units": "frames per second; a frame is one time step of one sequence",
        })
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
