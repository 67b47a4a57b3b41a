"""The trainer: metrics file, early stopping, resume after an interruption, divergence."""

import json
import os

import numpy as np
import pytest
import torch

import linmem.training.evaluation
import linmem.training.trainer
import linmem.training.updates
from linmem.metrics import frame_accuracy, frame_nll
from linmem.models import build_model
from linmem.training.config import TrainConfig
from linmem.training.evaluation import evaluate, load_run_model
from linmem.training.trainer import TrainingDiverged, train_loop


def config(**kw):
    # linmem's protocol: the loss summed over the keys, as the hand computations below (the
    # paper protocol's mean loss: tests/test_protocol.py)
    base = dict(protocol="linmem", model="lmn-b", hidden=12, memory=10, batch_size=6, epochs=4,
                patience=10, seed=3)
    return TrainConfig(**{**base, **kw})


def test_metrics_file_and_scores(tmp_path, small):
    metrics = train_loop(config(), tmp_path / "run", progress=False, data=small, command="test")
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved == metrics
    for key in ("valid_acc", "test_acc", "test_nll", "valid_nll", "n_params", "epochs",
                "wall_time_s", "seed", "commit", "command", "data_digest"):
        assert key in saved
    assert saved["command"] == "test" and saved["epochs"] == 4
    # the machine of the timings, against an independent read of /proc/cpuinfo (Linux: CI's)
    info = dict(line.split(":", 1) for line in open("/proc/cpuinfo").read().splitlines()
                if ":" in line)
    info = {k.strip(): v.strip() for k, v in info.items()}
    assert saved["machine"] == {"cpu": f"{info['model name']} (family {info['cpu family']}, "
                                       f"model {info['model']})",
                                "avx512": "avx512f" in info["flags"].split(),
                                "avx2": "avx2" in info["flags"].split(),
                                "cpus": len(os.sched_getaffinity(0)),
                                "threads": torch.get_num_threads()}
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [row["epoch"] for row in log] == [1, 2, 3, 4]
    best_epoch = max(log, key=lambda r: r["valid_acc"])["epoch"]
    assert saved["best_epoch"] == best_epoch
    assert saved["valid_acc"] == pytest.approx(max(r["valid_acc"] for r in log))
    # an independent evaluation of the best checkpoint: one pass per sequence, no batching
    model, _ = load_run_model(tmp_path / "run")
    probs, logits, targets = [], [], []
    with torch.no_grad():
        for seq in small["test"]:
            x = torch.tensor(seq[:-1], dtype=torch.float32)[None]
            z = model(x)[0]
            logits.append(z)
            probs.append(torch.sigmoid(z))
            targets.append(torch.tensor(seq[1:]))
    assert saved["test_acc"] == pytest.approx(
        100 * frame_accuracy(torch.cat(probs), torch.cat(targets)), rel=1e-6)
    assert saved["test_nll"] == pytest.approx(frame_nll(torch.cat(logits), torch.cat(targets)),
                                              rel=1e-5)
    # the threshold chosen on validation (the grid's first best), and the test accuracy at it
    from linmem.metrics import THRESHOLD_GRID

    def probs_of(split):
        with torch.no_grad():
            inputs = [torch.tensor(s[:-1], dtype=torch.float32)[None] for s in small[split]]
            return (torch.cat([torch.sigmoid(model(x)[0]) for x in inputs]),
                    torch.cat([torch.tensor(s[1:]) for s in small[split]]))

    valid_acc = {t: frame_accuracy(*probs_of("valid"), threshold=t) for t in THRESHOLD_GRID}
    chosen = max(valid_acc, key=valid_acc.get)
    assert saved["valid_threshold"] == chosen
    assert saved["test_acc_at_valid_threshold"] == pytest.approx(
        100 * frame_accuracy(*probs_of("test"), threshold=chosen), rel=1e-6)


