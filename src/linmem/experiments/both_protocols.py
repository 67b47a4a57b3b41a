"""Table 2 under both training protocols side by side (the paper's and linmem's: each
configuration selected on validation under each), and the ablation's tables, one protocol
factor at a time (:mod:`linmem.experiments.ablation` computes them): what
:func:`linmem.experiments.report.build_report` adds to a report given the other protocol's."""

from __future__ import annotations

import json
from collections.abc import Sequence

from linmem._io import made_by
from linmem.experiments.paper import PAPER_TABLE2, TABLE2_DATASETS, TABLE2_MODELS, TABLE2_TITLES
from linmem.experiments.protocol_choice import ranges_apart
from linmem.experiments.seed_groups import failures_text, seeds_lines, spread_text, variant_text
from linmem.experiments.table2 import FAILED_MARK, FAILED_TEXT, all_failed
from linmem.models import display_name
from linmem.registry import REGISTRY

__all__ = ["PROTOCOL_TITLES", "ablation_markdown", "ablation_record_markdown",
           "both_protocols_lines", "protocols_markdown", "pruner_markdown"]


def protocols_markdown(paper: Sequence[dict], linmem: Sequence[dict],
                       command: str | None = None) -> str:
    """Table 2 under both training protocols side by side: per data set and model
    the paper's figure, ours under the paper's protocol (the per-frame mean first: the paper's
    metric; the global accuracy beside it) and ours under linmem's, each cell the test accuracy
    of the configuration selected on that accuracy's validation score. ``paper`` and ``linmem``
    are the two reports' records (:func:`linmem.experiments.studies.search_records`,
    :func:`summary_file_records`)."""
    return "\n".join(_protocols_lines(paper, linmem) + made_by(command)) + "\n"


def _protocols_lines(paper: Sequence[dict], linmem: Sequence[dict]) -> list[str]:
    def by_key(records: Sequence[dict]) -> dict[tuple[str, str], dict]:
        return {(r["dataset"], r["model"]): r for r in records if r.get("test_acc") is not None}

    def cells(r: dict | None, failed: bool) -> list[str]:
        if r is None:
            return [FAILED_MARK if failed else "–"] * 2
        mark = "" if r.get("grid") == "runs" or r.get("grid_complete") else "†"
        frame = (r.get("frame_selection") or {}).get("test_acc_frame")
        return [("–" if frame is None else f"{frame:.2f}{mark}"), f"{r['test_acc']:.2f}{mark}"]

    ours, theirs = by_key(paper), by_key(linmem)
    ours_failed, theirs_failed = all_failed(paper), all_failed(linmem)
    failed = ours_failed | theirs_failed
    lines = ["| data set | model | paper | paper protocol: per-frame | global | "
             "linmem protocol: per-frame | global |", "|---|---|---:|---:|---:|---:|---:|"]
    for i, d in enumerate(TABLE2_DATASETS):
        for m in TABLE2_MODELS:
            if (d, m) not in ours and (d, m) not in theirs and (d, m) not in failed:
                continue
            published = PAPER_TABLE2[m][i] if m in PAPER_TABLE2 else None
            lines.append(f"| {TABLE2_TITLES[d]} | {_label(m, paper, linmem, d)} | "
                         + ("–" if published is None else f"{published:.2f}") + " | "
                         + " | ".join(cells(ours.get((d, m)), (d, m) in ours_failed)
                                      + cells(theirs.get((d, m)), (d, m) in theirs_failed))
                         + " |")
    lines += ["", "Test frame accuracy in %: the per-frame mean of TP / (TP + FP + FN) (the "
              "metric of the paper's code) and the global one (Bay et al., mir_eval's), each of "
              "the configuration selected on that accuracy's validation score. The paper "
              "protocol: batch 1, BCE averaged over keys and frames, clip 10, the readout's "
              "default initialisation, early stopping on the per-frame accuracy, no pruning; "
              "linmem's: batch 4, the NLL summed over keys, clip 5, the readout bias at the keys' "
              "rates, early stopping on the global accuracy, the median pruner. †: selected "
              "from a grid that is not complete yet. " + (FAILED_TEXT + " " if failed else "")
              + (UNBOUNDED_TEXT + " " if any(map(_unbounded_lmn, (*paper, *linmem))) else "")
              + "–: not run."]
    return lines


