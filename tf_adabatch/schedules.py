"""Learning-rate rules for a changing batch: AdaScale, square-root, linear, none.

`AdaptiveLearningRate` is a Keras `LearningRateSchedule` that wraps the user's own
schedule (or a constant), tuned for the base batch B0 and written in base-batch steps:

    adascale  lr = r^p * base(floor(tau)),  tau += r      (p = 1; 0.5 for Adam-like)
    sqrt      lr = sqrt(S) * base(floor(tau)), tau += S   (SimiGrad's reference rule)
    linear    lr = S * base(floor(tau)),    tau += S      (optional linear warm-up)
    none      lr = base(floor(tau)),        tau += S

with S = B / B0 the current scale and r the AdaScale gain. Pass it to the optimizer;
the engine binds it to its adaptive state (gain, tau, batch), which is checkpointed
with the rest of that state. Until it is bound (or after a `from_config` without an
engine), it behaves as the base schedule read at the optimizer's step.

Keras's learning-rate callbacks (`ReduceLROnPlateau`, `LearningRateScheduler`) set a
float learning rate, which a schedule refuses. Bound to an engine, the schedule keeps a
multiplier of the base rate for them (`LearningRateScale`, checkpointed with the
adaptive state): `base_rate` reads and `set_base_rate` sets the base rate in effect,
base(floor(tau)) times that multiplier, while the rule's factor still applies on top
(`tf_adabatch.callbacks` makes Keras's own callbacks act on it under `attach`).
"""

from __future__ import annotations

import math
from typing import Any

import keras
import tensorflow as tf
from keras.optimizers.schedules import LearningRateSchedule

from tf_adabatch._checks import integer, is_real
from tf_adabatch.state import AdaptiveState

__all__ = [
    "LR_RULES",
    "AdaptiveLearningRate",
    "LearningRateScale",
    "bind_adaptive_schedules",
]

LR_RULES = ("adascale", "sqrt", "linear", "none")


class LearningRateScale(tf.Module):
    """The multiplier of the base learning rate that Keras's learning-rate callbacks set.

    1 until a callback (or `AdaptiveLearningRate.set_base_rate`) changes it; the engine
    creates it in the strategy's scope and checkpoints it with the adaptive state (part
    "lr"; a checkpoint written before it existed restores without it, at 1).

    >>> float(LearningRateScale().scale)
    1.0
    """

    def __init__(self, name: str = "adabatch_lr") -> None:
        super().__init__(name=name)
        with self.name_scope:
            self.scale = tf.Variable(
                tf.constant(1.0, tf.float64),
                name="scale",
                trainable=False,
                aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
            )


