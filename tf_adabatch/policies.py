"""Batch-size policies: from one step's statistics to the next global batch size.

A policy is a pure, graph-safe decision. The engine calls `next_batch_size` in
cross-replica context, inside `tf.function`, once per optimizer step that was applied,
and realises the answer as a number of accumulation micro-steps
k = round(B / (replicas * micro_batch)), clamped to what the engine can run. Changing
it never retraces the step.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable
from typing import NamedTuple

import tensorflow as tf

from tf_adabatch._checks import integer, real
from tf_adabatch.stats import adascale_gain
from tf_adabatch.throughput import ThroughputModel

__all__ = [
    "BatchPolicy",
    "GoodputPolicy",
    "NoiseScalePolicy",
    "SchedulePolicy",
    "SimiGradPolicy",
    "StaticPolicy",
    "StepStats",
]


class StepStats(NamedTuple):
    """What a policy sees after each optimizer step (float64 scalar tensors).

    >>> stats = StepStats.make(similarity=0.4, noise_scale=250.0)
    >>> float(stats.noise_scale), int(stats.step)
    (250.0, 1)

    Attributes:
      similarity: the groups' cosine similarity of this step (exact mode) or its
        estimate from this step's moments (estimated mode); may be NaN.
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

    @classmethod
    def make(cls, **values: float) -> StepStats:
        """Stats from Python numbers, 0 where not given (step: 1), for tests and examples.

        >>> float(StepStats.make(similarity=0.3).similarity)
        0.3
        """
        fields = {
            name: tf.constant(float(values.pop(name, 0.0)), tf.float64)
            for name in cls._fields
            if name != "step"
        }
        step = tf.constant(int(values.pop("step", 1)), tf.int64)
        if values:
            raise TypeError(f"Unknown StepStats fields: {sorted(values)}")
        return cls(step=step, **fields)


class BatchPolicy(tf.Module, abc.ABC):
    """Base class of batch-size policies.

    Subclasses implement `initial_batch_size` and `next_batch_size`. They keep any
    state of their own in `tf.Variable`s created in `build` (the engine calls it in
    the strategy scope; the variables are checkpointed with the policy) and never call
    host-side Python per step. After `build`, `batch_unit` is replicas x micro-batch,
    the step in which the batch size can change.

    Example (double the batch every 100 steps of progress, up to 1024):

    >>> class Doubling(BatchPolicy):
    ...     initial_batch_size = 64
    ...     def next_batch_size(self, batch_size, stats):
    ...         grow = tf.math.floormod(stats.step, 100) == 0
    ...         return tf.minimum(tf.where(grow, 2 * batch_size, batch_size), 1024)
    >>> policy = Doubling()
    >>> policy.build(batch_unit=32)
    >>> int(policy.next_batch_size(tf.constant(64, tf.int64), StepStats.make(step=100)))
    128
    """

    batch_unit: int = 1

    def build(self, batch_unit: int) -> None:
        """Called once by the engine, in the strategy scope, before the first step.

        Raises:
          ValueError: if the policy's bounds cannot be realised in multiples of
            `batch_unit`.
        """
        self.batch_unit = batch_unit

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
        super().__init__()
        self._batch_size = integer("batch_size", batch_size)

    @property
    def initial_batch_size(self) -> int:
        return self._batch_size

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        del stats  # A static policy does not look at the statistics.
        return tf.cast(batch_size, tf.int64)


class _BoundedPolicy(BatchPolicy):
    """A policy with `min_batch_size <= batch <= max_batch_size`, checked at build."""

    def __init__(
        self, *, initial_batch_size: int, min_batch_size: int, max_batch_size: int
    ) -> None:
        super().__init__()
        initial_batch_size = integer("initial_batch_size", initial_batch_size)
        min_batch_size = integer("min_batch_size", min_batch_size)
        max_batch_size = integer("max_batch_size", max_batch_size)
        if min_batch_size > max_batch_size:
            raise ValueError(
                "Argument `min_batch_size` must be <= `max_batch_size`. Received: "
                f"min_batch_size={min_batch_size}, max_batch_size={max_batch_size}"
            )
        if not min_batch_size <= initial_batch_size <= max_batch_size:
            raise ValueError(
                "Argument `initial_batch_size` must be within [min_batch_size, "
                f"max_batch_size] = [{min_batch_size}, {max_batch_size}]. Received: "
                f"initial_batch_size={initial_batch_size}"
            )
        self._initial = initial_batch_size
        self.min_batch_size = min_batch_size
        self.max_batch_size = max_batch_size

    @property
    def initial_batch_size(self) -> int:
        return self._initial

    def build(self, batch_unit: int) -> None:
        super().build(batch_unit)
        for name in ("min_batch_size", "max_batch_size"):
            value = getattr(self, name)
            if value % batch_unit:
                raise ValueError(
                    f"Argument `{name}` must be a multiple of replicas x micro_batch_size "
                    f"= {batch_unit} to be reachable. Received: {name}={value}"
                )

    def _clamp(self, batch_size: tf.Tensor) -> tf.Tensor:
        return tf.clip_by_value(
            tf.cast(batch_size, tf.int64), self.min_batch_size, self.max_batch_size
        )


