r"""8 GPUs in one node over NVLink (V100/A100 class). ASSUMED figures: nothing here was
measured (this machine has no GPU).

    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/assumed_nvlink_8gpu.py

Assumptions, each a rough figure:
  seconds_per_example = 3e-6   forward + backward of one 28x28 example through the
      Fashion-MNIST CNN (conv 32, conv 64, dense 128: ~5 MFLOP forward, ~16 MFLOP forward
      + backward) at ~5 TFLOP/s sustained, about a third of a V100's 15.7 TFLOP/s FP32
      peak (small convolutions rarely do better). An A100 would be ~2x faster. The
      same figure is used for the digits MLP, which is ~100x smaller: for it the
      per-step fixed cost dominates anyway.
  fixed_seconds = 2e-3         per-step cost independent of the batch: kernel launches
      (a few dozen kernels at ~5-10 us), the tf.function step's host overhead, the
      optimizer's apply and the adaptive statistics. 1-5 ms is typical of small TF
      models on a GPU; 2 ms assumed.
  bandwidth_bytes_per_second = 100e9   NCCL all-reduce "bus bandwidth" on a DGX-1-class
      NVLink node (NCCL's nccl-tests report ~130 GB/s for V100 DGX-1, ~230 GB/s for A100
      DGX); 100 GB/s taken as a round, conservative figure. The ring formula
      2 (N-1)/N * bytes / bandwidth is exactly how nccl-tests define bus bandwidth.
  latency_seconds = 2e-6       per ring hop (2 (N-1) hops): ~30 us for a small
      all-reduce on 8 GPUs, the order nccl-tests show for 8-byte messages.
  min_examples_per_device = 1  any batch split down to one example per GPU is allowed
      (a GPU is badly used far above that, which the fixed cost models).
  parallel_devices = None      every GPU computes in parallel.
  max_devices = 8              one node; rows beyond 8 are extrapolations (a real
      multi-node job would leave NVLink for the network: see assumed_ethernet_64gpu.py).
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "assumed_nvlink_8gpu"
    config.seconds_per_example = 3e-6
    config.fixed_seconds = 2e-3
    config.bandwidth_bytes_per_second = 100e9
    config.latency_seconds = 2e-6
    config.min_examples_per_device = 1
    config.parallel_devices = config_dict.placeholder(int)
    config.max_devices = 8
    return config
