"""`run(config, workdir)`: one training job from an ml_collections config.

The launch script only parses flags and calls `run`. Everything here is plain library
code: a strategy, the data, a model, the adaptive trainer, checkpoints (rerunning on
the same workdir resumes), TensorBoard logs and a final `metrics.json`.

Workdir layout:
    checkpoints/        tf.train.CheckpointManager (model, optimizer, adaptive state)
    tensorboard/train/  adabatch/*, train/loss every optimizer step
    tensorboard/eval/   eval/loss, eval/accuracy at each evaluation
    metrics.json        written at the end
    worker-<i>/         multi-worker: the same files of each non-chief worker

Multi-worker (MultiWorkerMirroredStrategy): give every worker the same workdir (a
shared filesystem). Every worker saves (the strategy needs it), non-chief workers into
`worker-<i>/`; every worker resumes from the chief's `checkpoints/`, so all restart
from one state, and a check refuses to train if they restored different steps. When a
worker dies, the others stop with `WorkerLostError` once TensorFlow's coordination
service notices the missing heartbeats (about 20 s here): relaunch all workers with the
same command to resume.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tf_adabatch import policies, summaries
from tf_adabatch.data import pipeline
from tf_adabatch.models import MODELS, build_model
from tf_adabatch.schedules import LR_RULES, AdaptiveLearningRate
from tf_adabatch.trainer import Trainer

__all__ = ["STRATEGIES", "WorkerLostError", "make_strategy", "run", "validate_config"]

STRATEGIES = ("mirrored", "one_device", "multi_worker", "tpu")
POLICIES = ("static", "simigrad", "noise_scale")


class ConfigError(ValueError):
    """A config field breaks a rule; the message names the field, rule and value."""


class WorkerLostError(RuntimeError):
    """Multi-worker training lost a worker (or the workers disagree on the checkpoint).

    >>> issubclass(WorkerLostError, RuntimeError)
    True
    """


# What a collective op raises on the survivors when a peer dies.
_PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)


def _worker(strategy: tf.distribute.Strategy) -> tuple[bool, str]:
    """(is this the chief?, a name for this worker's own output folder)."""
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True, ""
    resolver: Any = strategy.cluster_resolver
    if resolver is None or not resolver.task_type:  # one worker, no TF_CONFIG
        return True, ""
    spec = resolver.cluster_spec().as_dict()
    chief = resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in spec
    )
    return chief, f"{resolver.task_type}-{resolver.task_id}"


def _check_same_checkpoint(strategy: tf.distribute.Strategy, step: int) -> None:
    """All workers must resume from the same step (else their collectives mix steps)."""

    @tf.function
    def gather() -> Any:
        def replica_fn() -> tf.Tensor:
            value = tf.constant([1.0, float(step), float(step) ** 2], tf.float64)
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    n, total, squares = (float(v) for v in gather().numpy())
    if abs(n * squares - total * total) > 0.5:  # equal iff every worker has the same step
        raise WorkerLostError(
            f"The workers restored different checkpoints (this one: step {step}, mean "
            f"{total / n:.1f}). Give every worker the same workdir on a shared filesystem: "
            "all of them resume from the chief's checkpoints/."
        )


def _require(ok: bool, field: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"Config field `{field}` must {rule}. Received: {field}={value!r}")