class SimiGradPolicy(_BoundedPolicy):
    """SimiGrad's controller: hold the two groups' gradient similarity at a target.

    Every `interval` optimizer steps, with c the (optionally smoothed) similarity:
    c < target grows the batch by `step` (a fraction), c > target shrinks it by
    `step`; each change is at least one micro-step (replicas x micro-batch) so the
    batch can always move both ways, including back down to `min_batch_size` (the
    reference implementation can only grow while k = 1). A NaN similarity leaves the
    batch and the smoothing state unchanged.

    Args:
      target_similarity: in (0, 1). The paper used 0.2 (CIFAR-10 ResNet-18) and 0.8
        (BERT-Large pre-training).
      initial_batch_size, min_batch_size, max_batch_size: global batch sizes;
        the bounds must be multiples of replicas x micro-batch.
      step: relative change per adjustment, in (0, 1]; 0.1 as in the paper.
      interval: optimizer steps between adjustments (1: every step, as in the paper).
      smoothing: None (off, as in the paper) or the decay in [0, 1) of a debiased
        moving average of the similarity.

    Example:

    >>> policy = SimiGradPolicy(0.5, initial_batch_size=64, min_batch_size=32,
    ...                         max_batch_size=1024)
    >>> policy.build(batch_unit=32)
    >>> int(policy.next_batch_size(64, StepStats.make(similarity=0.1)))  # noisy: grow
    96
    >>> int(policy.next_batch_size(64, StepStats.make(similarity=0.9)))  # clean: shrink
    32

    References:
      Qin, Rajbhandari, Ruwase, Yan, He. SimiGrad: Fine-Grained Adaptive Batching for
      Large Scale Training using Gradient Similarity Measurement. NeurIPS 2021.
    """

    def __init__(
        self,
        target_similarity: float,
        *,
        initial_batch_size: int,
        min_batch_size: int,
        max_batch_size: int,
        step: float = 0.1,
        interval: int = 1,
        smoothing: float | None = None,
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
        )
        real("target_similarity", target_similarity, "in (0, 1)", lambda v: 0.0 < v < 1.0)
        real("step", step, "in (0, 1]", lambda v: 0.0 < v <= 1.0)
        interval = integer("interval", interval)
        if smoothing is not None:
            real("smoothing", smoothing, "None or in [0, 1)", lambda v: 0 <= v < 1)
        self.target_similarity = target_similarity
        self.step = step
        self.interval = interval
        self.smoothing = smoothing
        self._built = False

    def build(self, batch_unit: int) -> None:
        super().build(batch_unit)
        if not self._built:
            with self.name_scope:
                agg = tf.VariableAggregation.ONLY_FIRST_REPLICA
                self.similarity_biased = tf.Variable(
                    tf.constant(0.0, tf.float64),
                    trainable=False,
                    aggregation=agg,
                    name="similarity_biased",
                )
                self.similarity_weight = tf.Variable(
                    tf.constant(0.0, tf.float64),
                    trainable=False,
                    aggregation=agg,
                    name="similarity_weight",
                )
            self._built = True

    def smoothed_similarity(self, similarity: tf.Tensor) -> tf.Tensor:
        """Feeds one measurement (NaN is ignored) and returns the value to act on."""
        if self.smoothing is None:
            return tf.cast(similarity, tf.float64)
        ok = tf.math.is_finite(similarity)
        theta = tf.constant(self.smoothing, tf.float64)
        value = tf.where(ok, tf.cast(similarity, tf.float64), 0.0)
        biased = tf.where(
            ok, theta * self.similarity_biased + (1 - theta) * value, self.similarity_biased
        )
        weight = tf.where(ok, theta * self.similarity_weight + (1 - theta), self.similarity_weight)
        self.similarity_biased.assign(biased)
        self.similarity_weight.assign(weight)
        return tf.where(weight > 0, biased / tf.where(weight > 0, weight, 1.0), float("nan"))

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        c = self.smoothed_similarity(stats.similarity)
        unit = self.batch_unit
        k = tf.cast(batch_size, tf.int64) // unit
        # Round half up (tf.round would round 0.5 to 0), and move at least one unit.
        delta = tf.maximum(tf.cast(tf.floor(self.step * tf.cast(k, tf.float64) + 0.5), tf.int64), 1)
        target = tf.constant(self.target_similarity, tf.float64)
        due = tf.equal(tf.math.floormod(tf.cast(stats.step, tf.int64), self.interval), 0)
        change = tf.where(c < target, delta, tf.where(c > target, -delta, tf.zeros_like(delta)))
        change = tf.where(due & tf.math.is_finite(c), change, tf.zeros_like(change))
        return self._clamp((k + change) * unit)


