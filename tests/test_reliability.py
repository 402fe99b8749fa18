"""Reliability: exact resume after SIGKILL at a random micro-step, and a run that keeps
producing non-finite gradients stops with a clear error and an intact last checkpoint.

(Non-finite skipping itself: tests/test_engine_equivalence.py; loss-scale overflow:
tests/test_mixed_precision.py; model.fit with BackupAndRestore: tests/test_fit.py;
multi-worker faults: tests/test_multiworker.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tf_adabatch
from configs import synthetic
from tf_adabatch import app, summaries

from helpers import checkpoint_values

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300
# SimiGrad + AdaScale on the synthetic task, 2 replicas x micro-batch 16, bit-exact ops.
OVERRIDES = {
    "deterministic": True,
    "train.base_epochs": 1.0,
    "train.checkpoint_every_steps": 5,
    "train.eval_every_base_epochs": 0.5,
    "policy.target_similarity": 0.3,
    # Smoothing on, so that the policy has a state of its own for the resume to restore.
    "policy.smoothing": 0.5,
}


def worker(workdir: Path, kill_at: int = 0) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "resume_worker.py"),
        str(ROOT / "configs" / "synthetic.py"),
        str(workdir),
        str(kill_at),
        json.dumps(OVERRIDES),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)


def test_sigkill_at_a_random_micro_step_then_rerun_equals_an_uninterrupted_run(
    tmp_path: Path,
) -> None:
    full = worker(tmp_path / "full")
    assert full.returncode == 0, full.stderr[-3000:]
    metrics = json.loads((tmp_path / "full" / "metrics.json").read_text())
    micro_batches = metrics["examples_seen"] // 16
    # A micro-step drawn at random (fixed seed) after the first checkpoint (step 5 uses
    # at most 2 x (1 + ... + 5) = 30 micro-batches) and before the end.
    kill_at = int(np.random.default_rng(20261202).integers(60, int(0.8 * micro_batches)))

    killed = worker(tmp_path / "resumed", kill_at)
    assert killed.returncode == -9, f"not killed (micro-batch {kill_at}): {killed.stderr[-2000:]}"
    saved = tf.train.latest_checkpoint(str(tmp_path / "resumed" / "checkpoints"))
    assert saved is not None, "killed before its first checkpoint"
    resumed = worker(tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"Resumed from {saved}" in resumed.stdout

    # Same final weights, optimizer slots, adaptive state and policy state.
    expected, got = checkpoint_values(tmp_path / "full"), checkpoint_values(tmp_path / "resumed")
    assert set(got) == set(expected)
    # The policy state is part of what is compared, and not its initial zeros.
    policy = [name for name in expected if name.startswith("policy/")]
    assert len(policy) == 2 and all(expected[name] != 0.0 for name in policy), policy
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    # Identical batch-size and gain sequences, step by step (the steps the killed run
    # logged after its last checkpoint were redone and logged again; the later wins).
    full_tb = summaries.read_scalars(str(tmp_path / "full" / "tensorboard" / "train"))
    resumed_tb = summaries.read_scalars(str(tmp_path / "resumed" / "tensorboard" / "train"))
    for tag in ("adabatch/batch_size", "adabatch/gain", "adabatch/progress"):
        assert resumed_tb[tag] == full_tb[tag], tag
    assert len({b for _, b in full_tb["adabatch/batch_size"]}) > 1  # the batch adapted
    resumed_metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    for key in ("optimizer_steps", "examples_seen", "test_accuracy", "test_loss"):
        assert resumed_metrics[key] == metrics[key], key


def test_a_diverging_run_stops_with_a_clear_error_and_keeps_its_last_good_checkpoint(
    tmp_path: Path,
) -> None:
    """Learning rate 1e6: after a few steps the weights are so large that every gradient
    overflows; the run stops after `max_consecutive_skips` skipped steps in a row. No
    checkpoint was written while skipping: the last one written holds the last applied
    step, every value finite. The loss exploded right after it, so it is set aside
    (renamed `ckpt-N.diverged-*`, kept) and none is left to resume from
    (tests/test_workdir.py: the rerun)."""
    config = synthetic.get_config()
    config.strategy = "one_device"
    config.policy.kind = "static"
    config.lr.rule = "none"
    config.optimizer.learning_rate = 1e6
    config.train.checkpoint_every_steps = 1
    config.train.max_consecutive_skips = 3
    with pytest.raises(tf_adabatch.NonFiniteGradientsError, match="3 optimizer steps in a row"):
        app.run(config, str(tmp_path), verbose=0)
    ckpts = tmp_path / "checkpoints"
    assert tf.train.latest_checkpoint(str(ckpts)) is None
    (index,) = ckpts.glob("ckpt-*.diverged-*.index")
    latest = str(index)[: -len(".index")]
    reader = tf.train.load_checkpoint(latest)
    values = {
        name: reader.get_tensor(name)
        for name in reader.get_variable_to_shape_map()
        if name != "_CHECKPOINTABLE_OBJECT_GRAPH" and not name.startswith("run/")
    }
    state = {name.split("/")[1]: v for name, v in values.items() if name.startswith("adabatch/")}
    applied = int(state["steps"])
    assert applied >= 1 and index.name.startswith(f"ckpt-{applied}.")
    assert int(state["skipped_steps"]) == 0 and int(state["consecutive_skips"]) == 0
    # The checkpoint stores each trainable weight once, under the optimizer
    # (`optimizer/_trainable_variables/<i>/...`), and the optimizer's own variables
    # (iterations, learning rate, momentum slots if any) under `optimizer/_variables/`.
    weights = [n for n in values if n.startswith("optimizer/_trainable_variables/")]
    optimizer_vars = [n for n in values if n.startswith("optimizer/_variables/")]
    assert len(weights) == 4, sorted(values)  # the MLP: two kernels, two biases
    assert optimizer_vars, sorted(values)
    for name in weights + optimizer_vars:
        assert np.all(np.isfinite(values[name])), name
    assert not (tmp_path / "metrics.json").exists()
