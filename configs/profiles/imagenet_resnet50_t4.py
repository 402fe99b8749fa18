r"""ResNet-50 on ImageNet on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for ResNet-50 on ImageNet on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 20 to 200: configs/profiles/pollux_traces/imagenet/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=imagenet_resnet50_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "imagenet_resnet50_t4"
    config.kind = "measured"
    config.measured = "ResNet-50 on ImageNet, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    config.compute_fixed = 0.06280407369344454
    config.compute_per_example = 0.004542256305787773
    config.intra_fixed = 1.1189347248186893e-05
    config.intra_bandwidth = 6.413915771601079e-05
    config.intra_latency = 4.845341482498503e-07
    config.inter_fixed = 7.657017771895628e-09
    config.inter_bandwidth = 0.3436401859284506
    config.inter_latency = 0.0058731386184015305
    config.pair_extra = 0.14231414161486172
    config.overlap = 2.845621441749184
    config.gpus_per_node = 4
    config.max_local_batch = 200
    return config
