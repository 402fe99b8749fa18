"""`config.cluster`: TensorFlow's cluster resolvers choose where a multi-worker job's workers are.

The resolver is tested in this process with SLURM's environment set by hand; the SLURM
launch runs launch/train.py as 2 tasks on 127.0.0.1 with the environment `srun
--ntasks=2` gives the tasks of a one-node step.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sys
from pathlib import Path

import numpy as np
import pytest

from configs import synthetic
from tf_adabatch import app
from tf_adabatch.app import cluster

from helpers import checkpoint_values
from launcher import finish, start_workers

HERE = Path(__file__).resolve().parent
SLURM_VARIABLES = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_STEP_NUM_TASKS",
    "SLURM_STEP_NODELIST",
    "SLURM_STEP_TASKS_PER_NODE",
    "SLURMD_NODENAME",
)


@pytest.fixture
def slurm_env(monkeypatch):
    """Sets SLURM's variables for one test (every other SLURM variable removed)."""
    for name in SLURM_VARIABLES:
        monkeypatch.delenv(name, raising=False)

    def set_env(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_env


def test_two_tasks_on_one_node_get_consecutive_ports_and_no_accelerators(slurm_env) -> None:
    # `srun --ntasks=2` on one node: tasks 0 and 1, both on that node (local ids 0, 1).
    for rank in (0, 1):
        slurm_env(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID=str(rank),
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_NODELIST="127.0.0.1",
            SLURM_STEP_TASKS_PER_NODE="2",
            SLURMD_NODENAME="127.0.0.1",
        )
        resolver = cluster.slurm_resolver(port_base=31000)
        assert resolver.cluster_spec().as_dict() == {
            "worker": ["127.0.0.1:31000", "127.0.0.1:31001"]
        }
        assert (resolver.task_type, resolver.task_id) == ("worker", rank)
        # No GPU on this machine: MultiWorkerMirroredStrategy must place its replica on
        # the CPU (SlurmClusterResolver itself would claim the GPU slot it laid out).
        assert resolver.num_accelerators() == {}
        assert resolver.rpc_layer == "grpc"


def test_zero_padded_nodes_keep_slurm_order(slurm_env) -> None:
    # SLURM's block distribution: rank r on the r-th node of the list, one task each.
    for rank, node in enumerate(["n09", "n10"]):
        slurm_env(
            SLURM_PROCID=str(rank),
            SLURM_LOCALID="0",
            SLURM_STEP_NUM_TASKS="2",
            SLURM_STEP_NODELIST="n[09-10]",
            SLURM_STEP_TASKS_PER_NODE="1(x2)",
            SLURMD_NODENAME=node,
        )
        resolver = cluster.slurm_resolver(port_base=8888)
        assert resolver.cluster_spec().as_dict() == {"worker": ["n09:8888", "n10:8888"]}
        assert resolver.task_id == rank


def test_a_placement_tensorflow_gets_wrong_is_refused(slurm_env) -> None:
    # SLURM runs rank 0 on n9, the first node of n[9-10]; TensorFlow sorts the host
    # names as strings ("n10" < "n9") and would make n10:8888 worker 0.
    slurm_env(
        SLURM_PROCID="0",
        SLURM_STEP_NUM_TASKS="2",
        SLURM_STEP_NODELIST="n[9-10]",
        SLURM_STEP_TASKS_PER_NODE="1(x2)",
        SLURMD_NODENAME="n9",
    )
    with pytest.raises(
        app.ConfigError,
        match=r"places SLURM task 0 at n10:8888 .* SLURMD_NODENAME=n9: TensorFlow orders "
        r"the nodes of SLURM_STEP_NODELIST=n\[9-10\] as strings",
    ):
        cluster.slurm_resolver(port_base=8888)
    # A task's rank on its node must be its port's: rank 1 of a one-node step is task 1
    # of that node (port 8889); SLURM saying local id 0 (another distribution) is refused.
    slurm_env(
        SLURM_PROCID="1",
        SLURM_LOCALID="0",
        SLURM_STEP_NODELIST="h",
        SLURM_STEP_TASKS_PER_NODE="2",
        SLURMD_NODENAME="h",
    )
    with pytest.raises(app.ConfigError, match=r"at h:8889 .* SLURM_LOCALID=0"):
        cluster.slurm_resolver(port_base=8888)


def test_outside_a_slurm_task_says_what_is_missing(slurm_env) -> None:
    slurm_env(SLURM_PROCID="0")
    with pytest.raises(
        app.ConfigError,
        match=r"`cluster`='slurm' needs the environment of a SLURM task \(run under `srun`\)\. "
        r"Not set: SLURM_STEP_NUM_TASKS, SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE$",
    ):
        cluster.slurm_resolver(port_base=8888)


@pytest.mark.parametrize(
    "overrides,expected",
    [
        ({"cluster": "pbs"}, r"Config field `cluster` must be 'tf_config' or 'slurm'\. "),
        (
            {"cluster": "slurm", "strategy": "mirrored"},
            r"`cluster` must be 'tf_config' unless strategy='multi_worker' .* "
            r"Received: cluster='slurm'",
        ),
        (
            {"cluster": "slurm", "strategy": "multi_worker", "slurm_port_base": 70000},
            r"`slurm_port_base` must be an integer in \[1, 65535\]\. Received: "
            r"slurm_port_base=70000",
        ),
    ],
)
def test_cluster_fields_are_validated(overrides: dict, expected: str) -> None:
    config = synthetic.get_config()
    for key, value in overrides.items():
        config[key] = value
    with pytest.raises(app.ConfigError, match=expected):
        app.validate_config(config)


def consecutive_free_ports(count: int) -> int:
    """A port P such that P .. P + count - 1 are free on 127.0.0.1 (SLURM's layout)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            base = probe.getsockname()[1]
        if base + count > 65535:
            continue
        sockets = [socket.socket() for _ in range(count)]
        try:
            for offset, s in enumerate(sockets):
                s.bind(("127.0.0.1", base + offset))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def test_slurm_launch_of_two_tasks_trains_to_the_end_on_both(tmp_path: Path) -> None:
    """launch/train.py --config.cluster=slurm, as `srun --ntasks=2` starts it on one node."""
    # Stand-ins that fail loudly (and leave a mark) if the resolver shells out to them.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("scontrol", "nvidia-smi"):
        path = bin_dir / tool
        path.write_text(
            f"#!/bin/sh\ntouch {tmp_path}/{tool}.called\necho {tool} called >&2\nexit 1\n"
        )
        path.chmod(0o755)
    port_base = consecutive_free_ports(2)

    def srun_task(rank: int) -> dict[str, str]:
        return {
            "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0",
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS": "2",
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NUM_NODES": "1",
            "SLURM_NODELIST": "127.0.0.1",
            "SLURM_STEP_NODELIST": "127.0.0.1",
            "SLURM_TASKS_PER_NODE": "2",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURMD_NODENAME": "127.0.0.1",
        }

    assert "TF_CONFIG" not in os.environ  # the cluster can only come from SLURM's variables
    run = tmp_path / "run"
    results = finish(
        start_workers(
            run,
            [port_base, port_base + 1],
            placement=srun_task,
            extra_flags=(
                "--config.cluster=slurm",
                f"--config.slurm_port_base={port_base}",
                "--config.train.base_epochs=0.25",
            ),
        )
    )
    for code, err, _ in results:
        assert code == 0, err[-3000:]
    assert not list(tmp_path.glob("*.called")), "the resolver ran scontrol or nvidia-smi"
    # One job of two workers: task 1 saw itself as worker 1 (its own folder), both report
    # 2 replicas in sync, and both ended with the same metrics (same final evaluation).
    # Every variable of the two tasks' last checkpoints is the same (model, optimizer,
    # adaptive state): one synchronous job, not two independent runs.
    mine, theirs = checkpoint_values(run), checkpoint_values(run / "worker-1")
    assert set(mine) == set(theirs) and len(mine) > 10
    for name, value in mine.items():
        np.testing.assert_array_equal(theirs[name], value, err_msg=name)
    chief = json.loads((run / "metrics.json").read_text())
    other = json.loads((run / "worker-1" / "metrics.json").read_text())
    assert chief["replicas"] == 2
    assert chief["progress"] >= chief["base_steps"]  # trained to the end of its budget
    timings = ("wall_time_s", "train_seconds")
    assert {k: v for k, v in other.items() if k not in timings} == {
        k: v for k, v in chief.items() if k not in timings
    }


def parsed_config(argv: list[str], monkeypatch):
    """launch/train.py's flags (a locked config file plus overrides) parsed by absl."""
    from absl import flags
    from ml_collections import config_flags

    values = flags.FlagValues()
    config_flags.DEFINE_config_file("config", None, "", flag_values=values, lock_config=True)
    flags.DEFINE_string("workdir", None, "", flag_values=values)
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])  # where ml_collections finds overrides
    values(sys.argv)
    return values.config


