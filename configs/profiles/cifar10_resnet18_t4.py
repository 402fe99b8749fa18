r"""ResNet-18 on CIFAR-10 on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for ResNet-18 on CIFAR-10 on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 32 to 1024: configs/profiles/pollux_traces/cifar10/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=cifar10_resnet18_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "cifar10_resnet18_t4"
    config.kind = "measured"
    config.measured = "ResNet-18 on CIFAR-10, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    config.compute_fixed = 0.018860287673783026
    config.compute_per_example = 0.0007678434656946252
    config.intra_fixed = 1.6629975532095645e-05
    config.intra_bandwidth = 2.3022764478545007e-05
    config.intra_latency = 7.341187941109243e-06
    config.inter_fixed = 1.111006534643328e-08
    config.inter_bandwidth = 0.1462684824270348
    config.inter_latency = 0.0022204307642668336
    config.pair_extra = 0.04379410852846584
    config.overlap = 3.1250647899013555
    config.gpus_per_node = 4
    config.max_local_batch = 1024
    return config
