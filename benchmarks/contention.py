"""Training throughput on a quiet machine and beside a competing process (issue 18).

For LMN-B(250,250) and ``torch.nn.LSTM(500)`` (batch 32, 128 steps, a training step as in
``benchmarks/throughput.py``), each measurement runs in a fresh process (the OpenMP wait policy
is read when torch loads) under two thread settings:

- ``torch``: torch's defaults (OpenMP threads spin while they wait; every core);
- ``linmem``: what the ``linmem`` command sets before torch loads (``linmem._threads``: a short
  spin before a waiting thread sleeps, one thread per usable CPU);
- ``spin=N`` (``GOMP_SPINCOUNT=N``) or ``passive`` (``OMP_WAIT_POLICY=PASSIVE``), to compare;

and three loads: ``quiet``; ``busy`` (a Python busy loop on one core beside it); ``train``
(a second training process of the same model and settings beside it). Every competitor stops by
itself after a bounded time. Reported: frames per second and the fraction of the quiet figure.

    python benchmarks/contention.py --json results/speed/contention.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MODELS = {"lmn-b": ("lmn-b", 250, 250), "lstm": ("lstm", 500, None)}
_THREAD_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME", "OMP_NUM_THREADS",
                     "MKL_NUM_THREADS")


def child(model_key: str, seconds: float, warmup: float) -> dict:
    """Train ``model_key`` on a random batch for ``warmup`` then ``seconds`` seconds; frames/s."""
    import torch

    sys.path.insert(0, str(Path(__file__).parent))
    from throughput import random_batch

    from linmem.models import build_model
    from linmem.training.updates import train_step

    name, hidden, memory = MODELS[model_key]
    torch.manual_seed(0)
    model = build_model(name, hidden, memory)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = random_batch(32, 128)
    frames = int(batch.mask.sum())
    end = time.perf_counter() + warmup
    while time.perf_counter() < end:
        train_step(model, optimizer, batch)
    steps, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds or steps < 2:
        train_step(model, optimizer, batch)
        steps += 1
    return {"fps": frames * steps / elapsed, "steps": steps, "seconds": elapsed,
            "threads": torch.get_num_threads(),
            "wait_policy": os.environ.get("OMP_WAIT_POLICY",
                                          os.environ.get("GOMP_SPINCOUNT", "(unset)"))}


def environment(policy: str) -> dict[str, str]:
    from linmem._threads import configure_threads

    env = {k: v for k, v in os.environ.items() if k not in _THREAD_VARIABLES}
    if policy == "linmem":
        configure_threads(env)
    elif policy.startswith("spin="):  # a GNU OpenMP spin count to compare with
        env["GOMP_SPINCOUNT"] = policy.removeprefix("spin=")
    elif policy == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    return env


def measure(model_key: str, policy: str, load: str, args) -> dict:
    env = environment(policy)
    me = [sys.executable, __file__, "--child", model_key, "--seconds", str(args.seconds),
          "--warmup", str(args.warmup)]
    bound = args.seconds + args.warmup + 15  # every competitor stops by itself
    competitor = None
    if load == "busy":
        loop = f"import time\nend = time.time() + {bound}\nwhile time.time() < end: pass"
        competitor = subprocess.Popen([sys.executable, "-c", loop])
    elif load == "train":
        other = [*me[:4], "--seconds", str(bound), "--warmup", "0"]
        competitor = subprocess.Popen(other, env=env, stdout=subprocess.DEVNULL)
        time.sleep(2)  # its start-up (imports) is not the load being measured
    try:
        out = subprocess.run(me, env=env, capture_output=True, text=True, check=True,
                             timeout=bound + 60).stdout
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--policies", nargs="+", default=["torch", "linmem"])
    p.add_argument("--loads", nargs="+", default=["quiet", "busy", "train"])
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; median reported")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.seconds, args.warmup)))
        return

    from linmem._io import command_line, git_commit, machine, provenance, write_json
    from linmem.ops.cpu import cpu_path
    from linmem.ops.paths import measure_cpu_paths

    started, commit = time.perf_counter(), git_commit()
    cpu = machine()["cpu"]
    path = cpu_path(measure_cpu_paths)  # measured (or read) before any timing
    print(f"CPU: {cpu}, {os.cpu_count()} CPUs; LMN CPU path: {path}", flush=True)
    cases = [(m, p, load) for m in args.models for p in args.policies for load in args.loads]
    runs: dict[tuple, list[dict]] = {case: [] for case in cases}
    for round_ in range(args.rounds):  # interleaved: drift of the shared machine hits all alike
        for case in cases:
            runs[case].append(measure(*case, args))
            print(f"round {round_ + 1}: {' '.join(case)} {runs[case][-1]['fps'] / 1e3:.1f}k "
                  "frames/s", flush=True)
    rows = []
    for model_key, policy, load in cases:
        results = runs[model_key, policy, load]
        fps = statistics.median(r["fps"] for r in results)
        quiet = statistics.median(r["fps"] for r in runs.get((model_key, policy, "quiet"), []))\
            if (model_key, policy, "quiet") in runs else None
        row = {"model": model_key, "policy": policy, "load": load, "fps": fps,
               "fps_rounds": [r["fps"] for r in results], "threads": results[0]["threads"],
               "wait": results[0]["wait_policy"], "of_quiet": fps / quiet if quiet else None}
        rows.append(row)
        share = f"{100 * row['of_quiet']:5.1f}% of quiet" if quiet else ""
        print(f"{model_key:6s} {policy:10s} threads {row['threads']} wait {row['wait']:8s} "
              f"{load:6s} {fps / 1e3:8.1f}k frames/s {share}", flush=True)
    if args.json:
        write_json(args.json, {
            **provenance(command_line(), commit, 0, None, time.perf_counter() - started),
            "cpu_count": os.cpu_count(), "lmn_cpu_path": path, "rows": rows,
            "units": "training frames per second (batch 32, 128 steps, Adam)"})


if __name__ == "__main__":
    main()
