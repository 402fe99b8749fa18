"""TensorBoard: event files, read back with TensorBoard's own reader, hold every tag."""

from __future__ import annotations

import gc
import re
import weakref

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import event_accumulator
from tensorboard.plugins.custom_scalar import layout_pb2, metadata

import tf_adabatch
from tf_adabatch import summaries

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data

# The SimiGrad policy of the test below: its target and bounds are the reference lines.
TARGET, MIN_BATCH, MAX_BATCH = 0.9, 8, 64


def read_scalars(logdir: str) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """Scalar series by tag, and the tags of the custom-scalars plugin (test_fit uses it)."""
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    layout_tags = set(acc.PluginTagToContent("custom_scalars"))
    return summaries.read_scalars(logdir), layout_tags


def read_layout(logdir: str) -> layout_pb2.Layout:
    """The custom-scalars layout as written into a run's event file."""
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    (event,) = acc.Tensors(metadata.CONFIG_SUMMARY_TAG)
    return layout_pb2.Layout.FromString(tf.make_ndarray(event.tensor_proto).item())


@pytest.fixture(scope="module")
def simigrad_run(tmp_path_factory) -> tuple[str, str, dict[str, list[float]]]:
    """Five steps of SimiGrad (target 0.9, batch in [8, 64]) with summaries, and one
    evaluation written into the sibling eval run, as `tf_adabatch.app.run` lays them out."""
    root = tmp_path_factory.mktemp("tb")
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05), momentum=0.9)
    policy = tf_adabatch.SimiGradPolicy(
        TARGET, initial_batch_size=16, min_batch_size=MIN_BATCH, max_batch_size=MAX_BATCH
    )
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=4,
        base_batch_size=8,
        policy=policy,
        strategy=strategy,
    )
    x, y = regression_data(512)
    train_dir = str(root / summaries.TRAIN_RUN)
    eval_dir = str(root / summaries.EVAL_RUN)
    history = trainer.fit(
        global_micro_batches(x, y, 8).repeat(), steps=5, summary_dir=train_dir, verbose=0
    )
    writer = tf.summary.create_file_writer(eval_dir)
    summaries.write_eval(writer, 5, {"loss": 0.25, "accuracy": 0.75})
    writer.flush()
    return train_dir, eval_dir, history


# The per-step tags docs/tensorboard.md documents, written out here (not taken from the
# code under test), with the history key `Trainer.fit` reports each under.
DOCUMENTED_STEP_TAGS = {
    "adabatch/batch_size": "batch_size",
    "adabatch/accumulation_steps": "accumulation_steps",
    "adabatch/gain": "gain",
    "adabatch/similarity": "similarity",
    "adabatch/noise_scale": "noise_scale",
    "adabatch/grad_sqr": "grad_sqr",
    "adabatch/grad_var": "grad_var",
    "adabatch/learning_rate": "learning_rate",
    "adabatch/progress": "progress",
    "adabatch/samples_seen": "samples_seen",
    "adabatch/skipped_steps": "skipped_steps",
    "adabatch/step_time": "step_time",
    "adabatch/examples_per_second": "examples_per_second",
    "adabatch/progress_per_second": "progress_per_second",
    "loss": "loss",
}


