r"""A fixed large batch (16 x 128 = 2048) with the AdaScale learning rate.

python launch/train.py --config=configs/fashion_mnist_adascale_large.py --workdir=workdir/fmnist_adascale_large
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.policy.kind = "static"
    config.policy.initial_batch_size = 16 * config.base_batch_size
    config.policy.max_batch_size = 16 * config.base_batch_size
    config.lr.rule = "adascale"
    return config
