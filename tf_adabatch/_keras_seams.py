"""Every use of private Keras API in tf_adabatch, in one place.

Keras 3 has no public hooks for what the engine and `attach` need: switching off the
optimizer's internal all-reduce, reading its schedule, telling added losses from weight
regularizers, updating compiled metrics per micro-batch, replacing `fit`'s train
function and epoch enumeration, and saving extra variables with the model. Each seam
below is one small function or class, with what it relies on; every one was checked on
**Keras 3.15.1 with TensorFlow 2.21.0** (the newest versions setup.py allows) and on
the floor and a middle pair of `.ci/version_matrix.sh` (docs/versions.md), and each
is pinned by a test in `tests/test_keras_private.py`, which fails loudly when an
upgrade changes it. Raise the version bounds in setup.py only when that test passes.

No other module of the package imports `keras.src` or touches a private Keras
attribute (`tests/test_keras_private.py::test_private_keras_names_live_in_one_module`).

Keras 3.10 to 3.15 differ in four behaviours the package meets; each is told apart here
by a feature test of the installed Keras (a small probe of the behaviour, never its
version number), and handled here alone:

- fit's epoch iterator yields `(step, iterator)` before Keras 3.11 and
  `(begin_step, end_step, iterator)` from 3.11 on (`epoch_items_are_triples`);
- a layer's activity-regularizer loss is summed over the batch before Keras 3.14 and
  divided by the batch size from 3.14 on (`activity_losses_are_batch_means`): the
  engine refuses activity regularizers on the older behaviour (see `added_losses`);
- `ReduceLROnPlateau` / `LearningRateScheduler` reach the optimizer through an
  overridable method only from Keras 3.15 (`lr_callbacks_redirectable`): before, their
  epoch hook is shown a model whose `optimizer` is the target (`redirect_epoch_hook`);
- the progress bar keeps a stateful value's own formatting (`step: 279`) only from
  Keras 3.13 on (`progbar_keeps_value_format`); before, `StepTimedProgbar` keeps it.

Each probe's answer is pinned by a test in `tests/test_keras_private.py` that names the
Keras versions it expects, so a Keras that differs fails there first.

Keras 3.8 and 3.9 are not supported: their metric variables are mirrored (written by
each replica) rather than per replica (`synchronization="on_read"`, Keras >= 3.10), and
under a strategy of more than one replica Keras's own `fit` reports wrong losses and
metrics there (`Mean`'s count grows by the replicas' summed new values at each update;
seen on 3.8: a loss of 2.80 for a true 4.07, NaN after a few hundred updates). Keras
before 3.8 lacks `unscale_loss_for_distribution`.
"""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from typing import Any

import keras
import numpy as np
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
    "activity_losses_are_batch_means",
    "added_losses",
    "epoch_data_adapter",
    "epoch_items_are_triples",
    "epoch_iterators",
    "install_fit_hooks",
    "learning_rate_schedule",
    "lr_callbacks_redirectable",
    "new_epoch_iterator",
    "optimizer_chain",
    "progbar_keeps_value_format",
    "redirect_epoch_hook",
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


def _needs_keras(feature: str, version: str, why: str) -> RuntimeError:
    """The error for a feature the installed Keras cannot give, naming the version that
    can. A plain `RuntimeError`: raised while a step is traced, autograph re-raises
    only built-in types as they are (a subclass would arrive as a `StagingError`)."""
    return RuntimeError(
        f"{feature} needs Keras >= {version}: {why} Upgrade Keras "
        f"(`pip install 'keras>={version}'`). Received: keras.__version__={keras.__version__!r}"
    )


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


@functools.cache
def activity_losses_are_batch_means() -> bool:
    """Whether a layer's activity-regularizer loss is divided by the batch size (Keras
    >= 3.14) rather than summed over the batch (Keras 3.8 - 3.13).

    A feature test: an L1(1) activity regularizer on an identity layer over a batch of
    two ones. Pinned by `test_activity_regularizer_loss_scaling_is_what_the_probe_says`.
    """
    with tf.init_scope():  # eager, also when first asked while a step is traced
        layer = keras.layers.Identity(activity_regularizer=keras.regularizers.L1(1.0))
        layer(np.ones((2, 1), "float32"))
        value = float(keras.ops.convert_to_numpy(layer.losses[0]))
    if value not in (1.0, 2.0):
        raise RuntimeError(
            "tf_adabatch does not know this Keras's activity-regularizer scaling "
            f"(L1(1) over a batch of two ones gave {value}, expected 1 or 2). "
            f"Received: keras.__version__={keras.__version__!r}"
        )
    return value == 1.0


