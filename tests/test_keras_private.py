"""Private Keras / TensorFlow behaviour the engine relies on: fails loudly on upgrade.

Every private Keras name the package uses lives in `tf_adabatch/_keras_seams.py`, one
documented seam each. If one of these tests fails after a Keras upgrade, the matching
seam must change before the version bound in setup.py is raised.
"""

from __future__ import annotations

import re
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch import _keras_seams as seams
from tf_adabatch._keras_seams import AllReduceBypass, tf_variable

from conftest import get_strategy

# The installed Keras's (major, minor): the pins below name the release where each
# behaviour changed, so a Keras that differs from them fails here loudly.
KERAS = tuple(int(part) for part in keras.__version__.split(".")[:2])


def test_optimizer_all_reduces_inside_apply_gradients_through_the_private_method() -> None:
    strategy = get_strategy(2)
    with strategy.scope():
        var = keras.Variable(np.zeros(3, np.float32))
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([var])
    assert hasattr(type(optimizer), "_all_reduce_sum_gradients")
    calls = []
    original = optimizer._all_reduce_sum_gradients

    def spy(grads_and_vars):
        calls.append(1)
        return original(grads_and_vars)

    optimizer._all_reduce_sum_gradients = spy

    @tf.function
    def step():
        strategy.run(lambda: optimizer.apply_gradients([(tf.ones(3), var)]))

    step()
    # Stock Keras: each replica's gradient of ones is summed over 2 replicas.
    np.testing.assert_allclose(var.numpy(), -2.0 * np.ones(3))
    assert len(calls) == 2  # once per replica, while tracing


def test_bypass_makes_the_internal_all_reduce_the_identity() -> None:
    strategy = get_strategy(2)
    with strategy.scope():
        var = keras.Variable(np.zeros(3, np.float32))
        optimizer = keras.optimizers.SGD(1.0)
        optimizer.build([var])
    bypass = AllReduceBypass(optimizer)

    @tf.function
    def step():
        bypass.active = True
        try:
            strategy.run(lambda: optimizer.apply_gradients([(tf.ones(3), var)]))
        finally:
            bypass.active = False

    step()
    np.testing.assert_allclose(var.numpy(), -np.ones(3))


def test_model_losses_list_added_losses_before_weight_regularizers() -> None:
    model = keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(
                3,
                kernel_regularizer=keras.regularizers.L2(0.5),
                activity_regularizer=keras.regularizers.L1(0.1),
            ),
            keras.layers.Dense(2, kernel_regularizer=keras.regularizers.L2(0.25)),
        ]
    )
    x = tf.ones((5, 4))
    out1 = model.layers[0](x)
    model(x)
    losses = model.losses
    assert len(losses) == 3
    weight_regs = [
        0.5 * tf.reduce_sum(tf.square(model.layers[0].kernel)),
        0.25 * tf.reduce_sum(tf.square(model.layers[1].kernel)),
    ]
    np.testing.assert_allclose(losses[1].numpy(), weight_regs[0].numpy(), rtol=1e-6)
    np.testing.assert_allclose(losses[2].numpy(), weight_regs[1].numpy(), rtol=1e-6)
    # The activity loss comes first: divided by the batch size from Keras 3.14 on,
    # summed over the batch before.
    summed = 0.1 * tf.reduce_sum(tf.abs(out1)).numpy()
    expected = summed / 5 if KERAS >= (3, 14) else summed
    np.testing.assert_allclose(losses[0].numpy(), expected, rtol=1e-6)


def test_activity_regularizer_loss_scaling_is_what_the_probe_says() -> None:
    """`seams.activity_losses_are_batch_means` (which `added_losses` decides on) tells
    the truth about this Keras: a Dense layer's L2 activity loss over a batch of 6 in a
    traced function is the per-example mean (Keras >= 3.14) or the batch sum."""
    means = seams.activity_losses_are_batch_means()
    assert means == (KERAS >= (3, 14)), (keras.__version__, means)
    layer = keras.layers.Dense(2, activity_regularizer=keras.regularizers.L2(0.5))
    x = tf.reshape(tf.range(12, dtype=tf.float32), (6, 2)) / 10.0

    @tf.function
    def forward(x):
        out = layer(x)
        return out, layer.losses[0]

    out, loss = forward(x)
    summed = 0.5 * float(tf.reduce_sum(tf.square(out)))
    np.testing.assert_allclose(float(loss), summed / 6 if means else summed, rtol=1e-6)


