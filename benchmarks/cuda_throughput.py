"""The LMN on a GPU against cuDNN's RNNs and against the LMN on the same machine's CPU.

Side by side in one run, on random piano-roll-like sequences of ``--steps`` steps, frames per
second of training (forward, masked next-step NLL, backward, Adam step) and of inference for

- ``lmn``: the LMN-B predictor on ``--device`` on the path ``linmem.ops.paths.gpu_kernel_path``
  chooses (measured on first use: the fused kernels or the loop);
- ``lmn-fused``: the same with the recurrence forced onto the fused Triton kernels
  (``linmem.ops.gpu``: one launch for the forward over all steps, one for the backward);
- ``lmn-loop``: forced onto the PyTorch loop of the ``linmem::lmn_scan`` operator (one small
  kernel launch per product and step);
- ``naive-loop`` (``--naive``): the straightforward per-step autograd loop
  (``throughput.NaiveLMN``), on the same device;
- ``rnn``, ``lstm``, ``gru``: ``torch.nn.RNN``/``LSTM``/``GRU`` (cuDNN's fused kernels on
  CUDA) with ``hidden = functional + memory``;
- ``lmn-cpu``: the LMN-B on this machine's CPU with one thread (the compiled kernel, the
  setting of the project's searches: a run per core), at batches up to ``--cpu-max-batch``.

``--epochs`` then times one training epoch on real data sets with the trainer's batching (batch
1 is the paper's protocol, 4 ours), for LMN-B and cuDNN's LSTM on the device, and for both on one
CPU thread over the first ``--cpu-frames`` frames of the epoch (scaled to the epoch). From those,
``--progress`` files (``linmem progress`` tables) give each LMN-B and LSTM study of those data
sets a projected wall time on this GPU: its CPU hours times the GPU's epoch time over one CPU
thread's, at the batch of the study's protocol (the CPU hours were logged on the search
machines, the ratio is this machine's CPU: an estimate, labelled as one).

    python benchmarks/cuda_throughput.py --json results/cuda/fused.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
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
from linmem.nn.rnns import as_torch
from linmem.ops import gpu as ops_gpu
from linmem.ops import paths as ops_paths
from linmem.training.updates import train_step


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


def _path(name: str):
    """The ``with`` block of a model's recurrence path: forced fused, forced loop, or chosen."""
    if name.endswith("-fused"):
        return ops_paths.use_gpu_kernel(True)
    if name.endswith("-loop") and not name.startswith("naive"):
        return ops_paths.use_gpu_kernel(False)
    return contextlib.nullcontext()


def measure(model: nn.Module, batch, min_time: float, device: torch.device, name: str = ""
            ) -> tuple[float, float]:
    """(training, inference) frames per second of ``model`` on ``batch``, both on ``device``,
    on the recurrence path ``name`` asks for (:func:`_path`)."""
    with _path(name):
        return _measure(model, batch, min_time, device)


def _measure(model: nn.Module, batch, min_time: float, device: torch.device
             ) -> tuple[float, float]:
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


LMN_PATHS = ("lmn", "lmn-fused", "lmn-loop")


def bench_sizes(args, device: torch.device) -> list[dict]:
    cpu = torch.device("cpu")
    rows = []
    for size in args.sizes:
        f, m = (int(v) for v in size.split("x"))
        for batch_size in args.batches:
            batch = random_batch(batch_size, args.steps)
            models = {}
            for name in LMN_PATHS:
                torch.manual_seed(0)
                models[name] = (build_model("lmn-b", f, m, memory_bound=None).to(device), device)
            if args.naive:
                models["naive-loop"] = (NaiveLMN(models["lmn"][0]).to(device), device)
            models.update({name: (model.to(device), device)  # cuDNN's on CUDA
                           for name, model in torch_rnns(f + m).items()})
            if batch_size <= args.cpu_max_batch:
                models["lmn-cpu"] = (build_model("lmn-b", f, m, memory_bound=None), cpu)
            runs = {name: [] for name in models}
            for _ in range(args.rounds):  # interleaved rounds: drift hits every model alike
                for name, (model, where) in models.items():
                    timing = (model, batch.to(where), args.min_time, where, name)
                    runs[name].append(_one_thread(measure, *timing) if where.type == "cpu"
                                      else measure(*timing))
            row = {"functional": f, "memory": m, "batch": batch_size, "steps": args.steps,
                   **median_rates(runs)}
            if device.type == "cuda":
                probe = torch.empty(args.steps, batch_size, f, device=device)
                row["chosen_path"] = ops_paths.gpu_kernel_path(probe, m)
            for mode in ("train", "infer"):
                for lmn in LMN_PATHS:
                    for other in ("lstm", "gru", "lmn-loop", "lmn-cpu"):
                        if other != lmn and f"{other}_{mode}_fps" in row:
                            row[f"{lmn}_{mode}_vs_{other}"] = (row[f"{lmn}_{mode}_fps"]
                                                               / row[f"{other}_{mode}_fps"])
            rows.append(row)
            print_row(row, device)
    return rows


