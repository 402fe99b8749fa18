"""`attach`: the adaptive engine behind `model.fit`.

A user keeps `model.compile(...)` and `model.fit(...)`; `attach` replaces the model's
train function with the engine's step (the same one `tf_adabatch.Trainer` runs). One
call of the train function is one optimizer step: it consumes k micro-batches per
replica, so a Keras "step" (progress bar, `on_train_batch_end`) is an optimizer step.
"""

from __future__ import annotations

from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.common import global_state
from keras.src.saving.keras_saveable import KerasSaveable

from tf_adabatch.engine import AdaptiveEngine
from tf_adabatch.policies import BatchPolicy

__all__ = ["attach"]


def attach(
    model: keras.Model,
    *,
    micro_batch_size: int,
    base_batch_size: int | None = None,
    policy: BatchPolicy | None = None,
    similarity: str = "exact",
    ema_decay: float | None = None,
    jit_compile: bool = False,
    max_consecutive_skips: int | None = 100,
) -> AdaptiveEngine:
    """Makes `model.fit` train with an adaptive batch size and the AdaScale statistics.

    Call it after `model.compile(optimizer, loss, ...)` with the model and optimizer
    created in the strategy's scope. Feed `fit` a dataset batched with the *global
    micro-batch* (replicas x `micro_batch_size`, `drop_remainder=True`), repeated, with
    `steps_per_epoch` in optimizer steps. The train logs (progress bar, callbacks, the
    returned History) are the engine's: loss, batch_size, gain, similarity,
    learning_rate, progress, ... Compiled metrics are not updated during training
    (`evaluate` and validation still compute them).

    Args:
      model: a compiled, built Keras model with a single loss.
      micro_batch_size, base_batch_size, policy, similarity, ema_decay, jit_compile,
        max_consecutive_skips: as for `tf_adabatch.Trainer`.

    Returns:
      The engine. Its `state` and `policy` (batch size, gain, progress, moving
      averages, counters, the policy's state) are saved and restored with the model by
      Keras: `model.save_weights` / `load_weights`, `model.save` and
      `keras.callbacks.BackupAndRestore` (so an interrupted `fit` resumes with the
      adapted batch, not the initial one).

    Raises:
      ValueError: if the model is not compiled, has several losses, or uses
        `steps_per_execution > 1` (one call of the train function is one optimizer
        step of a variable number of micro-batches).

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    >>> engine = attach(model, micro_batch_size=8, policy=tf_adabatch.StaticPolicy(16),
    ...                 similarity="estimated")
    >>> x = np.random.default_rng(0).normal(size=(256, 3)).astype("float32")
    >>> data = tf.data.Dataset.from_tensor_slices((x, x.sum(1))).repeat().batch(8, drop_remainder=True)
    >>> history = model.fit(data, epochs=1, steps_per_epoch=5, verbose=0)
    >>> history.history["batch_size"], int(engine.state.steps)
    ([16.0], 5)
    """
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
    if model.steps_per_execution != 1:
        raise ValueError(
            "`steps_per_execution` must be 1 with tf_adabatch: one call of the train "
            "function is one optimizer step of a variable number of micro-batches. "
            f"Received: steps_per_execution={model.steps_per_execution}"
        )
    strategy = model.distribute_strategy
    engine = AdaptiveEngine(
        model,
        loss=loss,
        optimizer=model.optimizer,
        micro_batch_size=micro_batch_size,
        base_batch_size=base_batch_size,
        policy=policy,
        similarity=similarity,
        ema_decay=ema_decay,
        jit_compile=jit_compile,
        max_consecutive_skips=max_consecutive_skips,
        strategy=strategy,
    )

    def train_function(iterator: Any) -> dict[str, tf.Tensor]:
        return engine.train_step(iterator)

    def make_train_function(force: bool = False) -> Any:
        model.train_function = train_function
        return train_function

    model.make_train_function = make_train_function
    model.train_function = train_function
    if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        _patch_symbolic_build(model, strategy)
    model._adabatch_engine = engine  # keep it alive and findable from the model
    # Keras saves (save_weights, save, BackupAndRestore) include the adaptive state.
    model._adabatch_state = _AdaptiveStateSaveable(engine)
    return engine


class _AdaptiveStateSaveable(KerasSaveable):
    """The engine's state and policy variables as one Keras-saveable object.

    `attach` sets it as an attribute of the model, so Keras's own saving walks it like
    any sub-object of the model: `model.save_weights`, `model.save` (.keras) and
    `keras.callbacks.BackupAndRestore` store the adaptive state under the path
    `_adabatch_state`, and `load_weights` restores it into an attached model. A model
    without the state (not attached) ignores that entry when it loads such a file, and
    an attached model loading a file without it keeps its current state.

    Keras has no public hook for this: it relies on the private `KerasSaveable` base,
    on saving walking a model's attributes and on its per-type attribute skip sets
    (pinned by tests/test_keras_private.py and the round trips in tests/test_fit.py).
    """

    def __init__(self, engine: AdaptiveEngine) -> None:
        self.name = "adabatch_state"
        self._get_variables = lambda: {
            **{f"state.{_key(v)}": v for v in engine.state.variables},
            **{f"policy.{_key(v)}": v for v in engine.policy.variables},
            **{f"carried.{i}": v for i, v in enumerate(engine.carried_buffers)},
        }

    def _obj_type(self) -> str:
        # Keras's saving asks for the attributes to skip per object type right after
        # this call and knows only its own types; an empty skip set is registered for
        # ours (again after `clear_session`, which clears Keras's global state).
        key = "saving_attr_skiplist_AdaBatchState"
        if global_state.get_global_attribute(key, None) is None:
            global_state.set_global_attribute(key, set())
        return "AdaBatchState"

    def save_own_variables(self, store: Any) -> None:
        for key, variable in self._get_variables().items():
            store[key] = variable.numpy()

    def load_own_variables(self, store: Any) -> None:
        saved = set(store.keys())
        if not saved:
            return  # a file saved without the adaptive state
        variables = self._get_variables()
        if saved != set(variables):
            raise ValueError(
                "The saved adaptive state does not fit this engine and policy: missing "
                f"{sorted(set(variables) - saved)}, unexpected {sorted(saved - set(variables))}. "
                "Load it with the same policy type and replica setup it was saved with."
            )
        for key, variable in variables.items():
            variable.assign(store[key])


def _key(variable: tf.Variable) -> str:
    """A variable's name without scopes and suffix, e.g. `steps` (an H5 dataset name)."""
    return variable.name.split("/")[-1].split(":")[0]


def _patch_symbolic_build(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """Works around keras-team/keras#20585 under MultiWorkerMirroredStrategy.

    `fit` builds the model symbolically from the first batch, which Keras reduces with
    `strategy.reduce("MEAN", ...)`; under MultiWorkerMirroredStrategy that fails. Any
    replica's batch has the right structure and shapes, so take the first local one.
    Pinned by tests/test_keras_private.py.
    """

    def maybe_symbolic_build(iterator: Any = None, data_batch: Any = None) -> None:
        if iterator is not None:
            for _, _, it in iterator:
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
        with strategy.scope():
            model._symbolic_build(data_batch=data_batch)

    model._maybe_symbolic_build = maybe_symbolic_build
