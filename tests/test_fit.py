"""model.fit through `tf_adabatch.attach`: the same engine, the same numbers as the loop."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from test_summaries import read_scalars

import tf_adabatch
from tf_adabatch import summaries

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data, weights

M = 4


def simigrad(replicas: int) -> tf_adabatch.SimiGradPolicy:
    unit = replicas * M
    # Smoothing on, so that the policy has a state of its own (two variables) that the
    # save/restore tests below must carry (without it they would compare zeros).
    return tf_adabatch.SimiGradPolicy(
        0.6,
        initial_batch_size=2 * unit,
        min_batch_size=2 * unit,
        max_batch_size=16 * unit,
        smoothing=0.5,
    )


def make(replicas: int):
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05), momentum=0.9)
    return strategy, model, optimizer


@pytest.mark.parametrize("replicas", [4, 1])
def test_fit_and_custom_loop_give_the_same_trajectory(replicas: int) -> None:
    steps = 8
    x, y = regression_data(2048)
    data = global_micro_batches(x, y, replicas * M).repeat()

    strategy, model, optimizer = make(replicas)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        base_batch_size=replicas * M,
        policy=simigrad(replicas),
        strategy=strategy,
    )
    loop = trainer.fit(data, steps=steps, verbose=0)

    strategy, fit_model, fit_optimizer = make(replicas)
    with strategy.scope():
        fit_model.compile(optimizer=fit_optimizer, loss="mse")
    engine = tf_adabatch.attach(
        fit_model, micro_batch_size=M, base_batch_size=replicas * M, policy=simigrad(replicas)
    )
    history = fit_model.fit(data, epochs=2, steps_per_epoch=steps // 2, verbose=0).history

    assert len(set(loop["batch_size"])) > 1  # the batch really adapted
    assert int(engine.state.steps.numpy()) == steps
    for a, b in zip(weights(fit_model), weights(model), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    # History keeps each epoch's last step.
    for name in ("batch_size", "gain", "similarity", "learning_rate"):
        np.testing.assert_allclose(
            history[name], [loop[name][steps // 2 - 1], loop[name][-1]], rtol=1e-5
        )
    assert engine.trace_count == 1


def test_fit_writes_the_same_tensorboard_tags_and_runs_user_callbacks(tmp_path) -> None:
    strategy, model, optimizer = make(2)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse")
    tf_adabatch.attach(model, micro_batch_size=M, policy=simigrad(2))
    seen = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append(float(logs["batch_size"]))
    )
    x, y = regression_data(1024)
    logdir = str(tmp_path / "tb")
    history = model.fit(
        global_micro_batches(x, y, 2 * M).repeat(),
        epochs=2,
        steps_per_epoch=5,
        verbose=0,
        validation_data=(x[:64], y[:64]),
        callbacks=[tf_adabatch.AdaBatchTensorBoard(logdir), record],
    )
    scalars, layout_tags = read_scalars(logdir + "/train")
    assert layout_tags
    expected = {f"adabatch/{n}" for n in tf_adabatch.summaries.ADABATCH_SCALARS} | {"loss"}
    expected |= {"adabatch/target_similarity", "adabatch/min_batch_size"}
    assert expected <= set(scalars)
    assert [s for s, _ in scalars["adabatch/batch_size"]] == list(range(1, 11))
    assert [v for _, v in scalars["adabatch/batch_size"]] == seen
    # Validation goes to the eval run under the same tag as the train loss, at the
    # step each epoch ended; the train run's loss stays the per-step loss.
    evals = tf_adabatch.summaries.read_scalars(logdir + "/eval")
    assert evals["loss"] == [
        (5, pytest.approx(history.history["val_loss"][0], rel=1e-6)),
        (10, pytest.approx(history.history["val_loss"][1], rel=1e-6)),
    ]
    assert [s for s, _ in scalars["loss"]] == list(range(1, 11))


def test_fit_progress_bar_shows_the_adaptation(capsys) -> None:
    strategy, model, optimizer = make(2)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse")
    tf_adabatch.attach(model, micro_batch_size=M, policy=simigrad(2))
    x, y = regression_data(512)
    model.fit(global_micro_batches(x, y, 2 * M).repeat(), epochs=1, steps_per_epoch=2, verbose=1)
    out = capsys.readouterr().out
    for name in ("batch_size", "gain", "similarity", "learning_rate", "2/2"):
        assert name in out


def _fit_blocks(per_call: int, replicas: int, *, fixed_epochs: bool, callbacks=()):
    """attach + fit with `steps_per_execution=per_call`: 2 epochs over 1,600 examples (or
    3 epochs of 5 steps over a repeated dataset); returns history, engine, weights and
    the AdaBatchTensorBoard's per-step tags."""
    x, y = regression_data(1600)
    strategy, model, optimizer = make(replicas)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse", steps_per_execution=per_call)
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, base_batch_size=replicas * M, policy=simigrad(replicas)
    )
    if fixed_epochs:
        data = global_micro_batches(x, y, replicas * M).repeat()
        history = model.fit(data, epochs=3, steps_per_epoch=5, verbose=0, callbacks=[*callbacks])
    else:
        history = model.fit(
            x,
            y,
            batch_size=replicas * M,
            epochs=2,
            shuffle=False,
            verbose=0,
            callbacks=[*callbacks],
        )
    return history.history, engine, weights(model)


