"""Replays whole training jobs of six real GPU workloads from the Pollux / AdaptDL traces.

For each workload of configs/profiles/pollux_traces/ (ResNet-18 on CIFAR-10, ResNet-50
on ImageNet, BERT fine-tuning, DeepSpeech2, YOLOv3, NCF), N GPUs (4 per machine) and a
batch-size policy: the seconds to the workload's target metric (`TARGETS`).

Static batches, from the data alone (`static_seconds`): the optimizer steps to the
target read off that batch's trace (the `iteration` of the first epoch whose best-so-far
metric reaches the target) x the step time of that batch on N GPUs, from the
workload's fitted `StepTimeModel` (configs/profiles/*_t4.py,
`tf_adabatch.app.factories.load_step_time_model`; its `step_seconds` splits a share above
`max_local_batch` into equal micro-steps, the extra ones charged as accumulation). A
batch that cannot give every GPU the smallest measured local batch is infeasible: None.

Adaptive policies, through the library's own policy objects (`replay_policy`): the run
advances AdaScale's scale-invariant progress tau (in steps of the traces' smallest batch
B_init) and the clock, the statistics it sees interpolated between the traces at
(tau, the batch it runs). Modelling assumptions, all of them:

1. Statistics. Each trace row's `grad_sqr` (|G|^2) and `grad_var` (the variance of a
   B_init-batch gradient) hold over the epoch that row ends, (progress of the previous
   row, progress of the row] (and after the last row): the gain they give is the epoch's
   measured progress / iterations to 1-3 % on every trace after the first epoch
   (a row's statistics describe its own epoch, not its end). The first rows' statistics
   do not (YOLOv3 at B = 512: gain 1.0 from them, 11 measured), so the first epoch's
   grad_var is the one that gives the measured gain with the row's grad_sqr,
   var = sqr (r - 1) / (1 - r / S) (kept as read when S = 1 or r is outside (1, S)).
   At a batch B between two validated batches B_lo <= B <= B_hi, linear in log2 B
   between the two traces' values at the same progress (Pollux's simulator
   interpolates linearly in B at the same epoch); outside the validated range, the
   nearest trace's. Only the statistics at the batch the policy runs are shown to it
   (a real run measures only its own batch).
2. Gain. Progress per optimizer step is AdaScale's gain r = (var + sqr) / (var / S + sqr),
   S = B / B_init (`tf_adabatch.stats.adascale_gain` with tr(Sigma) = var x B_init): the
   traces' runs advanced their own progress this way. Steps may be fractional.
3. Target. The metric of each trace is its best-so-far value at the last epoch row at or
   before tau (an epoch that has not ended has not been evaluated). At batch B it is
   that of the two nearest validated batches, linear in log2 B. The run ends at the
   first tau where the metric at the batch it runs then reaches the target. A run's
   history before that batch plays no part: only its progress does.
4. Time. Every optimizer step at global batch B is charged `StepTimeModel.step_seconds(B,
   N)` (the virtual clock's price: `tf_adabatch.VirtualClock`), with no time for
   evaluations, checkpoints or batch changes.
5. Decisions. The policy is consulted at decision points every `tau_end / decisions` of
   progress (tau_end: the traces' last epoch), `DECISIONS` = 64 by default, and early on
   also whenever progress has doubled since the last one (at least tau_end / decisions /
   64 apart): without these, a run that starts small spent a whole spacing (thousands of
   steps on NCF) at its first batch. At each,
   `calls` (`CALLS` = 4) consecutive optimizer steps run through the policy object, each
   one call of a `tf.function` (the statistics held at the decision's progress, each step's
   progress, gain, similarity and noise scale given to the policy, and for the goodput
   policy each step's time fed to its `ThroughputModel` after its decision, as the
   engine's host does). The steps until the next decision point then run at the last
   batch in numpy (the number of steps: the progress to go over the gain, summed over
   the pieces where the statistics are constant, `Workload.steps_between`). `docs/benchmarks.md` shows the results with twice as many decision
   points.
6. Policies, their bounds and units: the batch moves in multiples of N (one example per
   GPU per micro-step; the clock prices the global batch whatever its split), within
   [the smallest multiple of N >= max(B_init, N x the smallest measured local batch),
   the largest multiple of N <= the largest validated batch]; it starts at the lower
   bound, and B0 (the AdaScale base) is B_init. "default" is the launcher's default
   policy (`configs/base.py`: `policy.kind` and its fields, built by
   `tf_adabatch.app.factories.make_policy`) with those bounds; "goodput" the launcher's
   goodput policy (`policy.kind = "goodput"`, its default hysteresis and a fresh
   `ThroughputModel`); "simigrad" SimiGrad's controller at the paper's ResNet-18 target
   0.2 (the launcher's other SimiGrad defaults); "probing" `tf_adabatch.ProbingGoodputPolicy`
   with its defaults (B0 = B_init: the ladder B_init x 2^j; not a launcher kind). A probe
   step of it is one of the `calls` steps of a decision point: a probe started at the
   last one runs the whole spacing at the probe batch (its interval's doubling after
   lost probes makes this rarer). SimiGrad sees the similarity estimated
   from the moments, |G|^2 / (|G|^2 + 2 tr(Sigma) / B) (`tf_adabatch.stats.
   estimated_similarity`), not a measured one: the traces hold no cosine.

Example (CIFAR-10 at the static batch 512 on 4 GPUs; the trace reaches 94 % at
iteration 7,265):

>>> cifar = Workload.load("cifar10")
>>> cifar.trace_steps(512)[0]
7265.0
>>> round(static_seconds(cifar, 512, devices=4))
851
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from tf_adabatch.app import factories
from tf_adabatch.app.step_time_fit import TRACES, WORKLOADS, read_trace
from tf_adabatch.clock import StepTimeModel

__all__ = [
    "CALLS",
    "DECISIONS",
    "DEVICES",
    "POLICIES",
    "REPLAYED",
    "TARGETS",
    "Check",
    "Outcome",
    "Run",
    "Target",
    "Workload",
    "gain",
    "leave_one_out",
    "make_policy",
    "replay",
    "replay_policy",
    "static_seconds",
]

DEVICES = (1, 4, 8, 16, 64)
POLICIES = ("goodput", "default", "simigrad", "probing")
# The policies `replay` runs unless told otherwise (the 60 s budget of the launch script).
REPLAYED = ("goodput", "default", "probing")
DECISIONS = 64  # decision points over the traces' progress
CALLS = 4  # optimizer steps through the policy object at each decision point
_BEFORE = -1e30  # the (signed) metric before a trace's first evaluation


class Target(NamedTuple):
    """A workload's target metric and its direction.

    >>> TARGETS["deepspeech2"].higher_is_better
    False
    """

    value: float
    higher_is_better: bool


# Each a value that every validated batch's trace reaches (docs/benchmarks.md, "Time to
# target on six real workloads": the direction of each metric and the best each reaches).
TARGETS = {
    "cifar10": Target(0.94, True),  # top-1 accuracy; the worst best: 0.9418 (B = 4096)
    "imagenet": Target(0.75, True),  # top-1 accuracy; 0.7551 (B = 1600)
    "bert": Target(88.0, True),  # SQuAD F1; 88.08 (B = 384), at the second and last epoch
    "deepspeech2": Target(25.0, False),  # word error rate, %; 24.41 (B = 40)
    "yolov3": Target(12.5, False),  # validation loss; 12.19 (B = 8)
    "ncf": Target(0.69, True),  # hit rate; 0.6909 (B = 4096)
}


class Run(NamedTuple):
    """A trace's run at one fixed batch: one row per epoch (`validation-<B>.csv`).

    >>> run = Workload.load("cifar10").runs[128]  # 100 epochs, 39,062 steps of 128
    >>> len(run.progress), int(run.iteration[-1])
    (100, 39062)
    """

    progress: np.ndarray
    iteration: np.ndarray
    metric: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


def read_runs(folder: str) -> dict[int, Run]:
    """Every `validation-<B>.csv` of a workload folder, by batch.

    >>> runs = read_runs(os.path.join(TRACES, "bert"))
    >>> sorted(runs), runs[12].iteration.tolist()
    ([12, 24, 48, 96, 192, 384], [7387.0, 14774.0])
    """
    runs = {}
    for name in os.listdir(folder):
        if name.startswith("validation-") and name.endswith(".csv"):
            with open(os.path.join(folder, name), newline="") as f:
                rows = [[float(r[key]) for key in Run._fields] for r in csv.DictReader(f)]
            runs[int(name[len("validation-") : -len(".csv")])] = Run(
                *np.asarray(rows, dtype=np.float64).T
            )
    return dict(sorted(runs.items()))


def gain(grad_sqr: Any, grad_var: Any, batch: Any, base: float) -> np.ndarray:
    """AdaScale's gain in numpy: `tf_adabatch.stats.adascale_gain(grad_sqr, grad_var x base,
    batch, base)` (the tests compare them), grad_var being the variance at `base`.

    >>> gain(0.0, 1.0, 64.0, 16.0).item(), gain(1.0, 0.0, 64.0, 16.0).item()
    (4.0, 1.0)
    """
    sqr, var = np.asarray(grad_sqr, np.float64), np.asarray(grad_var, np.float64)
    scale = np.asarray(batch, np.float64) / base
    num, den = var + sqr, var / scale + sqr
    ok = np.isfinite(num) & np.isfinite(den) & (den > 0)
    r = np.where(ok, num / np.where(ok, den, 1.0), 1.0)
    return np.clip(r, np.minimum(scale, 1.0), np.maximum(scale, 1.0))


@dataclasses.dataclass(frozen=True)
class Workload:
    """One workload's traces, target and step-time model (see the module docstring).

    >>> ncf = Workload.load("ncf")
    >>> ncf.base_batch, ncf.min_local, ncf.without(256).base_batch
    (256, 32, 256)
    """

    name: str
    runs: Mapping[int, Run]
    target: Target
    step_time: StepTimeModel
    min_local: int
    base_batch: int

    @classmethod
    def load(cls, name: str, target: Target | None = None) -> Workload:
        if name not in WORKLOADS:
            raise ValueError(
                f"Workload.load: argument `name` must be one of {sorted(WORKLOADS)}. "
                f"Received: name={name!r}"
            )
        folder = os.path.join(TRACES, name)
        runs = read_runs(folder)
        return cls(
            name=name,
            runs=runs,
            target=target or TARGETS[name],
            step_time=factories.load_step_time_model(WORKLOADS[name][0]),
            min_local=int(read_trace(folder).local_batch.min()),
            base_batch=min(runs),
        )

    def without(self, batch: int) -> Workload:
        """The same workload with `batch`'s trace left out (B_init stays: the other
        traces' grad_var is the variance at it)."""
        if batch not in self.runs or len(self.runs) < 2:
            raise ValueError(
                f"Workload.without: argument `batch` must be one of {list(self.runs)} "
                f"(and leave one). Received: batch={batch!r}"
            )
        runs = {b: r for b, r in self.runs.items() if b != batch}
        return dataclasses.replace(self, runs=runs)

    @property
    def batches(self) -> np.ndarray:
        return np.array(list(self.runs), dtype=np.float64)

    @property
    def end(self) -> float:
        """The progress of the traces' last epoch (the longest run)."""
        return max(float(r.progress[-1]) for r in self.runs.values())

    def _pairs(self, batches: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """For each batch: the indices of the two nearest traces and the weight of the
        upper one, linear in log2 B, clamped to the validated range."""
        xs = np.log2(self.batches)
        x = np.log2(np.asarray(batches, np.float64))
        if len(xs) == 1:
            zero = np.zeros(x.shape, np.int64)
            return zero, zero, np.zeros(x.shape)
        lo = np.clip(np.searchsorted(xs, x, side="right") - 1, 0, len(xs) - 2)
        w = np.clip((x - xs[lo]) / (xs[lo + 1] - xs[lo]), 0.0, 1.0)
        return lo, lo + 1, w

    @functools.cached_property
    def _epoch_stats(self) -> list[tuple[np.ndarray, np.ndarray]]:
        """Each trace's (grad_sqr, grad_var) per epoch (assumption 1): the rows', the first
        epoch's grad_var set so that the gain is the epoch's measured one."""
        out = []
        for b, run in self.runs.items():
            sqr, var = run.grad_sqr.copy(), run.grad_var.copy()
            scale, first = b / self.base_batch, run.progress[0] / run.iteration[0]
            if 1.0 < first < scale:
                var[0] = sqr[0] * (first - 1.0) / (1.0 - first / scale)
            out.append((sqr, var))
        return out

    @functools.cached_property
    def _rows(self) -> np.ndarray:
        return np.unique(np.concatenate([r.progress for r in self.runs.values()]))

    def _trace_stats(self, tau: Any) -> tuple[np.ndarray, np.ndarray]:
        """Each trace's (grad_sqr, grad_var) at progress `tau`: shape (traces, *tau). Epoch
        i's statistics hold on (progress[i-1], progress[i]], the last epoch's after it."""
        sqr, var = [], []
        for run, (s, v) in zip(self.runs.values(), self._epoch_stats, strict=True):
            row = np.minimum(np.searchsorted(run.progress, tau, side="left"), len(s) - 1)
            sqr.append(s[row])
            var.append(v[row])
        return np.array(sqr), np.array(var)

    def steps_between(self, start: float, stop: float, batch: float) -> float:
        """Optimizer steps at a fixed `batch` from progress `start` to `stop`: the sum of
        progress / gain over the pieces where the statistics are constant (exact)."""
        if not stop > start:
            return 0.0
        rows = self._rows
        cuts = np.union1d([start, stop], rows[(rows > start) & (rows < stop)])
        middles = (cuts[1:] + cuts[:-1]) / 2
        return float(np.sum(np.diff(cuts) / self.gain(middles, float(batch))))

    def stats(self, tau: Any, batches: Any) -> tuple[np.ndarray, np.ndarray]:
        """(grad_sqr, grad_var) at progress `tau` and batch `batches` (broadcast: a scalar
        and an array, or two of one shape).

        >>> cifar = Workload.load("cifar10")
        >>> sqr, var = cifar.stats(391.0, [128.0, 256.0])
        >>> sqr[0].item()  # the B = 128 trace's first row
        8.947307535897329
        """
        tau_a, b_a = np.broadcast_arrays(np.asarray(tau, np.float64), np.asarray(batches, float))
        lo, hi, w = self._pairs(b_a)
        sqr, var = self._trace_stats(tau_a)
        flat = np.arange(tau_a.size).reshape(tau_a.shape)
        sqr, var = sqr.reshape(len(self.runs), -1), var.reshape(len(self.runs), -1)
        mix_sqr = (1 - w) * sqr[lo, flat] + w * sqr[hi, flat]
        mix_var = (1 - w) * var[lo, flat] + w * var[hi, flat]
        return mix_sqr, mix_var

    def gain(self, tau: Any, batches: Any) -> np.ndarray:
        """AdaScale's gain at (tau, batch) from the interpolated statistics."""
        sqr, var = self.stats(tau, batches)
        return gain(sqr, var, batches, float(self.base_batch))

    def _signed_best(self, run: Run, grid: np.ndarray) -> np.ndarray:
        """The run's best-so-far metric (signed: higher is better) at each progress of `grid`."""
        sign = 1.0 if self.target.higher_is_better else -1.0
        best = np.maximum.accumulate(sign * run.metric)
        row = np.searchsorted(run.progress, grid, side="right") - 1
        return np.where(row >= 0, best[np.maximum(row, 0)], _BEFORE)

    def reached(self, batches: Any) -> np.ndarray:
        """The progress at which the metric at each batch first reaches the target (inf:
        never, within the traces).

        >>> Workload.load("bert").reached([12, 384]).round().tolist()
        [14774.0, 14790.0]
        """
        b = np.atleast_1d(np.asarray(batches, np.float64))
        lo, hi, w = self._pairs(b)
        sign = 1.0 if self.target.higher_is_better else -1.0
        goal = sign * self.target.value
        runs = list(self.runs.values())
        out = np.full(b.shape, np.inf)
        for i in np.unique(lo):
            mine = lo == i
            grid = np.union1d(runs[i].progress, runs[hi[mine][0]].progress)
            m_lo, m_hi = (
                self._signed_best(runs[i], grid),
                self._signed_best(runs[hi[mine][0]], grid),
            )
            wi = w[mine][:, None]
            metric = (1 - wi) * m_lo[None, :] + wi * m_hi[None, :]
            ok = metric >= goal
            first = np.argmax(ok, axis=1)
            out[mine] = np.where(ok.any(axis=1), grid[first], np.inf)
        return out

    def trace_steps(self, batch: int) -> tuple[float, float] | None:
        """(optimizer steps, progress) at the first epoch of `batch`'s own trace whose
        best-so-far metric reaches the target; None if none does."""
        run = self.runs[batch]
        sign = 1.0 if self.target.higher_is_better else -1.0
        ok = np.maximum.accumulate(sign * run.metric) >= sign * self.target.value
        if not ok.any():
            return None
        row = int(np.argmax(ok))
        return float(run.iteration[row]), float(run.progress[row])

    def predicted_steps(self, batch: float) -> float:
        """The replay of a static policy at `batch`, in numpy: the optimizer steps to the
        target (`steps_between` 0 and `reached`); inf if the target is never reached.

        >>> round(Workload.load("cifar10").predicted_steps(512))
        7267
        """
        goal = float(self.reached([batch])[0])
        return self.steps_between(0.0, goal, batch) if math.isfinite(goal) else math.inf


def static_seconds(workload: Workload, batch: int, devices: int) -> float | None:
    """Seconds to the target at a static validated `batch` on `devices` GPUs, from the
    trace alone (steps read off it x the step time); None if infeasible or never reached.

    >>> cifar10 = Workload.load("cifar10")
    >>> round(static_seconds(cifar10, 128, 1)), static_seconds(cifar10, 128, 64)
    (3066, None)
    """
    if batch / devices < workload.min_local:
        return None
    steps = workload.trace_steps(batch)
    if steps is None:
        return None
    return steps[0] * workload.step_time.step_seconds(batch, devices)


def bounds(workload: Workload, devices: int) -> tuple[int, int] | None:
    """The adaptive policies' (min, max) global batch on `devices` GPUs (multiples of N);
    None if no batch is feasible.

    >>> bounds(Workload.load("cifar10"), 64)
    (2048, 4096)
    """
    lowest = max(workload.base_batch, devices * workload.min_local)
    first = -(-lowest // devices) * devices
    last = int(max(workload.runs)) // devices * devices
    return None if first > last else (first, last)


def make_policy(kind: str, workload: Workload, devices: int) -> Any:
    """The policy `kind` of `POLICIES` (or "static:<B>") as the launcher builds it, with the
    replay's bounds (module docstring, assumption 6); None if no batch is feasible.

    >>> type(make_policy("goodput", Workload.load("cifar10"), 8)).__name__
    'GoodputPolicy'
    """
    from tf_adabatch import policies
    from tf_adabatch.app.configs import base

    if kind.startswith("static:"):
        return policies.StaticPolicy(int(kind.split(":", 1)[1]))
    if kind not in POLICIES:
        raise ValueError(
            f"make_policy: argument `kind` must be one of {POLICIES} or 'static:<batch>'. "
            f"Received: kind={kind!r}"
        )
    limits = bounds(workload, devices)
    if limits is None:
        return None
    config = base.get_config()
    config.base_batch_size = workload.base_batch
    config.policy.initial_batch_size, config.policy.min_batch_size = limits[0], limits[0]
    config.policy.max_batch_size = limits[1]
    if kind == "probing":
        from tf_adabatch.probing import ProbingGoodputPolicy

        return ProbingGoodputPolicy(initial_batch_size=limits[0], min_batch_size=limits[0],
                                    max_batch_size=limits[1], base_batch_size=workload.base_batch)  # fmt: skip
    if kind == "goodput":
        config.policy.kind = "goodput"
    elif kind == "simigrad":
        config.policy.kind = "simigrad"
        config.policy.target_similarity = 0.2
    return factories.make_policy(config)


def _decider(policy: Any, *, low: int, unit: int, base: int) -> Callable[..., Any]:
    """One optimizer step through `policy` (assumption 5), a concrete tf.function: from
    ((batch, steps so far, progress) in one float64 vector, the statistics and step times
    of every candidate batch) to (the next batch, the step's gain, its seconds) in one
    float64 vector (one conversion each way: the replay calls it thousands of times)."""
    import tensorflow as tf

    from tf_adabatch import policies, stats
    from tf_adabatch.probing import ProbingGoodputPolicy

    observe = isinstance(policy, policies.GoodputPolicy)
    # The probing policy reads the timings, not the fitted line: no refit per step.
    refit = not isinstance(policy, ProbingGoodputPolicy)
    f64 = tf.float64

    def run(state, sqr, trace_sigma, seconds):  # type: ignore[no-untyped-def]
        b, step, tau = tf.cast(state[0], tf.int64), tf.cast(state[1], tf.int64), state[2]
        index = (b - low) // unit
        g2, tr = tf.gather(sqr, index), tf.gather(trace_sigma, index)
        cost, bf = tf.gather(seconds, index), tf.cast(b, f64)
        r = stats.adascale_gain(g2, tr, bf, float(base))
        view = policies.StepStats(
            similarity=stats.estimated_similarity(g2, tr, bf),
            grad_sqr=g2,
            trace_sigma=tr,
            noise_scale=stats.noise_scale(g2, tr),
            gain=r,
            progress=tau + r,
            step=step + 1,
        )
        new = tf.cast(policy.next_batch_size(b, view), tf.int64)
        if observe:  # the host times the step after the policy decided
            with tf.control_dependencies([new]):
                policy.throughput.record(tf.cast(b // unit, f64), cost, refit=refit)
        return tf.stack([tf.cast(new, f64), r, cost])

    vector = tf.TensorSpec([None], f64)
    return tf.function(run, autograph=False).get_concrete_function(
        tf.TensorSpec([3], f64), vector, vector, vector
    )


class Outcome(NamedTuple):
    """An adaptive run's replay: seconds to the target (None: never reached), optimizer
    steps, and the batch it ran, averaged over steps and at the end.

    >>> Outcome(seconds=None, steps=10.0, mean_batch=64.0, final_batch=64).seconds is None
    True
    """

    seconds: float | None
    steps: float
    mean_batch: float
    final_batch: int


def replay_policy(
    workload: Workload,
    devices: int,
    policy: Any,
    *,
    decisions: int = DECISIONS,
    calls: int = CALLS,
) -> Outcome:
    """Replays `policy` (a built-or-not `tf_adabatch.BatchPolicy`) on `devices` GPUs to the
    target (module docstring, assumptions 1-6).

    >>> bert = Workload.load("bert")
    >>> out = replay_policy(bert, 4, make_policy("goodput", bert, 4))
    >>> out.seconds > 0, out.final_batch % 4
    (True, 0)
    """
    import tensorflow as tf

    if not isinstance(decisions, int) or decisions < 1:
        raise ValueError(
            f"replay_policy: argument `decisions` must be an integer >= 1. "
            f"Received: decisions={decisions!r}"
        )
    if not isinstance(calls, int) or calls < 1:
        raise ValueError(
            f"replay_policy: argument `calls` must be an integer >= 1. Received: calls={calls!r}"
        )
    unit = devices
    low = int(getattr(policy, "min_batch_size", policy.initial_batch_size))
    high = int(getattr(policy, "max_batch_size", policy.initial_batch_size))
    policy.build(batch_unit=unit)
    candidates = np.arange(low, high + 1, unit, dtype=np.float64)
    price = np.array([workload.step_time.step_seconds(float(b), devices) for b in candidates])
    goal = workload.reached(candidates)
    decide = _decider(policy, low=low, unit=unit, base=workload.base_batch)
    spacing = workload.end / decisions
    base = float(workload.base_batch)
    tau = seconds = steps = batch_steps = 0.0
    count, batch = 0, int(policy.initial_batch_size)
    table = tf.constant(price)
    while tau < workload.end:
        sqr, var = (tf.constant(x) for x in workload.stats(tau, candidates))
        var = var * base
        for _ in range(calls):
            out = decide(tf.constant([batch, count, tau], tf.float64), sqr, var, table).numpy()
            new, r, t = out
            finish = goal[(batch - low) // unit]
            if tau + r >= finish:
                part = max(finish - tau, 0.0) / r
                return Outcome(float(seconds + part * t), steps + part,
                               (batch_steps + part * batch) / (steps + part), batch)  # fmt: skip
            tau, seconds, steps, batch_steps = tau + r, seconds + t, steps + 1, batch_steps + batch
            count, batch = count + 1, int(new)
        index = (batch - low) // unit
        grid = (math.floor(tau / spacing + 1e-9) + 1) * spacing
        to = min(grid, max(2.0 * tau, tau + spacing / 64), goal[index])
        if to > tau:
            n = workload.steps_between(tau, to, batch)
            seconds, steps, batch_steps = (
                seconds + n * float(price[index]),
                steps + n,
                batch_steps + n * batch,
            )
            count += math.ceil(n)
            tau = to
        if tau >= goal[index]:
            return Outcome(float(seconds), steps, batch_steps / steps, batch)
    return Outcome(None, steps, batch_steps / max(steps, 1e-300), batch)


def replay(
    names: Sequence[str] = tuple(WORKLOADS),
    devices: Sequence[int] = DEVICES,
    kinds: Sequence[str] = REPLAYED,
    *,
    decisions: int = DECISIONS,
    calls: int = CALLS,
) -> list[dict[str, Any]]:
    """One row per (workload, devices, policy): keys `workload`, `devices`, `policy`
    ("static" or a kind of `POLICIES`), `seconds_to_target` (None if never reached or
    infeasible), `static_batch` (the batch of a static row, else None) and, for adaptive
    rows, `mean_batch` and `final_batch`.

    >>> rows = replay(["bert"], [1], kinds=())  # the static rows alone
    >>> [(r["policy"], r["static_batch"]) for r in rows][:2]
    [('static', 12), ('static', 24)]
    """
    rows: list[dict[str, Any]] = []
    for name in names:
        workload = Workload.load(name)
        for n in devices:
            for b in workload.runs:
                rows.append(dict(workload=name, devices=n, policy="static",
                                 seconds_to_target=static_seconds(workload, b, n),
                                 static_batch=b))  # fmt: skip
            for kind in kinds:
                policy = make_policy(kind, workload, n)
                row: dict[str, Any] = dict(workload=name, devices=n, policy=kind,
                                           seconds_to_target=None, static_batch=None)  # fmt: skip
                if policy is not None:
                    out = replay_policy(workload, n, policy, decisions=decisions, calls=calls)
                    row.update(seconds_to_target=out.seconds, mean_batch=round(out.mean_batch, 1),
                               final_batch=out.final_batch)  # fmt: skip
                rows.append(row)
    return rows


class Check(NamedTuple):
    """Leave-one-out check of one trace: its steps to the target as read off it, as the
    replay predicts them from the other traces, and with every trace (in-sample).

    >>> Check(128, trace_steps=100.0, predicted=105.0, error=0.05, in_sample=101.0,
    ...       in_sample_error=0.01).error
    0.05
    """

    batch: int
    trace_steps: float
    predicted: float
    error: float
    in_sample: float
    in_sample_error: float


def leave_one_out(workload: Workload) -> list[Check]:
    """For every validated batch: its trace's steps to the target against the static
    replay at that batch with its trace removed (error: predicted / read - 1).

    >>> checks = leave_one_out(Workload.load("cifar10"))
    >>> [c.batch for c in checks][:3], all(abs(c.error) < 0.5 for c in checks)
    ([128, 256, 512], True)
    """
    checks = []
    for b in workload.runs:
        read = workload.trace_steps(b)
        if read is None:
            continue
        predicted = workload.without(b).predicted_steps(b)
        inside = workload.predicted_steps(b)
        checks.append(Check(b, read[0], predicted, predicted / read[0] - 1, inside,
                            inside / read[0] - 1))  # fmt: skip
    return checks