def test_loss_call_is_per_example_and_unscaled_under_a_strategy() -> None:
    strategy = get_strategy(4)
    loss = keras.losses.MeanSquaredError()
    y_true = tf.constant([[1.0, 2.0], [0.0, 0.0]])
    y_pred = tf.constant([[1.0, 0.0], [1.0, 1.0]])
    with strategy.scope():
        per_example = loss.call(y_true, y_pred)
        reduced = loss(y_true, y_pred)
    np.testing.assert_allclose(per_example.numpy(), [2.0, 1.0])
    # __call__ reduces and divides by the replica count, which the engine avoids.
    np.testing.assert_allclose(float(reduced), 1.5 / 4)


def test_optimizer_keeps_its_schedule_in_learning_rate_attribute() -> None:
    from keras.optimizers.schedules import ExponentialDecay

    schedule = ExponentialDecay(0.1, 10, 0.5)
    optimizer = keras.optimizers.SGD(schedule)
    assert optimizer._learning_rate is schedule
    wrapped = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(schedule))
    assert wrapped.inner_optimizer._learning_rate is schedule


def test_fit_builds_through_the_private_symbolic_build_hooks() -> None:
    """`tf_adabatch._keras_seams.install_fit_hooks` replaces `_maybe_symbolic_build`
    (always building the compiled metrics; keras-team/keras#20585 under
    MultiWorkerMirroredStrategy) and calls `_symbolic_build`."""
    import inspect

    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

    params = list(inspect.signature(TensorFlowTrainer._maybe_symbolic_build).parameters)
    assert params == ["self", "iterator", "data_batch"]
    assert "data_batch" in inspect.signature(TensorFlowTrainer._symbolic_build).parameters
    source = inspect.getsource(TensorFlowTrainer.fit)
    assert "self._maybe_symbolic_build(iterator=epoch_iterator)" in source
    assert "self.make_train_function()" in source and "self.train_function(iterator)" in source


def test_saving_walks_a_models_keras_saveable_attributes_with_registered_skip_sets(
    tmp_path,
) -> None:
    """`tf_adabatch._keras_seams.Saveable` rides on three private pieces of Keras
    saving: the `KerasSaveable` base, `_walk_saveable` visiting a model's attributes,
    and `get_attr_skipset` consulting the global attribute
    `saving_attr_skiplist_<type>` before its own list of known types."""
    from keras.src.backend.common import global_state
    from keras.src.saving import saving_lib
    from keras.src.saving.keras_saveable import KerasSaveable

    global_state.set_global_attribute("saving_attr_skiplist_PinProbe", {"skipped"})
    assert saving_lib.get_attr_skipset("PinProbe") == {"skipped"}

    class Probe(KerasSaveable):
        def __init__(self) -> None:
            self.value = np.arange(3.0)
            self.skipped = None

        def _obj_type(self) -> str:
            return "PinProbe"

        def save_own_variables(self, store) -> None:
            store["0"] = self.value

        def load_own_variables(self, store) -> None:
            self.value = np.array(store["0"])

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model._probe = Probe()
    path = str(tmp_path / "w.weights.h5")
    model.save_weights(path)
    model._probe.value = np.zeros(3)
    model.load_weights(path)
    np.testing.assert_array_equal(model._probe.value, [0.0, 1.0, 2.0])


def test_keras_variables_are_backed_by_a_tf_variable_in_value() -> None:
    """The engine's roll-back copies a Keras variable through the `tf.Variable` in its
    `value` (per device under a strategy: a distributed variable's components)."""

    strategy = get_strategy(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.BatchNormalization()])
    checked = 0
    for variable in model.variables:
        backing = tf_variable(variable)
        assert isinstance(backing, tf.distribute.DistributedValues)
        assert len(strategy.experimental_local_results(backing)) == 2
        np.testing.assert_array_equal(backing.numpy(), variable.numpy())
        checked += 1
    assert checked == 4  # gamma, beta, moving mean, moving variance


