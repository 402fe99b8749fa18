"""From a config to the objects of one job: strategy, durations, model, policy, optimizer.

Each factory reads its config fields in one place; the policy and the learning rate are
built from a table `argument -> config field` (`POLICY_ARGUMENTS`, `SCHEDULE_ARGUMENTS`),
so that `validate_config` can report a library object's refusal against the field that
caused it. No factory here runs a TensorFlow op before `make_strategy` (a process must
create its strategy first).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
from typing import Any

import keras
import ml_collections
import tensorflow as tf

from tf_adabatch import critical_batch, policies
from tf_adabatch.app import cluster, resources
from tf_adabatch.app.models import build_model
from tf_adabatch.clock import Clock, StepTimeModel, VirtualClock, WallClock
from tf_adabatch.schedules import AdaptiveLearningRate

__all__ = [
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "POLICIES",
    "POLICY_ARGUMENTS",
    "SCHEDULE_ARGUMENTS",
    "STRATEGIES",
    "Durations",
    "field",
    "make_model",
    "make_optimizer",
    "make_policy",
    "make_schedule",
    "make_strategy",
]

STRATEGIES = ("mirrored", "one_device", "multi_worker", "tpu")
OPTIMIZERS = ("sgd", "adamw")

_BOUNDS = {
    "initial_batch_size": "policy.initial_batch_size",
    "min_batch_size": "policy.min_batch_size",
    "max_batch_size": "policy.max_batch_size",
}
# policy.kind -> (the class, its keyword argument -> the config field that sets it).
POLICY_ARGUMENTS: dict[str, tuple[type[policies.BatchPolicy], dict[str, str]]] = {
    "static": (policies.StaticPolicy, {"batch_size": "policy.initial_batch_size"}),
    "simigrad": (
        policies.SimiGradPolicy,
        {
            "target_similarity": "policy.target_similarity",
            "step": "policy.step",
            "interval": "policy.interval",
            "smoothing": "policy.smoothing",
            **_BOUNDS,
        },
    ),
    "noise_scale": (policies.NoiseScalePolicy, {"factor": "policy.factor", **_BOUNDS}),
    "goodput": (
        policies.GoodputPolicy,
        {"base_batch_size": "base_batch_size", "hysteresis": "policy.hysteresis", **_BOUNDS},
    ),
    "critical_warmup": (
        critical_batch.CriticalBatchWarmupPolicy,
        {"margin": "policy.margin", "factor": "policy.growth_factor", **_BOUNDS},
    ),
    "norm_test": (critical_batch.NormTestPolicy, {"theta": "policy.theta", **_BOUNDS}),
    # decay_points: the step schedule's decay fractions x the budget (`make_policy`).
    "seesaw": (
        critical_batch.SeesawPolicy,
        {
            "decay_points": "lr.decay_fractions",
            "factor": "policy.growth_factor",
            "initial_batch_size": "policy.initial_batch_size",
            "max_batch_size": "policy.max_batch_size",
        },
    ),
}
POLICIES = tuple(POLICY_ARGUMENTS)

# `AdaptiveLearningRate`'s arguments -> the config fields that set them.
SCHEDULE_ARGUMENTS = {
    "base": "optimizer.learning_rate",
    "rule": "lr.rule",
    "gain_power": "lr.gain_power",
    "warmup_steps": "lr.warmup_base_epochs",
}
LR_SCHEDULES = ("cosine", "constant", "step")


def field(config: ml_collections.ConfigDict, name: str) -> Any:
    """The value of a dotted config field.

    >>> field(ml_collections.ConfigDict({"policy": {"kind": "static"}}), "policy.kind")
    'static'
    """
    node = config
    for key in name.split("."):
        node = node[key]
    return node


@dataclasses.dataclass(frozen=True)
class Durations:
    """The config's durations in optimizer steps of the base batch, converted in one place.

    Attributes:
      base_steps: the base schedule's length (`train.base_epochs` at `base_batch_size`);
        training ends when the progress τ reaches it.
      eval_every: progress between evaluations (`train.eval_every_base_epochs`).

    >>> from configs import base
    >>> config = base.get_config()  # 10 base epochs, base batch 128, evaluate every epoch
    >>> Durations.of(config, num_examples=1280)
    Durations(base_steps=100, eval_every=10.0)
    """

    base_steps: int
    eval_every: float

    @classmethod
    def of(cls, config: ml_collections.ConfigDict, num_examples: int) -> Durations:
        b0 = config.base_batch_size
        return cls(
            base_steps=max(1, math.ceil(config.train.base_epochs * num_examples / b0)),
            eval_every=config.train.eval_every_base_epochs * num_examples / b0,
        )


def make_strategy(config: ml_collections.ConfigDict) -> tf.distribute.Strategy:
    """The strategy named by `config.strategy` (call before any other TensorFlow op).

    "mirrored" uses all local GPUs, or `num_cpu_replicas` logical CPU devices when
    there are none; "multi_worker" finds its workers through `config.cluster`'s
    resolver (TF_CONFIG, or SLURM's environment: `tf_adabatch.app.cluster`); "tpu"
    connects to the local TPU.

    Raises:
      ConfigError: `cluster="slurm"` outside a SLURM task, or a task placement
        TensorFlow's resolver gets wrong; "tpu" where no TPU can be reached.

    >>> from configs import base
    >>> config = base.get_config()
    >>> config.strategy = "one_device"
    >>> make_strategy(config).num_replicas_in_sync
    1
    """
    kind = config.strategy
    if kind == "tpu":
        try:
            resolver = tf.distribute.cluster_resolver.TPUClusterResolver()
            tf.config.experimental_connect_to_cluster(resolver)
            tf.tpu.experimental.initialize_tpu_system(resolver)
            return tf.distribute.TPUStrategy(resolver)
        except (ValueError, RuntimeError, tf.errors.OpError) as err:  # no TPU here
            # Imported here: `config` imports this module.
            from tf_adabatch.app.config import ConfigError

            first = (str(err).strip().splitlines() or [""])[0][:200]
            raise ConfigError(
                "Config field `strategy` is 'tpu' but no TPU could be reached from this "
                f"machine ({type(err).__name__}: {first}). Run on a TPU VM, or choose "
                "'mirrored', 'one_device' or 'multi_worker'. Received: strategy='tpu'"
            ) from err
    if kind == "multi_worker":
        if config.cluster == "slurm":
            resolver = cluster.slurm_resolver(port_base=config.slurm_port_base)
            return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
        return tf.distribute.MultiWorkerMirroredStrategy()  # TF_CONFIG
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


def make_model(
    config: ml_collections.ConfigDict, input_shape: tuple[int, ...], num_classes: int
) -> keras.Model:
    """The classifier `config.model` for inputs of `input_shape` (call in the strategy scope).

    Raises:
      ValueError: the model cannot take such inputs (e.g. the CNN's poolings on 4x4).

    >>> from configs import synthetic
    >>> make_model(synthetic.get_config(), (8, 8, 1), 10).output_shape
    (None, 10)
    """
    return build_model(config.model, input_shape, num_classes, seed=config.seed)


def make_policy(config: ml_collections.ConfigDict, base_steps: float = 1.0) -> policies.BatchPolicy:
    """The batch-size policy `config.policy.kind`, from the fields in `POLICY_ARGUMENTS`.

    `base_steps` (the budget in base steps) turns Seesaw's decay fractions into progress
    values; the check of a config before the data is loaded passes 1.

    Raises:
      ValueError, TypeError: the policy refuses an argument (its message names it).

    >>> from configs import base
    >>> type(make_policy(base.get_config())).__name__
    'SimiGradPolicy'
    >>> config = base.get_config()
    >>> config.policy.kind, config.policy.max_batch_size = "seesaw", 512
    >>> list(make_policy(config, base_steps=1000).decay_points)  # lr.decay_fractions (0.5, 0.75)
    [500.0, 750.0]
    """
    cls, arguments = POLICY_ARGUMENTS[config.policy.kind]
    kwargs = {name: field(config, source) for name, source in arguments.items()}
    points = kwargs.get("decay_points")
    if isinstance(points, tuple | list) and all(_is_number(p) for p in points):
        kwargs["decay_points"] = [float(p) * base_steps for p in points]
    return cls(**kwargs)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def make_schedule(config: ml_collections.ConfigDict, base_steps: int) -> AdaptiveLearningRate:
    """The learning rate: `lr.schedule` of `optimizer.learning_rate` under the `lr.rule`.

    Args:
      config: the job's config.
      base_steps: the base schedule's length (`Durations.base_steps`).

    Raises:
      ValueError, TypeError: the rule refuses an argument (its message names it).

    >>> from configs import base
    >>> make_schedule(base.get_config(), base_steps=100).rule
    'adascale'
    """
    lr = config.optimizer.learning_rate
    base: float | keras.optimizers.schedules.LearningRateSchedule = lr
    if config.lr.schedule == "cosine":
        base = keras.optimizers.schedules.CosineDecay(lr, decay_steps=base_steps)
    elif config.lr.schedule == "step":
        # Multiplied by lr.decay_factor at each of lr.decay_fractions of the budget.
        fractions, factor = list(config.lr.decay_fractions), config.lr.decay_factor
        base = keras.optimizers.schedules.PiecewiseConstantDecay(
            [float(f) * base_steps for f in fractions],
            [lr * factor**i for i in range(len(fractions) + 1)],
        )
    warmup = round(config.lr.warmup_base_epochs * base_steps / config.train.base_epochs)
    return AdaptiveLearningRate(
        base, config.lr.rule, gain_power=config.lr.gain_power, warmup_steps=warmup
    )


def make_optimizer(
    config: ml_collections.ConfigDict, base_steps: int
) -> keras.optimizers.Optimizer:
    """`optimizer.name` on `make_schedule`'s learning rate: "sgd" (`optimizer.momentum`,
    `optimizer.nesterov`) or "adamw" (Keras's defaults otherwise); `optimizer.weight_decay`
    > 0 adds Keras's decoupled weight decay to either.

    >>> from configs import base
    >>> type(make_optimizer(base.get_config(), base_steps=100)).__name__
    'SGD'
    """
    schedule = make_schedule(config, base_steps)
    decay = float(config.optimizer.weight_decay) or None
    if config.optimizer.name == "adamw":
        return keras.optimizers.AdamW(schedule, weight_decay=decay or 0.0)
    return keras.optimizers.SGD(
        schedule,
        momentum=config.optimizer.momentum,
        nesterov=config.optimizer.nesterov,
        weight_decay=decay,
    )


# The measured step-time profiles (launch/fit_profiles.py writes them), installed with the
# package (configs/profiles in a checkout).
PROFILES_DIR = resources.profiles_dir()
_MODEL_FIELDS = tuple(f.name for f in dataclasses.fields(StepTimeModel))


def measured_profiles() -> list[str]:
    """Names of the measured step-time profiles in configs/profiles (for the clock).

    >>> "cifar10_resnet18_t4" in measured_profiles()
    True
    """
    names = []
    for entry in sorted(os.listdir(PROFILES_DIR)):
        if entry.endswith(".py") and not entry.startswith("_"):
            with open(os.path.join(PROFILES_DIR, entry), encoding="utf-8") as f:
                if 'config.kind = "measured"' in f.read():
                    names.append(entry[:-3])
    return names


def load_step_time_model(profile: str) -> StepTimeModel:
    """The `StepTimeModel` of a measured profile: a name in configs/profiles or a file.

    Raises:
      ValueError: naming the profile and what is wrong with it.

    >>> load_step_time_model("cifar10_resnet18_t4").gpus_per_node
    4
    """
    path = profile if profile.endswith(".py") else os.path.join(PROFILES_DIR, f"{profile}.py")
    if not os.path.isfile(path):
        raise ValueError(
            f"be a measured profile, one of {measured_profiles()} or a profile file; no such file"
        )
    try:
        spec = importlib.util.spec_from_file_location(f"_step_time_profile_{abs(hash(path))}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        loaded = module.get_config()
        fields = {name: loaded[name] for name in _MODEL_FIELDS}
        return StepTimeModel(**fields)
    except Exception as err:  # a profile is user code: any failure in one line
        raise ValueError(
            "be a measured profile file whose get_config() holds the fields of "
            f"tf_adabatch.StepTimeModel ({type(err).__name__}: {' '.join(str(err).split())})"
        ) from err


def make_clock(config: ml_collections.ConfigDict) -> Clock:
    """The step clock: the host's (clock.profile None) or a profile's on clock.devices devices."""
    if config.clock.profile is None:
        return WallClock()
    name = os.path.basename(config.clock.profile)
    name = name[:-3] if name.endswith(".py") else name
    return VirtualClock(
        load_step_time_model(config.clock.profile), config.clock.devices, profile=name
    )
