"""Shared helpers for the tests: small models and datasets with fixed seeds."""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

import tf_adabatch


def sum_of_outputs(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
    """fairscale's test loss: per example, the sum of the model's outputs."""
    del y_true
    return tf.reduce_sum(y_pred, axis=-1)


def dense_model(
    strategy: tf.distribute.Strategy, d_in: int, d_out: int, *, use_bias: bool = True, seed: int = 0
) -> keras.Model:
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [keras.Input((d_in,)), keras.layers.Dense(d_out, use_bias=use_bias)]
        )


def mlp(
    strategy: tf.distribute.Strategy, d_in: int = 6, *, seed: int = 0, **dense_kwargs
) -> keras.Model:
    with strategy.scope():
        keras.utils.set_random_seed(seed)
        return keras.Sequential(
            [
                keras.Input((d_in,)),
                keras.layers.Dense(8, activation="tanh", **dense_kwargs),
                keras.layers.Dense(3, **dense_kwargs),
            ]
        )


def regression_data(num: int, d_in: int = 6, *, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num, d_in)).astype("float32")
    w = rng.normal(size=(d_in, 3)).astype("float32")
    y = (np.tanh(x @ w) + 0.3 * rng.normal(size=(num, 3))).astype("float32")
    return x, y


def trainer(
    model: keras.Model,
    optimizer: keras.optimizers.Optimizer,
    strategy: tf.distribute.Strategy,
    **kwargs,
) -> tf_adabatch.Trainer:
    kwargs.setdefault("loss", "mse")
    return tf_adabatch.Trainer(model, optimizer=optimizer, strategy=strategy, **kwargs)


def global_micro_batches(x: np.ndarray, y: np.ndarray, global_micro: int) -> tf.data.Dataset:
    """Examples in order, batched by replicas x micro-batch (the strategy splits it)."""
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(global_micro, drop_remainder=True)


def weights(model: keras.Model) -> list[np.ndarray]:
    return [np.array(v.numpy()) for v in model.trainable_variables]


def checkpoint_values(workdir) -> dict[str, np.ndarray]:
    """Every variable of a run's latest checkpoint (model, optimizer, adaptive state, policy)."""
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir) + "/checkpoints"))
    return {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        # The run's record (seconds, processes, the divergence guard's references) is
        # the launcher's bookkeeping of its processes, not training state: a resumed
        # run's differs from an uninterrupted one's by design (tests/test_records.py).
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith("run/")
    }


def _estimated_similarity(grads: np.ndarray, replicas: int, from_moments: float) -> float:
    """Estimated mode's similarity of one step, from its definition (docs/algorithms.md).

    One replica: `from_moments`, |G|^2 / (|G|^2 + 2 tr / B) of the step's own unclipped
    moments. N >= 2 replicas: h_r = the sum of replica r's micro-gradients (blocks
    b = i * N + r), c_1 = sum over pairs r != s of h_r.h_s / sum of |h_r| |h_s| (each
    pair's inner product and norms, taken pair by pair here), carried from B/N to B/2
    examples by c(b) = |G|^2 / (|G|^2 + tr/b): c = N c_1 / ((N - 2) c_1 + 2).
    """
    if replicas == 1:
        return from_moments
    h = np.stack([grads[r::replicas].sum(axis=0) for r in range(replicas)])
    pairs = [(r, s) for r in range(replicas) for s in range(replicas) if r != s]
    c1 = sum(h[r] @ h[s] for r, s in pairs) / sum(
        np.linalg.norm(h[r]) * np.linalg.norm(h[s]) for r, s in pairs
    )
    return float(replicas * c1 / ((replicas - 2) * c1 + 2))


