"""Process-wide test set-up: logical CPU devices and one strategy per replica count.

TensorFlow fixes its devices when the first op runs, so this file (loaded by pytest
before any test module or doctest) splits the CPU into 8 logical devices first.

Strategies: several `MirroredStrategy`s with collective all-reduce in one process reuse
collective keys and crash ("Shape mismatch in the collective instance"). The suite
therefore shares one strategy per replica count for the whole session, all with
`ReductionToOneDevice` except one 4-replica strategy with the default collective ops.
"""

from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

NUM_LOGICAL_CPUS = 8

_cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    _cpu, [tf.config.LogicalDeviceConfiguration()] * NUM_LOGICAL_CPUS
)

import keras
from hypothesis import settings

import tf_adabatch

# Property tests draw the same cases on every run (a seed derived from each test), and
# keep no example database between runs: the suite stays deterministic.
settings.register_profile("deterministic", derandomize=True, database=None, deadline=None)
settings.load_profile("deterministic")

_STRATEGIES: dict[str, tf.distribute.Strategy] = {}


def get_strategy(
    num_replicas: int, *, collective: bool = False, mirrored: bool = False
) -> tf.distribute.Strategy:
    """The session's strategy with `num_replicas` replicas (1: the default strategy, or
    with `mirrored` a `MirroredStrategy` on one device)."""
    if num_replicas == 1 and not collective and not mirrored:
        return tf.distribute.get_strategy()
    key = f"{num_replicas}{'c' if collective else ''}"
    if key not in _STRATEGIES:
        if num_replicas == 1:
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(["/cpu:0"])
        elif collective:
            if num_replicas != 4:
                raise ValueError("Only one collective strategy (4 replicas) per process.")
            devices = [f"/cpu:{i}" for i in range(4, 8)]
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(devices)
        else:
            devices = [f"/cpu:{i}" for i in range(num_replicas)]
            _STRATEGIES[key] = tf.distribute.MirroredStrategy(
                devices, cross_device_ops=tf.distribute.ReductionToOneDevice()
            )
    return _STRATEGIES[key]


@pytest.fixture(autouse=True)
def _doctest_names(doctest_namespace: dict) -> None:
    doctest_namespace.update(tf=tf, keras=keras, np=np, tf_adabatch=tf_adabatch)


# The fast tier, `pytest -m "not slow"` (CONTRIBUTING: its time): every test of these
# files is marked `slow`. They start launcher or worker subprocesses, build wheels, train
# whole runs, or replay golden trajectories; CI runs them all.
SLOW_FILES = frozenset(
    {
        "test_benchmarks.py",
        "test_checkpoints.py",
        "test_clock.py",
        "test_cluster.py",
        "test_docs_commands.py",
        "test_engine_golden.py",
        "test_faults.py",
        "test_fit_keras.py",
        "test_golden_trajectory.py",
        "test_goodput.py",
        "test_guarantees.py",
        "test_honest_failures.py",
        "test_launch.py",
        "test_launch_blocks.py",
        "test_mixed_precision.py",
        "test_multiworker.py",
        "test_packaging.py",
        "test_preemption.py",
        "test_reliability.py",
        "test_second_day.py",
        "test_simulate_cluster.py",
        "test_steps_per_execution.py",
        "test_topology.py",
        "test_workdir.py",
        "test_xla_step.py",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    seen = set()
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
            seen.add(item.path.name)
    # Collecting the whole suite: a renamed or removed file must leave the list too.
    if len(items) > 500 and seen != SLOW_FILES:
        raise pytest.UsageError(
            f"conftest.SLOW_FILES names no tests in {sorted(SLOW_FILES - seen)}"
        )
