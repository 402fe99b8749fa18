"""`run(config, workdir)`: one training job from an ml_collections config.

The launch script only parses flags and calls `run`. `run` builds the job (the
factories), resumes it (`checkpoints`), and drives `Trainer.fit` as the inner loop with
the outer loop's actions as named parts, each holding its own state (in the spirit of
orbit's `Controller` and actions):

- `EvaluateEvery` runs the `Evaluation` (test set, eval summaries) each time the progress
  passes another `train.eval_every_base_epochs`;
- `CheckpointEvery` saves every `train.checkpoint_every_steps` optimizer steps, and once
  more at the end; after a SIGTERM its `PreemptionWatch` (`tf_adabatch.app.preemption`)
  saves at the step every worker agrees on and raises `Preempted`;
- `write_metrics` writes the closing summary, `metrics.json`.

Workdir layout:
    checkpoints/        tf.train.CheckpointManager (model, optimizer, adaptive state);
                        fingerprint.json: what a resume must not change;
                        config.json: the settings of the run writing them (a
                        resume names the fields it changes)
    tensorboard/train/  adabatch/*, loss every optimizer step
    tensorboard/eval/   loss, accuracy at each evaluation (same tags: TensorBoard
                        overlays train and eval loss), and adabatch/train_seconds:
                        seconds spent training so far, evaluations excluded
    metrics.json        written at the end
    worker-<i>/         multi-worker: the same files of each non-chief worker

Multi-worker (MultiWorkerMirroredStrategy): give every worker the same workdir (a
shared filesystem); see `tf_adabatch.app.workers`. Relaunch all workers with the same
command to resume after `WorkerLostError`.

Resuming takes the newest checkpoint that reads back intact; see
`tf_adabatch.app.checkpoints`.
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tf_adabatch import summaries
from tf_adabatch.app import checkpoints, factories, records, workers
from tf_adabatch.app import preemption as preemption_lib
from tf_adabatch.app.config import ConfigError, check_workdir, validate_config
from tf_adabatch.app.data import pipeline
from tf_adabatch.app.workdir import WorkdirLock, WriteError, check_writable
from tf_adabatch.clock import Clock, WallClock
from tf_adabatch.engine import NonFiniteGradientsError
from tf_adabatch.step_logs import BLOCK_SECONDS
from tf_adabatch.trainer import Trainer

__all__ = [
    "ChargeSteps",
    "CheckpointEvery",
    "EvaluateEvery",
    "Evaluation",
    "RecordingCheckpointManager",
    "TrainClock",
    "run",
    "total_steps",
    "write_metrics",
]

Log = Callable[..., None]


def total_steps(trainer: Trainer) -> int:
    """Optimizer steps taken, skipped ones included: the x-axis of every summary.

    >>> from tf_adabatch import StaticPolicy
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                   micro_batch_size=4, policy=StaticPolicy(4), similarity="estimated")
    >>> total_steps(trainer)
    0
    """
    return int(trainer.state.steps.numpy() + trainer.state.skipped_steps.numpy())


class TrainClock:
    """Seconds spent training, evaluations excluded: time-to-accuracy's x-axis.

    With the host's clock (`step_clock` a `WallClock`), it is the process's elapsed
    time less the evaluations: checkpoint saves are included (a real run pays for
    them). With a virtual clock it is the sum of the steps' charged seconds
    (`charge`, called with each step's `step_time` by `ChargeSteps`): the profiled
    hardware's training time, with nothing of this host's in it. `offset` is what the
    run's earlier processes spent (restored from the checkpoint's `RunRecord`), so a
    resumed run's clock goes on from there. `name` is the step clock's.

    >>> clock = TrainClock(offset=100.0)
    >>> clock.exclude(clock.seconds() - 100.0 + 60.0)  # an evaluation took a minute
    >>> clock.seconds() < 100.0, clock.name
    (True, 'wall')
    >>> from tf_adabatch import StepTimeModel, VirtualClock
    >>> virtual = TrainClock(offset=1.0, step_clock=VirtualClock(
    ...     StepTimeModel(compute_fixed=0.5, compute_per_example=0.0), devices=1, profile="p"))
    >>> virtual.charge(0.5); virtual.charge(0.5); virtual.seconds(), virtual.name
    (2.0, 'virtual:px1')
    """

    def __init__(self, *, offset: float = 0.0, step_clock: Clock | None = None) -> None:
        self.start = time.time()
        self.offset = offset
        self.excluded = 0.0
        self.step_clock = step_clock or WallClock()
        self.virtual = not self.step_clock.measures_host
        self.charged = 0.0
        self.name = self.step_clock.name

    def exclude(self, seconds: float) -> None:
        """Takes `seconds` (spent evaluating) out of the training time."""
        self.excluded += seconds

    def charge(self, seconds: float) -> None:
        """Adds a step's charged seconds (a virtual clock's; ignored by the host's)."""
        if self.virtual and math.isfinite(seconds):
            self.charged += seconds

    def seconds(self) -> float:
        if self.virtual:
            return self.offset + self.charged
        return self.offset + time.time() - self.start - self.excluded