def test_the_shipped_sbatch_script_and_manifest_run_valid_configs(monkeypatch) -> None:
    """The srun line of launch/slurm/train.sbatch and the TFJob's command are train.py
    command lines whose config passes `validate_config` (no TensorFlow op runs)."""
    import shlex

    import yaml  # PyYAML: a dependency of ml_collections

    root = HERE.parent
    script = (root / "launch" / "slurm" / "train.sbatch").read_text()
    defaults = dict(re.findall(r"^(\w+)=\$\{\1:-(.*)\}$", script, flags=re.M))
    assert set(defaults) == {"CONFIG", "WORKDIR"}
    (srun,) = re.findall(r"^srun .*?[^\\]$", script.replace("\\\n", " "), flags=re.M)
    config_file = str(root / defaults["CONFIG"])
    words = shlex.split(srun.replace("$CONFIG", config_file).replace("$WORKDIR", "w"))
    start = words.index("launch/train.py")
    assert words[start - 1] == "python"
    config = parsed_config(words[start + 1 :], monkeypatch)
    assert (config.strategy, config.cluster) == ("multi_worker", "slurm")
    app.validate_config(config)

    manifest = list(yaml.safe_load_all((root / "launch" / "k8s" / "tfjob.yaml").read_text()))
    (job,) = [d for d in manifest if d["kind"] == "TFJob"]
    worker = job["spec"]["tfReplicaSpecs"]["Worker"]
    assert (worker["replicas"], worker["restartPolicy"]) == (2, "ExitCode")
    (container,) = worker["template"]["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["python", "launch/train.py"]
    config = parsed_config(
        [a.replace("configs/", f"{root}/configs/") for a in command[2:]], monkeypatch
    )
    assert (config.strategy, config.cluster) == ("multi_worker", "tf_config")
    app.validate_config(config)
