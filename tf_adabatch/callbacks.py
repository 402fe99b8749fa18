"""Keras callbacks for `model.fit` with the adaptive engine (see `tf_adabatch.attach`)."""

from __future__ import annotations

import math
import os
from typing import Any

import keras
import tensorflow as tf

from tf_adabatch import summaries
from tf_adabatch._checks import real
from tf_adabatch.keras_fit import ProgressBudgetLike, attached_engine, block_logs

__all__ = ["AdaBatchTensorBoard", "ProgressBudget"]


class AdaBatchTensorBoard(keras.callbacks.Callback):
    """Writes the adaptive step's TensorBoard scalars from `model.fit`.

    The same tags as `Trainer.fit(summary_dir=...)` (`tf_adabatch.summaries`), in two
    runs under `log_dir`, as Keras's own TensorBoard callback lays them out: in
    `log_dir/train` every optimizer step `adabatch/*` (with the policy's bounds and
    target as lines) and `loss` (that step's loss, not the epoch's running mean the
    progress bar shows), with the optimizer step as x-axis, and the custom-scalars
    layout once; in `log_dir/eval`, at each epoch end, Keras's `val_<metric>` logs
    under `<metric>` (so train and eval loss share one chart). The per-step values
    come from the engine, not from the logs (which hold only a few of them).

    Args:
      log_dir: the log root; the runs `train` and `eval` are created in it.

    Raises:
      ValueError: at the start of training, if the model is not prepared by
        `tf_adabatch.attach`.

    Example:

    >>> import os, tempfile
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> model.compile(optimizer="sgd", loss="mse")
    >>> engine = tf_adabatch.attach(model, micro_batch_size=4)
    >>> log_dir = tempfile.mkdtemp()
    >>> x = np.ones((12, 2), "float32")
    >>> _ = model.fit(x, x[:, 0], batch_size=4, verbose=0,
    ...               callbacks=[AdaBatchTensorBoard(log_dir)])
    >>> train_run = os.path.join(log_dir, "train")
    >>> [step for step, _ in tf_adabatch.summaries.read_scalars(train_run)["adabatch/gain"]]
    [1, 2, 3]
    """

    def __init__(self, log_dir: str) -> None:
        super().__init__()
        if not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(
                f"Argument `log_dir` must be a path (str or os.PathLike). Received: log_dir={log_dir!r}"
            )
        self.log_dir = os.fspath(log_dir)
        self._writer: tf.summary.SummaryWriter | None = None
        self._eval_writer: tf.summary.SummaryWriter | None = None
        self._step = 0

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        engine = attached_engine(self.model, "AdaBatchTensorBoard")
        self._policy = engine.policy
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(
                os.path.join(self.log_dir, summaries.TRAIN_RUN)
            )
            self._eval_writer = tf.summary.create_file_writer(
                os.path.join(self.log_dir, summaries.EVAL_RUN)
            )
            summaries.write_layout(self._writer, policy=self._policy)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        # Every step of the call that just ended (several with `steps_per_execution`).
        block = block_logs(self.model)
        if not block or self._writer is None:
            return
        for row in zip(*block.values(), strict=True):
            values = {name: float(v) for name, v in zip(block, row, strict=True)}
            self._step = int(values["step"])
            summaries.write_step(self._writer, self._step, values, policy=self._policy)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._eval_writer is None:
            return
        results = {
            name[4:]: float(value)
            for name, value in (logs or {}).items()
            if name.startswith("val_")
        }
        if results:
            summaries.write_eval(self._eval_writer, self._step, results)
        self._eval_writer.flush()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        for writer in (self._writer, self._eval_writer):
            if writer is not None:
                writer.flush()


class ProgressBudget(keras.callbacks.Callback, ProgressBudgetLike):
    """Stops `model.fit` once the scale-invariant progress tau reaches a budget.

    tau counts base-batch steps (AdaScale: tau += gain per optimizer step; the other
    rules: += S), so the natural budget is the length of the base learning-rate
    schedule. With a budget, give `fit` enough `epochs` x `steps_per_epoch`: the run
    ends at the budget, usually well before.

    Args:
      base_steps: the budget, in base-batch steps.

    Raises:
      ValueError: if `base_steps` is not positive; at the start of training, if the
        model is not prepared by `tf_adabatch.attach` (with `tf_adabatch.Trainer`,
        use `Trainer.fit(until_progress=...)`).

    Example:

    >>> budget = ProgressBudget.from_epochs(10, num_examples=60000, base_batch_size=128)
    >>> budget.base_steps
    4688
    """

    def __init__(self, base_steps: float) -> None:
        super().__init__()
        real("base_steps", base_steps, "a finite number > 0", lambda v: 0 < v < math.inf)
        self.base_steps = base_steps

    @classmethod
    def from_epochs(
        cls, epochs: float, *, num_examples: int, base_batch_size: int
    ) -> ProgressBudget:
        """The budget of `epochs` passes over `num_examples` at the base batch size."""
        return cls(math.ceil(epochs * num_examples / base_batch_size))

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._engine = attached_engine(self.model, "ProgressBudget")

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if float(self._engine.state.progress.numpy()) >= self.base_steps:
            self.model.stop_training = True
