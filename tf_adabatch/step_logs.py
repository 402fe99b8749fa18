"""What one call of the engine's step hands the host, and what the host does with it.

Each optimizer step ends with one float64 vector (`LOG_NAMES`); a call of N steps
with an `[N, len(LOG_NAMES)]` matrix, read in one transfer. `read_call` turns it into
the logs, charges the steps' time, feeds a `GoodputPolicy` and raises when the run
must stop.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tf_adabatch.clock import Clock, charge
from tf_adabatch.policies import GoodputPolicy
from tf_adabatch.step_statistics import PROGRESS_INCREMENT

__all__ = [
    "BLOCK_SECONDS",
    "BLOCK_STEPS",
    "LOG_NAMES",
    "STEP_LOGS",
    "UPDATE_LOST",
    "CallLogs",
    "NonFiniteGradientsError",
    "NonFiniteUpdateError",
    "read_call",
]

# The logs of one step, in the order of the step's output vector.
STEP_LOGS = (
    "loss",
    "batch_size",
    "accumulation_steps",
    "gain",
    "similarity",
    "noise_scale",
    "grad_sqr",
    "grad_var",
    "learning_rate",
    "progress",
    "samples_seen",
    "skipped_steps",
    "applied",
    "step",
    "consecutive_skips",
)
# Whether the step's update (from finite gradients) was not finite: restored from the
# copy with rollback="copy"; the end of the run with "stop".
UPDATE_LOST = "_update_not_finite"
LOG_NAMES = (*STEP_LOGS, PROGRESS_INCREMENT, UPDATE_LOST)
# What `Trainer.fit` adds to its callbacks' logs at the end of a call (a block of
# steps with `steps_per_execution`): the steps it took and the sum of their step_time.
BLOCK_STEPS, BLOCK_SECONDS = "block_steps", "block_seconds"


class NonFiniteGradientsError(RuntimeError):
    """Too many optimizer steps in a row had non-finite gradients.

    >>> issubclass(NonFiniteGradientsError, RuntimeError)
    True
    """


class NonFiniteUpdateError(NonFiniteGradientsError):
    """With `rollback="stop"`: an update from finite gradients left a weight or an
    optimizer variable non-finite, and there is no copy to undo it with.

    >>> issubclass(NonFiniteUpdateError, NonFiniteGradientsError)
    True
    """


class CallLogs(dict):
    """`read_call`'s logs (name -> one value per step), and why each skipped step was
    skipped: `update_not_finite[i]` is True where step i's gradients were finite and
    its update was not (rolled back), False where its gradients were not finite.

    >>> logs = CallLogs({"applied": np.array([0.0])})
    >>> logs.update_not_finite.tolist(), dict(logs)
    ([False], {'applied': array([0.])})
    """

    def __init__(self, *args: Any, update_not_finite: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if update_not_finite is None:
            update_not_finite = np.zeros(len(self.get("applied", ())), bool)
        self.update_not_finite = np.asarray(update_not_finite, bool)


def read_call(
    values: np.ndarray,
    seconds: float,
    *,
    traced: bool,
    clock: Clock,
    policy: Any,
    update_undone: bool,
    max_consecutive_skips: int | None,
) -> dict[str, np.ndarray]:
    """The logs of one call's steps, from its output (`values`, one row per step).

    Args:
      values: the call's output, `LOG_NAMES` per step.
      seconds: the host's time for the call; `traced`: whether the call traced.
      clock: what each step is charged (`clock.charge`); a `GoodputPolicy` `policy`
        observes (k, charged seconds) of every applied step that has a time.
      update_undone: whether a non-finite update was undone (rollback="copy").
      max_consecutive_skips: the engine's option.

    Returns:
      `STEP_LOGS` and step_time, examples_per_second, progress_per_second, one array
      each, one entry per step (a `CallLogs`, which also says why a step was skipped).

    Raises:
      NonFiniteUpdateError: a non-finite update that was not undone.
      NonFiniteGradientsError: the last step made `max_consecutive_skips` in a row.

    >>> from tf_adabatch.clock import WallClock
    >>> row = np.zeros(len(LOG_NAMES)); row[[1, 2, 12]] = 64, 1, 1  # batch, k, applied
    >>> row[LOG_NAMES.index(PROGRESS_INCREMENT)] = 2.0
    >>> logs = read_call(row, 0.5, traced=False, clock=WallClock(), policy=None,
    ...                  update_undone=True, max_consecutive_skips=None)
    >>> logs["step_time"].tolist(), logs["examples_per_second"].tolist()
    ([0.5], [128.0])
    """
    rows = np.asarray(values, np.float64).reshape(-1, len(LOG_NAMES))
    logs = dict(zip(LOG_NAMES, rows.T, strict=True))
    progress = logs.pop(PROGRESS_INCREMENT)
    lost = logs.pop(UPDATE_LOST)
    if lost.any() and not update_undone:
        raise NonFiniteUpdateError(
            f"Optimizer step {int(logs['step'][lost > 0][0])} had finite gradients but its "
            "update left a weight or an optimizer variable non-finite (NaN or inf), and "
            'with rollback="stop" there is no copy to undo it: the model is broken. '
            "Resume from the last checkpoint (lower the learning rate), or use "
            'rollback="copy" to skip such steps.'
        )
    ks, batches = logs["accumulation_steps"], logs["batch_size"]
    charged = charge(clock, seconds, batches, ks, traced=traced)
    if isinstance(policy, GoodputPolicy) and not np.isnan(charged).all():
        for k, step_seconds, applied in zip(ks, charged, logs["applied"], strict=True):
            if applied:
                policy.throughput.observe(int(k), float(step_seconds))
    logs["step_time"] = charged
    logs["examples_per_second"] = batches / charged
    logs["progress_per_second"] = progress / charged
    limit = max_consecutive_skips
    if limit is not None and logs["consecutive_skips"][-1] >= limit:
        applied_steps = int(logs["step"][-1] - logs["skipped_steps"][-1])
        raise NonFiniteGradientsError(
            f"{limit} optimizer steps in a row had non-finite gradients or updates (NaN or "
            "inf) and were skipped; stopping. Weights, optimizer and adaptive state are those of "
            f"the last good step ({applied_steps} applied). Check the data, the learning rate "
            "and the loss; raise `max_consecutive_skips` to tolerate more."
        )
    return CallLogs(logs, update_not_finite=lost > 0)
