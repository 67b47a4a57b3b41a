"""The thread count of a batch-1 training: ``linmem train`` under the paper's protocol (batch 1)
with the command's own choice (one thread at batch 1, ``linmem._threads.training_threads``)
against two threads (``OMP_NUM_THREADS=2``, what it chose before on a 2-core machine), side by
side: each run a fresh process, the settings interleaved round by round; reported per setting,
the median epoch's wall and CPU seconds (``log.jsonl``'s ``epoch_time_s``, ``epoch_cpu_s``, the
first epoch left out: it builds buffers) and the threads the run recorded; under each load of
``--loads``: ``quiet``, and ``busy`` (a Python busy loop beside the run, as
``benchmarks/contention.py``'s, started before it and stopped after). Run it on a machine with
nothing else busy:

    python benchmarks/threads_batch1.py --loads quiet busy --json results/speed/threads-batch1.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from linmem._io import command_line, git_commit, machine, provenance, write_json

SETTINGS = {"linmem": {}, "2 threads": {"OMP_NUM_THREADS": "2"}}


BUSY = "import time\nend = time.time() + 3600\nwhile time.time() < end: pass"


def one_run(env_extra: dict[str, str], args: argparse.Namespace, out: Path, load: str) -> dict:
    """One ``linmem train`` in a fresh process, under ``load``: its epochs' wall and CPU seconds
    (the first left out) and the thread count its ``metrics.json`` records."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    env.update(env_extra)
    linmem = Path(sys.executable).with_name("linmem")
    competitor = subprocess.Popen([sys.executable, "-c", BUSY]) if load == "busy" else None
    try:
        subprocess.run([str(linmem), "train", "--data", args.data, "--model", args.model,
                        "--hidden", str(args.hidden), "--memory", str(args.memory), "--epochs",
                        str(args.epochs), "--protocol", "paper", "--out", str(out), "--quiet",
                        *(["--data-dir", args.data_dir] if args.data_dir else [])],
                       env=env, check=True, capture_output=True, text=True)
    finally:
        if competitor is not None:
            competitor.kill()
            competitor.wait()
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()][1:]
    threads = json.loads((out / "metrics.json").read_text())["machine"].get("threads")
    return {"wall": [r["epoch_time_s"] for r in rows], "cpu": [r["epoch_cpu_s"] for r in rows],
            "threads": threads}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", default="jsb")
    parser.add_argument("--model", default="lmn-b")
    parser.add_argument("--hidden", type=int, default=250)
    parser.add_argument("--memory", type=int, default=250)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each setting, interleaved")
    parser.add_argument("--loads", nargs="+", choices=("quiet", "busy"), default=["quiet"])
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    started = time.perf_counter()
    runs = {(load, name): [] for load in args.loads for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for load, name in runs:
                out = Path(tmp) / f"{load}-{name.replace(' ', '-')}-{round_}"
                runs[load, name].append(one_run(SETTINGS[name], args, out, load))
    rows: dict[str, dict] = {}
    for (load, name), done in runs.items():
        wall = [w for r in done for w in r["wall"]]
        cpu = [c for r in done for c in r["cpu"]]
        rows.setdefault(load, {})[name] = {
            "epoch_wall_s": statistics.median(wall), "epoch_cpu_s": statistics.median(cpu),
            "epoch_wall_range_s": [min(wall), max(wall)],
            "threads_recorded": sorted({r["threads"] for r in done}, key=str),
            "epochs_timed": len(wall)}
    print(f"{args.model}({args.hidden}, {args.memory}) on {args.data}, paper protocol (batch 1), "
          f"{args.rounds} runs of {args.epochs} epochs per setting, interleaved; "
          f"CPU: {machine()['cpu']}")
    for load, settings in rows.items():
        base = settings["2 threads"]
        for name, row in settings.items():
            print(f"  {load:<6} {name:<10} epoch {row['epoch_wall_s']:.3f} s wall "
                  f"({row['epoch_wall_range_s'][0]:.3f}-{row['epoch_wall_range_s'][1]:.3f}), "
                  f"{row['epoch_cpu_s']:.3f} s CPU; threads recorded {row['threads_recorded']}; "
                  f"wall {base['epoch_wall_s'] / row['epoch_wall_s']:.2f}x, "
                  f"CPU {base['epoch_cpu_s'] / row['epoch_cpu_s']:.2f}x of two threads'")
    if args.json:
        write_json(args.json, {"loads": rows, "args": vars(args) | {"json": str(args.json)},
                               **provenance(command_line(), git_commit(), None, None,
                                            time.perf_counter() - started)})


if __name__ == "__main__":
    main()
