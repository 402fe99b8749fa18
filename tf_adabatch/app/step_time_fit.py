"""Fits `tf_adabatch.clock.StepTimeModel` to measured GPU step times (the Pollux traces).

The traces (configs/profiles/pollux_traces/, copied from petuum/adaptdl with their
provenance and license) time real workloads on 1 to 64 NVIDIA T4 GPUs, 4 per machine:
`placements.csv` (one digit per machine: the GPUs used there; 1 to 4 machines) and
`scalability.csv` (6 to 16 machines), every local batch size, the step's seconds and
its all-reduce part.

The fit minimises the squared log-ratio of predicted to measured step time over every
row (a relative error, so the fast steps count as much as the slow ones), with every
term kept non-negative (fitted as logarithms) and the overlap g = 1 + e^x >= 1, by
`scipy.optimize.least_squares` from a fixed start: deterministic.

    python launch/fit_profiles.py            # refits, prints the errors
    python launch/fit_profiles.py --write    # and rewrites configs/profiles/*_t4.py

Errors are |predicted / measured - 1| per row: the median, 90th percentile and largest
over every row, and two held-out errors: fitted on placements of at most 2 machines,
the rows on 4 to 16 machines; fitted on at most 4 machines (every `placements.csv`
row), the `scalability.csv` rows on 6 to 16.
"""

from __future__ import annotations

import csv
import dataclasses
import os
from typing import Any, NamedTuple

import numpy as np

from tf_adabatch.app import resources
from tf_adabatch.clock import StepTimeModel

__all__ = ["TRACES", "WORKLOADS", "Errors", "Trace", "errors", "fit", "read_trace", "report"]

# Installed with the package (configs/profiles/pollux_traces in a checkout).
TRACES = resources.traces_dir()
# Workload folder -> (profile name, what was measured).
WORKLOADS = {
    "cifar10": ("cifar10_resnet18_t4", "ResNet-18 on CIFAR-10"),
    "imagenet": ("imagenet_resnet50_t4", "ResNet-50 on ImageNet"),
    "bert": ("bert_squad_t4", "BERT question-answering fine-tuning"),
    "deepspeech2": ("deepspeech2_t4", "DeepSpeech2 speech recognition"),
    "yolov3": ("yolov3_t4", "YOLOv3 object detection"),
    "ncf": ("ncf_t4", "NCF recommendation"),
}
GPUS_PER_NODE = 4  # the testbed: AWS g4dn.12xlarge, 4 T4 GPUs per machine

# The fitted terms, in the order of the parameter vector (logarithms of seconds).
_TERMS = (
    "compute_fixed",
    "compute_per_example",
    "intra_fixed",
    "intra_bandwidth",
    "intra_latency",
    "inter_fixed",
    "inter_bandwidth",
    "inter_latency",
    "pair_extra",
)


class Trace(NamedTuple):
    """Measured rows, one per (placement, local batch): arrays of equal length.

    >>> trace = read_trace(os.path.join(TRACES, "bert"))
    >>> single = trace.where(trace.devices == 1)
    >>> bool((single.nodes == 1).all()), int(single.local_batch.min())
    (True, 4)
    """

    nodes: np.ndarray  # machines used
    devices: np.ndarray  # GPUs used
    local_batch: np.ndarray  # examples per GPU per step
    step_time: np.ndarray  # seconds per optimizer step
    sync_time: np.ndarray  # its all-reduce part, seconds

    def where(self, keep: np.ndarray) -> Trace:
        return Trace(*(column[keep] for column in self))


def read_trace(folder: str) -> Trace:
    """Reads `placements.csv` and `scalability.csv` of one workload folder.

    >>> trace = read_trace(os.path.join(TRACES, "cifar10"))
    >>> int(trace.devices.max()), int(trace.nodes.max()), len(trace.step_time) > 1000
    (64, 16, True)
    """
    rows: list[tuple[float, ...]] = []
    with open(os.path.join(folder, "placements.csv"), newline="") as f:
        for row in csv.DictReader(f):
            digits = [int(c) for c in row["placement"]]
            rows.append(
                (len(digits), sum(digits), int(row["local_bsz"]), float(row["step_time"]),
                 float(row["sync_time"]))
            )  # fmt: skip
    with open(os.path.join(folder, "scalability.csv"), newline="") as f:
        for row in csv.DictReader(f):
            rows.append(
                (int(row["num_nodes"]), int(row["num_replicas"]), int(row["local_bsz"]),
                 float(row["step_time"]), float(row["sync_time"]))
            )  # fmt: skip
    if not rows:
        raise ValueError(f"read_trace: no rows in {folder}.")
    return Trace(*np.asarray(rows, dtype=np.float64).T)


def _model(x: np.ndarray, max_local_batch: int) -> StepTimeModel:
    terms = dict(zip(_TERMS, np.exp(x[: len(_TERMS)]).tolist(), strict=True))
    return StepTimeModel(
        **terms,
        overlap=1.0 + float(np.exp(x[-1])),
        gpus_per_node=GPUS_PER_NODE,
        max_local_batch=max_local_batch,
    )


