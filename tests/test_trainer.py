"""The custom loop: checkpoints, progress bar, quiet mode, properties and bad input."""

from __future__ import annotations

import math
import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data, weights

M = 4


def make_trainer(replicas: int = 2, batch: int | None = None, **kwargs) -> tf_adabatch.Trainer:
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    kwargs.setdefault("policy", tf_adabatch.StaticPolicy(batch or replicas * M * 2))
    return tf_adabatch.Trainer(
        model, loss="mse", optimizer=optimizer, micro_batch_size=M, strategy=strategy, **kwargs
    )


def assert_refused(
    match: str,
    *,
    exception: type[Exception] = ValueError,
    strategy: tf.distribute.Strategy | None = None,
    sgd: dict | None = None,
    **trainer_kwargs,
) -> None:
    """A Trainer of the small MLP with SGD(0.1, **sgd), both built in `strategy` (2
    mirrored replicas by default), must raise `exception` with a message matching `match`."""
    strategy = strategy or get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, **(sgd or {}))
    args = {"loss": "mse", "optimizer": optimizer, "micro_batch_size": M} | trainer_kwargs
    with pytest.raises(exception, match=match):
        tf_adabatch.Trainer(model, strategy=strategy, **args)


def data(replicas: int = 2, num: int = 512) -> tf.data.Dataset:
    x, y = regression_data(num)
    return global_micro_batches(x, y, replicas * M).repeat()


def test_checkpoint_restores_weights_optimizer_and_adaptive_state(tmp_path) -> None:
    trainer = make_trainer(base_batch_size=M)
    trainer.fit(data(), steps=4, verbose=0)
    trainer.set_batch_size(2 * M * 3)
    path = trainer.checkpoint.save(str(tmp_path / "ckpt"))
    saved = {
        "weights": weights(trainer.engine.model),
        "state": {v.name: v.numpy() for v in trainer.state.variables},
        "iterations": int(trainer.engine.optimizer.iterations.numpy()),
    }
    trainer.fit(data(), steps=3, verbose=0)  # move everything on
    assert trainer.accumulation_steps == 3 and trainer.gain != pytest.approx(1.0)
    trainer.checkpoint.read(path).assert_consumed()
    for w, s in zip(weights(trainer.engine.model), saved["weights"], strict=True):
        np.testing.assert_array_equal(w, s)
    for v in trainer.state.variables:
        np.testing.assert_array_equal(v.numpy(), saved["state"][v.name])
    assert int(trainer.engine.optimizer.iterations.numpy()) == saved["iterations"]
    assert trainer.accumulation_steps == 3


def test_quiet_fit_prints_nothing_and_writes_nothing(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    trainer = make_trainer()
    history = trainer.fit(data(), steps=3, verbose=0)
    assert capsys.readouterr().out == ""
    assert os.listdir(tmp_path) == []
    assert sorted(history) == sorted(
        [
            "loss",
            "batch_size",
            "accumulation_steps",
            "gain",
            "similarity",
            "noise_scale",
            "grad_sqr",
            "grad_var",
            "learning_rate",
            "progress",
            "samples_seen",
            "skipped_steps",
            "applied",
            "step",
            "consecutive_skips",
            "step_time",
            "examples_per_second",
            "progress_per_second",
        ]
    )
    assert len(history["loss"]) == 3


def test_progress_bar_shows_batch_gain_similarity_and_learning_rate(capsys) -> None:
    trainer = make_trainer()
    trainer.fit(data(), steps=2, verbose=1)
    out = capsys.readouterr().out
    for name in ("loss", "batch_size", "gain", "similarity", "learning_rate", "progress", "2/2"):
        assert name in out
    assert "/step" in out and "step:" not in out  # the bar itself counts the steps


def test_progress_bar_shows_the_skipped_steps(capsys) -> None:
    """The launcher's progress line (this bar) counts the skipped steps: the first
    step's 16 examples (2 replicas x M x k = 2) hold a NaN, the next two are clean."""
    trainer = make_trainer()
    x, y = regression_data(64)
    x[:16, 0] = np.nan
    history = trainer.fit(global_micro_batches(x, y, 2 * M).repeat(), steps=3, verbose=1)
    assert history["applied"] == [0.0, 1.0, 1.0]
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3/3" in last and "- skipped_steps: 1" in last, last


def test_progress_bar_on_a_budget_counts_base_steps_and_shows_optimizer_steps(capsys) -> None:
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(0.05, "linear"))
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        base_batch_size=2 * M,
        policy=tf_adabatch.StaticPolicy(4 * M),
        strategy=strategy,
    )
    trainer.fit(data(), until_progress=6.0, verbose=1)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # The "linear" rule: tau grows by S = 4M / 2M = 2 base steps per optimizer step, so
    # the budget of 6 base steps takes 3 optimizer steps.
    assert "6/6" in last and "/base step" in last
    assert "- step: 3 -" in last  # optimizer steps as a whole number, not 3.0000
    assert "progress:" not in last  # the bar is the progress


