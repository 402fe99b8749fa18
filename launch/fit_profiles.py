r"""Fits the step-time model to the measured GPU traces and prints its errors per workload.

    python launch/fit_profiles.py                     # every workload: fit, print the errors
    python launch/fit_profiles.py --workloads=cifar10 # one
    python launch/fit_profiles.py --write             # and rewrite configs/profiles/<name>.py

The traces (configs/profiles/pollux_traces/, from the Pollux / AdaptDL authors: real
step times of six workloads on 1 to 64 NVIDIA T4 GPUs, 4 per machine) and the model
(`tf_adabatch.clock.StepTimeModel`: compute linear in the local batch, a ring
all-reduce whose terms depend on whether it leaves the machine, their overlap) are
described in `tf_adabatch/app/step_time_fit.py`. Each workload is fitted three ways:
on every measured row (the shipped profile), on placements of at most 2 machines
(predicting those on 4 to 16), and on at most 4 (predicting 6 to 16). The printed
errors are |predicted / measured - 1| over the rows predicted: median, 90th percentile,
largest. The last column is the median measured all-reduce seconds per machine count.

`--write` rewrites each workload's profile file from the fit on every row, with the
parameters in full precision (a test refits and compares them).

Exit codes: 0 done; 2 a bad flag (one line on stderr).
"""

from __future__ import annotations

import os
import sys
from typing import Any

from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tf_adabatch.app import step_time_fit as F  # noqa: E402

_WORKLOADS = flags.DEFINE_list(
    "workloads", list(F.WORKLOADS), f"Workloads to fit (of {', '.join(F.WORKLOADS)})."
)
_WRITE = flags.DEFINE_bool("write", False, "Rewrite configs/profiles/<name>.py from the fits.")

_PROFILE_TEMPLATE = '''r"""{what} on NVIDIA T4 GPUs, 4 per machine: a MEASURED step-time profile.

Fitted by `python launch/fit_profiles.py --write` (do not edit by hand; refit instead)
to the step times the Pollux / AdaptDL authors measured for {what} on 1 to 64 T4
GPUs over 1 to 16 AWS g4dn.12xlarge machines (50 Gb/s between machines), every local
batch from {smallest} to {largest}: configs/profiles/pollux_traces/{workload}/
(placements.csv, scalability.csv; provenance and license in that folder's README.md
and LICENSE). The model is `tf_adabatch.clock.StepTimeModel`; its errors against the
measured rows are in docs/benchmarks.md ("Measured GPU profiles").

Used by the virtual clock: `--config.clock.profile={name} --config.clock.devices=N`.
"""

from ml_collections import config_dict


def get_config() -> config_dict.ConfigDict:
    config = config_dict.ConfigDict()
    config.name = "{name}"
    config.kind = "measured"
    config.measured = "{what}, NVIDIA T4 x 1-64, 4 per machine (Pollux traces)"
{fields}
    return config
'''


def profile_text(workload: str, model: Any, trace: Any) -> str:
    """The profile file for `workload` fitted as `model` on `trace`."""
    name, what = F.WORKLOADS[workload]
    fields = "\n".join(
        f"    config.{key} = {value!r}" for key, value in F.model_fields(model).items()
    )
    return _PROFILE_TEMPLATE.format(
        what=what,
        workload=workload,
        name=name,
        smallest=int(trace.local_batch.min()),
        largest=int(trace.local_batch.max()),
        fields=fields,
    )


def _row(label: str, e: F.Errors) -> str:
    return f"{label} {e.median:6.1%} {e.p90:6.1%} {e.largest:7.1%} ({e.rows} rows)"


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        print(f"error: unexpected positional arguments: {argv[1:]}", file=sys.stderr)
        sys.exit(2)
    unknown = [w for w in _WORKLOADS.value if w not in F.WORKLOADS]
    if unknown:
        print(
            f"error: flag `--workloads` must list workloads of {', '.join(F.WORKLOADS)}. "
            f"Received: --workloads={','.join(_WORKLOADS.value)}",
            file=sys.stderr,
        )
        sys.exit(2)
    print(
        "relative error |predicted/measured - 1|: median, 90th percentile, largest\n"
        f"{'workload':<12} {'fit on every row':<36} {'held out: <=2 -> >=4 machines':<36} "
        f"{'held out: <=4 -> >=6 machines':<36} all-reduce s by machines (median)"
    )
    for workload in _WORKLOADS.value:
        result = F.report(workload)
        sync = " ".join(f"{k}:{v:.3g}" for k, v in result["sync_by_nodes"].items())
        print(
            f"{workload:<12} {_row('', result['all']):<36} {_row('', result['held_out_2_to_4']):<36} "
            f"{_row('', result['held_out_4_to_6']):<36} {sync}"
        )
        if _WRITE.value:
            name = F.WORKLOADS[workload][0]
            path = os.path.join(ROOT, "configs", "profiles", f"{name}.py")
            trace = F.read_trace(os.path.join(F.TRACES, workload))
            with open(path, "w", encoding="utf-8") as f:
                f.write(profile_text(workload, result["model"], trace))
            print(f"  wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
    app.run(main)
