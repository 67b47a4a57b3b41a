"""Which training protocol ``linmem train`` uses by default: the seeds of the
selected configurations under both protocols, compared on validation.

The rule, fixed before the long sets' seeds were in:

- a *pair* is a (data set, model) with at least :data:`MIN_SEEDS` finished seeds under each
  protocol (:func:`linmem.experiments.seed_groups.seed_groups` groups; the model at its Table 2
  activation);
- per pair and metric (the per-frame mean, the paper's; the global accuracy, Bay et al.'s) the
  protocol with the higher validation mean over its seeds wins the pair;
- the default is decided once the pairs cover all four data sets: the paper protocol if it wins
  a majority of the pairs on both metrics, otherwise linmem's, the cheaper one (batch 4 against
  1: a JSB grid costs 3.5 times less CPU).

Validation only: the test scores are not read here.
"""

from __future__ import annotations

from collections.abc import Sequence

from linmem._io import made_by
from linmem.data import DATASETS, dataset_title
from linmem.models import activation_of, display_name
from linmem.training.config import DEFAULT_PROTOCOL

__all__ = ["METRICS", "MIN_SEEDS", "protocol_choice", "protocol_choice_markdown", "ranges_apart"]

MIN_SEEDS = 3
METRICS = (("valid_acc_frame", "per-frame"), ("valid_acc", "global"))
PROTOCOLS = ("paper", "linmem")


def ranges_apart(x: dict, y: dict) -> bool:
    """Whether two seed groups' ranges of one metric
    (:func:`linmem.experiments.seed_groups.seed_groups`) do not overlap."""
    return y["min"] > x["max"] or x["min"] > y["max"]


def _by_pair(groups: Sequence[dict]) -> dict[tuple[str, str], dict]:
    """Seed groups keyed (data set, model), at the model's default activation only."""
    return {(g["dataset"], g["model"]): g for g in groups
            if g.get("nonlinearity") == activation_of({"model": g["model"]})}


def protocol_choice(paper: Sequence[dict], linmem: Sequence[dict]) -> dict:
    """Apply the module's rule to the seed groups of each protocol: ``{"pairs", "wins",
    "datasets", "decision", "reason", "unpaired"}``, ``decision`` ``"paper"``, ``"linmem"`` or
    None (not decided yet: the pairs do not cover every data set); ``unpaired``: the (data set,
    model) with seeds under one protocol at least but fewer than :data:`MIN_SEEDS` finished
    under one, each protocol's finished and diverged seeds (not compared)."""
    a, b = _by_pair(paper), _by_pair(linmem)
    pairs, unpaired = [], []
    order = {d: i for i, d in enumerate(DATASETS)}
    for key in sorted(set(a) | set(b), key=lambda k: (order.get(k[0], len(order)), k)):
        groups = {"paper": a.get(key), "linmem": b.get(key)}
        if any(g is None or len(g["seeds"]) < MIN_SEEDS for g in groups.values()):
            unpaired.append({"dataset": key[0], "model": key[1], **{
                p: {"finished": len(g["seeds"]) if g else 0,
                    "diverged": len(g["diverged_seeds"]) if g else 0}
                for p, g in groups.items()}})
            continue
        pair = {"dataset": key[0], "model": key[1]}
        for metric, name in METRICS:
            if any(metric not in g for g in groups.values()):
                break
            values = {p: groups[p][metric] for p in PROTOCOLS}
            diff = values["paper"]["mean"] - values["linmem"]["mean"]
            apart = ranges_apart(values["paper"], values["linmem"])
            pair[name] = {**values, "paper_minus_linmem": diff, "ranges_apart": apart,
                          "winner": "paper" if diff > 0 else "linmem"}
        else:
            pairs.append(pair)
    wins = {name: {p: sum(pair[name]["winner"] == p for pair in pairs) for p in PROTOCOLS}
            for _, name in METRICS}
    datasets = sorted({pair["dataset"] for pair in pairs})
    missing = [d for d in DATASETS if d not in datasets]
    if missing:
        decision = None
        reason = (f"seeds under both protocols on {len(datasets)} of {len(DATASETS)} "
                  f"data sets, none yet on {', '.join(DATASETS[d].title for d in missing)}")
    else:
        majority = {name: next((p for p in PROTOCOLS if 2 * w[p] > len(pairs)), None)
                    for name, w in wins.items()}
        if len(set(majority.values())) == 1 and None not in majority.values():
            decision = majority["per-frame"]
            reason = f"{decision} wins a majority of the {len(pairs)} pairs on both metrics"
        else:
            decision = "linmem"
            reason = ("no protocol wins a majority on both metrics (" + ", ".join(
                f"{name}: {majority[name] or 'a tie'}" for name in majority)
                + "): linmem's, the cheaper protocol")
    return {"pairs": pairs, "wins": wins, "datasets": datasets, "decision": decision,
            "reason": reason, "unpaired": unpaired}


