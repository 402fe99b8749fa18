"""The optimizer step under XLA (`jit_compile=True`).

On one replica everything after the micro-steps that draw data compiles into one XLA
program: the last micro-step, the reduce, the statistics, the apply, the roll-back and
the policy (`AdaptiveEngine._finish_step`); the roll-back's save compiles on its own.
Only the loop that draws the k micro-batches from the iterator stays outside, as in
Keras's own `fit` (an iterator has no XLA kernel). On several replicas TensorFlow
refuses to compile cross-replica code that touches every device's variables, Keras's
own `fit(jit_compile=True)` included: the last test pins that down, so that an upgrade
that lifts it is noticed.
"""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.measure import SCOPES

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
STEP = 2 * M  # k = 2 on one replica (estimated similarity needs two micro-steps)
_BOUNDS = {"initial_batch_size": STEP, "min_batch_size": STEP, "max_batch_size": 8 * STEP}
POLICIES = {
    "static": lambda: tf_adabatch.StaticPolicy(STEP),
    "simigrad": lambda: tf_adabatch.SimiGradPolicy(0.5, **_BOUNDS),
    "goodput": lambda: tf_adabatch.GoodputPolicy(**_BOUNDS),
    "noise_scale": lambda: tf_adabatch.NoiseScalePolicy(2.0, **_BOUNDS),
    "norm_test": lambda: tf_adabatch.NormTestPolicy(1.0, **_BOUNDS),
    "critical_warmup": lambda: tf_adabatch.CriticalBatchWarmupPolicy(**_BOUNDS),
    "seesaw": lambda: tf_adabatch.SeesawPolicy(
        [5.0, 10.0], initial_batch_size=STEP, max_batch_size=8 * STEP
    ),
    "schedule": lambda: tf_adabatch.SchedulePolicy(
        lambda tau: STEP * tf.cast(1 + tau // 4.0, tf.int64), **_BOUNDS
    ),
}


def _trainer(
    policy: tf_adabatch.BatchPolicy, lr: object = 0.05, *, dropout: bool = True, **options: object
) -> tf_adabatch.Trainer:
    strategy = get_strategy(1, mirrored=True)
    model = bn_model(strategy, dropout=dropout)
    with strategy.scope():
        rate = tf_adabatch.AdaptiveLearningRate(lr) if isinstance(lr, float) else lr
        optimizer = keras.optimizers.SGD(rate, momentum=0.9)
    return tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=policy,
        strategy=strategy,
        **options,
    )


def _scopes(hlo: str) -> set[str]:
    """The engine's name scopes (`SCOPES`) among the HLO's op metadata: which parts of
    the step the XLA program holds."""
    names = re.findall(r'op_name="([^"]+)"', hlo)
    return {part for name in names for part in name.split("/") if part in SCOPES.values()}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_on_one_mirrored_replica_the_step_after_its_data_is_one_xla_program(name: str) -> None:
    """Every policy: the finish (statistics, apply, roll-back, policy) lowers to HLO."""
    trainer = _trainer(POLICIES[name](), jit_compile=True)
    engine = trainer.engine
    x, y = regression_data(64 * STEP)
    iterator = iter(trainer.distribute(global_micro_batches(x, y, M)))
    logs = engine.train_steps(iterator, 3)  # runs the compiled step
    assert logs["applied"].tolist() == [1.0, 1.0, 1.0]
    k = engine.state.accumulation_steps.read_value()
    hlo = engine._finish_fn.experimental_get_compiler_ir(k, next(iterator))(stage="hlo")
    expected = {"micro", "statistics", "apply", "rollback", "policy"}
    assert {SCOPES[part] for part in expected} <= _scopes(hlo)
    # The save, before the micro-steps (BatchNormalization's statistics, the weights
    # and slots: their copies).
    save = engine._save_fn.experimental_get_compiler_ir()(stage="hlo")
    assert save.count("ENTRY") == 1 and "parameter(" in save


