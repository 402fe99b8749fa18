"""The learning-rate rules: scripted gains, serialization, checkpoints, the engine."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.state import AdaptiveState

from conftest import get_strategy
from helpers import (
    dense_model,
    global_micro_batches,
    mlp,
    regression_data,
    sum_of_outputs,
    sum_of_outputs_closed_form,
)

# Base schedule in base-batch steps: 1.0 up to step 2, 0.5 up to step 5, then 0.1.
BASE = keras.optimizers.schedules.PiecewiseConstantDecay([2, 5], [1.0, 0.5, 0.1])


def test_adascale_with_scripted_gains() -> None:
    """gains 1, 1.5, 2, 2, 3: tau before each step = 0, 1, 2.5, 4.5, 6.5;
    base(floor(tau)) = base(0), base(1), base(2), base(4), base(6) = 1, 1, 1, 0.5, 0.1;
    lr = r * base = 1, 1.5, 2, 1, 0.3."""
    state = AdaptiveState()
    lr = tf_adabatch.AdaptiveLearningRate(BASE)
    lr.bind(state, batch_unit=8, base_batch_size=8)
    rates, taus = [], []
    for r in (1.0, 1.5, 2.0, 2.0, 3.0):
        state.gain.assign(r)
        taus.append(float(state.progress.numpy()))
        rates.append(float(lr(123)))  # the optimizer's own step count is ignored
        state.progress.assign_add(lr.progress_increment(state.gain, 1.0))
    assert taus == [0.0, 1.0, 2.5, 4.5, 6.5]
    assert rates == pytest.approx([1.0, 1.5, 2.0, 1.0, 0.3], rel=1e-6)


@pytest.mark.parametrize(
    "rule,kwargs,expected",
    [
        # k = 4 micro-steps of unit 8 = batch 32, B0 = 8: S = 4; gain 3; tau = 0 (base 1.0)
        ("adascale", {}, 3.0),
        ("adascale", {"gain_power": 0.5}, 3.0**0.5),
        ("sqrt", {}, 2.0),
        ("linear", {}, 4.0),
        ("none", {}, 1.0),
    ],
)
def test_rule_factors(rule, kwargs, expected) -> None:
    state = AdaptiveState(accumulation_steps=4)
    state.gain.assign(3.0)
    lr = tf_adabatch.AdaptiveLearningRate(BASE, rule, **kwargs)
    lr.bind(state, batch_unit=8, base_batch_size=8)
    assert float(lr(0)) == pytest.approx(expected, rel=1e-6)
    assert float(lr.progress_increment(3.0, 4.0)) == (3.0 if rule == "adascale" else 4.0)


def test_linear_warmup_ramps_from_one_to_scale() -> None:
    lr = tf_adabatch.AdaptiveLearningRate(0.1, "linear", warmup_steps=10)
    assert [float(lr.factor(1.0, 5.0, t)) for t in (0.0, 5.0, 10.0, 20.0)] == [1.0, 3.0, 5.0, 5.0]


def test_serialization_round_trip() -> None:
    lr = tf_adabatch.AdaptiveLearningRate(BASE, "adascale", gain_power=0.5)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(lr))
    assert isinstance(restored, tf_adabatch.AdaptiveLearningRate)
    assert restored.get_config() == lr.get_config()
    assert float(restored(3)) == float(lr(3)) == 0.5
    optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.2, "sqrt"), momentum=0.9)
    config = keras.saving.serialize_keras_object(optimizer)
    again = keras.saving.deserialize_keras_object(config)
    assert again._learning_rate.rule == "sqrt" and again._learning_rate.base == 0.2


def test_bad_rule_arguments() -> None:
    with pytest.raises(
        ValueError,
        match=r"Argument `rule` must be one of \('adascale', 'sqrt', 'linear', 'none'\). Received: rule='cubic'",
    ):
        tf_adabatch.AdaptiveLearningRate(0.1, "cubic")
    for bad in (-1, float("inf"), float("nan"), "0.1"):
        with pytest.raises(
            ValueError,
            match=rf"Argument `base` must be a positive, finite float .* Received: base={bad!r}",
        ):
            tf_adabatch.AdaptiveLearningRate(bad)
    for bad in ("x", 0.0, 1.5, True):
        with pytest.raises(
            ValueError, match=rf"`gain_power` must be in \(0, 1\]. Received: gain_power={bad!r}"
        ):
            tf_adabatch.AdaptiveLearningRate(0.1, gain_power=bad)
    with pytest.raises(ValueError, match=r"applies to rule='linear' only"):
        tf_adabatch.AdaptiveLearningRate(0.1, "adascale", warmup_steps=5)


def adascale_trainer(replicas: int = 2, **kwargs) -> tf_adabatch.Trainer:
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(BASE), momentum=0.9)
    return tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=4,
        base_batch_size=8,
        policy=tf_adabatch.StaticPolicy(replicas * 4 * 4),
        strategy=strategy,
        **kwargs,
    )


def test_engine_applies_gain_times_base_at_floor_tau() -> None:
    """The gains come from numpy (`helpers.sum_of_outputs_closed_form`: with `Dense` and
    the sum-of-outputs loss every per-sample gradient is known whatever the weights),
    not from the engine's logs; tau and the learning rate follow from them."""
    strategy = get_strategy(2)
    model = dense_model(strategy, 3, 2)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(BASE), momentum=0.9)
    trainer = tf_adabatch.Trainer(
        model,
        loss=sum_of_outputs,
        optimizer=optimizer,
        micro_batch_size=2,
        base_batch_size=4,
        policy=tf_adabatch.StaticPolicy(2 * 2 * 4),  # S = 4
        ema_decay=0.5,
        strategy=strategy,
    )
    x = np.random.default_rng(3).normal(size=(2 * 2 * 4 * 6, 3)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros((len(x), 2), np.float32)))
    history = trainer.fit(data.batch(4, drop_remainder=True), steps=6, verbose=0)
    expected = sum_of_outputs_closed_form(
        x, [4] * 6, replicas=2, micro=2, base_batch=4, d_out=2, decay=0.5
    )
    gains = np.array([e["gain"] for e in expected])
    taus = np.concatenate([[0.0], np.cumsum(gains)])
    assert gains.min() > 1.0 and gains.max() < 4.0  # not clamped: the test sees the gain
    assert taus[-1] > 6  # the base schedule's steps (2, 5) are crossed
    np.testing.assert_allclose(history["gain"], gains, rtol=1e-5)
    np.testing.assert_allclose(history["progress"], taus[1:], rtol=1e-5)
    base = [float(BASE(np.floor(t))) for t in taus[:-1]]
    np.testing.assert_allclose(history["learning_rate"], gains * base, rtol=1e-5)


