"""`Trainer.evaluate` takes Keras metrics, losses and names and matches `model.evaluate`.

103 examples in batches of 16 (an uneven last batch, split unevenly across replicas);
the references are plain Keras's `model.evaluate` on the same weights (rtol 1e-5:
float32 sums in another order) and numpy for the per-example means.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import mlp

M = 4


def setup(replicas: int, loss):
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    trainer = tf_adabatch.Trainer(
        model, loss=loss, optimizer=optimizer, micro_batch_size=M, strategy=strategy
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(103, 6)).astype("float32")
    y = rng.integers(0, 3, size=103)
    sw = rng.uniform(0.5, 1.5, size=103).astype("float32")
    return strategy, model, trainer, x, y, sw


@pytest.mark.parametrize("replicas", [1, 2])
def test_metrics_names_objects_losses_and_weights_match_keras(replicas: int) -> None:
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    strategy, model, trainer, x, y, sw = setup(replicas, xent)
    data = tf.data.Dataset.from_tensor_slices((x, y, sw)).batch(16)
    # Created outside the strategy's scope: re-created in it.
    outside = keras.metrics.SparseCategoricalAccuracy(name="acc_obj")
    result = trainer.evaluate(
        data,
        metrics=["accuracy", outside, xent],
        weighted_metrics={"wacc": keras.metrics.SparseCategoricalAccuracy()},
    )
    with strategy.scope():
        model.compile(
            loss=xent,
            metrics=["accuracy", keras.metrics.SparseCategoricalAccuracy(name="acc_obj")],
            weighted_metrics=[keras.metrics.SparseCategoricalAccuracy(name="wacc")],
        )
    expected = model.evaluate(x, y, sample_weight=sw, batch_size=16, verbose=0, return_dict=True)
    for name in ("loss", "accuracy", "acc_obj", "wacc"):
        assert result[name] == pytest.approx(expected[name], rel=1e-5), name
    # By hand: the weighted loss over all examples, the per-example mean of the Loss.
    logits = model.predict(x, verbose=0).astype(np.float64)
    nll = -(logits - np.log(np.exp(logits).sum(1, keepdims=True)))[np.arange(103), y]
    assert result["loss"] == pytest.approx((nll * sw).sum() / 103, rel=1e-5)
    assert result["sparse_categorical_crossentropy"] == pytest.approx(nll.mean(), rel=1e-5)
    correct = logits.argmax(1) == y
    assert result["wacc"] == pytest.approx((correct * sw).sum() / sw.sum(), rel=1e-5)


def test_scalar_loss_with_sample_weights_matches_keras() -> None:
    def mean_loss(y_true, y_pred):  # returns the batch mean, not per-example values
        return tf.reduce_mean(tf.square(y_pred[:, 0] - tf.cast(y_true, tf.float32)))

    _, model, trainer, x, y, sw = setup(1, mean_loss)
    result = trainer.evaluate(tf.data.Dataset.from_tensor_slices((x, y, sw)).batch(16))
    model.compile(loss=mean_loss)
    expected = model.evaluate(x, y, sample_weight=sw, batch_size=16, verbose=0)
    assert result["loss"] == pytest.approx(expected, rel=1e-5)


def test_bad_metrics_argument_is_refused() -> None:
    _, _, trainer, x, y, _ = setup(1, "mse")
    with pytest.raises(
        TypeError, match=r"Argument `metrics` must hold metric names.*Received: metrics=\[3\]"
    ):
        trainer.evaluate(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), metrics=[3])


@pytest.mark.parametrize("shape", ["(batch,)", "(batch, 1)"])
def test_training_with_a_scalar_loss_and_sample_weights_follows_keras(shape: str) -> None:
    """A loss returning its batch mean, trained with sample weights: Keras's rule makes
    the step's loss mean_loss * mean(weights) (the scalar broadcast over the weights),
    and weights of shape (batch, 1) are the same weights as (batch,).

    One replica, one micro-batch of M = 4 per step, static batch 4: the first step's
    loss is computed here with numpy from the initial weights."""

    def mean_loss(y_true, y_pred):
        return tf.reduce_mean(tf.square(y_pred[:, 0] - tf.cast(y_true, tf.float32)))

    _, model, trainer, x, y, sw = setup(1, mean_loss)
    weights = sw[:, None] if shape == "(batch, 1)" else sw
    pred = model.predict(x[:M], verbose=0).astype(np.float64)
    expected = np.mean((pred[:, 0] - y[:M]) ** 2) * np.mean(sw[:M])
    data = tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(M, drop_remainder=True)
    history = trainer.fit(data, steps=2, verbose=0)
    assert history["loss"][0] == pytest.approx(expected, rel=1e-5)
    assert np.isfinite(history["loss"][1])


def test_sample_weights_of_another_shape_are_refused() -> None:
    _, _, trainer, x, y, _ = setup(1, "sparse_categorical_crossentropy")
    weights = np.ones((103, 2), "float32")
    data = tf.data.Dataset.from_tensor_slices((x, y, weights)).batch(M, drop_remainder=True)
    with pytest.raises(
        ValueError,
        match=r"Argument `sample_weight` must have one weight per example .* "
        r"Received: sample_weight of shape \(4, 2\)",
    ):
        trainer.fit(data, steps=1, verbose=0)


@pytest.mark.parametrize("batch", [1, 3, 2, 64])
def test_batches_smaller_than_or_not_divisible_by_the_replicas_match_one_replica(
    batch: int,
) -> None:
    """Issue 42: on 2 replicas a global batch of 1 (or a last batch of 1, 64 = 21 x 3 +
    1) left one replica without examples, and its mean over none (NaN) made the whole
    loss NaN. The reference is stock Keras's `evaluate` on one device with the same
    weights, at the same batch size: loss within 1e-6, accuracy equal."""
    xent = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    _, model, trainer, x, y, _ = setup(2, xent)
    x, y = x[:64], y[:64]
    result = trainer.evaluate(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(batch), metrics=["accuracy"]
    )
    reference = mlp(get_strategy(1))
    reference.set_weights(model.get_weights())
    reference.compile(loss=xent, metrics=["accuracy"])
    expected = reference.evaluate(x, y, batch_size=batch, verbose=0, return_dict=True)
    assert sorted(result) == ["accuracy", "loss"]
    assert np.isfinite(expected["loss"])
    assert result["loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert result["accuracy"] == expected["accuracy"]
