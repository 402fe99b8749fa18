r"""Statistical efficiency and time to accuracy on Fashion-MNIST: seven ways to train.

The logic of `launch/benchmark_efficiency.py`, whose flags are the fields of `Options`:

    python launch/benchmark_efficiency.py --outdir=workdir/benchmark_efficiency

Every run is the launcher (`python -m tf_adabatch.app`, as `launch/train.py`) on the CNN config with 4 logical CPU replicas and the
same base schedule (SGD + momentum 0.9, B0 = 128, learning rate 0.05, cosine over
`--base_epochs` epochs at B0); only the batch-size policy and the learning-rate rule
change:

  baseline           static batch B0, the base schedule as tuned
  linear_16x         static batch 16 B0, learning rate x16 with linear warm-up
                     (over the first `--warmup_fraction` of the budget; Goyal et al.)
  adascale_16x       static batch 16 B0, AdaScale gain, schedule on progress tau
  simigrad_adascale  SimiGrad controls the batch in [B0, 16 B0], AdaScale (the default)
  simigrad_sqrt      SimiGrad controls the batch, learning rate x sqrt(S) (the reference)
  simigrad_estimated simigrad_adascale with similarity='estimated' (no group all-reduce)
  goodput            GoodputPolicy picks the batch in [B0, 16 B0] with the most progress
                     per second on this machine, AdaScale
  static_2x, _4x, _8x  static batch 2, 4, 8 B0 with AdaScale (with baseline and
                     adascale_16x: the candidates of the oracle static batch below)
  critical_warmup    CriticalBatchWarmupPolicy: x2 when the smoothed noise scale reaches
                     the doubled batch, never shrinks (Merrill et al. 2025), AdaScale
  norm_test          NormTestPolicy: the smallest batch the norm test passes, never
                     shrinks (Byrd et al. 2012), AdaScale
  seesaw             SeesawPolicy on the step-decay schedule (x1/2 at 1/2 and 3/4 of the
                     budget): the batch doubles there instead, rate x sqrt(S) (Meterez
                     et al. 2025)
  baseline_step      static batch B0 on that step-decay schedule (Seesaw's own reference)

Policies (`policies.md`, `policies.png`, whenever one of the variants of
`POLICY_VARIANTS` ran): each policy's optimizer steps, examples and seconds (priced
GPU seconds with `--clock_profiles`) to the final value of `--metric` (accuracy, or
bits_per_byte for the language model, lower is better) of the baseline run of the same
seed, its final value, and the batch size and noise scale along training.

GPU time (`--clock_profiles`, e.g. `cifar10_resnet18_t4,imagenet_resnet50_t4`, and
`--clock_devices`, default 1,8,64): the runs train here, and their time is priced by a
measured profile on N GPUs (the virtual clock, `configs/profiles/*_t4.py`). A run whose
batches do not depend on time (every variant but goodput) runs once and is priced
afterwards from its per-step batch sizes: each step costs what the profile predicts for
its global batch on N GPUs (`StepTimeModel.step_seconds`), exactly what the virtual
clock would have charged. Goodput learns its step times from the clock, so it runs once
per profile and N, with `--config.clock.profile/devices`; its own reported seconds are
checked against the same pricing. The threshold is 99 % of the baseline's mean final
test accuracy (every baseline run must reach it); the oracle is the static variant
(baseline, static_2x/4x/8x, adascale_16x) with the least mean time to it, chosen after
the fact. `gpu_time.md` / the "gpu_time" key of results.json hold the table, with 95 %
bootstrap intervals over seeds of each mean ratio.

Time to accuracy: every evaluation records the seconds the run has spent training
(evaluations excluded; `adabatch/train_seconds` in its eval logs). For each run, the
first evaluation at or above the baseline's mean final test accuracy gives the seconds,
optimizer steps and examples to reach it. The runs are interleaved: each seed runs every
variant, in an order rotated by one per seed, so slow spells of this shared machine hit
all variants alike.

The runs are sequential subprocesses, each with a time limit. A run that already wrote
its `metrics.json` is not rerun, so an interrupted benchmark continues where it stopped
(and an interrupted run resumes from its checkpoint). At the end the script writes to
`--outdir`: `results.json` (every run's metrics and curves), `results.md` (the table and
the targets), `accuracy.png` and `adaptation.png`.

`--config` and `--override` choose another task (the test suite runs a tiny version on
scikit-learn's digits so that this benchmark cannot rot).
"""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from absl import app

from tf_adabatch.app.benchmarks import FlagOptions

# name -> (batch-size policy, learning-rate rule, static batch in units of B0 or None).
VARIANTS: dict[str, tuple[str, str, str | None]] = {
    "baseline": ("static", "none", "1"),
    "linear_16x": ("static", "linear", "S"),
    "adascale_16x": ("static", "adascale", "S"),
    "simigrad_adascale": ("simigrad", "adascale", None),
    "simigrad_sqrt": ("simigrad", "sqrt", None),
    "simigrad_estimated": ("simigrad", "adascale", None),
    "goodput": ("goodput", "adascale", None),
    "static_2x": ("static", "adascale", "2"),
    "static_4x": ("static", "adascale", "4"),
    "static_8x": ("static", "adascale", "8"),
    "critical_warmup": ("critical_warmup", "adascale", None),
    "norm_test": ("norm_test", "adascale", None),
    "seesaw": ("seesaw", "sqrt", None),
    "baseline_step": ("static", "none", "1"),
}
# The oracle's candidates: the static batches in [B0, S B0].
__all__ = [
    "Options",
    "batch_by_tenth",
    "priced_seconds",
    "ratio_interval",
    "run_plan",
    "seconds_to",
    "time_to_accuracy",
]

STATIC_VARIANTS = ("baseline", "static_2x", "static_4x", "static_8x", "adascale_16x")
# Further overrides of some variants.
EXTRA: dict[str, dict[str, Any]] = {
    "simigrad_estimated": {"similarity": "estimated"},
    # Seesaw is defined on a step-decay schedule: x lr.decay_factor (1/2) at the fractions
    # lr.decay_fractions of the budget, where it doubles the batch instead (x sqrt 2 by
    # the rule: the rate falls by 1/sqrt 2).
    "seesaw": {"lr.schedule": "step"},
    "baseline_step": {"lr.schedule": "step"},
}
# The batch-size policies compared in `policy_table` (issue 32), against the baseline.
POLICY_VARIANTS = (
    "adascale_16x",
    "simigrad_adascale",
    "goodput",
    "critical_warmup",
    "norm_test",
    "seesaw",
    "baseline_step",
)
# The evaluation metrics a threshold can be on, and whether lower is better.
METRICS = {"accuracy": False, "bits_per_byte": True}
ADAPTATION_TAGS = ("batch_size", "similarity", "gain", "learning_rate")
# Also kept per run: progress tau (the x-axis of the adaptation plot), and the policy's
# reference lines (SimiGrad's target similarity and batch bounds), as written by training.
CURVE_TAGS = (*ADAPTATION_TAGS, "progress", "noise_scale")
REFERENCE_TAGS = ("target_similarity", "min_batch_size", "max_batch_size")