UNBOUNDED_TEXT = ("An LMN row whose name gives no bound has the paper's unbounded memory (it was "
                  "trained before the memory bound became the layer's default).")


def _unbounded_lmn(record: dict) -> bool:
    """Whether ``record`` is an LMN's (a model with a memory) with the paper's unbounded memory
    (a record from before the field existed had it)."""
    spec = REGISTRY.get(record.get("model", ""))
    return bool(spec and spec.has_memory) and record.get("memory_bound") is None


def _label(model: str, paper: Sequence[dict], linmem: Sequence[dict], dataset: str) -> str:
    """The model's name, with what sets each protocol's selection apart (a memory bound, a
    departure from its protocol: :func:`variant_text`), each side's where they differ."""
    chosen = [(title, next((r for r in records
                            if (r["dataset"], r["model"]) == (dataset, model)), {}))
              for title, records in (("paper protocol", paper), ("linmem protocol", linmem))]
    sides = [(title, variant_text(r) if r else "") for title, r in chosen]
    texts = {text for _, text in sides}
    if texts == {""}:
        return display_name(model)
    if len(texts) == 1:
        return f"{display_name(model)} ({texts.pop()})"
    # a side without a bound, beside one with it, is the paper's unbounded memory (no longer the
    # LMN's default since the bound became it)
    bounded = any(r.get("memory_bound") is not None for _, r in chosen)
    plain = "unbounded" if bounded else "the defaults"
    return (f"{display_name(model)} ("
            + "; ".join(f"{title}: {text or plain}" for title, text in sides) + ")")


def _ablation_delta(a: dict, key: str) -> str:
    """The variant's mean against the base's, and whether their seeds' ranges overlap."""
    x, y = a["base"].get(key), a["variant"].get(key)
    if x is None or y is None:
        return "–"
    change = f"{y['mean'] - x['mean']:+.2f}"
    if min(x["n"], y["n"]) < 2:  # a single seed has no range to part from another
        return f"{change} (one seed so far)"
    return change + (" (ranges apart)" if ranges_apart(x, y) else "")


def _ablation_seeds(g: dict) -> str:
    text = ", ".join(map(str, g["seeds"]))
    if g.get("diverged_seeds"):
        text += f" ({failures_text(g)})"
    return text


def ablation_markdown(rows: Sequence[dict], command: str | None = None,
                      at: str | None = None) -> str:
    """:func:`linmem.experiments.ablation.ablation_groups` as a table: each configuration's own
    seeds, then one row per factor changed alone; test accuracy per-frame mean (the paper's
    metric) and global."""
    lines = ["| data | model | size, weight decay | changed alone | seeds | test acc % "
             "(per-frame mean) | change | test acc % (global) | change |",
             "|---|---|---|---|---|---:|---:|---:|---:|"]
    shown: set[str] = set()  # each base once (rows read back from ablation.json share none)
    for a in rows:
        b, v = a["base"], a["variant"]
        size = f"({b['hidden']}" + (f", {b['memory']}" if b.get("memory") else "") + ")"
        head = (f"| {TABLE2_TITLES.get(a['dataset'], a['dataset'])} | {a['model']} | "
                f"{size}, {b['weight_decay']:g} |")
        if (key := json.dumps(b, sort_keys=True)) not in shown:
            shown.add(key)
            lines.append(f"{head} – (as selected) | {_ablation_seeds(b)} | "
                         f"{spread_text(b, 'test_acc_frame')} | | {spread_text(b, 'test_acc')} | |")
        change = ", ".join(f"{f} {a['base_values'][f]} → {value}"
                           for f, value in a["factor"].items())
        lines.append(f"{head} {change} | {_ablation_seeds(v)} | "
                     f"{spread_text(v, 'test_acc_frame')} | "
                     f"{_ablation_delta(a, 'test_acc_frame')} | {spread_text(v, 'test_acc')} | "
                     f"{_ablation_delta(a, 'test_acc')} |")
    lines += ["", "Mean ± standard deviation (minimum-maximum) over the seeds; a change is the "
              "difference of the means, \"ranges apart\" where the seeds' ranges do not overlap "
              "(two seeds or more on each side; a seed that diverged, with no score, is named "
              "and left out)."]
    return "\n".join(lines + made_by(command, at)) + "\n"