def added_losses(model: keras.Model, variables: list[Any]) -> list[Any]:
    """The activity / `add_loss` losses of the model's last forward pass.

    Seam: Keras 3 lists `Model.losses` as the model's and its sublayers' added losses
    followed by one loss per regularized trainable weight; the last ones are dropped
    here (the engine applies weight regularizers once per step). Pinned by
    `test_model_losses_list_added_losses_before_weight_regularizers`.

    Activity regularizers: the engine adds these losses per micro-batch and averages
    over a step's micro-batches, which equals one device's large batch exactly when a
    layer's activity loss is a per-example mean (Keras >= 3.14). Before Keras 3.14 it
    is a sum over the batch, so the one-device reference itself would weigh the
    regularizer by the batch size, and under an adaptive batch its strength would
    change with every batch decision; the engine cannot tell those losses apart from
    other `add_loss` losses there to rescale them. So on such a Keras a model with an
    activity regularizer is refused (`RuntimeError`, raised while the step is
    traced, before any update) instead of trained differently.

    Raises:
        RuntimeError: a layer has an activity regularizer and Keras sums
            activity losses over the batch (before 3.14).
    """
    if not activity_losses_are_batch_means():
        regularized = [
            layer.name
            for layer in model._flatten_layers(include_self=True)
            if getattr(layer, "activity_regularizer", None) is not None
        ]
        if regularized:
            raise _needs_keras(
                f"An activity regularizer (on layer {regularized[0]!r}) under tf_adabatch",
                "3.14",
                "before it, Keras sums a layer's activity loss over the batch instead of "
                "averaging it, so its weight would follow the adaptive batch size.",
            )
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


@functools.cache
def epoch_items_are_triples() -> bool:
    """Whether fit's epoch iterator yields `(begin_step, end_step, iterator)` (Keras >=
    3.11) rather than `(step, iterator)` (Keras 3.8 - 3.10); fit unpacks what it yields.

    A feature test on a two-example `EpochIterator`. Pinned by
    `test_epoch_iterator_items_are_what_the_probe_says_and_fit_unpacks_them`.
    """
    from keras.src.trainers.epoch_iterator import EpochIterator

    probe = EpochIterator(x=np.zeros((2, 1), "float32"), batch_size=1)
    item = next(iter(probe._enumerate_iterator()))
    if len(item) not in (2, 3):
        raise RuntimeError(
            "tf_adabatch does not know this Keras's epoch iterator: it yields items of "
            f"{len(item)} parts (expected 2 or 3). Received: keras.__version__={keras.__version__!r}"
        )
    return len(item) == 3


def epoch_iterators(epoch_iterator: Any) -> Iterator[Any]:
    """The data iterators of fit's epoch iterator, one per item it yields (the last
    part of a pair or a triple, see `epoch_items_are_triples`)."""
    for item in epoch_iterator:
        yield item[-1]


def new_epoch_iterator(epoch_iterator: Any) -> Iterator[Any]:
    """A fresh iterator over the epoch's (distributed) batches. Seam: `_get_iterator`."""
    return iter(epoch_iterator._get_iterator())


def replace_epoch_enumeration(
    epoch_iterator: Any, enumerate_steps: Callable[[], Iterator[Any]]
) -> None:
    """Makes `fit`'s epoch iterator yield `enumerate_steps()` (one item per call of the
    train function, `(begin_step, end_step, iterator)`) with an unknown number of
    steps per epoch.

    Seam: `fit` loops over `epoch_iterator._enumerate_iterator()`, and `reset` restores
    `_num_batches` each epoch. Keras 3.11 on unpacks `(begin_step, end_step, iterator)`
    and tells the callbacks the begin step at a batch's begin and the end step at its
    end; before 3.11 fit unpacks `(step, iterator)` and gives that one step to both, so
    there the items become `(end_step, iterator)`: the step a call ends on, which is
    what the progress bar and `on_train_batch_end` count (`epoch_items_are_triples`).
    Pinned by `test_fit_epoch_iterator_and_metric_pieces_attach_relies_on` and
    `test_epoch_iterator_items_are_what_the_probe_says_and_fit_unpacks_them`.
    """
    reset = epoch_iterator.reset

    def reset_unknown_length() -> None:
        reset()
        epoch_iterator._num_batches = None

    def as_pairs() -> Iterator[tuple[int, Any]]:
        for _, end_step, iterator in enumerate_steps():
            yield end_step, iterator

    triples = epoch_items_are_triples()
    epoch_iterator._enumerate_iterator = enumerate_steps if triples else as_pairs
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


