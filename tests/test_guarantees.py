"""Documented guarantees that had no test of their own (issue 17), each derived independently.

The statistics, gain, progress, learning rate and similarity of the engine are checked
against `helpers.sum_of_outputs_closed_form` (numpy, from the formulas of
docs/algorithms.md): with `Dense` + `sum_of_outputs` every per-sample gradient is known
in closed form whatever the weights, so a whole run, batch changes included, is too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch

from conftest import get_strategy
from helpers import (
    dense_model,
    global_micro_batches,
    mlp,
    regression_data,
    sum_of_outputs,
    sum_of_outputs_closed_form,
    weights,
)

ROOT = Path(__file__).resolve().parent.parent
M = 2  # micro-batch: > 1, so that a lost factor m in tr(Sigma) shows
D_IN, D_OUT = 3, 2
DECAY = 0.5
# Base schedule in base-batch steps: 1.0 before step 2, 0.5 before step 5, then 0.1, so
# that reading it at the wrong progress changes the learning rate.
BASE = keras.optimizers.schedules.PiecewiseConstantDecay([2, 5], [0.1, 0.05, 0.01])


def closed_form_run(replicas: int, similarity: str, ks: list[int], *, collective: bool = False):
    strategy = get_strategy(replicas, collective=collective)
    model = dense_model(strategy, D_IN, D_OUT)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(tf_adabatch.AdaptiveLearningRate(BASE))
    w0 = [v.numpy().astype(np.float64) for v in model.trainable_variables]
    trainer = tf_adabatch.Trainer(
        model,
        loss=sum_of_outputs,
        optimizer=optimizer,
        micro_batch_size=M,
        base_batch_size=replicas * M,  # B0 = one micro-step: S = k
        policy=tf_adabatch.StaticPolicy(replicas * M * ks[0]),
        similarity=similarity,
        ema_decay=DECAY,
        strategy=strategy,
    )
    rng = np.random.default_rng(17)
    x = rng.normal(size=(replicas * M * sum(ks), D_IN)).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, np.zeros((len(x), D_OUT), np.float32)))
    iterator = iter(trainer.distribute(data.batch(replicas * M, drop_remainder=True)))
    logs = []
    for k in ks:
        trainer.set_batch_size(replicas * M * k)
        logs.append({name: float(v) for name, v in trainer.engine.train_step(iterator).items()})
    expected = sum_of_outputs_closed_form(
        x, ks, replicas=replicas, micro=M, base_batch=replicas * M, d_out=D_OUT, decay=DECAY
    )
    return trainer, logs, expected, w0


@pytest.mark.parametrize(
    "replicas,similarity,collective",
    [
        (2, "estimated", False),
        (4, "estimated", True),
        (3, "exact", False),
        (4, "exact", True),
        (1, "exact", False),
    ],
)
def test_statistics_gain_progress_lr_and_similarity_equal_the_closed_form(
    replicas: int, similarity: str, collective: bool
) -> None:
    """B != B0 at every step but the k = 1 ones (S = k), so the gain is not clamped to 1;
    3 replicas in exact mode go 2 -> 1 -> 3 -> 1 micro-steps (the odd-replica slots, with
    one micro-step a replica writes only one of them); 4 replicas use the collective
    all-reduce. The weights equal w0 - sum_t lr_t gbar_t (plain SGD), a one-device
    reference in numpy."""
    ks = [2, 3, 2, 4] if replicas == 1 else [2, 1, 3, 1]
    trainer, logs, expected, w0 = closed_form_run(replicas, similarity, ks, collective=collective)
    b0 = replicas * M
    assert any(e["gain"] > 1.2 for e in expected)  # the gain is informative
    update = np.zeros(D_IN * D_OUT + D_OUT)
    for t, (log, e) in enumerate(zip(logs, expected, strict=True)):
        assert log["batch_size"] == e["batch_size"], t
        assert log["grad_sqr"] == pytest.approx(e["grad_sqr"], rel=1e-5), t
        assert log["grad_var"] * b0 == pytest.approx(e["trace_sigma"], rel=1e-5), t
        assert log["gain"] == pytest.approx(e["gain"], rel=1e-5), t
        assert log["progress"] == pytest.approx(e["progress"], rel=1e-5), t
        lr = e["gain"] * float(BASE(np.floor(e["tau_before"])))
        assert log["learning_rate"] == pytest.approx(lr, rel=1e-5), t
        key = "exact_similarity" if similarity == "exact" else "estimated_similarity"
        assert log["similarity"] == pytest.approx(e[key], rel=1e-5, abs=1e-6), t
        update += lr * e["gbar"]
    kernel, bias = w0
    np.testing.assert_allclose(
        trainer.engine.model.trainable_variables[0].numpy(),
        kernel - update[: D_IN * D_OUT].reshape(D_IN, D_OUT),
        rtol=1e-5,
        atol=1e-6,
    )
    np.testing.assert_allclose(
        trainer.engine.model.trainable_variables[1].numpy(),
        bias - update[D_IN * D_OUT :],
        rtol=1e-5,
        atol=1e-6,
    )


def smoothed_simigrad(replicas: int) -> tf_adabatch.SimiGradPolicy:
    unit = replicas * 4
    return tf_adabatch.SimiGradPolicy(
        0.6,
        initial_batch_size=2 * unit,
        min_batch_size=unit,
        max_batch_size=16 * unit,
        smoothing=0.5,
    )


# The 4-replica case runs on the session's collective strategy (the default all-reduce).
@pytest.mark.parametrize("replicas,collective", [(2, False), (4, True)])
def test_a_skipped_step_under_smoothed_simigrad_changes_neither_batch_nor_policy_state(
    replicas: int, collective: bool
) -> None:
    strategy = get_strategy(replicas, collective=collective)
    x, y = regression_data(replicas * 4 * 16 * 4, seed=5)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05, momentum=0.9)
    policy = smoothed_simigrad(replicas)
    trainer = tf_adabatch.Trainer(
        model, loss="mse", optimizer=optimizer, micro_batch_size=4, policy=policy, strategy=strategy
    )
    engine = trainer.engine
    iterator = iter(trainer.distribute(global_micro_batches(x, y, replicas * 4)))
    for _ in range(2):
        assert float(engine.train_step(iterator)["applied"]) == 1.0
    policy_before = [float(v.numpy()) for v in policy.variables]
    state_before = [float(v.numpy()) for v in engine.state.variables]
    batch_before = engine.batch_size
    # The policy state is not trivial: two measurements went into the smoothed similarity.
    assert len(policy_before) == 2 and all(v != 0.0 for v in policy_before)

    # Poison the next step: one NaN target in its first micro-batch.
    poisoned = tf.data.Dataset.from_tensor_slices(
        (x[: replicas * 4], np.full_like(y[: replicas * 4], np.nan))
    ).batch(replicas * 4, drop_remainder=True)
    bad = iter(trainer.distribute(poisoned.concatenate(global_micro_batches(x, y, replicas * 4))))
    logs = engine.train_step(bad)
    assert float(logs["applied"]) == 0.0
    assert [float(v.numpy()) for v in policy.variables] == policy_before
    assert engine.batch_size == batch_before
    after = {v.name: float(v.numpy()) for v in engine.state.variables}
    for v, before in zip(engine.state.variables, state_before, strict=True):
        if "skipped" in v.name or "consecutive" in v.name or "samples_seen" in v.name:
            continue
        assert after[v.name] == before or (np.isnan(before) and np.isnan(after[v.name])), v.name
    assert int(engine.state.skipped_steps.numpy()) == 1
    assert int(engine.state.consecutive_skips.numpy()) == 1
    # And the next good step moves the policy again.
    assert float(engine.train_step(iterator)["applied"]) == 1.0
    assert [float(v.numpy()) for v in policy.variables] != policy_before


@pytest.mark.parametrize("replicas,collective", [(2, False), (4, True)])
def test_weight_regularizers_stay_out_of_the_statistics_and_the_similarity(
    replicas: int, collective: bool
) -> None:
    """Same model, data and seed with and without an L2 kernel regularizer (lambda = 0.01),
    one step of plain SGD (lr 0.1) in exact mode: the statistics and the similarity are
    those of the data loss alone; the kernel differs by exactly lr * 2 lambda w0 (the
    regularizer's gradient, applied once per step)."""
    lam, lr = 0.01, 0.1
    strategy = get_strategy(replicas, collective=collective)
    x, y = regression_data(replicas * 4 * 3, seed=9)
    runs = []
    for regularizer in (None, keras.regularizers.L2(lam)):
        model = mlp(strategy, kernel_regularizer=regularizer)
        w0 = weights(model)
        with strategy.scope():
            optimizer = keras.optimizers.SGD(lr)
        trainer = tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=optimizer,
            micro_batch_size=4,
            base_batch_size=replicas * 4,
            policy=tf_adabatch.StaticPolicy(replicas * 4 * 3),
            similarity="exact",
            strategy=strategy,
        )
        history = trainer.fit(global_micro_batches(x, y, replicas * 4), steps=1, verbose=0)
        runs.append((history, w0, weights(model)))
    (plain, w0, w_plain), (regularized, w0_reg, w_reg) = runs
    for a, b in zip(w0, w0_reg, strict=True):
        np.testing.assert_array_equal(a, b)
    for name in ("grad_sqr", "grad_var", "similarity", "gain", "loss"):
        assert regularized[name][0] == pytest.approx(plain[name][0], rel=1e-6), name
    for index in (0, 2):  # the two kernels
        np.testing.assert_allclose(
            w_reg[index], w_plain[index] - lr * 2 * lam * w0[index], rtol=1e-5, atol=1e-7
        )
    for index in (1, 3):  # the biases have no regularizer
        np.testing.assert_allclose(w_reg[index], w_plain[index], rtol=1e-6, atol=1e-7)
    assert not np.allclose(w_reg[0], w_plain[0], rtol=0, atol=1e-6)  # the regularizer acted


