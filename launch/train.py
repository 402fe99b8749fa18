r"""Trains one config from a checkout: the launcher of `tf_adabatch.app.cli`, same flags.

    python launch/train.py --config=configs/fashion_mnist.py --workdir=workdir/fashion_mnist

From an installed package the same launcher is `python -m tf_adabatch.app` or the console
script `tf-adabatch-train`; `--config` also takes a shipped config by name
(`--config=fashion_mnist`). Flags, overrides and exit codes: `tf_adabatch.app.cli`.
"""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # before TensorFlow is imported
# Config files written for a checkout import `configs.base` (the shipped ones now import
# `tf_adabatch.app.configs.base`, which works installed too): the repository root first.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from tf_adabatch.app.cli import _interrupted, fail, main, parse_flags, run_cli

__all__ = ["_interrupted", "fail", "main", "parse_flags", "run_cli"]

if __name__ == "__main__":
    run_cli()
