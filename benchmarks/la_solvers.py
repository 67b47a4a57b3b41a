"""Linear autoencoder solvers side by side: fit time, peak memory and error against dense SVD.

Each fit runs in a fresh subprocess, so that its peak resident memory (``ru_maxrss``) is its own;
the memory of a process that only imports linmem is printed too and subtracted. The error is the
optimal rank-p error of Xi reached by the solver, ``1 - sum(s_i^2) / ||Xi||_F^2`` (the tail energy;
equal errors mean equally good subspaces), and for JSB Chorales also the autoencoder's recursive
reconstruction error on its first training sequences. Every fit gets the same float64 input; with
the default ``--tol 1e-2`` the randomized solver iterates in float32 and takes its final
Rayleigh-Ritz step in float64 (column "iterated").

    python benchmarks/la_solvers.py [--data-dir DIR] [--part jsb|window|full|all] [--json OUT]
                                    [--tol T] [--n-oversamples K]

Targets (issue 3): JSB full length, randomized at least 20x faster and 10x less peak memory than
dense at equal error (1e-3 relative); every data set at full length, p = 500, under 5 minutes
and 4 GB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "polyphonic"


def one(spec: dict) -> dict:
    """Run one fit in this process (the child) and return its measurements."""
    from linmem.data import load_polyphonic
    from linmem.la import LinearAutoencoder

    train = load_polyphonic(spec["data"], root=spec["data_dir"], progress=False)["train"]
    seqs = [s.astype("float64") for s in train]
    ps = spec["p"] if isinstance(spec["p"], list) else [spec["p"]]
    start = time.perf_counter()
    fitted = LinearAutoencoder(max(ps), window=spec["window"], solver=spec["solver"],
                               random_state=0, tol=spec.get("tol", 1e-8),
                               n_oversamples=spec.get("n_oversamples")).fit(seqs)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results = []
    for p in ps:  # the exact solvers' components are nested: one SVD serves every p
        la = fitted if p == fitted.n_components_ else fitted.truncated(p)
        result = {**spec, "p": p, "seconds": seconds, "n_components": la.n_components_,
                  "relative_svd_error": la.relative_svd_error_,
                  "n_iter": getattr(la, "n_iter_", None),
                  "iteration_dtype": getattr(la, "iteration_dtype_", None), "peak_rss_mb": peak}
        if spec.get("la_error_sequences"):
            subset = seqs[: spec["la_error_sequences"]]
            result["la_error_first_seqs"] = la.reconstruction_error(subset)
        results.append(result)
    return results


def spawn(spec: dict) -> list[dict]:
    out = subprocess.run([sys.executable, __file__, "--one", json.dumps(spec)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return [{**spec, "error": out.stderr.strip().splitlines()[-1:]}]
    return json.loads(out.stdout.strip().splitlines()[-1])


def baseline_rss() -> float:
    code = ("import resource, linmem.la, linmem.data;"
            "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)")
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                check=True).stdout)


def row(r: dict, base: float) -> str:
    if "error" in r:
        return (f"{r['data']:<11}{r['solver']:<11}{r['window']!s:>7}{r['p']:>6}   "
                f"FAILED {r['error']}")
    la = r.get("la_error_first_seqs")
    la_txt = f"  la {la['la']:.3e} svd {la['svd']:.3e}" if la else ""
    return (f"{r['data']:<11}{r['solver']:<11}{r['window']!s:>7}{r['p']:>6}{r['n_components']:>6}"
            f"{r['seconds']:>10.2f}{r['peak_rss_mb'] - base:>10.0f}"
            f"{r['relative_svd_error']:>14.6e}{r['n_iter'] if r['n_iter'] is not None else '':>6}"
            f"{r.get('iteration_dtype') or '':>9}" + la_txt)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default=os.environ.get("LINMEM_DATA", str(DEFAULT_DATA)))
    parser.add_argument("--part", choices=["jsb", "window", "full", "all"], default="all")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--tol", type=float, default=1e-2,
                        help="the randomized solver's tolerance on each Ritz value's relative "
                             "change (1e-2 reaches the dense error to within 1e-3 on JSB)")
    parser.add_argument("--n-oversamples", type=int, default=None,
                        help="randomized solver's oversampling (default: the library's, p/2)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one(json.loads(args.one))))
        return
    from linmem._io import command_line, git_commit, provenance, write_json

    started = time.perf_counter()
    commit = git_commit()  # the code that runs, taken before any later edit of the tree
    base = baseline_rss()
    print(f"peak RSS of a process that only imports linmem: {base:.0f} MB (subtracted below)")
    print(f"{'data':<11}{'solver':<11}{'window':>7}{'p':>6}{'kept':>6}{'fit s':>10}"
          f"{'peak MB':>10}{'rel. SVD err':>14}{'iters':>6}{'iterated':>9}")
    results = []
    datasets = ("jsb", "piano", "nottingham", "musedata")

    def run(**spec):
        spec = {"data_dir": args.data_dir, "tol": args.tol,
                "n_oversamples": args.n_oversamples, **spec}
        rows = spawn(spec)
        for r in rows:
            results.append(r)
            print(row(r, base), flush=True)
        return rows

    if args.part in ("jsb", "all"):
        sizes = [100, 300, 1000]
        print("(dense: one full SVD of Xi serves every p; its time and memory are per fit)")
        dense_rows = run(data="jsb", solver="dense", window=None, p=sizes,
                         la_error_sequences=10)
        dense_by_p = {r["p"]: r for r in dense_rows if "error" not in r}
        for p in sizes:
            (fast,) = run(data="jsb", solver="randomized", window=None, p=p,
                          la_error_sequences=10)
            dense = dense_by_p.get(p)
            if dense is not None and "error" not in fast:
                gap = abs(fast["relative_svd_error"] - dense["relative_svd_error"]) / max(
                    dense["relative_svd_error"], 1e-300)
                print(f"  -> p={p}: randomized {dense['seconds'] / fast['seconds']:.1f}x faster, "
                      f"{(dense['peak_rss_mb'] - base) / max(fast['peak_rss_mb'] - base, 1):.1f}x "
                      f"less peak memory, error gap {gap:.1e} (relative)", flush=True)
    if args.part in ("window", "all"):
        for name in datasets:
            run(data=name, solver="qr", window=10, p=500)
            run(data=name, solver="randomized", window=10, p=500)
    if args.part in ("full", "all"):
        for name in datasets:
            run(data=name, solver="randomized", window=None, p=500)
    if args.json:
        from linmem.data import data_checksum

        checksums = {name: data_checksum(name, args.data_dir) for name in datasets}
        write_json(args.json, {
            **provenance(command_line(), commit, 0, checksums, time.perf_counter() - started),
            "baseline_rss_mb": base, "results": results})


if __name__ == "__main__":
    main()
