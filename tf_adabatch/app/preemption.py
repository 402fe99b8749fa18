"""Preemption: SIGTERM -> a checkpoint at an optimizer-step boundary -> `Preempted`.

Ctrl-C (SIGINT) does the same (exit code 130 = 128 + SIGINT); a second Ctrl-C quits at
once with `KeyboardInterrupt`, saving nothing more.

SLURM, Kubernetes and cloud spot instances stop a job with SIGTERM (then SIGKILL after a
grace period). `PreemptionWatch` turns it into a checkpoint through the job's own
`tf.train.CheckpointManager` (its numbering: the optimizer step, as the periodic saves),
on every worker at the same step, then raises `Preempted`; `launch/train.py` exits
with `PREEMPTED_EXIT_CODE` (143 = 128 + SIGTERM, what a SIGTERM'd process returns, so
restart policies that retry signal exits, such as Kubeflow's `ExitCode`, relaunch it),
and rerunning the same command resumes from that checkpoint.

One worker saves at the first optimizer-step boundary after the signal (the step that
was running when it arrived), with nothing to agree on. The agreement between several
workers is TensorFlow's own
`tf.distribute.experimental.PreemptionCheckpointHandler`, used "decoupled": it never
reads or writes the job's checkpoints (it gets a dummy `tf.train.Checkpoint` and a
temporary `checkpoint_dir` it never writes), its `save_fn` is the job's manager and its
`exit_fn` raises `Preempted`. The worker that sees the signal posts "save after step
N + 1" through the coordination service (N: the last step it finished); every worker
saves there. Our own SIGTERM handler sets a flag that the handler polls (once a second,
`termination_watcher_fn`), the same on every platform: TensorFlow would otherwise
install its own handler, or none on GCP. On GCE CPU and TPU VMs TensorFlow's handler
does nothing: there a multi-worker run is not covered (a one-line warning says so).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import threading
from typing import Any

import tensorflow as tf

__all__ = ["PREEMPTED_EXIT_CODE", "Preempted", "PreemptionWatch"]

PREEMPTED_EXIT_CODE = 128 + int(signal.SIGTERM)  # 143


class Preempted(Exception):
    """The job received SIGTERM (or Ctrl-C: SIGINT) and saved a checkpoint at an
    optimizer-step boundary.

    Attributes:
      checkpoint: the path of the checkpoint written (this worker's).
      step: the optimizer step it holds (its number).
      signum: the signal (SIGTERM or SIGINT).
      exit_code: 128 + signum, what a process killed by it returns (143, 130).

    >>> print(Preempted("/w/checkpoints/ckpt-7", 7))
    checkpoint ckpt-7 written at step 7; rerun the same command to resume
    >>> Preempted("/w/checkpoints/ckpt-7", 7, signal.SIGINT).exit_code
    130
    """

    def __init__(self, checkpoint: str | None, step: int, signum: int = signal.SIGTERM) -> None:
        name = os.path.basename(checkpoint) if checkpoint else "(none)"
        super().__init__(
            f"checkpoint {name} written at step {step}; rerun the same command to resume"
        )
        self.checkpoint, self.step, self.signum = checkpoint, step, int(signum)
        self.exit_code = 128 + int(signum)


# SIGTERM (schedulers, spot VMs) and SIGINT (Ctrl-C) both save and stop.
_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class PreemptionWatch:
    """SIGTERM -> save through `manager` at a step boundary all workers agree on -> `Preempted`.

    Created early in the main thread (it installs a SIGTERM handler that only sets
    `signalled`), then `start`ed once the strategy and the checkpoint manager exist;
    `after_step` is called once per optimizer step on every worker (the checkpoint
    action does it); `close` restores the previous SIGTERM handler. One per process in
    a multi-worker job (the coordination service's keys are written once).

    State: `signalled` (SIGTERM seen here), `saved_step` (the step of the preemption
    checkpoint, None before), `handler` (TensorFlow's, for several workers only; None before `start`
    and after `close`).

    Example (one worker; a real SIGTERM to this process, polled within a second):

    >>> import time
    >>> v = tf.Variable(0.0)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 2)
    >>> watch = PreemptionWatch()
    >>> watch.start(tf.distribute.get_strategy(), manager)
    >>> os.kill(os.getpid(), signal.SIGTERM)
    >>> try:
    ...     for step in range(1, 100):
    ...         time.sleep(0.05)  # an optimizer step
    ...         watch.after_step(step)
    ... except Preempted as preempted:
    ...     print(preempted.step, os.path.basename(manager.latest_checkpoint))
    1 ckpt-1
    >>> watch.close()
    """

    def __init__(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionWatch must be created in the main thread (it installs a SIGTERM "
                "handler); set the config field `train.preemption=False` to run elsewhere."
            )
        self.signalled = False
        self.signum: int = signal.SIGTERM  # the first signal seen
        self.saved_step: int | None = None
        self.handler: Any = None
        self.manager: tf.train.CheckpointManager | None = None
        self._inert = False  # TensorFlow's handler does nothing here (GCE CPU / TPU VMs)
        self._multi_worker = False
        self._unused_dir: str | None = None
        self._previous: dict[int, Any] = {}
        for signum in _SIGNALS:
            previous = signal.signal(signum, self._on_signal)
            # Installed from C: restore the default at the end.
            self._previous[signum] = signal.SIG_DFL if previous is None else previous
        self._installed = True

    def reinstall(self) -> None:
        """Puts the SIGTERM handler back after TensorFlow's coordination service took it.

        A multi-worker strategy starts the coordination service, whose C++ preemption
        notifier installs its own SIGTERM handler over Python's: call this once the
        strategy exists (a SIGTERM before is remembered, one in between is lost to it).
        """
        if self._installed:
            for signum in _SIGNALS:
                signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        del frame
        if signum == signal.SIGINT and self.signalled and self.signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: quit at once
        if signum == signal.SIGINT:
            print(
                "\nCtrl-C: saving a checkpoint at the end of this optimizer step, then "
                "stopping (Ctrl-C again to quit at once, without saving)",
                file=sys.stderr,
                flush=True,
            )
        if not self.signalled:
            self.signum = signum
        self.signalled = True

    def start(self, strategy: tf.distribute.Strategy, manager: tf.train.CheckpointManager) -> None:
        """From now on a SIGTERM leads to a save by `manager` (several workers: through
        TensorFlow's handler, created here).

        Args:
          strategy: the job's strategy; a multi-worker one agrees on the step through
            its coordination service, any other is one worker.
          manager: the job's checkpoint manager (this worker's).
        """
        self.manager = manager
        self.reinstall()
        resolver = None
        if isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
            resolver = strategy.cluster_resolver
        # One worker (an empty cluster spec): no agreement, so no handler. TensorFlow's
        # "local mode" would only add its once-a-second polling: a run whose remaining
        # steps take less than that ended with exit 0 despite the signal (seen in a full
        # suite run, 2026-12-03).
        self._multi_worker = bool(resolver is not None and resolver.cluster_spec().jobs)
        if not self._multi_worker:
            return
        self._unused_dir = tempfile.mkdtemp(prefix="tf_adabatch-preemption-")
        self.handler = tf.distribute.experimental.PreemptionCheckpointHandler(
            resolver,
            tf.train.Checkpoint(),  # a dummy: the handler adds its run counter to it
            checkpoint_dir=os.path.join(self._unused_dir, "unused"),
            termination_config=tf.distribute.experimental.TerminationConfig(
                termination_watcher_fn=lambda: self.signalled,
                exit_fn=self._exit,
                grace_period=0,
                save_fn=self._save,
            ),
        )
        # Pinned in tests/test_keras_private.py: the platform it detected.
        platform = str(self.handler._platform_device)
        self._inert = "GCE_CPU" in platform or "GCE_TPU" in platform
        if self._inert:
            print(
                "warning: preemption (SIGTERM) is not handled for a multi-worker run on a GCE "
                "CPU or TPU VM (TensorFlow's PreemptionCheckpointHandler does not support it)",
                file=sys.stderr,
            )

    def after_step(self, step: int) -> None:
        """Called after each optimizer step `step` (its number), on every worker.

        Raises:
          Preempted: this is the agreed step; the checkpoint `ckpt-<step>` is written.
        """
        if self.manager is None:  # not started
            return
        if not self._multi_worker:  # one worker: this boundary is the one to save at
            if self.signalled:
                self._save(checkpoint_number=step)
                self._exit()
            return
        if self._inert:  # several workers on a GCE CPU / TPU VM: not covered (warned)
            return
        # Its save reads its own deprecated `total_run_calls` (a warning line): quiet.
        logger = tf.get_logger()
        level = logger.level
        logger.setLevel("ERROR")
        try:
            self.handler.save_checkpoint_if_preempted(checkpoint_number=step)
        finally:
            logger.setLevel(level)

    def _save(self, *, checkpoint_number: int) -> None:
        assert self.manager is not None
        self.saved_step = checkpoint_number
        latest = self.manager.latest_checkpoint
        if not latest or os.path.basename(latest) != f"ckpt-{checkpoint_number}":
            self.manager.save(checkpoint_number=checkpoint_number)  # not saved at this step yet

    def _exit(self) -> None:
        assert self.manager is not None and self.saved_step is not None
        raise Preempted(self.manager.latest_checkpoint, self.saved_step, self.signum)

    def close(self, *, clean: bool = True) -> None:
        """Stops TensorFlow's handler and restores the previous SIGTERM handler.

        Args:
          clean: the run ended normally or by `Preempted`. Otherwise (an error) a
            multi-worker handler's watcher thread is left to end with the process (its
            stop talks to a coordination service that may be gone).
        """
        handler, self.handler = self.handler, None
        if handler is not None and (clean or not self._multi_worker or self.saved_step is not None):
            # Stops its threads, here in the main thread (pinned in tests/test_keras_private.py).
            handler.__del__()
        if self._unused_dir:
            shutil.rmtree(self._unused_dir, ignore_errors=True)
            self._unused_dir = None
        if self._installed:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._installed = False
