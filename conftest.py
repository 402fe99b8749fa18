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
