"""One step's statistics and counters, written once the step is known to be applied.

Cross-replica context, inside the engine's step (`AdaptiveEngine`):

    update    moments -> moving averages -> gain and similarity, as values; only the
              gain is written (the learning-rate rule reads it while the optimizer
              applies)
    commit    the statistics written if the step was applied, kept otherwise
    advance   counters, progress tau and the policy's next k (a skipped step moves
              only the skip counters and `samples_seen`)
"""

from __future__ import annotations

from typing import NamedTuple

import tensorflow as tf

from tf_adabatch import stats as S
from tf_adabatch.measure import GroupMeasurement, Reading
from tf_adabatch.policies import BatchPolicy, StepStats
from tf_adabatch.schedules import AdaptiveLearningRate
from tf_adabatch.state import AdaptiveState

__all__ = ["PROGRESS_INCREMENT", "StepBookkeeping"]

# The step's progress increment, popped from its logs by the engine's host side (it
# gives progress_per_second without reading the progress variable before the step).
PROGRESS_INCREMENT = "_progress_increment"
_F64 = tf.float64


class Noise(NamedTuple):
    """The noise statistics one step hands from the statistics to the policy and logs."""

    gain: tf.Tensor
    similarity: tf.Tensor
    grad_sqr: tf.Tensor  # debiased moving average of |G|^2
    trace_sigma: tf.Tensor  # debiased moving average of per-example tr(Sigma)
    noise_scale: tf.Tensor


# The state's statistics one step writes (`AdaptiveState` attribute names).
_STATISTICS = ("grad_sqr_biased", "trace_sigma_biased", "ema_weight", "gain", "similarity")


class StepStatistics(NamedTuple):
    """One step's statistics between the reading and the commit (cross-replica)."""

    finite: tf.Tensor  # the gradients and the loss were finite
    batch: tf.Tensor  # the global batch (float64)
    new: dict[str, tf.Tensor]  # `_STATISTICS` if the step is applied
    old: dict[str, tf.Tensor]  # `_STATISTICS` as they were