def test_early_stopping_and_existing_run(tmp_path, small):
    metrics = train_loop(config(epochs=50, patience=2, lr=0.05), tmp_path / "run", progress=False,
                         data=small)
    assert metrics["epochs"] == metrics["best_epoch"] + 2
    assert "early stopping" in metrics["stop_reason"]
    with pytest.raises(FileExistsError, match="--resume"):
        train_loop(config(), tmp_path / "run", progress=False, data=small)
    with pytest.raises(ValueError, match="different config"):
        train_loop(config(hidden=13), tmp_path / "run", resume=True, progress=False, data=small)


@pytest.mark.parametrize("model", ["lmn-b", "lstm"])
def test_resume_after_interruption_gives_the_same_result(tmp_path, small, model):
    cfg = config(model=model, epochs=5, transpose=2)
    straight = train_loop(cfg, tmp_path / "straight", progress=False, data=small)

    def interrupt(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_loop(cfg, tmp_path / "resumed", progress=False, data=small, on_epoch_end=interrupt)
    assert not (tmp_path / "resumed" / "metrics.json").exists()
    resumed = train_loop(cfg, tmp_path / "resumed", resume=True, progress=False, data=small)
    for key in ("valid_acc", "test_acc", "test_nll", "best_epoch", "epochs"):
        assert resumed[key] == straight[key], key
    log = (tmp_path / "resumed" / "log.jsonl").read_text().splitlines()
    assert [json.loads(x)["epoch"] for x in log] == [1, 2, 3, 4, 5]
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "resumed" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_of_a_checkpoint_without_cpu_time_counts_its_wall_time(tmp_path, small):
    """Checkpoints written before the CPU time was kept: their sessions' wall time stands in."""
    def interrupt(epoch, row):
        if epoch == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train_loop(config(), tmp_path / "run", progress=False, data=small, on_epoch_end=interrupt)
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=False)
    del ckpt["state"]["cpu_elapsed"]
    ckpt["state"]["elapsed"] = 1000.0
    torch.save(ckpt, tmp_path / "run" / "last.pt")
    metrics = train_loop(config(), tmp_path / "run", resume=True, progress=False, data=small)
    this_session = metrics["cpu_time_s"] - 1000.0  # on top of the earlier session's 1000 s
    assert 0 < this_session <= (metrics["wall_time_s"] - 1000.0) * torch.get_num_threads() + 1


def test_resume_with_a_larger_budget_continues_the_run(tmp_path, small):
    """A finished run resumed with more epochs (or patience) goes on, and ends with the numbers
    of a run given that budget from the start; the model or data may not change; a finished run
    that the budget does not extend is not rewritten."""
    straight = train_loop(config(epochs=6), tmp_path / "straight", progress=False, data=small)
    short = train_loop(config(epochs=3), tmp_path / "run", progress=False, data=small,
                       command="first")
    assert short["epochs"] == 3 and "epoch limit (3)" in short["stop_reason"]
    metrics_file = tmp_path / "run" / "metrics.json"
    before = metrics_file.read_bytes()
    again = train_loop(config(epochs=3), tmp_path / "run", resume=True, progress=False, data=small)
    assert again == short and metrics_file.read_bytes() == before  # finished: left alone
    with pytest.raises(ValueError, match=r"different config.*hidden"):
        train_loop(config(epochs=6, hidden=13), tmp_path / "run", resume=True, progress=False,
                   data=small)
    # the activation spelt out is the default it was run with (the ULM cache's entries are
    # resumed so by a pret-LMN with --ulm-nonlinearity selu): the same run, not a change
    assert config(nonlinearity="tanh").identity() == config().identity() != config(
        nonlinearity="relu").identity()
    longer = train_loop(config(epochs=6, nonlinearity="tanh"), tmp_path / "run", resume=True,
                        progress=False, data=small, command="second")
    for key in ("valid_acc", "test_acc", "test_nll", "best_epoch", "epochs", "stop_reason"):
        assert longer[key] == straight[key], key
    assert longer["command"] == "first" and longer["resumed_with"] == ["second"]
    # the CPU time sums the sessions': every epoch's, the final scoring's on top of it
    rows = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(r["epoch_cpu_s"] > 0 for r in rows)
    assert longer["cpu_time_s"] > sum(r["epoch_cpu_s"] for r in rows)
    assert longer["cpu_time_s"] > short["cpu_time_s"]
    assert [r["epoch"] for r in rows] == [1, 2, 3, 4, 5, 6]
    a = torch.load(tmp_path / "straight" / "last.pt", weights_only=True)["model"]
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["epochs"] == 6
    # early stopping is a budget too: more patience lets a stopped run go on
    stopped = train_loop(config(epochs=40, patience=1, lr=0.05), tmp_path / "p", progress=False,
                         data=small)
    assert "early stopping" in stopped["stop_reason"]
    more = train_loop(config(epochs=40, patience=3, lr=0.05), tmp_path / "p", resume=True,
                      progress=False, data=small)
    assert more["epochs"] > stopped["epochs"]
    assert more["epochs"] == more["best_epoch"] + 3 or more["epochs"] == 40


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, small, monkeypatch):
    built = {}

    def capture(*args, **kwargs):
        built["model"] = build_model(*args, **kwargs)
        return built["model"]

    def poison(epoch, row):  # after epoch 2's checkpoint, corrupt the live weights
        if epoch == 2:
            with torch.no_grad():
                built["model"].readout.weight.fill_(float("nan"))

    monkeypatch.setattr(linmem.training.evaluation, "build_model", capture)
    with pytest.raises(TrainingDiverged, match="keeps epoch 2"):
        train_loop(config(epochs=5, on_divergence="raise"), tmp_path / "run", progress=False,
                   data=small, on_epoch_end=poison)
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ckpt["state"]["epoch"] == 2
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())


