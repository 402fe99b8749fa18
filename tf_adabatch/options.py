"""The adaptive engine's options: one definition for `AdaptiveEngine`, `Trainer` and `attach`."""

from __future__ import annotations

import math
import numbers
from typing import Any

# typing_extensions comes with TensorFlow; `Required` for Python 3.10.
from typing_extensions import Required, TypedDict

from tf_adabatch._checks import integer, is_real
from tf_adabatch.clock import Clock
from tf_adabatch.policies import BatchPolicy

__all__ = [
    "ROLLBACK_MODES",
    "SIMILARITY_MODES",
    "EngineOptions",
    "batch_to_k",
    "check_engine_objects",
    "check_objects",
    "resolve_options",
    "resolve_similarity",
]

SIMILARITY_MODES = ("exact", "estimated")


class EngineOptions(TypedDict, total=False):
    """The adaptive engine's options: one definition for every front door.

    `AdaptiveEngine`, `Trainer` and `attach` take these as keyword arguments (checked
    once, by the engine):

      micro_batch_size: m, examples per replica per micro-step (required, fixed).
      base_batch_size: B0, the batch the learning rate was tuned for (for the gain).
        Defaults to the policy's initial batch size.
      policy: a `BatchPolicy`; default `StaticPolicy(replicas * micro_batch_size)`.
      similarity: "exact" (the two groups' gradients, one all-reduce of twice the size),
        "estimated" (from scalars, no extra gradient-sized communication: on N >= 2
        replicas the replicas' pairwise cosine from their gradient norms, with 2
        replicas exact mode's cosine; on one, from the step's moments; like the exact
        cosine, a per-step reading with no memory) or "auto"
        (default): exact with two or more replicas, estimated with one (where exact
        needs k >= 2 micro-steps, which the default policy does not give).
      ema_decay: decay of the moving averages behind the gain and the noise scale
        (not the similarity); `None` (default) uses fairscale's max(1 - n/1000, 0)
        with n the micro-gradients of the step.
      min_variance: per-step floor of tr(Sigma)/B0 (default fairscale's 1e-6).
      jit_compile: XLA-compile the step. The micro-step always; on one replica also
        everything after the micro-steps that draw data (the last micro-step, reduce,
        statistics, apply, roll-back and policy) as one XLA program, and the
        roll-back's save. On several replicas the cross-replica part stays a plain
        graph: XLA refuses code that reaches every device's variables (Keras's own
        `fit(jit_compile=True)` fails there too; docs/architecture.md). Dropout and
        other random layers draw other numbers under XLA. Default False.
      max_consecutive_skips: raise `NonFiniteGradientsError` after this many skipped
        (non-finite) steps in a row (default 100); None never stops.
      rollback: how a step whose *update* (from finite gradients) left a weight or
        optimizer slot non-finite is undone. "copy" (default): every step first copies
        the weights and the optimizer's variables (Adam: three times the model, on
        every device) and such a step is restored from the copy and skipped. "stop":
        no copy (the memory-light mode); such a step stops the run with
        `NonFiniteUpdateError` (resume from the last checkpoint). Either way the
        gradients are checked before the update, and a non-finite gradient skips the
        step with nothing changed.
      clock: what each optimizer step is charged (`step_time` in the logs and
        summaries, and what a `GoodputPolicy` learns from): a `tf_adabatch.WallClock`
        (the host's time; the default, None) or a `tf_adabatch.VirtualClock` (the time
        a measured step-time profile predicts on N accelerators).

    >>> sorted(resolve_options({"micro_batch_size": 8}).items())[:3]
    [('base_batch_size', None), ('clock', None), ('ema_decay', None)]
    """

    micro_batch_size: Required[int]
    base_batch_size: int | None
    policy: BatchPolicy | None
    similarity: str
    ema_decay: float | None
    min_variance: float
    jit_compile: bool
    max_consecutive_skips: int | None
    rollback: str
    clock: Clock | None


_OPTION_DEFAULTS: dict[str, Any] = {
    "base_batch_size": None,
    "policy": None,
    "similarity": "auto",
    "ema_decay": None,
    "min_variance": 1e-6,
    "jit_compile": False,
    "max_consecutive_skips": 100,
    "rollback": "copy",
    "clock": None,
}

ROLLBACK_MODES = ("copy", "stop")


