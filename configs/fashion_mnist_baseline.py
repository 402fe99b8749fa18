r"""Baseline: Fashion-MNIST CNN at the static base batch 128 (what the schedule was tuned for).

python launch/train.py --config=configs/fashion_mnist_baseline.py --workdir=workdir/fmnist_baseline
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.policy.kind = "static"
    config.lr.rule = "none"
    return config
