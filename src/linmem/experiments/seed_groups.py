"""The seeds of a configuration as a group (``linmem reseed``, ``linmem summarize --seeds``,
the reports): their mean, spread and failures per metric, and the paper's two claims per data
set (pret-LMN-B above LMN-B, each against the published figure), a failed seed counted below
every score."""

from __future__ import annotations

import json
from collections.abc import Sequence

import numpy as np

from linmem.experiments.paper import (
    PAPER_ACTIVATION,
    PAPER_TABLE2,
    TABLE2_DATASETS,
    TABLE2_TITLES,
)
from linmem.models import activation_of, display_name
from linmem.training.runs import failed_on

__all__ = ["MIN_CLAIM_SEEDS", "SEED_METRICS", "failures_text", "row_label", "seed_groups",
           "seeds_lines", "seeds_markdown", "seeds_text", "size_text", "spread_text",
           "valid_seeds_markdown", "variant_text"]

SEED_METRICS = ("test_acc", "test_acc_frame", "test_nll", "valid_acc", "valid_acc_frame")


def _otheractivation_of(group: dict) -> str | None:
    """The seed group's activation where it is not its model's default, else None."""
    act = group.get("nonlinearity")
    return None if act == activation_of({"model": group["model"]}) else act


def variant_text(group: dict) -> str:
    """What sets a seed group's or a selection's configuration apart beyond its model: its
    activation when not the model's default, its memory bound and the protocol fields it
    departs from (``"bound 0.99, init_bias true"``); empty where none."""
    parts = [_otheractivation_of(group)]
    if group.get("memory_bound") is not None:
        parts.append(f"bound {group['memory_bound']:g}")
    if group.get("loop_bound"):
        parts.append("loop bound")
    if group.get("input_path", "none") != "none":
        parts.append(f"input {group['input_path']}")
    if group.get("dropout"):
        parts.append(f"dropout {group['dropout']:g}")
    if group.get("transpose"):
        parts.append(f"transpose {group['transpose']}")
    parts += [f"{k} {json.dumps(v)}" for k, v in group.get("overrides") or ()]
    return ", ".join(p for p in parts if p)


def row_label(group: dict) -> str:
    """The model's display name with :func:`variant_text` in parentheses, where any: how the
    tables of seeds and Table 2 name a row."""
    extra = variant_text(group)
    return display_name(group["model"]) + (f" ({extra})" if extra else "")


