"""Throughput of the LMN against torch's fused RNNs, side by side in one run (issue 6).

For every LMN size (functional, memory) and batch size, on random piano-roll-like sequences of
``--steps`` steps, this measures frames per second of

- training: forward, masked next-step NLL, backward, Adam step
(``linmem.training.updates.train_step`` with the trainer's optimizer, ``make_optimizer``);
- inference: forward under ``torch.inference_mode``;

for the LMN-B predictor (the library's default fast path: on CPU the compiled kernel of
``csrc/lmn_cpu.cpp``), the same layer with the kernel switched off (the recurrence as a PyTorch
loop in a custom autograd function, ``use_cpu_kernel(False)``), the LMN written as the
straightforward per-step autograd loop (the reference it must equal), and ``torch.nn.RNN``,
``LSTM`` and ``GRU`` themselves (not ``linmem.nn.rnns``' faster ones: ``linmem.nn.rnns.as_torch``)
with ``hidden = functional + memory``, all with the same 88-key readout.

The GEMM bound of an LMN-B is the measured rate of a large float32 matrix product divided by its
floating-point work per frame: forward ``2 (x f + m f + f m + m m + m K)`` (input, memory-to-
functional, functional-to-memory, memory-to-memory and readout products, K = 88 keys), training
three times that (forward, gradients of activations, gradients of weights). A second, tighter
bound uses the rate measured for the recurrent product's own shape ``(B, m) @ (m, f + m)``,
which small batches cannot push to the large-product rate. Both bounds are rates of torch's BLAS
(MKL on the project's machine), not of the hardware: the kernel's own products can run faster,
so the rate of the kernel's recurrence alone (no input or readout products) is printed beside
them. At batch 1 a step reads each recurrent weight once and uses it for one multiply-add, so
the third bound is the cache's: the rate at which one core streams the step's weights
(``W^mh``, ``W^mm``, ``W^hm``: 750 KB at (250, 250)) through the kernel's vector loads,
measured in the same run; a forward step cannot take less than their size over that rate, a
training step (forward and backward loops) twice that.

``--epochs`` then times whole training epochs on real data sets with the trainer's batching
(length buckets, padding) and prints the padding fraction. ``--profile`` prints where a training
step's time goes, for the straightforward loop and for the fast path.

    python benchmarks/throughput.py --json results/speed/throughput.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.batching import Batch, bucket_batches, collate, padding_fraction
from linmem.data import N_KEYS, data_checksum, load_polyphonic
from linmem.metrics import masked_nll
from linmem.models import build_model
from linmem.nn.lmn import lmn_recurrence
from linmem.nn.rnns import as_torch
from linmem.ops.cpu import KERNEL_ENV, cpu_path, kernel_variants, load_cpu_kernel
from linmem.ops.paths import measure_cpu_paths, use_cpu_kernel
from linmem.training.config import TrainConfig
from linmem.training.updates import make_optimizer, train_step

# what limits torch's own libraries to an instruction set (MKL, oneDNN): with
# LINMEM_CPU_KERNEL=avx2 they make an AVX-512 machine stand in for an AVX2 one, LSTM included
ISA_VARIABLES = ("MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", KERNEL_ENV)


class _Wrapped(nn.Module):
    """A predictor's forward pass replaced (below); trained on the same NLL as the model."""

    def training_loss(self, batch: Batch) -> torch.Tensor:
        return masked_nll(self(batch.inputs), batch.targets, batch.mask)


class NaiveLMN(_Wrapped):
    """The LMN-B predictor as a straightforward autograd loop: every term of eqs. (6)-(7) is its
    own operation at every step. Shares the parameters of ``model``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        w = self.model.core.layer_weights(0)
        m = inputs.new_zeros(inputs.shape[0], w["weight_mm"].shape[0])
        ms = []
        for t in range(inputs.shape[1]):
            h = torch.tanh(inputs[:, t] @ w["weight_xh"].t() + m @ w["weight_mh"].t()
                           + w["bias_h"])
            m = h @ w["weight_hm"].t() + m @ w["weight_mm"].t() + w["bias_m"]
            ms.append(m)
        return self.model.readout(torch.stack(ms, 1))


class PathLMN(_Wrapped):
    """``model`` with its recurrence forced onto one CPU path: a variant of the compiled kernel
    (``"avx2"``, ...) or, with ``False``, the PyTorch loop of the ``linmem::lmn_scan``
    operator (``linmem.ops.lmn``; forward and backward). Shares the parameters."""

    def __init__(self, model: nn.Module, path: str | bool):
        super().__init__()
        self.model, self.path = model, path

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        with use_cpu_kernel(self.path):
            return self.model(inputs)


def recurrence_rate(f: int, m: int, batch: int, steps: int, kernel: bool | str,
                    min_time: float) -> float:
    """FLOP/s of the recurrence alone (eqs. 6-7 given ``W^xh x_t + b^h``), inference."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(steps, batch, f, generator=g)
    weights = [torch.randn(*s, generator=g) * 0.05 for s in ((f, m), (m, f), (m, m))]
    m0, bias = torch.zeros(batch, m), torch.zeros(m)

    def run():
        with use_cpu_kernel(kernel), torch.inference_mode():
            lmn_recurrence(x, m0, *weights, bias)

    fps = frames_per_second(run, steps * batch, min_time)
    return fps * 2 * (m * f + f * m + m * m)


