r"""This machine: N logical CPU devices of one TensorFlow process sharing 2 cores.

    python launch/simulate_cluster.py --measure --out=/tmp/cluster_measure   # refit
    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/this_machine.py

PLACEHOLDER values until the measurement below is filled in.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "this_machine"
    config.seconds_per_example = 2e-4
    config.fixed_seconds = 5e-3
    config.bandwidth_bytes_per_second = 5e9
    config.latency_seconds = 1e-3
    config.min_examples_per_device = 1
    config.parallel_devices = 2
    config.max_devices = 4
    return config
