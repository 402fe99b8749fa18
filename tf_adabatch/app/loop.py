"""`run(config, workdir)`: one training job from an ml_collections config.

The launch script only parses flags and calls `run`. Everything here is plain library
code: a strategy, the data, a model, the adaptive trainer, checkpoints (rerunning on
the same workdir resumes), TensorBoard logs and a final `metrics.json`.

Workdir layout:
    checkpoints/        tf.train.CheckpointManager (model, optimizer, adaptive state);
                        fingerprint.json: what a resume must not change
    tensorboard/train/  adabatch/*, loss every optimizer step
    tensorboard/eval/   loss, accuracy at each evaluation (same tags: TensorBoard
                        overlays train and eval loss), and adabatch/train_seconds:
                        seconds spent training so far, evaluations excluded
    metrics.json        written at the end
    worker-<i>/         multi-worker: the same files of each non-chief worker

Multi-worker (MultiWorkerMirroredStrategy): give every worker the same workdir (a
shared filesystem). Every worker saves (the strategy needs it), non-chief workers into
`worker-<i>/`; every worker resumes from the chief's `checkpoints/`, so all restart
from one state, and a check refuses to train if they restored different steps. When a
worker dies, the others stop with `WorkerLostError` once TensorFlow's coordination
service notices the missing heartbeats (about 20 s here): relaunch all workers with the
same command to resume.

Resuming takes the newest checkpoint that reads back intact (not what the `checkpoint`
state file says): a damaged newer one is renamed `ckpt-N.damaged-<time>.*` with a
one-line warning, never deleted or overwritten; if checkpoints exist but none is
readable, or `fingerprint.json` shows another job wrote them, `run` stops with
`ResumeError` rather than start over.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tf_adabatch import policies, summaries
from tf_adabatch.app.data import pipeline
from tf_adabatch.app.models import MODELS, build_model
from tf_adabatch.schedules import LR_RULES, AdaptiveLearningRate
from tf_adabatch.trainer import Trainer

__all__ = [
    "STRATEGIES",
    "ConfigError",
    "ResumeError",
    "WorkerLostError",
    "make_strategy",
    "restore_newest_readable",
    "run",
    "validate_config",
]

STRATEGIES = ("mirrored", "one_device", "multi_worker", "tpu")
POLICIES = ("static", "simigrad", "noise_scale", "goodput")


class ConfigError(ValueError):
    """A config field (or the workdir) breaks a rule; the message names it, the rule and the value.

    >>> issubclass(ConfigError, ValueError)
    True
    """


class ResumeError(RuntimeError):
    """The workdir's checkpoints cannot be resumed: none is readable, or another job wrote them.

    >>> issubclass(ResumeError, RuntimeError)
    True
    """


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


# ------------------------------------------------------------------ checkpoints

# A checkpoint's own files (a kill during a save leaves `ckpt-N_temp*` instead).
_CKPT_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-\d+-of-\d+)$")
FINGERPRINT = "fingerprint.json"


def _checkpoint_numbers(directory: str) -> list[int]:
    """Numbers of the checkpoints with any file in `directory`, newest first.

    Read from the files themselves, not the `checkpoint` state file (which can be
    damaged, or name a checkpoint whose files are damaged).
    """
    if not os.path.isdir(directory):
        return []
    found = {int(m.group(1)) for name in os.listdir(directory) if (m := _CKPT_FILE.match(name))}
    return sorted(found, reverse=True)


def _clean_temporaries(directory: str) -> None:
    """Removes what a kill during a save left behind (`ckpt-N_temp*`, never recorded)."""
    if not os.path.isdir(directory):
        return
    for name in os.listdir(directory):
        if re.match(r"^ckpt-\d+_temp", name):
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                os.remove(path)


def _short(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:160]}"


def _read_every_tensor(prefix: str) -> None:
    """Opens the checkpoint and reads every tensor (the bundle reader checks each checksum)."""
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


def _move_aside(directory: str, number: int, stamp: str) -> str:
    """Renames ckpt-N's files to ckpt-N.damaged-<stamp>.* (kept, never reused or deleted)."""
    for name in os.listdir(directory):
        m = _CKPT_FILE.match(name)
        if m and int(m.group(1)) == number:
            new = f"ckpt-{number}.damaged-{stamp}.{m.group(2)}"
            os.replace(os.path.join(directory, name), os.path.join(directory, new))
    return f"ckpt-{number}.damaged-{stamp}.*"