def attached(policy: tf_adabatch.BatchPolicy):
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    engine = tf_adabatch.attach(model, micro_batch_size=4, policy=policy)
    return model, engine


def test_a_keras_save_of_another_policys_state_is_refused(tmp_path) -> None:
    x, y = regression_data(512)
    model, engine = attached(smoothed_simigrad(2))
    model.fit(global_micro_batches(x, y, 8).repeat(), epochs=1, steps_per_epoch=3, verbose=0)
    assert all(float(v.numpy()) != 0.0 for v in engine.policy.variables)
    path = str(tmp_path / "simigrad.weights.h5")
    model.save_weights(path)
    static, _ = attached(tf_adabatch.StaticPolicy(16))
    with pytest.raises(
        ValueError, match=r"does not fit this engine and policy.*unexpected.*similarity"
    ):
        static.load_weights(path)
    # The same policy type loads it, policy state included.
    same, same_engine = attached(smoothed_simigrad(2))
    same.load_weights(path)
    np.testing.assert_array_equal(
        [v.numpy() for v in same_engine.policy.variables],
        [v.numpy() for v in engine.policy.variables],
    )


def test_the_trainer_checkpoint_holds_the_policy_state(tmp_path) -> None:
    strategy = get_strategy(2)
    x, y = regression_data(1024)
    data = global_micro_batches(x, y, 8).repeat()
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.05)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=4,
        policy=smoothed_simigrad(2),
        strategy=strategy,
    )
    trainer.fit(data, steps=3, verbose=0)
    saved = [float(v.numpy()) for v in trainer.engine.policy.variables]
    assert all(v != 0.0 for v in saved)  # not the initial zeros
    path = trainer.checkpoint.save(str(tmp_path / "ckpt"))
    trainer.fit(data, steps=2, verbose=0)
    assert [float(v.numpy()) for v in trainer.engine.policy.variables] != saved
    trainer.checkpoint.read(path).assert_consumed()
    assert [float(v.numpy()) for v in trainer.engine.policy.variables] == saved