def lmn_flops_per_frame(f: int, m: int, x: int = N_KEYS, keys: int = N_KEYS) -> int:
    """Forward floating-point operations per frame of an LMN-B predictor (multiply-adds x 2)."""
    return 2 * (x * f + m * f + f * m + m * m + m * keys)


def gemm_rate(rows: int, inner: int, cols: int, min_time: float = 0.5) -> float:
    """FLOP/s of ``(rows, inner) @ (inner, cols)`` in float32, best of repeated timings."""
    a, b = torch.rand(rows, inner), torch.rand(inner, cols)
    out = torch.empty(rows, cols)
    torch.mm(a, b, out=out)
    best = 0.0
    for _ in range(3):
        n, t0 = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - t0) < min_time / 3:
            torch.mm(a, b, out=out)
            n += 1
        best = max(best, 2 * rows * inner * cols * n / elapsed)
    return best


def step_weight_bytes(f: int, m: int) -> int:
    """Bytes of float32 weights one step of the recurrence reads, forward (``W^mh``, ``W^mm``,
    ``W^hm``) and again backward (their transposes' products): at batch 1 each once per step."""
    return 4 * (m * f + m * m + f * m)


def stream_rate(n_bytes: int, variant: str, min_time: float) -> float:
    """Bytes per second at which one core streams ``n_bytes`` (a step's weights, so from the cache
    level they fit in) through ``variant``'s vector loads (the kernel's ``stream_read``), best of
    three timings."""
    kernel = load_cpu_kernel()
    data = torch.full((n_bytes // 4,), 1e-3)
    kernel.stream_read(data, 10, variant)
    best, repeats = 0.0, 64
    for _ in range(3):
        while True:
            t0 = time.perf_counter()
            kernel.stream_read(data, repeats, variant)
            elapsed = time.perf_counter() - t0
            if elapsed >= min_time / 3:
                break
            repeats *= 2
        best = max(best, data.numel() * 4 * repeats / elapsed)
    return best


def trainer_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    """The optimizer ``linmem train`` makes (Adam at 1e-3, fused where the parameters allow),
    without weight decay: every model is timed with what a run would update it with."""
    return make_optimizer(model.parameters(), TrainConfig(weight_decay=0.0))


def random_batch(batch: int, steps: int, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    rolls = [(rng.random((steps + 1, N_KEYS)) < 0.05).astype(np.float32) for _ in range(batch)]
    return collate(rolls)


def frames_per_second(step, frames: int, min_time: float) -> float:
    """Run ``step`` twice to warm up, then for at least ``min_time`` seconds."""
    step()
    step()
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_time or n < 2:
        step()
        n += 1
    return frames * n / elapsed


def measure(model: nn.Module, batch: Batch, min_time: float) -> tuple[float, float]:
    """(training, inference) frames per second of ``model`` on ``batch``."""
    optimizer = trainer_optimizer(model)
    frames = int(batch.mask.sum())
    train = frames_per_second(lambda: train_step(model, optimizer, batch), frames, min_time)

    def infer():
        with torch.inference_mode():
            model(batch.inputs)

    return train, frames_per_second(infer, frames, min_time)


def torch_rnns(hidden: int) -> dict[str, nn.Module]:
    """Predictors on ``torch.nn.RNN``, ``LSTM`` and ``GRU`` themselves (not ``linmem.nn.rnns``'
    faster ones: :func:`linmem.nn.rnns.as_torch`) of ``hidden`` units, with the 88-key readout."""
    models = {}
    for name in ("rnn", "lstm", "gru"):
        models[name] = build_model(name, hidden)
        models[name].core = as_torch(models[name].core)
    return models


def median_rates(runs: dict[str, list[tuple[float, float]]]) -> dict[str, float]:
    """``NAME_train_fps`` and ``NAME_infer_fps``: each model's median over the rounds."""
    return {f"{name}_{mode}_fps": statistics.median(v[i] for v in values)
            for name, values in runs.items() for i, mode in enumerate(("train", "infer"))}


def bench_sizes(args) -> list[dict]:
    rows = []
    for size in args.sizes:
        f, m = (int(v) for v in size.split("x"))
        for batch_size in args.batches:
            batch = random_batch(batch_size, args.steps)
            torch.manual_seed(0)
            lmn = build_model("lmn-b", f, m, memory_bound=None)
            models = {"lmn": lmn, **{f"lmn-{v}": PathLMN(lmn, v) for v in args.variants},
                      "torch-loop": PathLMN(lmn, False), "naive-loop": NaiveLMN(lmn),
                      **torch_rnns(f + m)}
            runs = {name: [] for name in models}
            for _ in range(args.rounds):  # interleaved rounds: drift hits every model alike
                for name, model in models.items():
                    runs[name].append(measure(model, batch, args.min_time))
            flops = lmn_flops_per_frame(f, m)
            small = gemm_rate(batch_size, m, f + m, args.min_time)
            row = {"functional": f, "memory": m, "batch": batch_size, "steps": args.steps,
                   "path": args.path, "variants": args.variants,
                   "flops_per_frame_forward": flops, "small_gemm_gflops": small / 1e9}
            default = False if args.path == "loop" else args.path
            for label, on in (("kernel", default), ("torch_loop", False)):
                rate = recurrence_rate(f, m, batch_size, args.steps, on, args.min_time)
                row[f"recurrence_{label}_gflops"] = rate / 1e9
            row.update(median_rates(runs))
            if batch_size == 1 and args.stream_variant is not None:
                # at batch 1 a step streams its weights once (forward; training twice): the
                # loop cannot run faster than the cache delivers them
                n_bytes = step_weight_bytes(f, m)
                rate = stream_rate(n_bytes, args.stream_variant, args.min_time)
                row["stream_gbytes_per_s"], row["stream_variant"] = rate / 1e9, args.stream_variant
                row["infer_stream_bound_fps"] = rate / n_bytes
                row["train_stream_bound_fps"] = rate / (2 * n_bytes)
            row["train_bound_fps"] = args.gemm_rate / (3 * flops)
            row["infer_bound_fps"] = args.gemm_rate / flops
            row["train_small_bound_fps"] = small / (3 * flops)
            row["infer_small_bound_fps"] = small / flops
            for mode in ("train", "infer"):
                fps = row[f"lmn_{mode}_fps"]
                row[f"{mode}_vs_lstm"] = fps / row[f"lstm_{mode}_fps"]
                row[f"{mode}_vs_naive"] = fps / row[f"naive-loop_{mode}_fps"]
                row[f"{mode}_vs_torch_loop"] = fps / row[f"torch-loop_{mode}_fps"]
                row[f"{mode}_of_bound"] = fps / row[f"{mode}_bound_fps"]
                row[f"{mode}_of_small_bound"] = fps / row[f"{mode}_small_bound_fps"]
                if f"{mode}_stream_bound_fps" in row:
                    row[f"{mode}_of_stream_bound"] = fps / row[f"{mode}_stream_bound_fps"]
                    for v in args.variants:
                        row[f"{mode}_{v}_of_stream_bound"] = (row[f"lmn-{v}_{mode}_fps"]
                                                             / row[f"{mode}_stream_bound_fps"])
                for v in args.variants:
                    variant_fps = row[f"lmn-{v}_{mode}_fps"]
                    row[f"{mode}_{v}_vs_lstm"] = variant_fps / row[f"lstm_{mode}_fps"]
                    row[f"{mode}_{v}_vs_torch_loop"] = variant_fps / row[f"torch-loop_{mode}_fps"]
            rows.append(row)
            print_row(row)
    return rows


def print_row(r: dict) -> None:
    k = 1e3
    print(f"LMN ({r['functional']},{r['memory']}) batch {r['batch']}: small-GEMM rate "
          f"{r['small_gemm_gflops']:.0f} GFLOP/s (torch.mm); recurrence alone "
          f"{r['recurrence_kernel_gflops']:.0f} GFLOP/s (kernel), "
          f"{r['recurrence_torch_loop_gflops']:.0f} GFLOP/s (torch loop)")
    if "stream_gbytes_per_s" in r:
        print(f"  streaming the step's {step_weight_bytes(r['functional'], r['memory']) / 1024:.0f}"
              f" KB of weights ({r['stream_variant']} loads): {r['stream_gbytes_per_s']:.1f} GB/s,"
              f" {1e6 / r['infer_stream_bound_fps']:.2f} us a forward step; bound "
              f"{r['infer_stream_bound_fps'] / k:.0f}k frames/s inference, "
              f"{r['train_stream_bound_fps'] / k:.0f}k training (the loops alone)")
    for mode, label in (("train", "train"), ("infer", "infer")):
        stream = (f"  of streaming bound {100 * r[f'{mode}_of_stream_bound']:.0f}%"
                  if f"{mode}_of_stream_bound" in r else "")
        print(f"  {label}: lmn {r[f'lmn_{mode}_fps'] / k:7.1f}k  torch loop "
              f"{r[f'torch-loop_{mode}_fps'] / k:6.1f}k  naive loop "
              f"{r[f'naive-loop_{mode}_fps'] / k:6.1f}k  rnn {r[f'rnn_{mode}_fps'] / k:6.1f}k  "
              f"lstm {r[f'lstm_{mode}_fps'] / k:6.1f}k  gru {r[f'gru_{mode}_fps'] / k:6.1f}k "
              f"frames/s | lmn/lstm {r[f'{mode}_vs_lstm']:.2f}x  lmn/torch-loop "
              f"{r[f'{mode}_vs_torch_loop']:.2f}x  lmn/naive "
              f"{r[f'{mode}_vs_naive']:.2f}x  of GEMM bound {100 * r[f'{mode}_of_bound']:.0f}% "
              f"({r[f'{mode}_bound_fps'] / k:.0f}k)  of small-GEMM bound "
              f"{100 * r[f'{mode}_of_small_bound']:.0f}% ({r[f'{mode}_small_bound_fps'] / k:.0f}k)"
              f"{stream}", flush=True)
        for v in r["variants"]:
            of = r.get(f"{mode}_{v}_of_stream_bound")
            print(f"    {label} variant {v}: {r[f'lmn-{v}_{mode}_fps'] / k:7.1f}k frames/s | "
                  f"/lstm {r[f'{mode}_{v}_vs_lstm']:.2f}x  /torch-loop "
                  f"{r[f'{mode}_{v}_vs_torch_loop']:.2f}x"
                  + (f"  of streaming bound {100 * of:.0f}%" if of is not None else ""),
                  flush=True)


def epoch_batches(data: dict, name: str, batch_size: int, data_dir: str | None
                  ) -> tuple[dict, list[Batch]]:
    """The training split of ``name`` in the trainer's batches (length buckets, padded) of
    ``batch_size`` sequences, with the row that describes them (frames, batches, padding,
    the data's checksum)."""
    seqs = [s for s in data["train"] if len(s) >= 2]
    lengths = [len(s) - 1 for s in seqs]
    batches = bucket_batches(lengths, batch_size, shuffle=True, seed=1)
    row = {"dataset": name, "batch": batch_size, "frames": int(sum(lengths)),
           "batches": len(batches), "padding_fraction": padding_fraction(lengths, batches),
           "data_sha256": data_checksum(name, data_dir)}
    return row, [collate([seqs[i] for i in idx]) for idx in batches]


def bench_epochs(args) -> list[dict]:
    """One training epoch with the trainer's batching, LMN-B against LSTM(f + m)."""
    f, m = (int(v) for v in args.epoch_size.split("x"))
    rows = []
    for name in args.epochs:
        data = load_polyphonic(name, root=args.data_dir, progress=False)
        for batch_size in args.batches:
            row, padded = epoch_batches(data, name, batch_size, args.data_dir)
            row.update(functional=f, memory=m)
            for model_name, size in (("lmn-b", (f, m)), ("lstm", (f + m, None))):
                times = []
                for _ in range(args.epoch_repeats if model_name == "lmn-b" else 1):
                    torch.manual_seed(0)
                    model = build_model(model_name, *size)
                    if model_name == "lstm":  # PyTorch's own, oneDNN's fused LSTM
                        model.core = as_torch(model.core)
                    optimizer = trainer_optimizer(model)
                    t0 = time.perf_counter()
                    for b in padded:
                        train_step(model, optimizer, b, clip=5.0)
                    times.append(time.perf_counter() - t0)
                seconds = statistics.median(times)
                row[f"{model_name}_epoch_s"] = seconds
                row[f"{model_name}_epoch_s_each"] = times
                row[f"{model_name}_train_fps"] = row["frames"] / seconds
            row["lmn_vs_lstm"] = row["lmn-b_train_fps"] / row["lstm_train_fps"]
            rows.append(row)
            print(f"epoch on {name} (train split, {row['frames']} frames, batch {batch_size}, "
                  f"{row['batches']} batches, padding {100 * row['padding_fraction']:.1f}%): "
                  f"LMN-B({f},{m}) {row['lmn-b_epoch_s']:.1f}s = "
                  f"{row['lmn-b_train_fps'] / 1e3:.1f}k frames/s"
                  + (f" (median of {', '.join(f'{t:.2f}' for t in row['lmn-b_epoch_s_each'])} s)"
                     if args.epoch_repeats > 1 else "") + f", LSTM({f + m}) "
                  f"{row['lstm_epoch_s']:.1f}s = {row['lstm_train_fps'] / 1e3:.1f}k frames/s, "
                  f"ratio {row['lmn_vs_lstm']:.2f}x", flush=True)
    return rows


def profile(args) -> str:
    """Where the time of LMN-B(250,250) training steps at batch 32 goes: the straightforward
    loop, the PyTorch loop of the fast path, and the compiled kernel."""
    from torch.profiler import profile as torch_profile

    batch = random_batch(32, args.steps)
    torch.manual_seed(0)
    lmn = build_model("lmn-b", 250, 250, memory_bound=None)
    out = []
    for label, model in (("straightforward per-step loop", NaiveLMN(lmn)),
                         ("fast path, PyTorch loop (kernel off)", PathLMN(lmn, False)),
                         ("fast path, compiled kernel (the default)", lmn)):
        optimizer = trainer_optimizer(model)
        train_step(model, optimizer, batch)
        with torch_profile() as prof:
            for _ in range(3):
                train_step(model, optimizer, batch)
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12)
        out.append(f"== {label}: 3 training steps, LMN-B(250,250), batch 32, {args.steps} "
                   f"steps ==\n{table}")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["50x50", "100x100", "250x250", "250x500"])
    p.add_argument("--batches", nargs="+", type=int, default=[8, 32])
    p.add_argument("--steps", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median reported")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement")
    p.add_argument("--epochs", nargs="*", default=["nottingham", "musedata"],
                   help="data sets to time a training epoch on (none to skip)")
    p.add_argument("--epoch-size", default="250x250")
    p.add_argument("--epoch-repeats", type=int, default=1,
                   help="the LMN-B's epoch this many times (each recorded), its median reported")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--profile", default=None, help="write a torch.profiler table to this file")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    started = time.perf_counter()
    commit = git_commit()  # the code that runs, taken before any later edit of the tree
    kernel = load_cpu_kernel() is not None  # built (or loaded from the cache) before timing
    args.path = cpu_path(measure_cpu_paths)  # the default path, measured (or read) before timing
    # every other variant this CPU runs, each its own column (LINMEM_CPU_KERNEL=v: only v)
    forced = os.environ.get(KERNEL_ENV, "") not in ("", "auto")
    args.variants = [] if forced else [v for v in kernel_variants() if v != args.path]
    # the streaming bound through the best loads this CPU runs (the default path's when it is
    # a variant): none without the compiled kernel
    args.stream_variant = (args.path if args.path in kernel_variants() else
                           (kernel_variants() or [None])[0]) if kernel else None
    cpu = machine()["cpu"]
    isa = {k: os.environ[k] for k in ISA_VARIABLES if k in os.environ}
    print(f"CPU: {cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads; compiled "
          f"CPU kernel: {'yes' if kernel else 'NO (the PyTorch loop runs in its place)'}; "
          f"default path: {args.path}; other variants: {args.variants or 'none'}; "
          f"instruction-set limits: {isa or 'none'}", flush=True)
    args.gemm_rate = gemm_rate(2048, 2048, 2048, 2 * args.min_time)
    print(f"large GEMM (2048^3, float32): {args.gemm_rate / 1e9:.0f} GFLOP/s", flush=True)
    sizes = bench_sizes(args)
    gemm_after = gemm_rate(2048, 2048, 2048, 2 * args.min_time)
    print(f"large GEMM again at the end: {gemm_after / 1e9:.0f} GFLOP/s", flush=True)
    epochs = bench_epochs(args) if args.epochs else []
    if args.profile:
        text = profile(args)
        Path(args.profile).parent.mkdir(parents=True, exist_ok=True)
        Path(args.profile).write_text(text + "\n")
        print(text)
    if args.json:
        checksums = {row["dataset"]: row["data_sha256"] for row in epochs} or None
        write_json(args.json, {
            **provenance(command_line(), commit, 0, checksums, time.perf_counter() - started),
            "cpu_kernel": kernel, "default_path": args.path, "variants": args.variants,
            "isa_limits": isa,
            "gemm_gflops": args.gemm_rate / 1e9, "gemm_gflops_end": gemm_after / 1e9,
            "sizes": sizes, "epochs": epochs,
            "units": "frames per second; a frame is one time step of one sequence",
        })
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