class NoiseScalePolicy(_BoundedPolicy):
    """Batch = factor x the smoothed simple noise scale tr(Sigma)/|G|^2, clamped.

    McCandlish et al. (2018) find the critical batch near the noise scale. An infinite
    noise scale (|G|^2 = 0) gives `max_batch_size`; an undefined one keeps the batch.

    Example:

    >>> policy = NoiseScalePolicy(factor=2.0, initial_batch_size=64, min_batch_size=32,
    ...                           max_batch_size=512)
    >>> policy.build(batch_unit=32)
    >>> int(policy.next_batch_size(64, StepStats.make(noise_scale=100.0)))  # the engine rounds to 192
    200
    """

    def __init__(
        self,
        factor: float = 1.0,
        *,
        initial_batch_size: int,
        min_batch_size: int,
        max_batch_size: int,
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
        )
        real("factor", factor, "a finite number > 0", lambda v: 0 < v < math.inf)
        self.factor = factor

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        wanted = self.factor * tf.cast(stats.noise_scale, tf.float64)
        wanted = tf.where(tf.math.is_nan(wanted), tf.cast(batch_size, tf.float64), wanted)
        wanted = tf.clip_by_value(wanted, float(self.min_batch_size), float(self.max_batch_size))
        return self._clamp(tf.round(wanted))


class SchedulePolicy(_BoundedPolicy):
    """Batch size as a function of scale-invariant progress tau (graph-safe callable).

    For "increase the batch instead of decaying the learning rate" (Smith et al., 2018).

    Args:
      schedule: `progress (float64 tensor) -> batch size`, tf.function-safe.

    Example:

    >>> policy = SchedulePolicy(lambda tau: tf.where(tau < 100.0, 64, 256),
    ...                         initial_batch_size=64, min_batch_size=64, max_batch_size=256)
    >>> policy.build(batch_unit=32)
    >>> int(policy.next_batch_size(64, StepStats.make(progress=150.0)))
    256
    """

    def __init__(
        self,
        schedule: Callable[[tf.Tensor], tf.Tensor],
        *,
        initial_batch_size: int,
        min_batch_size: int,
        max_batch_size: int,
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
        )
        if not callable(schedule):
            raise TypeError(
                f"Argument `schedule` must be callable. Received: schedule={schedule!r}"
            )
        self.schedule = schedule

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        return self._clamp(self.schedule(tf.cast(stats.progress, tf.float64)))