def resolve_options(options: Any, *, caller: str = "AdaptiveEngine") -> dict[str, Any]:
    """Every `EngineOptions` key with its value or default; unknown or missing ones refused.

    >>> resolve_options({"micro_batch_size": 8, "batch": 4})
    Traceback (most recent call last):
    ...
    TypeError: AdaptiveEngine() got an unexpected keyword argument 'batch'; its options are base_batch_size, clock, ema_decay, jit_compile, max_consecutive_skips, micro_batch_size, min_variance, policy, rollback, similarity (tf_adabatch.EngineOptions).
    """
    known = EngineOptions.__annotations__
    for name in options:
        if name not in known:
            raise TypeError(
                f"{caller}() got an unexpected keyword argument {name!r}; its options are "
                f"{', '.join(sorted(known))} (tf_adabatch.EngineOptions)."
            )
    if "micro_batch_size" not in options:
        raise TypeError(f"{caller}() missing required keyword argument: 'micro_batch_size'")
    resolved = {**_OPTION_DEFAULTS, **options}
    _check_values(resolved)
    return resolved


def _check_values(options: dict[str, Any]) -> None:
    """The options' types and ranges that need no model or strategy (ValueError, Keras's
    message shape: argument, rule, value received); integers made Python ints."""

    def refuse(name: str, rule: str) -> None:
        raise ValueError(f"Argument `{name}` must be {rule}. Received: {name}={options[name]!r}")

    options["micro_batch_size"] = integer("micro_batch_size", options["micro_batch_size"])
    for name in ("base_batch_size", "max_consecutive_skips"):
        if options[name] is not None:
            options[name] = integer(name, options[name])
    policy = options["policy"]
    if policy is not None and not isinstance(policy, BatchPolicy):
        refuse(
            "policy",
            "a `tf_adabatch.BatchPolicy` (e.g. `tf_adabatch.StaticPolicy(64)`, "
            "`SimiGradPolicy(...)`) or None",
        )
    decay = options["ema_decay"]
    if decay is not None and not (is_real(decay) and 0.0 <= float(decay) < 1.0):
        refuse("ema_decay", "a number in [0, 1) or None")
    if not (is_real(options["min_variance"]) and 0.0 <= float(options["min_variance"]) < math.inf):
        refuse("min_variance", "a finite number >= 0")
    if not isinstance(options["jit_compile"], bool):
        refuse("jit_compile", "True or False")
    if options["rollback"] not in ROLLBACK_MODES:
        refuse("rollback", f"one of {ROLLBACK_MODES}")
    if options["clock"] is not None and not isinstance(options["clock"], Clock):
        refuse("clock", "a `tf_adabatch.WallClock()` or `tf_adabatch.VirtualClock(...)`, or None")


def check_objects(
    model: Any, optimizer: Any, strategy: Any, *, optimizer_argument: str = "optimizer"
) -> None:
    """The front doors' objects are what they must be (ValueError naming the argument).

    >>> check_objects("model", None, None)
    Traceback (most recent call last):
    ...
    ValueError: Argument `model` must be a `keras.Model`. Received: model='model'
    """
    import keras
    import tensorflow as tf

    if not isinstance(model, keras.Model):
        raise ValueError(f"Argument `model` must be a `keras.Model`. Received: model={model!r}")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"Argument `{optimizer_argument}` must be a Keras optimizer instance created in "
            "the strategy's scope (e.g. `keras.optimizers.SGD(...)`; a name such as 'sgd' "
            f"is not enough). Received: {optimizer_argument}={optimizer!r}"
        )
    if strategy is not None and not isinstance(strategy, tf.distribute.Strategy):
        raise ValueError(
            "Argument `strategy` must be a `tf.distribute.Strategy` instance (e.g. "
            "`tf.distribute.MirroredStrategy()`) or None for the current one. "
            f"Received: strategy={strategy!r}"
        )