def validate_config(config: ml_collections.ConfigDict) -> None:
    """Checks every field `run` reads, before anything is built.

    Raises:
      ConfigError: naming the first field that breaks its rule.

    >>> from configs import base
    >>> config = base.get_config()
    >>> config.policy.target_similarity = 1.3
    >>> validate_config(config)
    Traceback (most recent call last):
    ...
    tf_adabatch.experiment.ConfigError: Config `policy`: Argument `target_similarity` must be in (0, 1). Received: target_similarity=1.3
    """
    c = config
    _require(c.dataset in pipeline.DATASETS, "dataset", f"be one of {pipeline.DATASETS}", c.dataset)
    _require(c.model in MODELS, "model", f"be one of {MODELS}", c.model)
    _require(c.strategy in STRATEGIES, "strategy", f"be one of {STRATEGIES}", c.strategy)
    _require(c.num_cpu_replicas >= 1, "num_cpu_replicas", "be >= 1", c.num_cpu_replicas)
    _require(c.micro_batch_size >= 1, "micro_batch_size", "be >= 1", c.micro_batch_size)
    _require(c.base_batch_size >= 1, "base_batch_size", "be >= 1", c.base_batch_size)
    _require(
        c.similarity in ("exact", "estimated"),
        "similarity",
        "be 'exact' or 'estimated'",
        c.similarity,
    )
    _require(c.policy.kind in POLICIES, "policy.kind", f"be one of {POLICIES}", c.policy.kind)
    _require(c.lr.rule in LR_RULES, "lr.rule", f"be one of {LR_RULES}", c.lr.rule)
    _require(
        c.lr.schedule in ("cosine", "constant"),
        "lr.schedule",
        "be 'cosine' or 'constant'",
        c.lr.schedule,
    )
    _require(
        c.optimizer.learning_rate > 0,
        "optimizer.learning_rate",
        "be > 0",
        c.optimizer.learning_rate,
    )
    _require(
        0 <= c.optimizer.momentum < 1, "optimizer.momentum", "be in [0, 1)", c.optimizer.momentum
    )
    _require(c.train.base_epochs > 0, "train.base_epochs", "be > 0", c.train.base_epochs)
    _require(
        c.train.checkpoint_every_steps >= 1,
        "train.checkpoint_every_steps",
        "be >= 1",
        c.train.checkpoint_every_steps,
    )
    _require(
        c.train.eval_every_base_epochs > 0,
        "train.eval_every_base_epochs",
        "be > 0",
        c.train.eval_every_base_epochs,
    )
    _require(
        c.train.max_consecutive_skips is None or c.train.max_consecutive_skips >= 1,
        "train.max_consecutive_skips",
        "be None or >= 1",
        c.train.max_consecutive_skips,
    )
    _require(
        isinstance(c.deterministic, bool), "deterministic", "be True or False", c.deterministic
    )
    _require(
        c.train.max_steps is None or c.train.max_steps >= 1,
        "train.max_steps",
        "be None or >= 1",
        c.train.max_steps,
    )
    # The policy and the learning-rate rule check their own arguments (Keras-style
    # messages); report them against the config fields.
    # (No TensorFlow op may run here: `make_strategy` must come first in a process.)
    for prefix, build in (("policy", _policy), ("lr", lambda cfg: _schedule(cfg, 1))):
        try:
            build(c)
        except ValueError as err:
            raise ConfigError(f"Config `{prefix}`: {err}") from err
    unit = c.num_cpu_replicas * c.micro_batch_size
    if c.strategy == "mirrored" and c.policy.kind != "static":
        for field in ("min_batch_size", "max_batch_size"):
            value = c.policy[field]
            _require(
                value % unit == 0,
                f"policy.{field}",
                f"be a multiple of num_cpu_replicas x micro_batch_size = {unit} to be reachable",
                value,
            )


def make_strategy(config: ml_collections.ConfigDict) -> tf.distribute.Strategy:
    """The strategy named by `config.strategy` (call before any other TensorFlow op).

    "mirrored" uses all local GPUs, or `num_cpu_replicas` logical CPU devices when
    there are none; "multi_worker" reads TF_CONFIG; "tpu" connects to the local TPU.

    >>> from configs import base
    >>> config = base.get_config()
    >>> config.strategy = "one_device"
    >>> make_strategy(config).num_replicas_in_sync
    1
    """
    kind = config.strategy
    if kind == "tpu":
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    if kind == "multi_worker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    gpus = tf.config.list_physical_devices("GPU")
    if kind == "one_device":
        return tf.distribute.OneDeviceStrategy("/gpu:0" if gpus else "/cpu:0")
    if gpus:
        return tf.distribute.MirroredStrategy()
    cpu = tf.config.list_physical_devices("CPU")[0]
    n = config.num_cpu_replicas
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n
        )
    except RuntimeError as err:  # already initialised: fine if there are enough devices
        if len(tf.config.list_logical_devices("CPU")) < n:
            raise RuntimeError(
                f"Cannot create {n} logical CPU devices: TensorFlow was initialised "
                "before `make_strategy`. Call it first in the process."
            ) from err
    return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])


