"""`attach`: the adaptive engine behind `model.fit`.

A user keeps `model.compile(...)` and `model.fit(...)`; `attach` replaces the model's
train function with the engine's step (the same one `tf_adabatch.Trainer` runs). One
call of the train function is one optimizer step: it consumes k micro-batches per
replica, so a Keras "step" (progress bar, `on_train_batch_end`) is an optimizer step,
and an epoch over a finite dataset is one pass over it in optimizer steps.
"""

from __future__ import annotations

import functools
import inspect
import math
import warnings
from typing import Any

import keras
import numpy as np
import tensorflow as tf
from typing_extensions import Unpack

from tf_adabatch import _keras_seams as seams
from tf_adabatch import lr_callbacks
from tf_adabatch.engine import AdaptiveEngine
from tf_adabatch.options import EngineOptions, resolve_options
from tf_adabatch.policies import StaticPolicy

__all__ = ["LOGGED_KEYS", "attach", "load_model", "track_adaptive_state"]

# The engine's values that `fit` shows in the progress bar and History, beside the
# compiled loss and metrics (running epoch means, as in plain Keras): the adaptive
# values and the count of skipped (non-finite) steps. The others (noise_scale,
# grad_sqr, ..., and the bookkeeping: step, applied, consecutive_skips) are read by
# `AdaBatchTensorBoard` from the engine, not from the logs.
LOGGED_KEYS = ("batch_size", "gain", "similarity", "learning_rate", "progress", "skipped_steps")


def attach(
    model: keras.Model,
    **options: Unpack[EngineOptions],
) -> AdaptiveEngine:
    """Makes `model.fit` train with an adaptive batch size and the AdaScale statistics.

    Call it once, after `model.compile(optimizer, loss, metrics=...)`, with the model
    and optimizer created in the strategy's scope. Then `fit` works as usual, with:

    - Input: numpy arrays with `batch_size` = the *global micro-batch* replicas x
      `micro_batch_size` (a partial last batch is dropped), or a `tf.data.Dataset`
      batched with it (`drop_remainder=True`). Anything else is refused.
    - Epochs: over a finite input, one epoch is one pass over it, in optimizer steps
      of k micro-batches (the micro-batches left over at the end, fewer than k, are
      dropped); the bar counts optimizer steps. With a repeated dataset, pass
      `steps_per_epoch` in optimizer steps.
    - Logs (bar, callbacks, History): `loss` and the compiled metrics as running
      means over the epoch's micro-batches, updated from each micro-batch's
      predictions (as plain Keras does per batch), and `LOGGED_KEYS` of the last
      optimizer step: the adaptive values (batch_size, gain, similarity,
      learning_rate, progress) and `skipped_steps`, the steps skipped so far.
      Validation, `evaluate` and `predict` are Keras's own.
    - A skipped step (non-finite gradients, or a non-finite update rolled back):
      weights, optimizer and metrics stay as they were, and its logs' `loss` is the
      loss it saw (NaN or inf when that broke the gradients; finite on a loss-scale
      overflow, as stock Keras shows it), or NaN when its update was not finite
      (stock Keras would have applied it and seen NaN next): an epoch that ends
      skipping shows `loss: nan` as stock Keras does, and
      `keras.callbacks.TerminateOnNaN` stops `fit`. The first skip warns once
      (`UserWarning`: the step and its cause).
    - `steps_per_execution=N` (in `compile`): N optimizer steps per call of the train
      function, in a loop on the device (`AdaptiveEngine.train_steps`); callbacks and
      the bar act at block ends, as Keras does. A block stops early where an epoch's
      micro-batches run out and after the step that reaches a `ProgressBudget`.

    Args:
      model: a compiled, built Keras model with a single loss, not attached yet.
      **options: the engine's options, `tf_adabatch.EngineOptions`, as for
        `tf_adabatch.Trainer` (`micro_batch_size` required; similarity "auto": exact
        with two or more replicas, estimated with one).

    Returns:
      The engine. Its `state` and `policy` (batch size, gain, progress, moving
      averages, counters, the policy's state) are saved and restored with the model by
      Keras: `model.save_weights` / `load_weights`, `model.save` and
      `keras.callbacks.BackupAndRestore` (so an interrupted `fit` resumes with the
      adapted batch, not the initial one).

    Raises:
      ValueError: if the model is not compiled, has several losses or is attached
        already; later,
        if the model is compiled again (the engine keeps the first optimizer and
        loss) or `fit` gets a batch size other than the global micro-batch.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    >>> engine = attach(model, micro_batch_size=8, policy=tf_adabatch.StaticPolicy(16))
    >>> x = np.random.default_rng(0).normal(size=(80, 3)).astype("float32")
    >>> history = model.fit(x, x.sum(1), batch_size=8, epochs=2, verbose=0)
    >>> sorted(history.history)
    ['batch_size', 'gain', 'learning_rate', 'loss', 'mae', 'progress', 'similarity', 'skipped_steps']
    >>> history.history["batch_size"], int(engine.state.steps)  # 10 micro-batches, k = 2
    ([16.0, 16.0], 10)
    """
    resolve_options(options, caller="attach")
    if not isinstance(model, keras.Model):
        raise ValueError(f"Argument `model` must be a `keras.Model`. Received: model={model!r}")
    if getattr(model, "_adabatch_engine", None) is not None:
        raise ValueError(
            "Argument `model` is attached to tf_adabatch already; attach a model once. "
            f"Received: model={model.name!r} (attached)"
        )
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ValueError(
            "Argument `model` must be compiled first: call `model.compile(optimizer=..., loss=...)`."
        )
    loss = model.loss
    if isinstance(loss, (list, tuple, dict)):
        raise ValueError(
            "Argument `model` must be compiled with a single loss; tf_adabatch does not "
            f"support several outputs' losses yet. Received: loss={loss!r}"
        )
    strategy = model.distribute_strategy
    engine = AdaptiveEngine(
        model,
        loss=loss,
        optimizer=model.optimizer,
        strategy=strategy,
        **options,
    )
    binding = _FitBinding(model, engine)
    engine.micro_step_hook = binding.update_metrics
    seams.install_fit_hooks(
        model,
        train_function=binding.train_function,
        make_train_function=binding.make_train_function,
        maybe_symbolic_build=binding.maybe_symbolic_build,
    )
    model.fit = binding.wrap_fit(model.fit)
    model.compile = binding.refuse_compile
    model._adabatch_engine = engine  # keep it alive and findable from the model
    model._adabatch_fit = binding
    track_adaptive_state(model, engine)
    return engine