class StepBookkeeping:
    """The statistics and counters of one optimizer step (cross-replica context).

    Args:
      state: the engine's `AdaptiveState`.
      measurement: the similarity mode's `GroupMeasurement` (its `interpret` and
        `after_step`).
      policy: the batch policy (`next_batch_size`).
      lr_schedule: the optimizer's `AdaptiveLearningRate`, if any (its progress rule).
      micro_batch_size, base_batch_size, batch_unit: examples per micro-batch, the
        base batch B0, and replicas x micro-batch.
      min_k: the fewest micro-steps the measurement needs.
      min_variance, ema_decay: the engine's options of the same names.

    The engine makes one and calls it inside its step:

    >>> import keras
    >>> from tf_adabatch import AdaptiveEngine
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                         micro_batch_size=4)
    >>> books = engine._books
    >>> isinstance(books, StepBookkeeping), books.batch_unit, books.base_batch_size
    (True, 4, 4)
    """

    def __init__(
        self,
        state: AdaptiveState,
        measurement: GroupMeasurement,
        policy: BatchPolicy,
        lr_schedule: AdaptiveLearningRate | None,
        *,
        micro_batch_size: int,
        base_batch_size: int,
        batch_unit: int,
        min_k: int,
        min_variance: float,
        ema_decay: float | None,
    ) -> None:
        self.state, self.measurement = state, measurement
        self.policy, self.lr_schedule = policy, lr_schedule
        self.micro_batch_size, self.base_batch_size = micro_batch_size, base_batch_size
        self.batch_unit, self._min_k = batch_unit, min_k
        self.min_variance, self.ema_decay = min_variance, ema_decay

    def update(self, reading: Reading) -> StepStatistics:
        """Moments, moving averages, gain and similarity of this step, as values.

        Only the gain is written here: the learning-rate rule reads it while the
        optimizer applies. The rest is written by `commit` once the step is
        known to be applied, so a skipped step has nothing of the state to roll back.
        """
        state = self.state
        batch = reading.num_micro * float(self.micro_batch_size)
        b0 = tf.constant(float(self.base_batch_size), _F64)
        finite = tf.reduce_all(
            tf.math.is_finite(tf.stack([reading.mean_sq, reading.grad_mean_sq, reading.loss]))
        )
        step = self.measurement.interpret(reading, batch, finite)
        moments = S.clip_moments(step.moments, b0, self.min_variance)
        n = reading.num_micro
        decay = S.default_decay(n) if self.ema_decay is None else tf.constant(self.ema_decay, _F64)
        update = step.valid  # (a skipped step commits none of this: `commit`)
        old = {name: getattr(state, name).read_value() for name in _STATISTICS}
        grad_sqr_b, weight = S.ema_update(
            old["grad_sqr_biased"], old["ema_weight"], moments.grad_sqr, decay
        )
        trace_b, _ = S.ema_update(
            old["trace_sigma_biased"], old["ema_weight"], moments.trace_sigma, decay
        )
        grad_sqr_b = tf.where(update, grad_sqr_b, old["grad_sqr_biased"])
        trace_b = tf.where(update, trace_b, old["trace_sigma_biased"])
        weight = tf.where(update, weight, old["ema_weight"])
        grad_sqr, trace = S.debias(grad_sqr_b, weight), S.debias(trace_b, weight)
        gain = tf.where(weight > 0.0, S.adascale_gain(grad_sqr, trace, batch, b0), 1.0)
        gain = tf.where(finite, gain, old["gain"])
        state.gain.assign(gain, read_value=False)
        new = {
            "grad_sqr_biased": grad_sqr_b,
            "trace_sigma_biased": trace_b,
            "ema_weight": weight,
            "gain": gain,
            "similarity": tf.where(finite, step.similarity, old["similarity"]),
        }
        return StepStatistics(finite, batch, new, old)

    def commit(self, stats: StepStatistics, applied: tf.Tensor) -> Noise:
        """Writes the step's statistics if it was applied (else keeps the old ones, the
        gain included); returns them as the policy and the logs see them."""
        kept = {}
        for name in _STATISTICS:
            kept[name] = tf.where(applied, stats.new[name], stats.old[name])
            getattr(self.state, name).assign(kept[name], read_value=False)
        self.measurement.after_step(applied, stats.batch)
        grad_sqr = S.debias(kept["grad_sqr_biased"], kept["ema_weight"])
        trace = S.debias(kept["trace_sigma_biased"], kept["ema_weight"])
        return Noise(
            gain=kept["gain"],
            similarity=kept["similarity"],
            grad_sqr=grad_sqr,
            trace_sigma=trace,
            noise_scale=S.noise_scale(grad_sqr, trace),
        )

    def advance(
        self, finite: tf.Tensor, num_micro: tf.Tensor, noise: Noise
    ) -> dict[str, tf.Tensor]:
        """Counters, progress tau and the policy's next batch size."""
        state = self.state
        applied = tf.cast(finite, tf.int64)
        # From the all-reduced micro-gradient count, not from k: every state write must
        # depend on the micro-steps, so that a step cut short by the end of the data
        # (an error inside the loop) leaves the state untouched.
        batch = tf.cast(tf.round(num_micro), tf.int64) * self.micro_batch_size
        if self.lr_schedule is None:
            increment = noise.gain
        else:
            scale = tf.cast(batch, _F64) / float(self.base_batch_size)
            increment = self.lr_schedule.progress_increment(noise.gain, scale)
        increment = tf.where(finite, tf.cast(increment, _F64), 0.0)
        progress = state.progress.read_value() + increment
        steps = state.steps.read_value() + applied
        skipped = state.skipped_steps.read_value() + (1 - applied)
        consecutive = tf.where(finite, tf.zeros_like(applied), state.consecutive_skips + 1)
        samples = state.samples_seen.read_value() + batch
        for variable, value in (
            (state.progress, progress),
            (state.steps, steps),
            (state.skipped_steps, skipped),
            (state.consecutive_skips, consecutive),
            (state.samples_seen, samples),
        ):
            variable.assign(value, read_value=False)
        stats = StepStats(
            similarity=noise.similarity,
            grad_sqr=noise.grad_sqr,
            trace_sigma=noise.trace_sigma,
            noise_scale=noise.noise_scale,
            gain=noise.gain,
            progress=progress,
            step=steps,
        )
        unit = self.batch_unit
        # Skipped steps leave the policy (and its state) alone.
        proposed = tf.cond(
            finite,
            lambda: tf.cast(self.policy.next_batch_size(batch, stats), tf.float64),
            lambda: tf.cast(batch, tf.float64),
        )
        new_k = tf.maximum(tf.cast(tf.round(proposed / unit), tf.int64), self._min_k)
        state.accumulation_steps.assign(
            tf.where(finite, new_k, state.accumulation_steps), read_value=False
        )
        return {
            PROGRESS_INCREMENT: increment,
            "progress": progress,
            "samples_seen": tf.cast(samples, _F64),
            "skipped_steps": tf.cast(skipped, _F64),
            "applied": tf.cast(finite, _F64),
            "step": tf.cast(steps + skipped, _F64),
            "consecutive_skips": tf.cast(consecutive, _F64),
        }
