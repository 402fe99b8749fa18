"""Replays the goodput rule on a peer's own numbers: the Pollux traces' gradient statistics.

For a workload of the traces (configs/profiles/pollux_traces/<workload>/) and N GPUs, at
every epoch of its smallest-batch run (`validation-<B_init>.csv`: AdaptDL's |G|^2 and
the variance of a B_init-batch gradient), the rule of `tf_adabatch.GoodputPolicy` picks
the global batch B in [max(B_init, N x the smallest measured local batch), the largest
validated batch] with the most progress per second,

    rate(B) = r(B) / T(B, N),   r = AdaScale's gain (`tf_adabatch.stats.adascale_gain`),

over every multiple of N in that range (the policy moves in whole per-device units), and
its predicted speed-up over the smallest batch, rate(B*) / rate(B_min). AdaptDL's goodput,
throughput x efficiency = (B / T) x (r / S) = B_init x r / T, is the same objective; the
two differ in the step-time model T and in the candidate batches (AdaptDL samples 50
batches geometrically; this replay tries every multiple of N).

Two step-time models: ours (`StepTimeModel`, fitted by `step_time_fit.fit`), and
Pollux's (the model of Qiao et al., OSDI 2021, section 4.1, with parameters fitted by
AdaptDL's own code and stored beside its reference values,
docs/benchmarks/adaptdl_reference/values.json), evaluated by `pollux_step_time`, written
here from the paper's description:

    T_compute(m) = alpha_c + beta_c m          (m: examples per device per micro-step)
    T_network    = 0 (N = 1); alpha_r + beta_r (N - 2) on one machine; alpha_n + beta_n (N - 2) across
    T(B, N)      = s T_compute + (T_compute^gamma + T_network^gamma)^(1/gamma)

with s accumulation steps (a device's share split into micro-steps of at most the
largest measured local batch, rounded up to whole examples, as in the traces).
"""

from __future__ import annotations

import csv
import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from tf_adabatch import stats
from tf_adabatch.clock import StepTimeModel

__all__ = ["Choice", "Validation", "choose", "pollux_step_time", "read_validation"]

GPUS_PER_NODE = 4


class Validation(NamedTuple):
    """A training run of the traces at a fixed batch: one row per epoch.

    >>> from tf_adabatch.app.step_time_fit import TRACES
    >>> runs = read_validation(os.path.join(TRACES, "cifar10"))
    >>> sorted(runs)[:2], len(runs[128].grad_sqr)
    ([128, 256], 100)
    """

    progress: np.ndarray
    grad_sqr: np.ndarray  # |G|^2
    grad_var: np.ndarray  # the variance of a B_init-batch gradient: tr(Sigma) / B_init


def read_validation(folder: str) -> dict[int, Validation]:
    """Every `validation-<B>.csv` of a workload folder, by batch B.

    >>> from tf_adabatch.app.step_time_fit import TRACES
    >>> runs = read_validation(os.path.join(TRACES, "imagenet"))
    >>> sorted(runs)[0], sorted(runs)[-1], len(runs[200].progress)
    (200, 12800, 90)
    """
    runs = {}
    for name in sorted(os.listdir(folder)):
        if name.startswith("validation-") and name.endswith(".csv"):
            with open(os.path.join(folder, name), newline="") as f:
                rows = [
                    (float(r["progress"]), float(r["grad_sqr"]), float(r["grad_var"]))
                    for r in csv.DictReader(f)
                ]
            runs[int(name[len("validation-") : -len(".csv")])] = Validation(
                *np.asarray(rows, dtype=np.float64).T
            )
    return runs