def _raw_events(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files, read with TensorFlow's raw event iterator (not
    `summaries.read_scalars`, the reader under test elsewhere)."""
    import glob

    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(glob.glob(f"{logdir}/events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(path):
            for value in event.summary.value:
                is_scalar = value.metadata.plugin_data.plugin_name == "scalars"
                if value.HasField("tensor") and is_scalar:
                    scalar = float(tf.make_ndarray(value.tensor))
                    out.setdefault(value.tag, []).append((int(event.step), scalar))
    return out


def test_every_tag_is_written_with_the_reported_values(simigrad_run) -> None:
    """Each documented tag holds, at steps 1-5, the value `fit` reported for that step
    (NaN where an infinite value was reported: TensorBoard's gap)."""
    train_dir, _, history = simigrad_run
    scalars = _raw_events(train_dir)
    checked = 0
    for tag, key in DOCUMENTED_STEP_TAGS.items():
        steps, values = zip(*sorted(scalars[tag]), strict=True)
        assert list(steps) == [1, 2, 3, 4, 5], tag
        reported = np.where(np.isinf(history[key]), np.nan, history[key])
        np.testing.assert_allclose(values, reported, rtol=1e-6, equal_nan=True, err_msg=tag)
        checked += 1
    assert checked == 15
    # The batch really adapted (target 0.9 is above what this task gives: it grows).
    assert history["batch_size"][-1] > history["batch_size"][0]


def test_policy_target_and_bounds_are_lines_at_every_step(simigrad_run) -> None:
    scalars = summaries.read_scalars(simigrad_run[0])
    # The values given to SimiGradPolicy above, at each of the five steps (a line).
    for name, value in (
        ("target_similarity", TARGET),
        ("min_batch_size", MIN_BATCH),
        ("max_batch_size", MAX_BATCH),
    ):
        assert scalars[f"adabatch/{name}"] == [(s, pytest.approx(value)) for s in range(1, 6)]


def test_train_and_eval_loss_share_one_tag_in_two_runs(simigrad_run) -> None:
    train_dir, eval_dir, _ = simigrad_run
    train, evals = summaries.read_scalars(train_dir), summaries.read_scalars(eval_dir)
    # Keras's TensorBoard callback convention: the same tag, told apart by the run folder.
    assert summaries.TRAIN_LOSS == summaries.eval_tag("loss") == "loss"
    assert len(train["loss"]) == 5
    assert evals == {"loss": [(5, 0.25)], "accuracy": [(5, 0.75)]}


# Which series share a scale: a chart may only hold tags of one of these quantities.
QUANTITY = {
    "adabatch/min_batch_size": "adabatch/batch_size",
    "adabatch/max_batch_size": "adabatch/batch_size",
    "adabatch/target_similarity": "adabatch/similarity",
}


def test_layout_charts_one_quantity_each_and_only_written_tags(simigrad_run) -> None:
    train_dir, eval_dir, _ = simigrad_run
    written = set(summaries.read_scalars(train_dir)) | set(summaries.read_scalars(eval_dir))
    charts = [chart for category in read_layout(train_dir).category for chart in category.chart]
    charted = set()
    for chart in charts:
        matched = {t for regex in chart.multiline.tag for t in written if re.fullmatch(regex, t)}
        # Every series of the chart is written (no empty line, no empty chart) ...
        for regex in chart.multiline.tag:
            assert any(re.fullmatch(regex, t) for t in written), (chart.title, regex)
        # ... and all of them are one quantity.
        assert len({QUANTITY.get(t, t) for t in matched}) == 1, (chart.title, matched)
        charted |= matched
    assert charted == written  # and every written series is in some chart
    titles = [chart.title for chart in charts]
    assert len(titles) == len(set(titles)) == len(written) - len(QUANTITY)


def test_a_static_policy_has_no_reference_lines(tmp_path) -> None:
    writer = tf.summary.create_file_writer(str(tmp_path))
    policy = tf_adabatch.StaticPolicy(32)
    summaries.write_layout(writer, policy=policy)
    summaries.write_step(writer, 1, {"loss": 1.0, "batch_size": 32.0}, policy=policy)
    writer.flush()
    assert set(summaries.read_scalars(str(tmp_path))) == {"loss", "adabatch/batch_size"}
    tags = {
        t for c in read_layout(str(tmp_path)).category for ch in c.chart for t in ch.multiline.tag
    }
    assert not {t for t in tags if "min_batch" in t or "max_batch" in t or "target" in t}


def test_step_scalars_are_written_by_one_compiled_call_per_tag_set(tmp_path) -> None:
    """`write_step` writes through one `tf.function` per writer and set of tags, traced
    once, and the values read back are the float32 roundings of those given, as the
    eager `tf.summary.scalar` writes them; the functions go with their writer."""
    writer = tf.summary.create_file_writer(str(tmp_path))
    steps = [(step, {"loss": 1.0 / step, "gain": 1.0 + step / 3.0}) for step in (1, 2, 3)]
    for step, logs in steps:
        summaries.write_step(writer, step, logs)
    summaries.write_step(writer, 4, {"gain": 9.0})  # another set of tags: another function
    with tf.summary.record_if(False):  # the caller's recording condition holds
        summaries.write_step(writer, 5, {"gain": 7.0})
    writer.flush()
    compiled = summaries._WRITE_FUNCTIONS[writer]
    assert sorted(compiled) == [("adabatch/gain",), ("adabatch/gain", "loss")]
    assert [f.experimental_get_tracing_count() for f in compiled.values()] == [1, 1]
    read = summaries.read_scalars(str(tmp_path))
    f32 = lambda x: float(np.float32(x))  # noqa: E731
    assert read["loss"] == [(step, f32(logs["loss"])) for step, logs in steps]
    assert read["adabatch/gain"] == [(s, f32(lg["gain"])) for s, lg in steps] + [(4, 9.0)]
    writer.close()
    alive = weakref.ref(writer)
    del writer, compiled
    gc.collect()
    assert alive() is None  # the compiled functions did not keep the writer


def linear_trainer(base) -> tf_adabatch.Trainer:
    """2 replicas x micro-batch 4, static batch 32, B0 = 8: the "linear" rule's progress
    grows by S = 32 / 8 = 4 per step. `base`: the base learning rate or schedule."""
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(base, "linear"))
    return tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=4,
        base_batch_size=8,
        policy=tf_adabatch.StaticPolicy(32),
        strategy=strategy,
    )


def test_until_progress_stops_at_the_budget() -> None:
    trainer = linear_trainer(0.05)
    x, y = regression_data(512)
    history = trainer.fit(global_micro_batches(x, y, 8).repeat(), until_progress=10.0, verbose=0)
    # "linear": tau grows by S = 32 / 8 = 4 per step: 4, 8, 12 -> three steps.
    assert history["progress"] == pytest.approx([4.0, 8.0, 12.0])


def test_default_budget_is_the_base_schedules_length() -> None:
    trainer = linear_trainer(keras.optimizers.schedules.CosineDecay(0.05, decay_steps=18))
    x, y = regression_data(512)
    history = trainer.fit(global_micro_batches(x, y, 8).repeat(), verbose=0)
    assert history["progress"] == pytest.approx(
        [4.0, 8.0, 12.0, 16.0, 20.0]
    )  # S = 4 per step, up to 18
