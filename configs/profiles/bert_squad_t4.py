r"""BERT question-answering fine-tuning on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for BERT question-answering fine-tuning on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from 4 to 12: configs/profiles/pollux_traces/bert/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile=bert_squad_t4 --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "bert_squad_t4"
    config.kind = "measured"
    config.measured = (
        "BERT question-answering fine-tuning, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
    )
    config.compute_fixed = 0.17959076955872155
    config.compute_per_example = 0.06266885744637853
    config.intra_fixed = 0.059965417474321034
    config.intra_bandwidth = 0.29875108768605596
    config.intra_latency = 0.019725627570834514
    config.inter_fixed = 5.098063220678972e-08
    config.inter_bandwidth = 1.5932410795408234
    config.inter_latency = 0.006378389102909918
    config.pair_extra = 0.7505207828420148
    config.overlap = 2.3195850737871346
    config.gpus_per_node = 4
    config.max_local_batch = 12
    return config
