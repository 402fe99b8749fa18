r"""Projects a finished run's time to its final progress tau onto clusters we do not have.

    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/this_machine.py \
        --profile=configs/profiles/assumed_nvlink_8gpu.py \
        --profile=configs/profiles/assumed_ethernet_64gpu.py \
        --max_devices=1024 --out=docs/benchmarks/cluster_projection

For N = 1, 2, 4, ..., `--max_devices` devices of each hardware profile (a shipped
profile by name, such as `this_machine`, or a file), prints the simulated seconds of
static B0, static 16 B0 with AdaScale, the run's SimiGrad batches replayed, and an ideal
goodput policy; writes `<out>.json`, `<out>.md` and `<out>.png`.

(docs/cluster_projection.md projects the digits run priced as the Fashion-MNIST CNN:
add `--num_parameters=225034`.)

Validation of the step-time model on this machine (about three minutes; one subprocess
per replica count):

    python launch/simulate_cluster.py --measure --out=docs/benchmarks/cluster_measure
    python launch/simulate_cluster.py --measure --measured=docs/benchmarks/cluster_measure.json

The model, the strategies and the fit: `tf_adabatch.app.simulation.cluster`.

Exit codes: 0 done; 2 a bad flag, profile or run (one line on stderr).
"""

from __future__ import annotations

import json
import os
import sys
from typing import NoReturn

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags, logging

from tf_adabatch.app.simulation import cluster
from tf_adabatch.app.simulation.cluster import SimulationError

_RUN = flags.DEFINE_string("run", None, "A finished run's workdir (has tensorboard/train).")
_PROFILES = flags.DEFINE_multi_string(
    "profile",
    [
        "configs/profiles/this_machine.py",
        "configs/profiles/assumed_nvlink_8gpu.py",
        "configs/profiles/assumed_ethernet_64gpu.py",
    ],
    "Hardware profiles, each a shipped profile's name (this_machine) or a config file "
    "(repeat the flag for several).",
)
_MAX_DEVICES = flags.DEFINE_integer("max_devices", 1024, "Simulate N = 1, 2, 4, ... up to this.")
_BASE_BATCH = flags.DEFINE_integer(
    "base_batch_size", None, "B0 of the run (default: inferred from its logged gains)."
)
_NUM_PARAMETERS = flags.DEFINE_integer(
    "num_parameters", None, "Parameters of the model (default: from checkpoints/fingerprint.json)."
)
_OUT = flags.DEFINE_string("out", None, "Output prefix: writes <out>.json, <out>.md, <out>.png.")
_MEASURE = flags.DEFINE_bool(
    "measure", False, "Time the engine here and fit this machine's profile."
)
_MEASURED = flags.DEFINE_string(
    "measured", None, "With --measure: refit from this saved <out>.json instead of timing."
)
_MEASURE_WORKER = flags.DEFINE_integer(
    "measure_worker", None, "Internal: time one replica count in this process, print JSON."
)
_MEASURE_KS = flags.DEFINE_list("measure_ks", ["1", "2", "4", "8"], "Micro-steps k to time.")
_MEASURE_STEPS = flags.DEFINE_integer("measure_steps", 30, "Timed steps per k (after 2 warm-up).")


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    logging.set_verbosity(logging.WARNING)  # TensorBoard's reader logs at INFO
    if len(argv) > 1:
        fail(f"Unexpected positional arguments: {argv[1:]}")
    try:
        ks = cluster.parse_ks(_MEASURE_KS.value)
        if _MEASURE_WORKER.value is not None:
            print(
                json.dumps(cluster.measure_worker(_MEASURE_WORKER.value, ks, _MEASURE_STEPS.value))
            )
        elif _MEASURE.value:
            cluster.measure(_OUT.value, ks, _MEASURE_STEPS.value, _MEASURED.value)
        else:
            cluster.project_run(
                _RUN.value,
                _PROFILES.value,
                max_devices=_MAX_DEVICES.value,
                base_batch_size=_BASE_BATCH.value,
                num_parameters=_NUM_PARAMETERS.value,
                out=_OUT.value,
            )
    except SimulationError as err:
        fail(str(err))


if __name__ == "__main__":
    app.run(main)
