"""A skipped optimizer step changes nothing, and a step whose update is not finite is skipped.

Two ways a step can leave damage although it is "skipped":
- the forward passes of its micro-steps write the model's non-trainable variables
  (BatchNormalization's moving statistics, a Dropout's seed generator) before anyone
  knows the gradients are NaN;
- the gradients are finite but the update is not (an infinite learning rate, an
  overflow in the optimizer), so the weights or the optimizer's slots become
  non-finite and a checkpoint taken afterwards would hold them.

The engine copies those variables at the start of every step and restores them when
the step is skipped. These tests compare every variable bit for bit with its value
before the step, and first show that the step really writes them when it is applied
(so the comparisons can fail).
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.rollback import StepRollback

from conftest import get_strategy
from helpers import (
    assert_unchanged,
    bn_model,
    changed,
    global_micro_batches,
    regression_data,
    snapshot,
)

M = 4


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_nan_micro_batch_leaves_batchnorm_statistics_and_everything_else_bit_identical(
    replicas: int,
) -> None:
    strategy = get_strategy(replicas)
    k = 2
    step = replicas * M * k
    x, y = regression_data(4 * step)
    x[step + 1, 0] = np.nan  # step 2, first micro-batch of replica 0
    model = bn_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.SimiGradPolicy(
            0.5, initial_batch_size=step, min_batch_size=step, max_batch_size=4 * step
        ),
        similarity="exact" if replicas > 1 else "estimated",
        strategy=strategy,
    )
    iterator = iter(trainer.distribute(global_micro_batches(x, y, replicas * M)))
    first = snapshot(trainer)
    assert float(trainer.engine.train_step(iterator)["applied"]) == 1.0
    before = snapshot(trainer)
    # An applied step writes the moving statistics, the seed generator and the
    # weights: the comparisons below can fail.
    assert len(changed(first, before, "moving_")) == 2
    assert changed(first, before, "seed_generator")
    assert changed(first, before, "kernel")
    seen, batch = int(trainer.state.samples_seen.numpy()), trainer.batch_size
    assert seen + batch > step + 1  # the NaN example falls into the next step
    logs = trainer.engine.train_step(iterator)  # the NaN micro-batch
    assert float(logs["applied"]) == 0.0
    after = snapshot(trainer)
    assert assert_unchanged(before, after) == len(before) - 3
    assert int(trainer.state.skipped_steps.numpy()) == 1
    assert int(trainer.state.samples_seen.numpy()) == seen + batch
    assert trainer.batch_size == batch  # the policy did not move
    # Evaluation stays finite (it uses the moving statistics).
    y_pred = model(x[:8], training=False)
    assert np.isfinite(y_pred.numpy()).all()
    assert float(trainer.engine.train_step(iterator)["applied"]) == 1.0  # trains on


def lr_trainer(
    strategy: tf.distribute.Strategy, lr: tf.Variable, step: int, **options: object
) -> tf_adabatch.Trainer:
    """A BatchNormalization model's Trainer whose SGD reads its rate from `lr` (a test
    sets it to inf: finite gradients, a non-finite update)."""
    model = bn_model(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(lambda: lr, momentum=0.9)
    return tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(step),
        strategy=strategy,
        **options,
    )


def test_an_update_that_makes_the_weights_non_finite_is_rolled_back() -> None:
    """lr = inf: the gradients are finite, the updated weights and slots are not."""
    strategy = get_strategy(2)
    step = 2 * M * 2
    x, y = regression_data(8 * step)
    lr = tf.Variable(0.05, dtype=tf.float32, trainable=False)
    trainer = lr_trainer(strategy, lr, step, max_consecutive_skips=3)
    engine = trainer.engine
    iterator = iter(trainer.distribute(global_micro_batches(x, y, 2 * M)))
    first = snapshot(trainer)
    assert float(engine.train_step(iterator)["applied"]) == 1.0
    before = snapshot(trainer)
    # An applied step moves the weights, the momentum slots, the iteration counter and
    # the statistics: the comparison below can fail.
    assert changed(first, before, "kernel")
    assert changed(first, before, "momentum")
    assert changed(first, before, "iteration")
    assert changed(first, before, "ema_weight")
    lr.assign(float("inf"))
    logs = engine.train_step(iterator)
    assert float(logs["applied"]) == 0.0
    after = snapshot(trainer)
    assert assert_unchanged(before, after) == len(before) - 3
    assert float(logs["gain"]) == float(before["state/adabatch_state/gain:0"])
    with pytest.raises(tf_adabatch.NonFiniteGradientsError, match="3 optimizer steps in a row"):
        trainer.fit(iterator, steps=5, verbose=0)
    assert assert_unchanged(before, snapshot(trainer)) == len(before) - 3
    lr.assign(0.05)
    assert float(engine.train_step(iterator)["applied"]) == 1.0  # recovers


def test_base_batch_size_zero_is_refused_not_replaced_by_the_default() -> None:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(
        ValueError,
        match=r"`base_batch_size` must be a positive integer\. Received: base_batch_size=0",
    ):
        tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=keras.optimizers.SGD(0.1),
            micro_batch_size=4,
            base_batch_size=0,
        )


def test_under_attach_a_skipped_step_leaves_the_compiled_metrics_alone() -> None:
    """fit over three micro-batches, the second holding a NaN: with learning rate 0 the
    predictions never change, so the epoch's loss and MAE must be the means over the
    first and third micro-batches alone, computed here from the model's predictions
    (without the roll-back both would be NaN)."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.0), loss="mse", metrics=["mae"])
    tf_adabatch.attach(model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(M))
    x, y = regression_data(3 * M)
    x[M + 1, 2] = np.nan
    clean = np.r_[0:M, 2 * M : 3 * M]
    pred = model.predict(x[clean], verbose=0)
    history = model.fit(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(M, drop_remainder=True), verbose=0
    )
    engine = model._adabatch_engine
    assert int(engine.state.skipped_steps.numpy()) == 1 and int(engine.state.steps.numpy()) == 2
    np.testing.assert_allclose(
        history.history["loss"], [np.mean((pred - y[clean]) ** 2)], rtol=1e-5
    )
    np.testing.assert_allclose(
        history.history["mae"], [np.mean(np.abs(pred - y[clean]))], rtol=1e-5
    )


