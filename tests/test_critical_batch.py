"""The 2024-2026 batch policies against values derived by hand from their rules.

Critical-batch warm-up (factor f, margin a): B -> f B when B_crit >= a f B and f B <= max.
Seesaw (points p_1 < p_2 < ..., factor f): B(tau) = B_init f^#{p_i < tau}, capped at the
largest B_init f^n <= max; with rule "sqrt" and a base schedule falling by f at the same
points, the rate falls by sqrt(f) at each.
Norm test (theta): B -> max(B, the smallest multiple of the unit >= tr(Sigma) / (theta^2 |g|^2)),
within [min, max].
"""

from __future__ import annotations

import math
import re

import keras
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.critical_batch import CriticalBatchWarmupPolicy, NormTestPolicy, SeesawPolicy
from tf_adabatch.policies import StepStats


def decide(policy, batch: int, **stats: float) -> int:
    return int(policy.next_batch_size(tf.constant(batch, tf.int64), StepStats.make(**stats)))


def warmup(**kwargs) -> CriticalBatchWarmupPolicy:
    policy = CriticalBatchWarmupPolicy(
        **{"initial_batch_size": 32, "min_batch_size": 32, "max_batch_size": 512, **kwargs}
    )
    policy.build(batch_unit=16)
    return policy


def test_warmup_doubles_exactly_when_the_critical_batch_allows_the_doubled_batch() -> None:
    policy = warmup()
    # From 32 the doubled batch is 64: grows iff B_crit >= 64.
    assert decide(policy, 32, noise_scale=63.9) == 32
    assert decide(policy, 32, noise_scale=64.0) == 64
    # One factor per step, even when B_crit would allow 4x.
    assert decide(policy, 32, noise_scale=1e6) == 64
    # Never shrinks: a critical batch below the current batch keeps it.
    assert decide(policy, 256, noise_scale=10.0) == 256
    # Never past the maximum, and only by whole factors: 256 -> 512 allowed, 512 stays.
    assert decide(policy, 256, noise_scale=1e6) == 512
    assert decide(policy, 512, noise_scale=1e6) == 512
    # No signal (inf: |G|^2 = 0; NaN): the batch stays.
    assert decide(policy, 32, noise_scale=math.inf) == 32
    assert decide(policy, 32, noise_scale=math.nan) == 32


def test_warmup_margin_and_factor() -> None:
    # margin 2, factor 3: from 48, 144 needs B_crit >= 288.
    policy = warmup(
        margin=2.0, factor=3, initial_batch_size=48, min_batch_size=48, max_batch_size=432
    )
    assert decide(policy, 48, noise_scale=287.0) == 48
    assert decide(policy, 48, noise_scale=288.0) == 144
    assert decide(policy, 144, noise_scale=1e9) == 432  # 3 x 144 = 432 <= max
    with pytest.raises(ValueError, match=r"`factor` must be an integer >= 2. Received: factor=1"):
        warmup(factor=1)
    with pytest.raises(ValueError, match=r"`margin` must be a finite number > 0"):
        warmup(margin=0.0)


def test_seesaw_doubles_at_each_decay_point_and_stops_at_the_cap() -> None:
    policy = SeesawPolicy([100.0, 200.0, 300.0], initial_batch_size=64, max_batch_size=256)
    policy.build(batch_unit=32)
    # 64 up to 100 (a point belongs to the interval before it, as Keras's boundaries);
    # 128 past 100; 256 past 200; past 300, 512 > 256: capped at 256.
    expected = {0.0: 64, 100.0: 64, 100.5: 128, 200.0: 128, 200.5: 256, 300.5: 256, 1e6: 256}
    for tau, batch in expected.items():
        assert decide(policy, 64, progress=tau) == batch, tau
    assert decide(policy, 256, progress=0.0) == 256  # never shrinks (a restored run)
    for bad in ([], [100.0, 100.0], [200.0, 100.0], [0.0], "100"):
        with pytest.raises(ValueError, match=r"`decay_points` must be a non-empty, increasing"):
            SeesawPolicy(bad, initial_batch_size=64, max_batch_size=256)


def test_seesaw_with_the_sqrt_rule_decays_the_rate_by_one_over_sqrt_two() -> None:
    """The base schedule halves at tau = 100 and 200 (0.1, 0.05, 0.025); the batch doubles
    there (64, 128, 256 with B0 = 64); under rule "sqrt" the rate is base x sqrt(B / B0):
    0.1, 0.05 sqrt(2) = 0.1 / sqrt(2), 0.025 x 2 = 0.1 / 2."""
    base = keras.optimizers.schedules.PiecewiseConstantDecay([100, 200], [0.1, 0.05, 0.025])
    rule = tf_adabatch.AdaptiveLearningRate(base, "sqrt")
    policy = SeesawPolicy([100.0, 200.0], initial_batch_size=64, max_batch_size=1024)
    policy.build(batch_unit=64)
    rates = []
    for tau in (50.0, 150.0, 250.0):
        batch = decide(policy, 64, progress=tau)  # 64, 128, 256
        factor = float(rule.factor(1.0, batch / 64.0, tau))
        rates.append(float(rule.base_learning_rate(tf.constant(tau))) * factor)
    assert rates == pytest.approx([0.1, 0.1 / math.sqrt(2.0), 0.1 / 2.0], rel=1e-6)


