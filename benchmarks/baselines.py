"""The RNN, GRU and LSTM baselines and the pretraining's unrolled network against their autograd
(or oneDNN) forms, side by side in one run.

:class:`linmem.nn.rnns.RNN`, :class:`linmem.nn.rnns.GRU` and :class:`linmem.nn.rnns.LSTM` are
``torch.nn.RNN``, ``torch.nn.GRU`` and ``torch.nn.LSTM`` with an explicit backward through time
on the CPU (their steps in the compiled kernel of ``csrc/`` where ``linmem.ops.cpu.cpu_path`` chose
a variant; ``rnn-loop`` and ``gru-loop`` are the same models on the PyTorch loop; the LSTM here
on the kernel at every size, where the module takes it from ``min_kernel_hidden`` units on);
:class:`linmem.UnrolledNet` (the ULM of the pretraining, eq. 10, ``k = 10``) has one too.
For each hidden size and batch size, on random piano-roll-like sequences of ``--steps`` steps,
this measures training frames per second (the next-step model of ``linmem.models``: forward,
masked NLL, backward, Adam step) of the model built on each and on its reference from the same
weights (PyTorch's module, its LSTM oneDNN's fused one; the ULM as a step-by-step autograd
loop), in interleaved rounds (median reported), after checking that the two give the same
logits.

    OMP_NUM_THREADS=1 python benchmarks/baselines.py --json results/speed/baselines.json
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import time

import torch
from torch import nn

from linmem._io import command_line, git_commit, machine, provenance, write_json
from linmem.batching import collate
from linmem.data import N_KEYS
from linmem.models import build_model
from linmem.nn.rnns import as_torch
from linmem.ops.cpu import cpu_path
from linmem.ops.paths import measure_cpu_paths, use_cpu_kernel
from linmem.training.updates import train_step

ACTIVATIONS = {"selu": torch.selu, "tanh": torch.tanh, "relu": torch.relu}


class AutogradULM(nn.Module):
    """The ULM's core (eq. 10) as a step-by-step autograd loop, sharing ``core``'s parameters:
    the reference the explicit backward replaces."""

    def __init__(self, core: nn.Module):
        super().__init__()
        self.core = core

    def forward(self, inputs: torch.Tensor, past=None):
        c = self.core
        x_proj = nn.functional.linear(inputs.transpose(0, 1), c.weight_xh, c.bias_h)
        blocks = [x_proj.new_zeros(inputs.shape[0], c.hidden_size)] * c.k  # h_{t-1}, ...
        hs = []
        for x_t in x_proj:
            h = ACTIVATIONS[c.nonlinearity](torch.addmm(x_t, torch.cat(blocks, 1),
                                                        c.weight_hh.t()))
            hs.append(h)
            blocks = [h, *blocks[:-1]]
        padded = torch.cat([x_proj.new_zeros(c.k, *hs[0].shape), torch.stack(hs)])
        steps = len(hs)
        lagged = torch.cat([padded[c.k - i: c.k - i + steps] for i in range(c.k + 1)], 2)
        return lagged.transpose(0, 1), None


def with_autograd_ulm(model: nn.Module) -> nn.Module:
    """A copy of the ULM ``model`` whose core runs as :class:`AutogradULM`, same weights."""
    other = build_model("ulm", model.hidden, k=model.k)
    other.load_state_dict(model.state_dict())
    other.core = AutogradULM(other.core)
    return other


class LoopPath(nn.Module):
    """``model`` with its recurrence on the PyTorch loop (``use_cpu_kernel(False)``; the backward
    runs where the forward ran). Shares the parameters."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def training_loss(self, batch) -> torch.Tensor:
        with use_cpu_kernel(False):
            return self.model.training_loss(batch)


def random_batch(batch: int, steps: int):
    g = torch.Generator().manual_seed(0)
    return collate([(torch.rand(steps + 1, N_KEYS, generator=g) < 0.05).float().numpy()
                    for _ in range(batch)])