class ChargeSteps(keras.callbacks.Callback):
    """Charges each step's `step_time` to a virtual `TrainClock` (first of the loop's actions).

    With `steps_per_execution`, `Trainer.fit` calls it once per block with the sum of
    the block's step times (`block_seconds`), which is what it charges then.

    >>> from tf_adabatch import StepTimeModel, VirtualClock
    >>> clock = TrainClock(step_clock=VirtualClock(
    ...     StepTimeModel(compute_fixed=0.25, compute_per_example=0.0), devices=1))
    >>> ChargeSteps(clock).on_train_batch_end(0, {"step_time": 0.25})
    >>> ChargeSteps(clock).on_train_batch_end(3, {"step_time": 0.25, "block_seconds": 0.75})
    >>> clock.seconds()
    1.0
    """

    def __init__(self, clock: TrainClock) -> None:
        super().__init__()
        self.clock = clock

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is None:
            return
        seconds = logs.get(BLOCK_SECONDS, logs.get("step_time"))
        if seconds is not None:
            self.clock.charge(float(seconds))


class Evaluation:
    """The evaluate action: the test set at the current step, written to the eval run.

    At most once per step: called again at the same step (the last step is also the
    final evaluation), it returns the result it has.

    Args:
      trainer: the job's trainer.
      dataset: the test set, in global batches.
      logdir: the eval run (`tensorboard/eval`): loss and metrics under
        `summaries.eval_tag`, and `summaries.TRAIN_SECONDS`.
      clock: the training clock; the evaluation's time is taken out of it.
      base_steps: the progress budget, for the log line.
      log: prints a line (or nothing).

    >>> import tempfile
    >>> from tf_adabatch import StaticPolicy
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                   micro_batch_size=4, policy=StaticPolicy(4), similarity="estimated")
    >>> test = tf.data.Dataset.from_tensor_slices((tf.ones((8, 2)), tf.zeros((8, 1)))).batch(4)
    >>> evaluation = Evaluation(trainer, test, tempfile.mkdtemp(), TrainClock(),
    ...                         base_steps=10, log=print)
    >>> sorted(evaluation())  # doctest: +ELLIPSIS
    Evaluation at step 0 (progress 0.0/10): loss ...
    ['loss']
    """

    def __init__(
        self,
        trainer: Trainer,
        dataset: tf.data.Dataset,
        logdir: str,
        clock: TrainClock,
        *,
        base_steps: int,
        log: Log,
        metrics: dict[str, Any] | None = None,
    ) -> None:
        self.trainer, self.dataset, self.clock = trainer, dataset, clock
        self.base_steps, self.log, self.metrics = base_steps, log, metrics
        self.writer = tf.summary.create_file_writer(logdir)
        self.step: int | None = None  # of the last evaluation
        self.result: dict[str, float] = {}

    def __call__(self, *, newline: bool = False) -> dict[str, float]:
        """Evaluates (unless this step was evaluated) and returns {"loss": ..., metric: ...}.

        Args:
          newline: start the log line on a new line (a progress bar's is unfinished).
        """
        step = total_steps(self.trainer)
        if self.step == step:
            return self.result
        began, trained = time.time(), self.clock.seconds()
        result = self.trainer.evaluate(self.dataset, metrics=self.metrics)
        values = ", ".join(f"{name} {value:.4f}" for name, value in sorted(result.items()))
        prefix = "\n" if newline else ""
        self.log(
            f"{prefix}Evaluation at step {step} "
            f"(progress {self.trainer.progress:.1f}/{self.base_steps}): {values}"
        )
        with self.writer.as_default(step=step):
            for name, value in result.items():
                tf.summary.scalar(summaries.eval_tag(name), value)
            tf.summary.scalar(
                summaries.TRAIN_SECONDS,
                trained,
                description=f"Seconds of training so far, evaluations excluded ({self.clock.name} clock).",
            )
        self.writer.flush()
        self.step, self.result = step, result
        self.clock.exclude(time.time() - began)
        return result