def test_train_py_exits_3_on_a_diverging_run(tmp_path) -> None:
    """Learning rate 1e6 makes every gradient overflow after a few steps (as in
    tests/test_reliability.py, there in-process); the script prints one error line and
    exits with code 3."""
    flags = [
        "--config.strategy=one_device",
        "--config.policy.kind=static",
        "--config.lr.rule=none",
        "--config.optimizer.learning_rate=1e6",
        "--config.train.max_consecutive_skips=3",
    ]
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={tmp_path}",
        *flags,
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert result.returncode == 3, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: 3 optimizer steps in a row had non-finite gradients"), last


def test_a_keras_save_carries_the_adaptive_state(tmp_path) -> None:
    """`model.save` (the .keras archive), not only `save_weights`, holds the state."""
    x, y = regression_data(512)
    model, engine = attached(smoothed_simigrad(2))
    model.fit(global_micro_batches(x, y, 8).repeat(), epochs=1, steps_per_epoch=3, verbose=0)
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored, restored_engine = attached(smoothed_simigrad(2))
    restored.load_weights(path)
    expected = [float(v.numpy()) for v in (*engine.state.variables, *engine.policy.variables)]
    got = [
        float(v.numpy())
        for v in (*restored_engine.state.variables, *restored_engine.policy.variables)
    ]
    assert int(engine.state.steps.numpy()) == 3 and all(
        v != 0.0 for v in expected[-2:]
    )  # steps taken, policy state not trivial
    np.testing.assert_array_equal(got, expected)


WORKER = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import tensorflow as tf
from tf_adabatch.app import workers
strategy = tf.distribute.MultiWorkerMirroredStrategy()
step = 10 + 5 * json.loads(os.environ["TF_CONFIG"])["task"]["index"]  # 10 and 15
try:
    workers.check_same_checkpoint(strategy, step)
except workers.WorkerLostError as err:
    print(err)
    sys.exit(4)
"""


def test_workers_that_restored_different_checkpoints_stop_with_worker_lost_error(tmp_path) -> None:
    """Two real workers (MultiWorkerMirroredStrategy on 127.0.0.1) report steps 10 and 15:
    both must refuse to train, naming the rule (the check `tf_adabatch.app.run` makes after a
    restore)."""
    from launch.multiworker import free_ports

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ports = free_ports(2)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(2):
        env = dict(os.environ)
        env["TF_CONFIG"] = json.dumps(
            {"cluster": cluster, "task": {"type": "worker", "index": index}}
        )
        env["PYTHONPATH"] = str(ROOT)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=180)
            outputs.append((proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    for index, (code, out) in enumerate(outputs):
        assert code == 4, f"worker {index}: exit {code}\n{out[-2000:]}"
        assert (
            f"The workers restored different checkpoints (this one: step {10 + 5 * index}, mean 12.5)"
            in out
        )
