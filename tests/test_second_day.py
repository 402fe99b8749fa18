"""The second day of use, written as the user's scripts: keep training a saved model,
tune the learning rate with Keras's callbacks, subclassed models.

Expected values come from an uninterrupted run of the same script (continuing a saved
model must be indistinguishable from never stopping) or from the callbacks' rules
written out by hand.
"""

from __future__ import annotations

import warnings

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import weights

M = 4  # micro-batch per replica


def data(num: int = 384, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + 0.5 * rng.normal(size=(num, 1))).astype("float32")
    return x, y


def compiled(strategy: tf.distribute.Strategy, *, base: float = 0.05, seed: int = 0):
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        model = keras.Sequential(
            [keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)]
        )
        model.compile(
            optimizer=keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(base), momentum=0.9),
            loss="mse",
        )
    return model


def simigrad() -> tf_adabatch.SimiGradPolicy:
    # Batches 8..64 on 2 replicas x 4; the target is high, so the batch grows.
    return tf_adabatch.SimiGradPolicy(
        0.9, initial_batch_size=8, min_batch_size=8, max_batch_size=64
    )


def adaptive_values(engine: tf_adabatch.AdaptiveEngine) -> dict[str, np.ndarray]:
    out = {}
    for name, part in engine.adaptive_state().items():
        variables = part if isinstance(part, list) else part.variables
        for v in variables:
            out[f"{name}/{v.name}"] = np.array(v.numpy())
    return out


# ------------------------------------------------------------ load_model, attach, fit


def test_load_model_continues_the_adaptive_state_as_if_never_stopped(tmp_path) -> None:
    strategy = get_strategy(2)
    x, y = data()
    unit = 2 * M

    def fit(model, epochs):
        return model.fit(x, y, batch_size=unit, epochs=epochs, shuffle=False, verbose=0)

    # Uninterrupted: 3 epochs.
    straight = compiled(strategy)
    straight_engine = tf_adabatch.attach(straight, micro_batch_size=M, policy=simigrad())
    fit(straight, 3)

    # The same script stopped after 2 epochs, saved, loaded the second-day way.
    first = compiled(strategy)
    tf_adabatch.attach(first, micro_batch_size=M, policy=simigrad())
    fit(first, 2)
    path = str(tmp_path / "model.keras")
    first.save(path)
    with strategy.scope():
        model, engine = tf_adabatch.load_model(path, micro_batch_size=M, policy=simigrad())
    saved = adaptive_values(first._adabatch_engine)
    loaded = adaptive_values(engine)
    assert sorted(saved) == sorted(loaded) and len(saved) >= 14
    for key in saved:
        np.testing.assert_array_equal(loaded[key], saved[key], err_msg=key)
    assert engine.accumulation_steps > 1 and float(engine.state.progress.numpy()) > 0  # adapted
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # no "adaptive state is new" warning
        fit(model, 1)
    for got, want in zip(weights(model), weights(straight), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert float(engine.state.progress.numpy()) == pytest.approx(
        float(straight_engine.state.progress.numpy())
    )
    assert engine.accumulation_steps == straight_engine.accumulation_steps


def test_keras_load_model_then_attach_warns_that_the_state_is_new(tmp_path) -> None:
    strategy = get_strategy(1)
    x, y = data(96)
    model = compiled(strategy)
    tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(8))
    model.fit(x, y, batch_size=M, epochs=1, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    assert int(restored.optimizer.iterations) == 12  # 96 / 8
    engine = tf_adabatch.attach(restored, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(8))
    with pytest.warns(
        UserWarning,
        match=r"taken 12 steps but the adaptive state is new.*"
        r"tf_adabatch.load_model",
    ):
        restored.fit(x, y, batch_size=M, epochs=1, verbose=0)
    # What the warning says works: load_weights after attach restores the state.
    again = keras.models.load_model(path)
    engine = tf_adabatch.attach(again, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(8))
    again.load_weights(path)
    assert int(engine.state.steps.numpy()) == 12
    assert float(engine.state.progress.numpy()) == pytest.approx(12.0)  # S = 1: tau += 1 per step


def test_a_trainer_model_saved_by_keras_carries_its_state(tmp_path) -> None:
    strategy = get_strategy(1)
    x, y = data(128)
    model = compiled(strategy)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=model.optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(16),
        base_batch_size=8,
    )
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(M, drop_remainder=True)
    trainer.fit(dataset, steps=5, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.models.load_model(path)
    again = tf_adabatch.Trainer(
        restored,
        loss="mse",
        optimizer=restored.optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(16),
        base_batch_size=8,
    )
    restored.load_weights(path)
    assert int(again.state.steps.numpy()) == 5
    assert again.progress == pytest.approx(trainer.progress) and trainer.progress > 5.0


# ------------------------------------------------------- Keras's learning-rate callbacks


def test_reduce_lr_on_plateau_halves_the_base_rate_under_attach() -> None:
    strategy = get_strategy(2)
    x, y = data(192)
    model = compiled(strategy, base=0.04)
    # Batch 16 = 2 x base batch 8: the gain r is in [1, 2] and multiplies the base rate.
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, base_batch_size=8, policy=tf_adabatch.StaticPolicy(16)
    )
    # min_delta larger than any change: epoch 1 sets the best, every later epoch is a
    # plateau (patience 0): the base rate halves at the ends of epochs 2, 3 and 4.
    reduce = keras.callbacks.ReduceLROnPlateau(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9, verbose=0
    )
    rates = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: rates.append(engine.lr_schedule.base_rate())
    )
    model.fit(x, y, batch_size=2 * M, epochs=4, verbose=0, callbacks=[reduce, record])
    # (the base schedule is evaluated in float32, as Keras's learning rates are)
    np.testing.assert_allclose(rates, [0.04, 0.02, 0.01, 0.005], rtol=1e-7)
    assert type(reduce) is keras.callbacks.ReduceLROnPlateau  # switched back after fit
    # The gain still applies: lr = r * base rate (rule "adascale", p = 1).
    gain = float(engine.state.gain.numpy())
    assert 1.0 < gain <= 2.0
    assert float(model.optimizer.learning_rate) == pytest.approx(gain * 0.005, rel=1e-6)


