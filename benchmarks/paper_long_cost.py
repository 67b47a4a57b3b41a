"""The cost of the paper protocol's grid ``paper-long`` on MuseData, Nottingham and Piano-midi.de,
projected before it starts (issue 43) from two measurements:

- the probes: one or two epochs of LMN-B (250, 250) and LSTM (750) at batch 1 on each data set,
  JSB Chorales included, with the search workers paused (``results/paper-protocol/cost-probes``;
  ``linmem train --data D --model M ... --protocol paper --epochs 1``): each set's CPU seconds
  per epoch over JSB's (:func:`linmem.experiments.projection.probe_ratios`, as ``linmem progress
  --probe``), LMN-B's ratio for the LMNs and the LSTM's for the RNN-like models;
- the CPU time of the same grid points on JSB Chorales under the paper protocol (the search's
  trials, ``cpu_time_s``), the epochs to early stopping taken as equal on every set (under our
  protocol the long sets' runs took 70-300 epochs, as JSB's did: ``results/search_trials.json``).

A point without a JSB trial that stored its CPU time (pret-RNN, part of the GRU's grid, LMN-A's
failed points) is projected at its model's nearest stand-in (the RNN's points; the LSTM's times
0.75, a GRU's work per step; LMN-B's), and said so.
The seeds (three of each selected configuration of LMN-B, pret-LMN-B and the LSTM) are projected
at the grid's dearest point of each. The CPU is printed with the figures.

    OMP_NUM_THREADS=1 python benchmarks/paper_long_cost.py \\
        --storage sqlite:////work/linmem-search/runs/search-paper/search.db
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import optuna

from linmem._io import machine
from linmem.experiments.grids import grid_points, trial_point
from linmem.experiments.projection import probe_ratios

PROBES = Path(__file__).resolve().parents[1] / "results/paper-protocol/cost-probes"
SETS = ("musedata", "nottingham", "piano")
PROBE_NAME = {"musedata": "muse", "nottingham": "nottingham", "piano": "piano", "jsb": "jsb"}
MODELS = ("rnn", "pret-rnn", "lstm", "gru", "lmn-a", "lmn-b", "pret-lmn-b")
STAND_IN = {"pret-rnn": ("rnn", 1.0), "gru": ("lstm", 0.75), "lmn-a": ("lmn-b", 1.0)}


def epoch_cpu(name: str) -> float:
    rows = [json.loads(line) for line in (PROBES / name / "log.jsonl").read_text().splitlines()]
    return statistics.median(r["epoch_cpu_s"] for r in rows)


def jsb_costs(storage: str, model: str) -> dict[str, float]:
    """CPU seconds per finished point of the model's JSB study under the paper protocol."""
    study = optuna.load_study(study_name=f"jsb-{model}-paper@paper", storage=storage)
    out = {}
    for t in study.get_trials(deepcopy=False):
        p = trial_point(t)
        if p is not None and "cpu_time_s" in t.user_attrs:
            out[p.name] = float(t.user_attrs["cpu_time_s"])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--storage", required=True)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    family = {"lmn-b": "memory", "lstm": "recurrent"}  # progress._family of each probe's model
    ratios = probe_ratios([PROBES])
    ratio = {(s, kind): ratios[(s, "jsb", family[kind])] for s in SETS for kind in family}
    print(f"CPU: {machine()['cpu']}; one thread; batch 1 (paper protocol)")
    print("epoch CPU s (JSB / " + " / ".join(SETS) + "):")
    for kind in ("lmn-b", "lstm"):
        print(f"  {kind}: {epoch_cpu(f'jsb-{kind}'):.2f} / "
              + " / ".join(f"{epoch_cpu(f'{PROBE_NAME[s]}-{kind}'):.1f} (x{ratio[s, kind]:.1f})"
                           for s in SETS))
    costs = {m: jsb_costs(args.storage, m) for m in MODELS}
    total, dearest = 0.0, {}
    print("\nmodel: points, JSB CPU h of those points -> projected CPU h per set")
    for model in MODELS:
        kind = "lmn-b" if model.startswith(("lmn", "pret-lmn")) else "lstm"
        points = [p.name for p in grid_points(model, "paper-long")]
        notes, jsb = [], []
        for name in points:
            if name in costs[model]:
                jsb.append(costs[model][name])
            else:
                other, factor = STAND_IN.get(model, (model, 1.0))
                jsb.append(costs[other][name] * factor)
                notes.append(name)
        per_set = {s: sum(jsb) * ratio[s, kind] / 3600 for s in SETS}
        dearest[model] = {s: max(jsb) * ratio[s, kind] / 3600 for s in SETS}
        total += sum(per_set.values())
        stand = (f"  [{len(notes)} of {len(points)} points from "
                 f"{STAND_IN[model][0]}'s JSB trials]" if notes else "")
        print(f"  {model}: {len(points)}, {sum(jsb) / 3600:.2f} -> "
              + ", ".join(f"{s} {h:.1f}" for s, h in per_set.items()) + stand)
    seeds = sum(3 * h for m in ("lmn-b", "pret-lmn-b", "lstm") for h in dearest[m].values())
    print(f"\ngrids: {total:.0f} CPU h; seeds (3 x LMN-B, pret-LMN-B, LSTM, each at its dearest "
          f"point): {seeds:.0f} CPU h; together {total + seeds:.0f} CPU h")


if __name__ == "__main__":
    main()
