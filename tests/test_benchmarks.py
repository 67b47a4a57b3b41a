"""The benchmark scripts: their reference models agree with the library's, and they run."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from linmem.batching import collate
from linmem.models import build_model

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_throughput_models_match_the_library():
    """The naive loop (every term of eqs. 6-7 its own operation) and the PyTorch-loop path give
    the model's own outputs and training loss: the benchmark times the same function."""
    bench = _load("throughput")
    torch.manual_seed(0)
    lmn = build_model("lmn-b", 7, 5)
    g = torch.Generator().manual_seed(1)
    seqs = [(torch.rand(n, 88, generator=g) < 0.1).float().numpy() for n in (9, 6)]
    batch = collate(seqs)
    expected = lmn(batch.inputs)
    for wrapped in (bench.NaiveLMN(lmn), bench.PathLMN(lmn, False)):
        torch.testing.assert_close(wrapped(batch.inputs), expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(wrapped.training_loss(batch), lmn.training_loss(batch),
                                   rtol=1e-5, atol=1e-6)


def test_scoring_reference_is_the_former_scoring():
    """benchmarks/scoring.py times the former per-threshold ``FrameScores.update`` against the
    present one: both accumulate the same counts, sums and frames."""
    from dataclasses import asdict

    from linmem.metrics import FrameScores

    bench = _load("scoring")
    g = torch.Generator().manual_seed(0)
    old, new = bench.PerThresholdScores(), FrameScores()
    for frames in (12, 5):
        logits = torch.randn(3, frames, 88, generator=g) * 2 - 2
        logits[torch.rand(logits.shape, generator=g) < 0.1] = 0.0  # exactly at 0.5
        targets = (torch.rand(logits.shape, generator=g) < 0.1).float()
        mask = torch.rand(3, frames, generator=g) < 0.8
        old.update(logits, targets, mask)
        new.update(logits, targets, mask)
    assert asdict(old) == asdict(new)
    assert old.compute() == new.compute()


def test_batch1_two_cores_split_is_the_whole_products():
    """benchmarks/batch1_two_cores.py times two halves of W_hh's products: together they are
    the whole forward product (every gate row once) and the whole backward one."""
    bench = _load("batch1_two_cores")
    hidden = 7
    w = torch.randn(4 * hidden, hidden, generator=torch.Generator().manual_seed(0))
    h, da = torch.randn(hidden), torch.randn(4 * hidden)
    fwd, bwd = torch.empty(4 * hidden), torch.empty(hidden)
    parts = bench.split(w)
    for units, rows, w_fwd, w_bwd in parts:
        fwd[rows] = w_fwd @ h
        bwd[units] = w_bwd.t() @ da
    assert sorted(torch.cat([r for _, r, _, _ in parts]).tolist()) == list(range(4 * hidden))
    torch.testing.assert_close(fwd, w @ h)
    torch.testing.assert_close(bwd, w.t() @ da)


def test_batch1_two_cores_script_runs():
    out = subprocess.run([sys.executable, str(BENCHMARKS / "batch1_two_cores.py"), "--hidden",
                          "16", "--steps", "8", "--calls", "20", "--min-time", "0.05",
                          "--repeats", "1"],
                         capture_output=True, text=True, check=True).stdout
    assert out.startswith("CPU: ") and "one / two = " in out


@pytest.mark.slow
def test_throughput_script_runs(tmp_path):
    """The whole script at a tiny size: every model trains and infers, the ratios it prints are
    the ratios of the rates it records."""
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "throughput.py"), "--sizes", "8x8",
                    "--batches", "2", "--steps", "6", "--rounds", "1", "--min-time", "0.01",
                    "--epochs", "--json", str(out)], check=True, capture_output=True)
    result = json.loads(out.read_text())
    (row,) = result["sizes"]
    for name in ("lmn", "torch-loop", "naive-loop", "rnn", "lstm", "gru"):
        assert row[f"{name}_train_fps"] > 0 and row[f"{name}_infer_fps"] > 0
    assert row["train_vs_lstm"] == pytest.approx(row["lmn_train_fps"] / row["lstm_train_fps"])
    assert result["machine"]["cpu"] and result["commit"] and "cpu" not in result