def seed_groups(runs: Sequence[dict]) -> list[dict]:
    """Runs (``metrics.json`` records of :func:`collect_metrics`) that differ only in their seed,
    grouped by (data set, model, activation, sizes, weight decay, memory bound, loop bound, input
    path, dropout, transposition, the protocol fields they depart from): per group the seeds that
    finished (``seeds``) and those that failed (``diverged_seeds``: records with a
    ``diverged`` field and no scores, ``failed_on`` where each failed,
    :func:`linmem.training.runs.failed_on`), and the mean, standard deviation (``ddof = 1``),
    minimum and maximum of each of :data:`SEED_METRICS` over the finished ones."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        key = (r["dataset"], r["model"], activation_of(r), r.get("hidden"), r.get("memory"),
               r.get("weight_decay"), r.get("memory_bound"), bool(r.get("loop_bound")),
               r.get("input_path", "none"), r.get("dropout") or 0.0, r.get("transpose") or 0,
               tuple(sorted((r.get("protocol_overrides") or {}).items())))
        groups.setdefault(key, []).append(r)
    out = []
    for (dataset, model, act, hidden, memory, wd, bound, loop, path, dropout, transpose,
         overrides), every in groups.items():
        seeds = [r.get("seed") for r in every]
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"{model} on {dataset}: seed {seeds} given twice")
        rs = [r for r in every if "diverged" not in r]
        group = {"dataset": dataset, "model": model, "nonlinearity": act, "hidden": hidden,
                 "memory": memory, "weight_decay": wd,
                 **({"memory_bound": bound} if bound is not None else {}),
                 **({"loop_bound": True} if loop else {}),
                 **({"input_path": path} if path != "none" else {}),
                 **({"dropout": dropout} if dropout else {}),
                 **({"transpose": transpose} if transpose else {}),
                 **({"overrides": list(overrides)} if overrides else {}),
                 "seeds": sorted(r.get("seed") for r in rs),
                 "diverged_seeds": sorted(r.get("seed") for r in every if "diverged" in r),
                 "failed_on": {str(r.get("seed")): failed_on(r) for r in every
                               if "diverged" in r},
                 "runs": sorted(r["run"] for r in every)}
        for key in SEED_METRICS:
            values = np.array([r[key] for r in rs if r.get(key) is not None], dtype=float)
            if len(values):
                group[key] = {"mean": float(values.mean()),
                              "sd": float(values.std(ddof=1)) if len(values) > 1 else None,
                              "min": float(values.min()), "max": float(values.max()),
                              "n": len(values)}
        out.append(group)
    return sorted(out, key=lambda g: (g["dataset"], g["model"], row_label(g)))


MIN_CLAIM_SEEDS = 3  # seeds per model before the seeds' table says whether a claim holds


def seeds_markdown(groups: Sequence[dict]) -> str:
    """The table of :func:`seed_groups` (mean ± sd, range) and the paper's two claims where
    both sides of one are among the groups."""
    return "\n".join(seeds_lines(groups)) + "\n"


def valid_seeds_markdown(groups: Sequence[dict]) -> str:
    """The validation side of :func:`seeds_markdown`'s groups (global and per-frame mean
    accuracy, mean ± sd and range): the scores a choice between groups is made on."""
    lines = ["| data | model | size | weight decay | seeds | valid acc % | valid acc % (per-frame "
             "mean) |", "|---|---|---|---|---|---:|---:|"]
    lines += [_group_row(g, ("valid_acc", "valid_acc_frame")) for g in groups]
    return "\n".join(lines) + "\n"


def size_text(group: dict) -> str:
    """A seed group's sizes: "250, 500" (an LMN's functional and memory units), "750"."""
    return f"{group['hidden']}" + (f", {group['memory']}" if group.get("memory") else "")


def seeds_text(group: dict) -> str:
    """A seed group's seeds, those that finished, then the failed named: "1, 3 (seed 2
    diverged)"."""
    failures = failures_text(group)
    return " ".join(filter(None, [", ".join(map(str, group["seeds"])),
                                  f"({failures})" if failures else ""]))


def _group_row(group: dict, keys: Sequence[str]) -> str:
    """A seed group's row: data set, label, size, decay, seeds (the failed named), then
    ``spread_text`` of each of ``keys``."""
    cells = [TABLE2_TITLES.get(group["dataset"], group["dataset"]), row_label(group),
             size_text(group), f"{group['weight_decay']:g}", seeds_text(group),
             *(spread_text(group, k) for k in keys)]
    return "| " + " | ".join(cells) + " |"


def spread_text(group: dict, key: str) -> str:
    """A seed group's ``key`` (:func:`seed_groups`) as "mean ± sd (min-max)"; "–" without it."""
    v = group.get(key)
    if v is None:
        return "–"
    sd = "" if v["sd"] is None else f" ± {v['sd']:.2f}"
    return f"{v['mean']:.2f}{sd} ({v['min']:.2f}-{v['max']:.2f})"


# what a failed seed's row says, by where it failed (linmem.training.runs.FAILURES)
_FAILED_WORDS = {"training": "diverged", "valid": "failed on validation",
                 "test": "failed on test"}


