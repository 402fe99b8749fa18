"""Every option of the learning-rate rule survives the round trips a user takes (hypothesis).

`AdaptiveLearningRate(base, rule, gain_power, warmup_steps)` with drawn options and base
schedules: through `get_config` / `from_config`, through Keras serialization (what
`model.save` writes), and through `model.save` + `tf_adabatch.load_model` of an attached
model. Each trip must give back the same configuration and the same behaviour: the same
multiplier `factor(gain, scale, progress)` at drawn points, and the same base schedule.
The multiplier is also checked against the rule's formula, written here from its
docstring (so a round trip that kept a wrong value would not pass as "equal"):

    adascale: r^p          sqrt: sqrt(S)          none: 1
    linear:   S, or with warm-up w: 1 + (S - 1) min(tau / w, 1)
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tf_adabatch
from tf_adabatch import AdaptiveLearningRate, _keras_seams

POINTS = [(1.0, 1.0, 0.0), (1.7, 4.0, 3.0), (3.5, 8.0, 40.0), (6.0, 16.0, 500.0)]


def expected_factor(rule: str, gain_power: float, warmup: int, gain, scale, tau) -> float:
    if rule == "adascale":
        return gain**gain_power
    if rule == "sqrt":
        return math.sqrt(scale)
    if rule == "linear":
        return scale if not warmup else 1.0 + (scale - 1.0) * min(tau / warmup, 1.0)
    return 1.0


@st.composite
def rules(draw) -> AdaptiveLearningRate:
    base = draw(
        st.one_of(
            st.floats(1e-4, 1.0),
            st.builds(
                lambda lr, steps, alpha: keras.optimizers.schedules.CosineDecay(
                    lr, steps, alpha=alpha
                ),
                st.floats(1e-3, 1.0),
                st.integers(10, 5000),
                st.floats(0.0, 0.5),
            ),
            st.builds(
                lambda first, factor: keras.optimizers.schedules.PiecewiseConstantDecay(
                    [100, 300], [first, first / factor, first / factor**2]
                ),
                st.floats(1e-3, 1.0),
                st.floats(1.5, 10.0),
            ),
        )
    )
    rule = draw(st.sampled_from(tf_adabatch.LR_RULES))
    gain_power = draw(st.floats(0.05, 1.0)) if rule == "adascale" else 1.0
    warmup = draw(st.integers(0, 200)) if rule == "linear" else 0
    return AdaptiveLearningRate(base, rule, gain_power=gain_power, warmup_steps=warmup)


def assert_same(got: AdaptiveLearningRate, want: AdaptiveLearningRate) -> int:
    """Same config, same factors (and the formula's), same base schedule; the points checked."""
    assert got is not want and isinstance(got, AdaptiveLearningRate)
    assert got.get_config() == want.get_config()
    checked = 0
    for point in POINTS:
        gain, scale, tau = (tf.constant(v, tf.float64) for v in point)  # as the engine passes them
        factor = float(got.factor(gain, scale, tau))
        assert factor == float(want.factor(gain, scale, tau))
        gain, scale, tau = point
        formula = expected_factor(want.rule, want.gain_power, want.warmup_steps, gain, scale, tau)
        np.testing.assert_allclose(factor, formula, rtol=1e-12)
        for step in (0, 150, 400):
            assert float(got.base_learning_rate(step)) == float(want.base_learning_rate(step))
        checked += 1
    return checked


SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_config_and_keras_serialization_keep_every_option() -> None:
    seen = {"points": 0, "rules": set()}

    @SETTINGS
    @given(rule=rules())
    def trip(rule: AdaptiveLearningRate) -> None:
        seen["points"] += assert_same(AdaptiveLearningRate.from_config(rule.get_config()), rule)
        again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(rule))
        seen["points"] += assert_same(again, rule)
        seen["rules"].add(rule.rule)

    trip()
    assert seen["points"] >= 25 * 2 * len(POINTS)
    assert seen["rules"] == set(tf_adabatch.LR_RULES)  # every rule was drawn


def test_model_save_and_load_model_keep_every_option(tmp_path) -> None:
    """The rule of an attached model's optimizer, saved with `model.save` and loaded
    with `tf_adabatch.load_model`."""
    seen = {"points": 0, "files": 0}

    @settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(rule=rules())
    def trip(rule: AdaptiveLearningRate) -> None:
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(rule), loss="mse")
        tf_adabatch.attach(model, micro_batch_size=4)
        path = str(tmp_path / f"model{seen['files']}.keras")
        seen["files"] += 1
        model.save(path)
        loaded, _ = tf_adabatch.load_model(path, micro_batch_size=4)
        schedule = _keras_seams.learning_rate_schedule(loaded.optimizer)
        seen["points"] += assert_same(schedule, rule)

    trip()
    assert seen["files"] >= 8 and seen["points"] >= 8 * len(POINTS)
