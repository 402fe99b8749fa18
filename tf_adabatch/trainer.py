"""`Trainer`: the custom tf.distribute training loop around `AdaptiveEngine`.

The outer loop is eager Python (iteration, progress bar, history); everything per step
runs in the engine's `tf.function`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf
from typing_extensions import Unpack

from tf_adabatch import _keras_seams as seams
from tf_adabatch import stats, summaries
from tf_adabatch._checks import integer, real
from tf_adabatch.engine import AdaptiveEngine
from tf_adabatch.evaluation import Evaluation
from tf_adabatch.keras_fit import track_adaptive_state
from tf_adabatch.options import EngineOptions, check_objects, resolve_options
from tf_adabatch.state import AdaptiveState
from tf_adabatch.step_logs import BLOCK_SECONDS, BLOCK_STEPS

__all__ = ["Trainer"]

# Shown on the progress bar, in this order (all as current values, not averages). The
# second key is the count the bar itself does not show: on a progress budget the bar
# counts base steps (progress tau) and "step" is the optimizer steps taken (skipped ones
# included); on a step count the bar counts optimizer steps and "progress" is tau.
_PROGRESS_KEYS = ("loss", "batch_size", "similarity", "gain", "learning_rate")
# Shown on the bar as whole numbers.
_COUNTS = ("step", "skipped_steps")


class Trainer:
    """Trains a Keras model with an adaptive batch size under any `tf.distribute` strategy.

    Each optimizer step accumulates k micro-batches of `micro_batch_size` examples per
    replica, all-reduces the gradient once, measures the gradient noise (the replica
    groups' cosine similarity, |G|^2, tr(Sigma), the noise scale and the AdaScale gain)
    and lets the batch-size policy choose the next k. Create the model and the optimizer
    inside `strategy.scope()`, as for any tf.distribute training.

    Args:
      model: a built Keras model, created in the strategy's scope.
      loss: a Keras `Loss`, a loss name, or `(y_true, y_pred) -> per-example losses`.
      optimizer: any Keras optimizer (SGD, Adam, AdamW, ...), created in the scope.
      strategy: defaults to the current strategy (`tf.distribute.get_strategy()`).
      **options: the engine's options, `tf_adabatch.EngineOptions`: `micro_batch_size`
        (examples per replica per micro-step; required), `base_batch_size` (the batch
        the learning rate was tuned for; default the policy's initial batch),
        `policy` (default: static at one micro-step), `similarity` ("exact",
        "estimated" or "auto"), `ema_decay`, `min_variance`, `jit_compile`,
        `max_consecutive_skips`.

    Raises:
      ValueError: for an invalid argument; the message names it, the rule and the value.

    Example:

    >>> import numpy as np
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                   micro_batch_size=8, policy=tf_adabatch.StaticPolicy(16))
    >>> x = np.random.default_rng(0).normal(size=(64, 2)).astype("float32")
    >>> data = tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True)))
    >>> history = trainer.fit(data.repeat().batch(8, drop_remainder=True), steps=3, verbose=0)
    >>> trainer.batch_size, trainer.accumulation_steps, len(history["loss"])
    (16, 2, 3)
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
        resolve_options(options, caller="Trainer")
        check_objects(model, optimizer, strategy)
        strategy = strategy or tf.distribute.get_strategy()
        for v in model.trainable_variables:
            if not strategy.extended.variable_created_in_scope(getattr(v, "value", v)):
                raise ValueError(
                    "Argument `model` must be created inside `strategy.scope()` of the "
                    f"strategy the Trainer uses ({type(strategy).__name__}). Variable "
                    f"{v.path!r} was not."
                )
        self.engine = AdaptiveEngine(
            model,
            loss=loss,
            optimizer=optimizer,
            strategy=strategy,
            **options,
        )
        # Keras's saves of the model carry the adaptive state, as under `attach`.
        track_adaptive_state(model, self.engine)
        self._checkpoint: tf.train.Checkpoint | None = None
        self._writers: dict[str, tf.summary.SummaryWriter] = {}
        self._evaluate = Evaluation(self.engine)

    # ------------------------------------------------------------------ the loop

    def distribute(self, dataset: Any) -> Any:
        """Turns a dataset into the distributed dataset the step consumes.

        Args:
          dataset: one of
            - a `tf.data.Dataset` batched with the *global* micro-batch
              replicas x micro_batch_size (`drop_remainder=True`), which the strategy
              splits across replicas;
            - a function `input_context -> tf.data.Dataset` batched per replica with
              `micro_batch_size` (`strategy.distribute_datasets_from_function`);
            - an already distributed dataset.

        Raises:
          ValueError: if a dataset's batch dimension is not the global micro-batch,
            or a function's datasets' is not `micro_batch_size`. Where a function's
            batch dimension is not static, each micro-batch is checked as it is read
            (`tf.errors.InvalidArgumentError` naming the rule).
        """
        strategy = self.engine.strategy
        if isinstance(dataset, tf.data.Dataset):
            expected = self.engine.num_replicas * self.engine.micro_batch_size
            first = tf.nest.flatten(dataset.element_spec)[0]
            batch_dim = first.shape[0] if first.shape.rank else None
            if batch_dim != expected:
                raise ValueError(
                    "Argument `dataset` must be batched with the global micro-batch "
                    f"replicas x micro_batch_size = {self.engine.num_replicas} x "
                    f"{self.engine.micro_batch_size} = {expected} and a static batch "
                    f"dimension (use `.batch({expected}, drop_remainder=True)`). "
                    f"Received: batch dimension {batch_dim}"
                )
            return strategy.experimental_distribute_dataset(dataset)
        if callable(dataset):
            fn: Callable[[tf.distribute.InputContext], tf.data.Dataset] = dataset
            micro = int(self.engine.micro_batch_size)
            rule = (
                "Argument `dataset` (a function) must return a `tf.data.Dataset` of "
                f"per-replica micro-batches of micro_batch_size = {micro} examples "
                f"(`.batch({micro}, drop_remainder=True)`)"
            )

            def checked_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
                ds = fn(ctx)
                if not isinstance(ds, tf.data.Dataset):
                    raise ValueError(f"{rule}. Received: {type(ds).__name__}")
                # Scalars have no batch dimension (0); an unknown rank, an unknown one.
                dims = [
                    s.shape[0] if s.shape.rank else (None if s.shape.rank is None else 0)
                    for s in tf.nest.flatten(ds.element_spec)
                ]
                if any(d is not None and d != micro for d in dims):
                    raise ValueError(f"{rule}. Received: batch dimensions {dims}")
                if None not in dims:
                    return ds

                # Batch size unknown until run time (no drop_remainder): checked per
                # element in the input pipeline, a cheap in-graph assertion.
                def check(*element: Any) -> Any:
                    value = element[0] if len(element) == 1 else element
                    checks = [
                        tf.debugging.assert_equal(
                            tf.shape(t)[0], micro, message=f"{rule}; batch dimension of"
                        )
                        for t in tf.nest.flatten(value)
                    ]
                    with tf.control_dependencies(checks):
                        return tf.nest.map_structure(tf.identity, value)

                return ds.map(check)

            return strategy.distribute_datasets_from_function(checked_fn)
        if isinstance(dataset, tf.distribute.DistributedDataset):
            return dataset
        raise ValueError(
            "Argument `dataset` must be a `tf.data.Dataset` batched with the global "
            "micro-batch, a function `input_context -> tf.data.Dataset`, a distributed "
            "dataset, or (to `fit`) an iterator over one; for numpy arrays use "
            "`tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(replicas x "
            "micro_batch_size, drop_remainder=True)`. Received: dataset of type "
            f"{type(dataset).__name__}"
        )

    def fit(
        self,
        dataset: Any,
        *,
        steps: int | None = None,
        until_progress: float | None = None,
        summary_dir: str | None = None,
        callbacks: list[keras.callbacks.Callback] | None = None,
        verbose: int = 1,
        steps_per_execution: int = 1,
    ) -> dict[str, list[float]]:
        """Trains until `steps` optimizer steps or a progress budget, whichever is first.

        Args:
          dataset: see `distribute`, or an iterator over a distributed dataset (to go
            on where an earlier call stopped). Repeat the dataset (`.repeat()`) so that
            it outlasts the run whatever batch sizes the policy chooses.
          steps: optimizer steps to run (skipped non-finite steps count).
          until_progress: stop once the scale-invariant progress tau reaches this
            budget, in base-batch steps. Default (when `steps` is not given either):
            the length of the base schedule of the optimizer's `AdaptiveLearningRate`
            (`base_steps`), where it has one.
          summary_dir: if given, write TensorBoard summaries of every step there
            (tags in `tf_adabatch.summaries`), with the policy's bounds and target and
            the custom-scalars layout. Nothing is written otherwise.
          callbacks: Keras callbacks; they get `on_train_begin/end` and
            `on_train_batch_begin/end(step, logs)` once per optimizer step, and may
            stop training with `model.stop_training = True`.
          verbose: 1 shows a progress bar with the loss, batch size, similarity, gain
            and learning rate of the last step and `skipped_steps`, the non-finite
            steps skipped so far (the run's count). With `steps` it counts optimizer steps
            and also shows `progress`; on a progress budget alone it counts base steps
            (progress tau) and also shows `step`, the optimizer steps taken (skipped
            ones included). 0 prints nothing.
          steps_per_execution: optimizer steps per call of the engine, run in a loop
            on the device (`AdaptiveEngine.train_steps`): the host reads the steps'
            logs once per block. As with Keras's `steps_per_execution`, callbacks get
            `on_train_batch_begin` with a block's first step and `on_train_batch_end`
            with its last (and that step's logs), and the bar moves once per block;
            the history and the summaries still have every step. The step budget cuts
            the last block short; a progress budget ends a block after the step that
            reaches it (the same step as with 1); `model.stop_training` acts at block
            ends. A host clock charges each step of a block the block's time / its
            steps. The callbacks' logs also hold `block_steps` (the steps the call
            took) and `block_seconds` (the sum of their `step_time`). If the data run
            out inside a block, the block's steps taken before are kept (the weights
            and state have them) but their logs are lost.

        Returns:
          The per-step logs, as lists of floats keyed by name (see
          `AdaptiveEngine.train_step`).

        Raises:
          ValueError: if neither `steps` nor `until_progress` is given, or one is invalid.
        """
        schedule = self.engine.lr_schedule
        if steps is None and until_progress is None and schedule is not None:
            until_progress = schedule.base_steps
        if steps is None and until_progress is None:
            raise ValueError(
                "Pass `steps`, `until_progress` or both (the default budget is the length "
                "of the base schedule of an `AdaptiveLearningRate`, and this optimizer's "
                "learning rate has none). Received neither."
            )
        if steps is not None:
            steps = integer("steps", steps, minimum=0)
        if until_progress is not None:
            real("until_progress", until_progress, "a number >= 0", lambda v: v >= 0)
        per_call = integer("steps_per_execution", steps_per_execution)
        iterator = dataset if hasattr(dataset, "__next__") else iter(self.distribute(dataset))
        writer = self._writer(summary_dir)
        # Without a step count the bar runs on progress tau towards the budget.
        by_progress = steps is None
        progbar = None
        shown = (
            "loss",
            "step" if by_progress else "progress",
            *_PROGRESS_KEYS[1:],
            "skipped_steps",
        )
        if verbose:
            target = until_progress if by_progress else steps
            unit = "base step" if by_progress else "step"
            progbar = _TrainingBar(target, stateful_metrics=shown, unit_name=unit)
        history: dict[str, list[float]] = {}
        model = self.engine.model
        hooks = keras.callbacks.CallbackList(callbacks, model=model)
        model.stop_training = False
        hooks.on_train_begin()
        done = 0
        first_step = int(self.state.steps.numpy() + self.state.skipped_steps.numpy())
        # Read once; then from each step's logs (a read of the variable cost ~0.9 ms a
        # step in the application's loop on this project's CPU machine).
        progress = self.progress
        while (
            (steps is None or done < steps)
            and (until_progress is None or progress < until_progress)
            and not model.stop_training
        ):
            hooks.on_train_batch_begin(done)
            block = per_call if steps is None else min(per_call, steps - done)
            try:
                logs = self.engine.train_steps(iterator, block, until_progress=until_progress)
            except tf.errors.OutOfRangeError:
                # Nothing to undo: the next step's first micro-step overwrites the
                # accumulators, and no state was written by the cut step (a block's
                # earlier steps were taken: counted from the state).
                taken = int(self.state.steps.numpy() + self.state.skipped_steps.numpy())
                warnings.warn(
                    f"The dataset ran out after {taken - first_step} "
                    "optimizer steps; the unfinished step was discarded. Repeat the "
                    "dataset to train longer.",
                    stacklevel=2,
                )
                break
            for row in zip(*logs.values(), strict=True):
                values = {name: float(value) for name, value in zip(logs, row, strict=True)}
                done += 1
                for name, value in values.items():
                    history.setdefault(name, []).append(value)
                if writer is not None:
                    summaries.write_step(
                        writer, int(values["step"]), values, policy=self.engine.policy
                    )
            progress = values["progress"]
            if progbar is not None:
                current: float = done
                if by_progress and until_progress is not None:
                    current = min(values["progress"], until_progress)
                shown_values = [
                    (name, _Whole(values[name]) if name in _COUNTS else values[name])
                    for name in shown
                ]
                progbar.step_done(current, shown_values)
            call = {
                BLOCK_STEPS: float(len(logs["step"])),
                BLOCK_SECONDS: float(logs["step_time"].sum()),
            }
            # The callbacks one by one, as `CallbackList.on_train_batch_end` does, without
            # its `pythonify_logs`: these logs are Python floats already, and its
            # `tf.is_tensor` test of each of ~20 values was a measurable share of a
            # step (docs/step_cost.md, "Host code per call").
            batch_logs = {**values, **call}
            for callback in hooks.callbacks:
                callback.on_train_batch_end(done - 1, batch_logs)
        if progbar is not None:
            progbar.close()
        hooks.on_train_end({name: v[-1] for name, v in history.items()} if history else {})
        if writer is not None:
            writer.flush()
        return history

    def evaluate(
        self,
        dataset: Any,
        *,
        metrics: Any = None,
        weighted_metrics: Any = None,
    ) -> dict[str, float]:
        """The loss and metrics over a finite dataset, as `model.evaluate` computes them.

        The loss is the Trainer's loss reduced as Keras reduces it (sample weights
        included; a loss callable may return per-example values or their mean) plus
        the model's own losses (regularizers), averaged over all examples; metrics
        are Keras metrics updated batch by batch. Their variables are per replica and
        summed across replicas when read, so uneven last batches are exact under any
        strategy (MultiWorkerMirroredStrategy included).

        Args:
          dataset: a finite `tf.data.Dataset` of global batches `(x, y)` or
            `(x, y, sample_weight)` (any batch size; `drop_remainder` not needed), or a
            per-replica dataset function.
          metrics: as for `model.compile`: a list of metric names (e.g. "accuracy",
            resolved from the shapes as Keras does), `keras.metrics.Metric` objects,
            `keras.losses.Loss` objects (their per-example mean) or functions
            `(y_true, y_pred) -> per-example values`; or a dict name -> one of these
            (the name is the result's key); or a single one. Sample weights are not
            applied to them (Keras's rule for `metrics`).
          weighted_metrics: the same, with the sample weights applied.

        Returns:
          {"loss": ..., <metric name>: ...}, as Python floats (a metric whose result
          is a dict contributes its keys).

        Raises:
          ValueError: if the dataset is empty, or a metric object was created outside
            the strategy's scope and cannot be re-created from its config in it.
          TypeError: if `metrics` or `weighted_metrics` is of another kind.

        Example:

        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
        >>> trainer = Trainer(model, optimizer=keras.optimizers.SGD(0.1), micro_batch_size=4,
        ...                   loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        >>> x = np.random.default_rng(0).normal(size=(10, 2)).astype("float32")
        >>> data = tf.data.Dataset.from_tensor_slices((x, np.arange(10) % 3)).batch(4)
        >>> result = trainer.evaluate(data, metrics=["accuracy"])
        >>> correct = model(x).numpy().argmax(1) == np.arange(10) % 3
        >>> sorted(result), bool(np.isclose(result["accuracy"], correct.mean()))
        (['accuracy', 'loss'], True)
        """
        return self._evaluate(dataset, metrics=metrics, weighted_metrics=weighted_metrics)

    def _writer(self, summary_dir: str | None) -> tf.summary.SummaryWriter | None:
        if summary_dir is None:
            return None
        if summary_dir not in self._writers:
            writer = tf.summary.create_file_writer(summary_dir)
            summaries.write_layout(writer, policy=self.engine.policy)
            self._writers[summary_dir] = writer
        return self._writers[summary_dir]

    # -------------------------------------------------------------- read-only view

    @property
    def state(self) -> AdaptiveState:
        """The adaptive state (variables)."""
        return self.engine.state

    @property
    def checkpoint(self) -> tf.train.Checkpoint:
        """A `tf.train.Checkpoint` of the model, the optimizer and the adaptive state."""
        if self._checkpoint is None:
            self._checkpoint = tf.train.Checkpoint(**self.checkpoint_parts())
        return self._checkpoint

    def checkpoint_parts(self) -> dict[str, Any]:
        """What `checkpoint` holds, by name: model, optimizer and the adaptive state's parts
        ("adabatch", "policy", and where present "carried" and "lr"), to save beside
        objects of your own (`tf.train.Checkpoint(**trainer.checkpoint_parts(), extra=...)`).

        >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                   micro_batch_size=4, policy=tf_adabatch.StaticPolicy(8),
        ...                   similarity="exact")
        >>> sorted(trainer.checkpoint_parts())
        ['adabatch', 'model', 'optimizer', 'policy']
        """
        # The adaptive state's parts; "state" is saved as "adabatch" (the name
        # checkpoints have used since the first release).
        parts = {
            "adabatch" if name == "state" else name: part
            for name, part in self.engine.adaptive_state().items()
        }
        return {"model": self.engine.model, "optimizer": self.engine.optimizer, **parts}

    def restore(self, path: str) -> Any:
        """`checkpoint.restore(path)` for a checkpoint written on this or another topology.

        The differenced estimator's previous gradient (part "carried": one replica,
        estimated similarity) is restored only if the file has it; a checkpoint written
        on several replicas has none, and `AdaptiveEngine.carry_batch_over` (call it
        next) restarts the estimator. A file that has it restores on several replicas
        too (the part is not read). Everything else must be in the file for
        `assert_existing_objects_matched()` to pass.

        Returns:
          TensorFlow's load status (`tf.train.Checkpoint.restore`'s).

        Example (saved on one replica in estimated mode, restored there):

        >>> import tempfile
        >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
        ...                   micro_batch_size=4, similarity="estimated")
        >>> path = trainer.checkpoint.save(tempfile.mkdtemp() + "/ckpt")
        >>> trainer.restore(path).assert_existing_objects_matched() is not None
        True
        """
        parts = self.checkpoint_parts()
        saved = {name.split("/", 1)[0] for name, _ in tf.train.list_variables(path)}
        # Parts a file may lack: "carried" (see above) and "lr", the base rate's
        # multiplier, which files written before it existed lack (it stays at 1).
        missing = [name for name in ("carried", "lr") if name in parts and name not in saved]
        if missing:
            for name in missing:
                del parts[name]
            return tf.train.Checkpoint(**parts).restore(path)
        return self.checkpoint.restore(path)

    @property
    def batch_size(self) -> int:
        """The global batch size of the next optimizer step."""
        return self.engine.batch_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-steps per replica in the next optimizer step."""
        return self.engine.accumulation_steps

    def set_batch_size(self, batch_size: int) -> None:
        """Sets the global batch size of the next step (for the static policy)."""
        self.engine.set_batch_size(batch_size)

    @property
    def gain(self) -> float:
        """The AdaScale gain r of the last step."""
        return float(self.state.gain.numpy())

    @property
    def similarity(self) -> float:
        """The groups' cosine similarity of the last step (NaN before the first)."""
        return float(self.state.similarity.numpy())

    @property
    def progress(self) -> float:
        """Scale-invariant progress tau, in base-batch steps."""
        return float(self.state.progress.numpy())

    @property
    def grad_sqr(self) -> float:
        """Smoothed |G|^2 (NaN before the first statistics)."""
        return float(self.engine.smoothed_moments().grad_sqr)

    @property
    def grad_var(self) -> float:
        """Smoothed variance of one base-batch gradient, tr(Sigma) / B0 (fairscale's)."""
        return float(self.engine.smoothed_moments().trace_sigma) / self.engine.base_batch_size

    @property
    def noise_scale(self) -> float:
        """The simple noise scale tr(Sigma) / |G|^2 of the smoothed moments."""
        return float(stats.noise_scale(*self.engine.smoothed_moments()))

    @property
    def learning_rate(self) -> float:
        """The optimizer's learning rate for its next step."""
        return float(keras.ops.convert_to_numpy(self.engine.optimizer.learning_rate))


