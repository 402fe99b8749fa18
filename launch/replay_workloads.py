r"""Time to target on six real GPU workloads, replayed from the Pollux traces (issue 45).

    python launch/replay_workloads.py --json=/tmp/replay.json
    python launch/replay_workloads.py --decisions=128        # twice the decision points
    python launch/replay_workloads.py --validate             # leave-one-out errors only

For each workload (configs/profiles/pollux_traces/), N in {1, 4, 8, 16, 64} GPUs and
policy: the seconds to the workload's target, static batches read off their traces,
adaptive policies replayed through the library's policy objects
(`tf_adabatch.app.simulation.workloads`, whose docstring states every assumption). The
table gives, per (workload, N), the best static batch and its seconds, and each row's
time as a multiple of it. `--json=FILE` writes one row per (workload, devices, policy):
`workload`, `devices`, `policy` ("static", "goodput", "default": the launcher's default
policy, "simigrad"), `seconds_to_target` (null: never reached or infeasible),
`static_batch` (static rows; else null).

Exit codes: 0 done; 2 a bad flag (one line on stderr).
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tf_adabatch.app.simulation import workloads as W  # noqa: E402

_JSON = flags.DEFINE_string("json", None, "Write the rows (JSON) to this file.")
_WORKLOADS = flags.DEFINE_list("workloads", list(W.TARGETS), "Workloads to replay.")
_DEVICES = flags.DEFINE_list("devices", [str(n) for n in W.DEVICES], "GPU counts N.")
_POLICIES = flags.DEFINE_list("policies", list(W.REPLAYED), f"Adaptive policies: {W.POLICIES}.")
_DECISIONS = flags.DEFINE_integer("decisions", W.DECISIONS, "Decision points over training.")
_CALLS = flags.DEFINE_integer("calls", W.CALLS, "Optimizer steps through the policy per point.")
_VALIDATE = flags.DEFINE_bool("validate", False, "Print the leave-one-out errors and stop.")


def _check_flags() -> list[int]:
    for name in _WORKLOADS.value:
        if name not in W.TARGETS:
            raise app.UsageError(f"--workloads must name {list(W.TARGETS)}. Received: {name!r}")
    for kind in _POLICIES.value:
        if kind not in W.POLICIES:
            raise app.UsageError(f"--policies must name {list(W.POLICIES)}. Received: {kind!r}")
    try:
        devices = [int(n) for n in _DEVICES.value]
    except ValueError:
        raise app.UsageError(f"--devices must be integers. Received: {_DEVICES.value}") from None
    if not devices or min(devices) < 1:
        raise app.UsageError(f"--devices must be integers >= 1. Received: {devices}")
    for flag in (_DECISIONS, _CALLS):
        if flag.value < 1:
            raise app.UsageError(f"--{flag.name} must be >= 1. Received: {flag.value}")
    return devices


def validation_table(names: list[str]) -> list[str]:
    """Leave-one-out: steps to target read off each trace, and predicted without it."""
    lines = ["| workload | batch: read / predicted (error) | median abs error | in-sample median |",
             "|---|---|---|---|"]  # fmt: skip
    for name in names:
        checks = W.leave_one_out(W.Workload.load(name))
        cells = ", ".join(
            f"{c.batch}: {c.trace_steps:.0f} / {c.predicted:.0f} ({c.error:+.1%})" for c in checks
        )
        median = np.median([abs(c.error) for c in checks])
        inside = np.median([abs(c.in_sample_error) for c in checks])
        lines.append(f"| {name} | {cells} | {median:.1%} | {inside:.1%} |")
    return lines


def replay_table(rows: list[dict], kinds: list[str]) -> list[str]:
    """Per (workload, N): the best static batch, static B_init and each policy, as x best."""
    head = " | ".join(kinds)
    lines = [f"| workload | N | best static (s) | static B_init | {head} |",
             "|---|---|---|---|" + "---|" * len(kinds)]  # fmt: skip
    cells: dict[tuple[str, int], list[dict]] = {}
    for row in rows:
        cells.setdefault((row["workload"], row["devices"]), []).append(row)
    for (name, n), mine in cells.items():
        static = {
            r["static_batch"]: r["seconds_to_target"] for r in mine if r["policy"] == "static"
        }
        done = {b: s for b, s in static.items() if s is not None}
        best = min(done, key=done.__getitem__)

        def ratio(seconds: float | None, best_seconds: float = done[best]) -> str:
            return "never" if seconds is None else f"{seconds / best_seconds:.2f}x"

        first = min(static)
        by_kind = {r["policy"]: r for r in mine}
        values = " | ".join(
            ratio(by_kind[k]["seconds_to_target"]) + f" (mean B {by_kind[k].get('mean_batch')})"
            for k in kinds
        )
        lines.append(f"| {name} | {n} | B={best}: {done[best]:.0f} | {ratio(static[first]) if static[first] else 'infeasible'} | "
                     f"{values} |")  # fmt: skip
    return lines


def main(argv: list[str]) -> None:
    del argv
    devices = _check_flags()
    if _VALIDATE.value:
        print("\n".join(validation_table(_WORKLOADS.value)))
        return
    import tensorflow as tf

    # The replay's functions are a few dozen ops: Grappler's passes cost more than they save.
    tf.config.optimizer.set_experimental_options({"disable_meta_optimizer": True})
    start = time.perf_counter()
    rows = W.replay(_WORKLOADS.value, devices, _POLICIES.value, decisions=_DECISIONS.value,
                    calls=_CALLS.value)  # fmt: skip
    print("\n".join(replay_table(rows, _POLICIES.value)))
    print(f"\nreplayed in {time.perf_counter() - start:.1f} s "
          f"(decisions={_DECISIONS.value}, calls={_CALLS.value})")  # fmt: skip
    if _JSON.value:
        with open(_JSON.value, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    app.run(main)
