"""What a run records across its processes, saved in every checkpoint; divergence.

A run may take many processes (kills, preemptions, reruns). `RunRecord` is saved in
each checkpoint beside the model and the adaptive state, so that a resume goes on from
the checkpoint's numbers, not from zero:

- `train_seconds` (training time, evaluations excluded: time to accuracy's x-axis) and
  `wall_seconds` (everything), summed over the processes up to the save; the time a
  killed process spent after its last save is not counted, and the steps it redoes
  are (so a resumed run's total is close to an uninterrupted one's);
- `processes`: how many processes have written checkpoints;
- `fingerprint`: the job's fingerprint (`checkpoints.fingerprint`) as JSON, so a lost
  or damaged `fingerprint.json` is recovered from the checkpoint itself;
- `first_loss`, `best_loss`: the divergence guard's references (`DivergenceGuard`).

Examples and optimizer steps need no record: the adaptive state counts them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import tensorflow as tf

__all__ = [
    "RECORD_KEY",
    "Diverged",
    "DivergenceGuard",
    "EvaluationNotFinite",
    "RunRecord",
    "stored_fingerprint",
]

# The record's name in the launcher's checkpoints.
RECORD_KEY = "run"


class Diverged(RuntimeError):
    """The run diverged: its loss exploded, or no step of it could be applied.

    `launch/train.py` exits 3, as on `NonFiniteGradientsError`.

    >>> issubclass(Diverged, RuntimeError)
    True
    """


class EvaluationNotFinite(Diverged):
    """The final test evaluation is not finite while training's loss at the same weights
    is: the weights did not diverge (no checkpoint is set aside), the evaluation failed.

    A `Diverged` for the callers that stop on it (`launch/train.py` exits 3 with its
    message), whose message says that training did not diverge.

    >>> issubclass(EvaluationNotFinite, Diverged)
    True
    """


class RunRecord(tf.Module):
    """The run's accumulated records (see the module docstring): scalar variables.

    >>> record = RunRecord({"seed": 0})
    >>> float(record.train_seconds.numpy()), json.loads(record.fingerprint.numpy())
    (0.0, {'seed': 0})
    """

    def __init__(self, fingerprint: dict[str, Any]) -> None:
        super().__init__(name="run_record")
        # Plain host variables: each worker saves its own copy (the same values).
        with tf.device("/cpu:0"):
            self.train_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.wall_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
            self.processes = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.first_loss = tf.Variable(math.nan, dtype=tf.float64, trainable=False)
            self.best_loss = tf.Variable(math.nan, dtype=tf.float64, trainable=False)
            self.fingerprint = tf.Variable(
                json.dumps(fingerprint, sort_keys=True), dtype=tf.string, trainable=False
            )

    def restore_from(self, prefix: str) -> bool:
        """Restores the record from checkpoint `prefix`; False (left as is) if it has none
        (written before records existed)."""
        if not _has_record(prefix):
            return False
        tf.train.Checkpoint(**{RECORD_KEY: self}).restore(prefix).expect_partial()
        return True


def _has_record(prefix: str) -> bool:
    names = {name for name, _ in tf.train.list_variables(prefix)}
    return f"{RECORD_KEY}/fingerprint/.ATTRIBUTES/VARIABLE_VALUE" in names


def stored_fingerprint(prefix: str) -> dict[str, Any] | None:
    """The fingerprint saved in checkpoint `prefix`, or None if it holds none.

    >>> import tempfile
    >>> record = RunRecord({"seed": 3})
    >>> prefix = tf.train.Checkpoint(run=record).save(tempfile.mkdtemp() + "/ckpt")
    >>> stored_fingerprint(prefix)
    {'seed': 3}
    """
    if not _has_record(prefix):
        return None
    value = tf.train.load_checkpoint(prefix).get_tensor(
        f"{RECORD_KEY}/fingerprint/.ATTRIBUTES/VARIABLE_VALUE"
    )
    stored = json.loads(value.decode() if isinstance(value, bytes) else value)
    return stored if isinstance(stored, dict) else None


class DivergenceGuard:
    """Keeps the checkpoints of a diverging run from standing in for the good ones.

    It reads the training loss of every step (that of a skipped step only when it is
    finite: a NaN loss says nothing of the weights, it may be the data's). The mean
    over the steps between two save points is a window; the first window's mean is the
    run's reference (`first_loss`), the lowest window mean so far its best
    (`best_loss`); both are saved in the `RunRecord`, so they survive resumes. A loss is
    *exploding* when it is not finite, or is both above the first window's mean and more
    than `factor` times the best: worse than early training and far worse than the
    best, which a converging run never is.

    - No checkpoint is written while the last loss explodes (`save_point` says so).
    - A step's loss is that of the weights before its update, so a checkpoint is judged
      by the next loss, that of the weights it holds: if that one explodes, the
      checkpoint is set aside (`set_aside(step)`, renamed, never deleted), and the
      newest one left predates the explosion.
    - Once the run has diverged (`set_aside_suspects`, called when it stops on it), a
      stricter rule applies to this process's checkpoints, newest first: one whose next
      loss was above the first window's mean (worse than early training) is set aside
      too, up to the first that was not. A rerun with a lower learning rate then
      resumes from weights taken before the divergence began (or starts over, when
      none is left). The stricter rule is never applied to a run that has not
      diverged: a noisy step there must not cost a good checkpoint.

    Args:
      record: the run's record (references read and written there).
      factor: how many times the best window mean an exploding loss exceeds; None
        disables the guard.
      set_aside: called with the number of a checkpoint to move out of the way and
        the loss that condemned it (the next one after it).
      chance: the loss of a uniform guess (ln of the classes for a cross-entropy):
        before the first window's mean exists, a stopped run's checkpoint whose next
        loss is above `factor` times it is suspect (`set_aside_suspects`,
        `judge_stopped_weights`); None: no such reference.

    Example:

    >>> aside = []
    >>> guard = DivergenceGuard(RunRecord({}), factor=10.0,
    ...                         set_aside=lambda step, loss: aside.append(step))
    >>> for loss in (2.0, 1.0):  # first window: mean 1.5
    ...     guard.observe(loss)
    >>> guard.save_point(), guard.saved(2)
    (True, None)
    >>> for loss in (0.5, 0.1):  # mean 0.3: the best
    ...     guard.observe(loss)
    >>> guard.save_point(), guard.saved(4)
    (True, None)
    >>> guard.observe(80.0)  # the weights of ckpt-4: 80 > 1.5 and > 10 x 0.3
    >>> aside, guard.save_point()
    ([4], False)
    """

    def __init__(
        self,
        record: RunRecord,
        *,
        factor: float | None,
        set_aside: Callable[[int, float], None] | None = None,
        chance: float | None = None,
    ) -> None:
        self.record, self.factor, self._set_aside = record, factor, set_aside
        self.chance = chance
        self._sum = 0.0
        self._count = 0
        self.last_loss = math.nan
        self._seen = False  # any loss observed by this process
        self._pending: int | None = None  # the checkpoint the next loss judges
        self._next_loss: dict[int, float] = {}  # this process's checkpoints: next loss
        self.set_aside_steps: list[int] = []

    def observe(self, loss: float, *, applied: bool = True) -> None:
        """One step's training loss (`applied`: the step's update was applied)."""
        if self.factor is None or not (applied or math.isfinite(loss)):
            return
        if applied and math.isfinite(loss):
            self._sum += loss
            self._count += 1
        self.last_loss = loss
        self._seen = True
        pending, self._pending = self._pending, None
        if pending is not None:
            self._next_loss[pending] = loss
            if self.exploding():
                self._aside(pending)

    def _aside(self, step: int) -> None:
        self.set_aside_steps.append(step)
        loss = self._next_loss.pop(step, math.nan)
        if self._set_aside is not None:
            self._set_aside(step, loss)

    def set_aside_suspects(self, kept: list[int]) -> None:
        """The run diverged: sets aside, newest first, this process's checkpoints among
        `kept` (those still on disk) whose next loss was above the first window's mean
        (before any window: above `factor` x `chance`) or not finite, up to the first
        that was not (see the class docstring)."""
        if self.factor is None:
            return
        bound = self._suspect_above()
        for step in sorted(kept, reverse=True):
            if step not in self._next_loss:
                return  # written by an earlier process, or never judged: kept
            loss = self._next_loss[step]
            if math.isfinite(loss) and not loss > bound:
                return
            self._aside(step)

    def _suspect_above(self) -> float:
        """The next loss above which a stopped run's checkpoint is suspect."""
        first = float(self.record.first_loss.numpy())
        if math.isfinite(first):
            return first
        if self.chance is not None and self.factor is not None:
            return self.factor * self.chance
        return math.inf

    def judging_a_checkpoint(self) -> bool:
        """Whether a checkpoint awaits its next loss (no loss counted since it was
        written or resumed from): the weights in memory are still its own."""
        return self.factor is not None and self._pending is not None

    def judge_stopped_weights(self, loss: float) -> None:
        """The run stopped (on skipped steps) while no loss was counted since the
        checkpoint the next loss would judge (written, or resumed from, by this
        process): the weights in memory are that checkpoint's, and `loss` is theirs on
        training examples. Their skipped steps' NaN losses were not counted (they may be
        the data's); this loss is the weights' own, and `set_aside_suspects` judges the
        checkpoint by it: a resume from weights whose loss is not finite, or worse than
        early training, would only repeat the failure.

        >>> aside = []
        >>> guard = DivergenceGuard(RunRecord({}), factor=10.0, chance=2.3,
        ...                         set_aside=lambda step, loss: aside.append((step, loss)))
        >>> guard.observe(2.3); guard.saved(1)  # step 1 applied, then saved
        >>> guard.observe(float("nan"), applied=False)  # skipped: not counted
        >>> guard.judge_stopped_weights(4e30)
        >>> guard.set_aside_suspects([1])
        >>> aside
        [(1, 4e+30)]
        """
        step, self._pending = self._pending, None
        if self.factor is not None and step is not None:
            self._next_loss[step] = loss

    def saved(self, step: int) -> None:
        """Checkpoint `step` was written: the next loss judges its weights."""
        if self.factor is not None:
            self._pending = step

    def save_point(self) -> bool:
        """Ends a window; True if a checkpoint may be written now."""
        if self.factor is None:
            return True
        if self._count:
            mean = self._sum / self._count
            self._sum, self._count = 0.0, 0
            record = self.record
            if math.isnan(float(record.first_loss.numpy())):
                record.first_loss.assign(mean)
            best = float(record.best_loss.numpy())
            if math.isnan(best) or mean < best:
                record.best_loss.assign(mean)
        return not self.exploding()

    def exploding(self) -> bool:
        """Whether the last loss (see the class docstring) says the run is exploding."""
        if self.factor is None or not self._seen:
            return False
        last = self.last_loss
        if not math.isfinite(last):
            return True
        first = float(self.record.first_loss.numpy())
        best = float(self.record.best_loss.numpy())
        if math.isnan(first) or math.isnan(best):
            return False
        return last > first and last > self.factor * best