@keras.saving.register_keras_serializable(package="tf_adabatch")
class AdaptiveLearningRate(LearningRateSchedule):
    """The user's learning-rate schedule, run on scale-invariant progress.

    Args:
      base: a float or any Keras `LearningRateSchedule`, tuned for the base batch and
        indexed in base-batch steps.
      rule: one of "adascale" (default), "sqrt", "linear", "none".
      gain_power: p in lr = r^p * base under "adascale"; 0.5 is AdaptDL's rule for
        Adam-like optimizers (the AdaScale paper validated SGD with p = 1).
      warmup_steps: under "linear", ramp the factor from 1 to S over this many base
        steps of progress (Goyal et al., 2017); 0 disables it.

    Example:

    >>> lr = AdaptiveLearningRate(keras.optimizers.schedules.CosineDecay(0.1, 1000))
    >>> optimizer = keras.optimizers.SGD(lr, momentum=0.9)
    >>> round(float(lr(0)), 6)  # not bound to an engine yet: the base schedule
    0.1
    >>> AdaptiveLearningRate.from_config(lr.get_config()).rule
    'adascale'
    """

    def __init__(
        self,
        base: float | LearningRateSchedule,
        rule: str = "adascale",
        *,
        gain_power: float = 1.0,
        warmup_steps: int = 0,
    ) -> None:
        super().__init__()
        if rule not in LR_RULES:
            raise ValueError(f"Argument `rule` must be one of {LR_RULES}. Received: rule={rule!r}")
        if not isinstance(base, LearningRateSchedule):
            if not is_real(base) or not 0 < float(base) < math.inf:
                raise ValueError(
                    "Argument `base` must be a positive, finite float or a Keras "
                    f"LearningRateSchedule. Received: base={base!r}"
                )
            base = float(base)
        if not is_real(gain_power) or not 0.0 < float(gain_power) <= 1.0:
            raise ValueError(
                f"Argument `gain_power` must be in (0, 1]. Received: gain_power={gain_power!r}"
            )
        warmup_steps = integer("warmup_steps", warmup_steps, minimum=0)
        if warmup_steps and rule != "linear":
            raise ValueError(
                "Argument `warmup_steps` applies to rule='linear' only (AdaScale's "
                f"warm-up emerges by itself). Received: warmup_steps={warmup_steps}, rule={rule!r}"
            )
        self.base = base
        self.rule = rule
        self.gain_power = gain_power
        self.warmup_steps = warmup_steps
        self._state: AdaptiveState | None = None
        self._scale: LearningRateScale | None = None
        self._batch_unit = 1
        self._base_batch_size = 1

    @property
    def base_steps(self) -> int | None:
        """The base schedule's length in base-batch steps, where Keras states it.

        `CosineDecay` (warm-up included) and `PolynomialDecay`; None otherwise (a
        constant, or a schedule without an end). The natural progress budget.

        >>> AdaptiveLearningRate(keras.optimizers.schedules.CosineDecay(0.1, 1000)).base_steps
        1000
        """
        schedules = keras.optimizers.schedules
        if isinstance(self.base, schedules.CosineDecay):
            return int(self.base.decay_steps + (self.base.warmup_steps or 0))
        if isinstance(self.base, schedules.PolynomialDecay) and not self.base.cycle:
            return int(self.base.decay_steps)
        return None

    def bind(
        self,
        state: AdaptiveState,
        *,
        batch_unit: int,
        base_batch_size: int,
        scale: LearningRateScale | None = None,
    ) -> None:
        """Reads gain, progress and batch from `state` from now on (called by the engine),
        and multiplies the base rate by `scale` (the callbacks' multiplier) if given."""
        self._state = state
        self._scale = scale
        self._batch_unit = batch_unit
        self._base_batch_size = base_batch_size

    @property
    def scale(self) -> LearningRateScale | None:
        """The base rate's multiplier (None until an engine binds the schedule)."""
        return self._scale

    def base_rate(self) -> float:
        """The base learning rate in effect (host code): base(floor(tau)) x the multiplier.

        What Keras's learning-rate callbacks read and set under `attach`: the rate for
        the base batch, before the rule's factor (the AdaScale gain) multiplies it.
        Unbound, the base schedule at step 0.

        >>> AdaptiveLearningRate(0.1).base_rate()
        0.1
        """
        progress = 0.0 if self._state is None else float(self._state.progress.numpy())
        base = float(self.base_learning_rate(tf.floor(tf.constant(progress, tf.float64))))
        scale = 1.0 if self._scale is None else float(self._scale.scale.numpy())
        return base * scale

    def set_base_rate(self, value: float) -> None:
        """Sets the base learning rate in effect to `value` (host code; bound schedules only).

        The multiplier becomes `value / base(floor(tau))`: with a constant base the base
        rate is `value` from now on; with a base schedule, the whole schedule is scaled
        by that ratio (it goes on decaying from the new level). The rule's factor still
        multiplies it at every step.

        Raises:
          ValueError: `value` is not a positive, finite number, or the schedule is not
            bound to an engine (`attach` or `Trainer` binds it).
        """
        if not is_real(value) or not 0 < float(value) < math.inf:
            raise ValueError(
                "The base learning rate must be a positive, finite number. "
                f"Received: learning_rate={value!r}"
            )
        if self._scale is None or self._state is None:
            raise ValueError(
                "This AdaptiveLearningRate is not bound to an engine yet: pass its optimizer "
                "to `tf_adabatch.attach` (after `compile`) or `tf_adabatch.Trainer` first. "
                f"Received: set_base_rate({value!r}) on an unbound schedule"
            )
        progress = tf.floor(self._state.progress.read_value())
        base = float(self.base_learning_rate(progress))
        if not base > 0:
            raise ValueError(
                "Cannot set the base learning rate where the base schedule is 0 "
                f"(at progress {float(progress)}). Received: learning_rate={value!r}"
            )
        self._scale.scale.assign(float(value) / base)

    def base_learning_rate(self, step: tf.Tensor) -> tf.Tensor:
        """The base schedule at base-batch step `step` (float32)."""
        if isinstance(self.base, LearningRateSchedule):
            return tf.cast(self.base(step), tf.float32)
        return tf.constant(self.base, tf.float32)

    def factor(self, gain: tf.Tensor, scale: tf.Tensor, progress: tf.Tensor) -> tf.Tensor:
        """The rule's multiplier of the base learning rate (float64).

        >>> rule = AdaptiveLearningRate(0.1, "linear", warmup_steps=100)
        >>> float(rule.factor(1.0, 8.0, 50.0))  # half-way through warm-up: 1 + 7/2
        4.5
        """
        gain = tf.cast(gain, tf.float64)
        scale = tf.cast(scale, tf.float64)
        if self.rule == "adascale":
            return gain if self.gain_power == 1.0 else tf.pow(gain, self.gain_power)
        if self.rule == "sqrt":
            return tf.sqrt(scale)
        if self.rule == "linear":
            if not self.warmup_steps:
                return scale
            ramp = tf.minimum(tf.cast(progress, tf.float64) / self.warmup_steps, 1.0)
            return 1.0 + (scale - 1.0) * ramp
        return tf.ones_like(scale)

    def progress_increment(self, gain: tf.Tensor, scale: tf.Tensor) -> tf.Tensor:
        """How far one optimizer step advances tau: r under AdaScale, S otherwise."""
        return tf.cast(gain if self.rule == "adascale" else scale, tf.float64)

    def __call__(self, step: Any) -> tf.Tensor:
        state = self._state
        if state is None:
            return self.base_learning_rate(step)
        progress = state.progress.read_value()
        batch = tf.cast(state.accumulation_steps, tf.float64) * self._batch_unit
        scale = batch / self._base_batch_size
        factor = self.factor(state.gain.read_value(), scale, progress)
        base = tf.cast(self.base_learning_rate(tf.floor(progress)), tf.float64)
        if self._scale is not None:
            base = base * self._scale.scale.read_value()
        return tf.cast(base * factor, tf.float32)

    def get_config(self) -> dict[str, Any]:
        base = self.base
        return {
            "base": keras.saving.serialize_keras_object(base)
            if isinstance(base, LearningRateSchedule)
            else base,
            "rule": self.rule,
            "gain_power": self.gain_power,
            "warmup_steps": self.warmup_steps,
        }

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> AdaptiveLearningRate:
        config = dict(config)
        if isinstance(config["base"], dict):
            config["base"] = keras.saving.deserialize_keras_object(config["base"])
        return cls(**config)