@functools.cache
def lr_callbacks_redirectable() -> bool:
    """Whether Keras's `ReduceLROnPlateau` and `LearningRateScheduler` reach the
    optimizer's learning rate through `_reduce_optimizer_lr` / `_update_optimizer_lr`
    (Keras >= 3.15), which the classes below override. Before 3.15 they read and set
    `self.model.optimizer.learning_rate` inline in `on_epoch_end` / `on_epoch_begin`,
    and the classes below show those hooks a model whose `optimizer` is the target
    instead (`redirect_epoch_hook`).

    A feature test (the methods exist). Pinned by
    `test_keras_learning_rate_callbacks_reach_the_optimizer_only_through_the_private_methods`
    and `test_keras_learning_rate_callbacks_before_3_15_set_the_optimizer_inline`.
    """
    return hasattr(keras.callbacks.ReduceLROnPlateau, "_reduce_optimizer_lr") and hasattr(
        keras.callbacks.LearningRateScheduler, "_update_optimizer_lr"
    )


class _ModelWithLrTarget:
    """A model as a learning-rate callback of Keras < 3.15 sees it in its epoch hook:
    `optimizer` is the redirection's target, everything else the model's."""

    def __init__(self, model: Any, target: Any) -> None:
        self.__dict__.update(_model=model, optimizer=target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["_model"], name)


def redirect_epoch_hook(
    callback: Any,
    hook: Callable[[int, Any], Any],
    lr_target: Callable[[Any], Any],
    epoch: int,
    logs: Any,
    *,
    logs_rate: bool,
) -> None:
    """Runs a learning-rate callback's epoch hook with its learning-rate access
    redirected to `lr_target(model.optimizer)`, on a Keras without the methods.

    Keras >= 3.15 (`lr_callbacks_redirectable`): the hook as it is (it calls the
    overridden method). Before: the hook sees a model whose `optimizer` is the target
    (set with the public `Callback.set_model`, the model put back after), which is all
    these hooks touch; and where the hook also logs `learning_rate` (`logs_rate`), the
    optimizer's own rate is logged, as Keras >= 3.15 does. Nothing to redirect (the
    target is the optimizer): the hook as it is.
    """
    model = callback.model
    optimizer = getattr(model, "optimizer", None)
    if lr_callbacks_redirectable() or optimizer is None:
        hook(epoch, logs)
        return
    target = lr_target(optimizer)
    if target is optimizer:
        hook(epoch, logs)
        return
    rate = float(keras.ops.convert_to_numpy(optimizer.learning_rate)) if logs_rate else None
    keras.callbacks.Callback.set_model(callback, _ModelWithLrTarget(model, target))
    try:
        hook(epoch, logs)
    finally:
        keras.callbacks.Callback.set_model(callback, model)
    if rate is not None and isinstance(logs, dict) and "learning_rate" in logs:
        logs["learning_rate"] = rate


class RedirectedReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
    """Keras's `ReduceLROnPlateau`, reading and setting `lr_target(optimizer).learning_rate`.

    Relies on: Keras reaches the optimizer's learning rate only in
    `_reduce_optimizer_lr(optimizer, epoch, name)`, called with `model.optimizer`
    (Keras >= 3.15), or only through `self.model.optimizer` in `on_epoch_end` (before;
    `redirect_epoch_hook`).
    """

    def lr_target(self, optimizer: Any) -> Any:
        """What to read and set `learning_rate` on (default: the optimizer)."""
        return optimizer

    def on_epoch_end(self, epoch: int, logs: Any = None) -> None:
        redirect_epoch_hook(self, super().on_epoch_end, self.lr_target, epoch, logs, logs_rate=True)

    def _reduce_optimizer_lr(self, optimizer: Any, epoch: int, name: str = "") -> bool:
        return bool(super()._reduce_optimizer_lr(self.lr_target(optimizer), epoch, name))