class GoodputPolicy(_BoundedPolicy):
    """Picks the batch that makes the most scale-invariant progress per second (Pollux).

    For each reachable global batch B in [min_batch_size, max_batch_size] (multiples of
    replicas x micro-batch), the AdaScale gain it would get from the current smoothed
    moments, with S = B / B0, sigma^2 = tr(Sigma) / B0 and mu^2 = |G|^2,

        r(B) = (sigma^2 + mu^2) / (sigma^2 / S + mu^2),

    and the step time T(B) = alpha + beta k (k = B / (replicas x micro-batch)) from a
    `ThroughputModel`, give the progress rate r(B) / T(B) in base-batch steps per
    second. That is Pollux's goodput divided by B0 (its statistical efficiency is r/S),
    see docs/algorithms.md. The policy moves to the best B only if its predicted rate
    beats the current batch's by `hysteresis` (AdaptDL found that chasing every change
    of the argmax thrashes). While the throughput model is not ready (fewer than two
    values of k timed enough) it explores: it stays at a batch until that k has
    `min_timings_per_k` timings, then tries one micro-step more (less, at the top). NaN
    statistics leave the batch alone. Pair it with the AdaScale learning-rate rule,
    whose progress is what it maximises (with the other rules the choice still
    maximises AdaScale's progress rate, which is then only a proxy).

    Args:
      throughput: the `ThroughputModel` the host feeds with step timings (the
        `Trainer` and `attach` do it when the policy is a `GoodputPolicy`); default a
        new `ThroughputModel()`.
      initial_batch_size, min_batch_size, max_batch_size: global batch sizes.
      base_batch_size: B0 of the gain; default `initial_batch_size` (pass the
        engine's `base_batch_size` if it differs).
      hysteresis: relative improvement needed to move, >= 0 (default 5%).

    Example (a step costs 1 s fixed + 0.1 s per micro-step: large batches are cheap):

    >>> from tf_adabatch.throughput import ThroughputModel
    >>> model = ThroughputModel(min_timings_per_k=1)
    >>> model.observe(1, 1.1); model.observe(2, 1.2)
    >>> policy = GoodputPolicy(model, initial_batch_size=32, min_batch_size=32,
    ...                        max_batch_size=256)
    >>> policy.build(batch_unit=32)
    >>> stats = StepStats.make(grad_sqr=1.0, trace_sigma=3200.0)  # noise scale 3200
    >>> int(policy.next_batch_size(32, stats))
    256
    """

    def __init__(
        self,
        throughput: ThroughputModel | None = None,
        *,
        initial_batch_size: int,
        min_batch_size: int,
        max_batch_size: int,
        base_batch_size: int | None = None,
        hysteresis: float = 0.05,
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            min_batch_size=min_batch_size,
            max_batch_size=max_batch_size,
        )
        if throughput is None:
            throughput = ThroughputModel()
        if not isinstance(throughput, ThroughputModel):
            raise TypeError(
                "Argument `throughput` must be a `tf_adabatch.throughput.ThroughputModel`. "
                f"Received: throughput={throughput!r}"
            )
        if base_batch_size is not None:
            base_batch_size = integer("base_batch_size", base_batch_size)
        real("hysteresis", hysteresis, "a finite number >= 0", lambda v: 0 <= v < math.inf)
        self.throughput = throughput
        self.base_batch_size = base_batch_size or initial_batch_size
        self.hysteresis = hysteresis

    def build(self, batch_unit: int) -> None:
        super().build(batch_unit)
        self.throughput.build()

    def progress_rate(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        """Predicted base-batch steps per second at `batch_size` (float64, graph-safe)."""
        b = tf.cast(batch_size, tf.float64)
        gain = adascale_gain(stats.grad_sqr, stats.trace_sigma, b, float(self.base_batch_size))
        seconds = self.throughput.predict_step_time(b / float(self.batch_unit))
        # A fit that predicts no time (too few or too noisy timings) predicts nothing.
        return tf.where(seconds > 0.0, gain / tf.where(seconds > 0.0, seconds, 1.0), float("nan"))

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        unit = self.batch_unit
        current = tf.cast(batch_size, tf.int64)
        candidates = tf.range(self.min_batch_size, self.max_batch_size + 1, unit, dtype=tf.int64)
        rates = self.progress_rate(candidates, stats)
        best = candidates[tf.argmax(rates)]
        move = tf.reduce_max(rates) > (1.0 + self.hysteresis) * self.progress_rate(current, stats)
        decided = tf.where(move, best, current)
        usable = tf.reduce_all(tf.math.is_finite(rates)) & tf.reduce_all(
            tf.math.is_finite(tf.stack([stats.grad_sqr, stats.trace_sigma]))
        )
        decided = tf.where(usable, decided, current)
        # Exploring: stay at a k until it is timed enough, then try one unit more (one
        # less at the top), until two values of k are.
        # (The host times this step after the decision: count it already.)
        timed = self.throughput.timings_at(current // unit) + 1 >= self.throughput.min_timings_per_k
        step = tf.where(current + unit <= self.max_batch_size, tf.constant(unit, tf.int64), -unit)
        explore = tf.where(timed, current + step, current)
        return self._clamp(tf.where(self.throughput.ready > 0, decided, explore))
