"""Shared helpers for the tests: small models and datasets with fixed seeds."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import tf_adabatch


def sum_of_outputs(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """fairscale's test loss: per example, the sum of the model's outputs."""
    del y_true
    return tf.reduce_sum(y_pred, axis=-1)


def dense_model(
    strategy: tf.distribute.Strategy, d_in: int, d_out: int, *, use_bias: bool = True, seed: int = 0
) -> keras.Model:
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [keras.Input((d_in,)), keras.layers.Dense(d_out, use_bias=use_bias)]
        )


def mlp(
    strategy: tf.distribute.Strategy, d_in: int = 6, *, seed: int = 0, **dense_kwargs
) -> keras.Model:
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [
                keras.Input((d_in,)),
                keras.layers.Dense(8, activation="tanh", **dense_kwargs),
                keras.layers.Dense(3, **dense_kwargs),
            ]
        )


def regression_data(num: int, d_in: int = 6, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, d_in)).astype("float32")
    w = rng.normal(size=(d_in, 3)).astype("float32")
    y = (np.tanh(x @ w) + 0.3 * rng.normal(size=(num, 3))).astype("float32")
    return x, y


def trainer(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    strategy: tf.distribute.Strategy,
    **kwargs,
) -> tf_adabatch.Trainer:
    kwargs.setdefault("loss", "mse")
    return tf_adabatch.Trainer(model, optimizer=optimizer, strategy=strategy, **kwargs)


def global_micro_batches(x: np.ndarray, y: np.ndarray, global_micro: int) -> tf.data.Dataset:
    """Examples in order, batched by replicas x micro-batch (the strategy splits it)."""
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_micro, drop_remainder=True)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def checkpoint_values(workdir) -> dict[str, np.ndarray]:
    """Every variable of a run's latest checkpoint (model, optimizer, adaptive state, policy)."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir) + "/checkpoints"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH"
    }
