"""The bounded memory (linmem.ops.bound): what each way of holding ||W^mm||_2 <= r costs, and what
the bound does to the pretraining's closed-form memory.

``--part cost``: per forward and backward of a batch-1 training step of LMN-B(M, M), side by
side in one run (the columns interleaved, ``--rounds`` times, the median): the step with no
bound, then the time each parametrization adds: the layer's own ``LMN(memory_bound=0.99)``
end to end (the certified norm, :mod:`linmem.ops.certified_norm`), and the same layer by the
exact norm it used before (:func:`linmem.ops.bound.bounded_memory_ref`); the same for a whole
update (forward, backward and Adam's step, so that the weights and the certified norm's warm
start move as in training: updates on JSB Chorales' training windows, after ``--warmup`` of
them); then the norm alone, rescaling the unbounded layer's matrix: the
certified norm (warm-started), the exact largest eigenpair of ``V^T V``
(:func:`linmem.ops.bound.spectral_norm`), the exact norm by a full SVD
(``torch.linalg.matrix_norm(V, 2)``), the Schatten 2^20-norm (the ONNX export's upper bound),
and one warm-started power iteration, as ``torch.nn.utils.parametrizations.spectral_norm``,
which holds the bound only approximately. Run it with nothing else busy, one thread.

``--part loop``: the loop bound's cost (:mod:`linmem.ops.loop_bound`), a SELU LMN-B(M, M)'s
batch-1 step and whole update with no bound, with the memory bound alone, and with the loop
bound (selu's default: three certified norms), interleaved as above.

``--part epochs``: whole epochs of the default LMN-B(250, 250) under the paper's protocol
through linmem's trainer (JSB Chorales and MuseData), with the certified norm and with the
exact one, alternated.

``--part norms``: ||B||_2 of the linear autoencoder of each data set's training split (window
11, no centering, as the transfer fits it on the ULM's states; here on the piano rolls), and
the relative change ``||W - B||_F / ||B||_F`` of the nearest matrix of the ball for each r
(:func:`linmem.pretrain.project_memory`): 0 where ``||B||_2 <= r``, the transfer exact.

    OMP_NUM_THREADS=1 python benchmarks/memory_bound.py --part cost|loop|epochs|norms|all \
        [--json OUT]
    python benchmarks/memory_bound.py --table OUT
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import time
from pathlib import Path

import numpy as np
import torch

from linmem._io import command_line, git_commit, provenance, write_json

DEFAULT_DATA = Path(os.environ.get(
    "LINMEM_DATA", Path(__file__).resolve().parents[2] / "shared" / "data" / "polyphonic"))


def power_iteration_norm(weight: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One step of torch's spectral_norm: ``u`` (persistent, updated in place) and the estimate
    ``u^T W v`` (a lower bound of ||W||_2)."""
    with torch.no_grad():
        v = torch.nn.functional.normalize(weight.T @ u, dim=0)
        u.copy_(torch.nn.functional.normalize(weight @ v, dim=0))
    return u @ weight @ v


def _time(fn, repeats: int) -> float:
    fn()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - started) / repeats


def _windows(data_dir: Path, steps: int) -> list[torch.Tensor]:
    """JSB Chorales' training split, its sequences end to end, cut into ``(1, steps, 88)``
    windows: the whole updates' data (real piano rolls, as in training, at a fixed length)."""
    from linmem.data import load_polyphonic

    train = load_polyphonic("jsb", root=data_dir, progress=False)["train"]
    roll = torch.cat([torch.as_tensor(np.asarray(s), dtype=torch.float32) for s in train])
    return [roll[i:i + steps][None] for i in range(0, len(roll) - steps + 1, steps)]


class _Stream:
    """The next window at every call (cycling): an update on each in turn."""

    def __init__(self, windows: list[torch.Tensor]):
        self.windows, self.i = windows, 0

    def __call__(self) -> torch.Tensor:
        self.i = (self.i + 1) % len(self.windows)
        return self.windows[self.i]


def _update(model, stream: _Stream, optimizer) -> None:
    """One training update on the stream's next window: the next-frame cross-entropy's forward
    and backward, then the optimizer's step."""
    x = stream()
    model.zero_grad()
    torch.nn.functional.binary_cross_entropy_with_logits(model(x[:, :-1]), x[:, 1:]).backward()
    optimizer.step()