def norm_test(theta: float = 1.0) -> NormTestPolicy:
    policy = NormTestPolicy(theta, initial_batch_size=32, min_batch_size=32, max_batch_size=512)
    policy.build(batch_unit=32)
    return policy


def test_norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks() -> None:
    # tr(Sigma) = 100, |g|^2 = 1, theta = 1: B >= 100 -> 128 (the next multiple of 32).
    assert decide(norm_test(), 32, grad_sqr=1.0, trace_sigma=100.0) == 128
    # Exactly a multiple passes as is: 96 / 1 = 96.
    assert decide(norm_test(), 32, grad_sqr=1.0, trace_sigma=96.0) == 96
    # theta = 0.5: B >= 100 / 0.25 = 400 -> 416.
    assert decide(norm_test(0.5), 32, grad_sqr=1.0, trace_sigma=100.0) == 416
    # Passing already: the batch stays (no shrinking) - 256 >= 100.
    assert decide(norm_test(), 256, grad_sqr=1.0, trace_sigma=100.0) == 256
    # Asks for more than the maximum: the maximum.
    assert decide(norm_test(), 32, grad_sqr=1.0, trace_sigma=1e6) == 512
    # Cannot be evaluated (|g|^2 = 0, NaN): the batch stays.
    assert decide(norm_test(), 64, grad_sqr=0.0, trace_sigma=100.0) == 64
    assert decide(norm_test(), 64, grad_sqr=math.nan, trace_sigma=100.0) == 64
    with pytest.raises(ValueError, match=r"`theta` must be a finite number > 0"):
        norm_test(0.0)


@pytest.mark.parametrize("kind", ["critical_warmup", "norm_test", "seesaw"])
def test_the_config_kinds_build_and_train_a_few_steps(kind: str, tmp_path) -> None:
    from configs import synthetic
    from tf_adabatch.app import run

    config = synthetic.get_config()
    config.strategy, config.train.max_steps = "one_device", 4
    config.policy.kind = kind
    if kind == "seesaw":
        config.lr.schedule, config.lr.rule = "step", "sqrt"
    metrics = run(config, str(tmp_path), verbose=0)
    assert metrics["optimizer_steps"] == 4


def test_the_step_schedule_and_seesaw_from_a_config_decay_at_the_same_points() -> None:
    """Budget 1000 base steps, lr.decay_fractions (0.5, 0.75), factor 0.5, rate 0.1:
    the base rate is 0.1 up to tau = 500, 0.05 up to 750, then 0.025 (Keras's
    boundaries); Seesaw doubles the batch past the same points; with rule sqrt the rate
    is 0.1, 0.1 / sqrt(2), 0.1 / 2: never a step where only one of them moved."""
    from configs import base
    from tf_adabatch.app import factories, validate_config

    config = base.get_config()
    config.policy.kind, config.lr.schedule, config.lr.rule = "seesaw", "step", "sqrt"
    config.policy.initial_batch_size, config.policy.max_batch_size = 128, 1024
    config.base_batch_size, config.optimizer.learning_rate = 128, 0.1
    validate_config(config)
    schedule = factories.make_schedule(config, base_steps=1000)
    policy = factories.make_policy(config, base_steps=1000)
    policy.build(batch_unit=128)
    assert policy.decay_points == [500.0, 750.0]
    rates, batches = [], []
    for tau in (0.0, 500.0, 501.0, 750.0, 751.0, 999.0):
        batch = decide(policy, 128, progress=tau)
        factor = float(schedule.factor(1.0, batch / 128.0, tau))
        rates.append(float(schedule.base_learning_rate(tf.constant(tau))) * factor)
        batches.append(batch)
    assert batches == [128, 128, 256, 256, 512, 512]
    r, half = 0.1, 0.1 / math.sqrt(2.0)
    assert rates == pytest.approx([r, r, half, half, r / 2.0, r / 2.0], rel=1e-6)


@pytest.mark.parametrize(
    "field,value,rule",
    [
        ("lr.decay_fractions", (0.75, 0.5), "increasing sequence of fractions"),
        ("lr.decay_fractions", (), "increasing sequence of fractions"),
        ("lr.decay_fractions", (0.5, 1.5), "increasing sequence of fractions"),
        ("lr.decay_factor", 1.0, "in (0, 1)"),
    ],
)
def test_step_schedule_fields_are_checked(field: str, value, rule: str) -> None:
    from configs import base
    from tf_adabatch.app import ConfigError, validate_config

    config = base.get_config()
    config.lr.schedule = "step"
    section, name = field.split(".")
    config[section][name] = value
    with pytest.raises(ConfigError, match=rf"`{field}` must .*{re.escape(rule)}"):
        validate_config(config)