def _spread(v: dict) -> str:
    sd = "" if v.get("sd") is None else f" ± {v['sd']:.2f}"
    return f"{v['mean']:.2f}{sd}"


def _seed_count(v: dict) -> str:
    """An unpaired group's seeds under one protocol: "none", "3 finished", "1 finished and 2
    diverged"."""
    if not (v["finished"] or v["diverged"]):
        return "none"
    return f"{v['finished']} finished" + (f" and {v['diverged']} diverged" if v["diverged"]
                                          else "")


def protocol_choice_markdown(choice: dict, command: str | None = None) -> str:
    """:func:`protocol_choice`'s result as a table, the tally and the decision."""
    lines = ["| data set | model | per-frame: paper | linmem | paper - linmem | global: paper "
             "| linmem | paper - linmem |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for pair in choice["pairs"]:
        cells = []
        for _, name in METRICS:
            v = pair[name]
            cells += [_spread(v["paper"]), _spread(v["linmem"]),
                      f"{v['paper_minus_linmem']:+.2f}" + (" (apart)" if v["ranges_apart"]
                                                           else "")]
        lines.append(f"| {dataset_title(pair['dataset'])} | "
                     f"{display_name(pair['model'])} | " + " | ".join(cells) + " |")
    waiting = "; ".join(
        f"{dataset_title(u['dataset'])} {display_name(u['model'])} (paper: "
        f"{_seed_count(u['paper'])}, linmem: {_seed_count(u['linmem'])})"
        for u in choice.get("unpaired", ()))
    tally = "; ".join(f"{name}: the paper protocol higher in {w['paper']}, linmem's in "
                      f"{w['linmem']}" for name, w in choice["wins"].items())
    lines += ["", f"Validation frame accuracy in %, mean ± sd over the seeds (at least "
              f"{MIN_SEEDS} under each protocol) of each protocol's selected configuration; "
              "(apart): the seeds' ranges do not overlap. Pairs: " + (tally or "none yet") + ".",
              *(["", f"Not compared (fewer than {MIN_SEEDS} finished seeds under a protocol): "
                 f"{waiting}."] if waiting else []),
              "", "The rule (`linmem.experiments.protocol_choice`, fixed before the long sets' "
              "seeds): once "
              "the pairs cover the four data sets, the protocol that is higher in a majority "
              "of them on both metrics becomes `linmem train`'s default; otherwise linmem's "
              "(3.5 times cheaper). Test scores are not read.", "",
              f"**Decision:** {choice['decision'] or 'none yet'} ({choice['reason']}).", "",
              "`linmem train`'s default (`linmem.training.config.DEFAULT_PROTOCOL`): "
              f"{DEFAULT_PROTOCOL}"
              + ("" if choice["decision"] in (None, DEFAULT_PROTOCOL) else
                 f", not yet the decision's {choice['decision']}") + "."]
    return "\n".join(lines + made_by(command)) + "\n"
