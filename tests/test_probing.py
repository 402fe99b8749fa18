"""ProbingGoodputPolicy (tf_adabatch/probing.py): its ladder, the probe cycle and its
decisions against rates worked out by hand from the gains and the timings fed."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.policies import StepStats
from tf_adabatch.probing import ProbingGoodputPolicy, _ladder
from tf_adabatch.throughput import ThroughputModel


def test_ladder_by_hand() -> None:
    # B0 = 20, unit 4: 20, 40, 80, 160, 320, 640; 20 is below the bound 40.
    assert _ladder(40, 640, 20, 4, 2) == [40, 80, 160, 320, 640]
    # B0 = 200 on 16 GPUs: 200 -> 208 (nearest multiple of 16: 200 / 16 = 12.5, half up),
    # below 320; 400, 800, ... are multiples; the bound 320 joins.
    assert _ladder(320, 12800, 200, 16, 2) == [320, 400, 800, 1600, 3200, 6400, 12800]
    # factor 3 from 10 with unit 8: 10 -> 8, 30 -> 32, 90 -> 88, 270 -> 272; bounds 8, 300.
    assert _ladder(8, 300, 10, 8, 3) == [8, 32, 88, 272, 300]


class _Run:
    """Drives the policy as the engine does: decide, then the host times the step."""

    def __init__(self, policy: ProbingGoodputPolicy, gain, seconds) -> None:  # type: ignore[no-untyped-def]
        self.policy, self.gain, self.seconds, self.step = policy, gain, seconds, 0

    def __call__(self, batch: int) -> int:
        self.step += 1
        stats = StepStats.make(gain=self.gain(batch), step=self.step)
        new = int(self.policy.next_batch_size(tf.constant(batch, tf.int64), stats))
        self.policy.throughput.observe(batch // self.policy.batch_unit, self.seconds(batch))
        return new


def _policy(**kw) -> ProbingGoodputPolicy:  # type: ignore[no-untyped-def]
    args = dict(initial_batch_size=8, min_batch_size=8, max_batch_size=64, interval=3)
    args.update(kw)
    policy = ProbingGoodputPolicy(ThroughputModel(), **args)
    policy.build(batch_unit=8)
    return policy


def test_climbs_then_loses_and_backs_off_by_hand() -> None:
    # Ladder 8, 16, 32, 64 (B0 = 8). Gain r(B) = min(B / 8, 2) (the noise runs out at
    # 16); a step costs 1 + B / 16 s: rates r / T: 8: 1 / 1.5 = 0.667, 16: 2 / 2 = 1,
    # 32: 2 / 3 = 0.667, 64: 2 / 5 = 0.4.
    policy = _policy()
    run = _Run(policy, lambda b: min(b / 8, 2.0), lambda b: 1.0 + b / 16)
    # Step 1 at 8: the first probe is due at once: 16. Step 2 at 16: back home. Step 3 at
    # 8: 1 > 1.05 x 0.667: move to 16, stride 2, probe on at once.
    assert [run(8), run(16), run(8)] == [16, 8, 16]
    # Step 4 at 16: probe two rungs up: 64. Step 5: back to 16. Step 6: 0.4 < 1.05 x 1:
    # stay; direction down, stride 1, the next probe waits 3 x 2 steps.
    assert [run(16), run(64), run(16)] == [64, 16, 16]
    assert int(policy.direction) == -1 and int(policy.backoff) == 2
    # Steps 7-11 wait (11 - 6 = 5 < 6); step 12 probes one rung down: 8 (rate 0.667):
    # lost again, direction up, the wait doubles to 12.
    assert [run(16) for _ in range(5)] == [16] * 5
    assert [run(16), run(8), run(16)] == [8, 16, 16]
    assert int(policy.direction) == 1 and int(policy.backoff) == 4
    # Up one rung from 16: 32 (0.667) is not better either; the wait is 3 x 8 after it.
    for _ in range(11):
        assert run(16) == 16
    assert [run(16), run(32), run(16)] == [32, 16, 16]
    assert int(policy.backoff) == 8


def test_a_probe_at_the_top_goes_down_and_median_timings() -> None:
    # Start at the top 64: the probe goes one rung down (32).
    policy = _policy(initial_batch_size=64, base_batch_size=8)
    run = _Run(policy, lambda b: b / 8, lambda b: 1.0)
    assert run(64) == 32
    assert run(32) == 64  # back home from the probe (its timing at k = 4: 1.0)
    # Timings at k = 8 (B = 64): 1.0, then three more: 3, 2, 5 -> median of (1, 3, 2, 5)
    # = 2.5; k = 4 has one (1.0); k = 2 none: NaN.
    for seconds in (3.0, 2.0, 5.0):
        policy.throughput.observe(8, seconds)
    assert float(policy.median_seconds(8)) == 2.5
    assert float(policy.median_seconds(4)) == 1.0
    assert math.isnan(float(policy.median_seconds(2)))
    # The decision: rate(32) = 4 / 1 = 4 against rate(64) = 8 / 2.5 = 3.2, x 1.05 = 3.36:
    # 32 wins, the policy moves down.
    assert run(64) == 32


def test_a_probe_within_the_hysteresis_does_not_move() -> None:
    # Gain B / 8; T(8) = 1 s, T(16) = 2 / 1.03 s: rate(16) = 1.03 against rate(8) = 1,
    # below 1.05 x 1: stay at 8 (with hysteresis 0.02 it moves).
    for hysteresis, moved in ((0.05, 8), (0.02, 16)):
        policy = _policy(hysteresis=hysteresis)
        run = _Run(policy, lambda b: b / 8, lambda b: 1.0 if b == 8 else 2 / 1.03)
        assert [run(8), run(16), run(8)] == [16, 8, moved]


def test_non_finite_gain_neither_starts_nor_keeps_a_probe() -> None:
    policy = _policy()
    run = _Run(policy, lambda b: math.nan, lambda b: 1.0)
    assert run(8) == 8 and int(policy.phase) == 0
    # A probe started with a finite gain whose probe step measures NaN: home, no decision.
    gains = iter([1.0, math.nan])
    run = _Run(policy, lambda b: next(gains), lambda b: 1.0)
    assert [run(8), run(16)] == [16, 8]
    assert int(policy.phase) == 0 and int(policy.direction) == 1


def test_graph_safe_and_exported() -> None:
    policy = _policy()
    assert tf_adabatch.ProbingGoodputPolicy is ProbingGoodputPolicy
    step = tf.function(policy.next_batch_size, autograph=False)
    stats = StepStats.make(gain=1.0, step=1)
    assert int(step(tf.constant(8, tf.int64), stats)) == 16
    assert np.isnan(float(policy.median_seconds(1)))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(interval=0), r"Argument `interval` must be a positive integer. Received: interval=0"),
        (dict(factor=1), r"Argument `factor` must be an integer >= 2. Received: factor=1"),
        (dict(hysteresis=-0.1), r"Argument `hysteresis`.*Received: hysteresis=-0.1"),
    ],
)
def test_bad_arguments_are_named(kw, message) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        ProbingGoodputPolicy(initial_batch_size=8, min_batch_size=8, max_batch_size=64, **kw)
