"""Restoring an adaptive state: carried over to another topology, or missing."""

from __future__ import annotations

import warnings
from typing import Any

from tf_adabatch.state import AdaptiveState

__all__ = ["carry_batch_over", "warn_if_state_is_new"]


def carry_batch_over(
    state: AdaptiveState, policy: Any, unit: int, min_k: int, *, carried: bool
) -> str | None:
    """After restoring a state written on another topology: keeps its global batch.

    The state stores k and the replicas x micro-batch (the batch unit) of the engine
    that wrote it. Restored as is on another number of replicas (or another
    micro-batch size), k would give another global batch: 4 -> 2 replicas would
    halve it. This sets k so that the global batch stays the saved one, or the
    nearest reachable one (a multiple of this engine's unit, within the policy's
    bounds); the differenced estimator's previous gradient (one replica, estimated
    similarity: `carried`, the engine has carried buffers) is not carried over. Progress, moving averages, the policy's state
    and the samples seen are unchanged. Host code; `tf_adabatch.app.run` and Keras's
    loading under `attach` call it after a restore (as
    `AdaptiveEngine.carry_batch_over`).

    Returns:
      None if the topology is unchanged, else one line saying what happened.

    Example (a state written with 4 replicas x 32 and k = 2: batch 256; resumed
    on one device x 32, k becomes 8; one replica in exact mode):

    >>> import keras
    >>> from tf_adabatch import AdaptiveEngine, StaticPolicy
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
    saved = int(state.batch_unit.numpy())
    if saved in (0, unit):
        state.batch_unit.assign(unit)
        return None
    batch = int(state.accumulation_steps.numpy()) * saved
    low = max(min_k, -(-int(getattr(policy, "min_batch_size", 0)) // unit))
    high = max(low, int(getattr(policy, "max_batch_size", 0)) // unit or 2**62)
    k = min(max(round(batch / unit), low), high)
    state.accumulation_steps.assign(k)
    state.prev_batch_size.assign(0.0)  # the previous gradient is not comparable
    state.batch_unit.assign(unit)
    head = f"Resumed on a batch unit of {unit} (replicas x micro-batch; it was {saved}): "
    # One replica, estimated similarity: the previous gradient (if the file had one)
    # was taken on another topology, so the differenced estimator starts over.
    restart = " The differenced estimator starts over (no previous gradient)." if carried else ""
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


def warn_if_state_is_new(optimizer: Any, state: AdaptiveState, batch_size: int) -> None:
    """Before the first step: a trained optimizer with a new adaptive state means the
    model was restored without its state (e.g. `keras.models.load_model` then
    `attach`), and training would restart the schedule on tau = 0 at the initial
    batch. Said once, as a warning: a model trained with plain Keras first may
    start its adaptation afresh on purpose.

    >>> import warnings, keras
    >>> from tf_adabatch import AdaptiveEngine
    >>> model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    >>> engine = AdaptiveEngine(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                         micro_batch_size=4)
    >>> _ = engine.optimizer.iterations.assign(5)  # as if trained, then restored alone
    >>> with warnings.catch_warnings(record=True) as caught:
    ...     warnings.simplefilter("always")
    ...     warn_if_state_is_new(engine.optimizer, engine.state, engine.batch_size)
    >>> str(caught[0].message)[:47]
    'The optimizer has taken 5 steps but the adaptiv'
    """
    iterations = int(optimizer.iterations.numpy())
    taken = int(state.steps.numpy()) + int(state.skipped_steps.numpy())
    if iterations > 0 and taken == 0:
        warnings.warn(
            f"The optimizer has taken {iterations} steps but the adaptive state is new "
            f"(progress 0, batch {batch_size}): the model was restored without its "
            "tf_adabatch state, and the schedule restarts at progress 0. To continue a "
            "model saved under tf_adabatch, load it with `tf_adabatch.load_model(path, "
            "...)`, or call `model.load_weights(path)` after `attach` / `Trainer(...)`.",
            stacklevel=5,
        )