def _policy(config: ml_collections.ConfigDict) -> policies.BatchPolicy:
    p = config.policy
    bounds = {
        "initial_batch_size": p.initial_batch_size,
        "min_batch_size": p.min_batch_size,
        "max_batch_size": p.max_batch_size,
    }
    if p.kind == "static":
        return policies.StaticPolicy(p.initial_batch_size)
    if p.kind == "noise_scale":
        return policies.NoiseScalePolicy(p.factor, **bounds)
    return policies.SimiGradPolicy(
        p.target_similarity, step=p.step, interval=p.interval, smoothing=p.smoothing, **bounds
    )


def _schedule(config: ml_collections.ConfigDict, base_steps: int) -> AdaptiveLearningRate:
    lr = config.optimizer.learning_rate
    base: float | keras.optimizers.schedules.LearningRateSchedule = lr
    if config.lr.schedule == "cosine":
        base = keras.optimizers.schedules.CosineDecay(lr, decay_steps=base_steps)
    warmup = round(config.lr.warmup_base_epochs * base_steps / config.train.base_epochs)
    return AdaptiveLearningRate(
        base, config.lr.rule, gain_power=config.lr.gain_power, warmup_steps=warmup
    )


def _optimizer(config: ml_collections.ConfigDict, base_steps: int) -> keras.optimizers.Optimizer:
    return keras.optimizers.SGD(
        _schedule(config, base_steps),
        momentum=config.optimizer.momentum,
        nesterov=config.optimizer.nesterov,
    )


class _Checkpointing(keras.callbacks.Callback):
    """Saves every `every` optimizer steps and evaluates at the configured interval."""

    def __init__(self, manager: tf.train.CheckpointManager, every: int, evaluate: Any) -> None:
        super().__init__()
        self.manager, self.every, self.evaluate = manager, every, evaluate

    def on_train_batch_end(self, batch: int, logs: dict[str, float] | None = None) -> None:
        logs = logs or {}
        step = int(logs.get("step", 0))
        self.evaluate(logs)
        # Never save while steps are being skipped: if the run stops on
        # `NonFiniteGradientsError`, its last checkpoint predates the skipped steps.
        if step % self.every == 0 and not logs.get("consecutive_skips", 0.0):
            self.manager.save(checkpoint_number=step)


