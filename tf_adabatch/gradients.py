"""One micro-batch's gradients, and the mean gradient as the optimizer gets it (replica context)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf

from tf_adabatch import _keras_seams as seams
from tf_adabatch.losses import weighted_losses
from tf_adabatch.measure import SCOPES

__all__ = ["MicroGradients"]


class MicroGradients:
    """The forward and backward pass of one micro-batch, for the engine's micro-steps.

    Args:
      model: the Keras model.
      loss_fn: per-example losses `(y_true, y_pred) -> losses` (`per_example_loss_fn`).
      optimizer: the engine's optimizer; a `keras.optimizers.LossScaleOptimizer` makes
        the pass scale the loss and unscale the gradients at once (`loss_scaled`).
      micro_batch_size: examples per micro-batch, checked by `of_micro_batch`.

    `hook`, if set, is called after each forward pass with (x, y, y_pred,
    sample_weight): `attach` updates Keras's compiled metrics there.

    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1, use_bias=False)])
    >>> _ = model.layers[0].kernel.assign([[2.0]])
    >>> loss = lambda y, p: tf.square(y - p)[:, 0]  # per example
    >>> grads, data_loss = MicroGradients(model, loss, keras.optimizers.SGD())(
    ...     tf.constant([[1.0]]), tf.constant([[0.0]]), None)
    >>> float(data_loss), grads[0].numpy().tolist()  # (2x)^2 and d/dw = 2 (w x) x
    (4.0, [[4.0]])
    """

    def __init__(
        self,
        model: keras.Model,
        loss_fn: Callable[..., Any],
        optimizer: Any,
        micro_batch_size: int | None = None,
    ) -> None:
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.micro_batch_size = micro_batch_size
        self.variables = list(model.trainable_variables)
        self.loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        self.hook: Callable[[Any, Any, Any, Any], None] | None = None

    def __call__(self, x: Any, y: Any, sample_weight: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        """Gradients (unscaled, one per weight) and the mean data loss of one micro-batch."""
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = tf.cast(self.loss_fn(y, y_pred), tf.float32)
            if sample_weight is not None:
                per_example = weighted_losses(per_example, sample_weight)
            data_loss = tf.reduce_mean(per_example)
            loss = data_loss + self.extra_losses()
            if self.loss_scaled:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, self.variables)
        if self.hook is not None:
            self.hook(x, y, y_pred, sample_weight)
        grads = [
            tf.zeros(v.shape, v.dtype) if g is None else tf.cast(tf.convert_to_tensor(g), v.dtype)
            for g, v in zip(grads, self.variables, strict=True)
        ]
        if self.loss_scaled:  # unscale now: overflow stays inf/NaN and skips the step
            scale = tf.convert_to_tensor(self.optimizer.dynamic_scale)
            grads = [g / tf.cast(scale, g.dtype) for g in grads]
        return grads, data_loss

    def of_micro_batch(self, data: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        """`self(x, y, sample_weight)` of a micro-batch `data` (replica context), which
        must hold `micro_batch_size` examples."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.name_scope(SCOPES["micro"]):
            tf.debugging.assert_equal(
                tf.shape(tf.nest.flatten(x)[0])[0],
                self.micro_batch_size,
                message="tf_adabatch: a micro-batch must have `micro_batch_size` examples per "
                "replica (batch the data with replicas x micro_batch_size, drop_remainder=True)",
            )
            return self(x, y, sample_weight)

    def extra_losses(self) -> tf.Tensor:
        """Activity / `add_loss` losses of the last forward pass, without weight regularizers.

        Weight regularizers are applied once per step in `for_update` instead: they are
        the same for every micro-batch and would inflate the groups' similarity.
        """
        extra = seams.added_losses(self.model, self.variables)
        if not extra:
            return tf.constant(0.0, tf.float32)
        return tf.add_n([tf.cast(x, tf.float32) for x in extra])

    def for_update(self, grads: list[tf.Tensor], finite: tf.Tensor | None) -> list[tf.Tensor]:
        """The mean gradient as the optimizer gets it: weight regularizers' gradients
        added once per step, and scaled for a loss-scale optimizer."""
        regularized = [v for v in self.variables if getattr(v, "regularizer", None) is not None]
        if regularized:
            with tf.GradientTape() as tape:
                reg = tf.add_n([tf.cast(v.regularizer(v), tf.float32) for v in regularized])
            reg_grads = tape.gradient(reg, self.variables)
            grads = [
                g if r is None else g + tf.cast(r, g.dtype)
                for g, r in zip(grads, reg_grads, strict=True)
            ]
        if self.loss_scaled:
            # The loss-scale optimizer divides by its scale (a power of two: exact). A
            # step the engine skips (e.g. a non-finite loss with finite gradients) must
            # be skipped by the optimizer too: hand it non-finite gradients then.
            scale = tf.convert_to_tensor(self.optimizer.dynamic_scale)
            nan = tf.constant(float("nan"))
            grads = [
                tf.where(finite, g * tf.cast(scale, g.dtype), tf.cast(nan, g.dtype)) for g in grads
            ]
        return grads
