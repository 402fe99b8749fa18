"""The throughput model recovers alpha and beta; the goodput policy picks the argmax.

Expected values are derived here from the formulas (no run of the engine involved):
step time T(k) = alpha + beta k, gain r(B) = (sigma^2 + mu^2) / (sigma^2 B0 / B + mu^2)
with sigma^2 = tr(Sigma) / B0, mu^2 = |G|^2, and the rate r(B) / T(B).
"""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.policies import GoodputPolicy, StepStats
from tf_adabatch.throughput import ThroughputModel, fit_line, fit_line_graph

UNIT = 32


def timings(alpha: float, beta: float, ks: list[int], per_k: int, seed: int = 0):
    """Step times with 3% multiplicative noise and one outlier in ten (x3 to x20 slower)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(per_k):
        for k in ks:
            t = (alpha + beta * k) * (1 + 0.03 * rng.standard_normal())
            if rng.random() < 0.1:
                t *= rng.uniform(3, 20)
            out.append((k, t))
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("alpha,beta", [(0.004, 0.012), (0.05, 0.002), (0.02, 0.02)])
def test_throughput_model_recovers_alpha_and_beta_within_5_percent_despite_outliers(
    alpha: float, beta: float
) -> None:
    model = ThroughputModel(window=400)
    observed = timings(alpha, beta, [1, 2, 3, 4, 6, 8], per_k=30)
    outliers = sum(t > 2 * (alpha + beta * k) for k, t in observed)
    assert outliers >= 10  # the outliers are really there
    for k, t in observed:
        model.observe(k, t)
    assert int(model.ready) == 1
    assert float(model.alpha) == pytest.approx(alpha, rel=0.05)
    assert float(model.beta) == pytest.approx(beta, rel=0.05)
    # A plain least-squares fit through all timings is thrown off by the outliers,
    # so the medians are what make the fit robust.
    ks, ts = np.array(observed, dtype=float).T
    naive_beta, naive_alpha = np.polyfit(ks, ts, 1)
    assert abs(naive_alpha - alpha) > 0.05 * alpha or abs(naive_beta - beta) > 0.05 * beta


def test_throughput_model_is_not_ready_with_one_value_of_k_and_forgets_old_timings() -> None:
    model = ThroughputModel(window=6, min_timings_per_k=2)
    for _ in range(5):
        model.observe(2, 0.5)
    assert int(model.ready) == 0
    model.observe(3, 0.6)
    assert int(model.ready) == 0  # one timing of k = 3 is not enough
    model.observe(3, 0.6)
    assert int(model.ready) == 1
    assert float(model.alpha) == pytest.approx(0.3) and float(model.beta) == pytest.approx(0.1)
    # The window keeps the latest 6: after 6 new timings at other costs, the old are gone.
    for k in (1, 2, 1, 2, 1, 2):
        model.observe(k, 1.0 + k)
    assert float(model.alpha) == pytest.approx(1.0) and float(model.beta) == pytest.approx(1.0)
    model.observe(2, float("nan"))  # ignored
    assert int(model.count) == 13


@pytest.mark.parametrize("min_per_k", [1, 3, 7])
def test_the_graph_fit_is_numpys_fit(min_per_k: int) -> None:
    """`observe` fits in the graph (`fit_line_graph`); `fit_line` (numpy's median and
    weighted mean) is the reference: random windows with repeated times (ties), even
    and odd counts per k, values of k below `min_per_k`, and windows with one k only."""
    rng = np.random.default_rng(min_per_k)
    checked = not_ok = 0
    for trial in range(40):
        n = int(rng.integers(1, 60))
        ks = rng.choice([1.0, 2.0, 3.0, 5.0, 8.0][: 1 + trial % 5], size=n)
        ts = np.round(0.01 + 0.002 * ks + 0.004 * rng.random(n), 3)  # rounded: ties
        alpha, beta, ok = fit_line(ks, ts, min_per_k)
        got = fit_line_graph(tf.constant(ks), tf.constant(ts), min_per_k)
        assert bool(got[2]) == ok, (ks, ts)
        np.testing.assert_allclose(
            [float(got[0]), float(got[1])], [alpha, beta], rtol=1e-9, atol=1e-12
        )
        checked += 1
        not_ok += not ok
    assert checked == 40 and 0 < not_ok < 40  # both outcomes were compared


def test_observe_adds_nothing_to_a_checkpoint_and_resumes_the_same_fit(tmp_path) -> None:
    """Its compiled function is not state: the checkpoint holds the six variables only,
    and a model restored from it continues the window and the fit exactly."""
    model = ThroughputModel(window=8, min_timings_per_k=1)
    model.build()
    before = {
        name
        for name, _ in tf.train.list_variables(
            tf.train.Checkpoint(m=model).write(str(tmp_path / "before"))
        )
    }
    for k, t in [(1, 0.3), (2, 0.5), (1, 0.31), (3, 0.7)]:
        model.observe(k, t)
    path = tf.train.Checkpoint(m=model).write(str(tmp_path / "after"))
    assert {name for name, _ in tf.train.list_variables(path)} == before
    assert len(before) == 7  # six variables and the checkpoint's object graph
    other = ThroughputModel(window=8, min_timings_per_k=1)
    other.build()
    tf.train.Checkpoint(m=other).read(path).assert_consumed()
    for m in (model, other):
        m.observe(2, 0.52)
    for name in ("timings_k", "timings_s", "count", "alpha", "beta", "ready"):
        np.testing.assert_array_equal(getattr(other, name).numpy(), getattr(model, name).numpy())


def test_fit_line_refuses_bad_arguments() -> None:
    with pytest.raises(ValueError, match="`window` must be a positive integer"):
        ThroughputModel(window=0)
    assert fit_line(np.array([1.0, 1.0]), np.array([1.0, 2.0])) == (0.0, 0.0, False)


def policy_with(alpha: float, beta: float, **kwargs) -> GoodputPolicy:
    model = ThroughputModel(min_timings_per_k=1)
    model.observe(1, alpha + beta)
    model.observe(2, alpha + 2 * beta)
    kwargs.setdefault("initial_batch_size", 64)
    kwargs.setdefault("min_batch_size", 32)
    kwargs.setdefault("max_batch_size", 512)
    policy = GoodputPolicy(model, **kwargs)
    policy.build(batch_unit=UNIT)
    return policy


def expected_best(alpha, beta, grad_sqr, trace, b0, lo, hi, current, hysteresis=0.05):
    """The argmax of r(B) / T(B) over multiples of UNIT in [lo, hi], by hand."""

    def rate(b):
        s2, m2 = trace / b0, grad_sqr
        # The gain lies between 1 and S = B / B0 (below B0 too: then in [S, 1]).
        r = min(max((s2 + m2) / (s2 * b0 / b + m2), min(b / b0, 1.0)), max(b / b0, 1.0))
        return r / (alpha + beta * b / UNIT)

    candidates = list(range(lo, hi + 1, UNIT))
    best = max(candidates, key=rate)
    return best if rate(best) > (1 + hysteresis) * rate(current) else current


@pytest.mark.parametrize(
    "alpha,beta,noise_scale",
    [
        (1.0, 0.01, 100.0),
        (0.0, 0.01, 100.0),
        (0.01, 0.01, 100.0),
        (0.01, 0.01, 3000.0),
        (0.1, 0.01, 1e5),
    ],
)
def test_goodput_policy_picks_the_argmax_of_the_progress_rate(alpha, beta, noise_scale) -> None:
    policy = policy_with(alpha, beta)
    stats = StepStats.make(grad_sqr=2.0, trace_sigma=2.0 * noise_scale)
    got = int(policy.next_batch_size(tf.constant(64, tf.int64), stats))
    assert got == expected_best(alpha, beta, 2.0, 2.0 * noise_scale, 64, 32, 512, 64)
    assert got % UNIT == 0 and 32 <= got <= 512


def test_fixed_cost_drives_the_choice_large_when_steps_are_expensive_small_when_cheap() -> None:
    stats = StepStats.make(grad_sqr=1.0, trace_sigma=200.0)  # noise scale 200
    chosen = [
        int(policy_with(alpha, 0.01).next_batch_size(tf.constant(64, tf.int64), stats))
        for alpha in (0.0, 0.01, 0.05, 0.5)
    ]
    assert chosen == sorted(chosen) and chosen[0] == 32 and chosen[-1] == 512


def test_hysteresis_holds_the_batch_under_the_threshold() -> None:
    """Noise scale 200, B0 = 64, T = 0.01 + 0.01 k: the rate is flat near its top
    (B = 64: 33.3, 96: 33.4, 128: 32.2 base steps per second)."""
    stats = StepStats.make(grad_sqr=1.0, trace_sigma=200.0)
    policy = policy_with(0.01, 0.01, hysteresis=0.0, min_batch_size=64)
    best = int(policy.next_batch_size(tf.constant(64, tf.int64), stats))
    assert best == expected_best(0.01, 0.01, 1.0, 200.0, 64, 64, 512, 64, hysteresis=0.0) == 96
    rates = {
        b: float(policy.progress_rate(tf.constant(b, tf.int64), stats)) for b in range(64, 513, 32)
    }
    close = [b for b in rates if b != best and rates[b] * 1.05 > rates[best]]
    far = [b for b in rates if rates[b] * 1.05 < rates[best]]
    assert close == [64, 128] and 512 in far
    held = policy_with(0.01, 0.01, hysteresis=0.05, min_batch_size=64)
    for b in close:
        assert int(held.next_batch_size(tf.constant(b, tf.int64), stats)) == b
    for b in far:
        assert int(held.next_batch_size(tf.constant(b, tf.int64), stats)) == best


def test_explores_until_the_throughput_model_is_ready_and_nan_changes_nothing() -> None:
    model = ThroughputModel(min_timings_per_k=1)
    policy = GoodputPolicy(model, initial_batch_size=64, min_batch_size=32, max_batch_size=128)
    policy.build(batch_unit=UNIT)
    stats = StepStats.make(grad_sqr=1.0, trace_sigma=200.0)
    # With min_timings_per_k=1 the step just taken is timing enough: explore at once.
    assert int(policy.next_batch_size(tf.constant(64, tf.int64), stats)) == 96  # one more
    assert int(policy.next_batch_size(tf.constant(128, tf.int64), stats)) == 96  # top: one less
    strict = ThroughputModel(min_timings_per_k=2)
    waiting = GoodputPolicy(strict, initial_batch_size=64, min_batch_size=32, max_batch_size=128)
    waiting.build(batch_unit=UNIT)
    # Deciding after a step at k = 2 that the host has not timed yet: with one earlier
    # timing of k = 2 that step makes two, enough; with none, it stays.
    assert int(waiting.next_batch_size(tf.constant(64, tf.int64), stats)) == 64  # stays
    strict.observe(2, 0.2)
    assert int(strict.timings_at(2)) == 1 and int(strict.timings_at(3)) == 0
    assert int(waiting.next_batch_size(tf.constant(64, tf.int64), stats)) == 96
    model.observe(2, 0.2)
    model.observe(3, 0.25)
    nan = StepStats.make(grad_sqr=float("nan"), trace_sigma=200.0)
    assert int(policy.next_batch_size(tf.constant(96, tf.int64), nan)) == 96


def test_goodput_policy_validates_its_arguments() -> None:
    with pytest.raises(TypeError, match="`throughput` must be"):
        GoodputPolicy("fast", initial_batch_size=32, min_batch_size=32, max_batch_size=64)
    with pytest.raises(ValueError, match="`hysteresis` must be a finite number >= 0"):
        GoodputPolicy(
            ThroughputModel(),
            initial_batch_size=32,
            min_batch_size=32,
            max_batch_size=64,
            hysteresis=-1,
        )
    assert "GoodputPolicy" in tf_adabatch.__all__ and "ThroughputModel" in tf_adabatch.__all__


class ScriptedClock(tf_adabatch.clock.Clock):
    """Charges every step `fixed + per_micro_step * k`, whatever the host measured."""

    name = "scripted"
    measures_host = False

    def __init__(self, fixed: float, per_micro_step: float) -> None:
        self.fixed, self.per_micro_step = fixed, per_micro_step
        self.charged: list[tuple[int, int, float]] = []

    def seconds(self, measured: float, batch_size: int, accumulation_steps: int) -> float:
        seconds = self.fixed + self.per_micro_step * accumulation_steps
        self.charged.append((batch_size, accumulation_steps, seconds))
        return seconds


def _goodput_run(
    clock: tf_adabatch.clock.Clock, steps: int = 20, *, loss="mse", callbacks=(), ready=True
) -> tuple[dict, ThroughputModel]:
    """One device, a linear model, GoodputPolicy in [8, 64] from 16, micro-batch 8."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
    throughput = ThroughputModel(min_timings_per_k=2)
    trainer = tf_adabatch.Trainer(
        model,
        loss=loss,
        optimizer=keras.optimizers.SGD(0.01),
        micro_batch_size=8,
        policy=GoodputPolicy(
            throughput, initial_batch_size=16, min_batch_size=8, max_batch_size=64
        ),
        similarity="estimated",
        clock=clock,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4096, 4)).astype("float32")
    y = (x.sum(1, keepdims=True) + 2.0 * rng.normal(size=(4096, 1))).astype("float32")
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8, drop_remainder=True)
    history = trainer.fit(data, steps=steps, verbose=0, callbacks=list(callbacks))
    if ready:
        assert int(throughput.ready) == 1
    return history, throughput