def bind_adaptive_schedules(
    schedules: list[Any],
    state: AdaptiveState,
    strategy: tf.distribute.Strategy,
    *,
    batch_unit: int,
    base_batch_size: int,
) -> tuple[AdaptiveLearningRate | None, LearningRateScale | None]:
    """Binds every `AdaptiveLearningRate` among an optimizer chain's `schedules` to the
    engine's state, with one `LearningRateScale` (made in `strategy`'s scope) for all.

    Returns:
      The last adaptive schedule and the scale, or (None, None) if there is none.

    >>> state = AdaptiveState(accumulation_steps=1, batch_unit=8)
    >>> schedule = AdaptiveLearningRate(0.1)
    >>> bound, scale = bind_adaptive_schedules(
    ...     [schedule], state, tf.distribute.get_strategy(), batch_unit=8, base_batch_size=8)
    >>> bound is schedule, float(scale.scale.numpy())
    (True, 1.0)
    >>> bind_adaptive_schedules([0.1], state, tf.distribute.get_strategy(),
    ...                         batch_unit=8, base_batch_size=8)
    (None, None)
    """
    adaptive: AdaptiveLearningRate | None = None
    scale: LearningRateScale | None = None
    for schedule in schedules:
        if isinstance(schedule, AdaptiveLearningRate):
            if scale is None:
                with strategy.scope():
                    scale = LearningRateScale()
            schedule.bind(
                state, batch_unit=batch_unit, base_batch_size=base_batch_size, scale=scale
            )
            adaptive = schedule
    return adaptive, scale
