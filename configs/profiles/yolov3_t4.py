r"""YOLOv3 object detection on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for YOLOv3 object detection on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 4 to 16: configs/profiles/pollux_traces/yolov3/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=yolov3_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "yolov3_t4"
    config.kind = "measured"
    config.measured = "YOLOv3 object detection, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    config.compute_fixed = 0.11916622983431376
    config.compute_per_example = 0.033861355742203635
    config.intra_fixed = 4.180897845775883e-07
    config.intra_bandwidth = 0.11573321814848027
    config.intra_latency = 0.0840467061858144
    config.inter_fixed = 3.99056334384137e-09
    config.inter_bandwidth = 1.014070541127174
    config.inter_latency = 0.008347880040517602
    config.pair_extra = 0.43134258068985787
    config.overlap = 1.5217846975071212
    config.gpus_per_node = 4
    config.max_local_batch = 16
    return config