@dataclass(frozen=True)
class Options(FlagOptions):
    """The benchmark's options: the flags of `launch/benchmark_efficiency.py`, one field each.

    List flags are kept as tuples of their strings, as given on the command line.

    >>> Options(seeds=["0", "1"]).seeds
    ('0', '1')
    >>> Options().variants == tuple(VARIANTS)
    True
    """

    outdir: str = "workdir/benchmark_efficiency"
    config: str = "fashion_mnist"  # the launch script's default is the checkout's file
    seeds: tuple[str, ...] = ("0", "1", "2")
    variants: tuple[str, ...] = tuple(VARIANTS)
    base_epochs: float = 3.0
    eval_every_base_epochs: float = 0.5
    warmup_fraction: float = 0.2
    scale: int = 16
    override: tuple[str, ...] = ()
    timeout_per_run: int = 1800
    metric: str = "accuracy"
    clock_profiles: tuple[str, ...] = ()
    clock_devices: tuple[str, ...] = ("1", "8", "64")


def _flags_for(
    options: Options, variant: str, seed: int, b0: int, clock: tuple[str, int] | None = None
) -> list[str]:
    """The launcher's overrides of one run (`clock`: a virtual clock's profile and devices).

    >>> _flags_for(Options(), "baseline", 0, 128)[:2]
    ['--config.seed=0', '--config.train.base_epochs=3.0']
    """
    kind, rule, static = VARIANTS[variant]
    values: dict[str, Any] = {
        "seed": seed,
        "train.base_epochs": options.base_epochs,
        "train.eval_every_base_epochs": options.eval_every_base_epochs,
        "policy.kind": kind,
        "lr.rule": rule,
        # SimiGrad starts at B0 and may grow to S B0; static runs hold their batch.
        "policy.initial_batch_size": b0 * (options.scale if static == "S" else int(static or 1)),
        "policy.min_batch_size": b0,
        "policy.max_batch_size": options.scale * b0,
        "lr.warmup_base_epochs": (
            options.warmup_fraction * options.base_epochs if rule == "linear" else 0.0
        ),
        **EXTRA.get(variant, {}),
    }
    if clock is not None:
        values["clock.profile"], values["clock.devices"] = clock
    out = [f"--config.{key}={value}" for key, value in values.items()]
    return out + [f"--config.{item}" for item in options.override]


def _load_config(path: str) -> Any:
    spec = importlib.util.spec_from_file_location("benchmark_base_config", path)
    if spec is None or spec.loader is None:
        raise app.UsageError(f"--config must be a Python config file. Received: {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _run(
    options: Options, variant: str, seed: int, b0: int, clock: tuple[str, int] | None = None
) -> dict[str, Any]:
    tag = "" if clock is None else f"{clock[0]}x{clock[1]}"
    workdir = Path(options.outdir) / variant / tag / f"seed{seed}"
    metrics_path = workdir / "metrics.json"
    if not metrics_path.exists():
        cmd = [
            sys.executable,
            "-m",
            "tf_adabatch.app",
            f"--config={options.config}",
            f"--workdir={workdir}",
            *_flags_for(options, variant, seed, b0, clock),
        ]
        workdir.mkdir(parents=True, exist_ok=True)
        start = time.time()
        with open(workdir / "log.txt", "a", encoding="utf-8") as log:
            log.write(" ".join(cmd) + "\n")
            log.flush()
            code: int | str
            try:
                code = subprocess.run(
                    cmd, stdout=log, stderr=subprocess.STDOUT, timeout=options.timeout_per_run
                ).returncode
            except subprocess.TimeoutExpired:
                code = "timeout"
        if code != 0 or not metrics_path.exists():
            raise RuntimeError(
                f"{variant} seed {seed} failed ({code}) after {time.time() - start:.0f} s; "
                f"see {workdir / 'log.txt'}"
            )
    from tf_adabatch import summaries

    metrics = json.loads(metrics_path.read_text())
    train = summaries.read_scalars(str(workdir / "tensorboard" / "train"))
    evals = summaries.read_scalars(str(workdir / "tensorboard" / "eval"))
    # Examples at each step, from the per-step batch sizes (skipped steps consume data too).
    examples, total = {}, 0.0
    for step, batch in train.get("adabatch/batch_size", []):
        total += batch
        examples[step] = total
    curves: dict[str, list[Any]] = {tag: train.get(f"adabatch/{tag}", []) for tag in CURVE_TAGS}
    curves["accuracy"] = evals.get(summaries.eval_tag("accuracy"), [])
    if options.metric != "accuracy":
        curves[options.metric] = evals.get(summaries.eval_tag(options.metric), [])
    curves["accuracy_examples"] = [
        (examples.get(step, math.nan), value) for step, value in curves["accuracy"]
    ]
    seconds = dict(evals.get(summaries.TRAIN_SECONDS, []))
    curves["accuracy_seconds"] = [
        (seconds.get(step, math.nan), value) for step, value in curves["accuracy"]
    ]
    references = {
        tag: train[f"adabatch/{tag}"][-1][1] for tag in REFERENCE_TAGS if f"adabatch/{tag}" in train
    }
    return {
        "variant": variant,
        "seed": seed,
        "clock": tag,
        "metrics": metrics,
        "curves": curves,
        "references": references,
    }


def run_plan(variants: list[str], seeds: list[int]) -> list[tuple[str, int]]:
    """Every seed runs every variant; the order rotates by one per seed (interleaved).

    >>> run_plan(["a", "b", "c"], [0, 1])
    [('a', 0), ('b', 0), ('c', 0), ('b', 1), ('c', 1), ('a', 1)]
    """
    n = len(variants)
    return [(variants[(i + j) % n], seed) for i, seed in enumerate(seeds) for j in range(n)]


# ----------------------------------------------------------------- GPU time (virtual clock)


