"""The adaptive state: every number the adaptation carries from step to step.

All of it lives in `tf.Variable`s so that the training step reads it in-graph (no
retrace when it changes) and `tf.train.Checkpoint` saves it with the model.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["AdaptiveState"]


def _scalar(name: str, value: float | int, dtype: tf.DType) -> tf.Variable:
    # Mirrored under a strategy; written in cross-replica context only, or from host code
    # between steps. ONLY_FIRST_REPLICA keeps a replica-context write well defined too.
    return tf.Variable(
        tf.constant(value, dtype),
        name=name,
        trainable=False,
        aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
    )


class AdaptiveState(tf.Module):
    """Checkpointable adaptive state (create it inside the strategy scope).

    Attributes (all scalar `tf.Variable`s):
      accumulation_steps: k, micro-steps per optimizer step (int64).
      steps: optimizer steps applied (int64).
      skipped_steps: optimizer steps skipped because a gradient was not finite (int64).
      consecutive_skips: skipped steps since the last applied one (int64).
      samples_seen: examples consumed, including those of skipped steps (int64).
      gain: the AdaScale gain of the last step (float64; 1 before any statistics).
      progress: scale-invariant progress tau, in base-batch steps (float64).
      similarity: the last measured cosine similarity of the two groups (float64).
      grad_sqr_biased, trace_sigma_biased, ema_weight: debiasable moving averages
        of |G|^2 and per-example tr(Sigma) (float64).
      prev_batch_size: batch of the previous step's gradient, used by the differenced
        estimator (0 while there is none).
      batch_unit: replicas x micro-batch of the engine that last wrote the state, so
        that a resume on another topology keeps the global batch k x batch_unit
        (`AdaptiveEngine.carry_batch_over`; int64, 0 if unknown).

    Example:

    >>> state = AdaptiveState(accumulation_steps=2)
    >>> int(state.accumulation_steps), float(state.gain)
    (2, 1.0)
    """

    def __init__(
        self, accumulation_steps: int = 1, batch_unit: int = 0, name: str = "adabatch_state"
    ) -> None:
        super().__init__(name=name)
        with self.name_scope:
            self.accumulation_steps = _scalar("accumulation_steps", accumulation_steps, tf.int64)
            self.steps = _scalar("steps", 0, tf.int64)
            self.skipped_steps = _scalar("skipped_steps", 0, tf.int64)
            self.consecutive_skips = _scalar("consecutive_skips", 0, tf.int64)
            self.samples_seen = _scalar("samples_seen", 0, tf.int64)
            self.gain = _scalar("gain", 1.0, tf.float64)
            self.progress = _scalar("progress", 0.0, tf.float64)
            self.similarity = _scalar("similarity", float("nan"), tf.float64)
            self.grad_sqr_biased = _scalar("grad_sqr_biased", 0.0, tf.float64)
            self.trace_sigma_biased = _scalar("trace_sigma_biased", 0.0, tf.float64)
            self.ema_weight = _scalar("ema_weight", 0.0, tf.float64)
            self.prev_batch_size = _scalar("prev_batch_size", 0.0, tf.float64)
            self.batch_unit = _scalar("batch_unit", batch_unit, tf.int64)
