"""Every use of private Keras API in tf_adabatch, in one place.

Keras 3 has no public hooks for what the engine and `attach` need: switching off the
optimizer's internal all-reduce, reading its schedule, telling added losses from weight
regularizers, updating compiled metrics per micro-batch, replacing `fit`'s train
function and epoch enumeration, and saving extra variables with the model. Each seam
below is one small function or class, with what it relies on; every one was checked on
**Keras 3.15.1 with TensorFlow 2.21.0** (the newest versions setup.py allows), and each
is pinned by a test in `tests/test_keras_private.py`, which fails loudly when an
upgrade changes it. Raise the version bounds in setup.py only when that test passes.

No other module of the package imports `keras.src` or touches a private Keras
attribute (`tests/test_keras_private.py::test_private_keras_names_live_in_one_module`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import global_state
from keras.src.losses.loss import unscale_loss_for_distribution
from keras.src.losses.losses import LossFunctionWrapper
from keras.src.saving.keras_saveable import KerasSaveable
from keras.src.trainers.compile_utils import get_metric

__all__ = [
    "AllReduceBypass",
    "RedirectedLearningRateScheduler",
    "RedirectedReduceLROnPlateau",
    "Saveable",
    "StepTimedProgbar",
    "added_losses",
    "epoch_data_adapter",
    "install_fit_hooks",
    "learning_rate_schedule",
    "new_epoch_iterator",
    "optimizer_chain",
    "redirecting_subclass",
    "reducing_loss",
    "register_saveable_type",
    "replace_epoch_enumeration",
    "resolve_metric",
    "symbolic_build",
    "tf_variable",
    "undo_replica_scaling",
    "update_loss_and_metrics",
]

# ----------------------------------------------------------------- optimizer


def optimizer_chain(optimizer: Any) -> list[Any]:
    """The optimizer and the ones it wraps (`LossScaleOptimizer.inner_optimizer`)."""
    chain = [optimizer]
    while getattr(chain[-1], "inner_optimizer", None) is not None:
        chain.append(chain[-1].inner_optimizer)
    return chain


class AllReduceBypass:
    """Makes a Keras optimizer's internal gradient all-reduce the identity, on demand.

    Seam: Keras 3's TF optimizer all-reduces the gradients inside `apply_gradients`
    (`TFOptimizer._backend_update_step` -> `_all_reduce_sum_gradients`). The engine has
    already all-reduced them, so it switches that step off while it applies (`active`
    is flipped around the `strategy.run` call, at trace time). Pinned by
    `test_optimizer_all_reduces_inside_apply_gradients_through_the_private_method` and
    `test_bypass_makes_the_internal_all_reduce_the_identity`.
    """

    def __init__(self, optimizer: keras.optimizers.Optimizer) -> None:
        self.active = False
        for opt in optimizer_chain(optimizer):
            original = getattr(opt, "_all_reduce_sum_gradients", None)
            if original is None:
                raise RuntimeError(
                    "tf_adabatch needs Keras's TF optimizer method "
                    "`_all_reduce_sum_gradients`, which this Keras version "
                    f"({keras.__version__}) does not have. Use a supported Keras "
                    "version (see setup.py)."
                )
            opt._all_reduce_sum_gradients = self._wrap(original)

    def _wrap(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def all_reduce_sum_gradients(grads_and_vars: Any) -> Any:
            if self.active:
                return list(grads_and_vars)
            return original(grads_and_vars)

        return all_reduce_sum_gradients


def learning_rate_schedule(optimizer: Any) -> Any:
    """The schedule (or value) an optimizer keeps as its learning rate.

    Seam: Keras keeps it in the private `_learning_rate` (the public `learning_rate`
    evaluates the schedule). Pinned by
    `test_optimizer_keeps_its_schedule_in_learning_rate_attribute`.
    """
    return getattr(optimizer, "_learning_rate", None)


# --------------------------------------------------------------- model, losses


def added_losses(model: keras.Model, variables: list[Any]) -> list[Any]:
    """The activity / `add_loss` losses of the model's last forward pass.

    Seam: Keras 3 lists `Model.losses` as the model's and its sublayers' added losses
    followed by one loss per regularized trainable weight; the last ones are dropped
    here (the engine applies weight regularizers once per step). Pinned by
    `test_model_losses_list_added_losses_before_weight_regularizers`.
    """
    losses = model.losses
    n_weight = sum(1 for v in variables if getattr(v, "regularizer", None) is not None)
    return list(losses[: len(losses) - n_weight])


def tf_variable(variable: Any) -> Any:
    """The `tf.Variable` behind a Keras variable (itself for a `tf.Variable`).

    Seam: Keras 3's TensorFlow backend keeps it as the variable's `value` (outside an
    autocast scope). Pinned by `test_keras_variables_are_backed_by_a_tf_variable_in_value`.
    """
    if isinstance(variable, tf.Variable):
        return variable
    value = getattr(variable, "value", None)
    if not isinstance(value, tf.Variable):
        raise TypeError(
            f"Expected a Keras or TensorFlow variable backed by a `tf.Variable`. Received: {variable!r}"
        )
    return value


def undo_replica_scaling(loss: Any) -> Any:
    """A `Loss` object's value under a strategy, times the replica count again.

    Seam: a Keras `Loss` divides its reduced value by the replicas in sync;
    `keras.src.losses.loss.unscale_loss_for_distribution` undoes it.
    """
    return unscale_loss_for_distribution(loss)


def reducing_loss(per_example: Any) -> keras.losses.Loss:
    """The Keras `Loss` behind a per-example loss function.

    A `Loss` object's bound `call` gives back the object; a plain function is wrapped
    as `compile` wraps it. Seam: `keras.src.losses.losses.LossFunctionWrapper` (which
    also accepts a scalar return).
    """
    owner = getattr(per_example, "__self__", None)
    if isinstance(owner, keras.losses.Loss):
        return owner
    return LossFunctionWrapper(per_example)


def resolve_metric(spec: Any, y_true: Any, y_pred: Any) -> Any:
    """A metric from a `compile`-style spec, resolved as `compile` does ("accuracy" ->
    the right accuracy for the shapes). Seam: `keras.src.trainers.compile_utils.get_metric`."""
    return get_metric(spec, y_true, y_pred)


def update_loss_and_metrics(
    model: keras.Model, x: Any, y: Any, y_pred: Any, sample_weight: Any
) -> None:
    """Keras's `train_step` metric updates for one batch (replica context).

    Seam: `Model._compute_loss`, the `_loss_tracker` and
    `unscale_loss_for_distribution`, as `TensorFlowTrainer.train_step` uses them. Pinned
    by `test_fit_epoch_iterator_and_metric_pieces_attach_relies_on`.
    """
    loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
    batch = tf.shape(next(v for v in tf.nest.flatten(x) if v is not None))[0]
    model._loss_tracker.update_state(unscale_loss_for_distribution(loss), sample_weight=batch)
    model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)


# ------------------------------------------------------------------------- fit


def install_fit_hooks(
    model: keras.Model,
    *,
    train_function: Callable[[Any], Any],
    make_train_function: Callable[..., Any],
    maybe_symbolic_build: Callable[..., None],
) -> None:
    """Replaces `fit`'s train function and its build-from-a-batch step on one model.

    Seam: `fit` calls `make_train_function` and then `train_function(iterator)` per step,
    and `_maybe_symbolic_build(iterator=epoch_iterator)` with its epoch iterator before
    it makes the callbacks (as does `evaluate`). Pinned by
    `test_fit_builds_through_the_private_symbolic_build_hooks`.
    """
    model.make_train_function = make_train_function
    model.train_function = train_function
    model._maybe_symbolic_build = maybe_symbolic_build


def symbolic_build(model: keras.Model, data_batch: Any) -> None:
    """Builds the model, its compiled metrics and loss from one batch's shapes.

    Seam: `Model._symbolic_build(data_batch=...)`. Pinned as above.
    """
    model._symbolic_build(data_batch=data_batch)


def epoch_data_adapter(epoch_iterator: Any) -> Any:
    """The data adapter of `fit`'s epoch iterator (`batch_size`, `num_batches`,
    `has_partial_batch`, `get_tf_dataset`, `on_epoch_begin/end`). Seam: pinned by
    `test_fit_epoch_iterator_and_metric_pieces_attach_relies_on`."""
    return epoch_iterator.data_adapter


def new_epoch_iterator(epoch_iterator: Any) -> Iterator[Any]:
    """A fresh iterator over the epoch's (distributed) batches. Seam: `_get_iterator`."""
    return iter(epoch_iterator._get_iterator())


