"""Preemption: SIGTERM -> a checkpoint at an optimizer-step boundary -> exit 143 -> exact resume.

`launch/train.py` on the synthetic config (SimiGrad + AdaScale, `deterministic=True`),
signalled once its first periodic checkpoint has files. One process saves at the
boundary of the step the signal arrived in, so the checkpoint's step s is at least the
newest periodic checkpoint's at signal time (equal when the signal came during that
periodic save, CI on 2026-12-04). The rerun of the same command must resume from ckpt-s and end where an
uninterrupted run ends: every variable of the final checkpoint (1e-6), the batch-size
and gain sequences, the final metrics. Two workers (SIGTERM to the non-chief only; both
save at the same step and exit 143): tests/test_multiworker.py, which shares its
uninterrupted two-worker run with the killed-worker test.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import tensorflow as tf

from configs import synthetic
from tf_adabatch import app
from tf_adabatch.app.checkpoints import checkpoint_numbers
from tf_adabatch.app.loop import CheckpointEvery
from tf_adabatch.app.preemption import Preempted, PreemptionWatch

from launcher import assert_same_end, signal_after_first_checkpoint, start, wait

FLAGS = (
    "--config.deterministic=True",
    "--config.train.base_epochs=1.0",  # 26 optimizer steps
    "--config.train.checkpoint_every_steps=2",
)


def test_sigterm_saves_at_the_next_step_boundary_exits_143_and_the_rerun_is_exact(
    tmp_path: Path,
) -> None:
    code, err, _ = wait(start(tmp_path / "full", *FLAGS))
    assert code == 0, err[-3000:]

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = start(run, *FLAGS)
    at_signal = signal_after_first_checkpoint(proc, ckpts)
    code, err, _ = wait(proc)
    assert code == 143, err[-3000:]
    saved = checkpoint_numbers(str(ckpts))[0]
    # Signalled once ckpt-`at_signal` had files: the save is at the boundary of the step
    # the signal arrived in, never an earlier one. That is step `at_signal` itself when
    # the signal came while its periodic save was being written (the boundary's check
    # follows the save; no second save then), else a later step.
    assert saved >= at_signal >= 2, (saved, at_signal)
    assert json.loads((tmp_path / "full" / "metrics.json").read_text())["optimizer_steps"] > saved
    lines = [line for line in err.splitlines() if line.startswith("preempted:")]
    assert lines == [
        f"preempted: checkpoint ckpt-{saved} written at step {saved}; "
        "rerun the same command to resume"
    ], err[-3000:]
    assert "Traceback" not in err
    assert not (run / "metrics.json").exists()  # stopped before the end

    code, err, out = wait(start(run, *FLAGS))
    assert code == 0, err[-3000:]
    assert f"Resumed from {ckpts / f'ckpt-{saved}'}:" in out, out[-2000:]
    # Periodic saves every 2 steps: the preemption's save is an extra one at an odd step.
    assert_same_end(tmp_path / "full", run, extra_saves=saved % 2)


def test_without_train_preemption_sigterm_kills_as_before(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start(run, *FLAGS, "--config.train.preemption=False")
    signal_after_first_checkpoint(proc, run / "checkpoints")
    code, err, _ = wait(proc)
    assert code == -signal.SIGTERM, err[-3000:]
    assert "preempted:" not in err


@pytest.mark.parametrize("skipping", [True, False])
def test_checkpoint_action_saves_once_at_the_agreed_step(tmp_path: Path, skipping: bool) -> None:
    """In process: SIGTERM to this process, steps of 20 ms through `CheckpointEvery`.

    skipping: every step is a skipped one (no periodic save): the preemption saves anyway.
    Else a periodic save every step: the preemption's save is not a second one.
    """
    before = signal.getsignal(signal.SIGTERM)
    v = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(v=v)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=100)
    watch = PreemptionWatch()
    try:
        watch.start(tf.distribute.get_strategy(), manager)
        action = CheckpointEvery(manager, every=1, restored_step=0, preemption=watch)
        os.kill(os.getpid(), signal.SIGTERM)
        assert watch.signalled
        with pytest.raises(Preempted) as info:
            for step in range(1, 500):
                time.sleep(0.02)
                v.assign(float(step))  # the "training"
                logs = {"step": step, "consecutive_skips": float(skipping)}
                action.on_train_batch_end(step - 1, logs)
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGTERM) is before  # restored
    saved = info.value.step
    # One worker: the signal came before step 1, so step 1's boundary is the first after
    # it (no polling delay; TensorFlow's handler is for agreeing between workers).
    assert saved == step == 1
    assert info.value.checkpoint == os.path.join(str(tmp_path), f"ckpt-{saved}")
    assert checkpoint_numbers(str(tmp_path)) == ([saved] if skipping else list(range(saved, 0, -1)))
    assert tf.train.load_checkpoint(info.value.checkpoint).get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE"
    ) == float(saved)
    assert int(checkpoint.save_counter) == (1 if skipping else saved)  # one save per step


def test_preemption_outside_the_main_thread_is_a_config_error(tmp_path: Path) -> None:
    config = synthetic.get_config()
    raised: list[BaseException] = []

    def target() -> None:
        try:
            app.run(config, str(tmp_path), verbose=0)
        except BaseException as err:  # handed to the main thread
            raised.append(err)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert len(raised) == 1
    with pytest.raises(app.ConfigError, match=r"`train.preemption` must be False .* main thread"):
        raise raised[0]
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_a_sigterm_while_the_run_starts_is_kept_and_saves_at_the_first_step(tmp_path) -> None:
    """A SIGTERM after the handler is installed but before the checkpoint manager exists
    (the run is still loading data, building the model) must not be forgotten: once the
    watch starts, the first step boundary saves ckpt-1 and raises Preempted (exit 143)."""
    watch = PreemptionWatch()
    try:
        _sigterm(watch)
        assert watch.signalled
        v = tf.Variable(1.0)
        manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(tmp_path), 2)
        watch.start(tf.distribute.get_strategy(), manager)
        with pytest.raises(Preempted) as preempted:
            watch.after_step(1)
        assert preempted.value.step == 1 and preempted.value.exit_code == 143
        assert checkpoint_numbers(str(tmp_path)) == [1]
    finally:
        watch.close()


def _sigterm(watch: PreemptionWatch) -> None:
    """Sends this process SIGTERM and waits (at most 10 s) until `watch` has seen it."""
    os.kill(os.getpid(), signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not watch.signalled and time.monotonic() < deadline:
        time.sleep(0.01)  # Python runs the handler between bytecodes of the main thread


@pytest.mark.parametrize(("signal_at", "block", "saved"), [(2, 1, 2), (3, 1, 3), (4, 3, 6)])
def test_a_signal_at_a_scripted_step_saves_at_the_next_boundary_only(
    tmp_path: Path, signal_at: int, block: int, saved: int
) -> None:
    """The signal is sent during step `signal_at` (scripted, no timing): the save comes at
    that step's boundary, not at a periodic save (every 5 steps) nor at any other step.
    With blocks of 3 steps (`train.steps_per_execution=3`) the loop's actions are told of
    steps 3, 6, 9 only: a signal during step 4 saves at 6, the end of its block (where
    the periodic save also falls: one checkpoint). Expected by hand: ckpt-`saved` only,
    holding that step's value."""
    v = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(v=v)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=100)
    watch = PreemptionWatch()
    told = []
    try:
        watch.start(tf.distribute.get_strategy(), manager)
        action = CheckpointEvery(manager, every=5, restored_step=0, preemption=watch)
        with pytest.raises(Preempted) as info:
            for step in range(1, 10):
                v.assign(float(step))
                if step == signal_at:
                    _sigterm(watch)
                if step % block == 0:  # a block's end
                    told.append(step)
                    action.on_train_batch_end(step - 1, {"step": step, "consecutive_skips": 0.0})
    finally:
        watch.close()
    assert told == list(range(block, saved + 1, block))
    assert info.value.step == saved
    assert checkpoint_numbers(str(tmp_path)) == [saved]
    value = tf.train.load_checkpoint(info.value.checkpoint).get_tensor(
        "v/.ATTRIBUTES/VARIABLE_VALUE"
    )
    assert value == float(saved)