class EvaluateEvery(keras.callbacks.Callback):
    """Runs `evaluation` each time the progress τ passes another multiple of `every`.

    Args:
      evaluation: called with `newline=newline` (the progress bar's line is unfinished).
      every: progress between evaluations, in base-batch steps.
      progress: the progress now (a resumed run goes on from the next multiple).
      newline: passed to `evaluation`.

    >>> action = EvaluateEvery(lambda newline: print("evaluate"), every=10.0, progress=12.0)
    >>> action.next_at
    20.0
    >>> action.on_train_batch_end(0, {"progress": 19.5})
    >>> action.on_train_batch_end(1, {"progress": 20.5})
    evaluate
    >>> action.next_at
    30.0
    >>> action.on_train_batch_end(9, {"progress": 52.0})  # a block past 30 and 40: once
    evaluate
    >>> action.next_at
    60.0
    """

    def __init__(
        self,
        evaluation: Callable[..., Any],
        *,
        every: float,
        progress: float,
        newline: bool = False,
    ) -> None:
        super().__init__()
        self.evaluation, self.every, self.newline = evaluation, every, newline
        self.next_at = self._mark_after(progress)

    def _mark_after(self, progress: float) -> float:
        """The first multiple of `every` above `progress`."""
        return (math.floor(progress / self.every) + 1) * self.every

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        progress = float(logs.get("progress", 0.0)) if logs else 0.0
        if math.isfinite(progress) and progress >= self.next_at:
            # Past every mark this step (or block of steps) crossed: one evaluation.
            self.next_at = self._mark_after(progress)
            self.evaluation(newline=self.newline)