def restore_newest_readable(
    checkpoint: tf.train.Checkpoint, directory: str, *, repair: bool = True
) -> tuple[str | None, list[str]]:
    """Restores the newest checkpoint in `directory` that reads back intact.

    The candidates are the `ckpt-N.*` files themselves, newest first (the `checkpoint`
    state file is not trusted). A checkpoint is intact if every tensor reads back
    (checksums included) and the restore succeeds. With `repair`, the damaged newer
    ones are renamed `ckpt-N.damaged-<time>.*` (never deleted, and their numbers free
    for new saves) and the state file is rewritten to the intact ones, so that a
    `CheckpointManager` created afterwards neither deletes nor overwrites anything
    it could not read.

    Args:
      checkpoint: the objects to restore into.
      directory: a `CheckpointManager` directory.
      repair: rename damaged checkpoints and rewrite the state file (the chief only).

    Returns:
      (the restored prefix or None if there is no checkpoint, one note per damaged
      checkpoint passed over).

    Raises:
      ResumeError: checkpoints exist but none is readable (nothing is renamed then),
        or one does not fit `checkpoint` (another job's).

    Example (the newest checkpoint's index is lost; the older one is restored):

    >>> import tempfile
    >>> v = tf.Variable(0.0)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 3)
    >>> _ = v.assign(1.0); _ = manager.save(1); _ = v.assign(2.0); path = manager.save(2)
    >>> os.remove(path + ".index")
    >>> prefix, notes = restore_newest_readable(tf.train.Checkpoint(v=v), manager.directory)
    >>> os.path.basename(prefix), float(v.numpy()), len(notes)
    ('ckpt-1', 1.0, 1)
    """
    numbers = _checkpoint_numbers(directory)
    damaged: list[tuple[int, str]] = []
    for number in numbers:
        prefix = os.path.join(directory, f"ckpt-{number}")
        try:
            if not tf.io.gfile.exists(prefix + ".index"):
                raise FileNotFoundError(f"{prefix}.index is missing")
            # Any failure to read a file back means it is damaged (the reader raises
            # OpErrors, but also IndexError for a truncated data file).
            _read_every_tensor(prefix)
        except Exception as err:
            damaged.append((number, _short(err)))
            continue
        try:
            checkpoint.restore(prefix).assert_existing_objects_matched()
        except (tf.errors.OpError, IndexError) as err:  # read back above: rare
            damaged.append((number, _short(err)))
            continue
        except (AssertionError, ValueError) as err:
            raise ResumeError(
                f"Cannot resume from {prefix}: it does not fit this job's model or "
                f"optimizer ({_short(err)}). Use a new --workdir, or the config it was written with."
            ) from err
        notes = []
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for bad, reason in damaged:
            moved = _move_aside(directory, bad, stamp) if repair else "left in place"
            notes.append(f"ckpt-{bad} is damaged ({reason}); {moved}")
        if repair:
            _write_state_file(directory, [n for n in sorted(numbers) if n <= number])
        return prefix, notes
    if damaged:
        listing = "; ".join(f"ckpt-{n}: {reason}" for n, reason in damaged)
        raise ResumeError(
            f"No readable checkpoint in {directory} (all left in place): {listing}. "
            "Restore them from a backup, or use a new --workdir to start over."
        )
    return None, []