def print_row(r: dict, device: torch.device) -> None:
    k = 1e3
    print(f"LMN ({r['functional']},{r['memory']}) batch {r['batch']}, {r['steps']} steps"
          f"{', chosen path: ' + r['chosen_path'] if 'chosen_path' in r else ''}:", flush=True)
    for mode in ("train", "infer"):
        rates = "  ".join(f"{name} {r[f'{name}_{mode}_fps'] / k:.1f}k"
                          for name in ("lmn", "lmn-fused", "lmn-loop", "naive-loop", "rnn",
                                       "lstm", "gru", "lmn-cpu")
                          if f"{name}_{mode}_fps" in r)
        ratios = "  ".join(f"{a}/{b} {r[f'{a}_{mode}_vs_{b}']:.2f}x"
                           for a, b in (("lmn-fused", "lstm"), ("lmn-fused", "lmn-loop"),
                                        ("lmn", "lstm"), ("lmn", "lmn-loop"), ("lmn", "lmn-cpu"))
                           if f"{a}_{mode}_vs_{b}" in r)
        print(f"  {mode} (frames/s; lmn-cpu: one CPU thread): {rates} | {ratios}", flush=True)


def bench_tiles(args, device: torch.device) -> list[dict]:
    """The fused kernels' training rate at each size and batch under each of ``--tile-sweep``'s
    tilings (``LINMEM_GPU_TILES``: ``BLOCK_B,BLOCK_N,BLOCK_K,dot[,warps]``; ``auto`` the default
    choice, ``linmem.ops.gpu.tiles``): the data to tune that choice on a GPU."""
    rows = []
    for size in args.sizes:
        f, m = (int(v) for v in size.split("x"))
        for batch_size in args.batches:
            batch = random_batch(batch_size, args.steps)
            row = {"functional": f, "memory": m, "batch": batch_size, "steps": args.steps,
                   "default": ops_gpu.tiles(batch_size, f, m,
                                              ops_gpu._multiprocessors(device))}
            for tiles in args.tile_sweep:
                torch.manual_seed(0)
                model = build_model("lmn-b", f, m, memory_bound=None).to(device)
                with _tiles(tiles):
                    rate, _ = measure(model, batch.to(device), args.min_time, device, "lmn-fused")
                row[f"train_fps[{tiles}]"] = rate
            rows.append(row)
            print(f"tiles, LMN ({f},{m}) batch {batch_size}: " + "  ".join(
                f"{t} {row[f'train_fps[{t}]'] / 1e3:.1f}k" for t in args.tile_sweep), flush=True)
    return rows


@contextlib.contextmanager
def _tiles(tiles: str):
    """``LINMEM_GPU_TILES`` set to ``tiles`` inside the block (``auto``: unset)."""
    previous = os.environ.pop("LINMEM_GPU_TILES", None)
    if tiles != "auto":
        os.environ["LINMEM_GPU_TILES"] = tiles
    try:
        yield
    finally:
        os.environ.pop("LINMEM_GPU_TILES", None)
        if previous is not None:
            os.environ["LINMEM_GPU_TILES"] = previous