def test_properties_report_the_state() -> None:
    trainer = make_trainer(replicas=4, batch=4 * M * 2, base_batch_size=4 * M)
    assert math.isnan(trainer.similarity) and trainer.gain == 1.0 and math.isnan(trainer.grad_sqr)
    trainer.fit(data(4), steps=5, verbose=0)
    assert trainer.batch_size == 32 and trainer.accumulation_steps == 2
    # Each property against the raw state variables, with the formulas of
    # docs/algorithms.md: debiased averages biased / weight, grad_var = tr(Sigma) / B0,
    # noise scale = tr(Sigma) / |G|^2.
    state = {v.name.split("/")[-1].split(":")[0]: float(v.numpy()) for v in trainer.state.variables}
    grad_sqr = state["grad_sqr_biased"] / state["ema_weight"]
    trace = state["trace_sigma_biased"] / state["ema_weight"]
    assert state["ema_weight"] > 0 and grad_sqr > 0 and trace > 0
    assert trainer.gain == state["gain"] and trainer.similarity == state["similarity"]
    assert trainer.progress == state["progress"]
    assert trainer.grad_sqr == pytest.approx(grad_sqr, rel=1e-12)
    assert trainer.grad_var == pytest.approx(trace / (4 * M), rel=1e-12)
    assert trainer.noise_scale == pytest.approx(trace / grad_sqr, rel=1e-12)
    b, b0 = 32.0, 16.0  # AdaScale's gain from the smoothed moments, independently
    assert trainer.gain == pytest.approx((trace / b0 + grad_sqr) / (trace / b + grad_sqr), rel=1e-9)
    assert trainer.learning_rate == pytest.approx(0.05)  # a plain float: no rule applies
    assert 1.0 <= trainer.gain <= 2.0  # S = 32 / 16
    for name in (
        "batch_size",
        "gain",
        "similarity",
        "progress",
        "learning_rate",
        "grad_sqr",
        "grad_var",
        "noise_scale",
        "accumulation_steps",
    ):
        with pytest.raises(AttributeError):
            setattr(trainer, name, 1)


