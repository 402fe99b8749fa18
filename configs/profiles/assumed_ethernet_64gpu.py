r"""64 GPUs (8 nodes x 8, or 64 single-GPU hosts) all-reducing over 100 Gb/s Ethernet.
ASSUMED figures: nothing here was measured (this machine has no GPU and no network).

    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/assumed_ethernet_64gpu.py

Assumptions, each a rough figure:
  seconds_per_example = 3e-6, fixed_seconds = 2e-3, min_examples_per_device = 1,
      parallel_devices = None: the same V100-class GPU as assumed_nvlink_8gpu.py (see there).
  bandwidth_bytes_per_second = 8e9    100 Gb/s is 12.5 GB/s line rate; NCCL over TCP
      sockets or RoCE typically reaches 60-90% of it as all-reduce bus bandwidth; ~65%
      assumed. The ring is limited by its slowest link, the network, so the whole ring
      runs at this rate even when 8 GPUs of a node share NVLink (a hierarchical
      all-reduce would do better).
  latency_seconds = 25e-6     per ring hop: one small message through the kernel
      network stack and a switch, 10-50 us on Ethernet. With 2 (N-1) hops this term
      is pessimistic at large N: NCCL switches to tree all-reduce (log N hops) for
      small messages, which this model does not.
  max_devices = 64            the cluster described; rows beyond 64 are extrapolations.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "assumed_ethernet_64gpu"
    config.seconds_per_example = 3e-6
    config.fixed_seconds = 2e-3
    config.bandwidth_bytes_per_second = 8e9
    config.latency_seconds = 25e-6
    config.min_examples_per_device = 1
    config.parallel_devices = config_dict.placeholder(int)
    config.max_devices = 64
    return config