def test_the_finiteness_check_sees_every_variable_and_each_kind_of_non_finite_value() -> None:
    """`StepRollback.all_finite` sums each variable and tests the sums (issue 16: one pass,
    no boolean copy): a NaN or an inf in any one of them, float16 ones included, is
    found; large finite values whose sum stays below float32's range are not flagged."""
    shapes = [(3,), (2, 2), (5,)]
    weights = [tf.Variable(tf.ones(s)) for s in shapes]
    half = tf.Variable(tf.ones([4], tf.float16))
    rollback = StepRollback(
        tf.distribute.get_strategy(), local=[], mirrored=[*weights, half], name="finite_check"
    )
    assert bool(rollback.all_finite())
    checked = 0
    for variable in [*weights, half]:
        for bad in (float("nan"), float("inf"), float("-inf")):
            before = variable.numpy()
            value = before.copy().ravel()
            value[-1] = bad
            variable.assign(value.reshape(before.shape))
            assert not bool(rollback.all_finite()), (variable.name, bad)
            variable.assign(before)
            assert bool(rollback.all_finite())
            checked += 1
    assert checked == 12
    weights[1].assign(tf.fill([2, 2], 1e37))  # sum 4e37 < 3.4e38: finite
    assert bool(rollback.all_finite())


def test_an_update_that_leaves_only_a_moving_statistic_infinite_is_skipped_and_undone() -> None:
    """docs/reliability.md: a step that leaves any state non-finite is skipped, the
    per-replica state (BatchNormalization's moving statistics) included. One example of
    1e25 in step 2 makes that micro-batch's variance of feature 0 overflow float32 (its
    square is 1e50 > 3.4e38): the moving variance becomes inf, while the normalised
    output there is (x - mean) / sqrt(inf) = 0, so the loss, the gradients and the new
    weights stay finite. The step must be skipped, everything bit for bit as before it."""
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((6,)), keras.layers.BatchNormalization(momentum=0.5), keras.layers.Dense(3)]
    )
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.05),
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(M),
        similarity="estimated",
    )
    x, y = regression_data(4 * M)
    x[M + 1, 0] = 1e25  # step 2's micro-batch
    iterator = iter(trainer.distribute(global_micro_batches(x, y, M)))
    assert float(trainer.engine.train_step(iterator)["applied"]) == 1.0
    before = snapshot(trainer)
    # What the step would write, computed outside the engine: finite gradients, an
    # infinite moving variance.
    xb, yb = x[M : 2 * M], y[M : 2 * M]
    with tf.GradientTape() as tape:
        loss = keras.losses.MeanSquaredError()(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    assert all(np.isfinite(g.numpy()).all() for g in grads) and np.isfinite(loss.numpy())
    variance = model.layers[0].moving_variance.numpy()
    assert np.isinf(variance[0]) and np.isfinite(variance[1:]).all()
    for v in model.variables:  # undo that probe's writes: the engine starts from `before`
        v.assign(before[f"model/{v.path}"])
    logs = trainer.engine.train_step(iterator)
    assert float(logs["applied"]) == 0.0
    after = snapshot(trainer)
    assert assert_unchanged(before, after) == len(before) - 3
    assert float(trainer.engine.train_step(iterator)["applied"]) == 1.0  # trains on


def test_rollback_stop_keeps_no_copy_and_stops_on_a_non_finite_update() -> None:
    """rollback="stop" (memory-light): no copy of the weights and slots; a non-finite
    gradient is still skipped with nothing changed, and an update from finite gradients
    that is not finite (lr = inf) stops the run, in a block too, at that step."""
    strategy = get_strategy(2)
    step = 2 * M * 2
    x, y = regression_data(8 * step)
    sizes = {}
    lr = tf.Variable(0.05, dtype=tf.float32, trainable=False)
    for mode in ("copy", "stop"):
        trainer = lr_trainer(strategy, lr, step, rollback=mode)
        sizes[mode] = trainer.engine.memory()
    model = trainer.engine.model
    # The copy holds the weights and the momentum slots on both devices; without it, only
    # BatchNormalization's moving statistics (per device) are copied.
    copy, stop = sizes["copy"], sizes["stop"]
    trainable = sum(v.numpy().nbytes for v in model.trainable_variables) * 2
    non_trainable = sum(v.numpy().nbytes for v in model.non_trainable_variables) * 2
    assert stop["rollback"] == non_trainable
    assert copy["rollback"] == non_trainable + copy["optimizer"] + trainable
    engine = trainer.engine
    iterator = iter(trainer.distribute(global_micro_batches(x, y, 2 * M)))
    assert float(engine.train_step(iterator)["applied"]) == 1.0
    nan_x = np.full_like(x[: 2 * M], np.nan)
    bad = iter(trainer.distribute(global_micro_batches(nan_x, y[: 2 * M], 2 * M).repeat()))
    before = snapshot(trainer)
    assert float(engine.train_step(bad)["applied"]) == 0.0  # a non-finite gradient: skipped
    assert assert_unchanged(before, snapshot(trainer)) == len(before) - 3  # counters aside
    lr.assign(float("inf"))
    with pytest.raises(tf_adabatch.NonFiniteUpdateError, match="Optimizer step 3 had finite"):
        engine.train_steps(iterator, 8)
    assert int(trainer.state.steps.numpy()) == 1  # the block stopped at that step
    assert int(trainer.state.skipped_steps.numpy()) == 2