def _cpu_epoch(model: nn.Module, batches: list, frames: int, limit: int) -> float:
    """Seconds of one epoch on one CPU thread, timed over the first batches up to ``limit``
    frames and scaled to the epoch's ``frames``."""
    head, counted = [], 0
    for b in batches:
        head.append(b)
        counted += int(b.mask.sum())
        if counted >= limit:
            break
    return _one_thread(_epoch, model, head, torch.device("cpu")) * frames / counted


def bench_epochs(args, device: torch.device) -> list[dict]:
    """One training epoch with the trainer's batching (length buckets, padding)."""
    f, m = (int(v) for v in args.epoch_size.split("x"))
    rows = []
    for name in args.epochs:
        data = load_polyphonic(name, root=args.data_dir, progress=False)
        for batch_size in args.epoch_batches:
            row, padded = epoch_batches(data, name, batch_size, args.data_dir)
            row.update(functional=f, memory=m)
            labels = [("lmn-b", "lmn-b", (f, m), device), ("lstm", "lstm", (f + m, None), device)]
            if args.epoch_loop:
                labels.append(("lmn-b-loop", "lmn-b", (f, m), device))
            labels += [("lmn-b-cpu", "lmn-b", (f, m), None), ("lstm-cpu", "lstm", (f + m, None),
                                                               None)]
            for label, model_name, size, where in labels:
                torch.manual_seed(0)
                model = build_model(model_name, *size)
                if where is None:  # our kernels on one CPU thread, as the searches ran
                    seconds = _cpu_epoch(model, padded, row["frames"], args.cpu_frames)
                else:
                    if model_name == "lstm":
                        model.core = as_torch(model.core)  # cuDNN's
                    with _path(label):
                        seconds = _epoch(model.to(where), [b.to(where) for b in padded], where)
                row[f"{label}_epoch_s"] = seconds
                row[f"{label}_train_fps"] = row["frames"] / seconds
            row["lmn_vs_lstm"] = row["lmn-b_train_fps"] / row["lstm_train_fps"]
            row["lmn_device_vs_cpu"] = row["lmn-b_train_fps"] / row["lmn-b-cpu_train_fps"]
            rows.append(row)
            loop = (f", loop {row['lmn-b-loop_epoch_s']:.1f}s" if "lmn-b-loop_epoch_s" in row
                    else "")
            print(f"epoch on {name} ({row['frames']} frames, batch {batch_size}, "
                  f"{row['batches']} batches): on {device.type}: LMN-B({f},{m}) "
                  f"{row['lmn-b_epoch_s']:.1f}s{loop}, LSTM({f + m}) {row['lstm_epoch_s']:.1f}s;"
                  f" on one CPU thread: LMN-B {row['lmn-b-cpu_epoch_s']:.1f}s, LSTM "
                  f"{row['lstm-cpu_epoch_s']:.1f}s (from {args.cpu_frames} frames) | lmn/lstm "
                  f"{row['lmn_vs_lstm']:.2f}x  lmn {device.type}/cpu "
                  f"{row['lmn_device_vs_cpu']:.2f}x", flush=True)
    return rows


_STUDY = re.compile(r"^\| (?P<data>[a-z]+)-(?P<model>lmn-b|lstm)-(?P<grid>[a-z]+)"
                    r"(?P<protocol>@paper)?(?: \([^|]*\))? \| (?P<done>\d+) / (?P<points>\d+) "
                    r"\|[^|]*\|[^|]*\| (?P<cpu_h>[0-9.]+) \|")


