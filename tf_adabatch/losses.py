"""The engine's losses: unreduced per-example losses and Keras's sample-weight matching."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

__all__ = ["per_example_loss_fn", "weighted_losses"]


def per_example_loss_fn(loss: Any) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """Returns a function computing unreduced, unscaled per-example losses.

    A Keras `Loss` object's `__call__` reduces and divides by the replica count under a
    strategy; its public `call` does neither. A string is resolved with
    `keras.losses.get`; any other callable must return per-example losses.

    >>> per_example_loss_fn("mse")(tf.constant([[0.0], [1.0]]), tf.constant([[1.0], [3.0]])).numpy()
    array([1., 4.], dtype=float32)
    """
    if isinstance(loss, str):
        loss = keras.losses.get(loss)
    if isinstance(loss, keras.losses.Loss):
        return loss.call
    if callable(loss):
        return loss
    raise TypeError(
        "Argument `loss` must be a Keras `Loss`, a loss name or a callable "
        f"`(y_true, y_pred) -> per-example losses`. Received: loss={loss!r}"
    )


def weighted_losses(losses: tf.Tensor, sample_weight: Any) -> tf.Tensor:
    """`losses * sample_weight`, the weights' shape matched to the losses' as Keras does.

    Trailing size-1 axes of the weights are dropped while they outrank the losses (weights
    of shape `(batch, 1)` with losses of shape `(batch,)`), and trailing axes are added
    while the losses outrank them (weights `(batch,)`, losses `(batch, time)`). A loss
    that returns its batch mean (a scalar) is multiplied by every weight, so the step's
    loss is that mean times the weights' mean: Keras's `model.fit` does the same.

    >>> float(tf.reduce_mean(weighted_losses(tf.constant(2.0), tf.constant([[1.0], [3.0]]))))
    4.0
    """
    sw = tf.cast(sample_weight, losses.dtype)
    loss_rank, sw_rank = losses.shape.rank, sw.shape.rank
    if loss_rank is None or sw_rank is None:
        raise ValueError(
            "tf_adabatch needs the rank of the losses and of the sample weights when the step "
            f"is traced. Received: losses of shape {losses.shape} and sample_weight of shape "
            f"{sw.shape}"
        )
    while sw_rank > max(loss_rank, 1) and sw.shape[-1] == 1:
        sw = tf.squeeze(sw, axis=-1)
        sw_rank -= 1
    if sw_rank > max(loss_rank, 1):
        raise ValueError(
            "Argument `sample_weight` must have one weight per example (shape (batch,) or "
            f"(batch, 1)) or the losses' shape {losses.shape}. Received: sample_weight of "
            f"shape {sw.shape}"
        )
    if loss_rank > sw_rank:
        sw = tf.reshape(sw, tf.concat([tf.shape(sw), tf.ones([loss_rank - sw_rank], tf.int32)], 0))
    return losses * sw
