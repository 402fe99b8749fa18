"""Batch-size policies: from one step's statistics to the next global batch size.

A policy is a pure, graph-safe decision. The engine calls `next_batch_size` in
cross-replica context, inside `tf.function`, once per optimizer step that was applied,
and realises the answer as a number of accumulation micro-steps
k = round(B / (replicas * micro_batch)), clamped to what the engine can run. Changing
it never retraces the step.
"""

from __future__ import annotations

import abc
from typing import NamedTuple

import tensorflow as tf

__all__ = ["BatchPolicy", "StaticPolicy", "StepStats"]


class StepStats(NamedTuple):
    """What a policy sees after each optimizer step (float64 scalar tensors).

    Attributes:
      similarity: the groups' cosine similarity of this step (exact mode) or the
        estimate from the smoothed moments (estimated mode); may be NaN.
      grad_sqr: smoothed |G|^2.
      trace_sigma: smoothed per-example tr(Sigma).
      noise_scale: tr(Sigma) / |G|^2 of the smoothed moments; may be inf or NaN.
      gain: the AdaScale gain of this step.
      progress: scale-invariant progress tau after this step.
      step: optimizer steps applied so far, this one included.
    """

    similarity: tf.Tensor
    grad_sqr: tf.Tensor
    trace_sigma: tf.Tensor
    noise_scale: tf.Tensor
    gain: tf.Tensor
    progress: tf.Tensor
    step: tf.Tensor


class BatchPolicy(abc.ABC):
    """Base class of batch-size policies.

    Subclasses implement `initial_batch_size` and `next_batch_size`. They must keep
    any state of their own in `tf.Variable`s (so that it is checkpointed and read
    in-graph) and never call host-side Python per step.
    """

    @property
    @abc.abstractmethod
    def initial_batch_size(self) -> int:
        """The global batch size of the first optimizer step."""

    @abc.abstractmethod
    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        """Returns the next global batch size (int64 scalar tensor).

        Called in cross-replica context, inside `tf.function`; must be
        tf.function-safe.

        Args:
          batch_size: the global batch size of the step just taken (int64).
          stats: that step's statistics.
        """


class StaticPolicy(BatchPolicy):
    """Keeps the batch size where it is: set at start, or between steps by the caller.

    Args:
      batch_size: the global batch size (a multiple of replicas x micro-batch).

    Example:

    >>> policy = StaticPolicy(256)
    >>> policy.initial_batch_size
    256
    """

    def __init__(self, batch_size: int) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(
                f"Argument `batch_size` must be a positive integer. Received: batch_size={batch_size!r}"
            )
        self._batch_size = batch_size

    @property
    def initial_batch_size(self) -> int:
        return self._batch_size

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        del stats  # A static policy does not look at the statistics.
        return tf.cast(batch_size, tf.int64)
