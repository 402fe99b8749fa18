r"""This machine: N logical CPU devices of one TensorFlow process on 2 shared cores,
fitted from step times of the real engine measured here (Fashion-MNIST CNN).

    python launch/simulate_cluster.py --measure --out=docs/benchmarks/cluster_measure
    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/this_machine.py

Measured 2026-12-06 08:40 UTC by `--measure` (timings and fit in
docs/benchmarks/cluster_measure.json; refit without timing again with
`--measure --measured=docs/benchmarks/cluster_measure.json`): `tf_adabatch.Trainer` on
the CNN (225,034 parameters) with random 28x28 inputs, micro-batch 32,
estimated-similarity mode, 1, 2 and 4 replicas x k = 1, 2, 4, 8 micro-steps, the median
of 30 timed steps each, with nothing else running (the earlier fit, of 2026-12-03, was
made under a load average of 3.5 to 5.5 and was off by 26% on average). The model's
errors against the medians: 7% on average, 11% at most; fitted on 1 and 2 replicas
only, it predicts the 4-replica times within 18% (see docs/cluster_projection.md).

Fitted (non-negative least squares on the 12 medians):
  seconds_per_example = 1.42e-4   forward + backward of one example.
  fixed_seconds = 2.05e-3         per optimizer step: the host's call and read-back,
      the statistics, the apply.
  latency_seconds = 6.45e-4       per hop of the ring (2 (N - 1) hops a step): the
      all-reduce between logical devices of one process.
  parallel_devices = 1            fitted between 1 and 2 (the cores): one logical
      device already uses both cores through TensorFlow's intra-op thread pool, which
      all logical CPU devices of a process share, so more replicas add no compute:
      measured step times depend on the global batch, not on the replica count
      (mean |error| 7% with 1, 17% with 2).
Assumed:
  bandwidth_bytes_per_second = 5e9   a memory copy between two buffers of one
      process; with 0.9 MB of gradient its term is below 0.3 ms.
  min_examples_per_device = 1, max_devices = 4 (the replica counts measured).
Not in the model: what a training loop adds per step beyond the engine's step
(TensorBoard summaries, the progress bar, the input pipeline; docs/cluster_projection.md
compares a projection with measured runs).
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "this_machine"
    config.seconds_per_example = 1.42e-4
    config.fixed_seconds = 2.05e-3
    config.bandwidth_bytes_per_second = 5e9
    config.latency_seconds = 6.45e-4
    config.min_examples_per_device = 1
    config.parallel_devices = 1
    config.max_devices = 4
    return config