def track_adaptive_state(model: keras.Model, engine: AdaptiveEngine) -> None:
    """Makes Keras's saves of `model` (save_weights, save, BackupAndRestore) include the
    engine's adaptive state, and `load_weights` restore it (`attach` and `Trainer` call it).

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> trainer = tf_adabatch.Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                               micro_batch_size=4)  # calls it
    >>> model._adabatch_state.name
    'adabatch_state'
    """
    model._adabatch_state = _AdaptiveStateSaveable(engine)


def load_model(
    filepath: str,
    *,
    custom_objects: dict[str, Any] | None = None,
    safe_mode: bool = True,
    **options: Unpack[EngineOptions],
) -> tuple[keras.Model, AdaptiveEngine]:
    """Loads a `.keras` model saved under `attach` and continues it: model, engine, state.

    `keras.models.load_model` restores the model, its compiled loss, metrics and
    optimizer, but not the adaptive state (Keras does not know the engine); this calls
    it, attaches the engine with `options`, then restores the adaptive state from the
    same file (`model.load_weights(filepath)`): `fit` goes on with the saved batch size,
    gain, progress tau, moving averages and policy state. Call it in the strategy's
    scope when you train under one. A file saved without the state (a plain Keras
    model) loads with a new state, as `attach` alone would.

    Args:
      filepath: a `.keras` file written by `model.save` (the model attached).
      custom_objects, safe_mode: as for `keras.models.load_model`.
      **options: the engine's options, as for `attach` (`micro_batch_size` required;
        the same policy type as when it was saved).

    Returns:
      `(model, engine)`, as `keras.models.load_model` and `attach` return them.

    Raises:
      ValueError: as `attach`, or if the saved state belongs to another policy type.

    Example:

    >>> import os, tempfile
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05)),
    ...               loss="mse")
    >>> engine = attach(model, micro_batch_size=8)
    >>> x = np.random.default_rng(0).normal(size=(64, 3)).astype("float32")
    >>> _ = model.fit(x, x.sum(1), batch_size=8, verbose=0)
    >>> path = os.path.join(tempfile.mkdtemp(), "model.keras")
    >>> model.save(path)
    >>> model, engine = load_model(path, micro_batch_size=8)
    >>> float(engine.state.progress), int(model.optimizer.iterations)  # 8 steps at S = 1
    (8.0, 8)
    """
    model = keras.models.load_model(filepath, custom_objects=custom_objects, safe_mode=safe_mode)
    engine = attach(model, **options)
    model.load_weights(filepath)
    return model, engine


