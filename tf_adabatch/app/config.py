"""`validate_config`: every field `run` reads is checked before anything is built.

The rules that belong to a library object are that object's: the batch-size policy and
the learning-rate rule are built from the config (`factories.make_policy`,
`factories.make_schedule`, no TensorFlow op) and their refusal is reported against the
config field that set the refused argument; the similarity modes are the engine's. What
remains here is what only the application knows: the config's own fields (durations,
evaluation, checkpoints), and which batch sizes the strategy it will build can reach.
"""

from __future__ import annotations

import itertools
import math
import numbers
import os
import re
from collections.abc import Callable
from typing import Any

import ml_collections
import tensorflow as tf

from tf_adabatch.app import factories
from tf_adabatch.app.cluster import CLUSTERS
from tf_adabatch.app.data import pipeline
from tf_adabatch.app.models import MODELS, SEQUENCE_MODELS
from tf_adabatch.engine import SIMILARITY_MODES
from tf_adabatch.measure import min_accumulation_steps
from tf_adabatch.options import ROLLBACK_MODES

__all__ = ["ConfigError", "check_workdir", "validate_config"]


class ConfigError(ValueError):
    """A config field (or the workdir) breaks a rule; the message names it, the rule and the value.

    >>> issubclass(ConfigError, ValueError)
    True
    """


def check_workdir(workdir: str) -> None:
    """Creates `workdir` if needed and checks that it is a writable folder.

    Raises:
      ConfigError: `workdir` is a file, or cannot be created or written.

    >>> import tempfile
    >>> check_workdir(tempfile.mkdtemp())
    >>> check_workdir(tempfile.mkstemp()[1])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tf_adabatch.app.config.ConfigError: Argument `workdir` must be a writable folder ... (a file)
    """
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
    value = factories.field(config, field)
    if optional and value is None:
        return
    rule = f"be an integer >= {low}" + (" or None" if optional else "")
    _require(_is_int(value) and value >= low, field, rule, value)


def _require_real(
    config: ml_collections.ConfigDict, field: str, rule: str, ok: Callable[[float], bool]
) -> None:
    value = factories.field(config, field)
    _require(_is_real(value) and ok(value), field, f"be a finite number {rule}", value)


def _one_of(choices: tuple[str, ...]) -> str:
    return "be " + " or ".join(repr(c) for c in choices)


def _build(what: str, build: Callable[[], Any], arguments: dict[str, str]) -> None:
    """Builds a library object; its refusal becomes a ConfigError naming the config field.

    The library's message names the argument ("Argument `step` must be ..."); `arguments`
    maps it to the config field that set it.
    """
    try:
        build()
    except (TypeError, ValueError) as err:
        m = re.search(r"Argument `(\w+)`", str(err))
        source = arguments.get(m.group(1)) if m else None
        where = f"field `{source}`" if source else f"`{what}`"
        raise ConfigError(f"Config {where}: {err}") from err


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