def sum_of_outputs_closed_form(
    x: np.ndarray,
    ks: list[int],
    *,
    replicas: int,
    micro: int,
    base_batch: int,
    d_out: int,
    decay: float,
    min_variance: float = 1e-6,
) -> list[dict[str, float | np.ndarray]]:
    """Every statistic of a run of `Dense(d_out)` (with bias) under `sum_of_outputs`, in numpy.

    A sample x has the gradient (kernel rows x_j * ones(d_out), bias ones(d_out)), whatever
    the weights, so a whole run is closed form. Step t with k_t micro-steps reads the next
    replicas * micro * k_t examples; micro-gradient i of replica r is the mean over block
    b = i * replicas + r (`micro` examples) and belongs to group A iff b is even. With
    n = replicas * k micro-gradients g_b, B = n * micro, mean_sq = mean |g_b|^2 and gbar
    their mean (docs/algorithms.md):

        |G|^2 = (n |gbar|^2 - mean_sq) / (n - 1)      tr(Sigma) = m n (mean_sq - |gbar|^2) / (n - 1)

    clipped at 0 and min_variance * B0, averaged with a debiased EMA (biased / (1 - decay^t)),
    gain = (tr/B0 + |G|^2) / (tr/B + |G|^2) clipped to [1, S], tau += gain, estimated
    similarity (`_estimated_similarity`) and exact similarity cos(mean_A, mean_B).
    """
    x = np.asarray(x, np.float64)
    out: list[dict[str, float | np.ndarray]] = []
    start, biased_g, biased_t, weight, tau = 0, 0.0, 0.0, 0.0, 0.0
    for k in ks:
        n = replicas * k
        batch = n * micro
        block = x[start : start + batch].reshape(n, micro, -1).mean(axis=1)
        start += batch
        grads = np.concatenate(
            [np.repeat(block, d_out, axis=1), np.ones((n, d_out))], axis=1
        )  # kernel (d_in, d_out) row-major, then bias
        gbar = grads.mean(axis=0)
        mean_sq = np.mean(np.sum(grads**2, axis=1))
        gbar_sq = gbar @ gbar
        step_g = (n * gbar_sq - mean_sq) / (n - 1)
        step_t = micro * n * (mean_sq - gbar_sq) / (n - 1)
        grad_sqr = max(step_g, 0.0)
        trace = max(step_t, min_variance * base_batch)
        biased_g = decay * biased_g + (1 - decay) * grad_sqr
        biased_t = decay * biased_t + (1 - decay) * trace
        weight = decay * weight + (1 - decay)
        g, t = biased_g / weight, biased_t / weight
        scale = batch / base_batch
        gain = float(np.clip((t / base_batch + g) / (t / batch + g), 1.0, scale))
        group_a, group_b = grads[0::2].mean(axis=0), grads[1::2].mean(axis=0)
        out.append(
            {
                "batch_size": float(batch),
                "gbar": gbar,
                "grad_sqr": g,
                "trace_sigma": t,
                "gain": gain,
                "tau_before": tau,
                "progress": tau + gain,
                "estimated_similarity": _estimated_similarity(
                    grads, replicas, step_g / (step_g + 2 * step_t / batch)
                ),
                "exact_similarity": float(
                    group_a @ group_b / np.linalg.norm(group_a) / np.linalg.norm(group_b)
                ),
            }
        )
        tau += gain
    return out


def bn_model(strategy: tf.distribute.Strategy, *, dropout: bool = True) -> keras.Model:
    """A small model whose forward pass writes variables: BatchNormalization's moving
    statistics and (with `dropout`) a Dropout's seed generator (the roll-back tests'
    model)."""
    with strategy.scope():
        keras.utils.set_random_seed(0)
        head = [keras.Input((6,)), keras.layers.Dense(8)]
        head += [keras.layers.BatchNormalization(momentum=0.5), keras.layers.Activation("tanh")]
        tail = [keras.layers.Dropout(0.2, seed=3)] if dropout else []
        return keras.Sequential([*head, *tail, keras.layers.Dense(3)])


def snapshot(trainer: tf_adabatch.Trainer) -> dict[str, np.ndarray]:
    """Every variable of the model (trainable or not), the optimizer and the state."""
    engine = trainer.engine
    values = {f"model/{v.path}": np.array(v.numpy()) for v in engine.model.variables}
    values.update({f"opt/{v.path}": np.array(v.numpy()) for v in engine.optimizer.variables})
    values.update({f"state/{v.name}": np.array(v.numpy()) for v in engine.state.variables})
    values.update({f"policy/{v.name}": np.array(v.numpy()) for v in engine.policy.variables})
    return values


def assert_unchanged(before: dict[str, np.ndarray], after: dict[str, np.ndarray]) -> int:
    """Bit-identical except the skip counters and samples_seen; returns how many compared."""
    counters = ("skipped_steps", "consecutive_skips", "samples_seen")
    compared = 0
    assert set(before) == set(after)
    for name, value in before.items():
        if any(c in name for c in counters):
            continue
        np.testing.assert_array_equal(after[name], value, err_msg=name)
        compared += 1
    return compared


def changed(before: dict[str, np.ndarray], after: dict[str, np.ndarray], part: str) -> list[str]:
    return [
        n for n in before if part in n and not np.array_equal(before[n], after[n], equal_nan=True)
    ]