def failures_text(group: dict) -> str:
    """A seed group's failed seeds by where they failed: "seed 1 diverged; seeds 2, 3 failed on
    test" (a pretrained seed's "failed on test in its pretraining"); "" for none."""
    by: dict[str, list[str]] = {}
    for seed in group.get("diverged_seeds", []):
        stage = group.get("failed_on", {}).get(str(seed), "training")
        pre, _, own = stage.rpartition(" ")
        words = _FAILED_WORDS.get(own, own)
        by.setdefault(f"{words} in its pretraining" if pre else words, []).append(str(seed))
    return "; ".join(f"seed{'s' * (len(seeds) > 1)} {', '.join(seeds)} {words}"
                     for words, seeds in by.items())


def _finished_text(group: dict, key: str) -> str:
    """A seed group with fewer than two scores of ``key``: "only seed 3 finished (31.28)"."""
    if not group["seeds"] or key not in group:
        return "no seed finished"
    return f"only seed {group['seeds'][0]} finished ({group[key]['max']:.2f})"


def _with_failures(group: dict, key: str) -> tuple[float, float]:
    """The range of ``key`` the claims compare, a failed seed counted below every score: from
    minus infinity when the group has one, to the best finished seed's (minus infinity when
    none finished)."""
    v = group.get(key)
    low = -np.inf if group.get("diverged_seeds") or v is None else v["min"]
    return low, (v["max"] if v is not None else -np.inf)


def _seeds_run(group: dict) -> int:
    """A seed group's seeds run: those that finished and those that diverged."""
    return len(group["seeds"]) + len(group.get("diverged_seeds", []))


def seeds_lines(groups: Sequence[dict]) -> list[str]:
    lines = ["| data | model | size | weight decay | seeds | test acc % | test acc % (per-frame "
             "mean) | test NLL |", "|---|---|---|---|---|---:|---:|---:|"]
    lines += [_group_row(g, ("test_acc", "test_acc_frame", "test_nll")) for g in groups]
    lines += ["", "Mean ± standard deviation (minimum-maximum) over the seeds of the selected "
              "configuration that have a score; a failed seed (its training diverged, or the "
              "checkpoint chosen on validation gave NaN or inf outputs on the test split) has "
              "none: it is named, and the claims and the comparisons with the published figures "
              "count it below every score. The paper's two claims per data set (test accuracy, "
              "global and per-frame mean): the difference of the means of the seeds that "
              "finished, and whether the seeds' ranges overlap:", ""]
    # against the model run as the paper's Table 2 has it (its default activation); the
    # challenger in each of its activations
    # and under the same memory bound (a model without a memory has none) and protocol
    # departures: a bounded pret-LMN-B against the bounded LMN-B, never the unbounded one
    by = {(g["dataset"], g["model"], _setting(g)): g for g in groups
          if _otheractivation_of(g) is None}
    for dataset in TABLE2_DATASETS:
        for model, other in (("pret-lmn-b", "lmn-b"), ("lmn-b", "lstm")):
            for b in [g for g in groups if (g["dataset"], g["model"]) == (dataset, model)]:
                a = by.get((dataset, other, _setting(b, bounded=other != "lstm")))
                # a side whose every seed failed is a claim too: against it
                if a is not None and ("test_acc" in a or "test_acc" in b):
                    lines.append(_claim_line(TABLE2_TITLES[dataset], b, a))
    reached = [line for g in groups if (line := _reached_line(g)) is not None]
    if reached:
        lines += ["", "The paper's figure (its Table 2) against the seeds' range of test "
                  "accuracy, per-frame mean (the paper's metric), the global range beside: "
                  "reached where the figure lies inside the range, exceeded where the range is "
                  "above it, not reached where below it:", "", *reached]
    return lines


def _setting(group: dict, bounded: bool = True) -> tuple:
    """What a seed group's claims hold fixed besides the data set: its memory bound (``None``
    where ``bounded`` is false: the other side has no memory) and its protocol departures."""
    return (group.get("memory_bound") if bounded else None,
            tuple(tuple(o) for o in group.get("overrides", ())))