def _check_reachable(config: ml_collections.ConfigDict) -> None:
    """The policy's batch sizes must be whole numbers of micro-steps on every replica.

    The engine checks the same once the strategy exists; checked here too because the
    replica count is known before (except multi-worker and TPU), and a refusal then
    costs no start-up.
    """
    c = config
    known = _num_replicas(c)
    if known is None:
        return
    replicas, what = known
    unit = replicas * c.micro_batch_size
    # The measurement's own rule (one replica in exact mode needs two micro-steps).
    least = min_accumulation_steps(c.similarity, replicas) * unit
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
    tf_adabatch.app.config.ConfigError: Config field `policy.target_similarity`: Argument `target_similarity` must be in (0, 1). Received: target_similarity=1.3
    """
    if not isinstance(config, ml_collections.ConfigDict):
        raise ConfigError(
            "Argument `config` must be an ml_collections.ConfigDict (what `get_config()` "
            f"returns). Received: config of type {type(config).__name__}"
        )
    c = config
    _require(c.dataset in pipeline.DATASETS, "dataset", f"be one of {pipeline.DATASETS}", c.dataset)
    _require(c.model in MODELS, "model", f"be one of {MODELS}", c.model)
    text = c.dataset in pipeline.TEXT_DATASETS
    _require(
        (c.model in SEQUENCE_MODELS) == text,
        "model",
        f"be one of {SEQUENCE_MODELS} for dataset {c.dataset!r} (token sequences)"
        if text
        else f"take images for dataset {c.dataset!r}: not one of {SEQUENCE_MODELS}",
        c.model,
    )
    _require(
        c.strategy in factories.STRATEGIES,
        "strategy",
        f"be one of {factories.STRATEGIES}",
        c.strategy,
    )
    _require(c.cluster in CLUSTERS, "cluster", _one_of(CLUSTERS), c.cluster)
    _require(
        c.cluster == "tf_config" or c.strategy == "multi_worker",
        "cluster",
        "be 'tf_config' unless strategy='multi_worker' (it chooses how the workers find "
        f"each other; strategy={c.strategy!r} has one worker)",
        c.cluster,
    )
    _require(
        _is_int(c.slurm_port_base) and 1 <= c.slurm_port_base <= 65535,
        "slurm_port_base",
        "be an integer in [1, 65535]",
        c.slurm_port_base,
    )
    _require_int(c, "seed", 0)
    _require_int(c, "num_cpu_replicas", 1)
    _require_int(c, "micro_batch_size", 1)
    _require_int(c, "base_batch_size", 1)
    # The config takes the engine's modes but not its "auto": a run states its mode.
    _require(
        c.similarity in SIMILARITY_MODES, "similarity", _one_of(SIMILARITY_MODES), c.similarity
    )
    _require(
        c.policy.kind in factories.POLICIES,
        "policy.kind",
        f"be one of {factories.POLICIES}",
        c.policy.kind,
    )
    _require(
        c.lr.schedule in factories.LR_SCHEDULES,
        "lr.schedule",
        _one_of(factories.LR_SCHEDULES),
        c.lr.schedule,
    )
    # The rule's own warm-up checks see steps, and here the data (hence the steps per
    # epoch) is not loaded yet: a short warm-up would round to 0 steps and pass.
    _require_real(c, "lr.warmup_base_epochs", ">= 0", lambda v: v >= 0)
    _require(
        c.lr.warmup_base_epochs == 0 or c.lr.rule == "linear",
        "lr.warmup_base_epochs",
        f"be 0 unless lr.rule='linear' (lr.rule={c.lr.rule!r} has no warm-up)",
        c.lr.warmup_base_epochs,
    )
    # With lr.schedule='cosine' the rule gets a schedule, not this number: checked here.
    _require_real(c, "optimizer.learning_rate", "> 0", lambda v: v > 0)
    _require(
        c.optimizer.name in factories.OPTIMIZERS,
        "optimizer.name",
        _one_of(factories.OPTIMIZERS),
        c.optimizer.name,
    )
    _require_real(c, "optimizer.weight_decay", ">= 0", lambda v: v >= 0)
    # Keras checks these when the optimizer is created, which runs TensorFlow ops.
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
    _require_int(c, "train.steps_per_execution", 1)
    _require(
        c.train.rollback in ROLLBACK_MODES,
        "train.rollback",
        _one_of(ROLLBACK_MODES),
        c.train.rollback,
    )
    if c.train.divergence_factor is not None:
        _require_real(c, "train.divergence_factor", "> 1 (or None)", lambda v: v > 1)
    _require(
        isinstance(c.deterministic, bool), "deterministic", "be True or False", c.deterministic
    )
    _require_int(c, "train.max_steps", 1, optional=True)
    _require(
        isinstance(c.train.preemption, bool),
        "train.preemption",
        "be True or False",
        c.train.preemption,
    )
    _require_int(c, "clock.devices", 1)
    if c.clock.profile is not None:
        try:
            factories.load_step_time_model(c.clock.profile)
        except ValueError as err:
            raise ConfigError(
                f"Config field `clock.profile` must {err}. Received: clock.profile={c.clock.profile!r}"
            ) from err
    if c.lr.schedule == "step" or c.policy.kind == "seesaw":
        fractions = c.lr.decay_fractions
        _require(
            isinstance(fractions, tuple | list)
            and len(fractions) > 0
            and all(_is_real(f) and 0 < f < 1 for f in fractions)
            and all(b > a for a, b in itertools.pairwise(fractions)),
            "lr.decay_fractions",
            "be a non-empty, increasing sequence of fractions of the budget in (0, 1)",
            fractions,
        )
        _require_real(c, "lr.decay_factor", "in (0, 1)", lambda v: 0 < v < 1)
    # The library's own rules (no TensorFlow op may run here: `make_strategy` comes first).
    _build("policy", lambda: factories.make_policy(c), factories.POLICY_ARGUMENTS[c.policy.kind][1])
    _build("lr", lambda: factories.make_schedule(c, 1), factories.SCHEDULE_ARGUMENTS)
    _check_reachable(c)
