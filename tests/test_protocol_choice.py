"""Which protocol linmem train uses by default (linmem.experiments.protocol_choice): the rule on
seed groups made by hand, and the report that writes it."""

import json

import pytest

from linmem.experiments.protocol_choice import protocol_choice, protocol_choice_markdown
from linmem.experiments.seed_groups import seed_groups

SETS = ("jsb", "musedata", "nottingham", "piano")


def _groups(scores: dict) -> list[dict]:
    """Seed groups from ``{(data set, model): [(valid per-frame, valid global), ...]}``, a seed
    per pair of scores; the test scores are set far off so that reading them would show."""
    runs = []
    for (dataset, model), seeds in scores.items():
        for seed, (frame, overall) in enumerate(seeds, 1):
            runs.append({"dataset": dataset, "model": model, "hidden": 250, "memory": 250,
                         "weight_decay": 0.0, "seed": seed, "valid_acc_frame": frame,
                         "valid_acc": overall, "test_acc": 99.0 - seed,
                         "test_acc_frame": 1.0 + seed, "run": f"{dataset}-{model}-s{seed}"})
    return seed_groups(runs)


def test_pairs_are_compared_on_validation_and_undecided_before_the_four_sets():
    paper = _groups({("jsb", "lmn-b"): [(33.0, 29.0), (34.0, 30.0), (35.0, 31.0)],
                     ("jsb", "lstm"): [(34.0, 30.0), (34.0, 30.0), (34.0, 30.0)],
                     ("jsb", "rnn"): [(31.0, 27.0), (31.0, 27.0)]})  # two seeds: no pair
    linmem = _groups({("jsb", "lmn-b"): [(31.0, 28.0), (31.5, 28.5), (32.0, 29.0)],
                      ("jsb", "lstm"): [(33.0, 30.5), (35.0, 30.5), (34.0, 30.5)],
                      ("jsb", "rnn"): [(29.0, 26.0), (29.0, 26.0), (29.0, 26.0)],
                      ("piano", "lmn-b"): [(25.0, 27.0)] * 3})  # no paper seeds: no pair
    choice = protocol_choice(paper, linmem)
    assert [(p["dataset"], p["model"]) for p in choice["pairs"]] == [("jsb", "lmn-b"),
                                                                     ("jsb", "lstm")]
    lmn, lstm = choice["pairs"]
    assert lmn["per-frame"]["paper_minus_linmem"] == pytest.approx(34.0 - 31.5)
    assert lmn["per-frame"]["ranges_apart"] and lmn["per-frame"]["winner"] == "paper"
    assert lmn["global"]["paper_minus_linmem"] == pytest.approx(30.0 - 28.5)
    assert not lmn["global"]["ranges_apart"]  # 29-31 against 28-29 touch at 29
    assert lstm["per-frame"]["paper_minus_linmem"] == pytest.approx(0.0)
    assert lstm["per-frame"]["winner"] == "linmem"  # a tie is no win for the dearer protocol
    assert lstm["global"]["winner"] == "linmem"
    assert choice["wins"] == {"per-frame": {"paper": 1, "linmem": 1},
                              "global": {"paper": 1, "linmem": 1}}
    assert choice["decision"] is None and "1 of 4 data sets" in choice["reason"]
    assert "none yet on MuseData, Nottingham, Piano-midi.de" in choice["reason"]
    # the groups that are no pair yet, with each protocol's finished and diverged seeds
    assert choice["unpaired"] == [
        {"dataset": "jsb", "model": "rnn", "paper": {"finished": 2, "diverged": 0},
         "linmem": {"finished": 3, "diverged": 0}},
        {"dataset": "piano", "model": "lmn-b", "paper": {"finished": 0, "diverged": 0},
         "linmem": {"finished": 3, "diverged": 0}}]
    text = protocol_choice_markdown(choice, "linmem report ...")
    assert "| JSB Chorales | LMN-B | 34.00 ± 1.00 | 31.50 ± 0.50 | +2.50 (apart) |" in text
    assert "99" not in text and "**Decision:** none yet" in text
    assert ("Not compared (fewer than 3 finished seeds under a protocol): JSB Chorales RNN "
            "(paper: 2 finished, linmem: 3 finished); Piano-midi.de LMN-B (paper: none, "
            "linmem: 3 finished).") in text
    # a seed that diverged counts as run, not as finished
    diverged = [{**g, "seeds": g["seeds"][:1], "diverged_seeds": g["seeds"][1:]}
                for g in paper]
    (lstm_unpaired,) = [u for u in protocol_choice(diverged, linmem)["unpaired"]
                        if u["model"] == "lstm"]
    assert lstm_unpaired["paper"] == {"finished": 1, "diverged": 2}
    assert "JSB Chorales LSTM (paper: 1 finished and 2 diverged, linmem: 3 finished)" in \
        protocol_choice_markdown(protocol_choice(diverged, linmem))


def _everywhere(paper_frame, paper_global, linmem_frame, linmem_global):
    """Both protocols' seeds on the four sets for LMN-B: each protocol's three seeds at its
    given (per-frame, global) validation scores plus -0.5, 0, +0.5."""
    def groups(frame, overall):
        return _groups({(d, "lmn-b"): [(frame[i] + e, overall[i] + e) for e in (-0.5, 0, 0.5)]
                        for i, d in enumerate(SETS)})
    return protocol_choice(groups(paper_frame, paper_global),
                           groups(linmem_frame, linmem_global))


