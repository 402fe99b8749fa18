"""Where a multi-worker job's workers are: TensorFlow's cluster resolvers, by `config.cluster`.

- "tf_config": the TF_CONFIG environment variable (`TFConfigClusterResolver`, what
  `MultiWorkerMirroredStrategy()` reads by default). `launch/multiworker.py` sets it on
  one machine; a Kubeflow TFJob sets it on Kubernetes (`launch/k8s/tfjob.yaml`).
- "slurm": the environment `srun` gives each task (`SlurmClusterResolver`), one
  process per task (`launch/slurm/train.sbatch`).

The GPUs a task uses are the ones SLURM lets it see (`CUDA_VISIBLE_DEVICES`, e.g. with
`srun --gpus-per-task`, or all of a node's with one task per node), as with TF_CONFIG:
the resolver is not asked to hand them out.
"""

from __future__ import annotations

import os

import tensorflow as tf

__all__ = ["CLUSTERS", "slurm_resolver"]

CLUSTERS = ("tf_config", "slurm")
# What SlurmClusterResolver reads (with the GPU count given, as here).
_SLURM_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
)


def _config_error(message: str) -> Exception:
    # Imported here: `config` imports `factories`, which imports this module.
    from tf_adabatch.app.config import ConfigError

    return ConfigError(message)


def slurm_resolver(*, port_base: int) -> tf.distribute.cluster_resolver.ClusterResolver:
    """This SLURM task's place in the job, from SLURM's environment (call before any TF op).

    `SlurmClusterResolver` reads `SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`,
    `SLURM_STEP_NODELIST` and `SLURM_STEP_TASKS_PER_NODE` (no `scontrol`); task i of a
    node listens on `port_base + i`. Its answer is checked against where SLURM put this
    task (`SLURMD_NODENAME`, `SLURM_LOCALID`, where set): TensorFlow orders the hosts as
    strings, so in `n[9-10]` it takes `n10` for rank 0, which SLURM runs on `n9`.

    The result is a `SimpleClusterResolver` with the same cluster and task, whose
    accelerators are the GPUs this process sees (none on a CPU host):
    `SlurmClusterResolver` would report the GPUs it was told to assign, and
    `MultiWorkerMirroredStrategy` takes that number from a resolver other than TF_CONFIG's.

    Args:
      port_base: the port of a node's first task (config field `slurm_port_base`).

    Raises:
      ConfigError: not inside a SLURM step, or TensorFlow's ordering of the tasks
        disagrees with SLURM's.

    Example (the environment `srun --ntasks=2` sets for task 1 on one node):

    >>> import os
    >>> os.environ.update(SLURM_PROCID="1", SLURM_STEP_NUM_TASKS="2",
    ...                   SLURM_STEP_NODELIST="127.0.0.1", SLURM_STEP_TASKS_PER_NODE="2")
    >>> resolver = slurm_resolver(port_base=20000)
    >>> resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id
    ({'worker': ['127.0.0.1:20000', '127.0.0.1:20001']}, 'worker', 1)
    >>> for name in ("SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NODELIST",
    ...              "SLURM_STEP_TASKS_PER_NODE"):
    ...     del os.environ[name]
    """
    missing = [name for name in _SLURM_VARIABLES if name not in os.environ]
    if missing:
        raise _config_error(
            "Config field `cluster`='slurm' needs the environment of a SLURM task (run "
            f"under `srun`). Not set: {', '.join(missing)}"
        )
    # GPUs are not the resolver's to assign (auto_set_gpu=False). It still lays tasks
    # out along its GPU count, one task per `gpus_per_task`: give it a slot per task.
    num_tasks = int(os.environ["SLURM_STEP_NUM_TASKS"])
    slurm = tf.distribute.cluster_resolver.SlurmClusterResolver(
        port_base=port_base, gpus_per_node=num_tasks, gpus_per_task=1, auto_set_gpu=False
    )
    spec = slurm.cluster_spec()  # sets task_type and task_id
    address = spec.task_address(slurm.task_type, slurm.task_id)
    host, port = address.rsplit(":", 1)
    where = {"SLURMD_NODENAME": host, "SLURM_LOCALID": str(int(port) - port_base)}
    for name, expected in where.items():
        actual = os.environ.get(name)
        if actual is not None and actual != expected:
            raise _config_error(
                f"SlurmClusterResolver places SLURM task {os.environ['SLURM_PROCID']} at "
                f"{address} (host {host}, task {expected} of that host), but SLURM runs it "
                f"with {name}={actual}: TensorFlow orders the nodes of "
                f"SLURM_STEP_NODELIST={os.environ['SLURM_STEP_NODELIST']} as strings and "
                "assumes block distribution. Use node names that sort as SLURM orders them "
                "(zero-padded numbers) and `srun --distribution=block`, or set TF_CONFIG "
                "on each task and keep config.cluster='tf_config'."
            )
    gpus = len(tf.config.list_physical_devices("GPU"))
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec,
        task_type=slurm.task_type,
        task_id=slurm.task_id,
        num_accelerators={"GPU": gpus} if gpus else {},
        rpc_layer="grpc",
    )
