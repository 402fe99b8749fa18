"""Several optimizer steps per call (`steps_per_execution`, `AdaptiveEngine.train_steps`).

What is checked, and why it must hold:
- A block of N steps runs the very same step graph N times in a `tf.while_loop`, with k
  read from its variable at every step; so N = 8 takes the same steps, the same batch
  choices and the same weights as N = 1, bit for bit (nothing is reordered).
- A progress budget ends a block after the step that reaches it, the step one call per
  step would end on.
- The host reads nothing between block ends: counted at TensorFlow's one door from a
  device tensor to Python (`_EagerTensorBase._numpy`, private; the count's own
  sanity check fails loudly if an upgrade moves it), and asserted on the traced graph
  (no Python-calling or printing op anywhere in the step or the block).
- A virtual clock prices each step of a block by its own batch.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.framework import ops as tf_ops

import tf_adabatch
from tf_adabatch import StepTimeModel, VirtualClock

from conftest import get_strategy
from helpers import mlp, regression_data

# Ops through which a graph hands control (or text) to the host.
HOST_OPS = {"PyFunc", "PyFuncStateless", "EagerPyFunc", "PrintV2", "Print"}


def _trainer(replicas: int, **options) -> tuple[tf_adabatch.Trainer, tf.data.Dataset]:
    strategy = get_strategy(replicas)
    model = mlp(strategy)
    with strategy.scope():
        schedule = keras.optimizers.schedules.CosineDecay(0.05, 400)
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(schedule), momentum=0.9)
    unit = replicas * 8
    policy = tf_adabatch.SimiGradPolicy(
        0.5, initial_batch_size=unit, min_batch_size=unit, max_batch_size=16 * unit
    )
    options = {"policy": policy, **options}
    trainer = tf_adabatch.Trainer(
        model, loss="mse", optimizer=optimizer, micro_batch_size=8, strategy=strategy, **options
    )
    x, y = regression_data(1024)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(unit, drop_remainder=True)
    return trainer, data


def _weights(trainer: tf_adabatch.Trainer) -> list[np.ndarray]:
    return [v.numpy() for v in trainer.engine.model.weights]


@pytest.mark.parametrize("replicas", [1, 2])
def test_eight_steps_per_call_take_the_steps_of_one_bit_for_bit(replicas: int) -> None:
    runs = {}
    for per_call in (1, 8):
        trainer, data = _trainer(replicas)
        history = trainer.fit(data, steps=21, verbose=0, steps_per_execution=per_call)
        runs[per_call] = (history, _weights(trainer), trainer.state.samples_seen.numpy())
    (h1, w1, s1), (h8, w8, s8) = runs[1], runs[8]
    assert len(h1["step"]) == len(h8["step"]) == 21  # 8 + 8 + 5: the last block cut short
    assert len(set(h1["batch_size"])) > 2  # the batch size did adapt
    timed = {"step_time", "examples_per_second", "progress_per_second"}
    compared = 0
    for name in h1:
        if name not in timed:
            np.testing.assert_array_equal(h8[name], h1[name], err_msg=name)  # NaN == NaN
            compared += 1
    assert compared == len(h1) - len(timed) == 15  # every logged value but the times
    assert s8 == s1
    assert all(np.array_equal(a, b) for a, b in zip(w1, w8, strict=True))


def test_a_progress_budget_ends_the_block_on_the_step_that_reaches_it() -> None:
    ends = {}
    for per_call in (1, 8):
        trainer, data = _trainer(2)
        history = trainer.fit(data, until_progress=30.0, verbose=0, steps_per_execution=per_call)
        ends[per_call] = history["progress"]
    assert ends[8] == ends[1]
    assert ends[8][-1] >= 30.0 > ends[8][-2]
    assert len(ends[8]) % 8 != 0  # the budget fell inside a block


class _HostReads:
    """Counts every copy of a device tensor's value into Python (`.numpy()`, `float()`,
    `int()`, a variable's `.numpy()` all pass through `_EagerTensorBase._numpy`)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        original = tf_ops._EagerTensorBase._numpy

        def counted(tensor: tf.Tensor) -> np.ndarray:
            self.count += 1
            return original(tensor)

        monkeypatch.setattr(tf_ops._EagerTensorBase, "_numpy", counted)


def test_the_host_reads_once_per_block_and_never_between(monkeypatch: pytest.MonkeyPatch) -> None:
    trainer, data = _trainer(2)
    iterator = iter(trainer.distribute(data))
    trainer.fit(iterator, steps=8, verbose=0, steps_per_execution=8)  # traces
    calls = []
    block_fn = trainer.engine._block_fn

    def counted_block(*args: tf.Tensor) -> tf.Tensor:
        calls.append(args)
        return block_fn(*args)

    monkeypatch.setattr(trainer.engine, "_block_fn", counted_block)
    reads = _HostReads(monkeypatch)
    float(tf.constant(1.0))  # the counter's own check: a read it must see
    assert reads.count == 1
    reads.count = 0
    history = trainer.fit(iterator, steps=32, verbose=0, steps_per_execution=8)
    assert len(history["step"]) == 32 and len(calls) == 4
    # fit's start reads the step counters (2) and the progress (1); then one per block.
    assert reads.count == 3 + 4
    reads.count = 0
    trainer.fit(iterator, steps=8, verbose=0, steps_per_execution=1)
    assert reads.count == 3 + 8  # one step per call: one read per step


