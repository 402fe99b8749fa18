"""Preemption: SIGTERM -> a checkpoint at an optimizer-step boundary -> exit 143 -> exact resume.

`launch/train.py` on the synthetic config (SimiGrad + AdaScale, `deterministic=True`),
signalled once its first periodic checkpoint exists (step 2 finished, so the signal
arrives in a later step). TensorFlow's `PreemptionCheckpointHandler` agrees on "the step
after the one that saw the signal", so the checkpoint's step s must exceed the newest
periodic checkpoint's at signal time. The rerun of the same command must resume from
ckpt-s and end where an uninterrupted run ends: every variable of the final checkpoint
(1e-6), the batch-size and gain sequences, the final metrics. Multi-worker: SIGTERM to
the non-chief worker only; both workers save at the same step and exit 143.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from test_multiworker import finish, start_workers

from configs import synthetic
from launch.multiworker import free_ports
from tf_adabatch import app, summaries
from tf_adabatch.app.checkpoints import checkpoint_numbers
from tf_adabatch.app.loop import CheckpointEvery
from tf_adabatch.app.preemption import Preempted, PreemptionWatch

from helpers import checkpoint_values

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 240
FLAGS = (
    "--config.deterministic=True",
    "--config.train.base_epochs=1.0",  # 26 optimizer steps
    "--config.train.checkpoint_every_steps=2",
)

# Multi-worker: 26 steps, a checkpoint every 2. With 13 steps the run once ended (exit 0)
# before the handler's 1 s polling and agreement step took effect (CI, 2026-12-03).
TINY = ("--config.train.base_epochs=1.0", "--config.train.checkpoint_every_steps=2")


def start(workdir: Path, *extra: str) -> subprocess.Popen:
    """launch/train.py on the synthetic config, 2 mirrored replicas; output to files."""
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={workdir}",
        *FLAGS,
        *extra,
    ]
    paths = (workdir.parent / f"{workdir.name}.out", workdir.parent / f"{workdir.name}.err")
    with open(paths[0], "w") as out, open(paths[1], "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=ROOT)
    proc.logs = paths  # type: ignore[attr-defined]
    return proc


def signal_after_first_checkpoint(proc: subprocess.Popen, ckpts: Path) -> int:
    """SIGTERM once `ckpts` has a checkpoint; returns the newest step saved at that time."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (numbers := checkpoint_numbers(str(ckpts))):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    return numbers[0]


def wait(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, proc.logs[1].read_text(), proc.logs[0].read_text()  # type: ignore[attr-defined]


def assert_same_end(
    full: Path, run: Path, *, preempted_at: int, every: int, workers: tuple[Path, ...] = ()
) -> None:
    """`run` ended as the uninterrupted `full`: final checkpoint, batch and gain per step, metrics.

    `preempted_at`: the preemption checkpoint's step; `every`: the periodic saves' interval.
    """
    expected, got = checkpoint_values(full), checkpoint_values(run)
    assert set(got) == set(expected)
    # `save_counter` counts saves, not training: the preemption's save is one more,
    # unless a periodic save had just saved that step.
    counter = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
    assert got.pop(counter) == expected.pop(counter) + (1 if preempted_at % every else 0)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    full_tb = summaries.read_scalars(str(full / "tensorboard" / "train"))
    run_tb = summaries.read_scalars(str(run / "tensorboard" / "train"))
    for tag in ("adabatch/batch_size", "adabatch/gain"):
        assert run_tb[tag] == full_tb[tag], tag
    full_metrics = json.loads((full / "metrics.json").read_text())
    for outdir in (run, *workers):
        metrics = json.loads((outdir / "metrics.json").read_text())
        assert metrics == {
            **full_metrics,
            "wall_time_s": metrics["wall_time_s"],  # timings differ run to run
            "train_seconds": metrics["train_seconds"],
        }


def test_sigterm_saves_at_the_next_step_boundary_exits_143_and_the_rerun_is_exact(
    tmp_path: Path,
) -> None:
    code, err, _ = wait(start(tmp_path / "full"))
    assert code == 0, err[-3000:]

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = start(run)
    at_signal = signal_after_first_checkpoint(proc, ckpts)
    code, err, _ = wait(proc)
    assert code == 143, err[-3000:]
    saved = checkpoint_numbers(str(ckpts))[0]
    # Signalled after step `at_signal` was saved: the step that was running is a later one.
    assert saved > at_signal >= 2, (saved, at_signal)
    assert json.loads((tmp_path / "full" / "metrics.json").read_text())["optimizer_steps"] > saved
    lines = [line for line in err.splitlines() if line.startswith("preempted:")]
    assert lines == [
        f"preempted: checkpoint ckpt-{saved} written at step {saved}; "
        "rerun the same command to resume"
    ], err[-3000:]
    assert "Traceback" not in err
    assert not (run / "metrics.json").exists()  # stopped before the end

    code, err, out = wait(start(run))
    assert code == 0, err[-3000:]
    assert f"Resumed from {ckpts / f'ckpt-{saved}'}:" in out, out[-2000:]
    assert_same_end(tmp_path / "full", run, preempted_at=saved, every=2)


def test_without_train_preemption_sigterm_kills_as_before(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start(run, "--config.train.preemption=False")
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


def test_sigterm_to_one_worker_makes_both_save_at_the_same_step_and_exit_143(
    tmp_path: Path,
) -> None:
    for code, err, _ in finish(start_workers(tmp_path / "full", free_ports(2), extra_flags=TINY)):
        assert code == 0, err[-3000:]

    run = tmp_path / "run"
    procs = start_workers(run, free_ports(2), extra_flags=TINY)
    try:
        at_signal = signal_after_first_checkpoint(procs[1], run / "checkpoints")
        # The signal goes to the non-chief worker only: the chief learns of it from its peer.
    finally:
        results = finish(procs)
    saved = []
    for (code, err, _), outdir in zip(results, (run, run / "worker-1"), strict=True):
        assert code == 143, err[-3000:]
        number = checkpoint_numbers(str(outdir / "checkpoints"))[0]
        assert f"preempted: checkpoint ckpt-{number} written at step {number};" in err, err[-2000:]
        saved.append(number)
    assert saved[0] == saved[1] > at_signal, (saved, at_signal)

    for code, err, out in finish(start_workers(run, free_ports(2), extra_flags=TINY)):
        assert code == 0, err[-3000:]
        assert f"Resumed from {run / 'checkpoints' / f'ckpt-{saved[0]}'}:" in out, out[-2000:]
    assert_same_end(
        tmp_path / "full", run, preempted_at=saved[0], every=2, workers=(run / "worker-1",)
    )