def _write_state_file(directory: str, numbers: list[int]) -> None:
    """Rewrites the `checkpoint` state file (a text CheckpointState proto) atomically.

    The newest of `numbers` becomes the latest; all get their index file's time, after
    `last_preserved_timestamp`, so that a `CheckpointManager` manages (and, past
    `max_to_keep`, deletes) them as if it had saved them.
    """
    times = [os.path.getmtime(os.path.join(directory, f"ckpt-{n}.index")) for n in numbers]
    times = [min(t, time.time()) for t in times]
    lines = [f'model_checkpoint_path: "ckpt-{numbers[-1]}"']
    lines += [f'all_model_checkpoint_paths: "ckpt-{n}"' for n in numbers]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
    lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
    tmp = os.path.join(directory, f"checkpoint.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(directory, "checkpoint"))


def _fingerprint(
    config: ml_collections.ConfigDict, model: keras.Model, num_classes: int
) -> dict[str, Any]:
    """What a resumed job must share with the one that wrote the checkpoints.

    Not in it (resuming may change them): replicas, workers, micro-batch size, policy
    bounds and targets, learning rate and schedule, evaluation settings, max_steps.
    """
    return {
        "model": config.model,
        "dataset": config.dataset,
        "seed": int(config.seed),
        "num_classes": int(num_classes),
        "input_shape": [int(d) for d in model.inputs[0].shape[1:]],
        "loss": "sparse_categorical_crossentropy(from_logits=True)",
        "optimizer": "SGD with momentum" if config.optimizer.momentum else "SGD",
        "policy.kind": config.policy.kind,
        # In order, short names (layer names get process-dependent suffixes).
        "variables": [f"{v.name}{tuple(int(d) for d in v.shape)}" for v in model.weights],
    }


def _check_fingerprint(directory: str, current: dict[str, Any]) -> None:
    """Refuses a resume whose fingerprint differs from the stored one (one line)."""
    path = os.path.join(directory, FINGERPRINT)
    try:
        with open(path, encoding="utf-8") as f:
            stored = json.load(f)
    except FileNotFoundError:
        return  # written before fingerprints existed: the restore checks the shapes
    except (OSError, ValueError) as err:
        print(f"warning: ignoring unreadable {path} ({_short(err)})", file=sys.stderr)
        return
    differ = []
    for key, value in current.items():
        if stored.get(key) != value:
            if key == "variables":
                old = list(stored.get(key) or [])
                first = next(
                    (
                        i
                        for i, pair in enumerate(zip(old, value, strict=False))
                        if len(set(pair)) > 1
                    ),
                    min(len(old), len(value)),
                )
                differ.append(
                    f"variables ({len(old)} in the checkpoint, {len(value)} now; the first "
                    f"difference at #{first}: {[*old, '-'][first]} vs {[*value, '-'][first]})"
                )
            else:
                differ.append(f"{key} {stored.get(key)!r} (checkpoint) vs {value!r} (now)")
    if differ:
        raise ResumeError(
            f"Cannot resume from {directory}: another job wrote it; differing fields: "
            f"{'; '.join(differ)}. Use a new --workdir, or the config it was written with."
        )


def _write_json_atomically(path: str, value: Any) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _check_workdir(workdir: str) -> None:
    rule = "be a writable folder (or a path where one can be created)"
    if os.path.exists(workdir) and not os.path.isdir(workdir):
        raise ConfigError(f"Argument `workdir` must {rule}. Received: workdir={workdir!r} (a file)")
    try:
        os.makedirs(workdir, exist_ok=True)
        probe = os.path.join(workdir, f".write-test-{os.getpid()}")
        with open(probe, "w", encoding="utf-8"):
            pass
        os.remove(probe)
    except OSError as err:
        raise ConfigError(
            f"Argument `workdir` must {rule}. Received: workdir={workdir!r} ({err.strerror})"
        ) from err


def _require(ok: bool, field: str, rule: str, value: Any) -> None:
    if not ok:
        raise ConfigError(f"Config field `{field}` must {rule}. Received: {field}={value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def _require_int(
    config: ml_collections.ConfigDict, field: str, low: int, *, optional: bool = False
) -> None:
    value = _field(config, field)
    if optional and value is None:
        return
    rule = f"be an integer >= {low}" + (" or None" if optional else "")
    _require(_is_int(value) and value >= low, field, rule, value)


def _require_real(
    config: ml_collections.ConfigDict, field: str, rule: str, ok: Callable[[float], bool]
) -> None:
    value = _field(config, field)
    _require(_is_real(value) and ok(value), field, f"be a finite number {rule}", value)


def _field(config: ml_collections.ConfigDict, field: str) -> Any:
    node = config
    for key in field.split("."):
        node = node[key]
    return node


def _num_replicas(config: ml_collections.ConfigDict) -> tuple[int, str] | None:
    """(replicas `make_strategy` will create, what they are), where known before it runs.

    Listing physical devices runs no TensorFlow op (`make_strategy` may come after).
    """
    if config.strategy == "one_device":
        return 1, "replicas (one_device)"
    if config.strategy == "mirrored":
        gpus = len(tf.config.list_physical_devices("GPU"))
        return (gpus, "local GPUs") if gpus else (config.num_cpu_replicas, "num_cpu_replicas")
    return None  # multi-worker, TPU: known once connected (the engine checks then)


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
    tf_adabatch.app.loop.ConfigError: Config `policy`: Argument `target_similarity` must be in (0, 1). Received: target_similarity=1.3
    """
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            "Argument `config` must be an ml_collections.ConfigDict (what `get_config()` "
            f"returns). Received: config of type {type(config).__name__}"
        )
    c = config
    _require(c.dataset in pipeline.DATASETS, "dataset", f"be one of {pipeline.DATASETS}", c.dataset)
    _require(c.model in MODELS, "model", f"be one of {MODELS}", c.model)
    _require(c.strategy in STRATEGIES, "strategy", f"be one of {STRATEGIES}", c.strategy)
    _require_int(c, "seed", 0)
    _require_int(c, "num_cpu_replicas", 1)
    _require_int(c, "micro_batch_size", 1)
    _require_int(c, "base_batch_size", 1)
    _require(
        c.similarity in ("exact", "estimated"),
        "similarity",
        "be 'exact' or 'estimated'",
        c.similarity,
    )
    _require(c.policy.kind in POLICIES, "policy.kind", f"be one of {POLICIES}", c.policy.kind)
    for field in ("initial_batch_size", "min_batch_size", "max_batch_size"):
        _require_int(c, f"policy.{field}", 1)
    _require(c.lr.rule in LR_RULES, "lr.rule", f"be one of {LR_RULES}", c.lr.rule)
    _require(
        c.lr.schedule in ("cosine", "constant"),
        "lr.schedule",
        "be 'cosine' or 'constant'",
        c.lr.schedule,
    )
    _require_real(c, "lr.warmup_base_epochs", ">= 0", lambda v: v >= 0)
    _require(
        c.lr.warmup_base_epochs == 0 or c.lr.rule == "linear",
        "lr.warmup_base_epochs",
        f"be 0 unless lr.rule='linear' (lr.rule={c.lr.rule!r} has no warm-up)",
        c.lr.warmup_base_epochs,
    )
    _require_real(c, "optimizer.learning_rate", "> 0", lambda v: v > 0)
    _require_real(c, "optimizer.momentum", "in [0, 1)", lambda v: 0 <= v < 1)
    _require(
        isinstance(c.optimizer.nesterov, bool),
        "optimizer.nesterov",
        "be True or False",
        c.optimizer.nesterov,
    )
    _require_real(c, "train.base_epochs", "> 0", lambda v: v > 0)
    _require_int(c, "train.checkpoint_every_steps", 1)
    _require_real(c, "train.eval_every_base_epochs", "> 0", lambda v: v > 0)
    _require_int(c, "train.eval_batch_size", 1)
    _require_int(c, "train.max_consecutive_skips", 1, optional=True)
    _require(
        isinstance(c.deterministic, bool), "deterministic", "be True or False", c.deterministic
    )
    _require_int(c, "train.max_steps", 1, optional=True)
    # The policy and the learning-rate rule check their own arguments (Keras-style
    # messages); report them against the config fields.
    # (No TensorFlow op may run here: `make_strategy` must come first in a process.)
    for prefix, build in (("policy", _policy), ("lr", lambda cfg: _schedule(cfg, 1))):
        try:
            build(c)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"Config `{prefix}`: {err}") from err
    known = _num_replicas(c)
    if known is None:
        return
    replicas, what = known
    unit = replicas * c.micro_batch_size
    # One replica in exact-similarity mode needs two micro-steps (two groups).
    least = 2 * unit if replicas == 1 and c.similarity == "exact" else unit
    rule = (
        f"be a multiple of {what} x micro_batch_size = {replicas} x {c.micro_batch_size} = {unit}"
    )
    if least > unit:
        rule += f", at least {least} (one replica with similarity='exact' needs 2 micro-steps)"
    fields = (
        ("initial_batch_size",)
        if c.policy.kind == "static"
        else ("min_batch_size", "max_batch_size", "initial_batch_size")
    )
    for field in fields:
        value = c.policy[field]
        _require(
            value % unit == 0 and value >= least,
            f"policy.{field}",
            rule + " to be reachable",
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
    if p.kind == "goodput":
        return policies.GoodputPolicy(
            base_batch_size=config.base_batch_size, hysteresis=p.hysteresis, **bounds
        )
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
      ConfigError: for a config value that breaks a rule, or a workdir that is not
        a writable folder.
      ResumeError: the workdir has checkpoints but none is readable (a damaged newer
        one is passed over with a warning when an older one is intact), or another
        job wrote them (a different model, dataset, seed, loss, optimizer kind,
        policy kind or variables; see `fingerprint.json` beside them).
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
    _check_workdir(workdir)
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
        try:
            model = build_model(config.model, x.shape[1:], num_classes, seed=config.seed)
        except ValueError as err:  # e.g. the CNN's poolings on 8x8 images
            raise ConfigError(
                f"Config fields `model`, `dataset`: model {config.model!r} cannot take "
                f"dataset {config.dataset!r} inputs of shape {tuple(x.shape[1:])} "
                f"({' '.join(str(err).split())[:200]})"
            ) from err
        optimizer = _optimizer(config, base_steps)
    try:
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
    except ValueError as err:  # what only the built strategy shows (multi-worker, TPU)
        raise ConfigError(f"Config: {err}") from err
    chief, worker_name = _worker(strategy)
    outdir = workdir if chief else os.path.join(workdir, worker_name)
    os.makedirs(outdir, exist_ok=True)
    _clean_temporaries(os.path.join(outdir, "checkpoints"))
    # Every worker resumes from the chief's checkpoints (the same state everywhere);
    # only the chief renames damaged ones and rewrites the state file.
    chief_dir = os.path.join(workdir, "checkpoints")
    fingerprint = _fingerprint(config, model, num_classes)
    if _checkpoint_numbers(chief_dir):
        _check_fingerprint(chief_dir, fingerprint)
    latest, notes = restore_newest_readable(trainer.checkpoint, chief_dir, repair=chief)
    for note in notes:
        print(f"warning: {note}; resuming from {latest}", file=sys.stderr)
    if latest:
        log(
            f"Resumed from {latest}: step {int(trainer.state.steps.numpy())}, progress {trainer.progress:.1f}/{base_steps}"
        )
        moved = trainer.engine.carry_batch_over()  # another replica count or micro-batch
        if moved:
            log(moved)
    if chief:  # before the first save: each checkpoint is written with it in place
        os.makedirs(chief_dir, exist_ok=True)
        _write_json_atomically(os.path.join(chief_dir, FINGERPRINT), fingerprint)
    manager = tf.train.CheckpointManager(
        trainer.checkpoint, os.path.join(outdir, "checkpoints"), max_to_keep=2
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

    # Seconds spent training in this process, evaluations excluded (checkpoint saves
    # included: a real run pays for them): the x-axis of time-to-accuracy.
    clock = {"start": time.time(), "evaluating": 0.0}

    def train_seconds() -> float:
        return time.time() - clock["start"] - clock["evaluating"]

    def evaluate_now(*, mid_bar: bool = False) -> dict[str, float]:
        step = total_steps()
        if evaluated["step"] != step:  # at most once per step (the last one is also final)
            began, trained = time.time(), train_seconds()
            result = trainer.evaluate(test, metrics=metrics_fns)
            values = ", ".join(f"{name} {value:.4f}" for name, value in sorted(result.items()))
            # During training the progress bar's line is unfinished: start a new one.
            newline = "\n" if mid_bar and verbose else ""
            log(
                f"{newline}Evaluation at step {step} "
                f"(progress {trainer.progress:.1f}/{base_steps}): {values}"
            )
            with eval_writer.as_default(step=step):
                for name, value in result.items():
                    tf.summary.scalar(summaries.eval_tag(name), value)
                tf.summary.scalar(summaries.TRAIN_SECONDS, trained)
            eval_writer.flush()
            evaluated.update(step=step, result=result)
            clock["evaluating"] += time.time() - began
        return evaluated["result"]

    def evaluate(logs: dict[str, float]) -> None:
        if logs and logs.get("progress", 0.0) >= next_eval[0]:
            next_eval[0] += eval_every
            evaluate_now(mid_bar=True)

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
        "train_seconds": train_seconds(),
        "replicas": strategy.num_replicas_in_sync,
    }
    with open(os.path.join(outdir, "metrics.json"), "w", encoding="utf-8") as f:
        json.dump(metrics, f, indent=2)
    log(
        f"Final test accuracy {metrics['test_accuracy']:.4f}, loss {metrics['test_loss']:.4f}; {steps} optimizer steps, average batch {metrics['average_batch_size']:.0f}; metrics in {os.path.join(outdir, 'metrics.json')}"
    )
    return metrics