def test_learning_rate_scheduler_and_a_subclass_set_the_base_rate(tmp_path) -> None:
    strategy = get_strategy(1)
    x, y = data(96)
    model = compiled(strategy, base=0.1)
    engine = tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(8))
    seen = []

    def schedule(epoch: int, rate: float) -> float:
        seen.append(rate)
        return 0.1 / (epoch + 1)

    class Noisy(keras.callbacks.LearningRateScheduler):  # a user's subclass
        pass

    model.fit(x, y, batch_size=M, epochs=3, verbose=0, callbacks=[Noisy(schedule)])
    # The schedule gets the base rate in effect and returns the next one.
    np.testing.assert_allclose(seen, [0.1, 0.1, 0.05], rtol=1e-7)
    assert engine.lr_schedule.base_rate() == pytest.approx(0.1 / 3, rel=1e-7)
    # The multiplier is part of the adaptive state: it travels with Keras's saves.
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    other = compiled(strategy, base=0.1)
    other_engine = tf_adabatch.attach(other, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(8))
    other.load_weights(path)
    assert other_engine.lr_schedule.base_rate() == pytest.approx(0.1 / 3, rel=1e-7)


def test_the_base_rate_refuses_bad_values() -> None:
    strategy = get_strategy(1)
    model = compiled(strategy)
    engine = tf_adabatch.attach(model, micro_batch_size=M)
    for bad in (0.0, -1.0, float("inf"), float("nan"), "0.1"):
        with pytest.raises(ValueError, match=r"positive, finite number. Received: learning_rate="):
            engine.lr_schedule.set_base_rate(bad)
    with pytest.raises(ValueError, match=r"not bound to an engine"):
        tf_adabatch.AdaptiveLearningRate(0.1).set_base_rate(0.05)


# ------------------------------------------------------------------ subclassed models


class Subclassed(keras.Model):
    def __init__(self) -> None:
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, x):
        return self.out(self.hidden(x))