def test_non_finite_validation_outputs_are_a_divergence(tmp_path, small, monkeypatch):
    """A finite training loss, then weights that make the validation outputs inf: the run stops
    as diverged (a search retries or records it), not with a metrics error."""
    calls = []
    update = linmem.training.updates._update

    def poisoned_update(model, optimizer, loss, clip, scale=1.0, norms=None):
        out = update(model, optimizer, loss, clip, scale, norms)
        calls.append(out)
        if len(calls) == 8:  # the last update of epoch 2 (4 batches per epoch)
            with torch.no_grad():
                model.readout.weight.fill_(float("inf"))
        return out

    monkeypatch.setattr(linmem.training.updates, "_update", poisoned_update)
    with pytest.raises(TrainingDiverged, match=r"NaN or inf .* after epoch 2; .* keeps epoch 1"):
        train_loop(config(epochs=5, on_divergence="raise"), tmp_path / "run", progress=False,
                   data=small)
    assert all(loss is not None for loss in calls)  # every training loss was finite
    ckpt = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    assert ckpt["state"]["epoch"] == 1


def test_divergence_stops_the_run_with_its_best_checkpoint(tmp_path, small, monkeypatch):
    """on_divergence="stop" (the default): the run ends at its last good epoch as early stopping
    does; its scores are those of best.pt, and resuming does not train it again."""
    built = {}

    def capture(*args, **kwargs):
        built["model"] = build_model(*args, **kwargs)
        return built["model"]

    def poison(epoch, row):
        if epoch == 3:
            with torch.no_grad():
                built["model"].readout.weight.fill_(float("nan"))

    monkeypatch.setattr(linmem.training.evaluation, "build_model", capture)
    run = tmp_path / "run"
    metrics = train_loop(config(epochs=6), run, progress=False, data=small, on_epoch_end=poison)
    assert metrics["stop_reason"].startswith("diverged: the training loss became NaN or inf "
                                             "in epoch 4")
    assert metrics["epochs"] == 3 and metrics["best_epoch"] <= 3
    log = [json.loads(line) for line in (run / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in log] == [1, 2, 3]
    assert metrics["valid_acc"] == pytest.approx(max(r["valid_acc"] for r in log))
    best, _ = load_run_model(run, "best")
    assert 100 * evaluate(best, small["test"])["acc"] == pytest.approx(metrics["test_acc"])
    ckpt = torch.load(run / "last.pt", weights_only=True)
    assert ckpt["state"]["epoch"] == 3 and ckpt["state"]["stop_reason"].startswith("diverged")
    assert all(torch.isfinite(v).all() for v in ckpt["model"].values())
    (run / "metrics.json").unlink()  # resumed with budget left: stays stopped, scores again
    again = train_loop(config(epochs=6), run, resume=True, progress=False, data=small)
    assert again["epochs"] == 3 and again["test_acc"] == pytest.approx(metrics["test_acc"])


def test_divergence_in_the_first_epoch_fails_the_run(tmp_path, small, monkeypatch):
    monkeypatch.setattr(linmem.training.updates, "_update", lambda *args: None)  # every loss NaN
    with pytest.raises(TrainingDiverged, match=r"in epoch 1; no epoch had finished: nothing "
                                               r"is kept .*\. Lower --lr\.$"):
        train_loop(config(), tmp_path / "run", progress=False, data=small)
    with pytest.raises(TrainingDiverged, match=r"Lower --lr or set --clip\.$"):
        train_loop(config(clip=None), tmp_path / "run2", progress=False, data=small)
    # one sequence per update (the paper protocol's): Adam's steps on one gradient are what
    # made LMNs diverge on the long sets (results/paper-protocol)
    with pytest.raises(TrainingDiverged, match=r"Lower --lr, or average more sequences per "
                                               r"update \(--batch-size 4, as --protocol "
                                               r"linmem\)\.$"):
        train_loop(config(batch_size=1), tmp_path / "run3", progress=False, data=small)
    assert not (tmp_path / "run" / "last.pt").exists()
    # the failure is recorded where the scores would be: why, with the run's provenance
    record = json.loads((tmp_path / "run" / "diverged.json").read_text())
    assert record["diverged"].startswith("the training loss became NaN or inf in epoch 1")
    assert record["epochs"] == 0 and record["seed"] == config().seed
    assert record["model"] == config().model and record["commit"] and record["cpu_time_s"] > 0
    assert not (tmp_path / "run" / "metrics.json").exists()
    monkeypatch.undo()  # trained again, it finishes: the earlier failure's record goes
    train_loop(config(), tmp_path / "run", resume=True, progress=False, data=small)
    assert (tmp_path / "run" / "metrics.json").is_file()
    assert not (tmp_path / "run" / "diverged.json").exists()


def test_a_pretraining_that_diverged_is_the_runs_result(tmp_path, small):
    """A pretrained model's run whose pretraining diverged (its unrolled network's training,
    say) records it in its own ``diverged.json``, as a divergence of its own training: a seed
    of it counts as run (``linmem reseed``, the seeds' table), not as never started."""
    def diverging(model):
        raise TrainingDiverged("the checkpoint chosen on validation (epoch 8): outputs NaN",
                               "test")

    with pytest.raises(TrainingDiverged, match=r"^its pretraining: the checkpoint chosen"):
        train_loop(config(), tmp_path / "run", progress=False, data=small, initialize=diverging)
    record = json.loads((tmp_path / "run" / "diverged.json").read_text())
    assert record["diverged"] == ("its pretraining: the checkpoint chosen on validation "
                                  "(epoch 8): outputs NaN")
    assert record["failed_on"] == "pretraining test"  # where: its pretraining's test split
    assert record["epochs"] == 0 and record["seed"] == config().seed and record["commit"]
    assert record["cpu_time_s"] >= 0 and not (tmp_path / "run" / "metrics.json").exists()
    from linmem.training.runs import collect_metrics  # read with the seeds, as a seed that diverged

    (seen,) = collect_metrics([tmp_path / "run"], diverged=True)
    assert seen["diverged"].startswith("its pretraining")


def test_evaluate_rejects_non_finite_outputs(small):
    torch.manual_seed(0)
    model = build_model("lstm", 5)
    with torch.no_grad():
        model.readout.bias.fill_(float("nan"))
    with pytest.raises(linmem.training.evaluation.NonFiniteOutputs, match="NaN or inf"):
        evaluate(model, small["valid"], batch_size=4)


def test_evaluate_counts_every_frame(small):
    torch.manual_seed(0)
    model = build_model("rnn", 5)
    scores = evaluate(model, small["valid"], batch_size=3)
    assert scores["frames"] == sum(len(s) - 1 for s in small["valid"])
    assert 0 <= scores["acc"] <= 1 and np.isfinite(scores["nll"])


def test_evaluate_without_thresholds_scores_the_same(small):
    """The epochs' validation counts no threshold grid (``thresholds=()``): the same scores, an
    empty ``acc_at``; the default counts the whole grid, whose 0.5 is the accuracy."""
    from linmem.metrics import THRESHOLD_GRID

    torch.manual_seed(0)
    model = build_model("lmn-b", 6, memory=4)
    full, bare = evaluate(model, small["valid"], 3), evaluate(model, small["valid"], 3,
                                                              thresholds=())
    assert bare.pop("acc_at") == {} and list(full.pop("acc_at")) == list(THRESHOLD_GRID)
    assert bare.pop("acc_frame_at") == {}
    assert full.pop("acc_frame_at")[0.5] == pytest.approx(full["acc_frame"])
    assert bare == full


def test_evaluate_batches_by_length_change_no_score(jsb):
    """The evaluation's batches pad no sequence beyond EVAL_MAX_RATIO of its length; the scores
    are those of scoring every sequence alone (no padding at all): the same frame counts, so the
    same accuracies, and the NLL up to the order of its sum."""
    from linmem.batching import EVAL_MAX_RATIO, bucket_batches, iterate_batches

    torch.manual_seed(0)
    model = build_model("lmn-b", 8, memory=6).double()
    sequences = jsb["valid"]
    lengths = [len(s) for s in sequences]
    batches = bucket_batches(lengths, 64, shuffle=False, max_ratio=EVAL_MAX_RATIO)
    assert len(batches) > -(-len(lengths) // 64)  # the ratio splits batches of 64 here
    for batch in iterate_batches(sequences, 64):  # evaluate's batches, by default
        assert batch.mask.shape[1] + 1 <= EVAL_MAX_RATIO * (batch.mask.sum(1).min() + 1)
    batched, alone = evaluate(model, sequences, 64), evaluate(model, sequences, 1)
    assert (batched["acc"], batched["acc_frame"], batched["frames"]) == \
        (alone["acc"], pytest.approx(alone["acc_frame"], rel=1e-12), alone["frames"])
    assert batched["nll"] == pytest.approx(alone["nll"], rel=1e-12)


def test_bad_configs():
    with pytest.raises(ValueError, match="unknown model"):
        TrainConfig(model="mlp")
    with pytest.raises(ValueError, match="unknown data set"):
        TrainConfig(data="mnist")
    with pytest.raises(ValueError, match="batch_size"):
        TrainConfig(batch_size=0)
    with pytest.raises(ValueError, match="weight_decay"):
        TrainConfig(weight_decay=-1)
    assert TrainConfig(model="lstm", memory=50).memory is None


def test_sgd_option_takes_plain_sgd_steps(tmp_path, small):
    """--optimizer sgd: one epoch of one batch is p - lr * (grad + wd * p), computed by hand."""
    from linmem.batching import collate
    from linmem.metrics import masked_nll

    one = {"train": small["train"][:2], "valid": small["valid"][:2], "test": small["test"][:2]}
    cfg = config(optimizer="sgd", lr=1e-3, weight_decay=1e-3, epochs=1, init_bias=False,
                 clip=None)
    torch.manual_seed(cfg.seed)
    model = build_model("lmn-b", 12, 10)
    batch = collate(one["train"])
    loss = masked_nll(model(batch.inputs), batch.targets, batch.mask)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    expected = [p - 1e-3 * (g + 1e-3 * p) for p, g in zip(model.parameters(), grads, strict=True)]
    train_loop(cfg, tmp_path / "run", progress=False, data=one)
    state = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    after = [state["model"][name] for name, _ in model.named_parameters()]
    assert all(torch.allclose(a, e, atol=1e-6) for a, e in zip(after, expected, strict=True))
    assert "exp_avg" not in str(state["optimizer"]["state"])
    with pytest.raises(ValueError, match="optimizer"):
        TrainConfig(optimizer="rmsprop")
    with pytest.raises(ValueError, match="momentum"):
        TrainConfig(momentum=1.5)


@pytest.mark.parametrize("model", ["lstm", "lmn-b"])
def test_chunked_training_is_truncated_bptt(tmp_path, small, model):
    """--chunk N: one plain SGD step per window of N steps, the state carried into the next
    window but not differentiated through, recomputed by hand with the bare recurrent core."""
    from linmem.batching import collate
    from linmem.metrics import masked_nll

    one = {"train": small["train"][:2], "valid": small["valid"][:2], "test": small["test"][:2]}
    cfg = config(model=model, optimizer="sgd", lr=0.01, weight_decay=0.0, epochs=1, chunk=7,
                 batch_size=2, init_bias=False, clip=None)
    torch.manual_seed(cfg.seed)
    ref = build_model(model, 12, cfg.memory)
    params = list(ref.parameters())
    batch = collate(one["train"])
    steps, state, windows = batch.inputs.shape[1], None, 0
    for start in range(0, steps, 7):
        piece = slice(start, start + 7)
        out, new_state = ref.core(batch.inputs[:, piece], state)
        loss = masked_nll(ref.readout(out), batch.targets[:, piece], batch.mask[:, piece])
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p -= 0.01 * g
        state = tuple(s.detach() for s in new_state)
        windows += 1
    assert windows == -(-steps // 7) > 2
    train_loop(cfg, tmp_path / "run", progress=False, data=one)
    after = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    for name, p in ref.named_parameters():
        assert torch.allclose(after[name], p, atol=1e-5), name
    # a window as long as the batch is one update on the whole batch, as without --chunk
    whole = train_loop(config(model=model, chunk=10_000, epochs=2), tmp_path / "w", progress=False,
                       data=small)
    plain = train_loop(config(model=model, epochs=2), tmp_path / "p", progress=False, data=small)
    assert whole["valid_acc"] == pytest.approx(plain["valid_acc"], abs=1e-9)
    assert whole["test_nll"] == pytest.approx(plain["test_nll"], rel=1e-6)


def test_batch_windows_cover_the_batch():
    from linmem.batching import collate

    rng = np.random.default_rng(0)
    seqs = [rng.random((n, 88)) < 0.1 for n in (12, 5, 9)]
    batch = collate(seqs)
    parts = list(batch.windows(4))
    assert [p.inputs.shape[1] for p in parts] == [4, 4, 3]
    assert torch.equal(torch.cat([p.inputs for p in parts], 1), batch.inputs)
    assert torch.equal(torch.cat([p.mask for p in parts], 1), batch.mask)
    for p in parts:  # a window's lengths are its valid steps
        assert torch.equal(p.lengths, p.mask.sum(1))
    with pytest.raises(ValueError, match="size must be a positive integer"):
        next(batch.windows(0))


def test_chunk_needs_a_model_that_can_train_on_windows(tmp_path, small):
    with pytest.raises(ValueError, match="chunk must be a positive integer"):
        TrainConfig(chunk=0)
    from linmem.models import NextStepPredictor
    from linmem.registry import ModelSpec, register, unregister

    class WholeOnly(NextStepPredictor):  # a model of the protocol without chunk_loss
        def __getattribute__(self, name):
            if name == "chunk_loss":
                raise AttributeError(name)
            return super().__getattribute__(name)

    register(ModelSpec("whole-only", "Whole only", "lstm",
                       lambda input_size, options: WholeOnly("whole-only", input_size,
                                                             options.hidden)))
    try:
        with pytest.raises(ValueError, match="cannot train on windows"):
            train_loop(config(model="whole-only", hidden=8, chunk=5, epochs=1), tmp_path / "r",
                       progress=False, data=small)
        assert not (tmp_path / "r").exists()
    finally:
        unregister("whole-only")


def test_select_on_nll_keeps_the_epoch_of_the_lowest_validation_nll(tmp_path, small):
    metrics = train_loop(config(select="nll", epochs=6, lr=0.03), tmp_path / "run", progress=False,
                         data=small)
    log = [json.loads(x) for x in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    best = min(log, key=lambda r: r["valid_nll"])
    assert metrics["best_epoch"] == best["epoch"] and metrics["selected_on"] == "valid nll"
    assert metrics["valid_nll"] == pytest.approx(best["valid_nll"], rel=1e-6)
    # a factorised model's accuracy costs nothing: it is still logged
    assert all(r["valid_acc"] is not None for r in log)
    with pytest.raises(ValueError, match="select must be one of"):
        TrainConfig(select="loss")


def test_a_chosen_checkpoint_that_diverges_on_test_fails_the_run(tmp_path, small, monkeypatch):
    """Finite on validation when it was chosen, NaN on a test sequence (a state that grows
    along a longer sequence): the run ends diverged with its reason in diverged.json and no
    metrics.json, an error the search records for its trial, instead of an unhandled one."""
    from linmem.training.evaluation import NonFiniteOutputs

    score = linmem.training.evaluation.evaluate

    def evaluate(model, sequences, *args, **kwargs):
        if sequences is small["test"]:
            raise NonFiniteOutputs("the model's outputs are NaN or inf on a batch (test)")
        return score(model, sequences, *args, **kwargs)

    monkeypatch.setattr(linmem.training.trainer, "evaluate", evaluate)
    with pytest.raises(TrainingDiverged, match=r"chosen on validation \(epoch \d\).*(test)"):
        train_loop(config(epochs=2), tmp_path / "run", progress=False, data=small)
    record = json.loads((tmp_path / "run" / "diverged.json").read_text())
    assert "chosen on validation" in record["diverged"] and record["epochs"] == 2
    assert "on the test split" in record["diverged"] and record["failed_on"] == "test"
    assert not (tmp_path / "run" / "metrics.json").exists()
    from linmem.training.runs import failed_on

    assert failed_on(record) == "test"


def test_a_run_on_the_kernel_is_the_run_on_the_pytorch_loop_to_float32_rounding(tmp_path, small):
    """A whole run under the paper's protocol (batch 1, fused Adam: every update one sequence),
    once on the compiled kernel (its packed weights, its own float32 tanh, its one-row products)
    and once on the PyTorch loop: 96 updates later every epoch's training loss agrees to 1e-6
    relative, the weights to 1e-5 (measured: 1e-8 and 1.6e-7), the scores to their rounding."""
    runs = {}
    for path in ("best", "loop"):
        cfg = TrainConfig(protocol="paper", model="lmn-b", hidden=20, memory=30, epochs=4,
                          patience=10, seed=3, cpu_kernel=path)
        runs[path] = train_loop(cfg, tmp_path / path, progress=False, data=small)
    logs = {p: [json.loads(x) for x in (tmp_path / p / "log.jsonl").read_text().splitlines()]
            for p in runs}
    for a, b in zip(logs["best"], logs["loop"], strict=True):
        assert a["train_nll"] == pytest.approx(b["train_nll"], rel=1e-6)
    weights = {p: torch.load(tmp_path / p / "last.pt", weights_only=True)["model"] for p in runs}
    for name, value in weights["best"].items():
        torch.testing.assert_close(value, weights["loop"][name], rtol=0, atol=1e-5)
    assert runs["best"]["test_nll"] == pytest.approx(runs["loop"]["test_nll"], rel=1e-6)
    assert runs["best"]["recurrence_path"] != "loop" and runs["loop"]["recurrence_path"] == "loop"


def test_adam_is_fused_and_an_unfused_checkpoint_resumes_unfused():
    """make_optimizer gives torch's fused Adam for CPU parameters (one kernel an update); the
    state of an unfused Adam (a checkpoint of an earlier version) loads into it and brings its
    choice along, so that a resumed run keeps its own arithmetic; SGD is unchanged."""
    from linmem.training.updates import make_optimizer

    model = build_model("lmn-b", 5, 4)
    adam = make_optimizer(model.parameters(), config(protocol="paper"))
    assert adam.param_groups[0]["fused"] is True
    earlier = torch.optim.Adam(model.parameters(), lr=1e-3)
    adam.load_state_dict(earlier.state_dict())
    assert not adam.param_groups[0]["fused"]
    sgd = make_optimizer(model.parameters(), config(optimizer="sgd"))
    assert isinstance(sgd, torch.optim.SGD)