def pruner_markdown(replays: Sequence[tuple[str, dict]], warmup: int,
                    command: str | None = None, at: str | None = None) -> str:
    """The :func:`linmem.experiments.ablation.replay_pruner` of each ``(study, replay)``: the
    selection with and without the stops."""
    lines = ["| study | trials | stopped | epochs saved | selected, every run to its end: "
             "point, test acc % per-frame (global) | selected with the pruner |",
             "|---|---:|---:|---:|---|---|"]

    def sel(t: dict | None) -> str:
        if t is None:
            return "–"
        glob = "–" if t["test_acc"] is None else f"{t['test_acc']:.2f}"
        frame = "–" if t["test_acc_frame"] is None else f"{t['test_acc_frame']:.2f}"
        return f"{t['point']}: {frame} ({glob})"

    for study, r in replays:
        same = (r["selected"] or {}).get("number") == (r["selected_pruned"] or {}).get("number")
        saved = "–" if r["epochs_saved"] is None else f"{100 * r['epochs_saved']:.0f} %"
        lines.append(f"| {study} | {r['trials']} | {len(r['stopped'])} | {saved} | "
                     f"{sel(r['selected'])} | "
                     f"{'the same' if same else sel(r['selected_pruned'])} |")
    lines += ["", f"The median pruner (from epoch {warmup}) replayed on the grid's finished runs, "
              "each against all the others as if they had finished before it (a search's "
              "pruner sees only those finished by then, after its first few): a run stops at "
              "the first epoch where its best validation score so far is below the median of "
              "the others' at that epoch. The selection is on validation (the runs' own "
              "score), among the runs that were not stopped."]
    return "\n".join(lines + made_by(command, at)) + "\n"


def ablation_record_markdown(record: dict, heading: str = "##") -> str:
    """An ablation's record (``ablation.json``,
    :func:`linmem.experiments.ablation.write_ablation`) as Markdown, its command left out: the
    factors' table (:func:`ablation_markdown`) and the pruner's (:func:`pruner_markdown`), each
    under a ``heading`` of its own."""
    parts = []
    if record.get("factors"):
        parts += [f"{heading} A part of training changed alone", "",
                  ablation_markdown(record["factors"])]
    if record.get("pruner"):
        pruner = record["pruner"]
        parts += [f"{heading} The median pruner", "", pruner_markdown(
            [(s["study"], s) for s in pruner["studies"]], pruner["warmup"])]
    return "\n".join(parts)


PROTOCOL_TITLES = {"paper": "the paper's protocol", "linmem": "linmem's protocol"}


def both_protocols_lines(paper: Sequence[dict], linmem: Sequence[dict], protocol: str,
                         other_seeds: Sequence[dict] = (), ablation: dict | None = None,
                         sources: str = "") -> list[str]:
    """Table 2's section on both training protocols, in the report of ``protocol``
    ('paper' or 'linmem'): each protocol's records side by side
    (:func:`protocols_markdown`), the other protocol's seeds (:func:`seed_groups`: their spread,
    the paper's claims and whether its figures are reached) and an ablation's record (``linmem
    ablation``'s ``ablation.json``) of the paper protocol's parts; ``sources`` names where
    they come from."""
    if protocol not in PROTOCOL_TITLES:
        raise ValueError(f"both protocols side by side: the report's protocol must be one of "
                         f"{', '.join(PROTOCOL_TITLES)}, not {protocol!r}")
    other_title = PROTOCOL_TITLES["linmem" if protocol == "paper" else "paper"]
    lines = ["", "## Both training protocols", "",
             f"The tables above were trained under {PROTOCOL_TITLES[protocol]}; here they are "
             f"beside {other_title}'s" + (f" ({sources})" if sources else "") + ":", "",
             *_protocols_lines(paper, linmem)]
    if other_seeds:
        lines += ["", f"Seeds under {other_title}: its selected configurations trained again "
                  "with other seeds:", "", *seeds_lines(other_seeds)]
    if ablation:
        made = f" (made by `{ablation['command']}`" + (
            f" at commit {ablation['commit']}" if ablation.get("commit") else "") + ")"
        lines += ["", "Which parts of the paper's protocol carry its result, one factor at a "
                  f"time{made}:", "", ablation_record_markdown(ablation, "###").rstrip("\n")]
    return lines
