"""pret-LMN-B's default activation under the bound (SELU with the loop bound, or tanh) and whether
its bound is 1, chosen on validation: the rule of ``results/bounded-memory/README.md`` ("The
memory loop"), written before its runs.

- the candidates (:data:`CANDIDATES`): pret-LMN-B with SELU and the loop bound, with tanh, and
  with tanh at ``r = 1``, each seeded (1-3) on the data sets of :data:`DATA_SETS`;
- each seed scores its per-frame validation accuracy (the paper's metric), a seed with no score
  0 (a seed that stopped on a divergence keeps its best checkpoint's score); a candidate's score
  is the mean over the data sets of its seeds' mean;
- SELU stays the activation if ``selu-loop`` leads ``tanh`` by more than :data:`LEAD` points,
  else tanh; ``r = 1`` becomes the bound if ``tanh-r1`` leads the chosen one by more than
  :data:`LEAD`, else 0.99.

Validation only: the test scores are not read here.
"""

from __future__ import annotations

from collections.abc import Sequence

from linmem.data import dataset_title
from linmem.experiments.bound_choice import COST_LIMIT, MIN_SEEDS, group_score, seeds_text

__all__ = ["CANDIDATES", "DATA_SETS", "LEAD", "loop_choice", "loop_choice_markdown"]

MODEL = "pret-lmn-b"
# name -> (activation, loop bound, memory bound)
CANDIDATES = {"selu-loop": ("selu", True, 0.99), "tanh": ("tanh", False, 0.99),
              "tanh-r1": ("tanh", False, 1.0)}
DATA_SETS = ("jsb", "piano")
LEAD = COST_LIMIT  # points: the seeds' spread, as the bound's rule


def _candidate(group: dict) -> str | None:
    key = (group.get("nonlinearity"), bool(group.get("loop_bound")), group.get("memory_bound"))
    return next((name for name, value in CANDIDATES.items() if value == key), None)


def loop_choice(groups: Sequence[dict]) -> dict:
    """Apply the module's rule to seed groups (:func:`linmem.experiments.seed_groups.seed_groups`
    of the candidates' seeds): ``{"cells", "scores", "activation", "bound", "reason"}``;
    ``activation`` and ``bound`` are ``"undecided"`` until every candidate has :data:`MIN_SEEDS`
    seeds on every data set. Groups of other configurations are left out."""
    cells: dict[str, dict[str, dict]] = {name: {} for name in CANDIDATES}
    for g in groups:
        name = _candidate(g)
        if g["model"] != MODEL or name is None or g["dataset"] not in DATA_SETS:
            continue
        if g["dataset"] in cells[name]:
            raise ValueError(f"{name} on {dataset_title(g['dataset'])}: two seed groups")
        cells[name][g["dataset"]] = {"score": group_score(g), "finished": len(g["seeds"]),
                                     "failed": len(g["diverged_seeds"])}
    scores = {name: sum(c[d]["score"] for d in DATA_SETS) / len(DATA_SETS)
              for name, c in cells.items() if all(d in c for d in DATA_SETS)}
    short = [f"{name} on {dataset_title(d)}" for name, c in cells.items() for d in DATA_SETS
             if d not in c or c[d]["finished"] + c[d]["failed"] < MIN_SEEDS]
    if short:
        return {"cells": cells, "scores": scores, "activation": "undecided",
                "bound": "undecided", "reason": f"{len(short)} cells lack {MIN_SEEDS} seeds "
                                                f"({', '.join(short)})"}
    lead = scores["selu-loop"] - scores["tanh"]
    chosen = "selu-loop" if lead > LEAD else "tanh"
    r1 = scores["tanh-r1"] - scores[chosen]
    reason = (f"selu-loop {'leads' if lead > 0 else 'trails'} tanh by {abs(lead):.2f} points "
              f"({'more' if lead > LEAD else 'not more'} than {LEAD}); tanh-r1 "
              f"{'leads' if r1 > 0 else 'trails'} {chosen} by {abs(r1):.2f} "
              f"({'more' if r1 > LEAD else 'not more'} than {LEAD})")
    return {"cells": cells, "scores": scores, "activation": CANDIDATES[chosen][0],
            "bound": 1.0 if r1 > LEAD else 0.99, "reason": reason}


def loop_choice_markdown(choice: dict) -> str:
    """The rule's cells and decision as markdown."""
    lines = ["| candidate | " + " | ".join(dataset_title(d) for d in DATA_SETS) + " | score |",
             "|---|" + "---:|" * (len(DATA_SETS) + 1)]
    for name, cells in choice["cells"].items():
        score = choice["scores"].get(name)
        lines.append(f"| {name} | " + " | ".join(seeds_text(cells.get(d)) for d in DATA_SETS)
                     + f" | {'–' if score is None else f'{score:.2f}'} |")
    if choice["activation"] == "undecided":
        verdict = "not decided yet"
    else:
        verdict = (f"pret-LMN-B's activation {choice['activation']}, its bound "
                   f"{choice['bound']:g}")
    lines += ["", "Mean per-frame validation accuracy of each candidate's seeds (a seed with no "
              f"score 0), then over the data sets. Decision: **{verdict}** ({choice['reason']}; "
              "`linmem.experiments.loop_choice`)."]
    return "\n".join(lines) + "\n"