def test_end_to_end_a_costly_fixed_part_makes_batches_large_a_costly_micro_step_small() -> None:
    """One device, Trainer, a scripted clock (no sleeping, no host timing): a cost per
    optimizer step (alpha) makes the largest batch the fastest way to progress,
    r(B) / T(B) ~ r(B) / alpha growing with B; a cost per micro-step (beta) makes the
    smallest one fastest, r(B) / (beta k) ~ r(B) / S falling with B (r <= S). The engine
    charges every step the clock's seconds, the traced first one included, and feeds them
    to the policy's model."""
    fixed_clock = ScriptedClock(fixed=0.1, per_micro_step=1e-4)
    fixed, _ = _goodput_run(fixed_clock)
    micro_clock = ScriptedClock(fixed=1e-4, per_micro_step=0.03)
    per_micro, _ = _goodput_run(micro_clock)
    assert fixed["batch_size"][-1] == 64.0, fixed["batch_size"]
    assert per_micro["batch_size"][-1] == 8.0, per_micro["batch_size"]
    for history, clock in ((fixed, fixed_clock), (per_micro, micro_clock)):
        assert len(clock.charged) == 20  # every step, the traced first one included
        expected = [clock.fixed + clock.per_micro_step * k for k in history["accumulation_steps"]]
        np.testing.assert_array_equal(history["step_time"], expected)


