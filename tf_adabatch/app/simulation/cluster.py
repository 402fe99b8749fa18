r"""Projects a finished run's time to its final progress tau onto clusters we do not have.

The logic of `launch/simulate_cluster.py` (its flags are the arguments here):

    python launch/simulate_cluster.py --run=/tmp/cluster_digits \
        --profile=configs/profiles/this_machine.py \
        --profile=configs/profiles/assumed_nvlink_8gpu.py \
        --profile=configs/profiles/assumed_ethernet_64gpu.py \
        --max_devices=1024 --out=docs/benchmarks/cluster_projection

`project_run` reads the run's TensorBoard train logs (`<run>/tensorboard/train`: the smoothed moments
|G|^2 = `adabatch/grad_sqr` and tr(Sigma)/B0 = `adabatch/grad_var`, the batch
`adabatch/batch_size` and the progress `adabatch/progress` of every optimizer step), its
gradient size (parameters x 4 bytes, from `checkpoints/fingerprint.json`) and B0 (a flag,
or inferred from the logged gains), and for N = 1, 2, 4, ..., `--max_devices` devices of
each hardware profile (`resolve_profile`: a shipped profile by name, such as
`this_machine`, or a file) prints the simulated seconds to reach the run's final tau of:

  static_b0        batch B0, gain 1: tau += 1 per step.
  adascale_16x     batch 16 B0 with AdaScale: tau += r(16 B0) at the moments of the current tau.
  simigrad_replay  SimiGrad + AdaScale: the batch the run chose at that tau, tau += r(B).
  goodput          each step the reachable B in [B0, 16 B0] maximising r(B) / T(N, B),
                   with the true step time (an ideal goodput policy: no exploration, no
                   hysteresis).

The gain r(B) is `tf_adabatch.stats.adascale_gain` at the logged moments. Step time
(`step_seconds`): T(N, B) = fixed_seconds + seconds_per_example * B / min(N,
parallel_devices) + 2 (N-1)/N * gradient_bytes / bandwidth + 2 (N-1) latency. A batch
below N x min_examples_per_device cannot be split over N devices: static B0 and
static 16 B0 are then infeasible ("-"), goodput only considers reachable batches
(multiples of N) and is infeasible if none is left, and the replay runs such steps at
the smallest reachable batch and counts them (marked "*").

Writes `<out>.json` (every number), `<out>.md` (the tables) and `<out>.png` (time to the
final tau against N, log-log, one panel per profile).

`measure` validates the step-time model on this machine (`launch/simulate_cluster.py
--measure`, about three minutes; or `--measured=<out>.json` to refit saved timings): it
times the real engine (Fashion-MNIST CNN on random inputs, 1, 2 and 4 logical CPU
replicas, k = 1, 2, 4, 8 micro-steps), fits fixed_seconds, seconds_per_example, the
per-hop latency and parallel_devices (1 or the cores) of this machine's profile, and
prints the model's error against every measured step time (and, held out, the
4-replica times predicted from a fit on 1 and 2). Each replica count is timed in a
process of its own, `python -m tf_adabatch.app.simulation.cluster --measure_worker=N`
(this module's entry: it runs from an installed package, no checkout needed).

Errors are `SimulationError`, one line naming the flag or field, the rule and the value
(the script prints it and exits 2).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tf_adabatch.app import resources

__all__ = [
    "STRATEGIES",
    "Result",
    "Run",
    "SimulationError",
    "allreduce_seconds",
    "check_profile",
    "device_counts",
    "fit_machine",
    "format_table",
    "gains",
    "infer_base_batch_size",
    "load_profile",
    "min_batch",
    "parse_ks",
    "plot",
    "project",
    "read_run",
    "resolve_profile",
    "simulate",
    "step_seconds",
    "validate_model",
    "worker_command",
]

STRATEGIES = ("static_b0", "adascale_16x", "simigrad_replay", "goodput")
BYTES_PER_PARAMETER = 4  # float32 gradients
# Profile fields: name -> (rule, check).
_PROFILE_RULES: dict[str, tuple[str, Any]] = {
    "seconds_per_example": ("a number > 0", lambda v: _is_number(v) and v > 0),
    "fixed_seconds": ("a number >= 0", lambda v: _is_number(v) and v >= 0),
    "bandwidth_bytes_per_second": ("a number > 0", lambda v: _is_number(v) and v > 0),
    "latency_seconds": ("a number >= 0", lambda v: _is_number(v) and v >= 0),
    "min_examples_per_device": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "parallel_devices": (
        "None (every device) or an integer >= 1",
        lambda v: v is None or (_is_int(v) and v >= 1),
    ),
    "max_devices": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
    "name": ("a non-empty string", lambda v: isinstance(v, str) and bool(v)),
}

_MICRO_BATCH = 32  # the Fashion-MNIST configs' micro-batch per replica


class SimulationError(ValueError):
    """A bad flag, profile or run; the message is one line naming the field, rule and value.

    >>> str(SimulationError("Flag `--max_devices` must be >= 1. Received: --max_devices=0"))
    'Flag `--max_devices` must be >= 1. Received: --max_devices=0'
    """


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# --------------------------------------------------------------------------- profiles


def check_profile(profile: Any, source: str = "profile") -> None:
    """Raises `SimulationError` naming the first field that breaks its rule.

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(name="x", seconds_per_example=1e-3, fixed_seconds=0.0,
    ...     bandwidth_bytes_per_second=1e9, latency_seconds=0.0, min_examples_per_device=1,
    ...     parallel_devices=None, max_devices=8))
    >>> check_profile(p)
    >>> p.fixed_seconds = -1.0
    >>> try:
    ...     check_profile(p, "demo.py")
    ... except SimulationError as err:
    ...     print(err)
    Profile demo.py: field `fixed_seconds` must be a number >= 0. Received: fixed_seconds=-1.0
    """
    for name, (rule, ok) in _PROFILE_RULES.items():
        if name not in profile:
            raise SimulationError(f"Profile {source}: field `{name}` is missing; it must be {rule}")
        value = profile[name]
        if not ok(value):
            raise SimulationError(
                f"Profile {source}: field `{name}` must be {rule}. Received: {name}={value!r}"
            )


def resolve_profile(profile: str) -> str:
    """The file of a profile given by name (`this_machine`) or by path.

    An absolute path, or a relative one that exists from the current folder, is returned
    as it is. Otherwise the value is looked up among the shipped profiles
    (`tf_adabatch.app.resources.profiles_dir()`): a bare name gets `.py`, and a path
    written from a checkout's root (`configs/profiles/this_machine.py`) drops that prefix,
    so the documented commands run from any folder and from an installed package. A
    missing file is reported by `load_profile`.

    >>> os.path.relpath(resolve_profile("this_machine"), resources.profiles_dir())
    'this_machine.py'
    >>> os.path.samefile(resolve_profile("configs/profiles/assumed_nvlink_8gpu.py"),
    ...                  resolve_profile("assumed_nvlink_8gpu"))
    True
    """
    if os.path.isabs(profile) or os.path.exists(profile):
        return profile
    relative = os.path.normpath(profile)
    prefix = os.path.join("configs", "profiles") + os.sep
    if relative.startswith(prefix):
        relative = relative[len(prefix) :]
    if not relative.endswith(".py"):
        relative += ".py"
    return os.path.join(resources.profiles_dir(), relative)


def load_profile(path: str) -> Any:
    """Loads and checks an ml_collections profile file (`get_config()`).

    >>> load_profile(resolve_profile("assumed_nvlink_8gpu")).max_devices
    8
    """
    if not os.path.isfile(path):
        raise SimulationError(
            f"Flag `--profile` must name a profile file. Received: --profile={path}"
        )
    try:
        spec = importlib.util.spec_from_file_location(f"_profile_{abs(hash(path))}", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        profile = module.get_config()
    except Exception as err:  # a profile is user code: report any failure in one line
        raise SimulationError(
            f"Flag `--profile` must name a config file whose get_config() returns the "
            f"profile. Received: --profile={path} ({type(err).__name__}: {err})"
        ) from err
    check_profile(profile, path)
    return profile


def min_batch(profile: Any, devices: int) -> int:
    """The smallest batch N devices can run: N x min_examples_per_device.

    >>> from ml_collections import config_dict
    >>> min_batch(config_dict.ConfigDict(dict(min_examples_per_device=4)), 8)
    32
    """
    return devices * int(profile.min_examples_per_device)


def allreduce_seconds(profile: Any, devices: int, gradient_bytes: float) -> float:
    """Ring all-reduce: 2 (N-1)/N * bytes / bandwidth + 2 (N-1) * latency; 0 for N = 1.

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(bandwidth_bytes_per_second=1e9, latency_seconds=1e-5))
    >>> allreduce_seconds(p, 1, 1e6), round(allreduce_seconds(p, 4, 1e6), 9)
    (0.0, 0.00156)
    """
    n = devices
    if n <= 1:
        return 0.0
    transfer = 2.0 * (n - 1) / n * gradient_bytes / float(profile.bandwidth_bytes_per_second)
    hops = 2.0 * (n - 1) * float(profile.latency_seconds)
    return transfer + hops


def step_seconds(profile: Any, devices: int, batch: Any, gradient_bytes: float) -> Any:
    """T(N, B) = fixed + seconds_per_example * B / min(N, parallel_devices) + all-reduce.

    Vectorised over `batch`. Does not check reachability (see `min_batch`).

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(fixed_seconds=0.01, seconds_per_example=0.001,
    ...     parallel_devices=2, bandwidth_bytes_per_second=1e9, latency_seconds=0.0))
    >>> round(float(step_seconds(p, 4, 64, 0.0)), 6)  # 0.01 + 0.001 * 64 / 2
    0.042
    """
    parallel = (
        devices if profile.parallel_devices is None else min(devices, profile.parallel_devices)
    )
    compute = float(profile.seconds_per_example) * np.asarray(batch, np.float64) / parallel
    return (
        float(profile.fixed_seconds) + compute + allreduce_seconds(profile, devices, gradient_bytes)
    )


# ------------------------------------------------------------------------------- runs


@dataclass
class Run:
    """A finished run's trajectory along progress tau, one entry per logged step.

    `tau_before[t]` is the progress before step t; `grad_sqr`, `trace_sigma` the
    smoothed moments the step's gain used; `batch` its global batch; `gain` the logged
    gain.

    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([1.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=1.0, base_batch_size=16, num_parameters=10)
    >>> run.gradient_bytes
    40
    """

    tau_before: np.ndarray
    batch: np.ndarray
    grad_sqr: np.ndarray
    trace_sigma: np.ndarray
    gain: np.ndarray
    final_tau: float
    base_batch_size: int
    num_parameters: int
    source: str = ""

    @property
    def gradient_bytes(self) -> int:
        return self.num_parameters * BYTES_PER_PARAMETER

    def index(self, tau: float) -> int:
        """The step whose tau_before is the last one <= tau (relative tolerance 1e-6,
        for the float32 rounding of the logged progress).

        >>> run = Run(np.array([0.0, 2.0]), np.ones(2), np.ones(2), np.ones(2), np.ones(2),
        ...           final_tau=3.0, base_batch_size=1, num_parameters=1)
        >>> run.index(1.9999999), run.index(0.5)
        (1, 0)
        """
        tol = 1e-6 * max(1.0, abs(tau))
        return max(0, int(np.searchsorted(self.tau_before, tau + tol, side="right")) - 1)


def _tag(name: str) -> str:
    from tf_adabatch import summaries

    if name not in summaries.ADABATCH_SCALARS:
        raise KeyError(name)
    return f"adabatch/{name}"


def gains(run: Run, batches: Any) -> np.ndarray:
    """AdaScale gains r(B) at each logged step's moments, shape [steps, len(batches)].

    Computed by `tf_adabatch.stats.adascale_gain` (sigma^2 = tr(Sigma)/B0, S = B/B0).

    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([0.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=1.0, base_batch_size=16, num_parameters=1)
    >>> gains(run, [16, 64]).tolist()  # pure noise: r = S
    [[1.0, 4.0]]
    """
    from tf_adabatch.stats import adascale_gain

    b = np.asarray(batches, np.float64)[None, :]
    g = np.broadcast_to(run.grad_sqr[:, None], (len(run.grad_sqr), b.shape[1]))
    tr = np.broadcast_to(run.trace_sigma[:, None], g.shape)
    return np.asarray(adascale_gain(g, tr, np.broadcast_to(b, g.shape), float(run.base_batch_size)))


def infer_base_batch_size(grad_sqr: Any, grad_var: Any, batch: Any, gain: Any) -> int:
    """B0 from the logged gains: r = (v + g) / (v B0/B + g) with v = tr(Sigma)/B0, so
    B0 = B ((v + g)/r - g) / v. The median over steps whose noise is not negligible.

    >>> infer_base_batch_size([1.0], [3.0], [64.0], [(3 + 1) / (3 * 16 / 64 + 1)])
    16
    """
    g, v, b, r = (np.asarray(a, np.float64) for a in (grad_sqr, grad_var, batch, gain))
    ok = np.isfinite(g + v + b + r) & (v > 1e-3 * np.abs(v + g)) & (r > 0)
    if not ok.any():
        raise SimulationError(
            "Cannot infer B0 from the logs (no step with finite, noisy moments): pass "
            "`--base_batch_size`"
        )
    estimates = b[ok] * ((v[ok] + g[ok]) / r[ok] - g[ok]) / v[ok]
    return round(float(np.median(estimates)))


def _num_parameters(workdir: str) -> int:
    path = os.path.join(workdir, "checkpoints", "fingerprint.json")
    try:
        with open(path, encoding="utf-8") as f:
            variables = json.load(f)["variables"]
    except (OSError, ValueError, KeyError) as err:
        raise SimulationError(
            f"Cannot read the model's variables from {path} ({type(err).__name__}): pass "
            "`--num_parameters`"
        ) from err
    # Two formats: {"name": [shape]} or ["name(d1, d2)", ...].
    if isinstance(variables, dict):
        shapes = [list(s) for s in variables.values()]
    else:
        shapes = [
            [int(d) for d in re.findall(r"\d+", m.group(1))]
            for m in (re.search(r"\(([\d, ]*)\)$", v) for v in variables)
            if m
        ]
    return int(sum(math.prod(s) for s in shapes))


def read_run(
    workdir: str, *, base_batch_size: int | None = None, num_parameters: int | None = None
) -> Run:
    """Reads a run's train logs (`tf_adabatch.summaries.read_scalars`) into a `Run`.

    Args:
      workdir: the run's folder, with `tensorboard/train`.
      base_batch_size: B0; default inferred from the logs (`infer_base_batch_size`).
      num_parameters: default from `checkpoints/fingerprint.json`.

    Raises:
      SimulationError: the logs or the fingerprint are missing, or B0 is inconsistent
        with the logged gains.

    >>> import tempfile
    >>> try:
    ...     read_run(tempfile.mkdtemp())
    ... except SimulationError as err:
    ...     print(str(err).split(" (")[0])
    Flag `--run` must be a run's workdir with TensorBoard train logs
    """
    from tf_adabatch import summaries

    logdir = os.path.join(workdir, "tensorboard", summaries.TRAIN_RUN)
    scalars = summaries.read_scalars(logdir) if os.path.isdir(logdir) else {}
    names = ("batch_size", "gain", "grad_sqr", "grad_var", "progress")
    missing = [n for n in names if _tag(n) not in scalars]
    if missing:
        raise SimulationError(
            f"Flag `--run` must be a run's workdir with TensorBoard train logs ({logdir}). "
            f"Received: --run={workdir} (missing tags: {', '.join(_tag(n) for n in missing)})"
        )
    steps = sorted(set.intersection(*(set(dict(scalars[_tag(n)])) for n in names)))
    col = {n: np.array([dict(scalars[_tag(n)])[s] for s in steps], np.float64) for n in names}
    progress = col["progress"]
    tau_before = np.concatenate([[0.0], progress[:-1]])
    if base_batch_size is None:
        base_batch_size = infer_base_batch_size(
            col["grad_sqr"], col["grad_var"], col["batch_size"], col["gain"]
        )
    if num_parameters is None:
        num_parameters = _num_parameters(workdir)
    run = Run(
        tau_before=tau_before,
        batch=col["batch_size"],
        grad_sqr=col["grad_sqr"],
        trace_sigma=col["grad_var"] * base_batch_size,
        gain=col["gain"],
        final_tau=float(progress[-1]),
        base_batch_size=int(base_batch_size),
        num_parameters=int(num_parameters),
        source=workdir,
    )
    # The logged gain is adascale_gain at the logged moments and batch: B0 must agree.
    from tf_adabatch.stats import adascale_gain

    recomputed = np.asarray(
        adascale_gain(run.grad_sqr, run.trace_sigma, run.batch, float(run.base_batch_size))
    )
    ok = np.isfinite(run.gain) & np.isfinite(run.grad_sqr) & np.isfinite(run.trace_sigma)
    error = float(np.median(np.abs(recomputed[ok] / run.gain[ok] - 1.0))) if ok.any() else 0.0
    if error > 1e-3:
        raise SimulationError(
            f"Flag `--base_batch_size` must be the run's B0, for which the logged gains are "
            f"reproduced. Received: --base_batch_size={base_batch_size} (median relative "
            f"gain error {error:.3g})"
        )
    return run


# --------------------------------------------------------------------------- simulate


@dataclass
class Result:
    """One strategy on N devices: seconds and steps to the final tau (None: infeasible).

    `batches[t]` and `taus[t]` are the batch of simulated step t and the progress
    after it; `raised_steps` counts steps that ran a larger batch than recorded
    (replay only), `reason` says why a strategy is infeasible.

    >>> Result("static_b0", 4, None, None, reason="B0 = 16 < 32").feasible
    False
    """

    strategy: str
    devices: int
    seconds: float | None
    steps: int | None
    raised_steps: int = 0
    mean_batch: float | None = None
    batches: list[int] = field(default_factory=list, repr=False)
    taus: list[float] = field(default_factory=list, repr=False)
    reason: str = ""

    @property
    def feasible(self) -> bool:
        return self.seconds is not None


def _adaptive(run: Run, table: np.ndarray, choose: Any) -> tuple[list[int], list[int], list[float]]:
    """Steps until tau reaches the final tau: (logged step i, column j, tau after) each.

    Each step reads the moments of the logged step at the current tau (`Run.index`),
    `choose(i)` picks a column of `table` (gains, [steps, columns]) and tau += that gain.
    """
    tau, rows, cols, taus = 0.0, [], [], []
    limit = 100 * (math.ceil(run.final_tau) + 1)
    while tau < run.final_tau * (1 - 1e-6):
        i = run.index(tau)
        j = choose(i)
        tau += float(table[i, j])
        rows.append(i)
        cols.append(j)
        taus.append(tau)
        if len(taus) > limit:  # gains below 1 (batches under B0) could stall
            raise SimulationError(
                f"The simulation did not reach the final tau {run.final_tau} in {limit} steps"
            )
    return rows, cols, taus


def simulate(run: Run, profile: Any, devices: int) -> dict[str, Result]:
    """Every strategy's time to `run.final_tau` on `devices` devices of `profile`.

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(fixed_seconds=1.0, seconds_per_example=0.0,
    ...     parallel_devices=None, bandwidth_bytes_per_second=1e9, latency_seconds=0.0,
    ...     min_examples_per_device=1))
    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([0.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=64.0, base_batch_size=16, num_parameters=0)
    >>> {k: r.steps for k, r in simulate(run, p, 1).items()}  # pure noise: r = S
    {'static_b0': 64, 'adascale_16x': 4, 'simigrad_replay': 64, 'goodput': 4}
    """
    b0, n = run.base_batch_size, devices
    smallest = min_batch(profile, n)
    big = 16 * b0
    out: dict[str, Result] = {}

    def result(name: str, batches: Sequence[int], taus: Sequence[float], raised: int = 0) -> Result:
        values, counts = np.unique(np.asarray(batches), return_counts=True)
        seconds = float(np.sum(counts * step_seconds(profile, n, values, run.gradient_bytes)))
        mean = float(np.mean(batches))
        return Result(name, n, seconds, len(batches), raised, mean, list(batches), list(taus))

    def infeasible(name: str, reason: str) -> Result:
        return Result(name, n, None, None, reason=reason)

    # Static B0: tau += 1 per step.
    if b0 < smallest:
        out["static_b0"] = infeasible("static_b0", f"B0 = {b0} < N x min_examples = {smallest}")
    else:
        steps = math.ceil(run.final_tau * (1 - 1e-6))
        out["static_b0"] = result(
            "static_b0", [b0] * steps, [float(t) for t in range(1, steps + 1)]
        )
    # Static 16 B0 with AdaScale: tau += r(16 B0) at the moments of the current tau.
    too_small = f"16 B0 = {big} < N x min_examples = {smallest}"
    if big < smallest:
        out["adascale_16x"] = infeasible("adascale_16x", too_small)
    else:
        _, _, taus = _adaptive(run, gains(run, [big]), lambda i: 0)
        out["adascale_16x"] = result("adascale_16x", [big] * len(taus), taus)
    # Replay: the batch the run chose at this tau, raised to the smallest reachable one
    # (infeasible if even that exceeds 16 B0, the top of every adaptive range here).
    if big < smallest:
        out["simigrad_replay"] = infeasible("simigrad_replay", too_small)
    else:
        recorded = np.rint(run.batch).astype(np.int64)
        replayed = np.maximum(recorded, smallest)
        values, inverse = np.unique(replayed, return_inverse=True)
        table = np.take_along_axis(gains(run, values), inverse.reshape(-1, 1), axis=1)
        rows, _, taus = _adaptive(run, table, lambda i: 0)
        raised = int(np.sum(recorded[rows] < smallest))
        replay = [int(b) for b in replayed[rows]]
        out["simigrad_replay"] = result("simigrad_replay", replay, taus, raised)
    # Goodput: the reachable B in [B0, 16 B0] (multiples of N) maximising r(B) / T(N, B).
    candidates = np.arange(math.ceil(max(b0, smallest) / n) * n, big + 1, n)
    if not len(candidates):
        reason = (
            f"no multiple of N = {n} in [max(B0, N x min_examples = {smallest}), 16 B0 = {big}]"
        )
        out["goodput"] = infeasible("goodput", reason)
    else:
        table = gains(run, candidates)
        rate = table / step_seconds(profile, n, candidates, run.gradient_bytes)[None, :]
        best = np.argmax(rate, axis=1)
        _, cols, taus = _adaptive(run, table, lambda i: int(best[i]))
        out["goodput"] = result("goodput", [int(candidates[j]) for j in cols], taus)
    return out


def device_counts(max_devices: int) -> list[int]:
    """1, 2, 4, ... up to max_devices.

    >>> device_counts(10)
    [1, 2, 4, 8]
    """
    if isinstance(max_devices, bool) or not isinstance(max_devices, int) or max_devices < 1:
        raise SimulationError(
            f"Flag `--max_devices` must be an integer >= 1. Received: --max_devices={max_devices!r}"
        )
    return [2**i for i in range(int(math.log2(max_devices)) + 1)]


def project(run: Run, profiles: Sequence[Any], max_devices: int) -> dict[str, Any]:
    """Every profile x N x strategy, as a JSON-ready dict.

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(name="toy", fixed_seconds=1.0, seconds_per_example=0.0,
    ...     parallel_devices=None, bandwidth_bytes_per_second=1e9, latency_seconds=0.0,
    ...     min_examples_per_device=1, max_devices=2))
    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([0.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=64.0, base_batch_size=16, num_parameters=0)
    >>> out = project(run, [p], 4)
    >>> [row["devices"] for row in out["profiles"]["toy"]["rows"]]
    [1, 2, 4]
    >>> out["profiles"]["toy"]["rows"][2]["extrapolated"]
    True
    """
    counts = device_counts(max_devices)
    result: dict[str, Any] = {
        "run": run.source,
        "final_tau": run.final_tau,
        "base_batch_size": run.base_batch_size,
        "num_parameters": run.num_parameters,
        "gradient_bytes": run.gradient_bytes,
        "recorded_steps": len(run.batch),
        "profiles": {},
    }
    for profile in profiles:
        rows = []
        for n in counts:
            sims = simulate(run, profile, n)
            rows.append(
                {
                    "devices": n,
                    "extrapolated": n > profile.max_devices,
                    **{
                        name: {
                            "seconds": r.seconds,
                            "steps": r.steps,
                            "mean_batch": r.mean_batch,
                            "raised_steps": r.raised_steps,
                            "reason": r.reason,
                        }
                        for name, r in sims.items()
                    },
                }
            )
        result["profiles"][profile.name] = {"profile": profile.to_dict(), "rows": rows}
    return result


def format_table(projection: dict[str, Any], name: str) -> str:
    """A markdown table of one profile: seconds and ratio to static B0 per strategy.

    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(name="toy", fixed_seconds=1.0, seconds_per_example=0.0,
    ...     parallel_devices=None, bandwidth_bytes_per_second=1e9, latency_seconds=0.0,
    ...     min_examples_per_device=1, max_devices=2))
    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([0.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=64.0, base_batch_size=16, num_parameters=0)
    >>> print(format_table(project(run, [p], 1), "toy").splitlines()[2])
    | 1 | 64 | 4 (0.062x, 16 B0) | 64 (1.000x, mean B 16) | 4 (0.062x, mean B 256) |
    """
    lines = [
        "| N | static B0 (s) | static 16 B0, AdaScale (s) | SimiGrad + AdaScale replay (s) | goodput (s) |",
        "|---|---|---|---|---|",
    ]
    notes = set()
    for row in projection["profiles"][name]["rows"]:
        base = row["static_b0"]["seconds"]
        cells = []
        for strategy in STRATEGIES:
            cell = row[strategy]
            if cell["seconds"] is None:
                cells.append("-")
                continue
            text = f"{cell['seconds']:.3g}"
            if strategy != "static_b0":
                ratio = f"{cell['seconds'] / base:.3f}x, " if base else ""
                extra = (
                    "16 B0" if strategy == "adascale_16x" else f"mean B {cell['mean_batch']:.0f}"
                )
                text += f" ({ratio}{extra})"
            if cell["raised_steps"]:
                text += f" *{cell['raised_steps']}"
                notes.add(
                    "*k: k steps ran the smallest reachable batch N x min_examples_per_device instead of the smaller recorded one."
                )
            cells.append(text)
        devices = f"{row['devices']}" + (" (extrapolated)" if row["extrapolated"] else "")
        lines.append(f"| {devices} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *([""] if notes else []), *sorted(notes)])


def plot(projection: dict[str, Any], path: str) -> None:
    """Time to the final tau against N, log-log, one panel per profile (matplotlib, Agg).

    >>> import tempfile
    >>> from ml_collections import config_dict
    >>> p = config_dict.ConfigDict(dict(name="toy", fixed_seconds=1.0, seconds_per_example=0.0,
    ...     parallel_devices=None, bandwidth_bytes_per_second=1e9, latency_seconds=0.0,
    ...     min_examples_per_device=1, max_devices=2))
    >>> run = Run(np.array([0.0]), np.array([16.0]), np.array([0.0]), np.array([1.0]),
    ...           np.array([1.0]), final_tau=64.0, base_batch_size=16, num_parameters=0)
    >>> plot(project(run, [p], 4), os.path.join(tempfile.mkdtemp(), "p.png"))
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(projection["profiles"])
    fig, axes = plt.subplots(1, len(names), figsize=(5 * len(names), 4), squeeze=False)
    labels = {
        "static_b0": "static B0",
        "adascale_16x": "static 16 B0 + AdaScale",
        "simigrad_replay": "SimiGrad + AdaScale (replay)",
        "goodput": "goodput (ideal)",
    }
    # Lines often coincide (goodput picking B0 or 16 B0): distinct markers and dashes.
    styles = {
        "static_b0": ("o", "-"),
        "adascale_16x": ("s", "--"),
        "simigrad_replay": ("^", "-."),
        "goodput": ("x", ":"),
    }
    for ax, name in zip(axes[0], names, strict=True):
        rows = projection["profiles"][name]["rows"]
        for strategy in STRATEGIES:
            pts = [(r["devices"], r[strategy]["seconds"]) for r in rows if r[strategy]["seconds"]]
            if pts:
                marker, style = styles[strategy]
                ax.plot(
                    *zip(*pts, strict=True),
                    marker=marker,
                    ls=style,
                    ms=5,
                    mfc="none",
                    label=labels[strategy],
                )
        limit = projection["profiles"][name]["profile"]["max_devices"]
        ax.axvline(limit, color="grey", lw=0.8, ls=":")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("devices N (dotted: profile's size; beyond it extrapolated)")
        ax.set_ylabel("seconds to the run's final tau")
        ax.set_title(name)
        ax.grid(True, which="both", lw=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle(
        f"{projection['run']}: tau {projection['final_tau']:.0f}, B0 {projection['base_batch_size']}, "
        f"{projection['num_parameters']} parameters",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------------- measure


def measure_worker(replicas: int, ks: Sequence[int], steps: int) -> dict[str, Any]:
    """Times the engine on `replicas` logical CPU devices (call first in a process).

    The Fashion-MNIST CNN on random 28x28 inputs, micro-batch 32, estimated-similarity
    mode (one gradient all-reduce per step), a static batch of replicas x 32 x k for each
    k; the median of `steps` host-timed steps after two warm-up steps per k.
    """
    from ml_collections import config_dict

    from tf_adabatch.app import make_strategy, models

    strategy = make_strategy(
        config_dict.ConfigDict({"strategy": "mirrored", "num_cpu_replicas": replicas})
    )
    import keras
    import tensorflow as tf

    from tf_adabatch import StaticPolicy, Trainer

    unit = replicas * _MICRO_BATCH
    with strategy.scope():
        model = models.build_model("cnn", (28, 28, 1), 10)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    trainer = Trainer(
        model,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=optimizer,
        micro_batch_size=_MICRO_BATCH,
        policy=StaticPolicy(unit * ks[0]),
        similarity="estimated",
        strategy=strategy,
    )
    rng = np.random.default_rng(0)
    x = rng.random((2048, 28, 28, 1), dtype=np.float32)
    y = rng.integers(0, 10, 2048)
    data = tf.data.Dataset.from_tensor_slices((x, y)).repeat().batch(unit, drop_remainder=True)
    iterator = iter(trainer.distribute(data.prefetch(4)))
    rows = []
    for k in ks:
        trainer.set_batch_size(unit * k)
        times = []
        for s in range(2 + steps):
            seconds = float(trainer.engine.train_step(iterator)["step_time"])
            if s >= 2 and math.isfinite(seconds):
                times.append(seconds)
        rows.append({"replicas": replicas, "k": k, "batch": unit * k, "seconds": times})
    return {"num_parameters": int(model.count_params()), "rows": rows}


def fit_machine(
    rows: Sequence[dict[str, Any]], gradient_bytes: float, bandwidth: float, parallel: int
) -> dict[str, float]:
    """Least squares (non-negative) of fixed_seconds, seconds_per_example, latency_seconds
    from median step times, with the bandwidth term taken as given.

    >>> rows = [{"replicas": n, "batch": b, "seconds": [0.01 + 1e-4 * b / min(n, 2) + 2 * (n - 1) * 1e-3]}
    ...         for n in (1, 2, 4) for b in (32 * n, 64 * n)]
    >>> {k: round(v, 6) for k, v in fit_machine(rows, 0.0, 1e9, 2).items()}
    {'fixed_seconds': 0.01, 'seconds_per_example': 0.0001, 'latency_seconds': 0.001}
    """
    from scipy.optimize import nnls

    a, t = [], []
    for row in rows:
        n = row["replicas"]
        a.append([1.0, row["batch"] / min(n, parallel), 2.0 * (n - 1)])
        t.append(float(np.median(row["seconds"])) - 2.0 * (n - 1) / n * gradient_bytes / bandwidth)
    coef, _ = nnls(np.array(a), np.array(t))
    return dict(
        zip(
            ("fixed_seconds", "seconds_per_example", "latency_seconds"),
            map(float, coef),
            strict=True,
        )
    )


def worker_command(replicas: int, ks: Sequence[int], steps: int) -> list[str]:
    """The command that times `replicas` in a fresh process: this module's entry.

    >>> worker_command(2, [1, 2], 5)[1:]  # doctest: +NORMALIZE_WHITESPACE
    ['-m', 'tf_adabatch.app.simulation.cluster', '--measure_worker=2', '--measure_ks=1,2',
     '--measure_steps=5']
    """
    return [
        sys.executable,
        "-m",
        __spec__.name if __spec__ is not None else "tf_adabatch.app.simulation.cluster",
        f"--measure_worker={replicas}",
        f"--measure_ks={','.join(map(str, ks))}",
        f"--measure_steps={steps}",
    ]


def collect_timings(ks: Sequence[int], steps: int) -> dict[str, Any]:
    """Times 1, 2 and 4 replicas, one subprocess each (`worker_command`, `measure_worker`)."""
    rows, num_parameters = [], 0
    for replicas in (1, 2, 4):
        command = worker_command(replicas, ks, steps)
        print(f"timing {replicas} replica(s), k in {list(ks)} ...", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=240, check=False)
        if done.returncode:
            raise SimulationError(f"The measuring subprocess failed: {done.stderr.strip()[-400:]}")
        result = json.loads(done.stdout.strip().splitlines()[-1])
        rows += result["rows"]
        num_parameters = result["num_parameters"]
    return {"gradient_bytes": num_parameters * BYTES_PER_PARAMETER, "rows": rows}


def validate_model(
    timings: dict[str, Any], *, cores: int, bandwidth: float
) -> tuple[dict[str, Any], list[str]]:
    """Fits this machine's profile to measured step times and reports the model's errors.

    Two readings of "parallel devices" are fitted: `cores` (each logical device runs on
    its own core, so N = 1 uses one) and 1 (the logical devices share one pool of
    intra-op threads: one device already uses every core). The one with the smaller
    mean |error| is kept. A held-out check fits on 1 and 2 replicas and predicts 4.

    >>> rows = [{"replicas": n, "k": k, "batch": 32 * n * k,
    ...          "seconds": [0.01 + 1e-4 * 32 * n * k + 2 * (n - 1) * 1e-3]}
    ...         for n in (1, 2, 4) for k in (1, 2)]
    >>> report, lines = validate_model({"gradient_bytes": 0, "rows": rows}, cores=2, bandwidth=1e9)
    >>> report["parallel_devices"], round(report["fit"]["seconds_per_example"], 6)
    (1, 0.0001)
    """
    from ml_collections import config_dict

    rows, nbytes = timings["rows"], float(timings["gradient_bytes"])

    def predict(params: dict[str, float], parallel: int, row: dict[str, Any]) -> float:
        p = config_dict.ConfigDict(
            {**params, "parallel_devices": parallel, "bandwidth_bytes_per_second": bandwidth}
        )
        return float(step_seconds(p, row["replicas"], row["batch"], nbytes))

    fits = {}
    for parallel in sorted({1, cores}):
        params = fit_machine(rows, nbytes, bandwidth, parallel)
        errors = [predict(params, parallel, r) / float(np.median(r["seconds"])) - 1 for r in rows]
        fits[parallel] = (params, errors, float(np.mean(np.abs(errors))))
    chosen = min(fits, key=lambda p: fits[p][2])
    params, errors, _ = fits[chosen]
    held = fit_machine([r for r in rows if r["replicas"] < 4], nbytes, bandwidth, chosen)
    held_errors = [predict(held, chosen, r) / float(np.median(r["seconds"])) - 1 for r in rows]
    names = " | ".join(f"model P={p} (s) | error" for p in fits)
    lines = [
        f"| replicas | k | batch | measured median (s) | min-max (s) | {names} | "
        f"P={chosen} fit on 1, 2 replicas: error |",
        "|---" * (6 + 2 * len(fits)) + "|",
    ]
    for i, row in enumerate(rows):
        cells = [f"{predict(fits[p][0], p, row):.3f} | {fits[p][1][i]:+.0%}" for p in fits]
        lines.append(
            f"| {row['replicas']} | {row['k']} | {row['batch']} | {np.median(row['seconds']):.3f} | "
            f"{min(row['seconds']):.3f}-{max(row['seconds']):.3f} | {' | '.join(cells)} | "
            f"{held_errors[i]:+.0%} |"
        )
    lines.append("")
    for n in (1, 2, 4):
        mine = [abs(e) for e, r in zip(errors, rows, strict=True) if r["replicas"] == n]
        held_n = [abs(e) for e, r in zip(held_errors, rows, strict=True) if r["replicas"] == n]
        if mine:
            lines.append(
                f"{n} replica(s), P={chosen}: median |error| {np.median(mine):.0%}, max "
                f"{max(mine):.0%}; fit on 1, 2 replicas: median {np.median(held_n):.0%}, "
                f"max {max(held_n):.0%}"
            )
    for p, (fit, _, mean) in fits.items():
        pretty = ", ".join(f"{k} = {v:.3g}" for k, v in fit.items())
        lines.append(f"P={p}: {pretty}; mean |error| {mean:.0%}")
    report = {
        "parallel_devices": chosen,
        "fit": params,
        "errors": errors,
        "fit_on_1_2_replicas": held,
        "held_out_errors": held_errors,
        "fits": {
            str(p): {"fit": f, "errors": e, "mean_abs_error": m} for p, (f, e, m) in fits.items()
        },
        "bandwidth": bandwidth,
        **timings,
    }
    return report, lines


def measure(out: str | None, ks: Sequence[int], steps: int, measured: str | None) -> dict[str, Any]:
    """Times the engine here (or reads `measured`, a saved `<out>.json`), fits, reports."""
    bandwidth = float(load_profile(resolve_profile("this_machine")).bandwidth_bytes_per_second)
    if measured:
        try:
            with open(measured, encoding="utf-8") as f:
                saved = json.load(f)
            keep = ("replicas", "k", "batch", "seconds")
            rows = [{key: row[key] for key in keep} for row in saved["rows"]]
            timings = {"gradient_bytes": saved["gradient_bytes"], "rows": rows}
        except (OSError, ValueError, KeyError) as err:
            raise SimulationError(
                f"Flag `--measured` must name a saved measurement (<out>.json of --measure). "
                f"Received: --measured={measured} ({type(err).__name__})"
            ) from err
    else:
        timings = collect_timings(ks, steps)
    report, lines = validate_model(timings, cores=len(os.sched_getaffinity(0)), bandwidth=bandwidth)
    print("\n".join(lines))
    if out:
        with open(f"{out}.json", "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
        with open(f"{out}.md", "w", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")
    return report


# ------------------------------------------------------------------------------ runs


def parse_ks(values: Sequence[str]) -> list[int]:
    """The micro-step counts of `--measure_ks`, each an integer >= 1.

    >>> parse_ks(["1", "4"])
    [1, 4]
    >>> parse_ks(["0"])
    Traceback (most recent call last):
    ...
    tf_adabatch.app.simulation.cluster.SimulationError: Flag `--measure_ks` must list integers >= 1. Received: --measure_ks=0
    """
    for value in values:
        if not value.isdigit() or int(value) < 1:
            raise SimulationError(
                f"Flag `--measure_ks` must list integers >= 1. Received: --measure_ks={','.join(values)}"
            )
    return [int(value) for value in values]


def project_run(
    run_dir: str | None,
    profiles: Sequence[str],
    *,
    max_devices: int,
    base_batch_size: int | None = None,
    num_parameters: int | None = None,
    out: str | None = None,
) -> dict[str, Any]:
    """Projects the run in `run_dir` onto `profiles` (names or files): prints the tables,
    and with `out` writes `<out>.json`, `<out>.md` and `<out>.png`.

    Args:
      run_dir: a finished run's workdir (with `tensorboard/train`).
      profiles: hardware profiles, each a shipped name or a file (`resolve_profile`).
      max_devices: simulate N = 1, 2, 4, ... up to this.
      base_batch_size: B0; default inferred from the logs.
      num_parameters: default from `checkpoints/fingerprint.json`.
      out: output prefix, or None to print only.

    Returns:
      The projection (`project`).

    Raises:
      SimulationError: a bad argument, profile or run (one line).
    """
    if not run_dir:
        raise SimulationError("Flag `--run` is required (a finished run's workdir). Received: none")
    counts = device_counts(max_devices)
    for name, value in (("base_batch_size", base_batch_size), ("num_parameters", num_parameters)):
        if value is not None and value < 1:
            raise SimulationError(
                f"Flag `--{name}` must be an integer >= 1. Received: --{name}={value}"
            )
    loaded = [load_profile(resolve_profile(p)) for p in profiles]
    names = [p.name for p in loaded]
    if len(set(names)) != len(names):
        raise SimulationError(
            f"Flag `--profile` must name profiles with distinct names. Received: {names}"
        )
    run = read_run(run_dir, base_batch_size=base_batch_size, num_parameters=num_parameters)
    projection = project(run, loaded, counts[-1])
    print(
        f"Run {run.source}: final tau {run.final_tau:.1f}, {len(run.batch)} logged steps, "
        f"B0 {run.base_batch_size}, {run.num_parameters} parameters ({run.gradient_bytes} gradient bytes)"
    )
    tables = []
    for name in names:
        tables.append(f"### {name}\n\n{format_table(projection, name)}\n")
    print("\n".join(tables))
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(f"{out}.json", "w", encoding="utf-8") as f:
            json.dump(projection, f, indent=1)
        with open(f"{out}.md", "w", encoding="utf-8") as f:
            f.write("\n".join(tables))
        plot(projection, f"{out}.png")
        print(f"wrote {out}.json, .md, .png")
    return projection


def _worker_main(argv: Sequence[str] | None = None) -> None:
    """`python -m tf_adabatch.app.simulation.cluster --measure_worker=N`: one JSON line."""
    parser = argparse.ArgumentParser(description=measure_worker.__doc__)
    parser.add_argument("--measure_worker", type=int, required=True)
    parser.add_argument("--measure_ks", default="1,2,4,8")
    parser.add_argument("--measure_steps", type=int, default=30)
    args = parser.parse_args(argv)
    ks = parse_ks(args.measure_ks.split(","))
    print(json.dumps(measure_worker(args.measure_worker, ks, args.measure_steps)))


if __name__ == "__main__":
    _worker_main()