def pollux_step_time(params: dict[str, float], max_local: int) -> Callable[[int, int], float]:
    """T(B, N) of Pollux's model with `params` (alpha_c, beta_c, alpha_n, beta_n, alpha_r,
    beta_r, gamma), the device's share split into micro-steps of at most `max_local`.

    >>> t = pollux_step_time(dict(alpha_c=1.0, beta_c=0.1, alpha_n=2.0, beta_n=0.0,
    ...                           alpha_r=0.5, beta_r=0.0, gamma=1.0), max_local=10)
    >>> t(10, 1), t(40, 4), t(80, 4)  # 2; 2 + 0.5; one extra micro-step of 10: 2 + 2.5
    (2.0, 2.5, 4.5)
    """

    def seconds(batch: int, devices: int) -> float:
        share = batch / devices
        extra = math.ceil(share / max_local - 1e-8) - 1
        micro = math.ceil(share / (extra + 1) - 1e-8)
        compute = params["alpha_c"] + params["beta_c"] * micro
        if devices == 1:
            network = 0.0
        elif math.ceil(devices / GPUS_PER_NODE) == 1:
            network = params["alpha_r"] + params["beta_r"] * (devices - 2)
        else:
            network = params["alpha_n"] + params["beta_n"] * (devices - 2)
        g = params["gamma"]
        return extra * compute + (compute**g + network**g) ** (1.0 / g)

    return seconds


def ours_step_time(model: StepTimeModel) -> Callable[[int, int], float]:
    """T(B, N) of our fitted model (micro-steps of whole examples, as the traces ran)."""

    def seconds(batch: int, devices: int) -> float:
        share = batch / devices
        extra = math.ceil(share / model.max_local_batch - 1e-8) - 1
        micro = math.ceil(share / (extra + 1) - 1e-8)
        return model.placement_seconds(micro, devices, model.nodes(devices), extra + 1)

    return seconds


class Choice(NamedTuple):
    """The rule's batch, and its rate over the smallest batch's.

    >>> Choice(batch=512, smallest=128, speedup=1.5).speedup
    1.5
    """

    batch: int
    smallest: int
    speedup: float


def choose(
    step_time: Callable[[int, int], float],
    *,
    grad_sqr: float,
    grad_var: float,
    init_batch: int,
    devices: int,
    min_local: int,
    max_batch: int,
) -> Choice | None:
    """The batch with the most progress per second, r(B) / T(B, N), over the multiples of
    N in [max(B_init, N min_local), max_batch]; None if that range is empty.

    >>> flat = lambda batch, devices: 1.0   # a step costs 1 s whatever its batch
    >>> choose(flat, grad_sqr=0.0, grad_var=1.0, init_batch=8, devices=2, min_local=2,
    ...        max_batch=64)  # pure noise: r = S, the largest batch wins, 8x faster
    Choice(batch=64, smallest=8, speedup=8.0)
    """
    unit = devices
    lowest = max(init_batch, devices * min_local)
    first, last = -(-lowest // unit), max_batch // unit
    if first > last:
        return None
    batches = np.arange(first, last + 1, dtype=np.float64) * unit
    gains = stats.adascale_gain(grad_sqr, grad_var * init_batch, batches, float(init_batch))
    times = np.array([step_time(int(b), devices) for b in batches])
    rates = np.asarray(gains, dtype=np.float64) / times
    best = int(np.argmax(rates))
    return Choice(int(batches[best]), int(batches[0]), float(rates[best] / rates[0]))


def replay(
    step_time: Callable[[int, int], float],
    runs: dict[int, Validation],
    *,
    devices: int,
    min_local: int,
) -> list[Choice | None]:
    """`choose` at every epoch of the smallest-batch run."""
    init, largest = min(runs), max(runs)
    stats_run = runs[init]
    return [
        choose(
            step_time,
            grad_sqr=float(sqr),
            grad_var=float(var),
            init_batch=init,
            devices=devices,
            min_local=min_local,
            max_batch=largest,
        )
        for sqr, var in zip(stats_run.grad_sqr, stats_run.grad_var, strict=True)
    ]


def summary(reference: list[dict[str, Any]], ours: list[Choice | None]) -> dict[str, float]:
    """Largest and median relative speed-up difference against AdaptDL's points."""
    diffs = [
        abs(mine.speedup / point["speedup"] - 1.0)
        for mine, point in zip(ours, reference, strict=True)
        if mine is not None
    ]
    return {"points": len(diffs), "median": float(np.median(diffs)), "largest": max(diffs)}
