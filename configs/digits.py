r"""scikit-learn's 8x8 digits (1,797 images, ships with scikit-learn), MLP: a tiny real task.

python launch/train.py --config=configs/digits.py --workdir=workdir/digits
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    config = base.get_config()
    config.dataset = "digits"
    config.model = "mlp"
    config.num_cpu_replicas = 2
    config.micro_batch_size = 8
    config.base_batch_size = 16
    config.policy.initial_batch_size = 16
    config.policy.min_batch_size = 16
    config.policy.max_batch_size = 256
    config.optimizer.learning_rate = 0.05
    config.train.base_epochs = 20.0
    config.train.checkpoint_every_steps = 50
    config.train.eval_batch_size = 300
    return config
