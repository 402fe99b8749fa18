"""Mixed precision: mixed_float16 with Keras's dynamic loss scaling, and mixed_bfloat16.

The engine differentiates the scaled loss and unscales each micro-gradient at once, so
the statistics must equal those of a float32 run up to float16 rounding (a missing
unscale would multiply |G|^2 by the scale squared, 2^30 here); a step whose scaled
gradients overflow is skipped by the loss-scale optimizer and by the engine alike.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import mlp, regression_data, weights

M = 8
REPLICAS = 2


def run(dtype: str, steps: int, *, initial_scale: float | None = 2.0**15, same_batch: bool = False):
    strategy = get_strategy(REPLICAS)
    model = mlp(strategy, dtype=dtype)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
        if dtype == "mixed_float16":
            optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=initial_scale)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(REPLICAS * M * 2),
        strategy=strategy,
    )
    x, y = regression_data(1024)
    data = tf.data.Dataset.from_tensor_slices((x, y))
    if same_batch:  # every micro-batch the same: skipped steps cost no data
        data = data.take(REPLICAS * M)
    data = data.repeat().batch(REPLICAS * M, drop_remainder=True)
    history = trainer.fit(data, steps=steps, verbose=0)
    return trainer, optimizer, history


def test_mixed_float16_statistics_and_weights_match_float32() -> None:
    ref, _, ref_hist = run("float32", 12)
    mixed, optimizer, hist = run("mixed_float16", 12)
    assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer)
    assert hist["applied"] == [1.0] * 12  # scale 2^15 does not overflow on this problem
    # float16 keeps ~3 decimal digits: 2% on the second moments, 1e-2 on the weights.
    for name in ("grad_sqr", "grad_var", "gain", "loss"):
        np.testing.assert_allclose(hist[name], ref_hist[name], rtol=2e-2, err_msg=name)
    for a, b in zip(weights(mixed.engine.model), weights(ref.engine.model), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-2)


def test_overflowing_steps_are_skipped_and_leave_the_averages_alone() -> None:
    """Initial scale 2^24: the float16 backward overflows, the loss-scale optimizer
    halves its scale per skipped step until the gradients are finite. With every
    micro-batch the same, the run after its s skipped steps must follow the clean run
    (scale 2^10) from its first step: s skips changed nothing but the scale."""
    over, over_opt, hist = run("mixed_float16", 12, initial_scale=2.0**24, same_batch=True)
    skipped = hist["applied"].index(1.0)
    assert skipped >= 1, "the large scale did not overflow: the test proves nothing"
    assert hist["applied"] == [0.0] * skipped + [1.0] * (12 - skipped)
    assert hist["skipped_steps"][-1] == skipped
    assert int(over.state.skipped_steps.numpy()) == skipped
    assert int(over.state.steps.numpy()) == 12 - skipped
    # The loss-scale optimizer saw each overflow: halved once per skipped step.
    assert float(over_opt.dynamic_scale.numpy()) == 2.0**24 / 2**skipped
    # No NaN/inf reached the moving averages (NaN = "no statistics yet" until the first
    # applied step, by design), the gain or the progress.
    assert np.all(np.isnan(hist["grad_sqr"][:skipped]))
    assert np.all(np.isfinite(hist["grad_sqr"][skipped:]))
    assert (
        hist["gain"][:skipped] == [1.0] * skipped and hist["progress"][:skipped] == [0.0] * skipped
    )
    n = 12 - skipped
    clean, _, clean_hist = run("mixed_float16", n, initial_scale=2.0**10, same_batch=True)
    assert clean_hist["applied"] == [1.0] * n
    for name in ("grad_sqr", "grad_var", "gain", "progress", "loss"):
        np.testing.assert_allclose(hist[name][skipped:], clean_hist[name], rtol=1e-2, err_msg=name)
    for a, b in zip(weights(over.engine.model), weights(clean.engine.model), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("dtype", ["mixed_bfloat16"])
def test_mixed_bfloat16_trains_like_float32(dtype: str) -> None:
    _, _, ref_hist = run("float32", 12)
    mixed, _, hist = run(dtype, 12)
    assert hist["applied"] == [1.0] * 12
    assert mixed.engine.model.layers[0].compute_dtype == "bfloat16"
    # bfloat16 keeps ~2-3 decimal digits.
    for name in ("grad_sqr", "loss"):
        np.testing.assert_allclose(hist[name], ref_hist[name], rtol=5e-2, err_msg=name)
    assert hist["loss"][-1] < 0.8 * hist["loss"][0]


def test_model_fit_with_the_mixed_float16_policy() -> None:
    """`compile` under the mixed_float16 policy wraps the optimizer in a
    LossScaleOptimizer; `attach` accepts it and fit trains."""
    strategy = get_strategy(REPLICAS)
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = mlp(strategy)
        with strategy.scope():
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    engine = tf_adabatch.attach(
        model, micro_batch_size=M, policy=tf_adabatch.StaticPolicy(REPLICAS * M * 2)
    )
    x, y = regression_data(512)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat()
    history = model.fit(
        data.batch(REPLICAS * M, drop_remainder=True), epochs=2, steps_per_epoch=5, verbose=0
    )
    assert int(engine.state.steps.numpy()) == 10 and int(engine.state.skipped_steps.numpy()) == 0
    assert history.history["loss"][-1] < history.history["loss"][0]
    assert np.isfinite(float(engine.smoothed_moments().grad_sqr))  # not in the fit logs