def test_fit_epoch_iterator_and_metric_pieces_attach_relies_on() -> None:
    """`tf_adabatch.keras_fit` (through the seams) relies on: fit calling `_maybe_symbolic_build`
    with its epoch iterator before `reset()` and before the callbacks take
    `epoch_iterator.num_batches`; the epoch iterator's `__iter__` calling the instance's
    `_enumerate_iterator`, its `_get_iterator`, `_num_batches`, `steps_per_epoch` and
    `data_adapter` (`batch_size`, `num_batches`, `has_partial_batch`,
    `get_tf_dataset`); CallbackList using a ProgbarLogger found among the callbacks;
    ProgbarLogger's `target`; and Keras's train-step metric pieces (`_compute_loss`,
    `_loss_tracker`, `unscale_loss_for_distribution`, `compile_utils.get_metric`,
    `LossFunctionWrapper`, used by `Trainer.evaluate` too)."""
    import inspect

    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    from keras.src.callbacks.callback_list import CallbackList
    from keras.src.losses.loss import unscale_loss_for_distribution
    from keras.src.losses.losses import LossFunctionWrapper
    from keras.src.trainers.compile_utils import get_metric
    from keras.src.trainers.data_adapters.array_data_adapter import ArrayDataAdapter
    from keras.src.trainers.data_adapters.tf_dataset_adapter import TFDatasetAdapter
    from keras.src.trainers.epoch_iterator import EpochIterator

    fit = inspect.getsource(TensorFlowTrainer.fit)
    build = fit.index("self._maybe_symbolic_build(iterator=epoch_iterator)")
    assert (
        build < fit.index("epoch_iterator.reset()") < fit.index("steps=epoch_iterator.num_batches")
    )
    assert "self._enumerate_iterator()" in inspect.getsource(EpochIterator.__iter__)
    for name in ("_get_iterator", "reset", "_enumerate_iterator"):
        assert callable(getattr(EpochIterator, name))
    assert "self._num_batches = self.data_adapter.num_batches" in inspect.getsource(
        EpochIterator.reset
    )
    for adapter in (ArrayDataAdapter, TFDatasetAdapter):
        for name in ("batch_size", "num_batches", "has_partial_batch"):
            assert isinstance(getattr(adapter, name), property)
        assert callable(adapter.get_tf_dataset)
    mine = keras.callbacks.ProgbarLogger()
    callbacks = CallbackList([mine], add_progbar=True, verbose=1, epochs=1, steps=None)
    assert [c for c in callbacks.callbacks if isinstance(c, keras.callbacks.ProgbarLogger)] == [
        mine
    ]
    assert mine.target is None
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3)])
    model.compile(loss="mse")
    assert isinstance(model._loss_tracker, keras.metrics.Mean)
    assert "training" in inspect.signature(model._compute_loss).parameters
    assert float(unscale_loss_for_distribution(tf.constant(2.0))) == 2.0  # no strategy
    y_true, y_pred = tf.zeros((4,), "int32"), tf.zeros((4, 3))
    assert isinstance(
        get_metric("accuracy", y_true, y_pred), keras.metrics.SparseCategoricalAccuracy
    )
    wrapped = LossFunctionWrapper(lambda a, b: tf.reduce_mean(b))
    assert float(wrapped(y_true, y_pred + 1.0, sample_weight=tf.fill((4,), 0.5))) == 0.5


def test_epoch_iterator_items_are_what_the_probe_says_and_fit_unpacks_them() -> None:
    """fit's epoch iterator yields `(begin_step, end_step, iterator)` from Keras 3.11 on
    and `(step, iterator)` before (`seams.epoch_items_are_triples`, a probe on the base
    `EpochIterator`); TensorFlow's epoch iterator (fit's) yields the same, and fit
    unpacks that shape and gives the callbacks its steps (`replace_epoch_enumeration`
    turns the engine's triples into pairs of the end step on the older Keras)."""
    import inspect

    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer, TFEpochIterator

    triples = seams.epoch_items_are_triples()
    assert triples == (KERAS >= (3, 11)), (keras.__version__, triples)
    epoch_iterator = TFEpochIterator(
        x=np.zeros((6, 1), "float32"),
        batch_size=2,
        steps_per_execution=2,
        distribute_strategy=tf.distribute.get_strategy(),
    )
    items = list(epoch_iterator._enumerate_iterator())
    if triples:
        assert [item[:2] for item in items] == [(0, 1), (2, 3)]
    else:
        assert [item[0] for item in items] == [0, 2] and {len(item) for item in items} == {2}
    fit = inspect.getsource(TensorFlowTrainer.fit)
    if triples:
        assert "for begin_step, end_step, iterator in epoch_iterator:" in fit
        assert "callbacks.on_train_batch_end(end_step, logs)" in fit
    else:
        assert "for step, iterator in epoch_iterator:" in fit
        assert "callbacks.on_train_batch_end(step, logs)" in fit


