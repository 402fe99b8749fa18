r"""Exact against estimated similarity on the same gradients: a paired measurement.

    python launch/similarity_paired.py --outdir=workdir/similarity_paired \
        --snapshot_steps=5,60,150,300 --ks=1,2,3,4,5,6 --draws=150 --iterates=5

An exact-mode run of --config is taken to each of --snapshot_steps (the launcher,
resuming its own checkpoints; kept snapshots are reused); at each, both modes' readings
come from the SAME micro-gradients, and the report says where the SimiGrad controller
would settle on each. `--config.FIELD=VALUE` overrides go to the snapshot run too.

The measurement and the report: `tf_adabatch.app.benchmarks.similarity_paired`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags
from ml_collections import config_flags

from tf_adabatch.app.benchmarks import similarity_paired

ROOT = Path(__file__).resolve().parent.parent

FLAGS = flags.FLAGS
_CONFIG = config_flags.DEFINE_config_file(
    "config", str(ROOT / "configs" / "fashion_mnist.py"), "Config of the exact-mode run."
)
flags.DEFINE_string("outdir", "workdir/similarity_paired", "Run, snapshots and results.")
flags.DEFINE_list("snapshot_steps", ["5", "60", "150", "300"], "Optimizer steps to measure at.")
flags.DEFINE_list("ks", ["1", "2", "4"], "Micro-steps per replica (batch N k m) to measure.")
flags.DEFINE_integer("draws", 200, "Independent batches per snapshot and k.")
flags.DEFINE_integer("iterates", 1, "Checkpoints pooled per snapshot step S (n).")
flags.DEFINE_integer("iterate_spacing", 1, "Steps between them (d): S-(n-1)d, ..., S-d, S.")
flags.DEFINE_bool(
    "report_only", False, "Rebuild the report from --outdir's results.json (no measuring)."
)
flags.DEFINE_integer("bootstrap", 2000, "Bootstrap resamples for the intervals.")
flags.DEFINE_integer("seed", 0, "Seed of the draws and the bootstrap.")
flags.DEFINE_integer("timeout_per_stage", 1800, "Seconds before a training stage is failed.")


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
    # The config's overrides on this command line go to the snapshot run as well.
    overrides = [a for a in sys.argv[1:] if a.startswith("--config.")]
    similarity_paired.run(
        similarity_paired.Options.from_flags(FLAGS),
        _CONFIG.value,
        config_flags.get_config_filename(FLAGS["config"]),
        overrides,
    )


if __name__ == "__main__":
    app.run(main)