def priced_seconds(run: dict[str, Any], model: Any, devices: int) -> list[tuple[int, float]]:
    """(step, seconds) at each of the run's evaluations, every step priced by `model` on
    `devices` GPUs: the sum of `model.step_seconds(batch, devices)` over the steps up to
    and including the evaluation's step (a skipped step's batch was computed too).

    >>> from tf_adabatch import StepTimeModel
    >>> model = StepTimeModel(compute_fixed=1.0, compute_per_example=0.01)
    >>> run = {"curves": {"batch_size": [(1, 100.0), (2, 100.0), (3, 200.0)],
    ...                   "accuracy": [(2, 0.5), (3, 0.7)]}}
    >>> priced_seconds(run, model, devices=1)  # 2 + 2 at step 2, + 3 at step 3
    [(2, 4.0), (3, 7.0)]
    """
    total, at_step = 0.0, {}
    for step, batch in run["curves"]["batch_size"]:
        total += model.step_seconds(batch, devices)
        at_step[int(step)] = total
    return [(int(step), at_step.get(int(step), math.nan)) for step, _ in run["curves"]["accuracy"]]


def seconds_to(run: dict[str, Any], priced: list[tuple[int, float]], target: float) -> float:
    """Priced seconds at the run's first evaluation with accuracy >= `target` (inf: never).

    >>> seconds_to({"curves": {"accuracy": [(2, 0.5), (3, 0.7)]}}, [(2, 4.0), (3, 7.0)], 0.6)
    7.0
    """
    for (step, accuracy), (priced_step, seconds) in zip(
        run["curves"]["accuracy"], priced, strict=True
    ):
        assert step == priced_step
        if accuracy >= target:
            return seconds
    return math.inf


def gpu_time(runs: list[dict[str, Any]], profiles: list[str], devices: list[int]) -> dict[str, Any]:
    """Every variant's priced seconds to 99 % of the baseline's mean final accuracy, per
    profile and N; the oracle static batch; ratios with bootstrap intervals over seeds.

    Goodput's runs under a virtual clock are matched to their (profile, N); every other
    run (host clock) is priced for every (profile, N). `checks` holds, for each goodput
    run, the largest difference between the seconds it reported (its virtual clock's)
    and its pricing here (they must agree).
    """
    from tf_adabatch.app import factories

    host = [r for r in runs if not r.get("clock")]
    finals = [float(r["metrics"]["test_accuracy"]) for r in host if r["variant"] == "baseline"]
    if not finals:
        raise app.UsageError("GPU time needs the baseline variant (its accuracy is the threshold).")
    target = 0.99 * statistics.fmean(finals)
    result: dict[str, Any] = {"target_accuracy": target, "tables": {}, "checks": []}
    for profile in profiles:
        model = factories.load_step_time_model(profile)
        for n in devices:
            key = f"{profile}x{n}"
            times: dict[str, list[float]] = {}
            for run in runs:
                if run.get("clock") not in ("", key):
                    continue
                priced = priced_seconds(run, model, n)
                if run.get("clock") == key:  # its own virtual clock's seconds must agree
                    own = run["curves"]["accuracy_seconds"]
                    result["checks"].append(
                        max(
                            abs(a - b) / max(b, 1e-12)
                            for (a, _), (_, b) in zip(own, priced, strict=True)
                        )
                    )
                elif run["variant"] == "goodput":
                    continue  # a host-clock goodput run learned this CPU's times
                times.setdefault(run["variant"], []).append(seconds_to(run, priced, target))
            static = {v: statistics.fmean(t) for v, t in times.items() if v in STATIC_VARIANTS}
            oracle = min(static, key=lambda v: static[v]) if static else None
            rows = {}
            for variant, mine in sorted(
                times.items(), key=lambda item: list(VARIANTS).index(item[0])
            ):
                row: dict[str, Any] = {"seconds": mine, "mean": statistics.fmean(mine)}
                for name, ref in (("vs_baseline", "baseline"), ("vs_oracle", oracle)):
                    if ref in times and all(map(math.isfinite, mine + times[ref])):
                        row[name] = (
                            statistics.fmean(mine) / statistics.fmean(times[ref]),
                            *ratio_interval(times[ref], mine),
                        )
                rows[variant] = row
            result["tables"][key] = {"oracle": oracle, "rows": rows}
    return result


def gpu_time_markdown(result: dict[str, Any]) -> str:
    """The GPU-time tables: one per profile and N."""
    lines = [
        f"Threshold: {100 * result['target_accuracy']:.2f} % test accuracy (99 % of the "
        "baseline's mean final accuracy). Seconds: mean over seeds of the priced training "
        "seconds to it; ratios: of the means, with the 95 % bootstrap interval over seeds.",
    ]
    if result["checks"]:
        lines.append(
            f"Goodput's own virtual-clock seconds against this pricing: largest relative "
            f"difference {max(result['checks']):.1e} over {len(result['checks'])} runs."
        )
    for key, table in result["tables"].items():
        lines += [
            "",
            f"**{key}** (oracle static batch: {table['oracle']})",
            "",
            "| variant | seeds | seconds to threshold | vs static B0 | vs oracle |",
            "|---|---|---|---|---|",
        ]
        for variant, row in table["rows"].items():
            cells = []
            for ref in ("vs_baseline", "vs_oracle"):
                if ref in row:
                    ratio, lo, hi = row[ref]
                    cells.append(f"{ratio:.2f}× ({lo:.2f}–{hi:.2f})")
                else:
                    cells.append("-")
            mean = row["mean"]
            shown = f"{mean:,.1f}" if math.isfinite(mean) else "not reached"
            lines.append(
                f"| {variant} | {len(row['seconds'])} | {shown} | {cells[0]} | {cells[1]} |"
            )
    return "\n".join(lines) + "\n"