def _step(model, x: torch.Tensor, norm=None) -> None:
    """One forward and backward of ``model`` on ``x`` (the sum of its outputs), ``W^mm``
    rescaled by ``norm`` (a function of the raw matrix) as the bound does, or as it is
    (``None``)."""
    model.zero_grad()
    if norm is None:
        out = model(x)
    else:
        v = model.core.weight_mm_l0
        scale = (0.99 / norm(v)).clamp(max=1.0)
        with torch.nn.utils.stateless._reparametrize_module(model,
                                                            {"core.weight_mm_l0": v * scale}):
            out = model(x)
    out.sum().backward()


@contextlib.contextmanager
def _reference_bound():
    """The layer's bound by the exact norm (:func:`linmem.ops.bound.bounded_memory_ref`, the
    layer's path before the certified norm) while the block runs."""
    import linmem.nn.lmn as lmn
    from linmem.ops.bound import bounded_memory_ref

    before = lmn.bounded_memory
    lmn.bounded_memory = lambda weight, bound, *args, **kwargs: bounded_memory_ref(weight, bound)
    try:
        yield
    finally:
        lmn.bounded_memory = before


def _columns(m: int, steps: int, windows: list[torch.Tensor], warmup: int = 0):
    """``{column: (function, baseline)}`` of one size: each function times one step; the
    baseline is the column whose time it adds to (None: a step's own time)."""
    from linmem.models import build_model
    from linmem.ops.bound import schatten_norm, spectral_norm
    from linmem.ops.certified_norm import certified_norm

    def model(bound):
        torch.manual_seed(0)
        return build_model("lmn-b", m, m, memory_bound=bound)

    x = (torch.rand(1, steps, 88, generator=torch.Generator().manual_seed(m + steps)) < 0.05
         ).float()
    plain, bounded, reference = model(None), model(0.99), model(0.99)
    u = torch.nn.functional.normalize(torch.randn(m), dim=0)
    start = torch.zeros(m)

    def certified(w):
        s, vector = certified_norm(w, start)
        start.copy_(vector.detach())
        return s

    def in_reference(fn):
        def call():
            with _reference_bound():
                fn()
        return call

    # whole updates (Adam, the paper's learning rate) on JSB Chorales' windows: the weights
    # move between steps, after ``warmup`` updates (a training run's steady state)
    moving = {name: (mod, _Stream(windows), torch.optim.Adam(mod.parameters(), lr=1e-3))
              for name, mod in (("plain", model(None)), ("bounded", model(0.99)),
                                ("reference", model(0.99)))}
    for name, (mod, stream, optimizer) in moving.items():
        with _reference_bound() if name == "reference" else contextlib.nullcontext():
            for _ in range(warmup):
                _update(mod, stream, optimizer)
    return {
        "step_s": (functools.partial(_step, plain, x), None),
        "layer memory_bound=0.99": (functools.partial(_step, bounded, x), "step_s"),
        "layer, exact eigenpair (before)": (in_reference(functools.partial(_step, reference, x)),
                                            "step_s"),
        "update_s": (functools.partial(_update, *moving["plain"]), None),
        "update: layer memory_bound=0.99": (functools.partial(_update, *moving["bounded"]),
                                            "update_s"),
        "update: layer, exact eigenpair (before)": (
            in_reference(functools.partial(_update, *moving["reference"])), "update_s"),
        "certified (linmem)": (functools.partial(_step, plain, x, certified), "step_s"),
        "exact, one eigenpair": (functools.partial(_step, plain, x, spectral_norm), "step_s"),
        "exact, SVD (matrix_norm)": (functools.partial(
            _step, plain, x, lambda w: torch.linalg.matrix_norm(w, 2)), "step_s"),
        "schatten q=20 (onnx)": (functools.partial(_step, plain, x, schatten_norm), "step_s"),
        "power iteration x1": (functools.partial(
            _step, plain, x, functools.partial(power_iteration_norm, u=u)), "step_s"),
    }


