"""What tf_adabatch does where Keras 3.10 - 3.15 differ (`tf_adabatch/_keras_seams.py`).

Each seam decides on a probe of the installed Keras (`epoch_items_are_triples`,
`activity_losses_are_batch_means`, `lr_callbacks_redirectable`); the probes' answers
are pinned per Keras release in tests/test_keras_private.py. Here each probe is set to
the older Keras's answer (monkeypatch; the learning-rate callbacks' epoch hooks also
take the older Keras's form), so these tests check the seams' handling of the older
behaviour on every Keras, the newest included, and fail if a shim is removed. On a
Keras that really has the older behaviour the probe gives that answer itself.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch import _keras_seams as seams

from helpers import weights

M = 4  # micro-batch per replica


def data(num: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, 5)).astype("float32")
    return x, (x @ rng.normal(size=(5, 1))).astype("float32")


def model_of(*, rate: object = 0.05, **layer_kwargs: object) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, **layer_kwargs), keras.layers.Dense(1)]
    )
    model.compile(optimizer=keras.optimizers.SGD(rate), loss="mse")
    return model


# ------------------------------------------------------------------ epoch iterator


class _FakeEpochIterator:
    """The two pieces `replace_epoch_enumeration` touches."""

    def __init__(self) -> None:
        self._num_batches = 7
        self.resets = 0

    def reset(self) -> None:
        self.resets += 1
        self._num_batches = 7


@pytest.mark.parametrize("triples", [True, False])
def test_the_engines_steps_reach_fit_in_the_shape_its_epoch_loop_unpacks(
    monkeypatch, triples
) -> None:
    """Keras >= 3.11's fit unpacks `(begin_step, end_step, iterator)`, older ones
    `(step, iterator)`: the engine's blocks become pairs of their end step there."""
    monkeypatch.setattr(seams, "epoch_items_are_triples", lambda: triples)
    fake = _FakeEpochIterator()
    blocks = [(0, 3, "first"), (4, 4, "second")]
    seams.replace_epoch_enumeration(fake, lambda: iter(blocks))
    items = list(fake._enumerate_iterator())
    assert items == (blocks if triples else [(3, "first"), (4, "second")])
    fake.reset()
    assert fake.resets == 1 and fake._num_batches is None  # steps per epoch: unknown
    # And the data iterators of either shape.
    assert list(seams.epoch_iterators(iter(items))) == ["first", "second"]


# ------------------------------------------------------------- activity regularizer