def test_an_unbuilt_subclassed_model_is_refused_with_what_to_do_then_trains() -> None:
    x, y = data(64)
    model = Subclassed()
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    with pytest.raises(
        ValueError,
        match=r"must be built .* calling it once on a batch, e\.g\. "
        r"`model\(x\[:1\]\)`.*Received: model=.*built=False",
    ):
        tf_adabatch.attach(model, micro_batch_size=M)
    model(x[:1])  # what the message says
    engine = tf_adabatch.attach(model, micro_batch_size=M)
    before = weights(model)
    model.fit(x, y, batch_size=M, epochs=1, verbose=0)
    assert int(engine.state.steps.numpy()) == 16
    assert any(not np.array_equal(a, b) for a, b in zip(before, weights(model), strict=True))


# ------------------------------------------------------------------ one line per mistake


def _model() -> keras.Model:
    return keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])


def _trainer(**kwargs) -> tf_adabatch.Trainer:
    kwargs.setdefault("optimizer", keras.optimizers.SGD(0.1))
    model = kwargs.pop("model", None) or _model()
    return tf_adabatch.Trainer(model, loss="mse", micro_batch_size=4, **kwargs)


_BOUNDS = {"initial_batch_size": 8, "min_batch_size": 8, "max_batch_size": 64}

# (call, the message's start): each names the argument, the rule and the value.
BAD_CALLS = {
    "policy_string": (
        lambda: _trainer(policy="static"),
        "Argument `policy` must be a `tf_adabatch.BatchPolicy`",
    ),
    "optimizer_none": (lambda: _trainer(optimizer=None), "Argument `optimizer` must be a Keras"),
    "optimizer_name": (lambda: _trainer(optimizer="sgd"), "Argument `optimizer` must be a Keras"),
    "strategy_name": (
        lambda: _trainer(strategy="mirrored"),
        "Argument `strategy` must be a `tf.distribute.Strategy`",
    ),
    "model_string": (lambda: _trainer(model="model"), "Argument `model` must be a `keras.Model`"),
    "attach_string": (
        lambda: tf_adabatch.attach("model", micro_batch_size=4),
        "Argument `model` must be a `keras.Model`",
    ),
    "ema_decay": (lambda: _trainer(ema_decay="x"), "Argument `ema_decay` must be a number"),
    "min_variance": (
        lambda: _trainer(min_variance="x"),
        "Argument `min_variance` must be a finite number",
    ),
    "jit_compile": (lambda: _trainer(jit_compile="yes"), "Argument `jit_compile` must be True"),
    "target_string": (
        lambda: tf_adabatch.SimiGradPolicy("0.5", **_BOUNDS),
        "Argument `target_similarity` must be in (0, 1)",
    ),
    "noise_inf": (
        lambda: tf_adabatch.NoiseScalePolicy(float("inf"), **_BOUNDS),
        "Argument `factor` must be a finite number > 0",
    ),
    "hysteresis": (
        lambda: tf_adabatch.GoodputPolicy(hysteresis="x", **_BOUNDS),
        "Argument `hysteresis` must be a finite number >= 0",
    ),
    "budget_string": (
        lambda: tf_adabatch.ProgressBudget("10"),
        "Argument `base_steps` must be a finite number > 0",
    ),
    "budget_inf": (
        lambda: tf_adabatch.ProgressBudget(float("inf")),
        "Argument `base_steps` must be a finite number > 0",
    ),
    "log_dir": (lambda: tf_adabatch.AdaBatchTensorBoard(3), "Argument `log_dir` must be a path"),
    "fit_none": (lambda: _trainer().fit(None, steps=1), "Argument `dataset` must be a"),
    "fit_numpy": (
        lambda: _trainer().fit(np.ones((8, 3), "float32"), steps=1),
        "Argument `dataset` must be a",
    ),
    "fit_progress": (
        lambda: _trainer().fit(
            tf.data.Dataset.from_tensor_slices((np.ones((8, 3), "float32"),)).batch(4),
            until_progress="x",
        ),
        "Argument `until_progress` must be a number >= 0",
    ),
    "evaluate_none": (lambda: _trainer().evaluate(None), "Argument `dataset` must be a finite"),
    "lr_inf": (
        lambda: tf_adabatch.AdaptiveLearningRate(float("inf")),
        "Argument `base` must be a positive, finite float",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_CALLS))
def test_a_wrong_argument_is_one_value_error_naming_it(case: str) -> None:
    call, start = BAD_CALLS[case]
    with pytest.raises(ValueError) as info:
        call()
    message = str(info.value)
    assert message.startswith(start), message
    assert "Received: " in message and "\n" not in message