# ------------------------------------------------------------- evaluate's helpers


class _Whole(float):
    """A count that Keras's progress bar prints as a whole number ("step: 279", not
    "step: 279.0000"): the bar divides a stateful value by 1 and formats it with
    `.4f`; both keep the count whole here (pinned by tests/test_keras_private.py)."""

    def __truediv__(self, other: Any) -> _Whole:
        return _Whole(float(self) / other)

    def __format__(self, spec: str) -> str:
        return str(int(self))


class _TrainingBar(seams.StepTimedProgbar):
    """Keras's progress bar, timed from the end of the first step.

    The first optimizer step traces the step function (seconds), and on a progress
    budget the bar counts progress tau, not steps, so Keras's rule for leaving the
    first step out of the time per unit (`current == 1`) never applies: its first ETA
    was the trace's time stretched over the whole budget ("3:05:13"). Here the first
    step is not drawn, and the time per unit is measured from its end.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._pending: tuple[float, list[Any]] | None = None

    def step_done(self, current: float, values: list[Any]) -> None:
        """After each optimizer step: draws it, except the first (kept for `close`)."""
        if self.timed_from is None:
            self.timed_from = (current, time.time())
            self._pending = (current, values)
            return
        self._pending = None
        self.update(current, values)

    def close(self) -> None:
        """Draws the first step if it was the only one."""
        if self._pending is not None:
            current, values = self._pending
            self._pending = None
            self.update(current, values, finalize=True)