def test_batch1_parts_script_runs(tmp_path):
    """The batch-1 parts at a tiny size: every cost positive, a call's fixed cost and a step's
    apart, both Adams timed."""
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "batch1_parts.py"), "--sizes", "9",
                    "--steps", "5", "--json", str(out)], check=True, capture_output=True)
    (row,) = json.loads(out.read_text())["rows"]
    for key in ("forward_call_us", "backward_call_us", "adam_ms", "adam_fused_ms"):
        assert row[key] > 0, key
    assert {"forward_step_us", "forward_step_relu_us", "backward_step_us"} <= set(row)


@pytest.mark.slow
def test_baselines_script_runs(tmp_path):
    """linmem.nn.rnns' RNN and GRU against PyTorch's, the ULM against its autograd loop, at a tiny
    size (the script checks that both give the same logits before it times them)."""
    out = tmp_path / "b.json"
    done = subprocess.run([sys.executable, str(BENCHMARKS / "baselines.py"), "--sizes", "8",
                           "--ulm-sizes", "8", "--steps", "6", "--rounds", "1", "--min-time",
                           "0.01", "--json", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    (row,) = json.loads(out.read_text())["sizes"]
    assert row["gru_vs_torch"] == pytest.approx(row["gru_train_fps"] / row["gru-torch_train_fps"])
    assert row["gru_vs_loop"] == pytest.approx(row["gru_train_fps"] / row["gru-loop_train_fps"])
    assert row["rnn_vs_loop"] == pytest.approx(row["rnn_train_fps"] / row["rnn-loop_train_fps"])
    assert row["lstm_vs_torch"] == pytest.approx(row["lstm_train_fps"]
                                                 / row["lstm-torch_train_fps"])
    assert row["ulm_vs_autograd"] > 0


def test_ab_trees_names_an_exported_tree_by_its_commit_file(tmp_path):
    """A tree exported by git archive (the device session's old tree) is named by its COMMIT
    file, not by a checkout around it; a tree in no checkout is named as unknown."""
    commit_of = _load("ab_trees").commit_of
    (tmp_path / "COMMIT").write_text("147caa0a26e023d6d925891d44b44c2f94c457aa\n")
    assert commit_of(tmp_path) == "147caa0a26e023d6d925891d44b44c2f94c457aa"
    (tmp_path / "COMMIT").unlink()
    assert commit_of(tmp_path).startswith("unknown")


@pytest.mark.slow
def test_ab_trees_script_runs(tmp_path):
    """Two trees (here the same one twice) timed in interleaved processes: a rate per tree and
    size, and the ratio of the medians."""
    out = tmp_path / "ab.json"
    tree = str(BENCHMARKS.parent)
    subprocess.run([sys.executable, str(BENCHMARKS / "ab_trees.py"), "--trees", tree, tree,
                    "--sizes", "6x5", "--rounds", "2", "--min-time", "0.05", "--json", str(out)],
                   check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert [row["mode"] for row in result["rows"]] == ["train", "infer"]
    for row in result["rows"]:
        assert row["a_fps"] > 0 and row["b_over_a"] == pytest.approx(row["b_fps"] / row["a_fps"])
    assert len(result["runs"][tree]["6x5"]) == 4  # both trees are this one: 2 rounds each
    assert result["trees"]["a"]["commit"] == result["trees"]["b"]["commit"]


def test_path_choice_script_runs(tmp_path):
    """Both orders of measurement, one trial each beside one busy process: every trial chose a
    path the CPU runs (or the loop), and the record keeps each variant's speedup per trial."""
    from linmem.ops.cpu import kernel_variants

    variants = kernel_variants()
    if not variants:  # no compiler here: the script says so and stops
        proc = subprocess.run([sys.executable, str(BENCHMARKS / "path_choice.py")],
                              capture_output=True, text=True)
        assert proc.returncode != 0 and "no compiled kernel" in proc.stderr
        return
    out = tmp_path / "p.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "path_choice.py"), "--trials", "1",
                    "--load", "1", "--json", str(out)], check=True, capture_output=True)
    result = json.loads(out.read_text())
    assert set(result["results"]) == {"one after the other, wall clock", "in turns, CPU time"}
    for record in result["results"].values():
        assert sum(record["choices"].values()) == 1
        assert set(record["choices"]) <= {*variants, "loop"}
        assert all(len(s) == 1 and s[0] > 0 for s in record["speedup_over_loop"].values())
    assert result["load"] == 1 and result["machine"]["cpu"] and result["commit"]


def test_rnnrbm_step_reference_is_the_former_chain():
    """The benchmark's former chain gives the library's numbers (the same draws in the same
    order): the two ways it times compute the same step."""
    bench = _load("rnnrbm_step")
    from linmem.nn.rnnrbm import gibbs_chain

    g = torch.Generator().manual_seed(0)
    w, b_v, b_h = torch.randn(7, 4, generator=g), torch.randn(2, 3, 7), torch.randn(2, 3, 4)
    v = (torch.rand(2, 3, 7, generator=g) < 0.4).float()
    for beta in (1.0, 0.5):
        expected = gibbs_chain(v, w, b_v, b_h, 3, torch.Generator().manual_seed(2), beta)
        former = bench.former_gibbs_chain(v, w, b_v, b_h, 3, torch.Generator().manual_seed(2),
                                          beta)
        assert torch.equal(former, expected)
    torch.manual_seed(0)
    model = bench.RNNRBM(n_recurrent=5, n_hidden=6, predict_steps=4, burn_in=1).eval()
    x = (torch.rand(2, 9, 88, generator=g) < 0.1).float()
    assert torch.equal(bench.former_marginals(model, x), model.marginals(x))


@pytest.mark.slow
def test_cuda_throughput_script_runs_on_the_cpu(tmp_path, data_dir):
    """The GPU benchmark's smoke test where there is no GPU (``--device cpu``): every model
    trains and infers, an epoch of real data is timed, the ratios are those of the rates, and a
    progress table's studies of the timed data set get their projection."""
    out = tmp_path / "c.json"
    progress = tmp_path / "progress.md"
    progress.write_text(
        "| study | points done / grid | failed | running | CPU h | per point | left |\n"
        "|---|---:|---:|---:|---:|---:|---:|\n"
        "| jsb-lmn-b-paper@paper | 30 / 30 | 0 | 0 | 1.21 | 0.04 | 0.00 |\n"
        "| jsb-lstm-paper (3 points: trial's stored time) | 25 / 25 | 0 | 0 | 0.85 | 0.03 | 0 |\n"
        "| nottingham-lmn-b-reduced | 6 / 6 | 0 | 0 | 4.02 | 0.67 | 0.00 |\n")
    subprocess.run([sys.executable, str(BENCHMARKS / "cuda_throughput.py"), "--device", "cpu",
                    "--sizes", "8x8", "--batches", "2", "--steps", "6", "--rounds", "1",
                    "--min-time", "0.01", "--naive", "--tile-sweep", "auto", "4,32,32,0",
                    "16,32,32,1", "--epochs", "jsb", "--epoch-size", "6x5",
                    "--epoch-batches", "1", "4", "--cpu-frames", "300", "--epoch-loop",
                    "--data-dir", str(data_dir), "--progress", str(progress),
                    "--json", str(out)], check=True, capture_output=True)
    result = json.loads(out.read_text())
    (row,) = result["sizes"]
    for name in ("lmn", "lmn-fused", "lmn-loop", "naive-loop", "rnn", "lstm", "gru", "lmn-cpu"):
        assert row[f"{name}_train_fps"] > 0 and row[f"{name}_infer_fps"] > 0
    assert row["lmn-fused_train_vs_lstm"] == pytest.approx(
        row["lmn-fused_train_fps"] / row["lstm_train_fps"])
    (tiles,) = result["tiles"]
    assert tiles["default"]["BLOCK_B"] == 1 and all(
        tiles[f"train_fps[{t}]"] > 0 for t in ("auto", "4,32,32,0", "16,32,32,1"))
    one, four = result["epochs"]
    assert (one["dataset"], one["batch"], four["batch"]) == ("jsb", 1, 4)
    subprocess.run([sys.executable, str(BENCHMARKS / "cuda_throughput.py"), "--device", "cpu",
                    "--sizes", "8x8", "--batches", "3", "--steps", "4", "--rounds", "1",
                    "--min-time", "0.01", "--tiles-only", "--tile-sweep", "auto", "2,32,32,0",
                    "--epochs", "--progress", "--json", str(tmp_path / "t.json")],
                   check=True, capture_output=True)
    alone = json.loads((tmp_path / "t.json").read_text())
    assert alone["sizes"] == [] and alone["epochs"] == []
    assert [row["batch"] for row in alone["tiles"]] == [3]
    for name in ("lmn-b", "lmn-b-loop", "lstm", "lmn-b-cpu", "lstm-cpu"):
        assert one[f"{name}_epoch_s"] > 0
    assert one["lmn_device_vs_cpu"] == pytest.approx(one["lmn-b_train_fps"]
                                                     / one["lmn-b-cpu_train_fps"])
    lmn, lstm = result["projected_studies"]  # Nottingham was not timed
    assert lmn["batch"] == 1 and lstm["batch"] == 4
    assert lmn["projected_gpu_hours"] == pytest.approx(
        1.21 * one["lmn-b_epoch_s"] / one["lmn-b-cpu_epoch_s"])
    assert lstm["projected_gpu_hours"] == pytest.approx(
        0.85 * four["lstm_epoch_s"] / four["lstm-cpu_epoch_s"])
    assert result["data_sha256"]["jsb"] and "gpu" not in result["machine"]


def test_paper_long_cost_projects_the_jsb_points_by_the_probes(tmp_path):
    """benchmarks/paper_long_cost.py: each paper-long point's JSB CPU time times the set's probe
    ratio (the committed probes' epoch CPU over JSB's), a missing point from its stand-in."""
    import statistics

    import optuna

    from linmem.experiments.grids import grid_points

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    storage = f"sqlite:///{tmp_path / 'search.db'}"
    hours = {"rnn": 1.0, "pret-rnn": 2.0, "lstm": 3.0, "gru": 4.0, "lmn-a": 5.0, "lmn-b": 6.0,
             "pret-lmn-b": 7.0}
    for model, h in hours.items():
        study = optuna.create_study(study_name=f"jsb-{model}-paper@paper", storage=storage,
                                    direction="maximize")
        points = grid_points(model, "paper-long")
        dist = {k: optuna.distributions.CategoricalDistribution(sorted({p.params[k]
                                                                        for p in points}))
                for k in points[0].params}
        for p in points[1:] if model == "gru" else points:  # the GRU's first point: no trial
            study.add_trial(optuna.trial.create_trial(
                state=optuna.trial.TrialState.COMPLETE, value=30.0, params=p.params,
                distributions=dist, user_attrs={"cpu_time_s": 3600.0 * h}))
    out = subprocess.run([sys.executable, str(BENCHMARKS / "paper_long_cost.py"), "--storage",
                          storage], capture_output=True, text=True, check=True).stdout

    def epoch(name):
        log = Path(BENCHMARKS).parent / "results/paper-protocol/cost-probes" / name / "log.jsonl"
        return statistics.median(json.loads(line)["epoch_cpu_s"]
                                 for line in log.read_text().splitlines())

    lmn = {s: epoch(f"{s}-lmn-b") / epoch("jsb-lmn-b") for s in ("muse", "nottingham", "piano")}
    lstm = {s: epoch(f"{s}-lstm") / epoch("jsb-lstm") for s in ("muse", "nottingham", "piano")}
    line = {ln.split(":")[0].strip(): ln for ln in out.splitlines() if ln.startswith("  ")}
    assert f"musedata {6 * 6.0 * lmn['muse']:.1f}, nottingham {6 * 6.0 * lmn['nottingham']:.1f}" \
        f", piano {6 * 6.0 * lmn['piano']:.1f}" in line["lmn-b"]
    assert f"nottingham {4 * 3.0 * lstm['nottingham']:.1f}" in line["lstm"]
    gru = (3 * 4.0 + 3.0 * 0.75) * lstm["piano"]  # its first point from the LSTM's, x 0.75
    assert f"piano {gru:.1f}" in line["gru"] and "[1 of 4 points from lstm's" in line["gru"]
    grids = sum(len(grid_points(m, "paper-long")) * h * (
        sum(lmn.values()) if m.endswith(("lmn-a", "lmn-b")) else sum(lstm.values()))
        for m, h in hours.items()) - (4.0 - 0.75 * 3.0) * sum(lstm.values())
    assert f"grids: {grids:.0f} CPU h" in out


def test_memory_bound_benchmark_runs_and_its_power_iteration_is_a_lower_bound(data_dir):
    """The candidates it times compute norms of the right kind: the power iteration's estimate
    is below ||W||_2 and converges to it; one small size of the cost part runs."""
    bench = _load("memory_bound")
    g = torch.Generator().manual_seed(0)
    w = torch.randn(20, 20, generator=g, dtype=torch.float64)
    exact = float(torch.linalg.matrix_norm(w, 2))
    u = torch.nn.functional.normalize(torch.randn(20, generator=g, dtype=torch.float64), dim=0)
    estimates = [float(bench.power_iteration_norm(w, u)) for _ in range(500)]
    assert max(estimates) <= exact * (1 + 1e-12)
    assert estimates[-1] == pytest.approx(exact, rel=1e-6)
    rows = bench.cost([6], [4, 5], repeats=1, rounds=2, data_dir=data_dir, warmup=2)
    assert [(r["memory"], r["steps"]) for r in rows] == [(6, 4), (6, 5)]
    assert {"layer memory_bound=0.99", "layer, exact eigenpair (before)", "certified (linmem)",
            "update: layer memory_bound=0.99", "exact, one eigenpair",
            "exact, SVD (matrix_norm)"} <= set(rows[0])
    loop = bench.cost([6], [4], repeats=1, rounds=1, data_dir=data_dir, warmup=2,
                      columns_of=bench._loop_columns)  # --part loop: the loop bound's cost
    assert {"update: selu, memory bound alone", "update: selu, loop bound (default)",
            "selu, loop bound (default)"} <= set(loop[0])


def test_threads_batch1_script_runs(tmp_path, data_dir):
    """benchmarks/threads_batch1.py trains under each setting and reads back the thread count
    each run recorded: one thread by the command's choice at batch 1, two where asked."""
    out = tmp_path / "t.json"
    subprocess.run([sys.executable, str(BENCHMARKS / "threads_batch1.py"), "--hidden", "4",
                    "--memory", "3", "--epochs", "2", "--rounds", "1", "--loads", "quiet",
                    "busy", "--data-dir", str(data_dir), "--json", str(out)], check=True,
                   capture_output=True)
    loads = json.loads(out.read_text())["loads"]
    assert set(loads) == {"quiet", "busy"}
    rows = loads["busy"]
    assert rows["linmem"]["threads_recorded"] == [1]
    assert rows["2 threads"]["threads_recorded"] == [2]
    assert all(r["epochs_timed"] == 1 and r["epoch_wall_s"] > 0 for r in rows.values())