def test_the_rule_decides_once_the_four_sets_are_in():
    paper_better = _everywhere([34, 36, 73, 27], [30, 36, 71, 27], [31, 33, 72, 26],
                               [28, 35, 70, 26])
    assert paper_better["decision"] == "paper"
    assert paper_better["wins"]["per-frame"] == {"paper": 4, "linmem": 0}
    assert paper_better["datasets"] == sorted(SETS)
    # the paper protocol higher per-frame on three sets, linmem's higher globally on three
    split = _everywhere([34, 36, 73, 25], [28, 34, 72, 27], [31, 33, 72, 26], [30, 35, 73, 26])
    assert split["wins"] == {"per-frame": {"paper": 3, "linmem": 1},
                             "global": {"paper": 1, "linmem": 3}}
    assert split["decision"] == "linmem" and "per-frame: paper, global: linmem" in split["reason"]
    # two sets each on one metric: no majority there, so linmem's
    tie = _everywhere([34, 36, 71, 25], [30, 36, 71, 25], [31, 33, 72, 26], [28, 35, 72, 26])
    assert tie["wins"]["per-frame"] == {"paper": 2, "linmem": 2}
    assert tie["decision"] == "linmem" and "a tie" in tie["reason"]
    linmem_better = _everywhere([30, 30, 70, 20], [25, 30, 70, 20], [31, 33, 72, 26],
                                [28, 35, 72, 26])
    assert linmem_better["decision"] == "linmem"
    assert "wins a majority of the 4 pairs on both metrics" in linmem_better["reason"]
    # the table says whether linmem train's default follows the decision
    from linmem.training.config import DEFAULT_PROTOCOL

    other = next(p for p in ("paper", "linmem") if p != DEFAULT_PROTOCOL)
    follows, behind = (protocol_choice_markdown(c) for c in (
        {"pairs": [], "wins": {}, "decision": DEFAULT_PROTOCOL, "reason": "r"},
        {"pairs": [], "wins": {}, "decision": other, "reason": "r"}))
    assert ("`linmem train`'s default (`linmem.training.config.DEFAULT_PROTOCOL`): "
            f"{DEFAULT_PROTOCOL}.") in follows
    assert f"): {DEFAULT_PROTOCOL}, not yet the decision's {other}." in behind


def test_the_report_writes_the_choice(tmp_path):
    """``linmem report --compare-seed-runs``: protocol-choice.md and .json from the runs'
    metrics.json under both protocols, and a clear error for a protocol the rule does not
    compare."""
    from linmem.experiments.report import build_report

    def write_runs(root, protocol, frames):
        for seed, frame in enumerate(frames, 1):
            run = root / f"jsb-lmn-b-s{seed}"
            run.mkdir(parents=True)
            (run / "metrics.json").write_text(json.dumps({
                "dataset": "jsb", "model": "lmn-b", "hidden": 20, "memory": 20,
                "weight_decay": 0.0, "seed": seed, "protocol": protocol,
                "valid_acc_frame": frame, "valid_acc": frame - 3, "test_acc": 1.0,
                "test_acc_frame": 2.0, "test_nll": 9.0}))
            (run / "config.json").write_text(json.dumps({"model": "lmn-b", "seed": seed}))

    write_runs(tmp_path / "paper", "paper", [33.0, 34.0, 35.0])
    write_runs(tmp_path / "linmem", "linmem", [30.0, 31.0, 32.0])
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps([{"dataset": "jsb", "model": "lmn-b", "hidden": 20,
                                    "memory": 20, "weight_decay": 0.0, "valid_acc": 28.0,
                                    "test_acc": 27.0, "grid": "runs", "run_dir": "x",
                                    "trials": 1}]))
    out = tmp_path / "out"
    build_report("sqlite:///" + str(tmp_path / "none.db"), None, tmp_path, out,
                 summaries=[summary], seed_runs=[tmp_path / "paper"], protocol="paper",
                 command="linmem report ...", compare_seed_runs=[tmp_path / "linmem"])
    choice = json.loads((out / "protocol-choice.json").read_text())
    (pair,) = choice["pairs"]
    assert pair["per-frame"]["paper_minus_linmem"] == pytest.approx(3.0)
    assert choice["decision"] is None and choice["command"] == "linmem report ..."
    assert "+3.00 (apart)" in (out / "protocol-choice.md").read_text()


def test_train_defaults_to_the_protocol_the_committed_seeds_chose():
    """``linmem train``'s default is the rule's decision on the committed seeds
    (results/paper-protocol/protocol-choice.json, which the report rewrites as seeds land): the
    day the seeds decide otherwise, this fails until the default follows."""
    from pathlib import Path

    from linmem.training.config import DEFAULT_PROTOCOL, TrainConfig

    path = Path(__file__).parent.parent / "results" / "paper-protocol" / "protocol-choice.json"
    committed = json.loads(path.read_text())
    assert committed["decision"] in ("paper", "linmem")
    assert TrainConfig().protocol == DEFAULT_PROTOCOL == committed["decision"]