def _loop_columns(m: int, steps: int, windows: list[torch.Tensor], warmup: int = 0):
    """``--part loop``'s columns: a SELU LMN-B(M, M)'s batch-1 step and whole update with no
    bound, and what the memory bound alone (``loop_bound=False``) and the loop bound (the
    default for selu, :mod:`linmem.ops.loop_bound`: three certified norms) add to them."""
    from linmem.models import build_model

    def model(bound, loop):
        torch.manual_seed(0)
        return build_model("lmn-b", m, m, nonlinearity="selu", memory_bound=bound,
                           loop_bound=loop)

    x = (torch.rand(1, steps, 88, generator=torch.Generator().manual_seed(m + steps)) < 0.05
         ).float()
    kinds = {"plain": (None, None), "memory": (0.99, False), "loop": (0.99, None)}
    stepping = {name: model(*kind) for name, kind in kinds.items()}
    moving = {}
    for name, kind in kinds.items():
        mod = model(*kind)
        moving[name] = (mod, _Stream(windows), torch.optim.Adam(mod.parameters(), lr=1e-3))
        for _ in range(warmup):
            _update(*moving[name])
    return {
        "step_s": (functools.partial(_step, stepping["plain"], x), None),
        "selu, memory bound alone": (functools.partial(_step, stepping["memory"], x), "step_s"),
        "selu, loop bound (default)": (functools.partial(_step, stepping["loop"], x), "step_s"),
        "update_s": (functools.partial(_update, *moving["plain"]), None),
        "update: selu, memory bound alone": (functools.partial(_update, *moving["memory"]),
                                             "update_s"),
        "update: selu, loop bound (default)": (functools.partial(_update, *moving["loop"]),
                                               "update_s"),
    }


def cost(sizes: list[int], lengths: list[int], repeats: int, rounds: int, data_dir: Path,
         warmup: int = 0, columns_of=_columns) -> list[dict]:
    """Per size, each column's time (``columns_of``'s), ``rounds`` times in turn (the columns
    interleaved, so that a drift of the machine's speed reaches all of them); a column's figure
    is the median over the rounds of what it added to its baseline in the same round (a
    baseline's own figure: the median of its times)."""
    rows = []
    for m, steps in ((m, steps) for m in sizes for steps in lengths):
        columns = columns_of(m, steps, _windows(data_dir, steps), warmup)
        times = {name: [] for name in columns}
        for _ in range(rounds):
            for name, (fn, _) in columns.items():
                times[name].append(_time(fn, repeats))
        row = {"memory": m, "steps": steps}
        for name, (_, base) in columns.items():
            row[name] = float(np.median(times[name] if base is None else
                                        np.subtract(times[name], times[base])))
        rows.append(row)
        added = [k for k in row if k not in ("memory", "steps", "step_s", "update_s")]

        share = {k: 100 * row[k] / row["update_s" if k.startswith("update") else "step_s"]
                 for k in added}
        print(f"LMN-B({m}, {m}) batch 1, {steps} steps: step {1e3 * row['step_s']:.2f} ms, "
              f"update (with Adam) {1e3 * row['update_s']:.2f} ms; added: "
              + ", ".join(f"{k} {1e3 * row[k]:+.2f} ms ({share[k]:+.0f} %)" for k in added),
              flush=True)
    return rows


def epochs(data_dir: Path, names: list[str], count: int, rounds: int) -> list[dict]:
    """Whole epochs of the default LMN-B(250, 250) under the paper's protocol (``linmem train``'s
    defaults: batch 1, Adam, the default bound), through linmem's trainer: each epoch's time
    (training and the validation pass, ``log.jsonl``'s ``epoch_time_s``) with the certified
    norm and with the exact one before it, the two runs alternated ``rounds`` times."""
    import tempfile

    from linmem.data import load_polyphonic
    from linmem.training.config import TrainConfig
    from linmem.training.trainer import train_loop

    rows = []
    for name in names:
        data = load_polyphonic(name, root=data_dir, progress=False)
        times = {"certified": [], "exact (before)": []}
        for _ in range(rounds):
            for variant in times:
                config = TrainConfig(data=name, model="lmn-b", hidden=250, memory=250,
                                     protocol="paper", epochs=count, seed=0)
                with tempfile.TemporaryDirectory() as tmp, (
                        _reference_bound() if variant != "certified"
                        else contextlib.nullcontext()):
                    train_loop(config, Path(tmp) / "run", progress=False, data=data)
                    log = (Path(tmp) / "run" / "log.jsonl").read_text().splitlines()
                times[variant] += [json.loads(line)["epoch_time_s"] for line in log]
        row = {"data": name, "epochs": count, "rounds": rounds,
               **{f"epoch_s {k}": float(np.median(v)) for k, v in times.items()},
               **{f"all {k}": v for k, v in times.items()}}
        rows.append(row)
        print(f"{name}: an epoch of LMN-B(250, 250), paper protocol: "
              + ", ".join(f"{k} {row[f'epoch_s {k}']:.2f} s" for k in times)
              + f" (medians of {count * rounds})", flush=True)
    return rows


