"""TensorBoard: event files, read back with TensorBoard's own reader, hold every tag."""

from __future__ import annotations

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

import tf_adabatch
from tf_adabatch import summaries

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data


def read_scalars(logdir: str) -> tuple[dict[str, list[tuple[int, float]]], set[str]]:
    """Scalar series by tag, and the tags of the custom-scalars plugin."""
    acc = event_accumulator.EventAccumulator(logdir, size_guidance={event_accumulator.TENSORS: 0})
    acc.Reload()
    layout_tags = set(acc.PluginTagToContent("custom_scalars"))
    return summaries.read_scalars(logdir), layout_tags


def test_every_tag_is_written_with_the_reported_values(tmp_path) -> None:
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05), momentum=0.9)
    policy = tf_adabatch.SimiGradPolicy(
        0.9, initial_batch_size=16, min_batch_size=8, max_batch_size=64
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
    logdir = str(tmp_path / "tb")
    history = trainer.fit(
        global_micro_batches(x, y, 8).repeat(), steps=5, summary_dir=logdir, verbose=0
    )
    scalars, layout_tags = read_scalars(logdir)
    expected_tags = {f"adabatch/{n}" for n in summaries.ADABATCH_SCALARS} | {"train/loss"}
    assert expected_tags <= set(scalars)
    for name in summaries.ADABATCH_SCALARS:
        steps, values = zip(*scalars[f"adabatch/{name}"], strict=True)
        assert list(steps) == [1, 2, 3, 4, 5]
        np.testing.assert_allclose(values, history[name], rtol=1e-6, equal_nan=True)
    np.testing.assert_allclose([v for _, v in scalars["train/loss"]], history["loss"], rtol=1e-6)
    # The batch really adapted (target 0.9 is above what this task gives: it grows).
    assert history["batch_size"][-1] > history["batch_size"][0]
    assert layout_tags  # the custom-scalars layout was written


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