def project_studies(progress_files: list[str], epochs: list[dict]) -> list[dict]:
    """Each LMN-B and LSTM study of the timed data sets in ``progress_files``: its CPU hours and
    the projected wall hours on this GPU (CPU hours x GPU epoch / one CPU thread's epoch, at
    the batch of its protocol: 1 under ``@paper``, else 4)."""
    ratio = {}
    for row in epochs:
        for model, gpu, cpu in (("lmn-b", "lmn-b", "lmn-b-cpu"), ("lstm", "lstm", "lstm-cpu")):
            ratio[row["dataset"], model, row["batch"]] = (row[f"{gpu}_epoch_s"]
                                                          / row[f"{cpu}_epoch_s"])
    out = []
    for path in progress_files:
        for line in Path(path).read_text().splitlines():
            match = _STUDY.match(line)
            if not match:
                continue
            batch = 1 if match["protocol"] else 4
            key = (match["data"], match["model"], batch)
            if key not in ratio:
                continue
            cpu_h = float(match["cpu_h"])
            out.append({"study": line.split("|")[1].strip(), "file": path, "batch": batch,
                        "cpu_hours": cpu_h, "gpu_over_cpu_epoch": ratio[key],
                        "projected_gpu_hours": cpu_h * ratio[key]})
            print(f"{out[-1]['study']}: {cpu_h:.2f} CPU h -> about "
                  f"{out[-1]['projected_gpu_hours']:.2f} h on this GPU (batch {batch})",
                  flush=True)
    return out


def ops_gpu_tiles(batch: int, size: str, device: torch.device) -> dict:
    """The tiling the fused kernels take at this batch and size on ``device`` (its SMs)."""
    f, m = (int(v) for v in size.split("x"))
    return ops_gpu.tiles(batch, f, m, ops_gpu._multiprocessors(device))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", help="cuda, cuda:N (cpu: a smoke test)")
    p.add_argument("--sizes", nargs="*", default=["50x50", "100x100", "250x250", "250x500"])
    p.add_argument("--batches", nargs="+", type=int, default=[1, 4, 32, 128, 512])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds; median reported")
    p.add_argument("--min-time", type=float, default=0.2, help="seconds per measurement")
    p.add_argument("--naive", action="store_true", help="add the per-step autograd loop")
    p.add_argument("--tile-sweep", nargs="*", default=[], metavar="B,N,K,DOT",
                   help="also time the fused kernels under these tilings (and 'auto')")
    p.add_argument("--tiles-only", action="store_true",
                   help="with --tile-sweep: time the tilings alone, not the table of columns")
    p.add_argument("--cpu-max-batch", type=int, default=32,
                   help="the largest batch timed on one CPU thread")
    p.add_argument("--epochs", nargs="*", default=["nottingham", "musedata"],
                   help="data sets to time a training epoch on (none to skip)")
    p.add_argument("--epoch-size", default="250x250")
    p.add_argument("--epoch-batches", nargs="+", type=int, default=[1, 4, 32],
                   help="batch sizes of the epochs (1: the paper's protocol; 4: ours)")
    p.add_argument("--epoch-loop", action="store_true",
                   help="also time the epochs with the LMN's recurrence on the loop")
    p.add_argument("--cpu-frames", type=int, default=20000,
                   help="frames of an epoch timed on one CPU thread (scaled to the epoch)")
    p.add_argument("--progress", nargs="*", default=["results/progress.md",
                                                     "results/paper-protocol/progress.md"],
                   help="linmem progress tables whose studies get a projected GPU time")
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
    triton = ops_gpu._triton()
    print(f"device: {gpu or device}; torch {torch.__version__}, cuDNN "
          f"{torch.backends.cudnn.version()}, Triton "
          f"{triton[0].__version__ if triton else 'not installed'}", flush=True)
    sizes = bench_sizes(args, device) if args.sizes and not args.tiles_only else []
    tile_rows = bench_tiles(args, device) if args.tile_sweep and args.sizes else []
    epochs = bench_epochs(args, device) if args.epochs else []
    studies = project_studies(args.progress, epochs) if epochs else []
    if args.json:
        checksums = {row["dataset"]: row["data_sha256"] for row in epochs} or None
        write_json(args.json, {
            **provenance(command_line(), commit, 0, checksums, time.perf_counter() - started,
                         device),
            "gpu_kernel_tiles": {f"{b}x{s}": ops_gpu_tiles(b, s, device) for s in args.sizes
                                 for b in args.batches} if args.sizes else {},
            "sizes": sizes, "tiles": tile_rows, "epochs": epochs, "projected_studies": studies,
            "units": "frames per second; a frame is one time step of one sequence",
        })
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
