r"""A fixed large batch (16 x 128 = 2048) with linear learning-rate scaling and warm-up.

    python launch/train.py --config=configs/fashion_mnist_linear_large.py --workdir=workdir/fmnist_linear_large

Goyal et al. (2017): learning rate x S, ramped up from the base rate over the first
epochs (here 2 base epochs of progress).
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.policy.kind = "static"
    config.policy.initial_batch_size = 16 * config.base_batch_size
    config.policy.max_batch_size = 16 * config.base_batch_size
    config.lr.rule = "linear"
    config.lr.warmup_base_epochs = 2.0
    return config
