r"""NCF recommendation on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for NCF recommendation on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 32 to 32768: configs/profiles/pollux_traces/ncf/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=ncf_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "ncf_t4"
    config.kind = "measured"
    config.measured = "NCF recommendation, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    config.compute_fixed = 0.006834626382784806
    config.compute_per_example = 8.196857205616406e-07
    config.intra_fixed = 0.0017821005782202852
    config.intra_bandwidth = 2.5906095584988986e-08
    config.intra_latency = 0.0011934756522301293
    config.inter_fixed = 3.3383214311232557e-10
    config.inter_bandwidth = 0.015313345881567832
    config.inter_latency = 0.0005338114032489251
    config.pair_extra = 0.007910836717483431
    config.overlap = 1.0000000148839445
    config.gpus_per_node = 4
    config.max_local_batch = 32768
    return config