def _mean_std(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def time_to_accuracy(run: dict[str, Any], target: float) -> dict[str, float] | None:
    """Seconds (training only), optimizer steps and examples at the run's first
    evaluation with test accuracy >= `target`; None if it never got there.

    >>> run = {"curves": {"accuracy": [(10, 0.5), (20, 0.8), (30, 0.9)],
    ...                   "accuracy_seconds": [(4.0, 0.5), (9.0, 0.8), (13.0, 0.9)],
    ...                   "accuracy_examples": [(320, 0.5), (960, 0.8), (1600, 0.9)]}}
    >>> time_to_accuracy(run, 0.75)
    {'seconds': 9.0, 'steps': 20.0, 'examples': 960.0}
    >>> time_to_accuracy(run, 0.95) is None
    True
    """
    curves = run["curves"]
    points = zip(
        curves["accuracy"],
        curves.get("accuracy_seconds", []),
        curves["accuracy_examples"],
        strict=True,
    )
    for (step, accuracy), (seconds, _), (examples, _) in points:
        if accuracy >= target:
            return {"seconds": float(seconds), "steps": float(step), "examples": float(examples)}
    return None


def summarize(runs: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Per-variant means and standard deviations, and the targets' verdicts.

    Time to accuracy is against the baseline's mean final test accuracy, averaged over
    the runs that reached it (`reached` says how many did).
    """
    baseline = [float(r["metrics"]["test_accuracy"]) for r in runs if r["variant"] == "baseline"]
    target = statistics.fmean(baseline) if baseline else None
    rows = []
    for variant in VARIANTS:
        mine = [r for r in runs if r["variant"] == variant]
        if not mine:
            continue
        row: dict[str, Any] = {"variant": variant, "runs": len(mine)}
        for key in (
            "test_accuracy",
            "optimizer_steps",
            "examples_seen",
            "average_batch_size",
            "wall_time_s",
        ):
            row[key] = _mean_std([float(r["metrics"][key]) for r in mine])
        if target is not None:
            reached = [t for t in (time_to_accuracy(r, target) for r in mine) if t is not None]
            row["target_accuracy"] = target
            row["reached"] = len(reached)
            for key in ("seconds", "steps", "examples"):
                row[f"{key}_to_target"] = (
                    _mean_std([t[key] for t in reached]) if reached else (math.nan, math.nan)
                )
        rows.append(row)
    by = {row["variant"]: row for row in rows}
    verdicts = []
    base = by.get("baseline")
    if base and "goodput" in by:
        mine = by["goodput"]["seconds_to_target"][0]
        others = {
            v: by[v]["seconds_to_target"][0]
            for v in ("baseline", "simigrad_adascale", "adascale_16x")
            if v in by
        }
        # At most the baseline's time, and less than the other adaptive variants' (a
        # variant that never reached the accuracy took longer than any finite time).
        ok = by["goodput"]["reached"] == by["goodput"]["runs"] and all(
            not math.isfinite(t) or (mine <= t if v == "baseline" else mine < t)
            for v, t in others.items()
        )
        reached_note = f"{by['goodput']['reached']}/{by['goodput']['runs']} runs reached it"
        target_note = "target: at most 1.0x the baseline's time, below the others'"
        if math.isfinite(mine):
            ratios = ", ".join(f"{mine / t:.2f}x {v}'s" for v, t in others.items())
            verdicts.append(
                f"{'MET' if ok else 'NOT MET'}: goodput reaches the baseline's accuracy in "
                f"{mine:.0f} s of training, {ratios} ({target_note}; {reached_note})"
            )
        else:
            verdicts.append(
                f"NOT MET: goodput never reached the baseline's final accuracy ({target_note}; "
                f"{reached_note})"
            )
    if base:
        acc0, steps0 = base["test_accuracy"][0], base["optimizer_steps"][0]
        for variant, quarter in (("simigrad_adascale", True), ("adascale_16x", False)):
            if variant not in by:
                continue
            delta = 100 * (by[variant]["test_accuracy"][0] - acc0)
            ok = delta >= -0.5
            text = (
                f"{variant}: mean test accuracy {delta:+.2f} points against the baseline's "
                "(target: at least -0.5)"
            )
            if quarter:
                ratio = by[variant]["optimizer_steps"][0] / steps0
                ok = ok and ratio <= 0.25
                text += f", {ratio:.3f} of its optimizer steps (target: at most 0.25)"
            verdicts.append(f"{'MET' if ok else 'NOT MET'}: {text}")
    return rows, verdicts


def batch_by_tenth(run: dict[str, Any]) -> list[float]:
    """The run's average global batch in each tenth of its progress budget (tau).

    A step belongs to the tenth its progress reached *before* it started.

    >>> run = {"curves": {"batch_size": [(1, 10.0), (2, 10.0), (3, 30.0), (4, 50.0)],
    ...                   "progress": [(1, 1.0), (2, 2.0), (3, 5.0), (4, 10.0)]},
    ...        "metrics": {"base_steps": 10}}
    >>> batch_by_tenth(run)[:5]
    [10.0, 10.0, 30.0, nan, nan]
    """
    budget = float(run["metrics"]["base_steps"])
    sums, counts = [0.0] * 10, [0] * 10
    before = 0.0
    for (_, batch), (_, after) in zip(
        run["curves"]["batch_size"], run["curves"]["progress"], strict=True
    ):
        tenth = min(9, int(10 * before / budget))
        sums[tenth] += batch
        counts[tenth] += 1
        before = after
    return [s / c if c else math.nan for s, c in zip(sums, counts, strict=True)]


def similarity_modes(runs: list[dict[str, Any]]) -> list[str]:
    """Exact against estimated similarity (simigrad_adascale vs simigrad_estimated):
    optimizer steps and the average batch in each tenth of the run, means over seeds;
    the target is every ratio within 10%."""
    exact = [r for r in runs if r["variant"] == "simigrad_adascale"]
    estimated = [r for r in runs if r["variant"] == "simigrad_estimated"]
    if not exact or not estimated:
        return []

    def per_seed(mine: list[dict[str, Any]]) -> list[list[float]]:
        """Column 0: each seed's optimizer steps; columns 1-10: each seed's average batch
        in that tenth (computed once, for the means and for the intervals)."""
        tenths = [batch_by_tenth(r) for r in mine]
        steps = [float(r["metrics"]["optimizer_steps"]) for r in mine]
        return [steps, *(list(col) for col in zip(*tenths, strict=True))]

    columns = list(zip(per_seed(exact), per_seed(estimated), strict=True))
    means = [(statistics.fmean(x), statistics.fmean(y)) for x, y in columns]
    steps = list(means[0])
    a, b = [x for x, _ in means[1:]], [y for _, y in means[1:]]
    ratios = [y / x for x, y in means]
    # A tenth without steps in both modes (a huge batch) compares nothing; in one only,
    # its ratio is NaN and fails.
    both_empty = [False] + [math.isnan(x) and math.isnan(y) for x, y in zip(a, b, strict=True)]
    compared = [r for r, skip in zip(ratios, both_empty, strict=True) if not skip]
    ok = all(abs(r - 1.0) <= 0.10 for r in compared)
    # With seeds to spare, how sure each ratio is: a bootstrap over the seeds.
    intervals = [ratio_interval(x, y) for x, y in columns]
    sure = [
        (lo, hi)
        for (lo, hi), skip in zip(intervals, both_empty, strict=True)
        if not skip and not math.isnan(lo)
    ]
    floor = [
        f"- same mode, seed against seed (the criterion's noise floor): {line}"
        for mode, mine in (("exact", exact), ("estimated", estimated))
        if (line := _seed_spread(mode, mine))
    ]
    return [
        "",
        f"Exact against estimated similarity ({len(exact)} and {len(estimated)} seeds; "
        "means over seeds; average global batch in each tenth of the progress budget):",
        "",
        "| | optimizer steps | " + " | ".join(f"tenth {i + 1}" for i in range(10)) + " |",
        "|---" * 12 + "|",
        f"| exact | {steps[0]:.0f} | " + " | ".join(f"{v:.0f}" for v in a) + " |",
        f"| estimated | {steps[1]:.0f} | " + " | ".join(f"{v:.0f}" for v in b) + " |",
        "| estimated / exact | " + " | ".join(f"{r:.3f}" for r in ratios) + " |",
        *(
            [
                "| 95% interval (bootstrap over seeds) | "
                + " | ".join(
                    "-" if math.isnan(lo) else f"{lo:.2f}-{hi:.2f}" for lo, hi in intervals
                )
                + " |"
            ]
            if sure
            else []
        ),
        "",
        f"- {'MET' if ok else 'NOT MET'}: every ratio within 10% ({len(compared)} compared, "
        f"largest deviation {max(abs(r - 1.0) for r in compared):.1%})",
        *(
            [
                f"- by the intervals: {sum(lo >= 0.9 and hi <= 1.1 for lo, hi in sure)} of "
                f"{len(sure)} ratios surely within 10% (the interval inside 0.90-1.10), "
                f"{sum(hi < 0.9 or lo > 1.1 for lo, hi in sure)} surely outside, the rest "
                "undecided at this number of seeds"
            ]
            if sure
            else []
        ),
        *floor,
    ]


def ratio_interval(
    exact: list[float], estimated: list[float], *, resamples: int = 4000
) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of mean(estimated) / mean(exact) when each mode's
    seeds are resampled with replacement (fixed RNG seed: the same runs give the same
    interval); NaN values (a tenth without steps) are left out; (nan, nan) with fewer
    than two values in either mode.

    >>> ratio_interval([100.0, 100.0], [110.0, 110.0])
    (1.1, 1.1)
    >>> ratio_interval([100.0], [110.0, 120.0])
    (nan, nan)
    """
    import numpy as np

    a = np.array([v for v in exact if not math.isnan(v)], dtype=float)
    b = np.array([v for v in estimated if not math.isnan(v)], dtype=float)
    if len(a) < 2 or len(b) < 2:
        return math.nan, math.nan
    rng = np.random.default_rng(0)
    ratios = rng.choice(b, size=(resamples, len(b))).mean(axis=1) / rng.choice(
        a, size=(resamples, len(a))
    ).mean(axis=1)
    low, high = np.percentile(ratios, [2.5, 97.5])
    return round(float(low), 6), round(float(high), 6)


def _seed_spread(mode: str, runs: list[dict[str, Any]]) -> str:
    """The largest deviation between two seeds of one mode, by the same ratios as the
    cross-mode comparison (each seed against the first; steps and every tenth with
    steps in both): '' with fewer than two seeds.

    >>> run = lambda steps, b: {"metrics": {"optimizer_steps": steps, "base_steps": 10},
    ...     "curves": {"batch_size": [(1, b)], "progress": [(1, 10.0)]}}
    >>> _seed_spread("exact", [run(100, 64.0), run(120, 48.0)])
    'exact: steps 1.200, largest deviation 25.0% (2 seeds, 2 compared)'
    """
    if len(runs) < 2:
        return ""
    first_steps, first = runs[0]["metrics"]["optimizer_steps"], batch_by_tenth(runs[0])
    deviations, ratios = [], []
    for other in runs[1:]:
        ratios.append(other["metrics"]["optimizer_steps"] / first_steps)
        tenths = batch_by_tenth(other)
        deviations += [abs(ratios[-1] - 1.0)] + [
            abs(y / x - 1.0)
            for x, y in zip(first, tenths, strict=True)
            if not (math.isnan(x) or math.isnan(y))
        ]
    return (
        f"{mode}: steps {', '.join(f'{r:.3f}' for r in ratios)}, largest deviation "
        f"{max(deviations):.1%} ({len(runs)} seeds, {len(deviations)} compared)"
    )


def markdown(rows: list[dict[str, Any]], verdicts: list[str]) -> str:
    lines = [
        "| variant | runs | test accuracy (%) | optimizer steps | examples | average batch "
        "| wall time in run() (s) | training seconds to the baseline's accuracy "
        "| steps to it | examples to it |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        acc, steps, ex, batch, wall = (
            row[k]
            for k in (
                "test_accuracy",
                "optimizer_steps",
                "examples_seen",
                "average_batch_size",
                "wall_time_s",
            )
        )
        lines.append(
            f"| {row['variant']} | {row['runs']} | {100 * acc[0]:.2f} ± {100 * acc[1]:.2f} "
            f"| {steps[0]:.0f} ± {steps[1]:.0f} | {ex[0] / 1e6:.3f}M ± {ex[1] / 1e6:.3f}M "
            f"| {batch[0]:.0f} ± {batch[1]:.0f} | {wall[0]:.0f} ± {wall[1]:.0f} |"
            + _to_target_cells(row)
        )
    if rows and "target_accuracy" in rows[0]:
        lines += [
            "",
            f"Time to accuracy: to {100 * rows[0]['target_accuracy']:.2f}% (the baseline's "
            "mean final test accuracy), training seconds (evaluations excluded), mean over "
            "the runs that reached it (their number in brackets).",
        ]
    return "\n".join(lines + [""] + [f"- {v}" for v in verdicts]) + "\n"


def _to_target_cells(row: dict[str, Any]) -> str:
    if "reached" not in row:
        return " - | - | - |"
    if not row["reached"]:
        return f" not reached (0/{row['runs']}) | - | - |"
    (sec, sec_sd), (steps, steps_sd), (ex, ex_sd) = (
        row[f"{k}_to_target"] for k in ("seconds", "steps", "examples")
    )
    return (
        f" {sec:.0f} ± {sec_sd:.0f} ({row['reached']}/{row['runs']}) | {steps:.0f} ± {steps_sd:.0f} "
        f"| {ex / 1e6:.3f}M ± {ex_sd / 1e6:.3f}M |"
    )


def _seed_band(
    curves: list[list[tuple[float, float]]],
) -> tuple[Any, Any, Any, Any]:
    """Evaluation i of every seed (the same progress tau in each): the mean x, and the
    mean, min and max y over the seeds, up to the shortest seed's evaluations."""
    import numpy as np

    n = min(len(c) for c in curves)
    xs = np.array([[p[0] for p in c[:n]] for c in curves])
    ys = np.array([[p[1] for p in c[:n]] for c in curves])
    return xs.mean(0), ys.mean(0), ys.min(0), ys.max(0)


def _on_grid(curves: list[list[tuple[float, float]]], xs: list[list[float]], grid: Any) -> Any:
    """Each seed's series interpolated onto `grid` (rows: seeds)."""
    import numpy as np

    return np.array(
        [np.interp(grid, x, [v for _, v in c]) for c, x in zip(curves, xs, strict=True)]
    )


def _rolling_mean(values: list[float], window: int) -> Any:
    """Centered moving average; NaN values are left out, the edges use what they have."""
    import numpy as np

    v = np.asarray(values, dtype=float)
    ok = np.isfinite(v)
    kernel = np.ones(window)
    total = np.convolve(np.where(ok, v, 0.0), kernel, mode="same")
    count = np.convolve(ok.astype(float), kernel, mode="same")
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


def accuracy_window(runs: list[dict[str, Any]]) -> tuple[float, float, list[str]]:
    """The test-accuracy range of the accuracy plot, and the variants drawn inside it.

    The variants that trained are those whose mean final accuracy is within 10 points of
    the best variant's (a diverged run ends near chance). The range runs from the lowest
    final accuracy of their seeds minus a quarter of the spread (at least 0.2 points) up
    to the highest accuracy any of their evaluations reached plus 1/20 of the spread.
    """
    final: dict[str, list[float]] = {}
    for run in runs:
        final.setdefault(run["variant"], []).append(float(run["metrics"]["test_accuracy"]))
    best = max(statistics.fmean(a) for a in final.values())
    trained = [v for v, a in final.items() if statistics.fmean(a) >= best - 0.1]
    lowest = min(min(final[v]) for v in trained)
    highest = max(
        [p[1] for r in runs if r["variant"] in trained for p in r["curves"]["accuracy"]]
        + [max(final[v]) for v in trained]
    )
    pad = max(0.25 * (highest - lowest), 0.002)
    return lowest - pad, highest + 0.2 * pad, trained


def _first_at(curve: list[tuple[float, float]], target: float, lower: bool) -> int | None:
    """The step of the first evaluation at or better than `target` (None: never).

    >>> _first_at([(10, 3.0), (20, 2.5), (30, 2.0)], 2.5, lower=True)
    20
    >>> _first_at([(10, 0.5), (20, 0.7)], 0.8, lower=False) is None
    True
    """
    for step, value in curve:
        if (value <= target) if lower else (value >= target):
            return int(step)
    return None


def policy_table(
    runs: list[dict[str, Any]], metric: str, profile: str | None, devices: list[int]
) -> tuple[str, dict[str, Any]]:
    """The policies against the baseline on `metric` (issue 32), seed by seed.

    Each run's threshold is the final value of the baseline run of the same seed (same
    initialisation and data order; every baseline run reaches its own, at its last
    evaluation at the latest). Per variant (goodput per virtual clock): the final value,
    and the optimizer steps, examples, this machine's training seconds and the seconds
    priced by `profile` on each N to the first evaluation at or better than that
    threshold; means over seeds (only if every seed got there), ratios of means against
    the baseline's. Verdicts: some policy within 0.5x the baseline's steps and 1.5x its
    examples; no policy's mean final value worse than the baseline's by more than 1 %.
    """
    from tf_adabatch.app import factories

    lower = METRICS[metric]
    final_key = f"test_{metric}"
    model = factories.load_step_time_model(profile) if profile else None

    def final(run: dict[str, Any]) -> float:
        return float(run["metrics"][final_key])

    if missing := sorted({r["variant"] for r in runs if final_key not in r["metrics"]}):
        raise app.UsageError(
            f"--metric={metric}: the runs of {missing} report no {final_key} (only a text "
            "config, e.g. configs/text_lm.py, reports bits_per_byte)."
        )
    thresholds = {
        r["seed"]: final(r) for r in runs if r["variant"] == "baseline" and not r["clock"]
    }
    if not thresholds:
        raise app.UsageError("The policy table needs the baseline variant (its final value).")
    target = statistics.fmean(thresholds.values())
    groups: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        if run["seed"] in thresholds and (
            run["variant"] == "baseline" or run["variant"] in POLICY_VARIANTS
        ):
            name = run["variant"] + (f" ({run['clock']})" if run["clock"] else "")
            groups.setdefault(name, []).append(run)
    result: dict[str, Any] = {"metric": metric, "target": target, "rows": {}}
    for name, mine in groups.items():
        row: dict[str, Any] = {"seeds": len(mine), "final": _mean_std([final(r) for r in mine])}
        hits = []
        for run in mine:
            curve = run["curves"][metric]
            step = _first_at(curve, thresholds[run["seed"]], lower)
            if step is None:
                continue
            # Every evaluation logs the accuracy too: its curves give each step's
            # examples and training seconds.
            steps = [int(s) for s, _ in run["curves"]["accuracy"]]
            examples = dict(
                zip(steps, (e for e, _ in run["curves"]["accuracy_examples"]), strict=True)
            )
            seconds = dict(
                zip(steps, (t for t, _ in run["curves"]["accuracy_seconds"]), strict=True)
            )
            hit = {"steps": step, "examples": examples[step]}
            if not run["clock"]:  # a virtual clock's seconds are priced, not this host's
                hit["seconds"] = seconds[step]
            for n in devices if model else []:
                if run["clock"] and run["clock"] != f"{profile}x{n}":
                    continue
                priced = dict(
                    priced_seconds({"curves": {**run["curves"], "accuracy": curve}}, model, n)
                )
                hit[f"gpu{n}"] = priced[step]
            hits.append(hit)
        row["reached"] = len(hits)
        for key in ("steps", "examples", "seconds", *(f"gpu{n}" for n in devices)):
            values = [h[key] for h in hits if key in h]
            if values and len(hits) == len(mine):
                row[key] = statistics.fmean(values)
        result["rows"][name] = row
    ref = result["rows"]["baseline"]
    better = "lower" if lower else "higher"
    lines = [
        f"Threshold of each run: the final {metric} of the baseline run of its seed (mean "
        f"{target:.4f}; {better} is better). To it: means over seeds (a variant with a seed "
        "that never got there shows '-'); ratios against the baseline's."
        + (f" GPU seconds: priced by {profile} on N GPUs." if model else ""),
        "",
        f"| variant | seeds | final {metric} | steps to it | examples to it | training s here "
        + "".join(f"| GPU s, N={n} " for n in devices if model)
        + "|",
        "|---" * (6 + (len(devices) if model else 0)) + "|",
    ]

    def cell(row: dict[str, Any], key: str, fmt: str) -> str:
        if key not in row:
            return "-"
        text = format(row[key], fmt)
        return text + (f" ({row[key] / ref[key]:.2f}×)" if ref.get(key) else "")

    for name, row in result["rows"].items():
        mean, sd = row["final"]
        lines.append(
            f"| {name} | {row['seeds']} | {mean:.4f} ± {sd:.4f} | {cell(row, 'steps', ',.0f')} "
            f"| {cell(row, 'examples', ',.0f')} | {cell(row, 'seconds', ',.0f')} "
            + "".join(f"| {cell(row, f'gpu{n}', ',.1f')} " for n in devices if model)
            + "|"
        )
    fast = [
        name
        for name, row in result["rows"].items()
        if name != "baseline"
        and "steps" in row
        and "steps" in ref
        and row["steps"] <= 0.5 * ref["steps"]
        and row["examples"] <= 1.5 * ref["examples"]
    ]
    sign = 1.0 if lower else -1.0  # > 0: worse than the baseline
    far = [
        f"{name} ({100 * (row['final'][0] / target - 1):+.2f} %)"
        for name, row in result["rows"].items()
        if sign * (row["final"][0] / target - 1) > 0.01
    ]
    result["verdicts"] = [
        f"{'MET' if fast else 'NOT MET'}: a policy reaches the baseline's final {metric} in "
        f"<= 0.5x its steps with <= 1.5x its examples: {', '.join(fast) or 'none'}",
        f"{'MET' if not far else 'NOT MET'}: no mean final {metric} worse than the "
        f"baseline's by more than 1 %: {'none' if not far else ', '.join(far)}",
    ]
    lines += ["", *(f"- {v}" for v in result["verdicts"])]
    return "\n".join(lines) + "\n", result


def plot_policies(runs: list[dict[str, Any]], path: Path) -> Path:
    """Batch size and noise scale along progress tau, per policy (each seed a thin line)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [v for v in ("baseline", *POLICY_VARIANTS) if any(r["variant"] == v for r in runs)]
    colors = dict(zip(names, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 3, strict=False))
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    labelled = set()
    for run in runs:
        if run["variant"] not in colors:
            continue
        tau = [t for _, t in run["curves"]["progress"]]
        label = None if run["variant"] in labelled else run["variant"]
        labelled.add(run["variant"])
        for ax, tag in zip(axes, ("batch_size", "noise_scale"), strict=True):
            values = [v for _, v in run["curves"].get(tag, [])]
            if len(values) == len(tau):
                ax.plot(tau, values, color=colors[run["variant"]], lw=0.8, alpha=0.7, label=label)
    for ax, title in zip(
        axes, ("global batch size", "noise scale tr(Σ)/|G|² (smoothed)"), strict=True
    ):
        ax.set(xlabel="progress τ (base-batch steps)", title=title, yscale="log")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_gpu_time(result: dict[str, Any], path: Path) -> Path:
    """gpu_time.png: priced seconds to the threshold against the GPUs N, log-log, one
    panel per profile; the static variants' best (the oracle) as one line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = sorted({key.rsplit("x", 1)[0] for key in result["tables"]})
    fig, axes = plt.subplots(1, len(profiles), figsize=(6 * len(profiles), 4.2), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        tables = {
            int(key.rsplit("x", 1)[1]): table
            for key, table in result["tables"].items()
            if key.rsplit("x", 1)[0] == profile
        }
        ns = sorted(tables)
        lines: dict[str, list[float]] = {}
        for n in ns:
            rows, oracle = tables[n]["rows"], tables[n]["oracle"]
            for variant, row in rows.items():
                lines.setdefault(variant, []).append(row["mean"])
            lines.setdefault("oracle static", []).append(
                rows[oracle]["mean"] if oracle else math.nan
            )
        for variant, values in lines.items():
            if variant in STATIC_VARIANTS and variant != "baseline":
                continue  # drawn as the oracle line
            style = "--" if variant == "oracle static" else "-"
            ax.plot(ns, values, style, marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("GPUs N (4 per machine)")
        ax.set_ylabel("priced seconds to the threshold")
        ax.set_title(f"{profile} (virtual clock)")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot(runs: list[dict[str, Any]], outdir: Path) -> list[Path]:
    """accuracy.png (against steps, examples and training seconds) and adaptation.png.

    Every variant is drawn as its mean over the seeds with a band from the lowest to the
    highest seed. The accuracy axes are zoomed to where the variants differ: from a little
    below the lowest final accuracy of the variants that trained (within 10 points of the
    best) to the highest accuracy reached; the others are listed as off the chart.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib import ticker

    colors = dict(
        zip(VARIANTS, plt.rcParams["axes.prop_cycle"].by_key()["color"] * 2, strict=False)
    )
    by_variant: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_variant.setdefault(run["variant"], []).append(run)
    final = {v: [float(r["metrics"]["test_accuracy"]) for r in rs] for v, rs in by_variant.items()}
    low, high, trained = accuracy_window(runs)

    def label(variant: str) -> str:
        mean, std = _mean_std(final[variant])
        n = len(final[variant])
        text = f"{variant}: {100 * mean:.2f}%" + (
            f" ± {100 * std:.2f} ({n} seeds)" if n > 1 else ""
        )
        return text + ("" if variant in trained else " (off the chart)")

    keys = ("accuracy", "accuracy_examples", "accuracy_seconds")
    xlabels = ("optimizer steps", "training examples", "training seconds, evaluations excluded")
    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    entering = dict.fromkeys(axes, math.inf)  # the x where a drawn curve enters the window
    for variant, mine in by_variant.items():
        for ax, key in zip(axes, keys, strict=True):
            curves = [r["curves"][key] for r in mine if r["curves"].get(key)]
            if not curves:
                continue
            x, mean, lowest, highest = _seed_band(curves)
            inside = np.flatnonzero(highest >= low)
            if variant in trained and inside.size:
                entering[ax] = min(entering[ax], x[max(inside[0] - 1, 0)])
            ax.plot(x, mean, "o-", ms=3, color=colors[variant], label=label(variant))
            ax.fill_between(x, lowest, highest, color=colors[variant], alpha=0.2, lw=0)
    for ax, xlabel in zip(axes, xlabels, strict=True):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        if math.isfinite(entering[ax]):
            ax.set_xlim(left=0.8 * entering[ax])
        ax.set_ylim(low, high)
        ax.set_xlabel(xlabel + " (log scale)")
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3, which="both")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, frameon=False, fontsize=9)
    fig.suptitle(
        "Test accuracy at each evaluation: mean over seeds, band from lowest to highest seed"
    )
    fig.tight_layout(rect=(0, 0.06 + 0.03 * math.ceil(len(labels) / 3), 1, 1))
    paths = [outdir / "accuracy.png"]
    fig.savefig(paths[0], dpi=100)
    plt.close(fig)

    adaptive = [v for v in by_variant if v not in ("baseline", "linear_16x")]
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ylabels = {
        "batch_size": "global batch size",
        "similarity": "gradient similarity",
        "gain": "AdaScale gain",
        "learning_rate": "learning rate",
    }
    for variant in adaptive:
        mine = [r for r in by_variant[variant] if r["curves"]["progress"]]
        if not mine:
            continue
        progress = [[p for _, p in r["curves"]["progress"]] for r in mine]
        grid = np.linspace(max(p[0] for p in progress), min(p[-1] for p in progress), 300)
        steps = max(len(p) for p in progress)
        window = max(1, steps // 25)
        for ax, tag in zip(axes.flat, ADAPTATION_TAGS, strict=True):
            curves = [r["curves"][tag] for r in mine]
            if tag == "similarity":  # very noisy per step: a rolling mean per seed first
                curves = [
                    list(
                        zip(
                            [s for s, _ in c], _rolling_mean([v for _, v in c], window), strict=True
                        )
                    )
                    for c in curves
                ]
            values = _on_grid(curves, progress, grid)
            ax.plot(grid, np.nanmean(values, 0), color=colors[variant], label=variant)
            ax.fill_between(
                grid,
                np.nanmin(values, 0),
                np.nanmax(values, 0),
                color=colors[variant],
                alpha=0.2,
                lw=0,
            )
    # The policy's reference lines, as training wrote them (each distinct value once).
    for tag, name, ax, style in (
        ("target_similarity", "SimiGrad target", axes[0, 1], "--"),
        ("min_batch_size", "SimiGrad batch bounds", axes[0, 0], ":"),
        ("max_batch_size", "SimiGrad batch bounds", axes[0, 0], ":"),
    ):
        values = {r.get("references", {}).get(tag) for v in adaptive for r in by_variant[v]}
        for value in sorted(values - {None}):
            ax.axhline(value, color="black", ls=style, lw=1.2, label=name)
    for ax, tag in zip(axes.flat, ADAPTATION_TAGS, strict=True):
        title = ylabels[tag]
        if tag == "similarity":
            title += " (rolling mean over 1/25 of each run's steps)"
        ax.set_title(title)
        ax.set_xlabel("progress tau (base-batch steps)")
        ax.set_ylabel(ylabels[tag])
        ax.grid(alpha=0.3)
    handles, labels = [], []
    for ax in axes.flat:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), frameon=False)
    fig.suptitle("Adaptive runs against progress: mean over seeds, band from lowest to highest")
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    paths.append(outdir / "adaptation.png")
    fig.savefig(paths[1], dpi=100)
    plt.close(fig)
    return paths


def run_benchmark(options: Options) -> None:
    """Runs the plan (every seed, every variant), then writes and prints the results.

    Raises:
      absl.app.UsageError: an unknown variant or clock profile, or a config that is not a
        Python config file.
      RuntimeError: a run that failed or timed out (its log named).
    """
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TensorBoard's reader logs every file at INFO
    unknown = sorted(set(options.variants) - set(VARIANTS))
    if unknown:
        raise app.UsageError(f"--variants must be among {list(VARIANTS)}. Received: {unknown}")
    from tf_adabatch.app import resources

    try:
        config = _load_config(resources.config_path(options.config))
    except ValueError as err:  # a name that is not a shipped config
        raise app.UsageError(str(err)) from err
    for item in options.override:  # the base batch may be overridden too
        key, _, value = item.partition("=")
        if key == "base_batch_size":
            config.base_batch_size = int(value)
    b0 = int(config.base_batch_size)
    outdir = Path(options.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    runs = []
    start = time.time()
    profiles = list(options.clock_profiles)
    devices = [int(n) for n in options.clock_devices]
    if profiles:
        from tf_adabatch.app import factories

        known = factories.measured_profiles()
        if unknown := sorted(set(profiles) - set(known)):
            raise app.UsageError(f"--clock_profiles must be among {known}. Received: {unknown}")
    # Goodput under virtual clocks: one run per profile and N (its batches follow the clock).
    clocks: list[tuple[str, int] | None] = [(p, n) for p in profiles for n in devices] or [None]
    plan = [
        (variant, seed, clock)
        for variant, seed in run_plan(list(options.variants), [int(seed) for seed in options.seeds])
        for clock in (clocks if variant == "goodput" else [None])
    ]
    for i, (variant, seed, clock) in enumerate(plan, 1):
        t0 = time.time()
        run = _run(options, variant, seed, b0, clock)
        runs.append(run)
        m = run["metrics"]
        print(
            f"[{i}/{len(plan)}] {variant}{' ' + run['clock'] if run['clock'] else ''} seed {seed}: accuracy {m['test_accuracy']:.4f}, "
            f"{m['optimizer_steps']} steps, average batch {m['average_batch_size']:.0f} "
            f"({time.time() - t0:.0f} s; {time.time() - start:.0f} s in all)",
            flush=True,
        )
    host = [r for r in runs if not r["clock"]]
    rows, verdicts = summarize(host)
    saved: dict[str, Any] = {"rows": rows, "runs": runs}
    if profiles:
        saved["gpu_time"] = gpu_time(runs, profiles, devices)
        gpu_table = gpu_time_markdown(saved["gpu_time"])
        (outdir / "gpu_time.md").write_text(gpu_table)
        plot_gpu_time(saved["gpu_time"], outdir / "gpu_time.png")
        print(gpu_table)
    if any(r["variant"] in POLICY_VARIANTS[3:] for r in runs) or options.metric != "accuracy":
        policies_md, saved["policies"] = policy_table(
            runs, options.metric, profiles[0] if profiles else None, devices
        )
        (outdir / "policies.md").write_text(policies_md)
        plot_policies(runs, outdir / "policies.png")
        print(policies_md)
    (outdir / "results.json").write_text(json.dumps(saved, indent=1))
    table = markdown(rows, verdicts) + "\n".join(similarity_modes(host)) + "\n"
    (outdir / "results.md").write_text(table)
    paths = plot(host, outdir) if host else []
    print(table)
    print("Plots: " + ", ".join(str(p) for p in paths))
