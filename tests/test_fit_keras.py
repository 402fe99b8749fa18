"""An ordinary Keras script after `tf_adabatch.attach`: the same numbers as plain Keras.

With a static policy of one micro-step per optimizer step and SGD, the engine's step is
plain Keras's step (mean gradient of the global batch), so History, weights, evaluate
and predict must equal plain `model.fit` up to float32 rounding (rtol 1e-5: the engine
sums per-example losses in another order). Where the batch adapts, the expected values
are derived by hand (learning rate 0 keeps the weights, so every epoch mean is a numpy
mean over the examples the epoch used).
"""

from __future__ import annotations

import csv
import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import mlp, weights

M = 4
INTERNAL = {"applied", "consecutive_skips", "step", "samples_seen"}


def data(num: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, 6)).astype("float32")
    y = rng.integers(0, 3, size=num)
    sw = rng.uniform(0.5, 1.5, size=num).astype("float32")
    return x, y, sw


def compiled(replicas: int, lr: float = 0.1, **compile_kwargs) -> keras.Model:
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        model.compile(
            optimizer=keras.optimizers.SGD(lr),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            **compile_kwargs,
        )
    return model


def metric_kwargs() -> dict:
    return {
        "metrics": [
            "accuracy",
            keras.metrics.SparseCategoricalCrossentropy(name="xent", from_logits=True),
        ],
        "weighted_metrics": [keras.metrics.SparseCategoricalAccuracy(name="wacc")],
    }


def run_recording_warnings(fn):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = fn()
    return result, {str(w.message) for w in caught}


def test_warning_capture_can_fail() -> None:
    """The warning check below sees Keras's own 'ran out of data' warning."""
    model = compiled(1)
    x, y, _ = data(32)
    _, seen = run_recording_warnings(
        lambda: model.fit(x, y, batch_size=8, steps_per_epoch=10, epochs=1, verbose=0)
    )
    assert any("ran out of data" in m for m in seen)