def test_dataset_running_out_ends_cleanly_and_discards_the_partial_step() -> None:
    x, y = regression_data(2 * M * 3 * 3 + 2 * M)  # three full steps and one micro-step
    full, extra = 2 * M * 3 * 2, 2 * M * 3 * 2 + 2 * M
    cut = make_trainer(batch=2 * M * 3)
    with pytest.warns(UserWarning, match="ran out after 2 optimizer steps"):
        history = cut.fit(global_micro_batches(x[:extra], y[:extra], 2 * M), steps=5, verbose=0)
    assert len(history["loss"]) == 2
    clean = make_trainer(batch=2 * M * 3)
    clean.fit(global_micro_batches(x[:full], y[:full], 2 * M), steps=2, verbose=0)
    # The next step must not see the discarded micro-batch.
    rest = global_micro_batches(x[full + 2 * M :], y[full + 2 * M :], 2 * M)
    for trainer in (cut, clean):
        trainer.fit(rest, steps=1, verbose=0)
    for a, b in zip(weights(cut.engine.model), weights(clean.engine.model), strict=True):
        np.testing.assert_array_equal(a, b)
    assert (
        cut.gain == clean.gain
        and cut.state.samples_seen.numpy() == clean.state.samples_seen.numpy()
    )


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (
            {"micro_batch_size": 0},
            r"Argument `micro_batch_size` must be a positive integer. Received: micro_batch_size=0",
        ),
        (
            {"similarity": "cosine"},
            r"Argument `similarity` must be one of \('auto', 'exact', 'estimated'\). Received: similarity='cosine'",
        ),
        (
            {"policy": tf_adabatch.StaticPolicy(12)},
            r"Argument `policy.initial_batch_size` must be a multiple of replicas x micro_batch_size = 2 x 4 = 8. Received: policy.initial_batch_size=12",
        ),
        (
            {"ema_decay": 1.0},
            r"Argument `ema_decay` must be a number in \[0, 1\) or None. Received: ema_decay=1.0",
        ),
        (
            {"base_batch_size": -3},
            r"Argument `base_batch_size` must be a positive integer. Received: base_batch_size=-3",
        ),
        (
            {"max_consecutive_skips": 0},
            r"Argument `max_consecutive_skips` must be a positive integer. Received: max_consecutive_skips=0",
        ),
    ],
)
def test_bad_arguments_are_named_with_rule_and_value(kwargs, match) -> None:
    assert_refused(match, **kwargs)


def test_one_replica_exact_mode_needs_two_micro_steps() -> None:
    model = mlp(tf.distribute.get_strategy())
    with pytest.raises(
        ValueError,
        match=r"at least 8 \(one replica in exact-similarity mode needs >= 2 micro-steps.*similarity='estimated'\)",
    ):
        tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=keras.optimizers.SGD(0.1),
            micro_batch_size=M,
            similarity="exact",
        )


def test_model_outside_the_strategy_scope_is_refused() -> None:
    model = mlp(tf.distribute.get_strategy())
    with pytest.raises(ValueError, match=r"must be created inside `strategy.scope\(\)`"):
        tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=keras.optimizers.SGD(0.1),
            micro_batch_size=M,
            strategy=get_strategy(2),
        )


def test_dataset_with_wrong_batch_dimension_is_refused() -> None:
    trainer = make_trainer()
    x, y = regression_data(64)
    with pytest.raises(
        ValueError,
        match=r"global micro-batch replicas x micro_batch_size = 2 x 4 = 8.*Received: batch dimension 4",
    ):
        trainer.fit(global_micro_batches(x, y, 4), steps=1, verbose=0)
    with pytest.raises(ValueError, match=r"drop_remainder=True.*Received: batch dimension None"):
        trainer.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(8), steps=1, verbose=0)


def test_set_batch_size_validates() -> None:
    trainer = make_trainer()
    with pytest.raises(
        ValueError,
        match=r"Argument `batch_size` must be a multiple of .* = 8. Received: batch_size=20",
    ):
        trainer.set_batch_size(20)


def test_optimizer_with_keras_gradient_accumulation_is_refused() -> None:
    assert_refused("gradient_accumulation_steps=2", sgd={"gradient_accumulation_steps": 2})


def test_per_replica_dataset_function() -> None:
    trainer = make_trainer()
    x, y = regression_data(256)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices((x, y)).shard(
            ctx.num_input_pipelines, ctx.input_pipeline_id
        )
        return ds.repeat().batch(ctx.get_per_replica_batch_size(2 * M), drop_remainder=True)

    history = trainer.fit(dataset_fn, steps=3, verbose=0)
    assert history["samples_seen"][-1] == 3 * 2 * M * 2


def test_static_loss_scale_factor_is_refused_with_the_alternative() -> None:
    assert_refused(
        r"static `loss_scale_factor` .* not supported .*LossScaleOptimizer.*Received: loss_scale_factor=128.0",
        sgd={"loss_scale_factor": 128.0},
    )