def _reached_line(group: dict) -> str | None:
    """Whether a seed group's test accuracy reaches the paper's figure for its model and data
    set: the figure against the seeds' range (per-frame mean, global beside); None where the
    paper has no figure for it (a model or data set it did not run, an activation neither the
    model's default nor the paper's tanh)."""
    try:
        figure = PAPER_TABLE2[group["model"]][TABLE2_DATASETS.index(group["dataset"])]
    except (KeyError, ValueError):
        return None
    if _otheractivation_of(group) not in (None, PAPER_ACTIVATION):
        return None
    head = f"- {TABLE2_TITLES[group['dataset']]}, {row_label(group)}: the paper's {figure:.2f}"
    ran, finished = _seeds_run(group), len(group["seeds"])
    if ran < MIN_CLAIM_SEEDS:
        return (f"{head}; {ran} seed(s) run, {finished} finished; no verdict until "
                f"{MIN_CLAIM_SEEDS} have run.")
    if finished and "test_acc_frame" not in group:
        return f"{head}; no per-frame score in its seeds' records: no verdict."
    if finished < 2:  # no range; a failed seed reaches nothing
        failed = f"{ran - finished} of {ran} seeds failed ({failures_text(group)}; no score)"
        if not finished:
            return f"{head}; {failed}: not reached."
        v, g = group["test_acc_frame"]["max"], group.get("test_acc", {}).get("max")
        glob = f" (global {g:.2f})" if g is not None else ""
        where = "reached by that seed alone" if v >= figure else "not reached by any seed"
        return f"{head}; {failed}, the one finished {v:.2f}{glob}: {where}."

    def verdict(key: str) -> str:
        v = group[key]
        low, high = _with_failures(group, key)
        where = ("reached" if low <= figure <= high else
                 "exceeded" if low > figure else "not reached")
        return f"{v['min']:.2f}-{v['max']:.2f}: {where}"

    failures = failures_text(group)
    also = f"; {failures}, counted below every score" if failures else ""
    glob = f" (global {verdict('test_acc')})" if "test_acc" in group else ""
    return f"{head} against {verdict('test_acc_frame')}{glob}{also}."


def _claim_line(title: str, b: dict, a: dict) -> str:
    """One of the paper's claims on one data set: seed group ``b`` against ``a``."""
    head = f"- {title}: {row_label(b)} against {row_label(a)}: "
    ran = {id(g): _seeds_run(g) for g in (a, b)}
    if min(ran.values()) < MIN_CLAIM_SEEDS:
        return (f"{head}{ran[id(b)]} seed(s) of {row_label(b)} and {ran[id(a)]} of "
                f"{row_label(a)} so far; no verdict under {MIN_CLAIM_SEEDS} each.")
    failed = [f"{row_label(g)}'s {failures_text(g)}" for g in (b, a) if g.get("diverged_seeds")]
    note = (f" ({'; '.join(failed)}: no score, counted below every score in the ranges; the "
            "means are over the seeds that finished)" if failed else "")
    if not (a["seeds"] or b["seeds"]):
        return f"{head}no seed of either finished; no verdict{note}."
    parts = []
    for key, metric in (("test_acc", "global"), ("test_acc_frame", "per-frame mean")):
        if not any(key in g for g in (a, b)) or any(g["seeds"] and key not in g for g in (a, b)):
            continue
        (a_low, a_high), (b_low, b_high) = _with_failures(a, key), _with_failures(b, key)
        apart = b_high < a_low or a_high < b_low
        few = [g for g in (b, a) if len(g["seeds"]) < 2]
        diff = (f"{b[key]['mean'] - a[key]['mean']:+.2f} points {metric}" if not few else
                f"{metric}: " + ", ".join(f"{row_label(g)} {_finished_text(g, key)}" for g in few))
        parts.append(f"{diff}, the ranges "
                     + ("do not overlap (beyond the spread between seeds)" if apart
                        else "overlap (within the spread between seeds)"))
    return head + "; ".join(parts) + note + "."
