"""Unit and property tests of the pure statistics (float64, no strategy)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from tf_adabatch import stats as S


def test_step_moments_are_unbiased_on_average() -> None:
    """Monte Carlo check of E[estimate] against the closed form, independent of the engine.

    g_i = G + e_i / sqrt(m) with e_i ~ N(0, diag(v)): |G|^2 and tr(Sigma) = sum(v) known.
    """
    rng = np.random.default_rng(0)
    G = np.array([1.0, -2.0, 0.5])
    v = np.array([4.0, 1.0, 9.0])
    n, m, trials = 4, 8, 20000
    g = G + rng.normal(size=(trials, n, 3)) * np.sqrt(v / m)
    mean_sq = np.mean(np.sum(g**2, -1), -1)
    gbar_sq = np.sum(g.mean(1) ** 2, -1)
    moments = S.step_moments(mean_sq, gbar_sq, float(n), float(m))
    assert np.mean(moments.grad_sqr) == pytest.approx(G @ G, rel=0.02)
    assert np.mean(moments.trace_sigma) == pytest.approx(v.sum(), rel=0.02)


def test_step_moments_need_two_micro_gradients() -> None:
    moments = S.step_moments(1.0, 1.0, 1.0, 4.0)
    assert np.isnan(moments.grad_sqr) and np.isnan(moments.trace_sigma)


def test_differenced_moments_equal_the_two_sample_estimator_for_equal_batches() -> None:
    """Two gradients of m examples: differenced and within-step estimators coincide."""
    a, b = np.array([1.0, 2.0]), np.array([3.0, -1.0])
    m = 5.0
    within = S.step_moments((a @ a + b @ b) / 2, ((a + b) / 2) @ ((a + b) / 2), 2.0, m)
    diff = S.differenced_moments(a @ b, (a - b) @ (a - b), m, m)
    assert float(diff.grad_sqr) == pytest.approx(float(within.grad_sqr), rel=1e-12)
    assert float(diff.trace_sigma) == pytest.approx(float(within.trace_sigma), rel=1e-12)


def test_ema_with_constant_decay_is_adam_debiasing() -> None:
    values = [3.0, -1.0, 4.0, 1.5]
    theta = 0.9
    biased = weight = tf.constant(0.0, tf.float64)
    for v in values:
        biased, weight = S.ema_update(biased, weight, v, theta)
    t = len(values)
    expected = sum((1 - theta) * theta ** (t - 1 - i) * v for i, v in enumerate(values)) / (
        1 - theta**t
    )
    assert float(S.debias(biased, weight)) == pytest.approx(expected, rel=1e-12)


def test_gain_limits_and_undefined_cases() -> None:
    assert float(S.adascale_gain(0.0, 5.0, 64.0, 8.0)) == pytest.approx(8.0)  # pure noise: S
    assert float(S.adascale_gain(3.0, 0.0, 64.0, 8.0)) == pytest.approx(1.0)  # exact gradient
    assert float(S.adascale_gain(0.0, 0.0, 64.0, 8.0)) == 1.0  # undefined: base LR
    assert float(S.adascale_gain(float("nan"), 1.0, 64.0, 8.0)) == 1.0
    # sigma^2 = 16/8 = 2, mu^2 = 1, S = 8: (2 + 1) / (2/8 + 1) = 2.4
    assert float(S.adascale_gain(1.0, 16.0, 64.0, 8.0)) == pytest.approx(2.4, rel=1e-12)


def test_noise_scale_and_similarity_edge_cases() -> None:
    assert float(S.noise_scale(0.0, 1.0)) == float("inf")
    assert np.isnan(float(S.noise_scale(0.0, 0.0)))
    assert np.isnan(float(S.cosine_similarity(0.0, 0.0, 1.0)))
    assert np.isnan(float(S.estimated_similarity(0.0, 0.0, 8.0)))
    # c = B / (B + 2 B_noise): B_noise = 16 / 2 = 8 at B = 16 gives 1/2.
    assert float(S.estimated_similarity(2.0, 16.0, 16.0)) == pytest.approx(0.5)


def test_sum_of_squares_accumulates_half_precision_in_float64() -> None:
    big = [tf.fill([1000], tf.constant(300.0, tf.float16))]  # 9e7: overflows float16
    assert float(S.sum_of_squares(big)) == pytest.approx(9e7)


finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=1e-6, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=200, deadline=None)
@given(grad_sqr=finite, trace=finite, batch=st.integers(1, 1 << 20), base=st.integers(1, 1 << 20))
def test_gain_is_finite_and_within_one_and_scale(grad_sqr, trace, batch, base) -> None:
    moments = S.clip_moments(
        S.NoiseMoments(tf.constant(grad_sqr, tf.float64), tf.constant(trace, tf.float64)),
        float(base),
    )
    gain = float(S.adascale_gain(moments.grad_sqr, moments.trace_sigma, float(batch), float(base)))
    scale = batch / base
    assert np.isfinite(gain)
    assert min(1.0, scale) * (1 - 1e-12) <= gain <= max(1.0, scale) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(mean_sq=positive, gbar_sq=positive, n=st.integers(2, 4096), m=st.integers(1, 4096))
def test_any_finite_step_gives_finite_clipped_moments(mean_sq, gbar_sq, n, m) -> None:
    moments = S.clip_moments(S.step_moments(mean_sq, gbar_sq, float(n), float(m)), 32.0)
    assert np.isfinite(float(moments.grad_sqr)) and float(moments.grad_sqr) >= 0.0
    assert np.isfinite(float(moments.trace_sigma)) and float(moments.trace_sigma) >= 32e-6


def _replica_draws(rng, n_replicas: int, k: int, decay: float, trials: int, d: int = 300):
    """Replica sums h_r of k micro-gradients g = G + e, e ~ N(0, diag(lam)), sum(lam) = 1:
    lam_j ~ j^-decay puts the noise into a few directions (effective dimension
    (sum lam)^2 / sum lam^2), |G|^2 = 0.2 tr(Sigma) per micro-gradient."""
    lam = np.arange(1, d + 1) ** -decay
    lam /= lam.sum()
    G = rng.normal(size=d)
    G *= np.sqrt(0.2) / np.linalg.norm(G)
    g = G + np.sqrt(lam) * rng.normal(size=(trials, n_replicas, k, d))
    return g.sum(2), g.reshape(trials, n_replicas * k, d)


def _exact_cosine(h: np.ndarray) -> np.ndarray:
    a, b = h[:, 0::2].sum(1), h[:, 1::2].sum(1)
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def _scalars(h: np.ndarray):
    sq = (h**2).sum(-1)
    return (h.sum(1) ** 2).sum(-1), sq.sum(1), np.sqrt(sq).sum(1)


def test_replica_similarity_is_the_exact_cosine_with_two_replicas() -> None:
    """N = 2: T - Q = 2 h_1.h_2 and R^2 - Q = 2 |h_1| |h_2|, so c = c_1 = cos(h_1, h_2),
    draw by draw, however few directions the noise has."""
    rng = np.random.default_rng(3)
    h, _ = _replica_draws(rng, 2, 3, decay=2.0, trials=500)
    got = S.replica_similarity(*_scalars(h), 2).numpy()
    np.testing.assert_allclose(got, _exact_cosine(h), rtol=1e-9, atol=1e-12)


def test_replica_similarity_reads_a_lower_median_when_the_noise_has_few_directions() -> None:
    """What the SimiGrad controller acts on is the sign of (reading - target), so the
    readings' median matters, and the carry c = N c_1 / ((N - 2) c_1 + 2) leaves the sign
    of c_1 - f^-1(target) as it is: the median moves only if c_1, measured on B/N
    examples, sits differently from exact mode's cosine at B/2. The carry is the first-
    order noise model, exact in high dimension; with the noise in a few directions exact
    mode's cosine has a long tail of low values, its median well above its mean, and
    above the carried value's median (docs/algorithms.md, "What the SimiGrad controller
    sees"). N = 4, k = 2 micro-gradients
    per replica (first-order c = 0.2 / (0.2 + 1/4) = 0.444 at B/2), 4,000 draws:
    effective dimension 5 (decay 1.5): medians 0.5115 against 0.4716 (exact mode's mean
    0.47); 300 equal directions: 0.4445 against 0.4450."""
    rng = np.random.default_rng(5)
    checked = 0
    for decay, gap in ((1.5, (0.02, None)), (0.0, (None, 0.005))):
        h, _ = _replica_draws(rng, 4, 2, decay, trials=4000)
        exact = float(np.median(_exact_cosine(h)))
        estimated = float(np.median(S.replica_similarity(*_scalars(h), 4)))
        print(f"decay {decay}: median exact {exact:.4f}, estimated {estimated:.4f}")
        at_least, at_most = gap
        if at_least is not None:
            assert exact - estimated > at_least
        if at_most is not None:
            assert abs(exact - estimated) < at_most and abs(exact - 0.444) < 0.01
        checked += 1
    assert checked == 2


def test_replica_similarity_halves_the_low_dimension_bias_of_the_moments_formula() -> None:
    """N = 4, k = 4, effective dimension 5 (decay 1.5): E[cos] of the half-batches
    (exact mode's reading, Monte Carlo) is above the moments' first-order value
    |G|^2 / (|G|^2 + 2 tr/B); the replicas' pairwise cosine keeps part of the
    difference. In high dimension (decay 0) all three agree."""
    rng = np.random.default_rng(4)
    n, k, m = 4, 4, 1.0
    checked = 0
    for decay, bias_at_least in ((1.5, 0.015), (0.0, None)):
        h, micro = _replica_draws(rng, n, k, decay, trials=4000)
        exact = _exact_cosine(h).mean()
        mean_sq = (micro**2).sum(-1).mean(-1)
        gbar_sq = (micro.mean(1) ** 2).sum(-1)
        moments = S.step_moments(mean_sq, gbar_sq, float(n * k), m)
        old = S.estimated_similarity(moments.grad_sqr, moments.trace_sigma, n * k * m)
        old = float(np.mean(old))
        new = float(np.mean(S.replica_similarity(*_scalars(h), n)))
        print(f"decay {decay}: exact {exact:.4f}, moments {old:.4f}, replica norms {new:.4f}")
        if bias_at_least is None:
            assert abs(old - exact) < 0.01 and abs(new - exact) < 0.01
        else:
            assert exact - old > bias_at_least  # the moments' bias is there...
            assert abs(new - exact) < 0.5 * abs(old - exact)  # ...and at least halved
        checked += 1
    assert checked == 2
