r"""This machine: N logical CPU devices of one TensorFlow process on 2 shared cores,
fitted from step times of the real engine measured here (Fashion-MNIST CNN).

    python launch/simulate_cluster.py --measure --out=docs/benchmarks/cluster_measure
    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/this_machine.py

Measured 2026-12-03 14:04 UTC by `--measure` (timings and fit in
docs/benchmarks/cluster_measure.json; refit without timing again with
`--measure --measured=docs/benchmarks/cluster_measure.json`): `tf_adabatch.Trainer` on
the CNN (225,034 parameters) with random 28x28 inputs, micro-batch 32,
estimated-similarity mode, 1, 2 and 4 replicas x k = 1, 2, 4, 8 micro-steps, the median
of 8 timed steps each. The machine was shared with other agents (load average 3.5 to
5.5 on 2 cores during the measurement): single step times varied by up to 4x, and the
model's errors against the medians are 26% on average (see
docs/cluster_projection.md).

Fitted (non-negative least squares on the 12 medians):
  seconds_per_example = 1.49e-3   forward + backward of one example.
  fixed_seconds = 0.0             the fit put no weight on a per-step constant: the
      noise hides it (a per-step host overhead of a few ms certainly exists).
  latency_seconds = 0.0           likewise, no measurable per-hop all-reduce cost
      between logical devices of one process.
  parallel_devices = 1            fitted between 1 and 2 (the cores): one logical
      device already uses both cores through TensorFlow's intra-op thread pool, which
      all logical CPU devices of a process share, so more replicas add no compute:
      measured step times depend on the global batch, not on the replica count
      (mean |error| 26% with 1, 34% with 2).
Assumed:
  bandwidth_bytes_per_second = 5e9   a memory copy between two buffers of one
      process; with 0.9 MB of gradient its term is below 0.3 ms, invisible here.
  min_examples_per_device = 1, max_devices = 4 (the replica counts measured).
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "this_machine"
    config.seconds_per_example = 1.49e-3
    config.fixed_seconds = 0.0
    config.bandwidth_bytes_per_second = 5e9
    config.latency_seconds = 0.0
    config.min_examples_per_device = 1
    config.parallel_devices = 1
    config.max_devices = 4
    return config