def test_compiled_and_plain_steps_choose_the_same_batches_and_weights() -> None:
    """SimiGrad moves k inside the compiled step; XLA may reorder float sums, so the
    weights agree to float32 round-off rather than bit for bit. Without Dropout: under
    XLA a Dropout layer draws other masks from the same seed (its loss differs by ~30 %
    at the first step), which says nothing about the engine."""
    runs = {}
    for jit in (False, True):
        trainer = _trainer(POLICIES["simigrad"](), jit_compile=jit, dropout=False)
        x, y = regression_data(64 * STEP, seed=1)
        iterator = iter(trainer.distribute(global_micro_batches(x, y, M)))
        logs = trainer.engine.train_steps(iterator, 8)
        runs[jit] = (logs, [w.numpy() for w in trainer.engine.model.weights])
    (plain, plain_w), (jitted, jitted_w) = runs[False], runs[True]
    assert len(set(plain["batch_size"].tolist())) > 1  # the batch moved
    np.testing.assert_array_equal(jitted["batch_size"], plain["batch_size"])
    np.testing.assert_allclose(jitted["gain"], plain["gain"], rtol=1e-4)
    compared = 0
    for a, b in zip(jitted_w, plain_w, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
        compared += 1
    assert compared == len(plain_w) == 8  # 2 Dense x 2, BatchNormalization's 4


def test_the_compiled_step_rolls_back_a_nan_batch_and_a_non_finite_update_bit_for_bit() -> None:
    """The in-graph roll-back inside the XLA program: a NaN micro-batch (BatchNormalization
    statistics and seed written by its forward pass, undone) and lr = inf (finite
    gradients, non-finite weights and slots, restored from the copy)."""
    lr = tf.Variable(0.05, dtype=tf.float32, trainable=False)
    trainer = _trainer(tf_adabatch.StaticPolicy(STEP), lr=lambda: lr, jit_compile=True)
    engine = trainer.engine
    x, y = regression_data(8 * STEP)
    x[STEP + 1, 0] = np.nan  # step 2's first micro-batch
    iterator = iter(trainer.distribute(global_micro_batches(x, y, M)))
    first = snapshot(trainer)
    assert float(engine.train_step(iterator)["applied"]) == 1.0
    before = snapshot(trainer)
    for part in ("moving_", "seed_generator", "kernel", "momentum"):
        assert changed(first, before, part), part  # an applied step writes them
    assert float(engine.train_step(iterator)["applied"]) == 0.0  # the NaN micro-batch
    assert assert_unchanged(before, snapshot(trainer)) == len(before) - 3
    lr.assign(float("inf"))
    # Finite gradients, inf weights and slots after the update: only the restore from
    # the copy (inside the XLA program) brings them back.
    assert float(engine.train_step(iterator)["applied"]) == 0.0
    assert assert_unchanged(before, snapshot(trainer)) == len(before) - 3
    lr.assign(0.05)
    assert float(engine.train_step(iterator)["applied"]) == 1.0
    assert changed(before, snapshot(trainer), "kernel")


def test_on_two_replicas_xla_refuses_cross_replica_code_ours_and_keras_fit_alike() -> None:
    """What keeps the finish out of XLA on several replicas (TF 2.21): its cross-replica
    code reads every device's variables, which XLA refuses; Keras's own
    `fit(jit_compile=True)` fails the same way on two CPU replicas. If either starts to
    compile after an upgrade, compile the finish on several replicas too
    (engine.py, `_finish_fn`) and update docs/architecture.md."""
    strategy = get_strategy(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", jit_compile=True)
    x, y = regression_data(4 * M)
    with pytest.raises(tf.errors.InvalidArgumentError, match="Trying to access resource"):
        model.fit(x, y, batch_size=2 * M, verbose=0)

    with strategy.scope():
        ours = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
    trainer = tf_adabatch.Trainer(
        ours,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.1),
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(2 * M),
        similarity="exact",
        strategy=strategy,
        jit_compile=True,
    )
    engine = trainer.engine
    iterator = iter(trainer.distribute(global_micro_batches(x, y, 2 * M)))
    assert float(engine.train_step(iterator)["applied"]) == 1.0  # per-replica parts compiled
    assert not hasattr(engine._finish_fn, "experimental_get_compiler_ir")  # a plain method
    whole = tf.function(engine._finish_step, jit_compile=True)
    k = engine.state.accumulation_steps.read_value()
    with pytest.raises(tf.errors.InvalidArgumentError, match="Trying to access resource"):
        whole(k, next(iterator))
