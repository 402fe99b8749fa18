"""Estimated similarity behaves like exact similarity: same mean, no lag.

The problem has a closed-form gradient distribution. A linear model without bias and the
loss "sum of the outputs" give each example the gradient x itself (d(w.x)/dw = x), so
with x ~ N(mu, s^2 I) in d dimensions:

    G = mu,   tr(Sigma) = d s^2,

whatever the weights (the problem is stationary under any learning rate). Two
independent halves of a batch B are g_A, g_B ~ N(mu, (2 s^2 / B) I), and their cosine
concentrates (d large) around

    c* = |mu|^2 / (|mu|^2 + 2 d s^2 / B),

which the tests also check with a Monte Carlo estimate of E[cos(g_A, g_B)] in numpy.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import sum_of_outputs

D = 512  # parameters
M = 4  # micro-batch per replica
REPLICAS = 2
K = 4  # micro-steps per replica
B = REPLICAS * M * K  # 32
MU = np.full(D, 0.25)  # |mu|^2 = 32 = 2 d s^2 / B with s = 1: c* = 1/2


def closed_form(s: float) -> float:
    g2 = float(MU @ MU)
    return g2 / (g2 + 2 * D * s**2 / B)


def monte_carlo(s: float, draws: int = 4000, seed: int = 1) -> float:
    rng = np.random.default_rng(seed)
    half = np.sqrt(2.0 / B) * s
    a = MU + half * rng.normal(size=(draws, D))
    b = MU + half * rng.normal(size=(draws, D))
    cos = (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)
    return float(cos.mean())


def similarities(
    mode: str, sigmas: list[float], steps_each: int, replicas: int = REPLICAS
) -> np.ndarray:
    """The engine's per-step similarity over `steps_each` steps at each noise level
    (batch B on `replicas` replicas: B / (replicas * M) micro-steps each)."""
    strategy = get_strategy(replicas)
    rng = np.random.default_rng(0)
    x = np.concatenate([MU + s * rng.normal(size=(steps_each * B, D)) for s in sigmas]).astype(
        "float32"
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(1, use_bias=False)])
        optimizer = keras.optimizers.SGD(0.01)
    trainer = tf_adabatch.Trainer(
        model,
        loss=sum_of_outputs,
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(B),
        similarity=mode,
        strategy=strategy,
    )
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros((len(x), 1), "float32")))
    history = trainer.fit(
        data.batch(replicas * M, drop_remainder=True), steps=len(sigmas) * steps_each, verbose=0
    )
    assert history["batch_size"] == [float(B)] * (len(sigmas) * steps_each)
    return np.array(history["similarity"])


def test_stationary_mean_matches_exact_mode_and_the_closed_form() -> None:
    """Two replicas: estimated mode's similarity is the cosine of the two replicas'
    gradient sums (stats.replica_similarity with N = 2: c = c_1), which is exact mode's
    cosine of its two groups (group A = replica 0), step by step. One replica (8
    micro-steps): the similarity comes from the step's moments, and its mean is within
    0.01 of exact mode's."""
    steps = 150
    exact = similarities("exact", [1.0], steps)
    estimated = similarities("estimated", [1.0], steps)
    from_moments = similarities("estimated", [1.0], steps, replicas=1)
    reference = monte_carlo(1.0)
    assert abs(reference - closed_form(1.0)) < 0.01  # d = 512 is "high dimension"
    # Standard error of a mean of 150 per-step values: about 0.05 / sqrt(150) = 0.004.
    assert abs(exact.mean() - reference) < 0.015
    # Same data, same groups: equal up to float32 rounding of the sums.
    np.testing.assert_allclose(estimated, exact, rtol=1e-4, atol=1e-6)
    assert abs(from_moments.mean() - exact.mean()) < 0.01
    # Per-step spreads, reported (all are single-step readings of the noise).
    for name, values in (("exact", exact), ("estimated", estimated), ("moments", from_moments)):
        print(f"{name}: mean {values.mean():.4f} std {values.std():.4f}")
        assert 0.0 < values.std() < 0.2, name


def test_follows_an_abrupt_change_of_the_noise_within_ten_steps() -> None:
    """s jumps from 1 to 3 at step 100: c* falls from 1/2 to 32 / (32 + 288) = 0.1.

    Ten steps after the jump, both modes (and estimated mode on one replica, from the
    step's moments) read the new level (mean of steps 110-149
    within 0.03 of the Monte Carlo value). The moving averages behind the gain have
    a memory of ~1/(1 - decay) = 125 steps here (fairscale's decay 1 - n/1000 with
    n = 8 micro-gradients), so a similarity read from them would still be far above."""
    before, after = 100, 50
    settle = 10
    expected = monte_carlo(3.0)
    assert abs(expected - closed_form(3.0)) < 0.01
    checked = 0
    for mode, replicas in (("exact", 2), ("estimated", 2), ("estimated", 1)):
        values = similarities(mode, [1.0, 3.0], before, replicas)[: before + after]
        assert abs(values[:before].mean() - monte_carlo(1.0)) < 0.02, (mode, replicas)
        assert abs(values[before + settle :].mean() - expected) < 0.03, (mode, replicas)
        checked += 1
    assert checked == 3


def test_one_replica_at_a_batch_other_than_b0_gives_the_closed_form_of_its_micro_gradients() -> (
    None
):
    """One replica, estimated mode, k = 4 micro-steps of m = 8 (B = 32) while B0 = 8: the
    step's similarity is that of `stats.estimated_similarity` at B (not B0) from the
    step's unbiased moments, written out (its docstring):

        c = (B |gbar|^2 - m mean_sq) / ((B - 2m) |gbar|^2 + m mean_sq),

    with g_i = (2 / m) X_i^T (X_i w - y_i) the mean-squared-error gradient of micro-batch i
    of a linear model y = X w, gbar their mean and mean_sq the mean of |g_i|^2, all in
    numpy from the data and the initial weights."""
    m, k = 8, 4
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4 * m * k, 5)).astype("float32")
    y = (x @ rng.normal(size=(5, 1)) + rng.normal(size=(4 * m * k, 1))).astype("float32")
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1, use_bias=False)])
    w = model.weights[0].numpy().astype(np.float64)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.01),
        micro_batch_size=m,
        base_batch_size=m,
        policy=tf_adabatch.StaticPolicy(m * k),
        similarity="estimated",
    )
    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(m, drop_remainder=True)
    iterator = iter(trainer.distribute(data))
    logs = trainer.engine.train_step(iterator)
    assert int(logs["batch_size"]) == 32 and int(logs["accumulation_steps"]) == k
    xs, ys = x[: m * k].astype(np.float64), y[: m * k].astype(np.float64)
    grads = [
        (2.0 / m)
        * xs[i * m : (i + 1) * m].T
        @ (xs[i * m : (i + 1) * m] @ w - ys[i * m : (i + 1) * m])
        for i in range(k)
    ]
    gbar_sq = float(np.sum(np.mean(grads, axis=0) ** 2))
    mean_sq = float(np.mean([np.sum(g**2) for g in grads]))
    b = m * k
    expected = (b * gbar_sq - m * mean_sq) / ((b - 2 * m) * gbar_sq + m * mean_sq)
    assert float(logs["similarity"]) == pytest.approx(expected, rel=1e-4)
    # At B0 instead of B the same moments would read another similarity: the test can tell.
    at_b0 = (m * gbar_sq - m * mean_sq) / ((m - 2 * m) * gbar_sq + m * mean_sq)
    assert abs(at_b0 - expected) > 0.05