def _graph_ops(concrete) -> tuple[list[str], int]:
    """Op types of a traced function and of every function in its library (the
    while-loop's body and the branches live there); and how many library functions."""
    graph_def = concrete.graph.as_graph_def()
    types = [node.op for node in graph_def.node]
    for function in graph_def.library.function:
        types.extend(node.op for node in function.node_def)
    return types, len(graph_def.library.function)


@pytest.mark.parametrize("similarity", ["exact", "estimated"])
def test_the_traced_step_and_block_hold_no_host_op(similarity: str) -> None:
    trainer, data = _trainer(2, similarity=similarity)
    iterator = iter(trainer.distribute(data))
    engine = trainer.engine
    engine.train_steps(iterator, 2)  # traces the block
    block = engine._block_fn.get_concrete_function(
        iterator,
        tf.constant(8, tf.int32),
        tf.constant(1.0, tf.float64),
        tf.constant(-1, tf.int64),
        tf.constant(-1, tf.int64),
    )
    step = engine._step_fn.get_concrete_function(iterator)
    for concrete in (block, step):
        types, functions = _graph_ops(concrete)
        assert functions > 0  # the loop body / branches were searched too
        assert types.count("AssignVariableOp") > 10  # the whole step is in there
        assert "AssignAddVariableOp" in types  # Keras SGD's update and step count
        assert not HOST_OPS & set(types), HOST_OPS & set(types)
    assert "While" in _graph_ops(block)[0] or "StatelessWhile" in _graph_ops(block)[0]


def test_the_host_op_check_sees_a_host_op() -> None:
    @tf.function
    def with_print(x: tf.Tensor) -> tf.Tensor:
        tf.cond(x > 0, lambda: tf.print("host"), lambda: tf.no_op())
        return tf.py_function(lambda v: v, [x], tf.float32)

    types, _ = _graph_ops(with_print.get_concrete_function(tf.constant(1.0)))
    assert {"PrintV2", "EagerPyFunc"} <= HOST_OPS & set(types)


def test_a_virtual_clock_prices_each_step_of_a_block_by_its_own_batch() -> None:
    model = StepTimeModel(
        compute_fixed=0.01, compute_per_example=0.001, inter_fixed=0.05, gpus_per_node=4
    )
    trainer, data = _trainer(2, clock=VirtualClock(model, devices=8, profile="test"))
    history = trainer.fit(data, steps=12, verbose=0, steps_per_execution=6)
    expected = [model.step_seconds(int(b), 8) for b in history["batch_size"]]
    assert len(set(expected)) > 1  # batches differ inside the blocks
    assert history["step_time"] == expected


def test_a_block_always_takes_its_first_step_as_one_call_would() -> None:
    """A budget already reached, or a skip limit already hit, still lets the block take
    one step (never none: a call of `train_step` always takes one), then stops."""
    trainer, data = _trainer(1)
    iterator = iter(trainer.distribute(data))
    logs = trainer.engine.train_steps(iterator, 8, until_progress=0.0)
    assert logs["step"].tolist() == [1.0]
    logs = trainer.engine.train_steps(iterator, 8, until_progress=float(logs["progress"][-1]))
    assert logs["step"].tolist() == [2.0]


def test_the_skip_limit_ends_a_block_and_raises() -> None:
    trainer, _ = _trainer(1, max_consecutive_skips=3)
    x = np.full((64, 6), np.nan, np.float32)
    y = np.zeros((64, 3), np.float32)
    bad = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(8, drop_remainder=True)
    bad_steps = iter(bad)
    with pytest.raises(tf_adabatch.NonFiniteGradientsError, match="3 optimizer steps in a row"):
        trainer.engine.train_steps(bad_steps, 8)
    assert int(trainer.state.skipped_steps.numpy()) == 3  # stopped there, not at 8
    assert int(trainer.state.steps.numpy()) == 0
    with pytest.raises(tf_adabatch.NonFiniteGradientsError, match="3 optimizer steps in a row"):
        trainer.engine.train_steps(bad_steps, 8)  # at the limit already: one step, as N = 1
    assert int(trainer.state.skipped_steps.numpy()) == 4


@pytest.mark.parametrize(
    ("argument", "value", "rule"),
    [("steps", 0, "a positive integer"), ("steps", 2.5, "a positive integer")],
)
def test_train_steps_refuses_bad_arguments_by_name(argument: str, value, rule: str) -> None:
    trainer, data = _trainer(1)
    with pytest.raises(ValueError, match=f"Argument `{argument}` must be {rule}"):
        trainer.engine.train_steps(iter(data), value)


def test_fit_refuses_a_bad_steps_per_execution_by_name() -> None:
    trainer, data = _trainer(1)
    with pytest.raises(ValueError, match="Argument `steps_per_execution` must be a positive"):
        trainer.fit(data, steps=2, verbose=0, steps_per_execution=0)
