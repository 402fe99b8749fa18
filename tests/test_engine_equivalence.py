"""The distributed step applies exactly the large-batch gradient a single device would.

Examples are consumed in order: micro-step i of replica r reads examples
[(i*N + r)*m, (i*N + r + 1)*m) of the step's block, so one optimizer step with k
micro-steps uses the next N*m*k examples, the same ones a single device takes as one
batch of N*m*k. Losses are means over that batch.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data, weights

M = 4  # micro-batch per replica

OPTIMIZERS = {
    "sgd_momentum": lambda **kw: keras.optimizers.SGD(0.1, momentum=0.9, **kw),
    "adam": lambda **kw: keras.optimizers.Adam(0.01, **kw),
    "adamw": lambda **kw: keras.optimizers.AdamW(0.01, weight_decay=0.05, **kw),
}


def reference_run(
    make_optimizer, ks: list[int], replicas: int, x: np.ndarray, y: np.ndarray, **layer_kwargs
) -> list[np.ndarray]:
    """Single device, plain Keras: one batch of replicas*M*k examples per step (the mean
    loss plus the model's regularization losses, as Keras trains it)."""
    model = mlp(tf.distribute.get_strategy(), **layer_kwargs)
    optimizer = make_optimizer()
    start = 0
    for k in ks:
        size = replicas * M * k
        xb, yb = x[start : start + size], y[start : start + size]
        start += size
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.mean_squared_error(yb, model(xb, training=True)))
            if model.losses:
                loss += tf.add_n(model.losses)
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
    return weights(model)


def engine_run(
    make_optimizer, ks: list[int], strategy, x, y, *, layer_kwargs=None, **kwargs
) -> tf_adabatch.Trainer:
    replicas = strategy.num_replicas_in_sync
    model = mlp(strategy, **(layer_kwargs or {}))
    with strategy.scope():
        optimizer = make_optimizer()
    kwargs.setdefault("similarity", "exact" if replicas > 1 else "estimated")
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(replicas * M * ks[0]),
        strategy=strategy,
        **kwargs,
    )
    iterator = iter(trainer.distribute(global_micro_batches(x, y, replicas * M)))
    for k in ks:
        trainer.set_batch_size(replicas * M * k)
        trainer.engine.train_step(iterator)
    return trainer


def assert_weights_close(
    actual: list[np.ndarray], expected: list[np.ndarray], rtol: float = 1e-5
) -> None:
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, rtol=rtol, atol=rtol * np.abs(e).max())


KS = [1, 2, 3, 2]


@pytest.mark.parametrize("opt", sorted(OPTIMIZERS))
def test_four_replicas_equal_one_device_large_batch_traced_once(opt: str) -> None:
    strategy = get_strategy(4, collective=True)  # real collective all-reduce
    x, y = regression_data(4 * M * sum(KS))
    trainer = engine_run(OPTIMIZERS[opt], KS, strategy, x, y)
    assert_weights_close(weights(trainer.engine.model), reference_run(OPTIMIZERS[opt], KS, 4, x, y))
    assert trainer.engine.trace_count == 1
    assert int(trainer.state.steps.numpy()) == len(KS)
    assert int(trainer.state.samples_seen.numpy()) == 4 * M * sum(KS)


@pytest.mark.parametrize(
    "replicas,similarity", [(1, "exact"), (1, "estimated"), (2, "estimated"), (3, "exact")]
)
def test_other_replica_counts_equal_one_device(replicas: int, similarity: str) -> None:
    ks = [2, 3, 2]
    x, y = regression_data(replicas * M * sum(ks))
    trainer = engine_run(
        OPTIMIZERS["sgd_momentum"], ks, get_strategy(replicas), x, y, similarity=similarity
    )
    assert_weights_close(
        weights(trainer.engine.model), reference_run(OPTIMIZERS["sgd_momentum"], ks, replicas, x, y)
    )
    assert trainer.engine.trace_count == 1


