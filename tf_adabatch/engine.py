"""The distributed adaptive step: micro-steps, one all-reduce, statistics, policy, apply.

Data flow of one optimizer step (one call of `AdaptiveEngine.train_step`):

    k x micro-step (replica context)   forward + backward on m examples; add the
                                        gradient to a per-replica accumulator and its
                                        squared norm to a float64 scalar
    reduce (replica context)           ONE all-reduce, one collective: the gradient
                                        (in exact mode the two groups' sum and
                                        difference, [A+B, A-B]) and the float64
                                        scalars as float32 limbs; gbar = sum / n. The
                                        last micro-step runs in the same replica
                                        function: its gradient joins the accumulators'
                                        sum without being stored (with k = 1 the
                                        accumulators are not touched at all; not in
                                        exact mode with an odd N: two accumulators)
    statistics (cross-replica context) moments, moving averages, gain, similarity (as
                                        values; only the gain is written before
                                        the apply: the learning-rate rule reads it)
    apply (cross-replica tf.cond)      the Keras optimizer applies gbar, with its own
                                        all-reduce bypassed; skipped if not finite
    roll-back (cross-replica tf.cond)  a skipped step (non-finite gradients, or an
                                        update that left a weight or slot non-finite)
                                        restores what the step wrote, from copies
                                        taken at its start (BatchNormalization
                                        statistics included); then the statistics
                                        are written, or kept as they were
    policy (cross-replica context)     the next batch size, as accumulation steps k

k is read from a variable, so changing it never retraces. The engine is written once
and serves the custom loop (`tf_adabatch.Trainer`) and, later, `model.fit`.
"""

from __future__ import annotations

import numbers
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import keras
import numpy as np
import tensorflow as tf

# typing_extensions comes with TensorFlow; `Unpack` / `Required` for Python 3.10.
from typing_extensions import Unpack

from tf_adabatch import _keras_seams as seams
from tf_adabatch import stats as S
from tf_adabatch._checks import integer
from tf_adabatch.clock import Clock, WallClock
from tf_adabatch.measure import (
    SCOPES,
    GroupMeasurement,
    Reading,
    make_measurement,
    micro_scalars,
    min_accumulation_steps,
)
from tf_adabatch.options import EngineOptions, check_objects, resolve_options
from tf_adabatch.policies import GoodputPolicy, StaticPolicy, StepStats
from tf_adabatch.rollback import StepRollback
from tf_adabatch.schedules import AdaptiveLearningRate, LearningRateScale
from tf_adabatch.state import AdaptiveState

__all__ = [
    "SIMILARITY_MODES",
    "AdaptiveEngine",
    "EngineOptions",
    "NonFiniteGradientsError",
    "resolve_options",
]

SIMILARITY_MODES = ("exact", "estimated")
# The step function's progress increment, popped from its logs by `train_step` (it
# gives progress_per_second without reading the progress variable before the step).
_PROGRESS_INCREMENT = "_progress_increment"
# Whether the step's update was not finite (finite gradients): `train_step` then restores
# the weights and the optimizer's variables from the roll-back's copy.
_RESTORE = "_restore_weights"
_F64 = tf.float64


class NonFiniteGradientsError(RuntimeError):
    """Too many optimizer steps in a row had non-finite gradients.

    >>> issubclass(NonFiniteGradientsError, RuntimeError)
    True
    """


def per_example_loss_fn(loss: Any) -> Callable[[tf.Tensor, tf.Tensor], tf.Tensor]:
    """Returns a function computing unreduced, unscaled per-example losses.

    A Keras `Loss` object's `__call__` reduces and divides by the replica count under a
    strategy; its public `call` does neither. A string is resolved with
    `keras.losses.get`; any other callable must return per-example losses.
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


def _local(strategy: tf.distribute.Strategy, value: Any) -> Any:
    """First local replica's value: identical on all replicas by construction."""
    return strategy.experimental_local_results(value)[0]


class _Noise(NamedTuple):
    """The noise statistics one step hands from the statistics to the policy and logs."""

    gain: tf.Tensor
    similarity: tf.Tensor
    grad_sqr: tf.Tensor  # debiased moving average of |G|^2
    trace_sigma: tf.Tensor  # debiased moving average of per-example tr(Sigma)
    noise_scale: tf.Tensor


# The state's statistics one step writes (`AdaptiveState` attribute names).
_STATISTICS = ("grad_sqr_biased", "trace_sigma_biased", "ema_weight", "gain", "similarity")