def test_config_policy_goodput_trains_resumes_and_keeps_its_timings_in_checkpoints(
    tmp_path,
) -> None:
    """`policy.kind = "goodput"` from a config: checking the config creates no variable
    (no TensorFlow op may run before the strategy exists); a run times every step but
    the traced first one, and a resumed run continues the same window of timings.

    8 steps: the first traces (no timing), so 7 timings; resumed to 12: the resumed
    process traces its first step again, so 7 + 3 = 10."""
    from configs import synthetic
    from tf_adabatch import app
    from tf_adabatch.app import factories

    config = synthetic.get_config()
    config.strategy = "one_device"
    config.policy.kind = "goodput"
    config.train.max_steps = 8
    config.train.checkpoint_every_steps = 4
    config.train.eval_every_base_epochs = 100.0
    app.validate_config(config)
    policy = factories.make_policy(config)
    assert isinstance(policy, GoodputPolicy) and policy.variables == ()
    assert policy.base_batch_size == config.base_batch_size and policy.hysteresis == 0.05

    def saved_count() -> int:
        reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
        keys = [k for k in reader.get_variable_to_shape_map() if "throughput" in k]
        count = [k for k in keys if k.startswith("policy/throughput/count/")]
        assert len(count) == 1, keys
        return int(reader.get_tensor(count[0]))

    assert app.run(config, str(tmp_path), verbose=0)["optimizer_steps"] == 8
    assert saved_count() == 7
    config.train.max_steps = 12
    assert app.run(config, str(tmp_path), verbose=0)["optimizer_steps"] == 12
    assert saved_count() == 10