def check_engine_objects(model: Any, optimizer: Any, strategy: Any) -> Any:
    """`check_objects`, and what the engine needs of them; returns the strategy to use.

    The strategy must be synchronous data-parallel (its replicas all-reduce), the
    optimizer must neither scale the loss statically nor accumulate gradients itself,
    and the model must be built (the engine allocates its accumulators from its
    weights).

    >>> import keras
    >>> unbuilt = keras.Sequential([keras.layers.Dense(1)], name="unbuilt")
    >>> check_engine_objects(unbuilt, keras.optimizers.SGD(), None)
    Traceback (most recent call last):
    ...
    ValueError: Argument `model` must be built and have trainable variables (the engine allocates its accumulators from them): create it with a `keras.Input`, or build a subclassed model by calling it once on a batch, e.g. `model(x[:1])`, or with `model.build(input_shape)`, in the strategy's scope, before `attach` / `Trainer`. Received: model='unbuilt' (built=False, 0 trainable variables)
    """
    import tensorflow as tf

    check_objects(model, optimizer, strategy)
    strategy = strategy or tf.distribute.get_strategy()
    unsupported = tuple(
        getattr(tf.distribute.experimental, name)
        for name in ("ParameterServerStrategy", "CentralStorageStrategy")
        if hasattr(tf.distribute.experimental, name)
    )
    if isinstance(strategy, unsupported):
        raise ValueError(
            "Argument `strategy` must be a synchronous data-parallel strategy whose "
            "replicas all-reduce (MirroredStrategy, MultiWorkerMirroredStrategy, "
            "TPUStrategy, OneDeviceStrategy or the default strategy): the replica "
            f"groups' statistics need it. Received: strategy={type(strategy).__name__}"
        )
    if getattr(optimizer, "loss_scale_factor", None):
        raise ValueError(
            "A static `loss_scale_factor` on the optimizer is not supported by "
            "tf_adabatch; wrap the optimizer in `keras.optimizers.LossScaleOptimizer` "
            "(dynamic loss scaling, what `mixed_float16` uses) instead. Received: "
            f"loss_scale_factor={optimizer.loss_scale_factor!r}"
        )
    if getattr(optimizer, "gradient_accumulation_steps", None):
        raise ValueError(
            "The optimizer has `gradient_accumulation_steps="
            f"{optimizer.gradient_accumulation_steps}`; tf_adabatch accumulates "
            "gradients itself. Create the optimizer without it."
        )
    if not model.built or not model.trainable_variables:
        raise ValueError(
            "Argument `model` must be built and have trainable variables (the engine "
            "allocates its accumulators from them): create it with a `keras.Input`, or "
            "build a subclassed model by calling it once on a batch, e.g. "
            "`model(x[:1])`, or with `model.build(input_shape)`, in the strategy's "
            f"scope, before `attach` / `Trainer`. Received: model={model.name!r} "
            f"(built={model.built}, {len(model.trainable_variables)} trainable variables)"
        )
    return strategy


def batch_to_k(name: str, batch_size: Any, replicas: int, micro_batch_size: int, min_k: int) -> int:
    """k for a global batch size: it must be a multiple of replicas x micro-batch, with at
    least `min_k` micro-steps (ValueError naming argument `name`).

    >>> batch_to_k("batch_size", 96, 2, 16, 1)
    3
    >>> batch_to_k("batch_size", 40, 2, 16, 1)
    Traceback (most recent call last):
    ...
    ValueError: Argument `batch_size` must be a multiple of replicas x micro_batch_size = 2 x 16 = 32. Received: batch_size=40
    """
    unit = replicas * micro_batch_size
    if (
        isinstance(batch_size, bool)
        or not isinstance(batch_size, numbers.Integral)  # int, np.int64, ...
        or batch_size % unit
        or batch_size < unit * min_k
    ):
        rule = (
            f"a multiple of replicas x micro_batch_size = {replicas} x {micro_batch_size} = {unit}"
        )
        if min_k > 1:
            rule += f", at least {unit * min_k} (one replica in exact-similarity mode needs >= 2 micro-steps to form two groups; or use similarity='estimated')"
        raise ValueError(f"Argument `{name}` must be {rule}. Received: {name}={batch_size!r}")
    return int(batch_size) // unit


def resolve_similarity(similarity: str, num_replicas: int) -> str:
    """The similarity mode "auto" stands for: exact with two or more replicas, else
    estimated; an unknown mode is refused.

    >>> resolve_similarity("auto", 1), resolve_similarity("auto", 4)
    ('estimated', 'exact')
    """
    if similarity == "auto":
        similarity = "exact" if num_replicas >= 2 else "estimated"
    if similarity not in SIMILARITY_MODES:
        raise ValueError(
            f"Argument `similarity` must be one of {('auto', *SIMILARITY_MODES)}. "
            f"Received: similarity={similarity!r}"
        )
    return similarity