def norms(data_dir: Path, components: list[int], bounds: list[float]) -> list[dict]:
    from linmem.data import load_polyphonic
    from linmem.la import LinearAutoencoder
    from linmem.pretrain import project_memory

    rows = []
    for name in ("jsb", "nottingham", "musedata", "piano"):
        train = load_polyphonic(name, root=data_dir, progress=False)["train"]
        seqs = [np.asarray(s, np.float64) for s in train]
        for p in components:
            la = LinearAutoencoder(p, window=11, center=False, random_state=0).fit(seqs)
            row = {"data": name, "components": int(la.n_components_),
                   "norm": float(np.linalg.norm(la.B_, 2))}
            for r in bounds:
                row[f"change_r{r}"] = project_memory(la.B_, r)[1]["memory_change"]
            rows.append(row)
            print(f"{name:10s} p={row['components']:3d}  ||B||_2 = {row['norm']:.9f}  "
                  + "  ".join(f"r={r}: change {row[f'change_r{r}']:.4f}" for r in bounds),
                  flush=True)
    return rows


def table(path: Path) -> str:
    """The cost part of a ``--json`` file as a markdown table: ms added, and the share of the
    step (or of the update) in brackets."""
    data = json.loads(Path(path).read_text())
    columns = [("layer memory_bound=0.99", "step_s", "the layer's bound"),
               ("layer, exact eigenpair (before)", "step_s", "before (exact eigenpair)"),
               ("update: layer memory_bound=0.99", "update_s", "the layer's bound"),
               ("update: layer, exact eigenpair (before)", "update_s", "before")]
    lines = ["| M | steps | step, no bound (ms) | " + " | ".join(c[2] for c in columns[:2])
             + " | update, no bound (ms) | " + " | ".join(c[2] for c in columns[2:]) + " |",
             "|---" * 8 + "|"]
    for r in data["cost"]:
        cells = [f"{1e3 * r[k]:+.2f} ({100 * r[k] / r[base]:+.0f} %)" for k, base, _ in columns]
        lines.append(f"| {r['memory']} | {r['steps']} | {1e3 * r['step_s']:.2f} | "
                     f"{cells[0]} | {cells[1]} | {1e3 * r['update_s']:.2f} | {cells[2]} | "
                     f"{cells[3]} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    p.add_argument("--part", choices=("cost", "loop", "norms", "epochs", "all"), default="all")
    p.add_argument("--epoch-data", nargs="+", default=["jsb", "musedata"],
                   help="the data sets of --part epochs")
    p.add_argument("--sizes", type=int, nargs="+", default=[50, 100, 250, 500])
    p.add_argument("--steps", type=int, nargs="+", default=[60, 200],
                   help="sequence lengths (JSB Chorales' sequences are about 60 steps long)")
    p.add_argument("--repeats", type=int, default=20, help="steps timed in a row")
    p.add_argument("--epoch-rounds", type=int, default=2,
                   help="--part epochs: runs of two epochs each way, alternated")
    p.add_argument("--warmup", type=int, default=200,
                   help="updates before the whole updates are timed (a training run's steady "
                        "state: JSB Chorales' first epoch is 229 updates at batch 1)")
    p.add_argument("--rounds", type=int, default=5,
                   help="each column timed this many times, interleaved; the median is given")
    p.add_argument("--components", type=int, nargs="+", default=[50, 250])
    p.add_argument("--bounds", type=float, nargs="+", default=[0.9, 0.99, 1.0])
    p.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    p.add_argument("--json", default=None)
    p.add_argument("--table", type=Path, default=None, metavar="JSON",
                   help="print the cost part of a --json file as a markdown table, and stop")
    args = p.parse_args()
    if args.table:
        print(table(args.table))
        return
    started = time.perf_counter()
    out = {}
    if args.part in ("cost", "all"):
        out["cost"] = cost(args.sizes, args.steps, args.repeats, args.rounds, args.data_dir,
                           args.warmup)
    if args.part in ("loop", "all"):
        out["loop"] = cost(args.sizes, args.steps, args.repeats, args.rounds, args.data_dir,
                           args.warmup, _loop_columns)
    if args.part in ("norms", "all"):
        out["norms"] = norms(args.data_dir, args.components, args.bounds)
    if args.part in ("epochs", "all"):
        out["epochs"] = epochs(args.data_dir, args.epoch_data, 2, args.epoch_rounds)
    if args.json:
        from linmem.data import data_checksum

        used = set(("jsb", "nottingham", "musedata", "piano") if "norms" in out else ("jsb",))
        used |= set(args.epoch_data) if "epochs" in out else set()
        sums = {n: data_checksum(n, args.data_dir) for n in sorted(used)}
        write_json(args.json, {**out, **provenance(command_line(), git_commit(), 0, sums,
                                                    time.perf_counter() - started)})
    print(json.dumps({"wall_time_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
