"""The distributed adaptive step: micro-steps, one all-reduce, statistics, policy, apply.

Data flow of one optimizer step (one call of `AdaptiveEngine.train_step`; N of them in
one call of `train_steps`, a `tf.while_loop` on the device):

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
    logs                               one float64 vector per step (`STEP_LOGS`): the
                                        host reads it once per call, nothing between

k is read from a variable, so changing it never retraces. The engine serves the custom
loop (`tf_adabatch.Trainer`) and `model.fit` (`attach`). Its rooms: the measurement
(`measure`), the statistics' update and commit (`step_statistics`), the micro-batch's
gradients (`gradients`, `losses`), the roll-back (`rollback`), the options' checks
(`options`), restoring a state (`resume`), the step's price (`clock`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import tensorflow as tf

# typing_extensions comes with TensorFlow; `Unpack` / `Required` for Python 3.10.
from typing_extensions import Unpack

from tf_adabatch import _keras_seams as seams
from tf_adabatch import resume
from tf_adabatch import stats as S
from tf_adabatch._checks import integer, real
from tf_adabatch.clock import Clock, WallClock
from tf_adabatch.gradients import MicroGradients
from tf_adabatch.losses import per_example_loss_fn
from tf_adabatch.measure import (
    SCOPES,
    GroupMeasurement,
    Reading,
    make_measurement,
    min_accumulation_steps,
)
from tf_adabatch.options import (
    SIMILARITY_MODES,
    EngineOptions,
    batch_to_k,
    check_engine_objects,
    resolve_options,
    resolve_similarity,
)
from tf_adabatch.policies import StaticPolicy
from tf_adabatch.rollback import StepRollback, variable_bytes
from tf_adabatch.schedules import bind_adaptive_schedules
from tf_adabatch.state import AdaptiveState
from tf_adabatch.step_logs import (
    LOG_NAMES,
    STEP_LOGS,
    UPDATE_LOST,
    NonFiniteGradientsError,
    NonFiniteUpdateError,
    read_call,
)
from tf_adabatch.step_statistics import StepBookkeeping

__all__ = [
    "SIMILARITY_MODES",
    "STEP_LOGS",
    "AdaptiveEngine",
    "EngineOptions",
    "NonFiniteGradientsError",
    "NonFiniteUpdateError",
    "resolve_options",
]

_F64 = tf.float64


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
      **options: the engine's options, `EngineOptions` (`micro_batch_size` required).

    Skipped steps: a step whose gradients, loss or update are not finite changes no
    weight, slot, model variable, statistic, average, progress or batch size (only the
    skip counters and `samples_seen` move): docs/reliability.md, and `rollback` in
    `EngineOptions` for the memory-light mode.

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
        self.clock: Clock = opts["clock"] or WallClock()
        self.strategy = check_engine_objects(model, optimizer, strategy)
        self.max_consecutive_skips = opts["max_consecutive_skips"]
        self.model, self.optimizer = model, optimizer
        self.num_replicas = int(self.strategy.num_replicas_in_sync)
        self.micro_batch_size = micro_batch_size = opts["micro_batch_size"]
        # replicas x micro-batch: the global batch of one micro-step, the unit of B.
        self.batch_unit = unit = self.num_replicas * micro_batch_size
        self.similarity_mode = similarity = resolve_similarity(
            opts["similarity"], self.num_replicas
        )
        self.policy = opts["policy"] or StaticPolicy(unit)
        with self.strategy.scope():
            self.policy.build(unit)
        self._min_k = min_accumulation_steps(similarity, self.num_replicas)
        k0 = self._batch_to_k("policy.initial_batch_size", self.policy.initial_batch_size)
        base_batch_size = opts["base_batch_size"]
        self.base_batch_size = int(
            self.policy.initial_batch_size if base_batch_size is None else base_batch_size
        )

        # Dynamic loss scaling (`mixed_float16`): each micro-step differentiates the
        # scaled loss and unscales its gradients at once, so the accumulators and every
        # statistic see true gradients; the optimizer gets the scaled mean gradient and
        # does its own bookkeeping (skips and halves its scale on overflow, grows it).
        self._grads = MicroGradients(model, per_example_loss_fn(loss), optimizer, micro_batch_size)
        self._loss_scaled = self._grads.loss_scaled
        self._variables = self._grads.variables
        with self.strategy.scope():
            self.state = AdaptiveState(accumulation_steps=k0, batch_unit=unit)
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
                strategy=self.strategy,
            )
        self._bypass = seams.AllReduceBypass(optimizer)
        # An `AdaptiveLearningRate` on the optimizer reads gain, tau and batch from the
        # state; `lr_scale` is Keras's learning-rate callbacks' multiplier.
        self.lr_schedule, self.lr_scale = bind_adaptive_schedules(
            [seams.learning_rate_schedule(opt) for opt in seams.optimizer_chain(optimizer)],
            self.state,
            self.strategy,
            batch_unit=unit,
            base_batch_size=self.base_batch_size,
        )
        self.trace_count = 0
        self.min_variance, self.ema_decay = opts["min_variance"], opts["ema_decay"]
        self.rollback_mode = opts["rollback"]
        # What a skipped step wrote is restored (`StepRollback.for_step` says what);
        # the state needs no copy: a step writes its statistics once it is known to be
        # applied (`StepBookkeeping.commit`), all but the gain, which it rewrites then.
        self._rollback = StepRollback.for_step(
            self.strategy,
            model,
            optimizer,
            self.measurement.carried_buffers,
            copy_mirrored=self.rollback_mode == "copy",
        )

        self._books = StepBookkeeping(
            self.state,
            self.measurement,
            self.policy,
            self.lr_schedule,
            micro_batch_size=micro_batch_size,
            base_batch_size=self.base_batch_size,
            batch_unit=unit,
            min_k=self._min_k,
            min_variance=self.min_variance,
            ema_decay=self.ema_decay,
        )
        jit = opts["jit_compile"]
        wrap = (lambda f: tf.function(f, jit_compile=True)) if jit else (lambda f: f)
        self._micro_fn = wrap(self._micro_step)
        single = self.num_replicas == 1
        reduce = self.measurement.reduce
        self._reduce_fn = wrap(reduce) if single else reduce
        # The last micro-step is fused with the reduce (which XLA compiles only on a
        # single replica: it holds the all-reduces); its forward and backward pass is
        # compiled on its own.
        self._gradients_fn = wrap(self._grads.of_micro_batch)
        self._last_fn = wrap(self._last_micro_step) if single else self._last_micro_step
        self._apply_fn = wrap(self._apply_step) if single else self._apply_step
        # On one replica the rest of the step after the micro-steps that draw data
        # compiles as one XLA function, roll-back and policy included (on several, the
        # cross-replica code reaches every device's variables, which XLA refuses:
        # docs/architecture.md).
        self._save_fn = wrap(self._rollback.save) if single else self._rollback.save
        self._finish_fn = wrap(self._finish_step) if single else self._finish_step
        self._step_fn = tf.function(self._train_step)
        self._block_fn = tf.function(self._train_block)

    # ------------------------------------------------------------------ public API

    @property
    def micro_step_hook(self) -> Callable[[Any, Any, Any, Any], None] | None:
        """Called in replica context after each micro-step's forward pass with (x, y,
        y_pred, sample_weight); `attach` updates Keras's compiled metrics there."""
        return self._grads.hook

    @micro_step_hook.setter
    def micro_step_hook(self, hook: Callable[[Any, Any, Any, Any], None] | None) -> None:
        self._grads.hook = hook

    @property
    def accumulation_steps(self) -> int:
        """k, micro-steps per optimizer step."""
        return int(self.state.accumulation_steps.numpy())

    @property
    def batch_size(self) -> int:
        """The current global batch size B = k x replicas x micro-batch."""
        return self.accumulation_steps * self.batch_unit

    @property
    def carried_buffers(self) -> list[tf.Variable]:
        """Per-step buffers the next step reads, to checkpoint with the state: the
        differenced estimator's previous gradient (one replica, estimated similarity)."""
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

    def memory(self) -> dict[str, int]:
        """Bytes of variables on all devices together: the model's, the optimizer's,
        and what the engine adds (the roll-back's copies, the measurement's
        accumulators and buffers, the adaptive state).

        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                         micro_batch_size=4, rollback="stop", similarity="exact",
        ...                         policy=StaticPolicy(8))
        >>> engine.memory()["model"], engine.memory()["rollback"]  # 4 float32 weights
        (16, 0)
        """
        optimizer = [v for opt in seams.optimizer_chain(self.optimizer) for v in opt.variables]
        parts = {
            "model": self.model.variables,
            "optimizer": optimizer,
            "rollback": self._rollback.backups(),
            "measurement": self.measurement.variables(),
            "state": [*self.state.variables, *self.policy.variables],
        }
        return {name: variable_bytes(self.strategy, part) for name, part in parts.items()}

    def smoothed_moments(self) -> S.NoiseMoments:
        """The debiased moving averages of |G|^2 and tr(Sigma) (NaN before any step)."""
        state = self.state
        return S.NoiseMoments(
            S.debias(state.grad_sqr_biased, state.ema_weight),
            S.debias(state.trace_sigma_biased, state.ema_weight),
        )

    def carry_batch_over(self) -> str | None:
        """After restoring a state written on another topology: keeps its global batch
        (`tf_adabatch.resume.carry_batch_over`, which says how).

        Returns:
          None if the topology is unchanged, else one line saying what happened.
        """
        carried = bool(self.carried_buffers)
        return resume.carry_batch_over(
            self.state, self.policy, self.batch_unit, self._min_k, carried=carried
        )

    def set_batch_size(self, batch_size: int) -> None:
        """Sets the global batch size of the next step (no retrace). Host code only.

        Raises:
          ValueError: if it is not a multiple of replicas x micro-batch, or too small.
        """
        self.state.accumulation_steps.assign(self._batch_to_k("batch_size", batch_size))

    def _batch_to_k(self, name: str, batch_size: int) -> int:
        return batch_to_k(name, batch_size, self.num_replicas, self.micro_batch_size, self._min_k)

    def _before_first_step(self) -> None:
        resume.warn_if_state_is_new(self.optimizer, self.state, self.batch_size)
        # Keras's metrics (loss tracker, compiled metrics: built by `fit` before its
        # first step) are updated by the micro-steps under `attach`: a skipped step
        # leaves them as they were too. Their values may be anything, so they do not
        # count in the finiteness check.
        metrics = [v for m in getattr(self.model, "metrics", []) for v in m.variables]
        self._rollback.add_local(metrics, check_finite=False)

    def train_step(self, iterator: Iterator[Any]) -> dict[str, np.float64]:
        """Runs one optimizer step, consuming k micro-batches per replica.

        Args:
          iterator: an iterator over a distributed dataset of per-replica micro-batches
            of `micro_batch_size` examples, `(x, y)` or `(x, y, sample_weight)`.

        Returns:
          NumPy float64 scalars, read from the device in one transfer: `STEP_LOGS`
          (`step` counts skipped steps too; `applied` is 1.0 or 0.0) and, charged by
          the clock (NaN for a host-timed step that traced), step_time (seconds),
          examples_per_second, progress_per_second (base-batch steps per second).

        Raises:
          NonFiniteGradientsError: after `max_consecutive_skips` skipped steps in a row.
        """
        return {name: column[0] for name, column in self._run(iterator, None).items()}

    def train_steps(
        self,
        iterator: Iterator[Any],
        steps: int,
        *,
        until_progress: float | None = None,
        micro_batches: int | None = None,
    ) -> dict[str, np.ndarray]:
        """Runs up to `steps` optimizer steps in one call on the device (`steps_per_execution`).

        The steps run in a loop inside one `tf.function`; k is read from its variable
        at every step, so the batch size changes within the block as it does between
        calls. The block ends early, after the step that brings progress tau to
        `until_progress` (a progress budget is crossed by exactly the step that
        crosses it, as one step per call would), or that makes `max_consecutive_skips`
        skips in a row. Its first step always runs, as a call of `train_step` would.
        The host reads the block's logs once, at its end.

        Time: a `WallClock` charges each step of a block the block's time / its steps
        (not measured apart); a `VirtualClock`, its own batch's price. A
        `GoodputPolicy` observes every applied step with that time.

        Args:
          iterator: as for `train_step`.
          steps: the most optimizer steps to run (an integer >= 1).
          until_progress: stop after the step whose progress tau reaches this.
          micro_batches: the most micro-steps the block may take (after its first
            step): a step is not begun that would need more (`attach` uses it for an
            epoch's end).

        Returns:
          The logs of `train_step`, one NumPy float64 array each, one entry per step
          taken (at least one).

        Raises:
          NonFiniteGradientsError: a block ended on `max_consecutive_skips` skips.

        Example (k = 2; the block stops where tau reaches 3):

        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                         micro_batch_size=4, policy=StaticPolicy(8))
        >>> data = tf.data.Dataset.from_tensors((tf.ones((4, 3)), tf.ones((4,)))).repeat()
        >>> logs = engine.train_steps(iter(data), 8, until_progress=3.0)
        >>> logs["step"].tolist(), logs["batch_size"].tolist()
        ([1.0, 2.0, 3.0], [8.0, 8.0, 8.0])
        """
        steps = integer("steps", steps)
        if until_progress is not None:
            until_progress = real("until_progress", until_progress, "a number", lambda v: True)
        if micro_batches is not None:
            micro_batches = integer("micro_batches", micro_batches)
        # A block's first step always runs, so a block of one is `train_step`'s call.
        block = None if steps == 1 else (steps, until_progress, micro_batches)
        return self._run(iterator, block)

    def _run(self, iterator: Iterator[Any], block: tuple[int, Any, Any] | None) -> dict:
        """One call of the step (`block` None) or of the block function; the one host read."""
        if self.trace_count == 0:
            self._before_first_step()
        traces = self.trace_count
        start = time.perf_counter()
        if block is None:
            out = self._step_fn(iterator)
        else:
            steps, until, micro = block
            limit = self.max_consecutive_skips
            out = self._block_fn(
                iterator,
                tf.constant(steps, tf.int32),
                tf.constant(math.inf if until is None else until, _F64),
                tf.constant(-1 if limit is None else limit, tf.int64),
                tf.constant(-1 if micro is None else micro, tf.int64),
            )
        values = out.numpy()  # the host read: every log of every step, one transfer
        return read_call(
            values,
            time.perf_counter() - start,
            traced=self.trace_count != traces,
            clock=self.clock,
            policy=self.policy,
            update_undone=self._rollback.copies_mirrored,
            max_consecutive_skips=self.max_consecutive_skips,
        )

    # ------------------------------------------------------------- replica context

    def _micro_step(self, data: Any, micro_index: tf.Tensor) -> None:
        grads, data_loss = self._grads.of_micro_batch(data)
        with tf.name_scope(SCOPES["accumulate"]):
            self.measurement.accumulate(grads, data_loss, micro_index)

    def _last_micro_step(
        self, data: Any, micro_index: tf.Tensor
    ) -> tuple[Reading, list[tf.Tensor], tuple[list[tf.Tensor], ...]]:
        """The step's last micro-step and the reduce, fused (one replica function)."""
        grads, data_loss = self._gradients_fn(data)
        return self.measurement.reduce_with_last(grads, data_loss, micro_index)

    def _apply_step(self, grads: list[tf.Tensor], finite: tf.Tensor | None = None) -> None:
        grads = self._grads.for_update(grads, finite)
        self.optimizer.apply_gradients(zip(grads, self._variables, strict=True))

    # ------------------------------------------------------- cross-replica context

    def _train_step(self, iterator: Iterator[Any]) -> tf.Tensor:
        """One optimizer step: the save and the micro-steps that draw data (not XLA:
        the iterator), then `_finish_step`, which XLA compiles whole on one replica."""
        self.trace_count += 1  # Python side effect: runs once per trace.
        strategy = self.strategy
        k = self.state.accumulation_steps.read_value()
        with tf.name_scope(SCOPES["rollback"]):
            self._save_fn()
        fused = self.measurement.fuses_last_micro_step
        for i in tf.range(k - 1 if fused else k):
            strategy.run(self._micro_fn, args=(next(iterator), i))
        # The last micro-batch, if the measurement fuses its micro-step with the reduce
        # (odd N in exact mode does not: every micro-step is accumulated first, into
        # one of two accumulators).
        return self._finish_fn(k, next(iterator)) if fused else self._finish_fn(k)

    def _finish_step(self, k: tf.Tensor, data: Any = None) -> tf.Tensor:
        """The rest of the step, with no data to draw: the reduce, statistics, apply,
        roll-back, commit and policy; returns the step's one log vector."""
        strategy = self.strategy
        with tf.name_scope(SCOPES["statistics"]):  # the all-reduces have their own
            if data is not None:
                per_replica, gbar, pending = strategy.run(self._last_fn, args=(data, k - 1))
            else:
                per_replica, gbar, pending = strategy.run(self._reduce_fn)
            # The first local replica's values: identical on all by construction.
            first = lambda v: strategy.experimental_local_results(v)[0]  # noqa: E731
            reading = tf.nest.map_structure(first, per_replica)
            if self.measurement.norms_after_reduce:
                local = tf.nest.map_structure(first, pending)
                reading = self.measurement.complete(reading, local)
            stats = self._books.update(reading)
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
            # A finite gradient with a non-finite update (rare): the weights and slots
            # too, from their copy (rollback="stop": none; the host stops the run). (On a
            # non-finite gradient nothing was applied, and a loss-scale optimizer's
            # lowered scale must stick.)
            lost = finite & ~update_ok
            if self._rollback.copies_mirrored:
                tf.cond(lost, self._rollback.restore_mirrored, lambda: None)
        with tf.name_scope(SCOPES["statistics"]):
            noise = self._books.commit(stats, applied)
        with tf.name_scope(SCOPES["policy"]):
            counters = self._books.advance(applied, reading.num_micro, noise)
        logs = {
            "loss": reading.loss,
            "batch_size": batch,
            "accumulation_steps": k,
            "gain": noise.gain,
            "similarity": noise.similarity,
            "noise_scale": noise.noise_scale,
            "grad_sqr": noise.grad_sqr,
            "grad_var": noise.trace_sigma / float(self.base_batch_size),
            "learning_rate": learning_rate,
            **counters,
            UPDATE_LOST: lost,
        }
        # One vector (`LOG_NAMES`): the host reads a step's logs in one transfer.
        return tf.stack([tf.cast(logs[name], _F64) for name in LOG_NAMES])

    def _train_block(
        self,
        iterator: Iterator[Any],
        steps: tf.Tensor,
        until: tf.Tensor,
        limit: tf.Tensor,
        micro: tf.Tensor,
    ) -> tf.Tensor:
        """Up to `steps` optimizer steps in one graph: a `tf.while_loop` around the step.

        Stops after the step that brings progress to `until` or the consecutive skips
        to `limit`, or before one that would take more than `micro` micro-batches in
        all (-1: no limit); the first step always runs. Returns the steps' logs,
        `[steps taken, logs]`.
        """
        state, lost_at = self.state, LOG_NAMES.index(UPDATE_LOST)
        stop_on_lost = not self._rollback.copies_mirrored

        def go_on(i: tf.Tensor, logs: tf.TensorArray, used: tf.Tensor, lost: tf.Tensor) -> Any:
            k = state.accumulation_steps.read_value()
            more = (i < steps) & (state.progress.read_value() < until)
            more = more & ((micro < 0) | (used + k <= micro))
            if stop_on_lost:
                more = more & ~lost
            more = more & ((limit < 0) | (state.consecutive_skips.read_value() < limit))
            return (i == 0) | more  # the first step runs, as a call of `train_step` would

        def step(i: tf.Tensor, logs: tf.TensorArray, used: tf.Tensor, lost: tf.Tensor) -> Any:
            used = used + state.accumulation_steps.read_value()
            out = self._train_step(iterator)
            return i + 1, logs.write(i, out), used, out[lost_at] > 0

        logs = tf.TensorArray(_F64, size=0, dynamic_size=True, element_shape=[len(LOG_NAMES)])
        start = (tf.constant(0), logs, tf.constant(0, tf.int64), tf.constant(False))
        return tf.while_loop(go_on, step, start)[1].stack()

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
