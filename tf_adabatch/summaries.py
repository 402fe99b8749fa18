"""TensorBoard tags, in one place, and the writers both front doors use.

Every optimizer step writes, with the step (applied and skipped ones counted) as x-axis:
``adabatch/<name>`` for each name in `ADABATCH_SCALARS`, and ``train/loss``; an
evaluation writes ``eval/<metric>``. `write_layout` adds a custom-scalars dashboard that
puts the batch size beside the similarity and the gain beside the learning rate.
"""

from __future__ import annotations

from collections.abc import Mapping

import tensorflow as tf

__all__ = [
    "ADABATCH_SCALARS",
    "TRAIN_LOSS",
    "eval_tag",
    "layout",
    "read_scalars",
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
)
TRAIN_LOSS = "train/loss"


def eval_tag(metric: str) -> str:
    """The tag of an evaluation metric.

    >>> eval_tag("accuracy")
    'eval/accuracy'
    """
    return f"eval/{metric}"


def write_step(writer: tf.summary.SummaryWriter, step: int, logs: Mapping[str, float]) -> None:
    """Writes one optimizer step's scalars (host-side, from the step's logs).

    Example:

    >>> import tempfile
    >>> writer = tf.summary.create_file_writer(tempfile.mkdtemp())
    >>> write_step(writer, 1, {"loss": 0.5, "gain": 1.2})
    """
    with writer.as_default(step=step):
        for name in ADABATCH_SCALARS:
            if name in logs:
                tf.summary.scalar(f"adabatch/{name}", logs[name])
        if "loss" in logs:
            tf.summary.scalar(TRAIN_LOSS, logs["loss"])


def layout() -> object:
    """The custom-scalars layout (a `tensorboard` `Layout` proto).

    >>> [category.title for category in layout().category]
    ['adaptation', 'noise', 'progress']
    """
    from tensorboard.plugins.custom_scalar import layout_pb2

    def chart(title: str, *tags: str) -> object:
        return layout_pb2.Chart(
            title=title, multiline=layout_pb2.MultilineChartContent(tag=[f"^{t}$" for t in tags])
        )

    def category(title: str, *charts: object) -> object:
        return layout_pb2.Category(title=title, chart=list(charts))

    return layout_pb2.Layout(
        category=[
            category(
                "adaptation",
                chart("batch size and similarity", "adabatch/batch_size", "adabatch/similarity"),
                chart("gain and learning rate", "adabatch/gain", "adabatch/learning_rate"),
            ),
            category(
                "noise",
                chart("noise scale", "adabatch/noise_scale"),
                chart("|G|^2 and variance", "adabatch/grad_sqr", "adabatch/grad_var"),
            ),
            category(
                "progress",
                chart("loss", TRAIN_LOSS),
                chart("progress and samples", "adabatch/progress", "adabatch/samples_seen"),
                chart("skipped steps", "adabatch/skipped_steps"),
            ),
        ]
    )


def write_layout(writer: tf.summary.SummaryWriter) -> None:
    """Writes the custom-scalars layout once into a run's log directory.

    >>> import tempfile
    >>> write_layout(tf.summary.create_file_writer(tempfile.mkdtemp()))
    """
    from tensorboard.plugins.custom_scalar import summary as custom_scalar

    with writer.as_default():
        tf.summary.experimental.write_raw_pb(custom_scalar.pb(layout()).SerializeToString(), step=0)


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
