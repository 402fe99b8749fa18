r"""A byte-level transformer language model on generated Python source.

    python launch/train.py --config=configs/text_lm.py --workdir=workdir/text_lm

The second workload family: a decoder-only transformer (3 blocks, width 128, ~0.67M
parameters) predicts the next byte of 64-byte windows of 90 modules of Python source and is
evaluated on 10 others (`tf_adabatch.app.data.python_text`: the modules are generated from a
fixed seed by a small grammar of Python, the same bytes on every Python, and pinned by
their hashes; no network). Its evaluation reports the validation loss in bits per byte
(`bits_per_byte`, also in metrics.json as `test_bits_per_byte`).

2 logical CPU replicas x micro-batch 16: the batch starts at B0 = 32 windows (2,048 bytes)
and SimiGrad moves it within [32, 512]; AdamW with the AdaScale rule at gain power 0.5 (the
square-root scaling suited to Adam) runs the cosine schedule of the base run on
scale-invariant progress.
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.dataset = "python_text"
    config.model = "transformer"
    config.num_cpu_replicas = 2
    config.micro_batch_size = 16
    config.base_batch_size = 32
    config.policy.initial_batch_size = 32
    config.policy.min_batch_size = 32
    config.policy.max_batch_size = 512
    config.optimizer.name = "adamw"
    config.optimizer.learning_rate = 2e-3
    config.optimizer.weight_decay = 0.01
    config.lr.gain_power = 0.5
    config.train.base_epochs = 1.0
    config.train.eval_every_base_epochs = 0.25
    config.train.eval_batch_size = 512
    config.train.checkpoint_every_steps = 200
    return config