class RedirectedLearningRateScheduler(keras.callbacks.LearningRateScheduler):
    """Keras's `LearningRateScheduler`, reading and setting `lr_target(optimizer).learning_rate`.

    Relies on: Keras reaches the optimizer's learning rate only in
    `_update_optimizer_lr(optimizer, epoch)`, called with `model.optimizer` (Keras >=
    3.15), or only through `self.model.optimizer` in `on_epoch_begin` (before;
    `redirect_epoch_hook`).
    """

    def lr_target(self, optimizer: Any) -> Any:
        """What to read and set `learning_rate` on (default: the optimizer)."""
        return optimizer

    def on_epoch_begin(self, epoch: int, logs: Any = None) -> None:
        redirect_epoch_hook(
            self, super().on_epoch_begin, self.lr_target, epoch, logs, logs_rate=False
        )

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

        def epoch_end(self: Any, epoch: int, logs: Any = None) -> None:
            hook = functools.partial(cls.on_epoch_end, self)
            redirect_epoch_hook(self, hook, lr_target, epoch, logs, logs_rate=True)

        attrs["_reduce_optimizer_lr"] = reduce
        attrs["on_epoch_end"] = epoch_end
    if issubclass(cls, keras.callbacks.LearningRateScheduler):

        def update(self: Any, optimizer: Any, epoch: int) -> Any:
            return cls._update_optimizer_lr(self, lr_target(optimizer), epoch)

        def epoch_begin(self: Any, epoch: int, logs: Any = None) -> None:
            hook = functools.partial(cls.on_epoch_begin, self)
            redirect_epoch_hook(self, hook, lr_target, epoch, logs, logs_rate=False)

        attrs["_update_optimizer_lr"] = update
        attrs["on_epoch_begin"] = epoch_begin
    return type(cls.__name__, (cls,), attrs) if attrs else None


# ------------------------------------------------------------------ progress bar


class _Marked(float):
    """A float that keeps its type through `/` and formats as "kept" (the probe's)."""

    def __truediv__(self, other: Any) -> _Marked:
        return _Marked(float(self) / other)

    def __format__(self, spec: str) -> str:
        return "kept"


@functools.cache
def progbar_keeps_value_format() -> bool:
    """Whether Keras's progress bar formats a stateful value of a float subclass (one
    whose `/` keeps its type: the bar divides by a count of 1) with the subclass's own
    `__format__` (Keras >= 3.13; `step: 279`), rather than converting it to a plain
    float first (Keras 3.8 - 3.12; `step: 279.0000`).

    A feature test: one update of a bar, its output captured. Pinned by
    `test_progbar_takes_its_time_per_unit_from_the_private_estimate_and_formats_counts`.
    """
    bar = keras.utils.Progbar(2, stateful_metrics=["v"], verbose=1, interval=0)
    out = io.StringIO()
    with redirect_stdout(out):
        bar.update(1, [("v", _Marked(1.0))])
    return "v: kept" in out.getvalue()


def _formats_itself(value: Any) -> bool:
    return (
        isinstance(value, float)
        and not isinstance(value, np.generic)
        and type(value).__format__ is not float.__format__
    )


class _OwnFormat:
    """A stateful value as Keras < 3.13's progress bar stores it (`[value, 1]`, read by
    index), printed with the value's own format (the bar prints a non-list as is)."""

    def __init__(self, value: float) -> None:
        self.value = value

    def __getitem__(self, index: int) -> Any:
        return (self.value, 1)[index]

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class _OwnFormatValues(dict[str, Any]):
    """The bar's `_values` where a stateful value that formats itself is kept whole."""

    def __init__(self, stateful: Any) -> None:
        super().__init__()
        self._stateful = stateful

    def __setitem__(self, key: str, value: Any) -> None:
        if (
            key in self._stateful
            and isinstance(value, list)
            and len(value) == 2
            and value[1] == 1
            and _formats_itself(value[0])
        ):
            value = _OwnFormat(value[0])
        super().__setitem__(key, value)


class StepTimedProgbar(keras.utils.Progbar):
    """Keras's progress bar whose time per unit is measured from `timed_from` on.

    Relies on: `Progbar.update` takes its time per unit (shown, and behind the ETA)
    from `_estimate_step_duration(current, now)`. A stateful value of a float subclass
    with its own `__format__` is printed with it on every Keras (before 3.13 Keras
    converts it to a float first: `progbar_keeps_value_format`; the bar's `_values`
    then keeps it whole, which Keras's one-line display prints as is).
    """

    timed_from: tuple[float, float] | None = None  # (current, time) where timing starts

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not progbar_keeps_value_format():
            self._values = _OwnFormatValues(self.stateful_metrics)

    def _estimate_step_duration(self, current: float, now: float) -> float:
        start = self.timed_from
        if start is None or current <= start[0]:
            return 0.0
        return (now - start[1]) / (current - start[0])
