"""Every policy's promises, for drawn bounds, units, options and skip patterns (hypothesis).

Each promise is written once and checked through the engine's own bookkeeping
(`StepBookkeeping.advance`, the code that turns a policy's proposal into the next k), on
bounds that are not whole factors of each other and units from 1 to 8 examples:

- the batch stays a multiple of the unit within [min_batch_size, max_batch_size];
- a skipped step moves nothing: the batch, progress and every variable of the policy are
  as before it;
- no policy moves further than its own rule allows (written below from each policy's
  docstring, not from its code): SimiGrad by at most max(1, round(step x k)) units and
  only every `interval` applied steps, in the direction the similarity asks; the
  critical-batch warm-up only by its whole factor and only where the noise scale
  allows the grown batch; the norm test to the smallest multiple that passes it, never
  shrinking; Seesaw only to initial x factor^n, never shrinking; the noise-scale
  policy to factor x noise scale, clipped, within half a unit.
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tf_adabatch import (
    AdaptiveEngine,
    CriticalBatchWarmupPolicy,
    NoiseScalePolicy,
    NormTestPolicy,
    SeesawPolicy,
    SimiGradPolicy,
)
from tf_adabatch.step_statistics import Noise

F64 = tf.float64
# How many (policy, step) pairs each test checked: a filter that dropped everything
# would otherwise pass unseen.
CHECKED: dict[str, int] = {}


@st.composite
def bounds(draw, *, grow_only: bool = False) -> tuple[int, int, int, int]:
    """(unit, min, initial, max): multiples of the unit, max not a whole factor of min."""
    unit = draw(st.integers(1, 8))
    low = draw(st.integers(1, 6))
    if grow_only:  # room for a few whole factors: max = min x (1..12) + up to 3 units
        high = low * draw(st.integers(1, 12)) + draw(st.integers(0, 3))
    else:
        high = draw(st.integers(low, low + 20))
    start = low if grow_only else draw(st.integers(low, high))
    return unit, low * unit, start * unit, high * unit


@st.composite
def steps(draw, count: int = 8) -> list[tuple[bool, float, float, float]]:
    """(finite, similarity, noise ratio, grad_sqr) per step: skips, NaN and inf included.

    The noise scale is drawn as a ratio to the batch the step runs (0 to 8 times it):
    every rule above decides by comparing the two, so the draws land on both sides.
    """
    out = []
    for _ in range(count):
        finite = draw(st.booleans() | st.just(True))  # about two thirds applied
        similarity = draw(st.floats(0.0, 1.0) | st.just(math.nan))
        ratio = draw(st.floats(0.0, 8.0) | st.sampled_from([math.inf, math.nan]))
        grad_sqr = draw(st.floats(1e-3, 10.0))
        out.append((finite, similarity, ratio, grad_sqr))
    return out


def engine_for(policy, unit: int) -> AdaptiveEngine:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    return AdaptiveEngine(
        model,
        loss="mse",
        optimizer=keras.optimizers.SGD(0.1),
        micro_batch_size=unit,
        policy=policy,
        similarity="estimated",  # one replica: k >= 1 allowed
    )


def replay(policy, unit: int, draws, rule) -> int:
    """Runs the drawn steps through the engine's bookkeeping; checks every invariant and
    `rule(before, after, applied_steps, similarity, noise_scale, grad_sqr)` on applied
    steps. Returns how many steps were checked."""
    engine = engine_for(policy, unit)
    state, books = engine.state, engine._books
    checked = 0
    for finite, similarity, ratio, grad_sqr in draws:
        k = int(state.accumulation_steps.numpy())
        before = k * unit
        noise_scale = ratio * before
        progress = float(state.progress.numpy())
        variables = [v.numpy().copy() for v in policy.variables]
        trace = noise_scale * grad_sqr
        noise = Noise(
            gain=tf.constant(1.5, F64),
            similarity=tf.constant(similarity, F64),
            grad_sqr=tf.constant(grad_sqr, F64),
            trace_sigma=tf.constant(trace, F64),
            noise_scale=tf.constant(noise_scale, F64),
        )
        books.advance(tf.constant(finite), tf.constant(float(k), F64), noise)
        after = int(state.accumulation_steps.numpy()) * unit
        assert after % unit == 0 and policy.min_batch_size <= after <= policy.max_batch_size
        if not finite:
            assert after == before
            assert float(state.progress.numpy()) == progress
            for old, variable in zip(variables, policy.variables, strict=True):
                np.testing.assert_array_equal(old, variable.numpy())
        else:
            applied = int(state.steps.numpy())
            rule(before, after, applied, similarity, noise_scale, grad_sqr)
        checked += 1
    return checked


SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(
    b=bounds(),
    draws=steps(),
    target=st.floats(0.05, 0.95),
    step=st.floats(0.01, 1.0),
    interval=st.integers(1, 3),
    smoothing=st.none() | st.floats(0.0, 0.9),
)
def _simigrad_moves_at_most_its_step_every_interval(
    b, draws, target, step, interval, smoothing
) -> None:
    unit, low, start, high = b
    policy = SimiGradPolicy(
        target,
        initial_batch_size=start,
        min_batch_size=low,
        max_batch_size=high,
        step=step,
        interval=interval,
        smoothing=smoothing,
    )

    def rule(before, after, applied, similarity, noise_scale, grad_sqr) -> None:
        k = before // unit
        allowed = max(1, math.floor(step * k + 0.5)) * unit
        assert abs(after - before) <= allowed
        if applied % interval:
            assert after == before
        if smoothing is None:  # the step's own similarity decides the direction
            if math.isnan(similarity) or similarity == target:
                assert after == before
            elif similarity < target:
                assert after >= before
            else:
                assert after <= before

    CHECKED["simigrad"] = CHECKED.get("simigrad", 0) + replay(policy, unit, draws, rule)


@SETTINGS
@given(
    b=bounds(grow_only=True), draws=steps(), margin=st.floats(0.5, 4.0), factor=st.integers(2, 4)
)
# One case drawn by hand into the window that matters: a noise scale of 1.5 B allows B
# (margin 1) but not the doubled 2 B, so the batch must stay.
@example(b=(4, 8, 8, 100), draws=[(True, 0.5, 1.5, 1.0)] * 3, margin=1.0, factor=2)
def _critical_warmup_grows_by_its_factor_where_the_noise_scale_allows(
    b, draws, margin, factor
) -> None:
    unit, low, start, high = b
    policy = CriticalBatchWarmupPolicy(
        margin, factor, initial_batch_size=start, min_batch_size=low, max_batch_size=high
    )

    def rule(before, after, applied, similarity, noise_scale, grad_sqr) -> None:
        grows = (
            math.isfinite(noise_scale)
            and noise_scale >= margin * factor * before
            and factor * before <= high
        )
        assert after == (factor * before if grows else before)

    CHECKED["critical_warmup"] = CHECKED.get("critical_warmup", 0) + replay(
        policy, unit, draws, rule
    )


@SETTINGS
@given(b=bounds(), draws=steps(), theta=st.floats(0.2, 3.0))
def _norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks(b, draws, theta) -> None:
    unit, low, start, high = b
    policy = NormTestPolicy(
        theta, initial_batch_size=start, min_batch_size=low, max_batch_size=high
    )

    def rule(before, after, applied, similarity, noise_scale, grad_sqr) -> None:
        assert after >= before
        if not math.isfinite(noise_scale):
            assert after == before
            return
        wanted = noise_scale / theta**2  # B >= tr(Sigma) / (theta^2 |g|^2)
        if after > before and after < high:
            # The smallest multiple of the unit that passes (up to float rounding).
            assert after >= wanted * (1 - 1e-9) and after - unit < wanted * (1 + 1e-9)
        if wanted <= before:
            assert after == before

    CHECKED["norm_test"] = CHECKED.get("norm_test", 0) + replay(policy, unit, draws, rule)


@SETTINGS
@given(b=bounds(), draws=steps(), factor=st.floats(0.25, 4.0))
def _noise_scale_policy_follows_factor_times_the_noise_scale(b, draws, factor) -> None:
    unit, low, start, high = b
    policy = NoiseScalePolicy(
        factor, initial_batch_size=start, min_batch_size=low, max_batch_size=high
    )

    def rule(before, after, applied, similarity, noise_scale, grad_sqr) -> None:
        if math.isnan(noise_scale):
            assert after == before
            return
        wanted = min(max(factor * noise_scale, low), high)
        # Rounded to whole examples by the policy, to whole units by the engine.
        assert abs(after - wanted) <= unit / 2 + 0.5

    CHECKED["noise_scale"] = CHECKED.get("noise_scale", 0) + replay(policy, unit, draws, rule)


@SETTINGS
@given(
    b=bounds(grow_only=True),
    draws=steps(),
    factor=st.integers(2, 3),
    gaps=st.lists(st.floats(0.5, 4.0), min_size=1, max_size=4),
)
def _seesaw_only_reaches_initial_times_powers_of_its_factor(b, draws, factor, gaps) -> None:
    unit, _, start, high = b
    points = list(np.cumsum(gaps))  # progress grows by the gain (1.5) per applied step
    policy = SeesawPolicy(points, factor, initial_batch_size=start, max_batch_size=high)
    reachable = [start * factor**n for n in range(12) if start * factor**n <= high]

    def rule(before, after, applied, similarity, noise_scale, grad_sqr) -> None:
        assert after >= before and after in reachable
        passed = sum(p < 1.5 * applied for p in points)  # tau = 1.5 per applied step
        assert after == max(before, reachable[min(passed, len(reachable) - 1)])

    CHECKED["seesaw"] = CHECKED.get("seesaw", 0) + replay(policy, unit, draws, rule)


def counted(prop, name: str) -> None:
    """Runs a property over its drawn cases and checks that it checked them: at least
    `max_examples` (30) cases of eight steps (a filter dropping everything would fail)."""
    before = CHECKED.get(name, 0)
    prop()
    assert CHECKED[name] - before >= 30 * 8


def test_simigrad_moves_at_most_its_step_every_interval() -> None:
    counted(_simigrad_moves_at_most_its_step_every_interval, "simigrad")


def test_critical_warmup_grows_by_its_factor_where_the_noise_scale_allows() -> None:
    counted(_critical_warmup_grows_by_its_factor_where_the_noise_scale_allows, "critical_warmup")


def test_norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks() -> None:
    counted(_norm_test_grows_to_the_smallest_passing_multiple_and_never_shrinks, "norm_test")


def test_noise_scale_policy_follows_factor_times_the_noise_scale() -> None:
    counted(_noise_scale_policy_follows_factor_times_the_noise_scale, "noise_scale")


def test_seesaw_only_reaches_initial_times_powers_of_its_factor() -> None:
    counted(_seesaw_only_reaches_initial_times_powers_of_its_factor, "seesaw")