def replace_epoch_enumeration(
    epoch_iterator: Any, enumerate_steps: Callable[[], Iterator[Any]]
) -> None:
    """Makes `fit`'s epoch iterator yield `enumerate_steps()` (one item per optimizer
    step) with an unknown number of steps per epoch.

    Seam: `fit` loops over `epoch_iterator._enumerate_iterator()` (items
    `(begin_step, end_step, iterator)`), and `reset` restores `_num_batches` each
    epoch. Pinned by `test_fit_epoch_iterator_and_metric_pieces_attach_relies_on`.
    """
    reset = epoch_iterator.reset

    def reset_unknown_length() -> None:
        reset()
        epoch_iterator._num_batches = None

    epoch_iterator._enumerate_iterator = enumerate_steps
    epoch_iterator.reset = reset_unknown_length


# ---------------------------------------------------------------------- saving


class Saveable(KerasSaveable):
    """Base of an object of ours that Keras's saving walks like a sub-object of a model.

    Seam: the private `KerasSaveable` base (`save_own_variables` /
    `load_own_variables` are called for it) and its `_obj_type`, registered with an
    empty attribute skip set. Subclasses set `OBJ_TYPE`.
    """

    OBJ_TYPE = "TfAdabatchSaveable"

    def _obj_type(self) -> str:
        # Asked right before the skip set is looked up: register it now (again after
        # `clear_session`, which clears Keras's global state).
        register_saveable_type(self.OBJ_TYPE)
        return self.OBJ_TYPE


