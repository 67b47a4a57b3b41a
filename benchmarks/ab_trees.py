"""The same LMN-B training step and inference timed under two source trees of linmem (two
commits checked out, e.g. ``git worktree add``), in interleaved processes: for a change whose
"before" is no longer in the code, such as the compiled kernel's layout of its packed weights.

Each round runs one process per tree, in turn (``PYTHONPATH=TREE/src``; each builds or reuses
its own kernel); a process times forward, masked NLL and backward of LMN-B at each size, then
the forward alone under ``torch.inference_mode``, batch ``--batch`` (4), sequences of 256 steps,
for ``--min-time`` seconds each after a warm-up, and prints frames per second (set
``LINMEM_CPU_KERNEL`` to compare one kernel variant: otherwise each tree takes the path its own
first use measured). The median over rounds is reported, with each tree's commit.

    OMP_NUM_THREADS=1 python benchmarks/ab_trees.py --trees ../tree-old . \\
        --json results/speed/ab_trees.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INNER = """
import json, sys, time, torch
try:
    from linmem.batching import collate  # its owner since the batching left data.py
except ImportError:  # an older tree
    from linmem.data import collate
from linmem.models import build_model
sizes, min_time, n_seqs = json.loads(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
g = torch.Generator().manual_seed(1)
batch = collate([(torch.rand(257, 88, generator=g) < 0.1).float().numpy() for _ in range(n_seqs)])
rates = {}
for hidden, memory in sizes:
    torch.manual_seed(0)
    model = build_model("lmn-b", hidden, memory, memory_bound=None)
    model.training_loss(batch).backward()  # warm-up: the kernel's build and buffers
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < min_time or n < 2:
        model.zero_grad()
        model.training_loss(batch).backward()
        n += 1
    train = n_seqs * 256 * n / (time.perf_counter() - t0)
    with torch.inference_mode():
        model(batch.inputs)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < min_time or n < 2:
            model(batch.inputs)
            n += 1
    rates[f"{hidden}x{memory}"] = {"train": train,
                                   "infer": n_seqs * 256 * n / (time.perf_counter() - t0)}
print(json.dumps(rates))
"""


def commit_of(tree: Path) -> str:
    """The commit of ``tree``: its ``COMMIT`` file where it has one (a tree exported by ``git
    archive``, which a checkout around it would otherwise name), else its checkout's HEAD."""
    named = tree / "COMMIT"
    if named.is_file():
        return named.read_text().strip()
    found = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                           text=True)
    return found.stdout.strip() if found.returncode == 0 else "unknown (no git checkout)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs=2, required=True, help="two source trees: A B")
    parser.add_argument("--sizes", nargs="+", default=["250x250", "250x500"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--batch", type=int, default=4, help="sequences per step")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    from linmem._io import command_line, git_commit, machine, provenance, write_json

    started = time.perf_counter()
    trees = [Path(t).resolve() for t in args.trees]
    sizes = [[int(v) for v in s.split("x")] for s in args.sizes]
    runs: dict[str, dict[str, list[dict]]] = {str(t): {s: [] for s in args.sizes} for t in trees}
    for _ in range(args.rounds):
        for tree in trees:
            # a kernel build per tree: the extension's cache is keyed by its sources' paths too,
            # and one folder for both would rebuild it at every alternation
            key = hashlib.sha256(str(tree).encode()).hexdigest()[:12]
            env = {**os.environ, "PYTHONPATH": str(tree / "src"), "TORCH_EXTENSIONS_DIR":
                   str(Path(tempfile.gettempdir()) / "linmem-ab-ext" / key)}
            out = subprocess.run([sys.executable, "-c", INNER, json.dumps(sizes),
                                  str(args.min_time), str(args.batch)], env=env,
                                 capture_output=True, text=True, check=True).stdout
            for size, rate in json.loads(out.strip().splitlines()[-1]).items():
                runs[str(tree)][size].append(rate)
    rows = []
    for size in args.sizes:
        for mode, what in (("train", "training step"), ("infer", "inference")):
            a, b = (statistics.median(r[mode] for r in runs[str(t)][size]) for t in trees)
            rows.append({"size": size, "mode": mode, "a_fps": a, "b_fps": b, "b_over_a": b / a})
            print(f"LMN-B {size}, batch {args.batch}, {what}: A {a / 1e3:.1f}k  B {b / 1e3:.1f}k "
                  f"frames/s  B/A {b / a:.2f}x", flush=True)
    print(f"A = {trees[0]} ({commit_of(trees[0])[:7]}), B = {trees[1]} "
          f"({commit_of(trees[1])[:7]}); {machine()}")
    if args.json:
        write_json(args.json, {
            **provenance(command_line(), git_commit(), 0, None, time.perf_counter() - started),
            "trees": {"a": {"path": str(trees[0]), "commit": commit_of(trees[0])},
                      "b": {"path": str(trees[1]), "commit": commit_of(trees[1])}},
            "rounds": args.rounds, "batch": args.batch, "runs": runs, "rows": rows,
            "kernel_path": os.environ.get("LINMEM_CPU_KERNEL", "auto"),
            "units": "frames per second: train, forward + masked NLL + backward; infer, the "
                     "forward under torch.inference_mode"})


if __name__ == "__main__":
    main()
