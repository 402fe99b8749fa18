r"""The main job: Fashion-MNIST CNN, SimiGrad batch control with the AdaScale learning rate.

    python launch/train.py --config=configs/fashion_mnist.py --workdir=workdir/fashion_mnist

4 logical CPU replicas (or all local GPUs) x micro-batch 32; the batch starts at the
base batch 128 and SimiGrad moves it within [128, 2048] to hold the groups' gradient
similarity at 0.5; AdaScale scales the learning rate by the gain and runs the cosine
schedule of a 10-epoch base-batch run on scale-invariant progress.
"""

from ml_collections import config_dict

from tf_adabatch.app.configs import base


def get_config() -> config_dict.ConfigDict:
    return base.get_config()
