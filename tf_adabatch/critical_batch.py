"""Batch-size policies of 2024-2026: grow the batch with the critical batch, never shrink it.

Three rules from recent language-model work, as `BatchPolicy`s (graph-safe decisions the
engine makes after every applied optimizer step). Each grows the global batch, within
[min_batch_size, max_batch_size], and never shrinks it:

- `CriticalBatchWarmupPolicy` (Merrill et al. 2025, OLMo-core's batch-size warm-up):
  double the batch whenever the measured critical batch allows the doubled one.
- `SeesawPolicy` (Meterez et al. 2025): double the batch where a step-decay schedule
  would halve the learning rate.
- `NormTestPolicy` (Byrd et al. 2012; AdAdaGrad, Lau et al. 2024): grow to the batch the
  norm test asks for.

How each pairs with a learning-rate rule is in its docstring; what each measures and
assumes is in docs/algorithms.md.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import tensorflow as tf

from tf_adabatch._checks import integer, is_real, real
from tf_adabatch.policies import StepStats, _BoundedPolicy

__all__ = ["CriticalBatchWarmupPolicy", "NormTestPolicy", "SeesawPolicy"]


def _growth_factor(factor: int) -> int:
    """`factor` if it is an integer >= 2, else one line naming it."""
    factor = integer("factor", factor)
    if factor < 2:
        raise ValueError(f"Argument `factor` must be an integer >= 2. Received: factor={factor}")
    return factor


class CriticalBatchWarmupPolicy(_BoundedPolicy):
    """Batch-size warm-up that follows the critical batch: grow by integer factors only.

    Merrill et al. (2025, "Critical Batch Size Revisited") measure, on OLMo, a critical
    batch that starts near zero, rises fast and plateaus, and warm the batch up after
    it. Here the critical batch is the smoothed gradient noise scale
    B_crit = tr(Sigma) / |G|^2 (McCandlish et al. 2018; `StepStats.noise_scale`, from
    the engine's moving averages). After each step, with B the current batch,

        B <- factor * B   if  B_crit >= margin * factor * B  and  factor * B <= max_batch_size,

    else B stays: the batch only ever changes by the integer `factor` (as OLMo-core's
    callback does), never shrinks, and never passes `max_batch_size`. A noise scale
    that is not finite (no signal yet: |G|^2 = 0, or undefined) keeps the batch.

    Learning rate: pair it with `AdaptiveLearningRate(rule="adascale")`, or, for Adam,
    with `rule="sqrt"`: the rate is then sqrt(B / B0) x base, i.e. multiplied by
    sqrt(factor) at each doubling, as OLMo-core does (it refuses non-Adam optimizers
    for that coupling; the square-root rule is derived for Adam-like updates).

    Args:
      margin: >= 1 is conservative: grow only while the grown batch is at most
        B_crit / margin. Default 1: the grown batch may reach the critical batch.
      factor: the integer growth factor, >= 2 (default 2).
      initial_batch_size, min_batch_size, max_batch_size: global batch sizes.

    Example (B_crit = 300: from 64 the doubled 128 <= 300 grows; from 128, 256 <= 300
    grows; from 256, 512 > 300: it stays):

    >>> policy = CriticalBatchWarmupPolicy(initial_batch_size=64, min_batch_size=64,
    ...                                    max_batch_size=1024)
    >>> policy.build(batch_unit=32)
    >>> stats = StepStats.make(noise_scale=300.0)
    >>> [int(policy.next_batch_size(b, stats)) for b in (64, 128, 256)]
    [128, 256, 256]

    References:
      Merrill, Arora, Groeneveld, Hajishirzi. Critical Batch Size Revisited: A Simple
      Empirical Approach to Large-Batch Language Model Training. 2025.
    """

    def __init__(
        self,
        margin: float = 1.0,
        factor: int = 2,
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
        real("margin", margin, "a finite number > 0", lambda v: 0 < v < math.inf)
        factor = _growth_factor(factor)
        self.margin, self.factor = margin, factor

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        current = tf.cast(batch_size, tf.int64)
        grown = current * self.factor
        critical = tf.cast(stats.noise_scale, tf.float64)
        wanted = critical >= self.margin * tf.cast(grown, tf.float64)
        grow = tf.math.is_finite(critical) & wanted & (grown <= self.max_batch_size)
        return self._clamp(tf.where(grow, grown, current))


class SeesawPolicy(_BoundedPolicy):
    """Seesaw: where a step-decay schedule would halve the learning rate, double the batch.

    Meterez et al. (2025) replace each decay of the learning rate by a factor `factor`
    with a batch growth by `factor` and a learning-rate decay by only sqrt(factor): for
    the same data, about a third less wall-clock time on 150M-600M-parameter language
    models. The batch is a function of progress tau (base-batch steps; under the
    square-root rule tau counts examples / B0):

        B(tau) = initial_batch_size x factor^n(tau),  n(tau) = #decay points < tau,

    capped at the largest such batch <= max_batch_size (from there on the schedule's
    decays are no longer replaced: say so in your schedule). It never shrinks. A point
    belongs to the interval before it, as a boundary of Keras's
    `PiecewiseConstantDecay` does, so the batch grows exactly when that schedule decays.

    Learning rate: give `AdaptiveLearningRate` the step-decay base schedule itself (e.g.
    `keras.optimizers.schedules.PiecewiseConstantDecay` with its boundaries at the same
    decay points and values falling by `factor`) and `rule="sqrt"`: the rule multiplies
    it by sqrt(B / B0) = sqrt(factor)^n, so each decay becomes 1/sqrt(factor), Seesaw's
    coupling, with nothing else to configure.

    Args:
      decay_points: the progress values (increasing, > 0) where the base schedule decays.
      factor: the batch growth at each point (the schedule's decay divisor), an integer
        >= 2 (default 2).
      initial_batch_size: B before the first point (also the minimum).
      max_batch_size: the cap.

    Example (points at tau = 100 and 200, from 64 up to 512):

    >>> policy = SeesawPolicy([100.0, 200.0], initial_batch_size=64, max_batch_size=512)
    >>> policy.build(batch_unit=32)
    >>> [int(policy.next_batch_size(64, StepStats.make(progress=t))) for t in (50.0, 101.0, 250.0)]
    [64, 128, 256]

    References:
      Meterez, Morwani, Tsilivis, Kakade, Pehlevan. Seesaw: Accelerating Training by
      Balancing Learning Rate and Batch Size Scheduling. 2025.
    """

    def __init__(
        self,
        decay_points: Sequence[float],
        factor: int = 2,
        *,
        initial_batch_size: int,
        max_batch_size: int,
    ) -> None:
        super().__init__(
            initial_batch_size=initial_batch_size,
            min_batch_size=initial_batch_size,
            max_batch_size=max_batch_size,
        )
        points = list(decay_points) if isinstance(decay_points, Sequence) else None
        if (
            not points
            or not all(is_real(p) and 0 < p < math.inf for p in points)
            or any(b <= a for a, b in itertools.pairwise(points))
        ):
            raise ValueError(
                "Argument `decay_points` must be a non-empty, increasing sequence of finite "
                f"progress values > 0. Received: decay_points={decay_points!r}"
            )
        factor = _growth_factor(factor)
        self.decay_points, self.factor = [float(p) for p in points], factor
        # The batches reachable by whole factors from the initial one, up to the cap.
        self._batches = [initial_batch_size]
        while self._batches[-1] * factor <= max_batch_size:
            self._batches.append(self._batches[-1] * factor)

    def batch_at(self, progress: tf.Tensor) -> tf.Tensor:
        """B(tau) (int64, graph-safe)."""
        tau = tf.cast(progress, tf.float64)
        passed = tf.reduce_sum(tf.cast(tf.constant(self.decay_points, tf.float64) < tau, tf.int64))
        index = tf.minimum(passed, len(self._batches) - 1)
        return tf.gather(tf.constant(self._batches, tf.int64), index)

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        # Never below the current batch (tau only grows; a restored run keeps its batch).
        return self._clamp(tf.maximum(self.batch_at(stats.progress), tf.cast(batch_size, tf.int64)))


class NormTestPolicy(_BoundedPolicy):
    """The norm test: grow the batch until its gradient's noise is small against its norm.

    Byrd, Chin, Nocedal and Wu (2012) keep the sampled gradient g_B a descent direction
    by asking that its expected squared error be at most theta^2 |g|^2; with per-example
    variance tr(Sigma), E|g_B - g|^2 = tr(Sigma) / B, so

        B >= tr(Sigma) / (theta^2 |g|^2) = noise_scale / theta^2.

    AdAdaGrad (Lau et al. 2024) uses this test to grow the batch of adaptive optimizers
    on language models. After each step the policy grows the batch to the smallest
    multiple of replicas x micro-batch that passes the test, from the smoothed moments
    (`StepStats.grad_sqr`, `trace_sigma`), within the bounds; it never shrinks it. A
    test that cannot be evaluated (|g|^2 = 0, or moments not finite) keeps the batch.

    Learning rate: any rule; with the AdaScale rule the gain rises with the batch as
    the noise allows (the test's theta plays the part of AdaScale's noise scale).

    Args:
      theta: the test's constant, > 0 (default 1: B >= the noise scale; smaller theta
        asks for larger batches).
      initial_batch_size, min_batch_size, max_batch_size: global batch sizes.

    Example (tr(Sigma) = 300, |g|^2 = 1, theta = 1: B >= 300, the next multiple of 32 is
    320; at theta = 2, B >= 75: 96, but the batch never shrinks below 128):

    >>> policy = NormTestPolicy(initial_batch_size=64, min_batch_size=32, max_batch_size=1024)
    >>> policy.build(batch_unit=32)
    >>> stats = StepStats.make(grad_sqr=1.0, trace_sigma=300.0)
    >>> int(policy.next_batch_size(64, stats))
    320
    >>> loose = NormTestPolicy(2.0, initial_batch_size=64, min_batch_size=32, max_batch_size=1024)
    >>> loose.build(batch_unit=32)
    >>> int(loose.next_batch_size(64, stats)), int(loose.next_batch_size(128, stats))
    (96, 128)

    References:
      Byrd, Chin, Nocedal, Wu. Sample size selection in optimization methods for
      machine learning. Mathematical Programming 134, 2012.
      Lau, Liu, Kolar. AdAdaGrad: Adaptive Batch Size Schemes for Adaptive Gradient
      Methods. 2024.
    """

    def __init__(
        self,
        theta: float = 1.0,
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
        real("theta", theta, "a finite number > 0", lambda v: 0 < v < math.inf)
        self.theta = theta

    def next_batch_size(self, batch_size: tf.Tensor, stats: StepStats) -> tf.Tensor:
        current = tf.cast(batch_size, tf.int64)
        sqr = tf.cast(stats.grad_sqr, tf.float64)
        trace = tf.cast(stats.trace_sigma, tf.float64)
        usable = tf.math.is_finite(sqr) & tf.math.is_finite(trace) & (sqr > 0.0)
        needed = trace / (self.theta**2 * tf.where(usable, sqr, 1.0))
        # The smallest multiple of the unit that passes (capped before the cast).
        units = tf.math.ceil(tf.minimum(needed, float(self.max_batch_size)) / self.batch_unit)
        passing = tf.cast(units, tf.int64) * self.batch_unit
        grown = tf.where(usable, tf.maximum(current, passing), current)
        return self._clamp(grown)