def register_saveable_type(obj_type: str) -> None:
    """Registers an empty attribute skip set for a `KerasSaveable` type of ours.

    Seam: Keras's saving asks for the attributes to skip per object type (from
    `KerasSaveable._obj_type`) and knows only its own types; the set lives in Keras's
    global state, which `clear_session` clears (so this is called again from
    `_obj_type`). Pinned by
    `test_saving_walks_a_models_keras_saveable_attributes_with_registered_skip_sets`.
    """
    key = f"saving_attr_skiplist_{obj_type}"
    if global_state.get_global_attribute(key, None) is None:
        global_state.set_global_attribute(key, set())


# ------------------------------------------------------- learning-rate callbacks


class RedirectedReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
    """Keras's `ReduceLROnPlateau`, reading and setting `lr_target(optimizer).learning_rate`.

    Relies on: Keras reaches the optimizer's learning rate only in
    `_reduce_optimizer_lr(optimizer, epoch, name)`, called with `model.optimizer`.
    """

    def lr_target(self, optimizer: Any) -> Any:
        """What to read and set `learning_rate` on (default: the optimizer)."""
        return optimizer

    def _reduce_optimizer_lr(self, optimizer: Any, epoch: int, name: str = "") -> bool:
        return bool(super()._reduce_optimizer_lr(self.lr_target(optimizer), epoch, name))


class RedirectedLearningRateScheduler(keras.callbacks.LearningRateScheduler):
    """Keras's `LearningRateScheduler`, reading and setting `lr_target(optimizer).learning_rate`.

    Relies on: Keras reaches the optimizer's learning rate only in
    `_update_optimizer_lr(optimizer, epoch)`, called with `model.optimizer`.
    """

    def lr_target(self, optimizer: Any) -> Any:
        """What to read and set `learning_rate` on (default: the optimizer)."""
        return optimizer

    def _update_optimizer_lr(self, optimizer: Any, epoch: int) -> Any:
        return super()._update_optimizer_lr(self.lr_target(optimizer), epoch)


def redirecting_subclass(cls: Any, lr_target: Callable[[Any], Any]) -> type | None:
    """A subclass of `cls` (a user's subclass of Keras's `ReduceLROnPlateau` or
    `LearningRateScheduler`) whose learning-rate access goes to `lr_target(optimizer)`;
    None if `cls` is neither (same reliance as the Redirected classes)."""
    attrs: dict[str, Any] = {}
    if issubclass(cls, keras.callbacks.ReduceLROnPlateau):

        def reduce(self: Any, optimizer: Any, epoch: int, name: str = "") -> bool:
            return bool(cls._reduce_optimizer_lr(self, lr_target(optimizer), epoch, name))

        attrs["_reduce_optimizer_lr"] = reduce
    if issubclass(cls, keras.callbacks.LearningRateScheduler):

        def update(self: Any, optimizer: Any, epoch: int) -> Any:
            return cls._update_optimizer_lr(self, lr_target(optimizer), epoch)

        attrs["_update_optimizer_lr"] = update
    return type(cls.__name__, (cls,), attrs) if attrs else None


# ------------------------------------------------------------------ progress bar


class StepTimedProgbar(keras.utils.Progbar):
    """Keras's progress bar whose time per unit is measured from `timed_from` on.

    Relies on: `Progbar.update` takes its time per unit (shown, and behind the ETA)
    from `_estimate_step_duration(current, now)`.
    """

    timed_from: tuple[float, float] | None = None  # (current, time) where timing starts

    def _estimate_step_duration(self, current: float, now: float) -> float:
        start = self.timed_from
        if start is None or current <= start[0]:
            return 0.0
        return (now - start[1]) / (current - start[0])
