"""Multi-worker jobs: which worker this is, the same-checkpoint check, a lost peer.

Every worker saves (the strategy needs it), non-chief workers into `worker-<i>/`; every
worker resumes from the chief's `checkpoints/`, so all restart from one state, and
`check_same_checkpoint` refuses to train if they restored different steps. When a worker
dies, the collectives of the others fail with one of `PEER_ERRORS` once TensorFlow's
coordination service notices the missing heartbeats (about 20 s here); `worker_lost`
turns that into `WorkerLostError`, which says how to resume; `launch/train.py` then exits
with `WORKER_LOST_EXIT_CODE`.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

__all__ = [
    "PEER_ERRORS",
    "WORKER_LOST_EXIT_CODE",
    "WorkerLostError",
    "check_same_checkpoint",
    "identify",
    "worker_lost",
]


# launch/train.py's exit code for `WorkerLostError`: a retryable failure (relaunching every
# worker resumes the run). 138 = 128 + SIGUSR1 is the code Kubeflow's training operator
# reserves for a user's retryable error: under `restartPolicy: ExitCode` it restarts the
# pod, while it treats 1-127 as permanent (an exit 4 failed the whole TFJob instead).
WORKER_LOST_EXIT_CODE = 138


class WorkerLostError(RuntimeError):
    """Multi-worker training lost a worker (or the workers disagree on the checkpoint).

    >>> issubclass(WorkerLostError, RuntimeError)
    True
    """


# What a collective op raises on the survivors when a peer dies.
PEER_ERRORS = (
    tf.errors.UnavailableError,
    tf.errors.AbortedError,
    tf.errors.DeadlineExceededError,
    tf.errors.CancelledError,
)


def identify(strategy: tf.distribute.Strategy) -> tuple[bool, str]:
    """(is this the chief?, a name for this worker's own output folder, "" for the chief).

    One process (any strategy but a multi-worker one with TF_CONFIG) is the chief.

    >>> identify(tf.distribute.get_strategy())
    (True, '')
    """
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True, ""
    resolver: Any = strategy.cluster_resolver
    if resolver is None or not resolver.task_type:  # one worker, no TF_CONFIG
        return True, ""
    spec = resolver.cluster_spec().as_dict()
    chief = resolver.task_type == "chief" or (
        resolver.task_type == "worker" and resolver.task_id == 0 and "chief" not in spec
    )
    return chief, f"{resolver.task_type}-{resolver.task_id}"


def check_same_checkpoint(strategy: tf.distribute.Strategy, step: int) -> None:
    """All workers must resume from the same step (else their collectives mix steps).

    Collective: every worker calls it with the step it restored.

    Raises:
      WorkerLostError: the workers restored different steps.

    >>> check_same_checkpoint(tf.distribute.get_strategy(), 10)  # one worker: agrees
    """

    @tf.function
    def gather() -> Any:
        def replica_fn() -> tf.Tensor:
            value = tf.constant([1.0, float(step), float(step) ** 2], tf.float64)
            ctx = tf.distribute.get_replica_context()
            return ctx.all_reduce(tf.distribute.ReduceOp.SUM, value)

        return strategy.experimental_local_results(strategy.run(replica_fn))[0]

    n, total, squares = (float(v) for v in gather().numpy())
    if abs(n * squares - total * total) > 0.5:  # equal iff every worker has the same step
        raise WorkerLostError(
            f"The workers restored different checkpoints (this one: step {step}, mean "
            f"{total / n:.1f}). Give every worker the same workdir on a shared filesystem: "
            "all of them resume from the chief's checkpoints/."
        )


def worker_lost(err: BaseException, checkpoint_dir: str) -> WorkerLostError:
    """The error to raise for `err`, one of `PEER_ERRORS` on a multi-worker job.

    Args:
      err: what the collective op raised.
      checkpoint_dir: the chief's checkpoints (where a relaunch resumes from).

    >>> err = tf.errors.UnavailableError(None, None, "Task /job:worker/task:1 unhealthy")
    >>> print(worker_lost(err, "/nowhere"))  # doctest: +ELLIPSIS
    Lost another worker (Task /job:worker/task:1 unhealthy). The chief's last checkpoint is None; ...
    """
    first = next((line for line in str(err).splitlines() if "unhealthy" in line), None)
    return WorkerLostError(
        f"Lost another worker ({first or type(err).__name__}). The chief's last "
        f"checkpoint is {tf.train.latest_checkpoint(checkpoint_dir)}; "
        "relaunch every worker with the same command to resume from it."
    )
