"""Our goodput rule on the Pollux traces' own gradient statistics, against AdaptDL's own
goodput function (values computed once with its published code:
docs/benchmarks/adaptdl_reference/, with the command).

Where the two coincide (the same objective, r(B) / T(B), and the same step-time model:
Pollux's, with AdaptDL's fitted parameters), the predicted speed-ups over the smallest
batch must agree within 5 % at every epoch and every N. On one GPU AdaptDL also forces at
least two micro-steps for any batch above B_init (its gradient statistics need two
micro-batches; our engine does not), so the coinciding step time there charges the same.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest

from tf_adabatch.app import goodput_replay as R
from tf_adabatch.app import step_time_fit as F

REFERENCE = Path(__file__).resolve().parent.parent / "docs/benchmarks/adaptdl_reference/values.json"


def _forced_accumulation(step_time, init_batch: int, max_local: int, params: dict):
    """Pollux's step time with AdaptDL's one-GPU rule: at least 2 micro-steps above B_init."""

    def seconds(batch: int, devices: int) -> float:
        if devices > 1 or batch <= init_batch:
            return step_time(batch, devices)
        extra = max(1, math.ceil(batch / max_local - 1e-8) - 1)
        micro = math.ceil(batch / (extra + 1) - 1e-8)
        return (extra + 1) * (params["alpha_c"] + params["beta_c"] * micro)  # no all-reduce

    return seconds


@pytest.mark.parametrize("workload", ["imagenet", "cifar10"])
def test_where_the_models_coincide_the_speedups_agree_within_5_percent(workload: str) -> None:
    reference = json.loads(REFERENCE.read_text())[workload]
    runs = R.read_validation(os.path.join(F.TRACES, workload))
    params = reference["perf_params"]
    pollux = R.pollux_step_time(params, reference["max_local_bsz"])
    step_time = _forced_accumulation(
        pollux, reference["init_batch_size"], reference["max_local_bsz"], params
    )
    compared = 0
    for n, points in reference["devices"].items():
        ours = R.replay(step_time, runs, devices=int(n), min_local=reference["min_local_bsz"])
        assert len(ours) == len(points)
        for mine, theirs in zip(ours, points, strict=True):
            assert mine is not None and mine.smallest == theirs["smallest_batch"]
            assert mine.speedup == pytest.approx(theirs["speedup"], rel=0.05), (n, theirs)
            compared += 1
    assert compared == len(reference["devices"]) * len(runs[min(runs)].grad_sqr) >= 600


def test_an_exact_gradient_keeps_the_smallest_batch_and_pure_noise_takes_the_largest() -> None:
    """r = 1 (var = 0): the rate 1 / T falls with B, so B_min; r = S (sqr = 0) on a step
    time that grows slower than B: the largest. T(B) = 1 + B / 100 on 1 device."""
    linear = lambda batch, devices: 1.0 + batch / 100.0  # noqa: E731
    exact = R.choose(
        linear, grad_sqr=1.0, grad_var=0.0, init_batch=10, devices=1, min_local=1, max_batch=100
    )
    noisy = R.choose(
        linear, grad_sqr=0.0, grad_var=1.0, init_batch=10, devices=1, min_local=1, max_batch=100
    )
    assert exact == R.Choice(batch=10, smallest=10, speedup=1.0)
    # r / T at B = 100: 10 / 2 = 5, at B = 10: 1 / 1.1: 5.5 times faster.
    assert noisy == R.Choice(batch=100, smallest=10, speedup=pytest.approx(5.5))