class _StepStatistics(NamedTuple):
    """One step's statistics between the reading and the commit (cross-replica)."""

    finite: tf.Tensor  # the gradients and the loss were finite
    batch: tf.Tensor  # the global batch (float64)
    new: dict[str, tf.Tensor]  # `_STATISTICS` if the step is applied
    old: dict[str, tf.Tensor]  # `_STATISTICS` as they were


class AdaptiveEngine:
    """The distributed adaptive training step, shared by every front door.

    Args:
      model: a built Keras model (its variables exist).
      loss: a Keras `Loss`, a loss name, or `(y_true, y_pred) -> per-example losses`.
      optimizer: any Keras optimizer. The engine owns it: it bypasses the optimizer's
        internal all-reduce while the engine applies gradients (other use of the
        optimizer is unaffected). `clipnorm`/`global_clipnorm` act on the global
        gradient. A `keras.optimizers.LossScaleOptimizer` (`mixed_float16`) works:
        the statistics see unscaled gradients, and the steps it skips on overflow are
        skipped steps here (they change no statistic, average or batch size).
      strategy: defaults to the current `tf.distribute` strategy.
      **options: the engine's options, `EngineOptions` (`micro_batch_size` required;
        `base_batch_size`, `policy`, `similarity`, `ema_decay`, `min_variance`,
        `jit_compile`, `max_consecutive_skips`).

    Skipped steps: a step is skipped when its gradients or loss are not finite, or
    when its update leaves any weight, optimizer slot or model variable non-finite.
    A skipped step changes no weight, slot, model variable (BatchNormalization's
    moving statistics, seed generators), statistic, average, progress or batch size:
    what it wrote is restored from copies taken at the start of every step (one copy
    of the model's non-trainable variables per device, one of the weights and the
    optimizer's variables), and the statistics are written only once the step is
    known to be applied. Only the skip counters and `samples_seen` move.

    Groups: micro-gradient i of replica r belongs to group A if (i*N + r) is even. With
    an even number of replicas N this is "even replicas vs odd replicas" (SimiGrad's
    replica groups); with one replica it is even vs odd micro-steps (needs k >= 2);
    with an odd N > 1 the groups differ by at most one micro-gradient, and since the
    cosine does not depend on the groups' weights, each group's mean is exact.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                         micro_batch_size=4, policy=StaticPolicy(8))
    >>> engine.accumulation_steps, engine.batch_size
    (2, 8)
    """

    def __init__(
        self,
        model: keras.Model,
        *,
        loss: Any,
        optimizer: keras.optimizers.Optimizer,
        strategy: tf.distribute.Strategy | None = None,
        **options: Unpack[EngineOptions],
    ) -> None:
        opts = resolve_options(options)
        micro_batch_size = opts["micro_batch_size"]
        base_batch_size, policy = opts["base_batch_size"], opts["policy"]
        similarity, ema_decay = opts["similarity"], opts["ema_decay"]
        min_variance, jit_compile = opts["min_variance"], opts["jit_compile"]
        max_consecutive_skips = opts["max_consecutive_skips"]
        self.clock: Clock = opts["clock"] or WallClock()
        check_objects(model, optimizer, strategy)
        self.strategy = strategy or tf.distribute.get_strategy()
        unsupported = tuple(
            getattr(tf.distribute.experimental, name)
            for name in ("ParameterServerStrategy", "CentralStorageStrategy")
            if hasattr(tf.distribute.experimental, name)
        )
        if isinstance(self.strategy, unsupported):
            raise ValueError(
                "Argument `strategy` must be a synchronous data-parallel strategy whose "
                "replicas all-reduce (MirroredStrategy, MultiWorkerMirroredStrategy, "
                "TPUStrategy, OneDeviceStrategy or the default strategy): the replica "
                "groups' statistics need it. Received: "
                f"strategy={type(self.strategy).__name__}"
            )
        if max_consecutive_skips is not None:
            max_consecutive_skips = integer("max_consecutive_skips", max_consecutive_skips)
        self.max_consecutive_skips = max_consecutive_skips
        self.model = model
        self.optimizer = optimizer
        self.num_replicas = int(self.strategy.num_replicas_in_sync)
        self.micro_batch_size = micro_batch_size = integer("micro_batch_size", micro_batch_size)
        if similarity == "auto":
            similarity = "exact" if self.num_replicas >= 2 else "estimated"
        if similarity not in SIMILARITY_MODES:
            raise ValueError(
                f"Argument `similarity` must be one of {('auto', *SIMILARITY_MODES)}. "
                f"Received: similarity={similarity!r}"
            )
        self.similarity_mode = similarity
        self.ema_decay = ema_decay  # checked by `resolve_options`, as min_variance
        self.min_variance = min_variance
        if getattr(optimizer, "loss_scale_factor", None):
            raise ValueError(
                "A static `loss_scale_factor` on the optimizer is not supported by "
                "tf_adabatch; wrap the optimizer in `keras.optimizers.LossScaleOptimizer` "
                "(dynamic loss scaling, what `mixed_float16` uses) instead. Received: "
                f"loss_scale_factor={optimizer.loss_scale_factor!r}"
            )
        # Dynamic loss scaling (`mixed_float16`): each micro-step differentiates the
        # scaled loss and unscales its gradients at once, so the accumulators and every
        # statistic see true gradients; the optimizer gets the scaled mean gradient and
        # does its own bookkeeping (skips and halves its scale on overflow, grows it).
        self._loss_scaled = isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
        if getattr(optimizer, "gradient_accumulation_steps", None):
            raise ValueError(
                "The optimizer has `gradient_accumulation_steps="
                f"{optimizer.gradient_accumulation_steps}`; tf_adabatch accumulates "
                "gradients itself. Create the optimizer without it."
            )
        if not model.built or not model.trainable_variables:
            raise ValueError(
                "Argument `model` must be built and have trainable variables (the engine "
                "allocates its accumulators from them): create it with a `keras.Input`, or "
                "build a subclassed model by calling it once on a batch, e.g. "
                "`model(x[:1])`, or with `model.build(input_shape)`, in the strategy's "
                f"scope, before `attach` / `Trainer`. Received: model={model.name!r} "
                f"(built={model.built}, {len(model.trainable_variables)} trainable variables)"
            )
        self.policy = policy or StaticPolicy(self.num_replicas * micro_batch_size)
        with self.strategy.scope():
            self.policy.build(self.num_replicas * micro_batch_size)
        self._min_k = min_accumulation_steps(similarity, self.num_replicas)
        k0 = self._batch_to_k_checked("policy.initial_batch_size", self.policy.initial_batch_size)
        if base_batch_size is not None:
            base_batch_size = integer("base_batch_size", base_batch_size)
        self.base_batch_size = int(
            self.policy.initial_batch_size if base_batch_size is None else base_batch_size
        )

        self._loss_fn = per_example_loss_fn(loss)
        self._variables = list(model.trainable_variables)
        with self.strategy.scope():
            self.state = AdaptiveState(
                accumulation_steps=k0, batch_unit=self.num_replicas * micro_batch_size
            )
            if not optimizer.built:
                optimizer.build(self._variables)
            # The gradient groups' measurement of the similarity mode: its buffers,
            # accumulate / reduce / interpret (tf_adabatch.measure).
            self.measurement: GroupMeasurement = make_measurement(
                similarity,
                self._variables,
                num_replicas=self.num_replicas,
                micro_batch_size=micro_batch_size,
                state=self.state,
            )
        # With N >= 2 replicas the reading's gradient-sized terms are computed once, on
        # the first replica's all-reduced tensors, not by every replica (on a TPU the
        # cross-replica code runs on the host: there each replica keeps computing them).
        tpu = tuple(
            module.TPUStrategy
            for module in (tf.distribute, tf.distribute.experimental)
            if hasattr(module, "TPUStrategy")
        )
        self.measurement.norms_after_reduce = self.num_replicas >= 2 and not isinstance(
            self.strategy, tpu
        )
        self._bypass = seams.AllReduceBypass(optimizer)
        # An `AdaptiveLearningRate` on the optimizer reads gain, tau and batch from the
        # state.
        self.lr_schedule: AdaptiveLearningRate | None = None
        self.lr_scale: LearningRateScale | None = None  # Keras's LR callbacks' multiplier
        for opt in seams.optimizer_chain(optimizer):
            schedule = seams.learning_rate_schedule(opt)
            if isinstance(schedule, AdaptiveLearningRate):
                if self.lr_scale is None:
                    with self.strategy.scope():
                        self.lr_scale = LearningRateScale()
                schedule.bind(
                    self.state,
                    batch_unit=self.num_replicas * micro_batch_size,
                    base_batch_size=self.base_batch_size,
                    scale=self.lr_scale,
                )
                self.lr_schedule = schedule
        self.trace_count = 0
        # A skipped step changes nothing: the forward passes may have written the
        # model's non-trainable variables (BatchNormalization statistics, seed
        # generators) and the apply may have produced non-finite weights or slots
        # (e.g. an infinite learning rate). Both are restored from copies taken at the
        # start of the step. The model's copies are restored on every skip; the
        # optimizer's only when the *update* was not finite (on a non-finite gradient, a
        # loss-scale optimizer lowers its scale, which must stick). The adaptive state
        # needs no copy: a step writes its statistics after the check
        # (`_commit_statistics`), all but the gain, which it rewrites then.
        trainable = {id(seams.tf_variable(v)) for v in model.trainable_variables}
        optimizer_variables = [v for opt in seams.optimizer_chain(optimizer) for v in opt.variables]
        self._rollback = StepRollback(
            self.strategy,
            local=[
                *(v for v in model.variables if id(seams.tf_variable(v)) not in trainable),
                *self.measurement.carried_buffers,
            ],
            mirrored=[*model.trainable_variables, *optimizer_variables],
            name="adabatch_backup",
        )
        # Called in replica context after each micro-step's forward pass with
        # (x, y, y_pred, sample_weight); `attach` updates Keras's compiled metrics there.
        self.micro_step_hook: Callable[[Any, Any, Any, Any], None] | None = None

        wrap = (lambda f: tf.function(f, jit_compile=True)) if jit_compile else (lambda f: f)
        self._micro_fn = wrap(self._micro_step)
        single = self.num_replicas == 1
        reduce = self.measurement.reduce
        self._reduce_fn = wrap(reduce) if single else reduce
        # The last micro-step is fused with the reduce (which XLA compiles only on a
        # single replica: it holds the all-reduces); its forward and backward pass is
        # compiled on its own.
        self._gradients_fn = wrap(self._micro_gradients)
        self._last_fn = wrap(self._last_micro_step) if single else self._last_micro_step
        self._apply_fn = wrap(self._apply_step) if single else self._apply_step
        self._step_fn = tf.function(self._train_step)
        self._restore_fn = tf.function(self._rollback.restore_mirrored)

    # ------------------------------------------------------------------ public API

    @property
    def accumulation_steps(self) -> int:
        """k, micro-steps per optimizer step."""
        return int(self.state.accumulation_steps.numpy())

    @property
    def batch_size(self) -> int:
        """The current global batch size B = k x replicas x micro-batch."""
        return self.accumulation_steps * self.num_replicas * self.micro_batch_size

    @property
    def carried_buffers(self) -> list[tf.Variable]:
        """Per-step buffers the next step reads, to checkpoint with the state.

        The previous step's gradient of the differenced estimator (one replica,
        estimated similarity); empty in every other mode (the accumulators are
        overwritten by each step's first micro-step and never need saving).
        """
        return self.measurement.carried_buffers

    def adaptive_state(self) -> dict[str, Any]:
        """Every piece of adaptive state, by part: the one list that checkpoints
        (`Trainer.checkpoint`, the launcher's) and Keras saves under `attach` store.

        - "state": the `AdaptiveState` (k, batch unit, counters, progress tau, gain,
          similarity, the moving averages);
        - "policy": the batch policy (its own variables; a `GoodputPolicy`'s
          throughput model's timings);
        - "carried": the measurement's carried buffers, only where it has some (one
          replica, estimated similarity);
        - "lr": the base learning rate's multiplier (`LearningRateScale`, which
          Keras's learning-rate callbacks set), only with an `AdaptiveLearningRate`.

        The learning-rate rule has no other state of its own: it reads this state.

        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                         micro_batch_size=4)
        >>> sorted(engine.adaptive_state())  # one replica, estimated similarity
        ['carried', 'policy', 'state']
        """
        parts: dict[str, Any] = {"state": self.state, "policy": self.policy}
        if self.carried_buffers:
            parts["carried"] = self.carried_buffers
        if self.lr_scale is not None:
            parts["lr"] = self.lr_scale
        return parts

    def smoothed_moments(self) -> S.NoiseMoments:
        """The debiased moving averages of |G|^2 and tr(Sigma) (NaN before any step)."""
        state = self.state
        return S.NoiseMoments(
            S.debias(state.grad_sqr_biased, state.ema_weight),
            S.debias(state.trace_sigma_biased, state.ema_weight),
        )

    def carry_batch_over(self) -> str | None:
        """After restoring a state written on another topology: keeps its global batch.

        The state stores k and the replicas x micro-batch (the batch unit) of the engine
        that wrote it. Restored as is on another number of replicas (or another
        micro-batch size), k would give another global batch: 4 -> 2 replicas would
        halve it. This sets k so that the global batch stays the saved one, or the
        nearest reachable one (a multiple of this engine's unit, within the policy's
        bounds); the differenced estimator's previous gradient (one replica, estimated
        similarity) is not carried over. Progress, moving averages, the policy's state
        and the samples seen are unchanged. Host code; `tf_adabatch.app.run` and Keras's
        loading under `attach` call it after a restore.

        Returns:
          None if the topology is unchanged, else one line saying what happened.

        Example (a state written with 4 replicas x 32 and k = 2: batch 256; resumed
        on one device x 32, k becomes 8; one replica in exact mode):

        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                         micro_batch_size=32, policy=StaticPolicy(64),
        ...                         similarity="exact")
        >>> _ = engine.state.batch_unit.assign(128); _ = engine.state.accumulation_steps.assign(2)
        >>> engine.carry_batch_over()
        'Resumed on a batch unit of 32 (replicas x micro-batch; it was 128): global batch 256 kept (k = 8).'

        With estimated similarity on one replica, the line adds "The differenced
        estimator starts over (no previous gradient)."
        """
        saved = int(self.state.batch_unit.numpy())
        unit = self.num_replicas * self.micro_batch_size
        if saved in (0, unit):
            self.state.batch_unit.assign(unit)
            return None
        batch = int(self.state.accumulation_steps.numpy()) * saved
        low = max(self._min_k, -(-int(getattr(self.policy, "min_batch_size", 0)) // unit))
        high = max(low, int(getattr(self.policy, "max_batch_size", 0)) // unit or 2**62)
        k = min(max(round(batch / unit), low), high)
        self.state.accumulation_steps.assign(k)
        self.state.prev_batch_size.assign(0.0)  # the previous gradient is not comparable
        self.state.batch_unit.assign(unit)
        head = f"Resumed on a batch unit of {unit} (replicas x micro-batch; it was {saved}): "
        # One replica, estimated similarity: the previous gradient (if the file had one)
        # was taken on another topology, so the differenced estimator starts over.
        restart = (
            " The differenced estimator starts over (no previous gradient)."
            if self.carried_buffers
            else ""
        )
        if k * unit == batch:
            return head + f"global batch {batch} kept (k = {k})." + restart
        return (
            head
            + (
                f"global batch {batch} is not reachable; continuing with {k * unit}, the nearest "
                "reachable one within the policy's bounds."
            )
            + restart
        )

    def set_batch_size(self, batch_size: int) -> None:
        """Sets the global batch size of the next step (no retrace). Host code only.

        Raises:
          ValueError: if it is not a multiple of replicas x micro-batch, or too small.
        """
        self.state.accumulation_steps.assign(self._batch_to_k_checked("batch_size", batch_size))

    def _warn_if_state_is_new_on_a_trained_optimizer(self) -> None:
        """Before the first step: a trained optimizer with a new adaptive state means the
        model was restored without its state (e.g. `keras.models.load_model` then
        `attach`), and training would restart the schedule on tau = 0 at the initial
        batch. Said once, as a warning: a model trained with plain Keras first may
        start its adaptation afresh on purpose."""
        iterations = int(self.optimizer.iterations.numpy())
        taken = int(self.state.steps.numpy()) + int(self.state.skipped_steps.numpy())
        if iterations > 0 and taken == 0:
            warnings.warn(
                f"The optimizer has taken {iterations} steps but the adaptive state is new "
                f"(progress 0, batch {self.batch_size}): the model was restored without its "
                "tf_adabatch state, and the schedule restarts at progress 0. To continue a "
                "model saved under tf_adabatch, load it with `tf_adabatch.load_model(path, "
                "...)`, or call `model.load_weights(path)` after `attach` / `Trainer(...)`.",
                stacklevel=3,
            )

    def train_step(self, iterator: Iterator[Any]) -> dict[str, Any]:
        """Runs one optimizer step, consuming k micro-batches per replica.

        Args:
          iterator: an iterator over a distributed dataset of per-replica micro-batches
            of `micro_batch_size` examples, `(x, y)` or `(x, y, sample_weight)`.

        Returns:
          A dict of scalar tensors: loss, batch_size, accumulation_steps, gain,
          similarity, noise_scale, grad_sqr, grad_var, learning_rate, progress,
          samples_seen, skipped_steps, applied (1.0 or 0.0), step (optimizer steps
          taken, skipped ones included), consecutive_skips; and, timed on the host
          (NaN for a step that traced; NumPy float64 scalars): step_time (seconds),
          examples_per_second, progress_per_second (base-batch steps per second).

        Raises:
          NonFiniteGradientsError: after `max_consecutive_skips` skipped steps in a row.
        """
        if self.trace_count == 0:
            self._warn_if_state_is_new_on_a_trained_optimizer()
            # Keras's metrics (loss tracker, compiled metrics: built by `fit` before
            # its first step) are updated by the micro-steps under `attach`: a skipped
            # step leaves them as they were too. Their values may be anything, so
            # they do not count in the finiteness check.
            metrics = [v for m in getattr(self.model, "metrics", []) for v in m.variables]
            self._rollback.add_local(metrics, check_finite=False)
        traces = self.trace_count
        start = time.perf_counter()
        logs = self._step_fn(iterator)
        # The step's outputs are ready when the call returns (the step ran to its end):
        # reading them is the only host round trip of a step.
        consecutive_skips = int(logs["consecutive_skips"])
        seconds = time.perf_counter() - start
        if float(logs.pop(_RESTORE)):  # rare: an update that was not finite
            self._restore_fn()
        increment = float(logs.pop(_PROGRESS_INCREMENT))
        logs.update(self._timing(logs, seconds, increment, traced=self.trace_count != traces))
        limit = self.max_consecutive_skips
        if limit is not None and consecutive_skips >= limit:
            raise NonFiniteGradientsError(
                f"{limit} optimizer steps in a row had non-finite gradients or updates (NaN or "
                "inf) and were skipped; stopping. Weights, optimizer and adaptive state are those of "
                f"the last good step ({int(self.state.steps.numpy())} applied). Check the "
                "data, the learning rate and the loss; raise `max_consecutive_skips` to "
                "tolerate more."
            )
        return logs

    def _timing(
        self, logs: dict[str, tf.Tensor], seconds: float, progress: float, *, traced: bool
    ) -> dict[str, Any]:
        """The step's charged time: the clock's `seconds` for the step just taken.

        A host-measured step that traced is charged NaN (its time is the trace's). Feeds
        a `GoodputPolicy`'s throughput model with (k, charged seconds) of every applied
        step that has a time.
        """
        k = int(logs["accumulation_steps"])
        if traced and self.clock.measures_host:
            seconds = float("nan")
        else:
            seconds = self.clock.seconds(seconds, int(logs["batch_size"]), k)
            if isinstance(self.policy, GoodputPolicy) and float(logs["applied"]):
                self.policy.throughput.observe(k, seconds)
        # NumPy scalars: a `tf.constant` each would cost tens of microseconds per step.
        return {
            "step_time": np.float64(seconds),
            "examples_per_second": np.float64(float(logs["batch_size"]) / seconds),
            "progress_per_second": np.float64(progress / seconds),
        }

    # ------------------------------------------------------------- replica context

    def _extra_losses(self) -> tf.Tensor:
        """Activity / `add_loss` losses of the last forward pass, without weight regularizers.

        Weight regularizers are applied once per step in `_apply_step` instead: they are
        the same for every micro-batch and would inflate the groups' similarity.
        """
        extra = seams.added_losses(self.model, self._variables)
        if not extra:
            return tf.constant(0.0, tf.float32)
        return tf.add_n([tf.cast(x, tf.float32) for x in extra])

    def _micro_step(self, data: Any, micro_index: tf.Tensor) -> None:
        grads, data_loss = self._micro_gradients(data)
        with tf.name_scope(SCOPES["accumulate"]):
            self.measurement.accumulate(grads, data_loss, micro_index)

    def _last_micro_step(
        self, data: Any, micro_index: tf.Tensor
    ) -> tuple[Reading, list[tf.Tensor], tuple[list[tf.Tensor], ...]]:
        """The step's last micro-step and the reduce, fused (one replica function).

        The last micro-step's gradients and scalars go to the all-reduce added to the
        accumulators' sums of the earlier micro-steps (none when it is the first),
        without being written to the accumulators and read back.
        """
        grads, data_loss = self._gradients_fn(data)
        with tf.name_scope(SCOPES["accumulate"]):
            scalars = micro_scalars(grads, data_loss)
            acc, acc_scalars = self.measurement.acc, self.measurement.scalars

            earlier = micro_index > 0

            def with_earlier() -> tuple[list[tf.Tensor], tf.Tensor]:
                local = [g + a.read_value() for g, a in zip(grads, acc, strict=True)]
                return local, scalars + acc_scalars.read_value()

            local, local_scalars = tf.cond(earlier, with_earlier, lambda: (list(grads), scalars))
            local_sq = None  # |h_r|^2, for a measurement with replica norms
            if self.measurement.uses_replica_norms:
                # Alone, the last micro-step's |g|^2 (in `scalars`) is |h_r|^2. A branch
                # of its own: inside the one above, the sum of squares made every step
                # 0.4 ms slower with k = 1 (2 replicas, measured), though never run.
                local_sq = tf.cond(earlier, lambda: S.sum_of_squares(local), lambda: scalars[0])
        return self.measurement.reduce(local, local_scalars, local_sq)

    def _micro_gradients(self, data: Any) -> tuple[list[tf.Tensor], tf.Tensor]:
        """One micro-batch's gradients (unscaled) and mean data loss (replica context)."""
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.name_scope(SCOPES["micro"]):
            tf.debugging.assert_equal(
                tf.shape(tf.nest.flatten(x)[0])[0],
                self.micro_batch_size,
                message="tf_adabatch: a micro-batch must have `micro_batch_size` examples per "
                "replica (batch the data with replicas x micro_batch_size, drop_remainder=True)",
            )
            return self._forward_backward(x, y, sample_weight)

    def _forward_backward(
        self, x: Any, y: Any, sample_weight: Any
    ) -> tuple[list[tf.Tensor], tf.Tensor]:
        """The forward and backward pass of `_micro_gradients` on unpacked data."""
        with tf.GradientTape() as tape:
            y_pred = self.model(x, training=True)
            per_example = tf.cast(self._loss_fn(y, y_pred), tf.float32)
            if sample_weight is not None:
                per_example = weighted_losses(per_example, sample_weight)
            data_loss = tf.reduce_mean(per_example)
            loss = data_loss + self._extra_losses()
            if self._loss_scaled:
                loss = self.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, self._variables)
        if self.micro_step_hook is not None:
            self.micro_step_hook(x, y, y_pred, sample_weight)
        grads = [
            tf.zeros(v.shape, v.dtype) if g is None else tf.cast(tf.convert_to_tensor(g), v.dtype)
            for g, v in zip(grads, self._variables, strict=True)
        ]
        if self._loss_scaled:  # unscale now: overflow stays inf/NaN and skips the step
            scale = tf.convert_to_tensor(self.optimizer.dynamic_scale)
            grads = [g / tf.cast(scale, g.dtype) for g in grads]
        return grads, data_loss

    def _apply_step(self, grads: list[tf.Tensor], finite: tf.Tensor | None = None) -> None:
        regularized = [v for v in self._variables if getattr(v, "regularizer", None) is not None]
        if regularized:
            with tf.GradientTape() as tape:
                reg = tf.add_n([tf.cast(v.regularizer(v), tf.float32) for v in regularized])
            reg_grads = tape.gradient(reg, self._variables)
            grads = [
                g if r is None else g + tf.cast(r, g.dtype)
                for g, r in zip(grads, reg_grads, strict=True)
            ]
        if self._loss_scaled:
            # The loss-scale optimizer divides by its scale (a power of two: exact). A
            # step the engine skips (e.g. a non-finite loss with finite gradients) must
            # be skipped by the optimizer too: hand it non-finite gradients then.
            scale = tf.convert_to_tensor(self.optimizer.dynamic_scale)
            nan = tf.constant(float("nan"))
            grads = [
                tf.where(finite, g * tf.cast(scale, g.dtype), tf.cast(nan, g.dtype)) for g in grads
            ]
        self.optimizer.apply_gradients(zip(grads, self._variables, strict=True))

    # ------------------------------------------------------- cross-replica context

    def _train_step(self, iterator: Iterator[Any]) -> dict[str, tf.Tensor]:
        self.trace_count += 1  # Python side effect: runs once per trace.
        strategy = self.strategy
        state = self.state
        k = state.accumulation_steps.read_value()
        with tf.name_scope(SCOPES["rollback"]):
            self._rollback.save()
        if self.measurement.fuses_last_micro_step:
            for i in tf.range(k - 1):
                strategy.run(self._micro_fn, args=(next(iterator), i))
            with tf.name_scope(SCOPES["statistics"]):  # the all-reduces have their own
                per_replica, gbar, pending = strategy.run(
                    self._last_fn, args=(next(iterator), k - 1)
                )
        else:
            # Every micro-step is accumulated first (odd N in exact mode: into one of
            # two accumulators).
            for i in tf.range(k):
                strategy.run(self._micro_fn, args=(next(iterator), i))
            with tf.name_scope(SCOPES["statistics"]):
                per_replica, gbar, pending = strategy.run(self._reduce_fn)
        with tf.name_scope(SCOPES["statistics"]):
            reading = tf.nest.map_structure(lambda v: _local(strategy, v), per_replica)
            if self.measurement.norms_after_reduce:
                local = tf.nest.map_structure(lambda v: _local(strategy, v), pending)
                reading = self.measurement.complete(reading, local)
            stats = self._update_statistics(reading)
            finite, batch = stats.finite, stats.batch
            # The rate this step applies (read before the optimizer counts the step).
            learning_rate = tf.cast(self.optimizer.learning_rate, _F64)
        with tf.name_scope(SCOPES["apply"]):
            self._apply_or_skip(gbar, finite)
        with tf.name_scope(SCOPES["rollback"]):
            # Applied only if the gradients were finite AND the update left every
            # weight, slot and model statistic finite; otherwise roll the step back.
            update_ok = self._rollback.all_finite()
            applied = finite & update_ok
            # Any skip: the forward passes' writes (BatchNormalization statistics...).
            if self._rollback.local:  # (no branch at all for a model without any)
                tf.cond(applied, lambda: None, self._rollback.restore_local)
            # A finite gradient with a non-finite update: `train_step` restores the
            # weights and slots (`_restore_fn`) before it returns. (On a non-finite
            # gradient nothing was applied, and a loss-scale optimizer's lowered scale
            # must stick.)
            restore = finite & ~update_ok
        with tf.name_scope(SCOPES["statistics"]):
            noise = self._commit_statistics(stats, applied)
        with tf.name_scope(SCOPES["policy"]):
            counters = self._advance(applied, reading.num_micro, noise)
        return {
            _RESTORE: tf.cast(restore, _F64),
            "loss": reading.loss,
            "batch_size": batch,
            "accumulation_steps": tf.cast(k, _F64),
            "gain": noise.gain,
            "similarity": noise.similarity,
            "noise_scale": noise.noise_scale,
            "grad_sqr": noise.grad_sqr,
            "grad_var": noise.trace_sigma / float(self.base_batch_size),
            "learning_rate": learning_rate,
            **counters,
        }

    def _apply_or_skip(self, gbar: list[tf.Tensor], finite: tf.Tensor) -> None:
        """Applies the mean gradient on every replica if `finite` (cross-replica context)."""
        strategy = self.strategy
        self._bypass.active = True
        try:
            if self._loss_scaled:
                # The loss-scale optimizer skips a non-finite step itself, and must see
                # it to lower its scale.
                strategy.run(self._apply_fn, args=(gbar, finite))
            else:
                tf.cond(finite, lambda: strategy.run(self._apply_fn, args=(gbar,)), lambda: None)
        finally:
            self._bypass.active = False

    def _update_statistics(self, reading: Reading) -> _StepStatistics:
        """Moments, moving averages, gain and similarity of this step, as values.

        Only the gain is written here: the learning-rate rule reads it while the
        optimizer applies. The rest is written by `_commit_statistics` once the step is
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
        update = step.valid  # (a skipped step commits none of this: `_commit_statistics`)
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
        return _StepStatistics(finite, batch, new, old)

    def _commit_statistics(self, stats: _StepStatistics, applied: tf.Tensor) -> _Noise:
        """Writes the step's statistics if it was applied (else keeps the old ones, the
        gain included); returns them as the policy and the logs see them."""
        kept = {}
        for name in _STATISTICS:
            kept[name] = tf.where(applied, stats.new[name], stats.old[name])
            getattr(self.state, name).assign(kept[name], read_value=False)
        self.measurement.after_step(applied, stats.batch)
        grad_sqr = S.debias(kept["grad_sqr_biased"], kept["ema_weight"])
        trace = S.debias(kept["trace_sigma_biased"], kept["ema_weight"])
        return _Noise(
            gain=kept["gain"],
            similarity=kept["similarity"],
            grad_sqr=grad_sqr,
            trace_sigma=trace,
            noise_scale=S.noise_scale(grad_sqr, trace),
        )

    def _advance(
        self, finite: tf.Tensor, num_micro: tf.Tensor, noise: _Noise
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
        unit = self.num_replicas * self.micro_batch_size
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
            _PROGRESS_INCREMENT: increment,
            "progress": progress,
            "samples_seen": tf.cast(samples, _F64),
            "skipped_steps": tf.cast(skipped, _F64),
            "applied": tf.cast(finite, _F64),
            "step": tf.cast(steps + skipped, _F64),
            "consecutive_skips": tf.cast(consecutive, _F64),
        }

    # ---------------------------------------------------------------- validation

    def _batch_to_k_checked(self, name: str, batch_size: int) -> int:
        unit = self.num_replicas * self.micro_batch_size
        if (
            isinstance(batch_size, bool)
            or not isinstance(batch_size, numbers.Integral)  # int, np.int64, ...
            or batch_size % unit
            or batch_size < unit * self._min_k
        ):
            rule = f"a multiple of replicas x micro_batch_size = {self.num_replicas} x {self.micro_batch_size} = {unit}"
            if self._min_k > 1:
                rule += f", at least {unit * self._min_k} (one replica in exact-similarity mode needs >= 2 micro-steps to form two groups; or use similarity='estimated')"
            raise ValueError(f"Argument `{name}` must be {rule}. Received: {name}={batch_size!r}")
        return int(batch_size) // unit