def test_engine_lr_matches_a_manual_sgd_step() -> None:
    """Plain SGD: the weight moves by exactly lr_t * gbar with lr_t from the schedule."""
    strategy = get_strategy(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05))
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=4,
        base_batch_size=4,
        policy=tf_adabatch.StaticPolicy(16),
        strategy=strategy,
    )
    x, y = regression_data(16)
    w0, b0 = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    history = trainer.fit(global_micro_batches(x, y, 8), steps=1, verbose=0)
    residual = x @ w0 + b0 - y
    grad_b = 2.0 / (16 * 3) * residual.sum(0)
    assert history["gain"][0] > 1.0
    np.testing.assert_allclose(
        model.trainable_variables[1].numpy(), b0 - 0.05 * history["gain"][0] * grad_b, rtol=1e-5
    )


def test_schedule_state_comes_back_from_a_checkpoint(tmp_path) -> None:
    trainer = adascale_trainer()
    x, y = regression_data(2 * 4 * 4 * 8)
    data = global_micro_batches(x, y, 8).repeat()
    trainer.fit(data, steps=3, verbose=0)
    path = trainer.checkpoint.save(str(tmp_path / "ckpt"))
    lr_saved, tau_saved = trainer.learning_rate, trainer.progress
    trainer.fit(data, steps=3, verbose=0)
    assert trainer.progress != tau_saved
    trainer.checkpoint.read(path).assert_consumed()
    assert (trainer.learning_rate, trainer.progress) == (lr_saved, tau_saved)