@pytest.mark.parametrize("fixed_epochs", [False, True])
def test_fit_with_steps_per_execution_takes_the_steps_of_one_per_call(fixed_epochs: bool) -> None:
    """Blocks of 4 steps on the device: the same optimizer steps, batch choices and
    weights, bit for bit, as one step per call (the same step graph, run in a loop);
    an epoch's last block is cut where its micro-batches run out."""
    runs = {n: _fit_blocks(n, 2, fixed_epochs=fixed_epochs) for n in (1, 4)}
    (h1, e1, w1), (h4, e4, w4) = runs[1], runs[4]
    # The blocks really ran on the device loop (one step per call never traces it).
    assert e4._block_fn.experimental_get_tracing_count() >= 1
    assert e1._block_fn.experimental_get_tracing_count() == 0
    assert int(e4.state.steps.numpy()) == int(e1.state.steps.numpy())
    assert int(e4.state.samples_seen.numpy()) == int(e1.state.samples_seen.numpy())
    if fixed_epochs:
        assert int(e1.state.steps.numpy()) == 15  # 3 epochs x 5 (blocks of 4 and 1)
    assert h4 == h1
    assert len(set(h1["batch_size"])) > 1 or not fixed_epochs
    assert all(np.array_equal(a, b) for a, b in zip(w1, w4, strict=True))


def test_fit_blocks_stop_at_a_progress_budget_and_write_every_step(tmp_path) -> None:
    ends = {}
    for n in (1, 8):
        budget = tf_adabatch.ProgressBudget(12.0)
        board = tf_adabatch.AdaBatchTensorBoard(str(tmp_path / f"logs{n}"))
        _, engine, _ = _fit_blocks(n, 2, fixed_epochs=True, callbacks=(budget, board))
        ends[n] = float(engine.state.progress.numpy()), int(engine.state.steps.numpy())
        series, _ = read_scalars(str(tmp_path / f"logs{n}" / summaries.TRAIN_RUN))
        steps = [step for step, _ in series["adabatch/batch_size"]]
        assert steps == list(range(1, ends[n][1] + 1))  # every step, blocks or not
    assert ends[8] == ends[1]
    assert ends[8][0] >= 12.0


def test_uncompiled_model_is_refused() -> None:
    _, model, _ = make(2)
    with pytest.raises(ValueError, match=r"must be compiled first"):
        tf_adabatch.attach(model, micro_batch_size=M)