def run(config: ml_collections.ConfigDict, workdir: str, *, verbose: int = 1) -> dict[str, Any]:
    """Trains `config` in `workdir`, resuming from its last checkpoint if there is one.

    Args:
      config: see `configs/base.py` for every field.
      workdir: output folder (created if needed).
      verbose: 1 shows a progress bar and a closing line; 0 prints nothing.

    Returns:
      The final metrics, also written to `workdir/metrics.json`.

    Raises:
      ConfigError: for a config value that breaks a rule.
      NonFiniteGradientsError: after `train.max_consecutive_skips` non-finite steps in
        a row (no checkpoint is written while skipping: the last one predates them).
      WorkerLostError: multi-worker only, when another worker died (or the workers
        restored different checkpoints).

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
    log = print if verbose else (lambda *args: None)
    start = time.time()
    strategy = make_strategy(config)
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    (x, y), (x_test, y_test), num_classes = pipeline.load_arrays(config.dataset, seed=config.seed)
    b0 = config.base_batch_size
    base_steps = max(1, math.ceil(config.train.base_epochs * len(x) / b0))
    eval_every = config.train.eval_every_base_epochs * len(x) / b0
    with strategy.scope():
        model = build_model(config.model, x.shape[1:], num_classes, seed=config.seed)
        optimizer = _optimizer(config, base_steps)
    trainer = Trainer(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=optimizer,
        micro_batch_size=config.micro_batch_size,
        base_batch_size=b0,
        policy=_policy(config),
        similarity=config.similarity,
        max_consecutive_skips=config.train.max_consecutive_skips,
        strategy=strategy,
    )
    chief, worker_name = _worker(strategy)
    outdir = workdir if chief else os.path.join(workdir, worker_name)
    os.makedirs(outdir, exist_ok=True)
    manager = tf.train.CheckpointManager(
        trainer.checkpoint, os.path.join(outdir, "checkpoints"), max_to_keep=2
    )
    # Every worker resumes from the chief's checkpoints (the same state everywhere).
    latest = tf.train.latest_checkpoint(os.path.join(workdir, "checkpoints"))
    if latest:
        trainer.checkpoint.restore(latest).assert_existing_objects_matched()
        log(
            f"Resumed from {latest}: step {int(trainer.state.steps.numpy())}, progress {trainer.progress:.1f}/{base_steps}"
        )
    multi_worker = bool(worker_name)
    samples = int(trainer.state.samples_seen.numpy())
    dataset_fn = pipeline.train_dataset_fn(
        x,
        y,
        micro_batch_size=config.micro_batch_size,
        seed=config.seed,
        skip_micro_batches=samples // config.micro_batch_size,
    )
    iterator = iter(trainer.distribute(dataset_fn))
    test = pipeline.eval_dataset(x_test, y_test, config.train.eval_batch_size)
    eval_writer = tf.summary.create_file_writer(os.path.join(outdir, "tensorboard", "eval"))
    metrics_fns = {"accuracy": keras.metrics.sparse_categorical_accuracy}
    next_eval = [(math.floor(trainer.progress / eval_every) + 1) * eval_every]
    evaluated: dict[str, Any] = {"step": None, "result": None}

    def total_steps() -> int:
        """Optimizer steps taken, skipped ones included: the x-axis of every summary."""
        return int(trainer.state.steps.numpy() + trainer.state.skipped_steps.numpy())

    def evaluate_now() -> dict[str, float]:
        step = total_steps()
        if evaluated["step"] != step:  # at most once per step (the last one is also final)
            result = trainer.evaluate(test, metrics=metrics_fns)
            with eval_writer.as_default(step=step):
                for name, value in result.items():
                    tf.summary.scalar(summaries.eval_tag(name), value)
            eval_writer.flush()
            evaluated.update(step=step, result=result)
        return evaluated["result"]

    def evaluate(logs: dict[str, float]) -> None:
        if logs and logs.get("progress", 0.0) >= next_eval[0]:
            next_eval[0] += eval_every
            evaluate_now()

    remaining = None
    if config.train.max_steps is not None:
        remaining = max(0, config.train.max_steps - total_steps())
    every = config.train.checkpoint_every_steps
    restored = total_steps()  # the step of the checkpoint resumed from (0 for a new run)
    try:
        if multi_worker:
            _check_same_checkpoint(strategy, total_steps())
        trainer.fit(
            iterator,
            steps=remaining,
            until_progress=float(base_steps),
            summary_dir=os.path.join(outdir, "tensorboard", "train"),
            callbacks=[_Checkpointing(manager, every, evaluate)],
            verbose=verbose,
        )
        # A final checkpoint unless the callback just took it; decided from the state
        # alone, so that every worker decides alike (never while skipping).
        done = total_steps()
        if done % every and done != restored and not int(trainer.state.consecutive_skips.numpy()):
            manager.save(checkpoint_number=done)
        result = evaluate_now()
    except _PEER_ERRORS as err:
        if not multi_worker:
            raise
        first = next((line for line in str(err).splitlines() if "unhealthy" in line), None)
        raise WorkerLostError(
            f"Lost another worker ({first or type(err).__name__}). The chief's last "
            f"checkpoint is {tf.train.latest_checkpoint(os.path.join(workdir, 'checkpoints'))}; "
            "relaunch every worker with the same command to resume from it."
        ) from err
    steps = int(trainer.state.steps.numpy())
    samples = int(trainer.state.samples_seen.numpy())
    metrics = {
        "test_accuracy": result["accuracy"],
        "test_loss": result["loss"],
        "optimizer_steps": steps,
        "skipped_steps": int(trainer.state.skipped_steps.numpy()),
        "examples_seen": samples,
        "average_batch_size": samples / max(1, steps + int(trainer.state.skipped_steps.numpy())),
        "progress": trainer.progress,
        "base_steps": base_steps,
        "wall_time_s": time.time() - start,
        "replicas": strategy.num_replicas_in_sync,
    }
    with open(os.path.join(outdir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    log(
        f"Final test accuracy {metrics['test_accuracy']:.4f}, loss {metrics['test_loss']:.4f}; {steps} optimizer steps, average batch {metrics['average_batch_size']:.0f}; metrics in {os.path.join(outdir, 'metrics.json')}"
    )
    return metrics