def test_profiler_trace_layout_that_launch_profile_step_reads(tmp_path) -> None:
    """launch/profile_step.py reads the profiler's `plugins/profile/*/*.xplane.pb` with
    TensorFlow's `tensorflow.tsl.profiler.protobuf.xplane_pb2` and attributes host-plane
    ("/host:CPU") op events to parts by the engine's name scopes: all private layout."""
    import glob

    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    @tf.function
    def step(x):
        with tf.name_scope("adabatch_statistics"):
            return tf.reduce_sum(tf.square(x))

    step(tf.ones([8]))  # traced before the capture
    tf.profiler.experimental.start(str(tmp_path))
    for _ in range(3):
        step(tf.ones([8]))
    tf.profiler.experimental.stop()
    paths = glob.glob(str(tmp_path / "plugins" / "profile" / "*" / "*.xplane.pb"))
    assert len(paths) == 1, paths
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    hosts = [plane for plane in space.planes if plane.name == "/host:CPU"]
    assert len(hosts) == 1
    names = [
        hosts[0].event_metadata[ev.metadata_id].name
        for line in hosts[0].lines
        for ev in line.events
    ]
    assert any("adabatch_statistics" in name for name in names), sorted(set(names))[:20]


# The private Keras names the seams use; no other module of the package may use them.
_PRIVATE_KERAS = re.compile(
    r"keras\.src|\._all_reduce_sum_gradients|[.\"]_learning_rate\b|\._compute_loss"
    r"|\._loss_tracker|\._symbolic_build|\._maybe_symbolic_build|\._get_iterator"
    r"|\._enumerate_iterator|\._num_batches|\.data_adapter|def _obj_type|KerasSaveable"
    r"|LossFunctionWrapper|global_state|unscale_loss_for_distribution|get_metric\("
    r"|_reduce_optimizer_lr|_update_optimizer_lr|_estimate_step_duration"
    r"|\._flatten_layers|\._values\b"
)


def test_private_keras_names_live_in_one_module() -> None:
    """Each private name is used by the seams module, and by no other module."""
    package = Path(tf_adabatch.__file__).parent
    files = sorted(package.rglob("*.py"))
    users = {}
    for path in files:
        code = "\n".join(
            line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")
        )
        found = set(_PRIVATE_KERAS.findall(code))
        if found:
            users[path.relative_to(package).as_posix()] = found
    assert len(files) >= 12  # the scan saw the package
    assert set(users) == {"_keras_seams.py"}, users
    # Every alternative of the pattern is really used there (the pattern is not stale).
    assert len(users["_keras_seams.py"]) == _PRIVATE_KERAS.pattern.count("|") + 1


def test_preemption_handler_pieces_the_preemption_watch_relies_on(tmp_path) -> None:
    """`tf_adabatch.app.preemption.PreemptionWatch` reads the handler's `_platform_device`
    (GCE CPU / TPU VMs: the handler does nothing), stops its polling thread by calling
    `__del__` in the main thread, and gives it a dummy checkpoint because the handler
    adds its `checkpointed_runs` variable to the one it gets."""
    import threading

    flag = [False]
    dummy = tf.train.Checkpoint()
    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        None,
        dummy,
        checkpoint_dir=str(tmp_path / "unused"),
        termination_config=tf.distribute.experimental.TerminationConfig(
            termination_watcher_fn=lambda: flag[0],
            exit_fn=lambda: None,
            grace_period=0,
            save_fn=lambda *args, **kwargs: None,
        ),
    )
    assert str(handler._platform_device) == "PlatformDevice.INTERNAL_CPU"  # not on GCP here
    assert hasattr(dummy, "checkpointed_runs")
    pollers = [
        t for t in threading.enumerate() if t.name == "WorkerTerminationSignalWatcher-single_worker"
    ]
    assert len(pollers) == 1 and pollers[0].is_alive()
    handler.__del__()
    assert not pollers[0].is_alive()
    assert not list(tmp_path.iterdir())  # it wrote nothing


