r"""Statistical efficiency and time to accuracy on Fashion-MNIST: seven ways to train.

    python launch/benchmark_efficiency.py --outdir=workdir/benchmark_efficiency

Every run is the launcher (`python -m tf_adabatch.app`) on `--config` with the same base
schedule; only the batch-size policy and the learning-rate rule change (`--variants`).
GPU time priced by measured profiles: `--clock_profiles=cifar10_resnet18_t4`. A run that
already wrote its `metrics.json` is not rerun. Writes to `--outdir`: `results.json`,
`results.md`, the plots (and `gpu_time.md`, `policies.md` when they apply).

The variants, the tables and the plots: `tf_adabatch.app.benchmarks.efficiency`.
"""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

from tf_adabatch.app.benchmarks import efficiency
from tf_adabatch.app.benchmarks.efficiency import METRICS, VARIANTS

ROOT = Path(__file__).resolve().parent.parent

FLAGS = flags.FLAGS
flags.DEFINE_string("outdir", "workdir/benchmark_efficiency", "Where runs and results go.")
flags.DEFINE_string("config", str(ROOT / "configs" / "fashion_mnist.py"), "Base config file.")
flags.DEFINE_list("seeds", ["0", "1", "2"], "Seeds; each variant runs once per seed.")
flags.DEFINE_list("variants", list(VARIANTS), f"Subset of {list(VARIANTS)}.")
flags.DEFINE_float("base_epochs", 3.0, "Budget: epochs at the base batch (all variants).")
flags.DEFINE_float("eval_every_base_epochs", 0.5, "Evaluation interval (for the curves).")
flags.DEFINE_float("warmup_fraction", 0.2, "linear_16x: warm-up share of the budget.")
flags.DEFINE_integer("scale", 16, "S of the static large-batch variants and SimiGrad's cap.")
flags.DEFINE_list("override", [], "Extra config overrides, e.g. num_cpu_replicas=2.")
flags.DEFINE_integer("timeout_per_run", 1800, "Seconds before a run is stopped (and failed).")
flags.DEFINE_enum(
    "metric",
    "accuracy",
    list(METRICS),
    "The evaluation metric of the policy table's threshold (bits_per_byte: text configs).",
)
flags.DEFINE_list(
    "clock_profiles", [], "Measured profiles (configs/profiles) to price the runs' GPU time with."
)
flags.DEFINE_list(
    "clock_devices", ["1", "8", "64"], "GPU counts N to price (with --clock_profiles)."
)


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    efficiency.run_benchmark(efficiency.Options.from_flags(FLAGS))


if __name__ == "__main__":
    app.run(main)