class RecordingCheckpointManager(tf.train.CheckpointManager):
    """TensorFlow's `CheckpointManager` whose saves update the run's record first and fail
    with one line.

    Args:
      checkpoint, directory, max_to_keep: as for `tf.train.CheckpointManager`.
      before_save: called before each save (it writes the `RunRecord`'s seconds).

    Raises (from `save`):
      WriteError: the checkpoint could not be written (disk full, a file-size limit,
        a read-only folder); the earlier checkpoints are untouched, and what the failed
        save left (`ckpt-N_temp*`) is removed at the next resume.

    >>> import tempfile
    >>> v = tf.Variable(0.0)
    >>> calls = []
    >>> manager = RecordingCheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 2,
    ...                                      before_save=lambda: calls.append(1))
    >>> os.path.basename(manager.save(checkpoint_number=7)), calls
    ('ckpt-7', [1])
    """

    def __init__(
        self,
        checkpoint: tf.train.Checkpoint,
        directory: str,
        max_to_keep: int,
        *,
        before_save: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(checkpoint, directory, max_to_keep=max_to_keep)
        self.before_save = before_save

    def save(
        self, checkpoint_number: Any = None, check_interval: bool = True, options: Any = None
    ) -> Any:
        if self.before_save is not None:
            self.before_save()
        try:
            return super().save(checkpoint_number, check_interval=check_interval, options=options)
        except (OSError, tf.errors.OpError) as err:
            raise WriteError(
                os.path.join(self.directory, f"ckpt-{checkpoint_number}"),
                err,
                "the earlier checkpoints are untouched: free space or fix the folder, then rerun",
            ) from err


class CheckpointEvery(keras.callbacks.Callback):
    """Saves every `every` optimizer steps (skipped ones counted), and once at the end.

    It is told of the steps at the end of each call of the step (a block of steps with
    `train.steps_per_execution`): it saves when the steps passed a multiple of `every`
    since it was last told, at the block's last step (so with blocks a checkpoint's
    number need not be a multiple of `every`).

    Never while steps are being skipped: if the run stops on `NonFiniteGradientsError`,
    its last checkpoint predates the skipped steps (unless a preemption saved inside the
    streak: that checkpoint counts the skips, and resuming from it is exact).

    Nor while the loss explodes (`guard`, a `records.DivergenceGuard`): then the newest
    checkpoint predates the explosion, and a rerun with a lower learning rate resumes
    from good weights.

    Args:
      manager: where to save.
      every: optimizer steps between saves.
      restored_step: the step of the checkpoint resumed from (0 for a new run).
      preemption: told of every step after the periodic save (`PreemptionWatch.after_step`:
        after a SIGTERM it saves at the step the workers agree on and raises `Preempted`).
      guard: told of every applied step's loss; consulted at each save point.

    >>> import tempfile
    >>> v = tf.Variable(0.0)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 5)
    >>> action = CheckpointEvery(manager, every=2, restored_step=0)
    >>> for step in (1, 2, 3):
    ...     action.on_train_batch_end(step - 1, {"step": step, "consecutive_skips": 0.0})
    >>> action.on_train_batch_end(6, {"step": 7, "consecutive_skips": 0.0})  # a block: 4-7
    >>> action.save_final(step=7, consecutive_skips=0)  # saved already
    >>> [os.path.basename(p) for p in manager.checkpoints]
    ['ckpt-2', 'ckpt-7']
    """

    def __init__(
        self,
        manager: tf.train.CheckpointManager,
        *,
        every: int,
        restored_step: int,
        preemption: preemption_lib.PreemptionWatch | None = None,
        guard: records.DivergenceGuard | None = None,
    ) -> None:
        super().__init__()
        self.manager, self.every = manager, every
        self.preemption, self.guard = preemption, guard
        self.told = restored_step  # the last step it was told of
        self.saved = restored_step  # the last step saved (or resumed from)

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        step = int(logs.get("step", 0))
        if self.guard is not None:
            self.guard.observe(
                float(logs.get("loss", math.nan)), applied=bool(logs.get("applied", 1.0))
            )
        passed = step // self.every > self.told // self.every  # (one step: step % every == 0)
        self.told = step
        if passed and not logs.get("consecutive_skips", 0.0) and self._healthy():
            self._save(step)
        if self.preemption is not None:
            self.preemption.after_step(step)

    def _healthy(self) -> bool:
        return self.guard is None or self.guard.save_point()

    def _save(self, step: int) -> None:
        self.manager.save(checkpoint_number=step)
        self.saved = step
        if self.guard is not None:
            self.guard.saved(step)

    def save_final(self, *, step: int, consecutive_skips: int) -> None:
        """A final checkpoint unless the last step's save took it, or nothing was trained
        (or the run ends skipping or exploding).

        Decided from the state (and the all-reduced losses) alone, so that every worker
        decides alike.
        """
        due = step != self.saved and not consecutive_skips
        if due and self._healthy():
            self._save(step)


#: The text datasets' evaluation: the validation loss in bits per byte (nats / ln 2).
BITS = "bits_per_byte"


def bits_per_byte(y_true: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    """Per-position cross-entropy of next-byte `logits` in bits.

    >>> float(bits_per_byte(tf.constant([[1]]), tf.zeros((1, 1, 4)))[0, 0])  # uniform over 4
    2.0
    """
    nats = keras.losses.sparse_categorical_crossentropy(y_true, logits, from_logits=True)
    return nats / math.log(2.0)


def eval_metrics(dataset: str) -> dict[str, Any]:
    """What an evaluation reports besides the loss: accuracy (per position for text), and
    for a text dataset the loss in bits per byte.

    >>> sorted(eval_metrics("python_text")), sorted(eval_metrics("digits"))
    (['accuracy', 'bits_per_byte'], ['accuracy'])
    """
    metrics: dict[str, Any] = {"accuracy": keras.metrics.sparse_categorical_accuracy}
    if dataset in pipeline.TEXT_DATASETS:
        metrics[BITS] = bits_per_byte
    return metrics


def write_metrics(
    path: str,
    trainer: Trainer,
    result: dict[str, float],
    *,
    base_steps: int,
    wall_time_s: float,
    train_seconds: float,
    replicas: int,
    processes: int = 1,
    clock: str = "wall",
) -> dict[str, Any]:
    """The summary action at the end: the final metrics, written to `path` (metrics.json).

    `wall_time_s` and `train_seconds` are the whole run's, over its `processes` (a
    resumed run's earlier processes included, from the checkpoint's `RunRecord`);
    steps and examples are the adaptive state's, which counts them over the run too.
    `clock` names where `train_seconds` comes from: "wall" (this host) or
    "virtual:<profile>x<devices>" (a measured profile's prediction; `wall_time_s` is
    still this host's).

    Raises:
      WriteError: `path` cannot be written (the checkpoints are intact: rerunning
        the job writes it).

    >>> import tempfile
    >>> from tf_adabatch import StaticPolicy
    >>> model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    >>> trainer = Trainer(model, loss="mse", optimizer=keras.optimizers.SGD(0.1),
    ...                   micro_batch_size=4, policy=StaticPolicy(4), similarity="estimated")
    >>> path = os.path.join(tempfile.mkdtemp(), "metrics.json")
    >>> metrics = write_metrics(path, trainer, {"accuracy": 0.5, "loss": 1.0}, base_steps=10,
    ...                         wall_time_s=2.0, train_seconds=1.0, replicas=1)
    >>> metrics["test_accuracy"], metrics["optimizer_steps"], os.path.exists(path)
    (0.5, 0, True)
    """
    state = trainer.state
    steps = int(state.steps.numpy())
    samples = int(state.samples_seen.numpy())
    metrics = {
        "test_accuracy": result["accuracy"],
        "test_loss": result["loss"],
        **({"test_bits_per_byte": result[BITS]} if BITS in result else {}),
        "optimizer_steps": steps,
        "skipped_steps": int(state.skipped_steps.numpy()),
        "examples_seen": samples,
        "average_batch_size": samples / max(1, steps + int(state.skipped_steps.numpy())),
        "progress": trainer.progress,
        "base_steps": base_steps,
        "wall_time_s": wall_time_s,
        "train_seconds": train_seconds,
        "clock": clock,
        "processes": processes,
        "replicas": replicas,
    }
    try:
        checkpoints.write_json_atomically(path, metrics, indent=2, sort_keys=False)
    except OSError as err:
        raise WriteError(
            path, err, "training finished and its checkpoints are intact: rerun to write it"
        ) from err
    return metrics


def _build(
    config: ml_collections.ConfigDict,
    strategy: tf.distribute.Strategy,
    input_shape: tuple[int, ...],
    num_classes: int,
    base_steps: int,
) -> tuple[keras.Model, Trainer]:
    """The model, optimizer and trainer; what only the built strategy shows is a ConfigError."""
    with strategy.scope():
        try:
            model = factories.make_model(config, input_shape, num_classes)
        except ValueError as err:  # e.g. the CNN's poolings on 8x8 images
            raise ConfigError(
                f"Config fields `model`, `dataset`: model {config.model!r} cannot take "
                f"dataset {config.dataset!r} inputs of shape {input_shape} "
                f"({' '.join(str(err).split())[:200]})"
            ) from err
        optimizer = factories.make_optimizer(config, base_steps)
    try:
        trainer = Trainer(
            model,
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            optimizer=optimizer,
            micro_batch_size=config.micro_batch_size,
            base_batch_size=config.base_batch_size,
            policy=factories.make_policy(config, base_steps),
            similarity=config.similarity,
            max_consecutive_skips=config.train.max_consecutive_skips,
            rollback=config.train.rollback,
            strategy=strategy,
            clock=factories.make_clock(config),
        )
    except ValueError as err:  # what only the built strategy shows (multi-worker, TPU)
        raise ConfigError(f"Config: {err}") from err
    return model, trainer


def run(config: ml_collections.ConfigDict, workdir: str, *, verbose: int = 1) -> dict[str, Any]:
    """Trains `config` in `workdir`, resuming from its last checkpoint if there is one.

    Args:
      config: see `configs/base.py` for every field.
      workdir: output folder (created if needed).
      verbose: 1 shows a progress bar and a closing line; 0 prints nothing.

    Returns:
      The final metrics, also written to `workdir/metrics.json`.

    Raises:
      ConfigError: for a config value that breaks a rule, or a workdir that is not
        a writable folder (or `train.preemption` outside the main thread).
      ResumeError: the workdir has checkpoints but none is readable (a damaged newer
        one is passed over with a warning when an older one is intact), or another
        job wrote them (a different model, dataset, seed, loss, optimizer kind,
        policy kind or variables; see `fingerprint.json` beside them).
      NonFiniteGradientsError: after `train.max_consecutive_skips` non-finite steps in
        a row (no checkpoint is written while skipping: the last one predates them).
      WorkerLostError: multi-worker only, when another worker died (or the workers
        restored different checkpoints).
      Preempted: after a SIGTERM (with `train.preemption`, the default), once the
        checkpoint of the step every worker agreed on is written (`launch/train.py`
        exits 143); rerunning resumes from it. The previous SIGTERM handler is back
        when `run` returns or raises.

    Example (two optimizer steps of the synthetic config on one device):

    >>> import tempfile
    >>> from configs import synthetic
    >>> config = synthetic.get_config()
    >>> config.strategy, config.train.max_steps = "one_device", 2
    >>> metrics = run(config, tempfile.mkdtemp(), verbose=0)
    >>> metrics["optimizer_steps"], metrics["examples_seen"] >= 2 * 32  # batch starts at 32
    (2, True)
    """
    validate_config(config)
    check_workdir(workdir)
    # Installed first: a SIGTERM during the start-up is kept and acted on in the first steps.
    watch = None
    if config.train.preemption:
        if threading.current_thread() is not threading.main_thread():
            raise ConfigError(
                "Config field `train.preemption` must be False when `run` is called outside "
                "the main thread (only the main thread can install a SIGTERM handler). "
                "Received: train.preemption=True"
            )
        watch = preemption_lib.PreemptionWatch()
    clean = False
    try:
        metrics = _run(config, workdir, verbose=verbose, watch=watch)
        clean = True
    except preemption_lib.Preempted:
        clean = True
        raise
    finally:
        if watch is not None:
            watch.close(clean=clean)
    return metrics


def _run(
    config: ml_collections.ConfigDict,
    workdir: str,
    *,
    verbose: int,
    watch: preemption_lib.PreemptionWatch | None,
) -> dict[str, Any]:
    """`run` once validated, with the SIGTERM watch installed (or None)."""
    log: Log = print if verbose else (lambda *args: None)
    start = time.time()
    strategy = factories.make_strategy(config)
    if watch is not None:  # a multi-worker strategy's coordination service took SIGTERM
        watch.reinstall()
    # One run per folder: each process holds its own (the chief the workdir), before
    # anything in it is read.
    chief, worker_name = workers.identify(strategy)
    outdir = workdir if chief else os.path.join(workdir, worker_name)
    lock = WorkdirLock(outdir)
    try:
        return _run_locked(
            config,
            workdir,
            strategy,
            chief,
            outdir,
            verbose=verbose,
            watch=watch,
            start=start,
            log=log,
            multi_worker=bool(worker_name),
        )
    finally:
        lock.release()


def _run_locked(
    config: ml_collections.ConfigDict,
    workdir: str,
    strategy: tf.distribute.Strategy,
    chief: bool,
    outdir: str,
    *,
    verbose: int,
    watch: preemption_lib.PreemptionWatch | None,
    start: float,
    log: Log,
    multi_worker: bool,
) -> dict[str, Any]:
    """`_run` with the strategy built and `outdir` locked."""
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    try:
        (x, y), (x_test, y_test), num_classes = pipeline.load_arrays(
            config.dataset, seed=config.seed
        )
    except ValueError as err:  # e.g. a corpus that is not the pinned one
        raise ConfigError(f"Config field `dataset` ({config.dataset!r}): {err}") from err
    durations = factories.Durations.of(config, len(x))
    base_steps = durations.base_steps
    model, trainer = _build(config, strategy, tuple(x.shape[1:]), num_classes, base_steps)

    # Resume: every worker from the chief's checkpoints (the same state everywhere);
    # only the chief renames damaged ones and rewrites the state file.
    own_dir = os.path.join(outdir, "checkpoints")  # this process's (the chief's: chief_dir)
    tensorboard = os.path.join(outdir, "tensorboard")
    check_writable(own_dir, os.path.join(tensorboard, "train"), os.path.join(tensorboard, "eval"))
    removed = checkpoints.clean_temporaries(own_dir)
    chief_dir = os.path.join(workdir, "checkpoints")
    fingerprint = checkpoints.fingerprint(config, model, num_classes)
    current_settings = checkpoints.settings(config)
    # Checked against fingerprint.json, or the newest checkpoint's copy without it.
    checkpoints.check_fingerprint(chief_dir, fingerprint)
    record = records.RunRecord(fingerprint)
    # The trainer restores a checkpoint of another topology too (`Trainer.restore`).
    latest, notes = checkpoints.restore_newest_readable(trainer, chief_dir, repair=chief)
    for note in notes:
        print(f"warning: {note}; resuming from {latest}", file=sys.stderr)
    # What killed saves left: temporaries (removed), older incomplete checkpoints (set
    # aside, kept): one line.
    leftovers = []
    if removed:
        leftovers.append(f"removed the unmerged save temporaries {', '.join(removed)}")
    if latest and chief:
        restored_number = int(latest.rsplit("-", 1)[1])
        aside = checkpoints.set_aside_leftovers(chief_dir, restored_number)
        if aside:
            leftovers.append(
                f"set aside {', '.join(aside)} as ckpt-N.leftover-<time>.* in {chief_dir}"
            )
    if leftovers:
        print(f"warning: leftovers of killed saves: {'; '.join(leftovers)}", file=sys.stderr)
    if latest:
        record.restore_from(latest)
        log(
            f"Resumed from {latest}: step {int(trainer.state.steps.numpy())}, progress {trainer.progress:.1f}/{base_steps}"
        )
        moved = trainer.engine.carry_batch_over()  # another replica count or micro-batch
        if moved:
            log(moved)
        changed = checkpoints.changed_settings(chief_dir, current_settings) if chief else []
        if changed:
            log(f"Settings changed since these checkpoints were written: {'; '.join(changed)}")
    if chief:  # before the first save: each checkpoint is written with it in place
        try:
            os.makedirs(chief_dir, exist_ok=True)
            checkpoints.write_fingerprint(chief_dir, fingerprint)
            checkpoints.write_settings(chief_dir, current_settings)
        except OSError as err:
            raise WriteError(
                getattr(err, "filename", None) or chief_dir, err, "nothing was trained"
            ) from err

    # The run's records go on from the checkpoint's (this process adds its share).
    clock = TrainClock(offset=float(record.train_seconds.numpy()), step_clock=trainer.engine.clock)
    wall_offset = float(record.wall_seconds.numpy())
    processes = int(record.processes.numpy()) + 1

    def update_record() -> None:
        record.train_seconds.assign(clock.seconds())
        record.wall_seconds.assign(wall_offset + time.time() - start)
        record.processes.assign(processes)

    checkpoint = tf.train.Checkpoint(**trainer.checkpoint_parts(), **{records.RECORD_KEY: record})
    if latest:  # the saves go on counting (the trainer restored its own checkpoint object)
        checkpoint.save_counter.assign(
            tf.train.load_checkpoint(latest).get_tensor("save_counter/.ATTRIBUTES/VARIABLE_VALUE")
        )
    manager = RecordingCheckpointManager(
        checkpoint,
        own_dir,
        max_to_keep=2,
        before_save=update_record,
    )
    if watch is not None:  # every worker, on its own manager
        watch.start(strategy, manager)

    # The input, and the outer loop's actions.
    samples = int(trainer.state.samples_seen.numpy())
    dataset_fn = pipeline.train_dataset_fn(
        x,
        y,
        micro_batch_size=config.micro_batch_size,
        seed=config.seed,
        skip_micro_batches=samples // config.micro_batch_size,
    )
    iterator = iter(trainer.distribute(dataset_fn))
    evaluation = Evaluation(
        trainer,
        pipeline.eval_dataset(x_test, y_test, config.train.eval_batch_size),
        os.path.join(tensorboard, "eval"),
        clock,
        base_steps=base_steps,
        log=log,
        metrics=eval_metrics(config.dataset),
    )
    restored = total_steps(trainer)  # the step of the checkpoint resumed from (0 for a new run)

    def set_aside(step: int, loss: float) -> None:  # the loss rose right after ckpt-`step`
        moved = checkpoints.set_aside(own_dir, step, "diverged")
        print(
            f"warning: the training loss right after ckpt-{step} was {loss:.4g} (the run "
            f"diverged); set aside as {moved}",
            file=sys.stderr,
        )

    guard = records.DivergenceGuard(
        record,
        factor=config.train.divergence_factor,
        set_aside=set_aside,
        chance=math.log(num_classes),
    )
    if latest:  # the next loss judges the resumed weights too
        guard.saved(restored)
    # Training examples for the loss of the weights in memory, when a stop must judge them.
    train_check = pipeline.eval_dataset(
        x[: len(x_test)], y[: len(x_test)], config.train.eval_batch_size
    )

    def train_loss() -> float:
        return float(trainer.evaluate(train_check, metrics=evaluation.metrics)["loss"])

    def judge_stopped_weights() -> None:
        # Stopped on skips with no step applied since the newest checkpoint (written or
        # resumed from): the weights in memory are its own; their loss judges it.
        if guard.judging_a_checkpoint():
            guard.judge_stopped_weights(train_loss())

    saving = CheckpointEvery(
        manager,
        every=config.train.checkpoint_every_steps,
        restored_step=restored,
        preemption=watch,
        guard=guard,
    )
    evaluating = EvaluateEvery(
        evaluation, every=durations.eval_every, progress=trainer.progress, newline=bool(verbose)
    )
    remaining = None
    if config.train.max_steps is not None:
        remaining = max(0, config.train.max_steps - restored)
    try:
        if multi_worker:
            workers.check_same_checkpoint(strategy, restored)
        try:
            trainer.fit(
                iterator,
                steps=remaining,
                until_progress=float(base_steps),
                summary_dir=os.path.join(tensorboard, "train"),
                callbacks=[ChargeSteps(clock), evaluating, saving],  # in this order
                verbose=verbose,
                steps_per_execution=config.train.steps_per_execution,
            )
        except NonFiniteGradientsError as err:
            judge_stopped_weights()
            guard.set_aside_suspects(checkpoints.checkpoint_numbers(own_dir))
            raise NonFiniteGradientsError(
                f"{err} {_newest_checkpoint(own_dir, guard.set_aside_steps)}"
            ) from err
        saving.save_final(
            step=total_steps(trainer),
            consecutive_skips=int(trainer.state.consecutive_skips.numpy()),
        )
        result = evaluation()
    except workers.PEER_ERRORS as err:
        if not multi_worker:
            raise
        raise workers.worker_lost(err, chief_dir) from err
    if int(trainer.state.consecutive_skips.numpy()):
        judge_stopped_weights()
    _check_converging(trainer, guard, result, own_dir, train_loss=train_loss)
    metrics = write_metrics(
        os.path.join(outdir, "metrics.json"),
        trainer,
        result,
        base_steps=base_steps,
        wall_time_s=wall_offset + time.time() - start,
        train_seconds=clock.seconds(),
        replicas=strategy.num_replicas_in_sync,
        processes=processes,
        clock=clock.name,
    )
    bits = f", {metrics['test_bits_per_byte']:.4f} bits per byte" if BITS in result else ""
    log(
        f"Final test accuracy {metrics['test_accuracy']:.4f}, loss {metrics['test_loss']:.4f}{bits}; {metrics['optimizer_steps']} optimizer steps, average batch {metrics['average_batch_size']:.0f}; metrics in {os.path.join(outdir, 'metrics.json')}"
    )
    return metrics


def _newest_checkpoint(directory: str, set_aside: list[int] | None = None) -> str:
    """What a rerun of the workdir does: the checkpoint it resumes from, or that it
    starts over; and the checkpoints set aside (kept, renamed), if any.

    >>> import tempfile
    >>> _newest_checkpoint(tempfile.mkdtemp(), [1])
    'No checkpoint is left to resume from (set aside, kept as ckpt-N.diverged-*: ckpt-1): a rerun of this workdir starts over from step 0; lower the learning rate first.'
    """
    numbers = checkpoints.checkpoint_numbers(directory)
    aside = ""
    if set_aside:
        names = ", ".join(f"ckpt-{n}" for n in sorted(set(set_aside), reverse=True))
        aside = f" (set aside, kept as ckpt-N.diverged-*: {names})"
    if not numbers:
        return (
            f"No checkpoint is left to resume from{aside}: a rerun of this workdir starts "
            "over from step 0; lower the learning rate first."
        )
    return (
        f"A rerun of this workdir resumes from ckpt-{numbers[0]}, the newest checkpoint "
        f"left{aside}, which predates the skipped (and any exploding) steps: rerun with a "
        "lower learning rate to go on from it, or use a new --workdir to start over."
    )


def _check_converging(
    trainer: Trainer,
    guard: records.DivergenceGuard,
    result: dict[str, float],
    directory: str,
    *,
    train_loss: Callable[[], float],
) -> None:
    """A run that ends exploding, skipping, or with a non-finite test loss has diverged;
    a non-finite test loss only if training's own loss says so too.

    Args:
      trainer, guard: the run's.
      result: the final evaluation.
      directory: this process's checkpoints.
      train_loss: the loss of the final weights on training examples; called only
        when the test result is not finite and nothing else showed a divergence.

    Raises:
      Diverged: with what was seen and the checkpoint to go back to.
      EvaluationNotFinite: the test result is not finite while the training loss at
        the same weights is: training did not diverge, no checkpoint is set aside.
    """
    state = trainer.state
    applied, skipped = int(state.steps.numpy()), int(state.skipped_steps.numpy())
    consecutive = int(state.consecutive_skips.numpy())
    if guard.exploding():
        reason = (
            f"its training loss exploded (last step {guard.last_loss:.4g}, against a first "
            f"window mean of {float(guard.record.first_loss.numpy()):.4g} and a best of "
            f"{float(guard.record.best_loss.numpy()):.4g}; no checkpoint was written while it did)"
        )
    elif consecutive:
        reason = (
            f"its last {consecutive} steps were skipped (non-finite gradients or updates; "
            f"{applied} applied, {skipped} skipped in all)"
        )
    elif not all(math.isfinite(v) for v in result.values()):
        # Training's own loss decides whether the weights diverged: a test set (or an
        # evaluation) can be non-finite on weights that train well.
        on_train = float(train_loss())
        if math.isfinite(on_train):
            numbers = checkpoints.checkpoint_numbers(directory)
            kept = f"ckpt-{numbers[0]}" if numbers else "none"
            raise records.EvaluationNotFinite(
                f"The test evaluation is not finite ({result}) while the training loss "
                f"at the same weights is ({on_train:.4g}): training did not diverge, and "
                f"no checkpoint was set aside (newest: {kept}). Look at the test set and "
                "the evaluation (config.train.eval_batch_size, the dataset); a rerun "
                "resumes from the newest checkpoint and evaluates again."
            )
        reason = (
            f"its test loss is not finite ({result}), nor is its training loss at the "
            f"same weights ({on_train:.4g})"
        )
    else:
        return
    guard.set_aside_suspects(checkpoints.checkpoint_numbers(directory))
    raise records.Diverged(
        f"The run diverged: {reason}. {_newest_checkpoint(directory, guard.set_aside_steps)}"
    )