def test_evaluate_is_exact_with_an_uneven_last_batch() -> None:
    """103 examples in batches of 16 over 2 replicas (the last batch has 7): loss and
    accuracy equal the plain means computed with numpy."""
    strategy = get_strategy(2)
    with strategy.scope():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
    trainer = tf_adabatch.Trainer(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=optimizer,
        micro_batch_size=M,
        strategy=strategy,
    )
    rng = np.random.default_rng(0)
    x = rng.normal(size=(103, 6)).astype("float32")
    y = rng.integers(0, 3, size=103)
    result = trainer.evaluate(
        tf.data.Dataset.from_tensor_slices((x, y)).batch(16),
        metrics={"accuracy": keras.metrics.sparse_categorical_accuracy},
    )
    logits = model(x).numpy().astype(np.float64)
    log_probs = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    assert result["loss"] == pytest.approx(-log_probs[np.arange(103), y].mean(), rel=1e-5)
    assert result["accuracy"] == pytest.approx((logits.argmax(1) == y).mean())


def test_unsupported_strategy_is_refused_by_name() -> None:
    assert_refused(
        r"Argument `strategy` must be a synchronous data-parallel strategy .* Received: strategy=CentralStorageStrategy",
        strategy=tf.distribute.experimental.CentralStorageStrategy(),
    )


def test_engine_only_arguments_and_the_loss_type_are_validated() -> None:
    assert_refused(
        r"Argument `loss` must be a Keras `Loss`, a loss name or a callable .* Received: loss=42",
        exception=TypeError,
        loss=42,
    )
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1)
    with pytest.raises(
        ValueError,
        match=r"Argument `min_variance` must be a finite number >= 0. Received: min_variance=-1.0",
    ):
        tf_adabatch.AdaptiveEngine(
            model,
            loss="mse",
            optimizer=optimizer,
            micro_batch_size=M,
            min_variance=-1.0,
            strategy=strategy,
        )


def test_fit_budgets_and_empty_evaluation_are_refused() -> None:
    trainer = make_trainer()
    with pytest.raises(
        ValueError, match=r"Argument `steps` must be a non-negative integer. Received: steps=-1"
    ):
        trainer.fit(data(), steps=-1, verbose=0)
    with pytest.raises(
        ValueError,
        match=r"Argument `until_progress` must be a number >= 0. Received: until_progress=-2.0",
    ):
        trainer.fit(data(), until_progress=-2.0, verbose=0)
    # A plain learning rate has no base schedule, hence no default budget.
    with pytest.raises(
        ValueError, match=r"Pass `steps`, `until_progress` or both .* Received neither"
    ):
        trainer.fit(data(), verbose=0)
    with pytest.raises(ValueError, match=r"Argument `dataset` must not be empty"):
        trainer.evaluate(data().take(0))


def test_one_replica_estimated_mode_resumes_exactly(tmp_path) -> None:
    """One replica, estimated similarity, k = 1: every step's statistics come from the
    differenced estimator, which reads the previous step's gradient. The checkpoint
    carries that gradient, so 3 + (restore) 3 steps = 6 uninterrupted steps."""
    x, y = regression_data(512)
    data = global_micro_batches(x, y, M).repeat()

    def make() -> tf_adabatch.Trainer:
        strategy = tf.distribute.get_strategy()
        model = mlp(strategy)
        return tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            micro_batch_size=M,
            similarity="estimated",
            policy=tf_adabatch.StaticPolicy(M),
        )

    full = make()
    expected = full.fit(data, steps=6, verbose=0)
    first = make()
    assert first.engine.carried_buffers  # the mode under test
    first.fit(data, steps=3, verbose=0)
    path = first.checkpoint.write(str(tmp_path / "ckpt"))
    second = make()
    second.checkpoint.read(path).assert_consumed()
    resumed = second.fit(data.skip(3), steps=3, verbose=0)
    for name in ("gain", "grad_sqr", "grad_var", "loss"):
        np.testing.assert_allclose(resumed[name], expected[name][3:], rtol=1e-6, err_msg=name)
    for a, b in zip(weights(second.engine.model), weights(full.engine.model), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