def test_noise_grows_as_training_converges_batch_and_gain_rise() -> None:
    """Noisy linear regression from far away: early, |G|^2 dominates (gain ~ 1, the
    groups agree, SimiGrad keeps the batch small); near the optimum the noise dominates
    (gain -> S, similarity drops, SimiGrad grows the batch)."""
    rng = np.random.default_rng(0)
    d, n = 16, 200_000
    x = rng.normal(size=(n, d)).astype("float32")
    y = (x @ rng.normal(size=(d, 1)) + rng.normal(size=(n, 1))).astype("float32")
    strategy = get_strategy(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential(
            [
                keras.Input((d,)),
                keras.layers.Dense(1, kernel_initializer=keras.initializers.Constant(5.0)),
            ]
        )
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.02))
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=16, min_batch_size=16, max_batch_size=1024
    )
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=8,
        base_batch_size=16,
        policy=policy,
        similarity="exact",
        ema_decay=0.9,
        strategy=strategy,
    )
    h = trainer.fit(global_micro_batches(x, y, 16).repeat(), steps=150, verbose=0)
    batch, gain = np.array(h["batch_size"]), np.array(h["gain"])
    # Expected from the data model (not from a run): per example g = 2 x' (x'.delta - eps)
    # with x' = (x, 1), delta = w - w* (w* ~ N(0, I_16), w = 5, b = 0: |delta|^2 ~ 16 * 26
    # = 416 at the start), so |G|^2 = 4|delta|^2 ~ 1664 and tr(Sigma) ~ 4((d + 2)|delta|^2
    # + d + 1) ~ 30,000: B_noise ~ 18 while |delta|^2 >> 1.
    # - Early, SimiGrad holds c = B / (B + 2 B_noise) at 0.5, i.e. B ~ 2 B_noise ~ 36: it
    #   grows from 16 while c < 0.5 (B = 32: c = 0.47) and shrinks above (B = 48: 0.57).
    # - Early gain, B0 = 16, B <= 48: r = (tr/16 + |G|^2) / (tr/B + |G|^2) <= 1.55.
    # - Late, near the optimum, |G|^2 -> 0 and B_noise grows without bound: the batch
    #   grows towards the maximum 1024. While SimiGrad grows the batch, c < 0.5, i.e.
    #   |G|^2 < 2 tr/B, so r > (tr/B0 + 2 tr/B) / (3 tr/B) = (S + 2) / 3 > S / 3 (the test
    #   allows S / 4 for the noise of the measured c).
    # - Loss: 1 + |delta|^2 ~ 417 at the start, the noise floor 1 at the optimum.
    assert batch[:10].mean() <= 48 and batch[-20:].mean() >= 512
    assert gain[:10].mean() < 1.6  # warm-up emerges: gain ~ 1 while |G|^2 dominates
    assert gain[-20:].mean() > 0.25 * (batch[-20:] / 16).mean()
    assert np.mean(h["loss"][:10]) > 100 and np.mean(h["loss"][-20:]) < 1.5


def test_progress_budget_stops_fit_at_the_budget() -> None:
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        lr = tf_adabatch.AdaptiveLearningRate(0.05, "linear")
        model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, base_batch_size=8, policy=tf_adabatch.StaticPolicy(32)
    )
    x, y = regression_data(1024)
    history = model.fit(
        global_micro_batches(x, y, 8).repeat(),
        epochs=1,
        steps_per_epoch=50,
        verbose=0,
        callbacks=[tf_adabatch.ProgressBudget(10)],
    )
    # "linear": tau += S = 32 / 8 = 4 per step: 4, 8, 12 -> stops after the third step.
    assert int(engine.state.steps.numpy()) == 3
    assert history.history["progress"] == [12.0]


def attached(replicas: int = 2, metrics: list | None = None, policy_replicas: int | None = None):
    """A model compiled and attached on `replicas`, with SimiGrad bounded for
    `policy_replicas` (default the same) replicas x M."""
    strategy, model, optimizer = make(replicas)
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse", metrics=metrics)
    bounds_for = policy_replicas or replicas
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, base_batch_size=bounds_for * M, policy=simigrad(bounds_for)
    )
    return model, engine


def adaptive_values(engine) -> list[float]:
    return [float(v.numpy()) for v in (*engine.state.variables, *engine.policy.variables)]


def assert_policy_state_is_not_trivial(engine) -> None:
    """The smoothed similarity's two variables moved away from their initial zeros."""
    values = [float(v.numpy()) for v in engine.policy.variables]
    assert len(values) == 2 and all(v != 0.0 for v in values), values


