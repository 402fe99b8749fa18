"""Batch-size policies, driven by scripted statistics (no model involved)."""

from __future__ import annotations

import math

import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.policies import StepStats

NAN = float("nan")


def trajectory(policy, similarities, start: int, unit: int) -> list[int]:
    policy.build(unit)
    batch, out = start, []
    for step, c in enumerate(similarities, start=1):
        batch = int(
            policy.next_batch_size(
                tf.constant(batch, tf.int64), StepStats.make(similarity=c, step=step)
            )
        )
        out.append(batch)
    return out


def test_simigrad_trajectory_derived_by_hand() -> None:
    """unit 32, bounds [32, 320], target 0.5, step 10%; k = batch / 32.

    Each change is max(floor(0.1 k + 0.5), 1) micro-steps:
      k=2 -(0.1)-> 3 -(0.1)-> 4 -(0.1)-> 5   grow by one unit (0.2, 0.3, 0.4 round to 0)
      NaN: stays 5
      k=5 -(0.9)-> 4 -> 3 -> 2 -> 1 -> 1     shrink (0.5 rounds up to 1), held at min k=1
      0.5 = target: stays 1
      k=1 -(0.1)-> 2                          grows back from the minimum: no ratchet
    """
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=64, min_batch_size=32, max_batch_size=320
    )
    cs = [0.1, 0.1, 0.1, NAN, 0.9, 0.9, 0.9, 0.9, 0.9, 0.5, 0.1]
    ks = [b // 32 for b in trajectory(policy, cs, 64, 32)]
    assert ks == [3, 4, 5, 5, 4, 3, 2, 1, 1, 1, 2]


def test_simigrad_ten_percent_steps_and_upper_bound() -> None:
    """From k=40: +4 (10%) per step: 44, 48 (+4.4 -> 4), 53 (+4.8 -> 5), then max k=55."""
    policy = tf_adabatch.SimiGradPolicy(
        0.9, initial_batch_size=40 * 8, min_batch_size=8, max_batch_size=55 * 8
    )
    ks = [b // 8 for b in trajectory(policy, [0.1] * 5, 40 * 8, 8)]
    assert ks == [44, 48, 53, 55, 55]


def test_simigrad_interval_adjusts_every_nth_step() -> None:
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=32, min_batch_size=32, max_batch_size=320, interval=3
    )
    ks = [b // 32 for b in trajectory(policy, [0.1] * 7, 32, 32)]
    assert ks == [1, 1, 2, 2, 2, 3, 3]  # changes at steps 3 and 6


def test_simigrad_smoothing_is_a_debiased_average_that_ignores_nan() -> None:
    """decay 0.5: after 0.9 the average is 0.9 (debiased); after NaN still 0.9; after
    0.0 it is (0.5*0.5*0.9 + 0.5*0.0) / (1 - 0.25) = 0.3."""
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=64, min_batch_size=32, max_batch_size=320, smoothing=0.5
    )
    policy.build(32)
    values = [
        float(policy.smoothed_similarity(tf.constant(c, tf.float64))) for c in (0.9, NAN, 0.0)
    ]
    assert values == pytest.approx([0.9, 0.9, 0.3])


def test_noise_scale_policy() -> None:
    policy = tf_adabatch.NoiseScalePolicy(
        2.0, initial_batch_size=64, min_batch_size=32, max_batch_size=512
    )
    policy.build(32)

    def nxt(noise_scale: float) -> int:
        stats = StepStats.make(noise_scale=noise_scale)
        return int(policy.next_batch_size(tf.constant(64, tf.int64), stats))

    assert [nxt(100.0), nxt(1e9), nxt(math.inf), nxt(NAN), nxt(1.0)] == [200, 512, 512, 64, 32]


def test_schedule_policy_reads_progress() -> None:
    policy = tf_adabatch.SchedulePolicy(
        lambda tau: 64 * tf.cast(1 + tau // 100, tf.int64),
        initial_batch_size=64,
        min_batch_size=64,
        max_batch_size=192,
    )
    policy.build(32)
    got = [
        int(policy.next_batch_size(tf.constant(64, tf.int64), StepStats.make(progress=p)))
        for p in (0.0, 150.0, 250.0, 999.0)
    ]
    assert got == [64, 128, 192, 192]


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            {"target_similarity": 1.3},
            r"Argument `target_similarity` must be in \(0, 1\). Received: target_similarity=1.3",
        ),
        (
            {"min_batch_size": 128, "max_batch_size": 64},
            r"`min_batch_size` must be <= `max_batch_size`. Received: min_batch_size=128, max_batch_size=64",
        ),
        (
            {"initial_batch_size": 16},
            r"`initial_batch_size` must be within \[min_batch_size, max_batch_size\] = \[32, 320\]. Received: initial_batch_size=16",
        ),
        ({"step": 0.0}, r"Argument `step` must be in \(0, 1\]. Received: step=0.0"),
        ({"interval": 0}, r"Argument `interval` must be a positive integer. Received: interval=0"),
        (
            {"smoothing": 1.0},
            r"Argument `smoothing` must be None or in \[0, 1\). Received: smoothing=1.0",
        ),
    ],
)
def test_simigrad_bad_arguments(kwargs, match) -> None:
    args = {
        "target_similarity": 0.5,
        "initial_batch_size": 64,
        "min_batch_size": 32,
        "max_batch_size": 320,
    } | kwargs
    with pytest.raises(ValueError, match=match):
        tf_adabatch.SimiGradPolicy(**args)


def test_bounds_must_be_reachable_with_the_replicas_and_micro_batch() -> None:
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=96, min_batch_size=48, max_batch_size=320
    )
    with pytest.raises(
        ValueError,
        match=r"`min_batch_size` must be a multiple of replicas x micro_batch_size = 32 to be reachable. Received: min_batch_size=48",
    ):
        policy.build(32)


def test_noise_scale_policy_and_progress_budget_bad_arguments() -> None:
    with pytest.raises(
        ValueError, match=r"Argument `factor` must be a finite number > 0. Received: factor=0.0"
    ):
        tf_adabatch.NoiseScalePolicy(
            0.0, initial_batch_size=32, min_batch_size=32, max_batch_size=64
        )
    with pytest.raises(
        ValueError,
        match=r"Argument `base_steps` must be a finite number > 0. Received: base_steps=0",
    ):
        tf_adabatch.ProgressBudget(0)
