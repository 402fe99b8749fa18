"""The statistics' float64 scalars ride in the gradient all-reduce (issue 16: one collective
per optimizer step), as float32 limbs (`measure.split_float64`).

Claims checked here: a float32 sum over N replicas of the limbs gives back the float64 sum
to about 1e-12 for values of similar size and to 1e-10 while they are within a factor of
2**(15 - log2 N) of each other, degrading to float32's precision (not worse) beyond; non-finite values stay non-finite; the
engine's step has one collective per replica; the all-reduce itself (a real collective)
sums the scalars to float64 precision.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from tf_adabatch.measure import all_reduce_with_scalars, join_float64, split_float64

from conftest import get_strategy


def float32_ring_sum(rows: np.ndarray) -> np.ndarray:
    """What a float32 all-reduce does to the limbs: sums rounded to float32 at each add."""
    acc = rows[0].astype(np.float32)
    for row in rows[1:]:
        acc = (acc + row.astype(np.float32)).astype(np.float32)
    return acc


def worst_relative_error(
    replicas: int, spread_bits: float, *, seed: int = 0
) -> tuple[float, float]:
    """(limbs, plain float32) worst relative error of the sum of 5 scalars over `replicas`
    replicas whose values differ by up to 2**spread_bits, over 40 random draws."""
    rng = np.random.default_rng(seed)
    worst_limbs = worst_plain = 0.0
    for _ in range(40):
        scale = 2.0 ** rng.integers(-40, 40)
        x = rng.uniform(0.5, 1.0, (replicas, 5)) * 2.0 ** rng.uniform(0, spread_bits, (replicas, 5))
        x *= scale
        want = x.sum(axis=0)  # float64
        limbs = np.stack([split_float64(tf.constant(row)).numpy() for row in x])
        got = join_float64(tf.constant(float32_ring_sum(limbs))).numpy()
        plain = float32_ring_sum(x).astype(np.float64)
        worst_limbs = max(worst_limbs, float(np.max(np.abs(got - want) / np.abs(want))))
        worst_plain = max(worst_plain, float(np.max(np.abs(plain - want) / np.abs(want))))
    return worst_limbs, worst_plain


@pytest.mark.parametrize("replicas", [2, 4, 8])
def test_limbs_of_similar_values_sum_to_float64_precision(replicas: int) -> None:
    limbs, plain = worst_relative_error(replicas, spread_bits=1.0)
    assert limbs < 1e-12
    assert plain > 1e-9  # float32 alone would not do (the comparison can fail)


@pytest.mark.parametrize("replicas", [2, 4, 8, 64])
def test_limbs_within_the_documented_spread_sum_to_1e_10(replicas: int) -> None:
    # The head limbs (8 bits each) add exactly in float32's 24 bits while the replicas'
    # exponents differ by at most 24 - 8 - 1 - log2(N) bits (the 1: the sum's carry).
    limbs, plain = worst_relative_error(replicas, spread_bits=15 - np.log2(replicas))
    assert limbs < 2e-10
    assert plain > 100 * limbs


def test_a_wider_spread_degrades_to_float32_precision_not_worse() -> None:
    limbs, plain = worst_relative_error(8, spread_bits=20.0)
    assert limbs <= 2.0 * max(plain, 2.0**-24)


def test_non_finite_values_stay_non_finite() -> None:
    x = tf.constant([np.nan, np.inf, -np.inf, 1.0, 0.0], tf.float64)
    back = join_float64(split_float64(x)).numpy()
    assert not np.isfinite(back[:3]).any()
    assert back[3] == 1.0 and back[4] == 0.0
    # Above float32's range the value becomes inf (the step counts as non-finite).
    assert not np.isfinite(join_float64(split_float64(tf.constant([1e39], tf.float64))).numpy()[0])


def collectives(graph: tf.Graph) -> int:
    """CollectiveReduceV2 ops in a graph and in the functions it calls."""
    count = sum(op.type == "CollectiveReduceV2" for op in graph.get_operations())
    for function in graph._functions.values():  # while-loop bodies, conds
        count += sum(node.op == "CollectiveReduceV2" for node in function.definition.node_def)
    return count


def test_the_all_reduce_sums_gradients_and_scalars_in_one_collective() -> None:
    strategy = get_strategy(4, collective=True)
    magnitudes = [1.0, 30.0, 0.25, 200.0]  # within 2**10 of each other (the limit: 2**13)

    def replica_fn() -> tuple[list[tf.Tensor], tf.Tensor]:
        ctx = tf.distribute.get_replica_context()
        r = tf.cast(ctx.replica_id_in_sync_group, tf.float64)
        scale = tf.gather(tf.constant(magnitudes, tf.float64), tf.cast(r, tf.int32))
        scalars = tf.stack([scale / 3.0, scale * (1.0 + 2.0**-40), r + 1.0])
        grads = [tf.fill([5], tf.cast(r, tf.float32)), tf.ones([2, 3])]
        return all_reduce_with_scalars(ctx, grads, scalars)

    @tf.function
    def step() -> tuple[list[tf.Tensor], tf.Tensor]:
        reduced, scalars = strategy.run(replica_fn)
        return (
            [strategy.experimental_local_results(t)[0] for t in reduced],
            strategy.experimental_local_results(scalars)[0],
        )

    reduced, scalars = step()
    m = np.array(magnitudes)
    want = np.array([np.sum(m / 3.0), np.sum(m * (1.0 + 2.0**-40)), 10.0])
    np.testing.assert_allclose(scalars.numpy(), want, rtol=1e-11)
    assert not np.allclose(np.float32(want[0]), want[0], rtol=1e-11, atol=0)  # float32 would fail
    np.testing.assert_array_equal(reduced[0].numpy(), np.full(5, 6.0, np.float32))
    np.testing.assert_array_equal(reduced[1].numpy(), np.full((2, 3), 4.0, np.float32))
    graph = step.get_concrete_function().graph
    assert collectives(graph) == 4  # one per replica: gradients and scalars together


def test_an_engine_step_has_one_collective_per_replica() -> None:
    strategy = get_strategy(4, collective=True)
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.SGD(0.1)
    counts = {}
    for similarity in ("estimated", "exact"):
        trainer = tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=optimizer,
            micro_batch_size=2,
            similarity=similarity,
            strategy=strategy,
        )
        x = np.ones((64, 3), np.float32)
        data = tf.data.Dataset.from_tensor_slices((x, np.zeros((64, 2), np.float32))).batch(
            8, drop_remainder=True
        )
        trainer.fit(data.repeat(), steps=1, verbose=0)
        graph = trainer.engine._step_fn.get_concrete_function(
            iter(trainer.distribute(data.repeat()))
        ).graph
        counts[similarity] = collectives(graph)
    assert counts == {"estimated": 4, "exact": 4}