def test_keras_weights_files_carry_the_adaptive_state(tmp_path) -> None:
    x, y = regression_data(1024)
    data = global_micro_batches(x, y, 2 * M).repeat()
    model, engine = attached()
    model.fit(data, epochs=1, steps_per_epoch=6, verbose=0)
    assert engine.batch_size != 2 * 2 * M and int(engine.state.steps.numpy()) == 6
    assert_policy_state_is_not_trivial(engine)
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)

    restored, restored_engine = attached()
    assert adaptive_values(restored_engine) != adaptive_values(engine)
    restored.load_weights(path)
    np.testing.assert_array_equal(adaptive_values(restored_engine), adaptive_values(engine))
    for a, b in zip(weights(restored), weights(model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert restored_engine.batch_size == engine.batch_size

    # A model that is not attached loads the same file (the state entry is ignored).
    strategy = get_strategy(2)
    plain = mlp(strategy, seed=3)
    with strategy.scope():
        plain.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    plain.load_weights(path)
    for a, b in zip(weights(plain), weights(model), strict=True):
        np.testing.assert_array_equal(a, b)

    # Loaded on ONE replica: k x (1 x M) must give the batch saved as k' x (2 x M), so k
    # doubles (the batch is a multiple of 2 M, so reachable; same bounds and B0).
    single, single_engine = attached(1, policy_replicas=2)
    with pytest.warns(UserWarning, match=f"global batch {engine.batch_size} kept") as caught:
        single.load_weights(path)
    assert len(caught) == 1
    assert single_engine.batch_size == engine.batch_size
    assert single_engine.accumulation_steps == 2 * engine.accumulation_steps
    assert float(single_engine.state.progress.numpy()) == float(engine.state.progress.numpy())


class _Record(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[float, float, float]] = []
        self.epochs = 0
        self.epoch_logs: list[dict[str, float]] = []

    def on_epoch_end(self, epoch, logs=None) -> None:
        self.epochs += 1
        self.epoch_logs.append({k: float(v) for k, v in logs.items() if k in ("loss", "mae")})

    def on_train_batch_end(self, batch, logs=None) -> None:
        state = self.model._adabatch_engine.state  # the step counter is not in the logs
        step = float(state.steps.numpy() + state.skipped_steps.numpy())
        self.steps.append((step, logs["batch_size"], logs["gain"]))


class _Interrupt(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None) -> None:
        if epoch == 2:
            raise KeyboardInterrupt("preempted")


def test_backup_and_restore_resumes_fit_exactly(tmp_path) -> None:
    """Keras's BackupAndRestore, stock: fit is interrupted at the start of epoch 2 and
    rerun with a new model (as after a restart); it must continue with the adapted batch
    size, gain, progress, moving averages and policy state, and end where an
    uninterrupted fit ends. Each epoch is one pass over the same finite data (Keras
    restarts an epoch's data on resume), ending mid-step (that step is discarded). The
    compiled loss and metric (epoch means) of the resumed epochs equal the
    uninterrupted run's."""
    x, y = regression_data(600)
    data = global_micro_batches(x, y, 2 * M)  # finite: 75 global micro-batches per epoch
    epochs = 4

    model, engine = attached(metrics=["mae"])
    full = _Record()
    model.fit(data, epochs=epochs, verbose=0, callbacks=[full])

    backup = str(tmp_path / "backup")
    first, _ = attached(metrics=["mae"])
    part1 = _Record()
    with pytest.raises(KeyboardInterrupt):
        first.fit(
            data,
            epochs=epochs,
            verbose=0,
            callbacks=[keras.callbacks.BackupAndRestore(backup), part1, _Interrupt()],
        )
    second, second_engine = attached(metrics=["mae"])
    part2 = _Record()
    second.fit(
        data, epochs=epochs, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(backup), part2]
    )
    assert (full.epochs, part1.epochs, part2.epochs) == (epochs, 2, epochs - 2)
    assert len({b for _, b, _ in full.steps}) > 1  # the batch adapted
    assert part2.steps[0][0] == part1.steps[-1][0] + 1  # the step counter went on
    assert part1.steps + part2.steps == full.steps  # identical batch sizes and gains
    assert len(full.epoch_logs) == epochs and part1.epoch_logs == full.epoch_logs[:2]
    assert all(set(logs) == {"loss", "mae"} for logs in full.epoch_logs + part2.epoch_logs)
    for resumed, uninterrupted in zip(part2.epoch_logs, full.epoch_logs[2:], strict=True):
        assert resumed == pytest.approx(uninterrupted, rel=1e-6), (resumed, uninterrupted)
    assert_policy_state_is_not_trivial(engine)
    np.testing.assert_allclose(
        adaptive_values(second_engine), adaptive_values(engine), rtol=1e-6, atol=1e-9
    )
    for a, b in zip(weights(second), weights(model), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