def test_keras_learning_rate_callbacks_reach_the_optimizer_only_through_the_private_methods() -> (
    None
):
    """`ReduceLROnPlateau` and `LearningRateScheduler` read and set the learning rate in
    `_reduce_optimizer_lr` / `_update_optimizer_lr`, given `model.optimizer` (Keras >=
    3.15), or inline through `self.model.optimizer` in their epoch hooks (before; the
    next test): redirected either way, a float-rate optimizer's rate is untouched, the
    target's changes, and the logged `learning_rate` is the optimizer's."""
    from tf_adabatch._keras_seams import (
        RedirectedLearningRateScheduler,
        RedirectedReduceLROnPlateau,
        redirecting_subclass,
    )

    assert seams.lr_callbacks_redirectable() == (KERAS >= (3, 15)), keras.__version__

    class Target:
        learning_rate = 0.4

    target = Target()

    def redirect(callback):
        callback.lr_target = lambda optimizer: target
        return callback

    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.zeros((8, 1), "float32")
    reduce = redirect(
        RedirectedReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1e9)
    )
    scheduler = redirect(RedirectedLearningRateScheduler(lambda epoch, lr: lr + 1.0))
    logged = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logged.append(logs["learning_rate"])
    )
    model.fit(x, x, epochs=2, verbose=0, callbacks=[reduce, scheduler, record])
    # Two epochs: the scheduler adds 1 at each start, the plateau halves after epoch 2.
    assert target.learning_rate == pytest.approx(((0.4 + 1.0) + 1.0) * 0.5)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)
    assert logged == pytest.approx([0.1, 0.1])

    class Users(keras.callbacks.ReduceLROnPlateau):
        pass

    users = redirecting_subclass(Users, lambda optimizer: target)(
        monitor="loss", factor=0.5, patience=0, min_delta=1e9
    )
    target.learning_rate = 0.4
    model.fit(x, x, epochs=2, verbose=0, callbacks=[users])
    assert target.learning_rate == pytest.approx(0.2)


def test_keras_learning_rate_callbacks_touch_the_optimizer_where_the_seams_expect() -> None:
    """Keras >= 3.15: the epoch hooks call the private methods with `model.optimizer`.
    Before: they read and set `self.model.optimizer.learning_rate` inline, and
    `Callback.set_model` sets what `self.model` returns (so `redirect_epoch_hook` can
    show them a model whose optimizer is the target)."""
    import inspect

    plateau = inspect.getsource(keras.callbacks.ReduceLROnPlateau.on_epoch_end)
    scheduler = inspect.getsource(keras.callbacks.LearningRateScheduler.on_epoch_begin)
    if seams.lr_callbacks_redirectable():
        assert "self._reduce_optimizer_lr(" in plateau
        assert "self._update_optimizer_lr(" in scheduler
    else:
        assert KERAS < (3, 15)
        for source in (plateau, scheduler):
            assert "self.model.optimizer.learning_rate = " in source
            assert "_optimizer_lr(" not in source
        callback = keras.callbacks.Callback()
        view = object()
        keras.callbacks.Callback.set_model(callback, view)
        assert callback.model is view


def test_progbar_takes_its_time_per_unit_from_the_private_estimate_and_formats_counts(
    capsys,
) -> None:
    """`Progbar.update` prints the time per unit `_estimate_step_duration` returns (the
    ETA is built on it), and formats a stateful value as `value / 1` with `.4f` (which
    the trainer's whole-number count overrides). Before Keras 3.13 the bar converts the
    value to a float first (`seams.progbar_keeps_value_format`), and `StepTimedProgbar`
    keeps the count whole itself."""
    from tf_adabatch._keras_seams import StepTimedProgbar
    from tf_adabatch.trainer import _Whole

    assert seams.progbar_keeps_value_format() == (KERAS >= (3, 13)), keras.__version__

    bar = StepTimedProgbar(100, stateful_metrics=["step"], unit_name="base step", interval=0)
    bar.timed_from = (0.0, 0.0)
    bar._estimate_step_duration = lambda current, now: 7.0  # seconds per base step
    bar.update(10, [("step", _Whole(279.0))])
    line = capsys.readouterr().out
    assert "7s/base step" in line and "10:30" in line  # ETA 7 s x 90 = 10 min 30 s
    assert "step: 279" in line and "279.0000" not in line
    # Keras's own bar: a whole count on Keras >= 3.13, four decimals before.
    plain = keras.utils.Progbar(100, stateful_metrics=["step"], interval=0)
    plain.update(10, [("step", _Whole(279.0))])
    line = capsys.readouterr().out
    assert ("279.0000" not in line) == (KERAS >= (3, 13)), line