@pytest.mark.parametrize("replicas", [1, 2])
def test_attached_fit_equals_plain_keras(replicas: int) -> None:
    unit = replicas * M
    x, y, sw = data(12 * unit)
    xv, yv, _ = data(30, seed=1)
    plain = compiled(replicas, **metric_kwargs())
    fit_kwargs = dict(
        sample_weight=sw,
        batch_size=unit,
        epochs=2,
        shuffle=False,
        validation_data=(xv, yv),
        verbose=0,
    )
    expected, plain_warnings = run_recording_warnings(lambda: plain.fit(x, y, **fit_kwargs))

    model = compiled(replicas, **metric_kwargs())
    engine = tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(unit))
    history, our_warnings = run_recording_warnings(lambda: model.fit(x, y, **fit_kwargs))
    assert our_warnings <= plain_warnings  # nothing beyond plain Keras's own
    assert not any("ran out of data" in m for m in our_warnings)
    assert set(history.history) == set(expected.history) | set(tf_adabatch.keras_fit.LOGGED_KEYS)
    assert not INTERNAL & set(history.history)
    for name, values in expected.history.items():
        np.testing.assert_allclose(history.history[name], values, rtol=1e-5, err_msg=name)
    for a, b in zip(weights(model), weights(plain), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert int(engine.state.steps.numpy()) == 2 * 12
    np.testing.assert_allclose(
        model.evaluate(xv, yv, verbose=0), plain.evaluate(xv, yv, verbose=0), rtol=1e-5
    )
    np.testing.assert_allclose(
        model.predict(xv, verbose=0), plain.predict(xv, verbose=0), rtol=1e-5, atol=1e-6
    )


def hand_means(model: keras.Model, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of a fixed model, in float64."""
    logits = model.predict(x, verbose=0).astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    return float(-log_probs[np.arange(len(y)), y].mean()), float((logits.argmax(1) == y).mean())


@pytest.mark.parametrize("replicas", [1, 2])
def test_finite_dataset_epoch_is_one_pass_in_optimizer_steps(replicas: int, capsys) -> None:
    """25 micro-batches, k = 3: 8 optimizer steps per epoch (24 micro-batches; the
    last one, fewer than k, is dropped); no warning; the bar counts 8, not 25."""
    unit = replicas * M
    x, y, _ = data(25 * unit)
    model = compiled(replicas, lr=0.0, metrics=["accuracy"])
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(3 * unit)
    )
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(unit, drop_remainder=True)
    history, seen = run_recording_warnings(lambda: model.fit(dataset, epochs=2, verbose=1))
    assert not any("ran out of data" in m for m in seen)
    out = capsys.readouterr().out
    assert "8/8" in out and "/25" not in out
    assert int(engine.state.steps.numpy()) == 16
    assert int(engine.state.samples_seen.numpy()) == 2 * 24 * unit
    loss, accuracy = hand_means(model, x[: 24 * unit], y[: 24 * unit])  # lr 0: fixed model
    np.testing.assert_allclose(history.history["loss"], [loss, loss], rtol=1e-5)
    np.testing.assert_allclose(history.history["accuracy"], [accuracy, accuracy], rtol=1e-6)


def test_numpy_partial_last_micro_batch_is_dropped() -> None:
    x, y, _ = data(50)  # 12 micro-batches of 4, then 2 examples
    model = compiled(1, lr=0.0, metrics=["accuracy"])
    engine = tf_adabatch.attach(model, micro_batch_size=M)
    history = model.fit(x, y, batch_size=M, epochs=1, shuffle=False, verbose=0)
    assert int(engine.state.samples_seen.numpy()) == 48
    loss, accuracy = hand_means(model, x[:48], y[:48])
    np.testing.assert_allclose(history.history["loss"], [loss], rtol=1e-5)
    np.testing.assert_allclose(history.history["accuracy"], [accuracy], rtol=1e-6)


def test_repeated_dataset_with_steps_per_epoch(capsys) -> None:
    x, y, _ = data(64)
    model = compiled(2, metrics=["accuracy"])
    engine = tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(16))
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8, drop_remainder=True)
    model.fit(dataset, epochs=2, steps_per_epoch=5, verbose=1)
    assert int(engine.state.steps.numpy()) == 10
    assert "5/5" in capsys.readouterr().out


def test_wrong_inputs_and_misuse_are_refused() -> None:
    x, y, _ = data(64)
    model = compiled(1)
    tf_adabatch.attach(model, micro_batch_size=16)
    with pytest.raises(
        ValueError,
        match=r"Argument `batch_size` of `fit` must be the global micro-batch replicas x micro_batch_size = 1 x 16 = 16 .*Received: batch_size=32",
    ):
        model.fit(x, y, batch_size=32, verbose=0)
    with pytest.raises(
        ValueError, match=r"batch dimension must be .* = 16, static.*Received: batch dimension None"
    ):
        model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), verbose=0)
    with pytest.raises(ValueError, match=r"attached to tf_adabatch already.*Received: model="):
        tf_adabatch.attach(model, micro_batch_size=16)
    with pytest.raises(ValueError, match=r"Compile before `attach`.*Received: model.compile"):
        model.compile(optimizer="adam", loss="mse")
    plain = compiled(1)
    for callback, name in [
        (tf_adabatch.ProgressBudget(10), "ProgressBudget"),
        (tf_adabatch.AdaBatchTensorBoard("/tmp/unused"), "AdaBatchTensorBoard"),
    ]:
        with pytest.raises(ValueError, match=rf"`{name}` needs a model prepared by .*not attached"):
            plain.fit(x, y, batch_size=16, verbose=0, callbacks=[callback])


@pytest.mark.parametrize("replicas,mode", [(1, "estimated"), (2, "exact")])
def test_shortest_call_works(replicas: int, mode: str) -> None:
    model = compiled(replicas)
    engine = tf_adabatch.attach(model, micro_batch_size=M)
    assert engine.similarity_mode == mode
    x, y, _ = data(8 * replicas * M)
    model.fit(x, y, batch_size=replicas * M, verbose=0)
    assert int(engine.state.steps.numpy()) == 8


def test_keras_callbacks_after_attach(tmp_path) -> None:
    x, y, _ = data(64)
    xv = data(20, seed=1)[0]
    model = compiled(2, metrics=["accuracy"])
    tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(16))
    csv_path = tmp_path / "log.csv"
    checkpoint = tmp_path / "model.keras"
    history = model.fit(
        x,
        y,
        batch_size=8,
        epochs=5,
        validation_split=0.25,
        verbose=0,
        callbacks=[
            # min_delta 10: epoch 2 cannot improve enough, so training stops after it.
            keras.callbacks.EarlyStopping("val_loss", min_delta=10.0, patience=0),
            keras.callbacks.ModelCheckpoint(str(checkpoint)),
            keras.callbacks.CSVLogger(str(csv_path)),
            keras.callbacks.TensorBoard(str(tmp_path / "tb")),
        ],
    )
    assert len(history.history["loss"]) == 2
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert [float(r["loss"]) for r in rows] == pytest.approx(history.history["loss"], rel=1e-6)
    assert "val_accuracy" in rows[0] and "batch_size" in rows[0] and "step" not in rows[0]
    loaded = keras.models.load_model(checkpoint)
    # The loaded model runs on one device, the attached one on 2 replicas: rounding only.
    np.testing.assert_allclose(
        loaded.predict(xv, verbose=0), model.predict(xv, verbose=0), rtol=1e-5, atol=1e-7
    )
    epoch_loss = [
        float(tf.make_ndarray(value.tensor))
        for path in (tmp_path / "tb" / "train").glob("events.out.tfevents.*")
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
        if value.tag == "epoch_loss"
    ]
    assert epoch_loss == pytest.approx(history.history["loss"], rel=1e-6)


@pytest.mark.parametrize(("replicas", "cause"), [(1, "gradients"), (2, "gradients"), (2, "update")])
def test_skipped_steps_show_their_loss_a_count_a_warning_and_terminate_on_nan_stops(
    replicas: int, cause: str
) -> None:
    """Issue 42: an epoch whose every step is skipped showed `loss` 0.0 (two replicas)
    or the last finite mean (one). The reference is stock Keras on the same input:
    NaN inputs give `loss: nan` and `TerminateOnNaN` stops after one batch. An
    infinite learning rate makes every update non-finite from finite gradients (rolled
    back): stock Keras applies the first and shows NaN from then on."""
    unit = replicas * M
    x, y, _ = data(8 * unit)
    bad = np.full_like(x, np.nan) if cause == "gradients" else x
    lr = 0.1 if cause == "gradients" else np.inf
    plain = compiled(replicas, lr=lr)
    expected = plain.fit(bad, y, batch_size=unit, epochs=2, shuffle=False, verbose=0)
    assert np.isnan(expected.history["loss"]).all()

    model = compiled(replicas, lr=lr)
    engine = tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(unit))
    seen: list[tuple[float, float]] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: seen.append((logs["loss"], logs["skipped_steps"]))
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = model.fit(
            bad, y, batch_size=unit, epochs=2, shuffle=False, verbose=0, callbacks=[record]
        )
    assert np.isnan(history.history["loss"]).all(), history.history
    assert history.history["skipped_steps"] == [8.0, 16.0]
    assert [s for _, s in seen] == list(range(1, 17))
    assert all(np.isnan(loss) for loss, _ in seen)
    assert int(engine.state.steps.numpy()) == 0
    skips = [str(w.message) for w in caught if "was skipped" in str(w.message)]
    assert len(skips) == 1, skips  # once, at the first skip
    assert skips[0].startswith("Optimizer step 1 was skipped: ")
    because = "its update was not" if cause == "update" else "its loss was nan"
    assert because in skips[0], skips[0]

    if cause == "gradients":
        # TerminateOnNaN stops fit after the first NaN loss: one batch in stock Keras.
        stock = compiled(replicas)
        stock.fit(
            bad,
            y,
            batch_size=unit,
            epochs=2,
            verbose=0,
            callbacks=[keras.callbacks.TerminateOnNaN()],
        )
        batches = int(stock.optimizer.iterations.numpy())
        assert batches == 1
        model.fit(
            bad,
            y,
            batch_size=unit,
            epochs=2,
            verbose=0,
            callbacks=[keras.callbacks.TerminateOnNaN()],
        )
        assert int(engine.state.skipped_steps.numpy()) == 16 + batches
