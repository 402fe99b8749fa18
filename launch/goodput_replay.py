r"""Our goodput rule on a peer's own numbers, side by side with AdaptDL's goodput function.

    python launch/goodput_replay.py                 # ImageNet and CIFAR-10, N = 1 ... 64
    python launch/goodput_replay.py --out=docs/benchmarks/goodput_replay.md

For each workload and N GPUs (4 per machine), at every epoch of the traces' smallest-batch
run, the batch that `tf_adabatch.GoodputPolicy`'s rule picks (the most AdaScale progress
per second, `tf_adabatch.app.goodput_replay.choose`) and its predicted speed-up over the
smallest batch, three ways:

  adaptdl     AdaptDL's own `GoodputFunction.optimize`, computed once with its published
              code in a scratch environment (docs/benchmarks/adaptdl_reference/: the values,
              and the command that computed them; none of its code is in this project)
  rule+pollux our rule with Pollux's step-time model and AdaptDL's fitted parameters
              (the two models coincide: the same objective and the same step times)
  ours        our rule with our own step-time model (configs/profiles/*_t4.py)

Printed per N: the median speed-up of each over training, the batch each picks at 10 %,
50 % and 90 % of training, the relative speed-up differences against AdaptDL (median,
largest), and the step time of the smallest batch as measured and as each model
predicts it (what the differences come from).

Exit codes: 0 done; 2 a bad flag (one line on stderr).
"""

from __future__ import annotations

import json
import math
import os
import sys

import numpy as np
from absl import app, flags

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tf_adabatch.app import goodput_replay as R  # noqa: E402
from tf_adabatch.app import step_time_fit as F  # noqa: E402

REFERENCE = os.path.join(ROOT, "docs", "benchmarks", "adaptdl_reference", "values.json")
_WORKLOADS = flags.DEFINE_list("workloads", ["imagenet", "cifar10"], "Workloads to replay.")
_OUT = flags.DEFINE_string("out", None, "Also write the tables (Markdown) to this file.")


def measured_seconds(trace: F.Trace, devices: int, local: float) -> float:
    """The traces' step time for `devices` GPUs packed 4 per machine at local batch
    `local` (linear between the two nearest measured local batches; NaN if unmeasured)."""
    nodes = math.ceil(devices / R.GPUS_PER_NODE)
    keep = (trace.devices == devices) & (trace.nodes == nodes)
    if devices % R.GPUS_PER_NODE and nodes > 1:
        keep &= False  # a partial machine: not a packing the traces measured as such
    rows = trace.where(keep)
    if not len(rows.step_time):
        return math.nan
    order = np.argsort(rows.local_batch)
    xs, ys = rows.local_batch[order], rows.step_time[order]
    # Several placements with this (nodes, devices): their mean at each local batch.
    unique = np.unique(xs)
    means = np.array([ys[xs == x].mean() for x in unique])
    if not unique[0] <= local <= unique[-1]:
        return math.nan
    return float(np.interp(local, unique, means))


def replay_workload(workload: str, reference: dict) -> list[str]:
    folder = os.path.join(F.TRACES, workload)
    runs = R.read_validation(folder)
    trace = F.read_trace(folder)
    theirs = R.pollux_step_time(reference["perf_params"], reference["max_local_bsz"])
    ours = R.ours_step_time(F.fit(trace))
    lines = [
        f"**{workload}** (B_init {reference['init_batch_size']}, batches up to "
        f"{reference['max_batch_size']}, local batch {reference['min_local_bsz']}-"
        f"{reference['max_local_bsz']}; {len(runs[min(runs)].grad_sqr)} epochs)",
        "",
        "| N | median speed-up: adaptdl / rule+pollux / ours | batch at 10/50/90 %: adaptdl | "
        "rule+pollux | ours | rule+pollux vs adaptdl: median, largest | ours vs adaptdl: "
        "median, largest | smallest batch's step (s): measured / pollux / ours |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for n, points in reference["devices"].items():
        devices = int(n)
        same = R.replay(theirs, runs, devices=devices, min_local=reference["min_local_bsz"])
        mine = R.replay(ours, runs, devices=devices, min_local=reference["min_local_bsz"])
        assert all(c is not None for c in same + mine)
        at = [int(q * (len(points) - 1)) for q in (0.1, 0.5, 0.9)]
        smallest = points[0]["smallest_batch"]
        measured = measured_seconds(trace, devices, smallest / devices)
        a, b = R.summary(points, same), R.summary(points, mine)  # type: ignore[arg-type]
        lines.append(
            f"| {devices} | {np.median([p['speedup'] for p in points]):.2f} / "
            f"{np.median([c.speedup for c in same]):.2f} / "  # type: ignore[union-attr]
            f"{np.median([c.speedup for c in mine]):.2f} | "  # type: ignore[union-attr]
            + " | ".join(
                "/".join(str(batches[i]) for i in at)
                for batches in (
                    [p["batch"] for p in points],
                    [c.batch for c in same],  # type: ignore[union-attr]
                    [c.batch for c in mine],  # type: ignore[union-attr]
                )
            )
            + f" | {a['median']:.1%}, {a['largest']:.1%} | {b['median']:.1%}, "
            f"{b['largest']:.1%} | "
            f"{'-' if math.isnan(measured) else f'{measured:.3f}'} / "
            f"{theirs(smallest, devices):.3f} / {ours(smallest, devices):.3f} |"
        )
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        print(f"error: unexpected positional arguments: {argv[1:]}", file=sys.stderr)
        sys.exit(2)
    with open(REFERENCE, encoding="utf-8") as f:
        reference = json.load(f)
    unknown = [w for w in _WORKLOADS.value if w not in reference or w == "source"]
    if unknown:
        print(
            "error: flag `--workloads` must list workloads with AdaptDL reference values "
            f"(imagenet, cifar10). Received: --workloads={','.join(_WORKLOADS.value)}",
            file=sys.stderr,
        )
        sys.exit(2)
    lines = [f"AdaptDL reference: {reference['source']}", ""]
    for workload in _WORKLOADS.value:
        lines += [*replay_workload(workload, reference[workload]), ""]
    text = "\n".join(lines)
    print(text)
    if _OUT.value:
        with open(_OUT.value, "w", encoding="utf-8") as f:
            f.write(text)


if __name__ == "__main__":
    app.run(main)
