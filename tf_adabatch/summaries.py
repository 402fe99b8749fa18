"""TensorBoard tags, in one place, and the writers both front doors use.

A training job writes two runs, as Keras's TensorBoard callback does: `TRAIN_RUN` and
`EVAL_RUN`, sibling folders under one log root. Every optimizer step writes into the
train run, with the step (applied and skipped ones counted) as x-axis:
``adabatch/<name>`` for each name in `ADABATCH_SCALARS`, the policy's reference lines
``adabatch/<name>`` for each name in `POLICY_SCALARS` that the policy defines (its batch
bounds, SimiGrad's target similarity), and the loss as `TRAIN_LOSS`. An evaluation
writes each metric under `eval_tag(metric)` into the eval run; the train and eval loss
share one tag, so TensorBoard overlays them. `write_layout` adds a custom-scalars
dashboard with one quantity per chart.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = [
    "ADABATCH_SCALARS",
    "EVAL_RUN",
    "POLICY_SCALARS",
    "TRAIN_LOSS",
    "TRAIN_RUN",
    "TRAIN_SECONDS",
    "eval_tag",
    "layout",
    "policy_scalars",
    "read_scalars",
    "write_eval",
    "write_layout",
    "write_step",
]

# Engine log key -> written under "adabatch/<key>".
ADABATCH_SCALARS = (
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
    "step_time",
    "examples_per_second",
    "progress_per_second",
)
# Policy attribute -> written under "adabatch/<name>" at every step (a flat line beside
# the quantity it bounds or targets), when the policy has it.
POLICY_SCALARS = ("min_batch_size", "max_batch_size", "target_similarity")
# The run folders under a log root, and the loss tag both of them use.
TRAIN_RUN = "train"
EVAL_RUN = "eval"
TRAIN_LOSS = "loss"
# Written into the eval run at each evaluation by `tf_adabatch.app.run`: seconds spent
# training so far in that process, evaluations excluded (time to accuracy).
TRAIN_SECONDS = "adabatch/train_seconds"


def eval_tag(metric: str) -> str:
    """The tag of an evaluation metric (written into the `EVAL_RUN` folder).

    The metric's own name, as Keras's TensorBoard callback does, so that the eval
    loss shares its tag with the train loss (`TRAIN_LOSS`) and TensorBoard draws both
    runs in one chart.

    >>> eval_tag("accuracy"), eval_tag("loss") == TRAIN_LOSS
    ('accuracy', True)
    """
    return metric


def policy_scalars(policy: Any) -> dict[str, float]:
    """The reference values a batch-size policy defines, by name (see `POLICY_SCALARS`).

    Any policy with numeric attributes of these names gets its lines; `None` or a
    policy without them (e.g. `StaticPolicy`) gives none.

    >>> import tf_adabatch
    >>> policy_scalars(tf_adabatch.SimiGradPolicy(
    ...     0.3, initial_batch_size=64, min_batch_size=32, max_batch_size=512))
    {'min_batch_size': 32.0, 'max_batch_size': 512.0, 'target_similarity': 0.3}
    >>> policy_scalars(tf_adabatch.StaticPolicy(64))
    {}
    """
    out = {}
    for name in POLICY_SCALARS:
        value = getattr(policy, name, None)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = float(value)
    return out


def write_step(
    writer: tf.summary.SummaryWriter,
    step: int,
    logs: Mapping[str, float],
    *,
    policy: Any = None,
) -> None:
    """Writes one optimizer step's scalars (host-side, from the step's logs).

    Args:
      writer: the train run's writer.
      step: the x-axis value (optimizer steps, skipped ones included).
      logs: the step's logs (`AdaptiveEngine.train_step`); the names of
        `ADABATCH_SCALARS` and "loss" are written, the others ignored. An infinite
        value (the noise scale before any signal) is written as NaN: TensorBoard
        leaves a gap for NaN, while one infinite point blanks its whole chart.
      policy: the batch-size policy; if given, its `policy_scalars` are written too,
        so that its bounds and target draw as lines beside the batch size and the
        similarity.

    Example:

    >>> import tempfile
    >>> logdir = tempfile.mkdtemp()
    >>> writer = tf.summary.create_file_writer(logdir)
    >>> write_step(writer, 1, {"loss": 0.5, "gain": 1.2, "noise_scale": float("inf")})
    >>> writer.flush()
    >>> read_scalars(logdir)["adabatch/noise_scale"]  # a gap in TensorBoard, not inf
    [(1, nan)]
    """
    tags, values = [], []
    for name in ADABATCH_SCALARS:
        if name in logs:
            tags.append(f"adabatch/{name}")
            values.append(float(logs[name]))
    for name, value in policy_scalars(policy).items():
        tags.append(f"adabatch/{name}")
        values.append(value)
    if "loss" in logs:
        tags.append(TRAIN_LOSS)
        values.append(float(logs["loss"]))
    with writer.as_default():  # (without a default writer nothing is recorded)
        record = tf.summary.should_record_summaries()  # the caller's `tf.summary.record_if`
    array = np.asarray(values, np.float64).reshape(len(tags))
    # TensorBoard cannot draw an infinite point (the first noise scale, before any
    # gradient signal, is +inf): its whole chart stayed empty. NaN is a gap there.
    array[np.isinf(array)] = np.nan
    _scalar_writer(writer, tuple(tags))(np.int64(step), array, record)


# writer -> {tags: compiled write}; weak, so that a closed writer's functions go with it.
_WRITE_FUNCTIONS: weakref.WeakKeyDictionary[Any, dict[tuple[str, ...], Callable[..., Any]]] = (
    weakref.WeakKeyDictionary()
)


def _scalar_writer(writer: tf.summary.SummaryWriter, tags: tuple[str, ...]) -> Callable[..., Any]:
    """One compiled function that writes these tags' scalars at a step.

    A `tf.summary.scalar` per tag in eager mode cost 2.5-4.5 ms a step for the 15-18
    scalars of a step (measured on this project's CPU machine), a tenth of a
    Fashion-MNIST CNN step; one call of a `tf.function` writing them all costs a
    fraction of that. The values written are the same: `tf.summary.scalar` casts
    each to float32 either way; the recording condition is the caller's at each call.
    """
    functions = _WRITE_FUNCTIONS.setdefault(writer, {})
    if tags not in functions:
        # Weakly: the function (a value of the weak dictionary) must not keep its key alive.
        writer_ref = weakref.ref(writer)

        def write(step: tf.Tensor, values: tf.Tensor, record: tf.Tensor) -> None:
            with writer_ref().as_default(step=step), tf.summary.record_if(record):  # type: ignore[union-attr]
                for i, tag in enumerate(tags):
                    tf.summary.scalar(tag, values[i])

        functions[tags] = tf.function(
            write,
            input_signature=[
                tf.TensorSpec([], tf.int64),
                tf.TensorSpec([len(tags)], tf.float64),
                tf.TensorSpec([], tf.bool),
            ],
            autograph=False,
        )
    return functions[tags]


def write_eval(writer: tf.summary.SummaryWriter, step: int, results: Mapping[str, float]) -> None:
    """Writes one evaluation's results (name -> value) under `eval_tag(name)`.

    Give it the writer of the `EVAL_RUN` folder, a sibling of the train run's.

    >>> import tempfile
    >>> write_eval(tf.summary.create_file_writer(tempfile.mkdtemp()), 10,
    ...            {"loss": 0.4, "accuracy": 0.9})
    """
    with writer.as_default(step=step):
        for name, value in results.items():
            tf.summary.scalar(eval_tag(name), value)


def layout(*, policy: Any = None, metrics: Iterable[str] = ("accuracy",)) -> Any:
    """The custom-scalars layout (a `tensorboard` `Layout` proto), one quantity per chart.

    A chart holds one quantity, or series on one scale: the batch size with the
    policy's bounds, the similarity with SimiGrad's target, the loss of the train and
    eval runs.

    Args:
      policy: the batch-size policy; its bounds and target are charted when it has
        them (`policy_scalars`).
      metrics: the evaluation metrics besides the loss, one chart each.

    >>> [category.title for category in layout().category]
    ['loss and evaluation', 'batch size', 'gradient noise', 'learning rate', 'progress',
     'speed (host-timed; NaN on steps that traced)']
    >>> [chart.title for chart in layout().category[0].chart]
    ['loss (runs train and eval)', 'accuracy (run eval)']
    """
    from tensorboard.plugins.custom_scalar import layout_pb2

    lines = policy_scalars(policy)

    def chart(title: str, *tags: str) -> Any:
        return layout_pb2.Chart(
            title=title, multiline=layout_pb2.MultilineChartContent(tag=[f"^{t}$" for t in tags])
        )

    def adabatch(title: str, *names: str) -> Any:
        return chart(title, *(f"adabatch/{n}" for n in names))

    def category(title: str, *charts: Any) -> Any:
        return layout_pb2.Category(title=title, chart=list(charts))

    bounds = [n for n in ("min_batch_size", "max_batch_size") if n in lines]
    target = [n for n in ("target_similarity",) if n in lines]
    return layout_pb2.Layout(
        category=[
            category(
                "loss and evaluation",
                chart(f"loss (runs {TRAIN_RUN} and {EVAL_RUN})", TRAIN_LOSS),
                *(chart(f"{m} (run {EVAL_RUN})", eval_tag(m)) for m in metrics),
            ),
            category(
                "batch size",
                adabatch(
                    "global batch size" + (" (policy min and max)" if bounds else ""),
                    "batch_size",
                    *bounds,
                ),
                adabatch("accumulation micro-steps k", "accumulation_steps"),
            ),
            category(
                "gradient noise",
                adabatch(
                    "similarity of the two gradient groups" + (" (target)" if target else ""),
                    "similarity",
                    *target,
                ),
                adabatch("noise scale tr(Sigma) / |G|^2", "noise_scale"),
                adabatch("|G|^2 (smoothed)", "grad_sqr"),
                adabatch("variance tr(Sigma) / B0 (smoothed)", "grad_var"),
            ),
            category(
                "learning rate",
                adabatch("AdaScale gain", "gain"),
                adabatch("learning rate", "learning_rate"),
            ),
            category(
                "progress",
                adabatch("progress tau (base steps)", "progress"),
                adabatch("samples seen", "samples_seen"),
                adabatch("skipped steps (non-finite gradients or updates)", "skipped_steps"),
            ),
            category(
                "speed (host-timed; NaN on steps that traced)",
                adabatch("seconds per optimizer step", "step_time"),
                adabatch("examples per second", "examples_per_second"),
                adabatch("progress per second (base steps / s)", "progress_per_second"),
            ),
        ]
    )


def write_layout(
    writer: tf.summary.SummaryWriter,
    *,
    policy: Any = None,
    metrics: Iterable[str] = ("accuracy",),
) -> None:
    """Writes the custom-scalars layout once into a run's log directory.

    Args:
      writer: the train run's writer (TensorBoard merges the layouts of all runs).
      policy, metrics: see `layout`.

    >>> import tempfile
    >>> write_layout(tf.summary.create_file_writer(tempfile.mkdtemp()))
    """
    from tensorboard.plugins.custom_scalar import summary as custom_scalar

    with writer.as_default():
        pb = custom_scalar.pb(layout(policy=policy, metrics=metrics))
        tf.summary.experimental.write_raw_pb(pb.SerializeToString(), step=0)


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in a run's log directory, by tag, as sorted (step, value) pairs.

    Read with TensorBoard's own reader. A run that was resumed writes some steps twice
    (the steps after its last checkpoint); the value written last wins, so the series
    is the trajectory the resumed run actually followed.

    >>> import tempfile
    >>> logdir = tempfile.mkdtemp()
    >>> writer = tf.summary.create_file_writer(logdir)
    >>> write_step(writer, 1, {"loss": 0.5, "gain": 1.2})
    >>> writer.flush()
    >>> read_scalars(logdir)["adabatch/gain"]
    [(1, 1.2000000476837158)]
    """
    from tensorboard.backend.event_processing import event_accumulator
    from tensorboard.util import tensor_util

    acc = event_accumulator.EventAccumulator(
        logdir, size_guidance={event_accumulator.TENSORS: 0}, purge_orphaned_data=False
    )
    acc.Reload()
    try:
        layout_tags = set(acc.PluginTagToContent("custom_scalars"))
    except KeyError:  # no layout in this directory (e.g. an eval run)
        layout_tags = set()
    out = {}
    for tag in acc.Tags()["tensors"]:
        if tag in layout_tags:
            continue
        by_step = {
            e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)
        }
        out[tag] = sorted(by_step.items())
    return out