def test_a_skipped_step_teaches_the_throughput_model_nothing() -> None:
    """Only applied steps feed the throughput model (docs/reliability.md: a skipped step
    leaves all state as it was). Steps 3, 7 and 8 get an infinite loss scale (non-finite
    gradients: skipped), and a scripted clock charges them 100x an applied step. The
    model's window must hold exactly the applied steps' (k, seconds), in order, and none
    of the 100x charges."""
    import keras

    poisoned = {3, 7, 8}
    poison = tf.Variable(0.0, trainable=False)

    class Poison(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            poison.assign(1.0 if batch in poisoned else 0.0)

    def loss(y_true, y_pred):
        scale = tf.where(poison > 0, tf.constant(np.inf, tf.float32), 1.0)
        return tf.reduce_mean(tf.square(y_true - y_pred), axis=-1) * scale

    class CostlySkips(ScriptedClock):
        def seconds(self, measured, batch_size, accumulation_steps):
            seconds = super().seconds(measured, batch_size, accumulation_steps)
            return 100.0 * seconds if float(poison.numpy()) > 0 else seconds

    clock = CostlySkips(fixed=0.01, per_micro_step=0.005)
    history, throughput = _goodput_run(
        clock, steps=12, loss=loss, callbacks=[Poison()], ready=False
    )
    applied = [bool(a) for a in history["applied"]]
    assert [i for i, a in enumerate(applied) if not a] == sorted(poisoned)  # the skips ran
    skipped_times = [t for t, a in zip(history["step_time"], applied, strict=True) if not a]
    assert min(skipped_times) >= 100 * 0.015  # charged 100x by the clock
    expected = [
        (k, t)
        for k, t, a in zip(
            history["accumulation_steps"], history["step_time"], applied, strict=True
        )
        if a
    ]
    count = int(throughput.count.numpy())
    assert count == len(expected) == 12 - len(poisoned)
    window = list(
        zip(throughput.timings_k.numpy()[:count], throughput.timings_s.numpy()[:count], strict=True)
    )
    assert window == [(float(k), float(t)) for k, t in expected]
    assert max(t for _, t in window) < 1.0


def test_exploration_at_the_top_tries_the_largest_batch_and_never_passes_it() -> None:
    """Exploring (the throughput model not ready), a timed batch one unit below
    max_batch_size moves up to max_batch_size itself, and from the top it explores down:
    never past it. Unit 8, range [8, 64]; one timing per k is enough."""
    model = ThroughputModel(min_timings_per_k=1)
    policy = GoodputPolicy(model, initial_batch_size=56, min_batch_size=8, max_batch_size=64)
    policy.build(batch_unit=8)
    stats = StepStats.make(grad_sqr=1.0, trace_sigma=100.0)
    assert int(model.ready) == 0
    assert int(policy.next_batch_size(56, stats)) == 64  # the top is tried
    model.observe(7, 1.0)  # the host timed the step at 56 (k = 7)
    assert int(model.ready) == 0  # one value of k timed: still exploring
    assert int(policy.next_batch_size(64, stats)) == 56  # from the top: one unit down
    for batch in range(8, 65, 8):  # wherever it explores from, it stays in range
        assert 8 <= int(policy.next_batch_size(batch, stats)) <= 64