def test_no_double_counting_closed_form_sgd_step() -> None:
    """One plain SGD step of lr 1 on a linear model moves w by exactly -gbar.

    For y_pred = x w + b and loss = mean_j (y_pred_j - y_j)^2 / d_out (Keras mse), the
    batch-mean gradient is dW = 2/(B d_out) x^T (x w + b - y), db = 2/(B d_out) sum(x w + b - y).
    A gradient all-reduced twice would move it N = 4 times as far.
    """
    strategy = get_strategy(4)
    x, y = regression_data(4 * M * 2)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(1.0)
    w0, b0 = (v.numpy().astype(np.float64) for v in model.trainable_variables)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(4 * M * 2),
        strategy=strategy,
    )
    trainer.fit(global_micro_batches(x, y, 4 * M), steps=1, verbose=0)
    residual = x.astype(np.float64) @ w0 + b0 - y
    scale = 2.0 / (len(x) * 3)
    w1, b1 = (v.numpy() for v in model.trainable_variables)
    np.testing.assert_allclose(
        w1, w0 - scale * x.T.astype(np.float64) @ residual, rtol=1e-5, atol=1e-6
    )
    np.testing.assert_allclose(b1, b0 - scale * residual.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("clip", ["global_clipnorm", "clipnorm"])
def test_clipping_acts_on_the_global_gradient(clip: str) -> None:
    make = lambda: keras.optimizers.SGD(0.1, momentum=0.9, **{clip: 0.05})  # noqa: E731
    ks = [2, 1, 3]
    x, y = regression_data(4 * M * sum(ks))
    trainer = engine_run(make, ks, get_strategy(4), x, y)
    # The clip is active: the unclipped gradient norm is well above 0.05.
    assert np.sqrt(trainer.grad_sqr) > 0.2
    assert_weights_close(weights(trainer.engine.model), reference_run(make, ks, 4, x, y))


def test_jit_compile_single_device_with_changing_k() -> None:
    ks = [2, 3, 2, 4]
    x, y = regression_data(M * sum(ks))
    plain = engine_run(OPTIMIZERS["adam"], ks, get_strategy(1), x, y, similarity="exact")
    jitted = engine_run(
        OPTIMIZERS["adam"], ks, get_strategy(1), x, y, similarity="exact", jit_compile=True
    )
    assert jitted.engine.trace_count == 1
    assert_weights_close(weights(jitted.engine.model), weights(plain.engine.model))
    assert jitted.gain == pytest.approx(plain.gain, rel=1e-5)
    assert jitted.similarity == pytest.approx(plain.similarity, rel=1e-4, abs=1e-5)


@pytest.mark.parametrize("replicas,k", [(4, 2), (2, 3), (3, 1), (3, 2), (1, 3)])
def test_exact_similarity_equals_cosine_of_group_means(replicas: int, k: int) -> None:
    """Group A holds micro-gradient i of replica r when (i*N + r) is even."""
    x, y = regression_data(replicas * M * k, seed=3)
    trainer = engine_run(
        OPTIMIZERS["sgd_momentum"], [k], get_strategy(replicas), x, y, similarity="exact"
    )
    model = mlp(tf.distribute.get_strategy())  # same seed: the weights before the step
    blocks = np.arange(replicas * k)
    groups = []
    for parity in (0, 1):
        idx = np.concatenate([np.arange(b * M, (b + 1) * M) for b in blocks if b % 2 == parity])
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(
                keras.losses.mean_squared_error(y[idx], model(x[idx], training=True))
            )
        grads = tape.gradient(loss, model.trainable_variables)
        groups.append(np.concatenate([g.numpy().ravel() for g in grads]).astype(np.float64))
    a, b = groups
    expected = a @ b / np.linalg.norm(a) / np.linalg.norm(b)
    assert trainer.similarity == pytest.approx(expected, abs=1e-5)


def test_non_finite_micro_batch_skips_the_step_and_corrupts_nothing() -> None:
    strategy = get_strategy(2)
    step = 2 * M * 2  # examples per optimizer step: 2 replicas x M x k=2
    x, y = regression_data(4 * step)
    x[step + M + 1, 0] = np.nan  # step 2, replica 1, micro-step 0
    y[2 * step + 3, 1] = np.inf  # step 3, replica 0, micro-step 0
    model = mlp(strategy)
    with strategy.scope():
        optimizer = OPTIMIZERS["sgd_momentum"]()
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(step),
        strategy=strategy,
    )
    engine = trainer.engine
    iterator = iter(trainer.distribute(global_micro_batches(x, y, 2 * M)))
    state = engine.state

    def snapshot():
        scalars = (
            state.grad_sqr_biased,
            state.trace_sigma_biased,
            state.ema_weight,
            state.gain,
            state.progress,
            state.similarity,
            state.accumulation_steps,
        )
        return (
            weights(model)
            + [np.array(v.numpy()) for v in optimizer.variables]
            + [np.array(v.numpy()) for v in scalars]
        )

    assert float(engine.train_step(iterator)["applied"]) == 1.0
    before = snapshot()
    assert float(engine.train_step(iterator)["applied"]) == 0.0  # NaN input
    assert float(engine.train_step(iterator)["applied"]) == 0.0  # inf target
    for b, a in zip(before, snapshot(), strict=True):
        np.testing.assert_array_equal(a, b)
    assert int(state.skipped_steps.numpy()) == 2
    assert int(state.samples_seen.numpy()) == 3 * step
    assert float(engine.train_step(iterator)["applied"]) == 1.0  # training continues
    assert int(state.steps.numpy()) == 2
    assert all(np.isfinite(w).all() for w in weights(model))
    assert state.ema_weight.numpy() > before[-5]


def test_regularizers_match_one_device() -> None:
    """Weight regularizers once per step, activity regularizers per micro-batch: exact."""
    kwargs = {
        "kernel_regularizer": keras.regularizers.L2(0.01),
        "activity_regularizer": keras.regularizers.L1(0.01),
    }
    ks = [2, 3]
    x, y = regression_data(4 * M * sum(ks))
    make = OPTIMIZERS["sgd_momentum"]
    trainer = engine_run(make, ks, get_strategy(4), x, y, layer_kwargs=kwargs)
    assert trainer.engine.model.losses  # the regularizers are there
    assert_weights_close(weights(trainer.engine.model), reference_run(make, ks, 4, x, y, **kwargs))


def test_a_run_of_non_finite_steps_stops_with_a_clear_error_and_keeps_the_last_good_state() -> None:
    strategy = get_strategy(2)
    x, y = regression_data(2 * M * 2 * 6)
    x[2 * M * 2 :] = np.nan  # every step after the first
    model = mlp(strategy)
    with strategy.scope():
        optimizer = OPTIMIZERS["sgd_momentum"]()
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(2 * M * 2),
        max_consecutive_skips=3,
        strategy=strategy,
    )
    iterator = iter(trainer.distribute(global_micro_batches(x, y, 2 * M)))
    trainer.engine.train_step(iterator)
    good = weights(model)
    with pytest.raises(
        tf_adabatch.engine.NonFiniteGradientsError,
        match=r"3 optimizer steps in a row had non-finite gradients .* \(1 applied\)",
    ):
        trainer.fit(iterator, steps=5, verbose=0)
    assert int(trainer.state.skipped_steps.numpy()) == 3
    for a, b in zip(weights(model), good, strict=True):
        np.testing.assert_array_equal(a, b)
