r"""Synthetic 8x8 images, MLP, SimiGrad + AdaScale: seconds, for tests and smoke runs.

python launch/train.py --config=configs/synthetic.py --workdir=workdir/synthetic
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.dataset = "synthetic"
    config.model = "mlp"
    config.num_cpu_replicas = 2
    config.micro_batch_size = 16
    config.base_batch_size = 32
    config.policy.initial_batch_size = 32
    config.policy.min_batch_size = 32
    config.policy.max_batch_size = 256
    config.train.base_epochs = 2.0
    config.train.checkpoint_every_steps = 20
    config.train.eval_batch_size = 256
    return config
