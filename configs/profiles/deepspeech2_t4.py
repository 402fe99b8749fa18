r"""DeepSpeech2 speech recognition on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for DeepSpeech2 speech recognition on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 10 to 80: configs/profiles/pollux_traces/deepspeech2/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=deepspeech2_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "deepspeech2_t4"
    config.kind = "measured"
    config.measured = (
        "DeepSpeech2 speech recognition, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    )
    config.compute_fixed = 0.0030096775578529003
    config.compute_per_example = 0.03338964411105954
    config.intra_fixed = 0.3093639209686011
    config.intra_bandwidth = 0.24288555047373253
    config.intra_latency = 0.052759704427498715
    config.inter_fixed = 1.2968301946859342e-07
    config.inter_bandwidth = 1.031175347311081
    config.inter_latency = 0.005365308417509144
    config.pair_extra = 0.2432359865912039
    config.overlap = 3.224301224340749
    config.gpus_per_node = 4
    config.max_local_batch = 80
    return config