def predict(model: StepTimeModel, trace: Trace) -> np.ndarray:
    """The model's step time for every row of `trace` (its own placements, k = 1)."""
    return np.array(
        [
            model.placement_seconds(m, int(n), int(nodes))
            for nodes, n, m in zip(trace.nodes, trace.devices, trace.local_batch, strict=True)
        ]
    )


def _predict_vector(x: np.ndarray, trace: Trace) -> np.ndarray:
    """`predict` for a parameter vector, vectorised (the fit calls it thousands of times)."""
    c0, c1, i0, i1, i2, r0, r1, r2, pair = np.exp(x[: len(_TERMS)])
    g = 1.0 + np.exp(x[-1])
    n = trace.devices
    compute = c0 + c1 * trace.local_batch
    share, hops = (n - 1) / n, n - 1
    inter = r0 + np.where(trace.nodes == 2, pair, 0.0) + r1 * share + r2 * hops
    sync = np.where(trace.nodes <= 1, i0 + i1 * share + i2 * hops, inter)
    sync = np.where(n <= 1, 0.0, sync)
    return (compute**g + sync**g) ** (1.0 / g)


def fit(
    trace: Trace, *, max_local_batch: int | None = None, pair_extra: bool = True
) -> StepTimeModel:
    """The `StepTimeModel` whose step times are closest to `trace`'s (log-ratio, least squares).

    `max_local_batch` defaults to the largest local batch measured. `pair_extra=False`
    holds that term at 0 (a fit on at most 2 machines cannot tell it from
    `inter_fixed`).

    >>> trace = read_trace(os.path.join(TRACES, "imagenet"))
    >>> model = fit(trace)
    >>> model.max_local_batch, model.overlap >= 1.0
    (200, True)
    """
    from scipy.optimize import least_squares  # the application's dependency, not the library's

    t = trace.step_time
    x0 = np.full(len(_TERMS) + 1, np.log(1e-3 * float(np.min(t))))
    x0[0] = np.log(float(np.min(t)) / 2)
    x0[1] = np.log(float(np.min(t / trace.local_batch)) / 2)
    x0[-1] = 0.0  # overlap 2

    pair = _TERMS.index("pair_extra")
    off = -np.inf  # e^-inf = 0: the term held at 0

    def residuals(x: np.ndarray) -> np.ndarray:
        if not pair_extra:
            x = np.concatenate([x[:pair], [off], x[pair:]])
        return np.log(_predict_vector(x, trace)) - np.log(t)

    start = x0 if pair_extra else np.delete(x0, pair)
    solution = least_squares(residuals, start, method="trf", x_scale=1.0, max_nfev=20_000)
    x = solution.x if pair_extra else np.concatenate([solution.x[:pair], [off], solution.x[pair:]])
    largest = int(np.max(trace.local_batch)) if max_local_batch is None else max_local_batch
    return _model(x, largest)


class Errors(NamedTuple):
    """Relative errors |predicted / measured - 1| over `rows` rows.

    >>> Errors(rows=3, median=0.05, p90=0.1, largest=0.2).p90
    0.1
    """

    rows: int
    median: float
    p90: float
    largest: float


def errors(model: StepTimeModel, trace: Trace) -> Errors:
    """The model's relative errors against `trace`'s measured step times.

    >>> trace = read_trace(os.path.join(TRACES, "ncf"))
    >>> result = errors(fit(trace), trace)
    >>> result.rows == len(trace.step_time), result.median < result.p90 <= result.largest
    (True, True)
    """
    relative = np.abs(predict(model, trace) / trace.step_time - 1.0)
    return Errors(
        len(relative),
        float(np.median(relative)),
        float(np.quantile(relative, 0.9)),
        float(np.max(relative)),
    )


def report(workload: str, folder: str | None = None) -> dict[str, Any]:
    """Fits one workload three ways; returns the model and its errors.

    Keys: "model" (fitted on every row), "all" (its errors on every row),
    "held_out_2_to_4" (fitted on <= 2 machines, errors on >= 4), "held_out_4_to_6"
    (fitted on <= 4 machines, errors on >= 6), "sync_by_nodes" (the median measured
    all-reduce seconds per machine count: what the held-out errors depend on).

    >>> result = report("yolov3")
    >>> sorted(result["sync_by_nodes"]) == [1, 2, 3, 4, 6, 8, 12, 16]
    True
    """
    trace = read_trace(folder or os.path.join(TRACES, workload))
    model = fit(trace)
    largest = int(np.max(trace.local_batch))
    result: dict[str, Any] = {"model": model, "all": errors(model, trace)}
    for name, train_max, test_min in (("held_out_2_to_4", 2, 4), ("held_out_4_to_6", 4, 6)):
        train = trace.where(trace.nodes <= train_max)
        test = trace.where(trace.nodes >= test_min)
        held_out = fit(train, max_local_batch=largest, pair_extra=train_max > 2)
        result[name] = errors(held_out, test)
    multi = trace.where(trace.devices > 1)
    result["sync_by_nodes"] = {
        int(k): float(np.median(multi.sync_time[multi.nodes == k])) for k in np.unique(multi.nodes)
    }
    return result


def model_fields(model: StepTimeModel) -> dict[str, Any]:
    """The model's fields, for a profile file."""
    return dataclasses.asdict(model)
