"""Inputs the engine relies on: a dataset function's per-replica batch size, integer types."""

from __future__ import annotations

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import mlp, regression_data

M = 4  # micro-batch per replica


def two_replica_trainer(**kwargs) -> tf_adabatch.Trainer:
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    kwargs.setdefault("micro_batch_size", M)
    kwargs.setdefault("policy", tf_adabatch.StaticPolicy(2 * M))
    return tf_adabatch.Trainer(model, loss="mse", optimizer=optimizer, strategy=strategy, **kwargs)


def dataset_fn(batch: int, *, drop_remainder: bool, examples: int = 40):
    x, y = regression_data(examples)

    def fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id
        )
        return ds.batch(batch, drop_remainder=drop_remainder)

    return fn


def test_function_with_a_static_wrong_batch_is_refused() -> None:
    trainer = two_replica_trainer()
    with pytest.raises(
        ValueError,
        match=r"Argument `dataset` \(a function\) must return a `tf.data.Dataset` of per-replica "
        r"micro-batches of micro_batch_size = 4 examples .* Received: batch dimensions \[8, 8\]",
    ):
        trainer.distribute(dataset_fn(2 * M, drop_remainder=True))


def test_function_returning_something_else_is_refused() -> None:
    trainer = two_replica_trainer()
    with pytest.raises(ValueError, match=r"Received: list"):
        trainer.distribute(lambda ctx: [1, 2, 3])


@pytest.mark.parametrize("batch", [M, 2 * M])
def test_function_with_an_unknown_batch_is_checked_per_micro_batch(batch: int) -> None:
    """Without drop_remainder the batch dimension is not static: each micro-batch is
    checked when read. One input pipeline feeds both replicas: 18 examples in batches
    of M = 4 are 4, 4, 4, 4, 2, so two distributed elements (one batch per replica)
    pass and the third (the batch of 2) is refused; in batches of 2M = 8 the first is."""
    trainer = two_replica_trainer()
    distributed = trainer.distribute(dataset_fn(batch, drop_remainder=False, examples=18))
    iterator = iter(distributed)
    good = 2 if batch == M else 0
    for _ in range(good):
        element = next(iterator)
        sizes = [
            int(t.shape[0]) for t in trainer.engine.strategy.experimental_local_results(element[0])
        ]
        assert sizes == [M, M]
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"micro_batch_size = 4 examples"):
        next(iterator)


def test_function_with_the_right_static_batch_trains() -> None:
    trainer = two_replica_trainer()
    history = trainer.fit(
        trainer.distribute(lambda ctx: dataset_fn(M, drop_remainder=True)(ctx).repeat()),
        steps=2,
        verbose=0,
    )
    # Static policy 2M over 2 replicas of M: one micro-step per step, 8 examples each.
    assert history["samples_seen"] == [8.0, 16.0]


def test_numpy_integers_are_accepted_where_ints_are() -> None:
    trainer = two_replica_trainer(micro_batch_size=np.int64(M), base_batch_size=np.int32(8))
    trainer.engine.set_batch_size(np.int64(4 * M))
    assert trainer.batch_size == 4 * M
    assert int(trainer.state.accumulation_steps.numpy()) == 2  # 16 / (2 replicas x 4)
    with pytest.raises(ValueError, match=r"Received: batch_size=np.float64\(16.0\)"):
        trainer.engine.set_batch_size(np.float64(16.0))
    with pytest.raises(ValueError, match=r"Received: micro_batch_size=True"):
        two_replica_trainer(micro_batch_size=True)


def test_policies_schedules_and_budgets_take_numpy_integers_as_python_ints() -> None:
    """docs/reliability.md: integer arguments accept any integer type (not bool). The
    policies and the schedule refused `np.int64` while the engine and configs took it."""
    i64 = np.int64
    checked = [
        tf_adabatch.StaticPolicy(i64(64)).initial_batch_size,
        *(
            getattr(
                tf_adabatch.SimiGradPolicy(
                    0.5,
                    initial_batch_size=i64(32),
                    min_batch_size=np.int32(16),
                    max_batch_size=i64(128),
                    interval=i64(2),
                ),
                name,
            )
            for name in ("initial_batch_size", "min_batch_size", "max_batch_size", "interval")
        ),
        tf_adabatch.GoodputPolicy(
            initial_batch_size=i64(32),
            min_batch_size=32,
            max_batch_size=64,
            base_batch_size=i64(32),
        ).base_batch_size,
        tf_adabatch.AdaptiveLearningRate(0.1, rule="linear", warmup_steps=i64(5)).warmup_steps,
        tf_adabatch.throughput.ThroughputModel(window=i64(50)).window,
    ]
    assert checked == [64, 32, 16, 128, 2, 32, 5, 50]
    assert all(type(value) is int for value in checked)  # stored as Python ints
    for bad in (True, np.float64(64.0), 0):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"`batch_size` must be a positive integer. Received: batch_size={bad!r}"
            ),
        ):
            tf_adabatch.StaticPolicy(bad)
    with pytest.raises(ValueError, match=r"`warmup_steps` must be a non-negative integer"):
        tf_adabatch.AdaptiveLearningRate(0.1, rule="linear", warmup_steps=np.float32(5))

    trainer = two_replica_trainer()
    history = trainer.fit(
        trainer.distribute(lambda ctx: dataset_fn(M, drop_remainder=True)(ctx).repeat()),
        steps=i64(2),
        verbose=0,
    )
    assert history["samples_seen"] == [8.0, 16.0]  # two steps of 8 (as with steps=2 above)


def test_every_front_door_takes_the_same_engine_options() -> None:
    """One definition (`EngineOptions`): `min_variance` reaches the engine from each door
    (it was missing from Trainer and attach), and an unknown option is refused by name."""
    options = tf_adabatch.EngineOptions.__annotations__
    assert set(options) == {
        "micro_batch_size",
        "base_batch_size",
        "policy",
        "similarity",
        "ema_decay",
        "min_variance",
        "jit_compile",
        "max_consecutive_skips",
        "rollback",
        "clock",
    }
    strategy = get_strategy(1)
    engines = []
    for door in ("engine", "trainer", "attach"):
        model = mlp(strategy)
        optimizer = keras.optimizers.SGD(0.1)
        kwargs = dict(micro_batch_size=M, min_variance=0.25)
        if door == "engine":
            engine = tf_adabatch.AdaptiveEngine(model, loss="mse", optimizer=optimizer, **kwargs)
        elif door == "trainer":
            engine = tf_adabatch.Trainer(model, loss="mse", optimizer=optimizer, **kwargs).engine
        else:
            model.compile(optimizer=optimizer, loss="mse")
            engine = tf_adabatch.attach(model, **kwargs)
        engines.append(engine)
        with pytest.raises(TypeError, match=r"unexpected keyword argument 'micro_batch'"):
            if door == "attach":
                tf_adabatch.attach(mlp(strategy), micro_batch=M)
            elif door == "trainer":
                tf_adabatch.Trainer(mlp(strategy), loss="mse", optimizer=optimizer, micro_batch=M)
            else:
                tf_adabatch.AdaptiveEngine(
                    mlp(strategy), loss="mse", optimizer=optimizer, micro_batch=M
                )
    assert [e.min_variance for e in engines] == [0.25, 0.25, 0.25]
    with pytest.raises(TypeError, match="missing required keyword argument: 'micro_batch_size'"):
        tf_adabatch.Trainer(mlp(strategy), loss="mse", optimizer=keras.optimizers.SGD(0.1))