def with_torch_core(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose core is PyTorch's own module with the same weights."""
    other = copy.deepcopy(model)
    other.core = as_torch(model.core)
    return other


def train_fps(model: nn.Module, batch, min_time: float) -> float:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    frames = int(batch.mask.sum())
    train_step(model, optimizer, batch)  # warm-up
    n, t0 = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - t0) < min_time or n < 2:
        train_step(model, optimizer, batch)
        n += 1
    return frames * n / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", type=int, default=[50, 250, 750],
                   help="hidden sizes of the RNN, GRU and LSTM")
    p.add_argument("--ulm-sizes", nargs="+", type=int, default=[100, 250],
                   help="hidden sizes of the ULM (the grids' functional sizes)")
    p.add_argument("--batches", nargs="+", type=int, default=[4])
    p.add_argument("--steps", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median reported")
    p.add_argument("--min-time", type=float, default=1.0, help="seconds per measurement")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    started, commit = time.perf_counter(), git_commit()
    cpu, path = machine()["cpu"], cpu_path(measure_cpu_paths)
    print(f"CPU: {cpu}; torch {torch.__version__}, {torch.get_num_threads()} threads; the "
          f"kernel's path: {path}", flush=True)
    rows = []
    for hidden in sorted({*args.sizes, *args.ulm_sizes}):
        for batch_size in args.batches:
            batch = random_batch(batch_size, args.steps)
            models = {}
            names = [n for n, sizes in (("rnn", args.sizes), ("gru", args.sizes),
                                        ("lstm", args.sizes), ("ulm", args.ulm_sizes))
                     if hidden in sizes]
            for name in names:
                torch.manual_seed(0)
                models[name] = build_model(name, hidden)
                if name == "lstm":  # the kernel at every size (the module's own rule aside)
                    models[name].core.min_kernel_hidden = 0
                models[f"{name}-{'autograd' if name == 'ulm' else 'torch'}"] = (
                    with_autograd_ulm(models[name]) if name == "ulm"
                    else with_torch_core(models[name]))
                reference = models[f"{name}-{'autograd' if name == 'ulm' else 'torch'}"]
                which = (f"{name} ({hidden} units, batch {batch_size}) against its reference, "
                         f"the kernel's path {path}, "
                         f"{torch.get_num_threads()} threads")  # a rare CI failure: which one
                with torch.no_grad():
                    torch.testing.assert_close(
                        models[name](batch.inputs), reference(batch.inputs), rtol=1e-4,
                        atol=1e-5, msg=lambda m, which=which: f"{which}: {m}")
            for name in ("rnn", "gru"):
                if name in models:
                    models[f"{name}-loop"] = LoopPath(models[name])
            runs = {name: [] for name in models}
            for _ in range(args.rounds):
                for name, model in models.items():
                    runs[name].append(train_fps(model, batch, args.min_time))
            row = {"hidden": hidden, "batch": batch_size, "steps": args.steps,
                   **{f"{name}_train_fps": statistics.median(v) for name, v in runs.items()}}
            ratios = []
            for name in names:
                ref = "autograd" if name == "ulm" else "torch"
                row[f"{name}_vs_{ref}"] = (row[f"{name}_train_fps"]
                                           / row[f"{name}-{ref}_train_fps"])
                ratios.append(f"{name}/{ref} {row[f'{name}_vs_{ref}']:.2f}x")
            for name in ("rnn", "gru"):
                if name in names:
                    row[f"{name}_vs_loop"] = (row[f"{name}_train_fps"]
                                              / row[f"{name}-loop_train_fps"])
                    ratios.append(f"{name}/loop {row[f'{name}_vs_loop']:.2f}x")
            rows.append(row)
            print(f"hidden {hidden}, batch {batch_size}: training frames/s  "
                  + "  ".join(f"{n} {row[f'{n}_train_fps'] / 1e3:.1f}k" for n in models)
                  + " | " + "  ".join(ratios), flush=True)
    if args.json:
        write_json(args.json, {
            **provenance(command_line(), commit, 0, None, time.perf_counter() - started),
            "sizes": rows,
            "units": "frames per second; a frame is one time step of one sequence"})
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
