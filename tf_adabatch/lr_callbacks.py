"""Keras's learning-rate callbacks on an `AdaptiveLearningRate`: they set its base rate.

Keras's `ReduceLROnPlateau` and `LearningRateScheduler` read the optimizer's learning
rate and assign a float to it, which an optimizer created with a schedule refuses
(TypeError). Here both act on the base rate of the optimizer's `AdaptiveLearningRate`
(`AdaptiveLearningRate.base_rate` / `set_base_rate`: the rate tuned for the base
batch, before the rule's factor), so that the AdaScale gain still applies on top:

- `ReduceLROnPlateau(factor=0.5)` halves the base rate on a plateau;
- `LearningRateScheduler(schedule)` calls `schedule(epoch, base_rate)` and sets the
  base rate it returns.

They are Keras's own classes with the learning-rate access redirected (all of Keras's
logic, patience, cooldown and `min_lr` included, is theirs), and behave exactly as
Keras's on an optimizer without an `AdaptiveLearningRate`. Under `tf_adabatch.attach`,
`model.fit` also redirects Keras's own instances of these classes for the duration of
the call (`redirected`), so a Keras script needs no change.

Keras reaches the optimizer in private methods of these classes (Keras >= 3.15), or
through `self.model.optimizer` in their epoch hooks (Keras 3.10 - 3.14): the seams
`RedirectedReduceLROnPlateau`, `RedirectedLearningRateScheduler` and
`redirecting_subclass` of `tf_adabatch._keras_seams` redirect either (pinned by
tests/test_keras_private.py, the older form checked on every Keras by
tests/test_keras_versions.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import keras

from tf_adabatch import _keras_seams as seams
from tf_adabatch.schedules import AdaptiveLearningRate

__all__ = ["LearningRateScheduler", "ReduceLROnPlateau", "base_rate_view", "redirected"]


class _BaseRate:
    """An optimizer as Keras's learning-rate callbacks see it: `learning_rate` is the
    base rate of its `AdaptiveLearningRate` (read and set)."""

    def __init__(self, schedule: AdaptiveLearningRate) -> None:
        self._schedule = schedule

    @property
    def learning_rate(self) -> float:
        return self._schedule.base_rate()

    @learning_rate.setter
    def learning_rate(self, value: float) -> None:
        self._schedule.set_base_rate(float(value))


def base_rate_view(optimizer: Any) -> Any:
    """What a learning-rate callback should act on: the base rate of the optimizer's bound
    `AdaptiveLearningRate`, or the optimizer itself when it has none (Keras's behaviour).

    >>> optimizer = keras.optimizers.SGD(0.1)
    >>> base_rate_view(optimizer) is optimizer
    True
    """
    for opt in seams.optimizer_chain(optimizer):
        schedule = seams.learning_rate_schedule(opt)
        if isinstance(schedule, AdaptiveLearningRate) and schedule.scale is not None:
            return _BaseRate(schedule)
    return optimizer


class ReduceLROnPlateau(seams.RedirectedReduceLROnPlateau):
    """Keras's `ReduceLROnPlateau`, reducing the base rate of an `AdaptiveLearningRate`.

    Same arguments and behaviour as Keras's; on a plateau the base rate (the rate for
    the base batch) is multiplied by `factor`, not below `min_lr`, and the rule's factor
    (the AdaScale gain) still multiplies it at every step. On an optimizer without an
    `AdaptiveLearningRate` it is Keras's callback. Under `attach`, Keras's own class
    behaves the same way.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.1)),
    ...               loss="mse")
    >>> engine = tf_adabatch.attach(model, micro_batch_size=8)
    >>> x = np.zeros((32, 2), "float32")  # a loss of 0 that never improves
    >>> reduce = ReduceLROnPlateau(monitor="loss", factor=0.5, patience=0, min_delta=1.0)
    >>> _ = model.fit(x, x[:, 0], batch_size=8, epochs=3, verbose=0, callbacks=[reduce])
    >>> round(engine.lr_schedule.base_rate(), 6)  # epoch 1 sets the best; halved after 2, 3
    0.025
    """

    def lr_target(self, optimizer: Any) -> Any:
        return base_rate_view(optimizer)


class LearningRateScheduler(seams.RedirectedLearningRateScheduler):
    """Keras's `LearningRateScheduler`, setting the base rate of an `AdaptiveLearningRate`.

    Same arguments as Keras's: at each epoch's start `schedule(epoch, base_rate)` gives
    the new base rate (with a constant base, the rate for the base batch from then on;
    with a base schedule, that schedule is scaled to pass through it), and the rule's
    factor (the AdaScale gain) still multiplies it at every step. On an optimizer
    without an `AdaptiveLearningRate` it is Keras's callback. Under `attach`, Keras's
    own class behaves the same way.

    Example:

    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.1)),
    ...               loss="mse")
    >>> engine = tf_adabatch.attach(model, micro_batch_size=8)
    >>> x = np.zeros((32, 2), "float32")
    >>> scheduler = LearningRateScheduler(lambda epoch, rate: 0.1 / (epoch + 1))
    >>> _ = model.fit(x, x[:, 0], batch_size=8, epochs=4, verbose=0, callbacks=[scheduler])
    >>> round(engine.lr_schedule.base_rate(), 6)  # set at the start of epoch 4
    0.025
    """

    def lr_target(self, optimizer: Any) -> Any:
        return base_rate_view(optimizer)


# Keras's class -> ours (a subclass that only redirects the learning-rate access).
_REDIRECTS: dict[type, type] = {
    keras.callbacks.ReduceLROnPlateau: ReduceLROnPlateau,
    keras.callbacks.LearningRateScheduler: LearningRateScheduler,
}


@contextlib.contextmanager
def redirected(callbacks: Iterable[Any] | None) -> Iterator[None]:
    """Within the block, Keras's own `ReduceLROnPlateau` and `LearningRateScheduler`
    among `callbacks` act as this module's (their class is switched to ours, which adds
    no state, and switched back afterwards).

    A user's subclass of Keras's class is switched to a subclass of it that redirects
    the same way (made once per class).

    >>> reduce = keras.callbacks.ReduceLROnPlateau()
    >>> with redirected([reduce]):
    ...     type(reduce) is ReduceLROnPlateau
    True
    >>> type(reduce) is keras.callbacks.ReduceLROnPlateau
    True
    """
    switched = []
    for callback in callbacks or ():
        new = _redirecting_class(type(callback))
        if new is not None:
            switched.append((callback, type(callback)))
            callback.__class__ = new
    try:
        yield
    finally:
        for callback, old in switched:
            callback.__class__ = old


def _redirecting_class(cls: Any) -> type | None:
    """The class to switch an instance of `cls` to, or None (nothing to redirect)."""
    if cls in _REDIRECTS:
        return _REDIRECTS[cls]
    if issubclass(cls, tuple(_REDIRECTS.values())):
        return None  # ours, or a subclass of ours: redirects already
    if cls not in _SUBCLASSES:
        _SUBCLASSES[cls] = seams.redirecting_subclass(cls, base_rate_view)
    return _SUBCLASSES[cls]


# A user's subclass of Keras's class -> its redirecting subclass (None: not one).
_SUBCLASSES: dict[type, type | None] = {}