@pytest.mark.parametrize("front_door", ["attach", "trainer"])
def test_an_activity_regularizer_is_refused_before_any_update_where_keras_sums_it(
    monkeypatch, front_door
) -> None:
    """Before Keras 3.14 a layer's activity loss is the batch's sum: the engine's
    micro-batches would weigh it by the adaptive batch, so it refuses, naming 3.14,
    while the step is traced (the weights untouched)."""
    monkeypatch.setattr(seams, "activity_losses_are_batch_means", lambda: False)
    x, y = data()
    model = model_of(activity_regularizer=keras.regularizers.L1(0.01))
    before = weights(model)
    match = r"activity regularizer \(on layer 'dense.*'\).*needs Keras >= 3\.14.*Received: keras"
    if front_door == "attach":
        engine = tf_adabatch.attach(model, micro_batch_size=M)
        with pytest.raises(RuntimeError, match=match):
            model.fit(x, y, batch_size=M, epochs=1, verbose=0)
    else:
        trainer = tf_adabatch.Trainer(
            model, loss="mse", optimizer=keras.optimizers.SGD(0.05), micro_batch_size=M
        )
        engine = trainer.engine
        dataset = trainer.distribute(
            tf.data.Dataset.from_tensor_slices((x, y)).batch(M, drop_remainder=True)
        )
        with pytest.raises(RuntimeError, match=match):
            trainer.fit(iter(dataset), steps=2, verbose=0)
    assert int(engine.state.steps.numpy()) == 0
    for a, b in zip(weights(model), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_without_an_activity_regularizer_the_older_scaling_changes_nothing(monkeypatch) -> None:
    """The refusal is about activity regularizers only: weight regularizers (applied
    once per step) and the rest train as on any Keras."""
    x, y = data()
    trained = []
    for probe in (True, False):
        monkeypatch.setattr(seams, "activity_losses_are_batch_means", lambda probe=probe: probe)
        model = model_of(kernel_regularizer=keras.regularizers.L2(0.01))
        tf_adabatch.attach(model, micro_batch_size=M)
        model.fit(x, y, batch_size=M, epochs=1, verbose=0)
        trained.append(weights(model))
    for a, b in zip(*trained, strict=True):
        np.testing.assert_array_equal(a, b)


# --------------------------------------------------------- learning-rate callbacks


def keras_before_3_15(monkeypatch) -> None:
    """Keras's learning-rate callbacks as before 3.15 (abridged): the epoch hooks read
    and set `self.model.optimizer.learning_rate` inline (a plateau after every epoch but
    the first), and the probe says so."""

    def plateau_end(self, epoch, logs=None):
        logs = logs or {}
        logs["learning_rate"] = float(self.model.optimizer.learning_rate)
        if epoch > 0:
            rate = float(self.model.optimizer.learning_rate)
            self.model.optimizer.learning_rate = max(rate * self.factor, self.min_lr)

    def scheduler_begin(self, epoch, logs=None):
        rate = float(self.model.optimizer.learning_rate)
        self.model.optimizer.learning_rate = self.schedule(epoch, rate)

    monkeypatch.setattr(seams, "lr_callbacks_redirectable", lambda: False)
    monkeypatch.setattr(keras.callbacks.ReduceLROnPlateau, "on_epoch_end", plateau_end)
    monkeypatch.setattr(keras.callbacks.LearningRateScheduler, "on_epoch_begin", scheduler_begin)


class Users(keras.callbacks.ReduceLROnPlateau):  # a user's subclass
    pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: keras.callbacks.ReduceLROnPlateau(monitor="loss", factor=0.5),
        lambda: tf_adabatch.ReduceLROnPlateau(monitor="loss", factor=0.5),
        lambda: Users(monitor="loss", factor=0.5),
    ],
    ids=["keras", "tf_adabatch", "users_subclass"],
)
def test_a_plateau_reduces_the_base_rate_where_keras_sets_the_rate_inline(
    monkeypatch, make
) -> None:
    """Before Keras 3.15 the callbacks have no method to redirect: their epoch hook is
    shown a model whose optimizer is the base rate (else Keras's hook would assign a
    float to a schedule's optimizer: TypeError)."""
    keras_before_3_15(monkeypatch)
    x, y = data()
    model = model_of(rate=tf_adabatch.AdaptiveLearningRate(0.05))
    engine = tf_adabatch.attach(model, micro_batch_size=M)
    callback = make()
    kind = type(callback)
    model.fit(x, y, batch_size=M, epochs=3, verbose=0, callbacks=[callback])
    assert engine.lr_schedule.base_rate() == pytest.approx(0.05 / 4)  # after epochs 2, 3
    assert type(callback) is kind  # switched back
    assert callback.model is model  # the model put back after each hook


def test_a_schedule_sets_the_base_rate_and_the_optimizers_rate_is_logged_where_keras_sets_it_inline(
    monkeypatch,
) -> None:
    keras_before_3_15(monkeypatch)

    class Target:
        learning_rate = 0.4

    target = Target()
    model = model_of(rate=0.1)
    scheduler = seams.RedirectedLearningRateScheduler(lambda epoch, rate: rate + 1.0)
    plateau = seams.RedirectedReduceLROnPlateau(monitor="loss", factor=0.5)
    for callback in (scheduler, plateau):
        callback.lr_target = lambda optimizer: target
    logged = []
    record = keras.callbacks.LambdaCallback(
        on_epoch_end=lambda epoch, logs: logged.append(logs["learning_rate"])
    )
    x, y = data()
    model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=[scheduler, plateau, record])
    assert target.learning_rate == pytest.approx(((0.4 + 1.0) + 1.0) * 0.5)
    assert float(model.optimizer.learning_rate) == pytest.approx(0.1)
    assert logged == pytest.approx([0.1, 0.1])  # the optimizer's rate, as Keras >= 3.15


def test_learning_rate_callbacks_without_an_adaptive_rate_are_kerass(monkeypatch) -> None:
    """With nothing to redirect (a float learning rate), tf_adabatch's callbacks are
    Keras's."""
    keras_before_3_15(monkeypatch)
    x, y = data()
    model = model_of(rate=0.1)
    reduce = tf_adabatch.ReduceLROnPlateau(monitor="loss", factor=0.5)
    model.fit(x, y, batch_size=8, epochs=3, verbose=0, callbacks=[reduce])
    assert float(model.optimizer.learning_rate) == pytest.approx(0.025)