def attached_engine(model: keras.Model | None, user: str) -> AdaptiveEngine:
    """The engine `attach` put behind `model`, or a clear error naming `user`."""
    engine = getattr(model, "_adabatch_engine", None)
    if engine is None:
        name = getattr(model, "name", None)
        raise ValueError(
            f"`{user}` needs a model prepared by `tf_adabatch.attach(model, ...)` (with "
            "`tf_adabatch.Trainer`, use `Trainer.fit(until_progress=..., "
            f"summary_dir=...)` instead). Received: model={name!r} (not attached)"
        )
    return engine


def last_step_logs(model: keras.Model) -> dict[str, tf.Tensor]:
    """All the engine's logs of the last optimizer step `fit` ran (empty before)."""
    binding = getattr(model, "_adabatch_fit", None)
    return binding.step_logs if binding is not None else {}


def block_logs(model: keras.Model) -> dict[str, np.ndarray]:
    """Every step's logs of the last call of `fit`'s train function (empty before)."""
    binding = getattr(model, "_adabatch_fit", None)
    return binding.block_logs if binding is not None else {}


class _FitBinding:
    """What `attach` puts in a model: train function, metric updates, epochs, checks.

    Keras has no public hooks for these: they go through the seams of
    `tf_adabatch._keras_seams` (`install_fit_hooks`, `symbolic_build`, the epoch
    iterator's pieces, `update_loss_and_metrics`).
    """

    def __init__(self, model: keras.Model, engine: AdaptiveEngine) -> None:
        self.model = model
        self.engine = engine
        self.step_logs: dict[str, Any] = {}  # the last step's
        self.block_logs: dict[str, np.ndarray] = {}  # every step of the last call's
        self.plan: tuple[int, int | None] = (1, None)  # steps, micro-batches of a call
        self.budget: float | None = None  # a ProgressBudget's, during fit
        self._expect_train_iterator = False
        self._metrics_result: Any = None
        self._warned_skip = False

    # ------------------------------------------------------------ train function

    def make_train_function(self, force: bool = False) -> Any:
        self.model.train_function = self.train_function
        return self.train_function

    def train_function(self, iterator: Any) -> dict[str, Any]:
        """One call: one step, or (`steps_per_execution` > 1) up to `plan`'s steps and
        micro-batches, ending on the step that reaches a `ProgressBudget`'s budget."""
        steps, micro = self.plan  # (1, ...) unless steps_per_execution > 1
        logs = self.engine.train_steps(
            iterator, steps, until_progress=self.budget, micro_batches=micro
        )
        self.block_logs = logs
        self.step_logs = {name: column[-1] for name, column in logs.items()}
        if self._metrics_result is None:
            # Metric variables are per replica (ON_READ, SUM): read in cross-replica
            # context, they hold the all-replica totals.
            self._metrics_result = tf.function(self.model.get_metrics_result)
        out = dict(self._metrics_result())
        out.update({name: self.step_logs[name] for name in LOGGED_KEYS})
        applied = logs["applied"]
        if not applied.all():
            self._warn_first_skip(logs)
        if not applied[-1]:
            # The metrics hold the applied steps only (the skip restored them); the
            # step's own loss tells the callbacks (TerminateOnNaN) and History: the
            # loss it saw (finite for a loss-scale overflow, as in stock Keras), NaN
            # for an update that was not finite (stock Keras would apply it and see
            # NaN next).
            lost = getattr(logs, "update_not_finite", np.zeros(len(applied), bool))
            out["loss"] = math.nan if lost[-1] else float(logs["loss"][-1])
        return out

    def _warn_first_skip(self, logs: dict[str, np.ndarray]) -> None:
        """Warns once per attached model, at its first skipped step: which, and why."""
        if self._warned_skip:
            return
        self._warned_skip = True
        first = int(np.flatnonzero(logs["applied"] == 0)[0])
        update = getattr(logs, "update_not_finite", np.zeros(len(logs["applied"]), bool))
        loss = float(logs["loss"][first])
        if update[first]:
            cause = (
                "its gradients were finite but its update was not (NaN or inf in a weight "
                "or an optimizer variable; rolled back): the learning rate may be too high"
            )
        elif math.isfinite(loss):
            cause = f"its gradients were not finite (NaN or inf; its loss, {loss:.4g}, was)"
        else:
            cause = f"its loss was {loss} and its gradients were not finite"
        limit = self.engine.max_consecutive_skips
        stop = (
            f"fit stops after {limit} skipped in a row (`max_consecutive_skips`)"
            if limit is not None
            else "fit does not stop on skips (`max_consecutive_skips=None`)"
        )
        warnings.warn(
            f"Optimizer step {int(logs['step'][first])} was skipped: {cause}. The weights, "
            "optimizer and adaptive state are those of the step before. The logs show the "
            f"loss it saw (NaN for a lost update) and count the skips in `skipped_steps`; "
            f"{stop}. "
            "(Warned once.)",
            UserWarning,
            stacklevel=2,
        )

    def update_metrics(self, x: Any, y: Any, y_pred: Any, sample_weight: Any) -> None:
        """Keras's `train_step` metric updates for one micro-batch (replica context)."""
        seams.update_loss_and_metrics(self.model, x, y, y_pred, sample_weight)

    # -------------------------------------------------------- fit and its epochs

    def wrap_fit(self, fit: Any) -> Any:
        signature = inspect.signature(fit)

        @functools.wraps(fit)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            arguments = signature.bind(*args, **kwargs).arguments
            callbacks = arguments.get("callbacks")
            if arguments.get("verbose", "auto") != 0 and not isinstance(
                callbacks, keras.callbacks.CallbackList
            ):
                callbacks = list(callbacks or [])
                if not any(isinstance(c, keras.callbacks.ProgbarLogger) for c in callbacks):
                    # Keras uses a ProgbarLogger found among the callbacks instead of
                    # adding its own.
                    kwargs = {**arguments, "callbacks": [*callbacks, _OptimizerStepBar()]}
                    args = ()
            self._expect_train_iterator = True
            self._checked_state = False
            given = arguments.get("callbacks")
            if isinstance(given, keras.callbacks.CallbackList):
                given = given.callbacks
            # A block of steps ends on the step that reaches a ProgressBudget's budget.
            budgets = [c.base_steps for c in given or [] if isinstance(c, ProgressBudgetLike)]
            self.budget = min(budgets) if budgets else None
            try:
                # Keras's ReduceLROnPlateau / LearningRateScheduler set the base rate
                # of an AdaptiveLearningRate (Keras's own would raise a TypeError).
                with lr_callbacks.redirected(given):
                    return fit(*args, **kwargs)
            finally:
                self._expect_train_iterator = False
                self.budget, self.plan = None, (1, None)

        return wrapped

    def refuse_compile(self, *args: Any, **kwargs: Any) -> None:
        raise ValueError(
            "This model is attached to tf_adabatch, whose engine keeps the optimizer and "
            "loss of the `compile` before `attach`; compiling again would silently train "
            "with the old ones. Compile before `attach`, or build a new model, compile "
            "and attach it (`load_weights` carries the weights and the adaptive state). "
            f"Received: model.compile(...) on attached model {self.model.name!r}"
        )

    def maybe_symbolic_build(self, iterator: Any = None, data_batch: Any = None) -> None:
        """Builds the model, its compiled metrics and loss from one batch's shapes.

        Keras skips this without a strategy scope and builds the metrics while tracing
        its own train step instead; the engine's step must not create variables, so
        it always runs here. It takes the first local replica's batch (Keras reduces
        the replicas' batches, which fails under MultiWorkerMirroredStrategy:
        keras-team/keras#20585). During `fit`, the first call gets fit's epoch
        iterator, which is checked and made to count optimizer steps.
        """
        strategy = self.engine.strategy
        if iterator is not None:
            for it in seams.epoch_iterators(iterator):
                batch = next(it)
                data_batch = tf.nest.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    batch,
                )
                break
            if self._expect_train_iterator:
                self._expect_train_iterator = False
                self._adapt_epochs(iterator)
        with strategy.scope():
            seams.symbolic_build(self.model, data_batch)

    def _largest_k(self) -> int | None:
        """The largest k the policy may choose next (None: no bound known)."""
        engine = self.engine
        if isinstance(engine.policy, StaticPolicy):
            return engine.accumulation_steps
        top = getattr(engine.policy, "max_batch_size", None)
        return max(engine.accumulation_steps, -(-int(top) // engine.batch_unit)) if top else None

    def _blocks_of_fixed_epochs(self, epoch_iterator: Any, per_call: int) -> None:
        """`steps_per_epoch` optimizer steps an epoch, `per_call` at a time, over one
        iterator kept across epochs (Keras's own rule for a given `steps_per_epoch`)."""
        total = epoch_iterator.steps_per_epoch
        adapter = seams.epoch_data_adapter(epoch_iterator)
        held: list[Any] = []

        def enumerate_blocks() -> Any:
            adapter.on_epoch_begin()
            if not held:
                held.append(seams.new_epoch_iterator(epoch_iterator))
            step = 0
            while step < total:
                n = min(per_call, total - step)
                self.plan = (n, None)
                yield step, step + n - 1, held[0]
                step += len(self.block_logs["step"])
            adapter.on_epoch_end()

        seams.replace_epoch_enumeration(epoch_iterator, enumerate_blocks)

    def _adapt_epochs(self, epoch_iterator: Any) -> None:
        engine = self.engine
        unit = engine.num_replicas * engine.micro_batch_size
        adapter = seams.epoch_data_adapter(epoch_iterator)
        kind = type(adapter).__name__
        batch = adapter.batch_size
        rule = (
            f"the global micro-batch replicas x micro_batch_size = {engine.num_replicas} x "
            f"{engine.micro_batch_size} = {unit}"
        )
        if kind == "ArrayDataAdapter" and batch != unit:
            raise ValueError(
                f"Argument `batch_size` of `fit` must be {rule} after `tf_adabatch.attach` "
                "(one optimizer step takes k such micro-batches). "
                f"Received: batch_size={batch}"
            )
        dataset = adapter.get_tf_dataset() if kind == "TFDatasetAdapter" else None
        if isinstance(dataset, tf.data.Dataset) and batch != unit:
            raise ValueError(
                f"The `fit` dataset's batch dimension must be {rule}, static, after "
                f"`tf_adabatch.attach`: batch it with `.batch({unit}, drop_remainder=True)`. "
                f"Received: batch dimension {batch}"
            )
        per_call = int(self.model.steps_per_execution)
        if epoch_iterator.steps_per_epoch:
            if per_call > 1:
                self._blocks_of_fixed_epochs(epoch_iterator, per_call)
            return  # one step per call: Keras's own loop, `steps_per_epoch` steps.
        usable = adapter.num_batches
        if usable is not None and adapter.has_partial_batch:
            usable -= 1  # a partial last micro-batch would skew the statistics

        def enumerate_optimizer_steps() -> Any:
            adapter.on_epoch_begin()
            iterator = seams.new_epoch_iterator(epoch_iterator)
            used = step = 0
            while usable is None or used + engine.accumulation_steps <= usable:
                # A block that surely fits in what is left (with the policy's largest
                # k), so that Keras is told its true last step; at least one step.
                n = per_call
                k_max = self._largest_k()
                if usable is not None and k_max is not None:
                    n = max(1, min(per_call, (usable - used) // k_max))
                self.plan = (n, None if usable is None else usable - used)
                yield step, step + n - 1, iterator
                used += int(self.block_logs["accumulation_steps"].sum())
                step += len(self.block_logs["step"])
            if step == 0:
                raise ValueError(
                    f"The `fit` data must hold at least one optimizer step of k = "
                    f"{engine.accumulation_steps} micro-batches of {unit} examples. "
                    f"Received: {usable} micro-batches"
                )
            adapter.on_epoch_end()

        # Optimizer steps per epoch: not known in advance.
        seams.replace_epoch_enumeration(epoch_iterator, enumerate_optimizer_steps)


class ProgressBudgetLike:
    """Marks a callback whose `base_steps` budget a block of steps must stop at
    (`tf_adabatch.callbacks.ProgressBudget`)."""

    base_steps: float


class _AdaptiveStateSaveable(seams.Saveable):
    """The engine's state and policy variables as one Keras-saveable object.

    `attach` sets it as an attribute of the model, so Keras's own saving walks it like
    any sub-object of the model: `model.save_weights`, `model.save` (.keras) and
    `keras.callbacks.BackupAndRestore` store the adaptive state under the path
    `_adabatch_state`, and `load_weights` restores it into an attached model. A model
    without the state (not attached) ignores that entry when it loads such a file, and
    an attached model loading a file without it keeps its current state.

    Keras has no public hook for this: it relies on saving walking a model's
    attributes and on the seam `tf_adabatch._keras_seams.Saveable` (pinned by
    tests/test_keras_private.py and the round trips in tests/test_fit.py).
    """

    OBJ_TYPE = "AdaBatchState"

    def __init__(self, engine: AdaptiveEngine) -> None:
        self.name = "adabatch_state"
        self._engine = engine

        def variables() -> dict[str, tf.Variable]:
            # Keys "state.<name>", "policy.<name>", "carried.<i>".
            out = {}
            for name, part in engine.adaptive_state().items():
                if name == "carried":
                    out.update({f"carried.{i}": v for i, v in enumerate(part)})
                else:
                    out.update({f"{name}.{_key(v)}": v for v in part.variables})
            return out

        self._get_variables = variables

    def save_own_variables(self, store: Any) -> None:
        for key, variable in self._get_variables().items():
            store[key] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        saved = set(store.keys())
        if not saved:
            return  # a file saved without the adaptive state
        variables = self._get_variables()
        # The differenced estimator's previous gradient ("carried", one replica with
        # estimated similarity) exists on one side only after a change of replicas; it
        # is not carried over then (`carry_batch_over` restarts the estimator). The base
        # rate's multiplier ("lr") is absent from files saved before it existed, or
        # without an `AdaptiveLearningRate`: it stays as it is.
        optional = ("carried.", "lr.")
        required = {k for k in variables if not k.startswith(optional)}
        known = {k for k in saved if not k.startswith(optional)}
        if known != required:
            raise ValueError(
                "The saved adaptive state does not fit this engine and policy: missing "
                f"{sorted(required - known)}, unexpected {sorted(known - required)}. "
                "Load it with the same policy type it was saved with."
            )
        for key, variable in variables.items():
            if key in saved:
                variable.assign(store[key])
        moved = self._engine.carry_batch_over()  # saved with another replica count
        if moved:
            warnings.warn(moved, stacklevel=2)


class _OptimizerStepBar(keras.callbacks.ProgbarLogger):
    """Keras's progress bar, with a target of optimizer steps or none.

    Over a finite input the number of optimizer steps of an epoch is not known in
    advance (k adapts); Keras's bar would keep the first epoch's count as the target
    of the next ones. Here an epoch without `steps_per_epoch` starts with an unknown
    target and ends at the steps it ran.
    """

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        self._steps = params["steps"]

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.target = self._steps
        super().on_epoch_begin(epoch, logs)


def _key(variable: tf.Variable) -> str:
    """A variable's name without scopes and suffix, e.g. `steps` (an H5 dataset name)."""
    return variable.name.split("/")[-1].split(":")[0]
