r"""Trains one config: flags in, `tf_adabatch.experiment.run(config, workdir)` out.

    python launch/train.py --config=configs/fashion_mnist.py --workdir=workdir/fashion_mnist

Override any field: `--config.policy.target_similarity=0.3`. The config is locked, so
a mistyped field is an error that names the closest existing one. Rerunning the same
command on the same workdir resumes from its last checkpoint.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags
from ml_collections import config_flags

# Configs import their shared base as `configs.base`: put the repository root first.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Path to a config file.", lock_config=True
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output folder (checkpoints, TensorBoard, metrics)."
)
flags.mark_flags_as_required(["config", "workdir"])


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines drown the progress bar
    from tf_adabatch import experiment

    try:
        config = _CONFIG.value
        config.keys()  # a config that failed to load raises on first use
    except OSError as err:  # ml_collections reports a bad config file on first use
        print(f"error: --config: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(2)
    from tf_adabatch.engine import NonFiniteGradientsError

    try:
        experiment.run(config, _WORKDIR.value)
    except experiment.ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    except NonFiniteGradientsError as err:
        # No checkpoint was written while steps were skipped: the last one predates them.
        print(f"error: {err}", file=sys.stderr)
        sys.exit(3)
    except experiment.WorkerLostError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(4)


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with any bad flag or override reported as one line, exit code 2."""
    try:
        return flags.FLAGS(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as err:
        message = " ".join(str(err).replace("\\'", "'").replace("\\n", " ").split())
        if len(message) > 1 and message[0] == message[-1] and message[0] in "'\"":
            message = message[1:-1]
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
