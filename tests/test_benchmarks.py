"""Smoke runs of the benchmark scripts (tiny sizes), so that they cannot rot.

The full benchmarks are not part of the suite; their results are in docs/benchmarks.md.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tf_adabatch.app.benchmarks import efficiency

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


def test_the_benchmark_scripts_docstring_examples_run() -> None:
    # pytest collects doctests from tests/ and tf_adabatch/ only (the benchmarks' logic,
    # tf_adabatch/app/benchmarks/ and simulation/, is collected there): run the scripts' here.
    # launch/ablate_step.py imports launch/benchmark_overhead.py, whose absl flags clash
    # with other launch scripts' (--timeout) that tests in this process may have loaded:
    # its examples run in a process of their own.
    ran = 0
    for name in ("ablate_step.py",):
        done = subprocess.run(
            [sys.executable, "-m", "doctest", "-v", f"launch/{name}"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            cwd=ROOT,
            check=False,
        )
        passed = re.search(r"\b([1-9]\d*) passed and 0 failed", done.stdout)
        assert done.returncode == 0 and passed, done.stdout[-2000:] + done.stderr[-2000:]
        ran += int(passed.group(1))
    assert ran >= 1, ran  # ablate_step's 1 example


def script(name: str, *flags: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(ROOT / "launch" / name), *flags]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)


def test_efficiency_benchmark_smoke(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    outdir = tmp_path / "bench"
    flags = [
        f"--outdir={outdir}",
        f"--config={ROOT / 'configs' / 'digits.py'}",
        "--seeds=0",
        "--base_epochs=0.5",
        "--eval_every_base_epochs=0.25",
        "--scale=4",
        # simigrad_sqrt and simigrad_estimated differ from simigrad_adascale, and
        # adascale_16x from linear_16x, only in config fields (lr.rule, similarity) run
        # by other tests: left out for time.
        "--variants=baseline,linear_16x,simigrad_adascale,goodput",
    ]
    result = script("benchmark_efficiency.py", *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    results = json.loads((outdir / "results.json").read_text())
    # Each run is the installed launcher, not a script of the checkout.
    command = (outdir / "baseline" / "seed0" / "log.txt").read_text().splitlines()[0]
    assert command.split()[1:3] == ["-m", "tf_adabatch.app"], command
    assert [row["variant"] for row in results["rows"]] == [
        "baseline",
        "linear_16x",
        "simigrad_adascale",
        "goodput",
    ]
    # digits: 1,497 training images, B0 = 16: the budget is ceil(0.5 * 1497 / 16) = 47
    # base steps; the baseline takes exactly that many steps of 16 examples, and the
    # static large-batch run uses batch 4 x 16 = 64 throughout.
    by = {run["variant"]: run for run in results["runs"]}
    base = by["baseline"]["metrics"]
    assert base["optimizer_steps"] == 47 and base["average_batch_size"] == 16
    assert by["linear_16x"]["metrics"]["average_batch_size"] == 64
    # Linear scaling advances progress by S = 4 per step: ceil(47 / 4) = 12 steps.
    assert by["linear_16x"]["metrics"]["optimizer_steps"] == 12
    for run in results["runs"]:
        curves, metrics = run["curves"], run["metrics"]
        # The examples axis is the running sum of the logged batch sizes; it must end
        # at the examples the run reports.
        assert sum(b for _, b in curves["batch_size"]) == metrics["examples_seen"]
        assert len(curves["batch_size"]) == metrics["optimizer_steps"]
        assert curves["accuracy"][-1][1] == pytest.approx(metrics["test_accuracy"])
        # Training seconds at each evaluation: positive, increasing, within the run's.
        seconds = [t for t, _ in curves["accuracy_seconds"]]
        assert len(seconds) == len(curves["accuracy"]) >= 2
        assert seconds[0] > 0 and all(a < b for a, b in itertools.pairwise(seconds))
        assert seconds[-1] <= metrics["train_seconds"] <= metrics["wall_time_s"]
    # Time to accuracy: the target is the baseline's final accuracy (one seed), which
    # the baseline reaches at its last evaluation at the latest.
    rows = {row["variant"]: row for row in results["rows"]}
    target = base["test_accuracy"]
    assert all(row["target_accuracy"] == target for row in rows.values())
    first = next(i for i, (_, a) in enumerate(by["baseline"]["curves"]["accuracy"]) if a >= target)
    assert rows["baseline"]["reached"] == 1
    assert (
        rows["baseline"]["seconds_to_target"][0]
        == (by["baseline"]["curves"]["accuracy_seconds"][first][0])
    )
    assert {row["variant"] for row in results["rows"] if row["average_batch_size"][0] > 16} >= {
        "linear_16x",
        "simigrad_adascale",
    }
    table = (outdir / "results.md").read_text()
    assert "| simigrad_adascale | 1 |" in table
    assert "MET: simigrad_adascale: mean test accuracy" in table  # its verdict line
    # Goodput's batches follow measured step times, so whether it reaches the target
    # varies: one verdict line either way.
    verdicts = [
        line
        for line in table.splitlines()
        if line.startswith(("- MET: goodput", "- NOT MET: goodput"))
    ]
    assert len(verdicts) == 1, table
    for png in ("accuracy.png", "adaptation.png"):
        assert (outdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # The adaptation plot's x-axis and reference lines come from the runs: progress ends
    # at the budget (47 base steps, above), and SimiGrad's target (configs/base.py: 0.5)
    # and bounds ([B0, scale B0] = [16, 64]) were written by training.
    for run in results["runs"]:
        assert run["curves"]["progress"][-1][1] >= 47
    bounds = {"min_batch_size": 16, "max_batch_size": 64}
    assert by["simigrad_adascale"]["references"] == {"target_similarity": 0.5, **bounds}
    assert by["goodput"]["references"] == bounds  # bounds, no similarity target
    assert by["baseline"]["references"] == {}  # a static policy has no bounds
    # A second call reuses the finished runs instead of training again.
    again = script("benchmark_efficiency.py", *flags)
    assert again.returncode == 0 and (outdir / "results.md").read_text() == table

    # GPU time: the finished baseline priced on 8 virtual T4 GPUs, one more static batch,
    # and goodput trained under the virtual clock (its own seconds checked against the
    # pricing).
    gpu_flags = [
        *[f for f in flags if not f.startswith("--variants=")],
        "--variants=baseline,static_2x,goodput",
        "--clock_profiles=cifar10_resnet18_t4",
        "--clock_devices=8",
    ]
    priced = script("benchmark_efficiency.py", *gpu_flags)
    assert priced.returncode == 0, priced.stdout[-2000:] + priced.stderr[-3000:]
    gpu = json.loads((outdir / "results.json").read_text())["gpu_time"]
    table8 = gpu["tables"]["cifar10_resnet18_t4x8"]
    assert table8["oracle"] in ("baseline", "static_2x")
    assert gpu["target_accuracy"] == pytest.approx(0.99 * base["test_accuracy"])
    # By hand: every baseline step is a batch of 16 on 8 GPUs (2 examples on each, 2
    # machines of 4), all at the same price; its first evaluation at or above the
    # threshold comes after `step` steps.
    from tf_adabatch.app import factories

    per_step = factories.load_step_time_model("cifar10_resnet18_t4").step_seconds(16, 8)
    threshold = gpu["target_accuracy"]
    step = next(s for s, a in by["baseline"]["curves"]["accuracy"] if a >= threshold)
    assert table8["rows"]["baseline"]["seconds"] == [pytest.approx(step * per_step, rel=1e-9)]
    assert table8["rows"]["baseline"]["vs_baseline"][0] == pytest.approx(1.0)
    assert len(gpu["checks"]) == 1 and gpu["checks"][0] < 1e-6
    assert "**cifar10_resnet18_t4x8**" in (outdir / "gpu_time.md").read_text()
    assert (outdir / "gpu_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The policies of 2024-2026: Seesaw on its step schedule, in the policy table.
    seesaw_flags = [
        *[f for f in flags if not f.startswith("--variants=")],
        "--variants=baseline,seesaw",
    ]
    ran = script("benchmark_efficiency.py", *seesaw_flags)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-3000:]
    saved = json.loads((outdir / "results.json").read_text())
    seesaw = next(r for r in saved["runs"] if r["variant"] == "seesaw")
    # B0 = 16 doubles at each decay point, tau = 0.5 and 0.75 of the 47-step budget
    # (23.5 and 35.25), up to the cap 4 x 16 = 64: the batches, in order, are 16, 32, 64.
    batches = [b for _, b in seesaw["curves"]["batch_size"]]
    assert [b for b, _ in itertools.groupby(batches)] == [16.0, 32.0, 64.0]
    assert len(seesaw["curves"]["noise_scale"]) == len(batches)  # the plot's second panel
    policies = (outdir / "policies.md").read_text()
    assert "| baseline | 1 |" in policies and "| seesaw | 1 |" in policies
    assert sum(line.startswith(("- MET", "- NOT MET")) for line in policies.splitlines()) == 2
    assert (outdir / "policies.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_overhead_benchmark_smoke() -> None:
    """One configuration (the script's single-process path; more configurations only
    repeat it, each in its own subprocess): the table of the five variants and the ratios."""
    result = script(
        "benchmark_overhead.py",
        "--replicas=2",
        "--models=small",
        "--rounds=2",
        "--steps=2",
        "--warmup=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for variant in ("plain", "estimated", "exact", "fit"):
        assert f"| {variant} |" in result.stdout
    ratios = json.loads(next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert set(ratios) >= {"plain", "estimated", "exact", "fit"} and ratios["plain"] == 1.0
    assert all(0.0 < r < 100.0 for r in ratios.values()), ratios


def test_steps_per_execution_benchmark_smoke() -> None:
    """At N = 2 (one mode, to keep it short) the engine's variants and the plain loop run,
    and each row has its ratio to the plain loop at the same N (the denominator where
    stock Keras cannot run several steps per call) besides the one to stock Keras."""
    result = script(
        "benchmark_steps_per_execution.py",
        "--replicas=2",
        "--models=small",
        "--rounds=1",
        "--steps=2",
        "--per_call=2",
        "--modes=estimated",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]
    variants = ["plain_2", "attach_estimated_2", "trainer_estimated_2"]
    for variant in variants:
        row = next(line for line in rows if line.startswith(f"| {variant} |"))
        assert row.count("|") == 6 and not row.rstrip().endswith("| - |"), row
    assert len(rows) >= len(variants)


def _run(variant: str, final: float, accuracy: list[tuple[float, float]]) -> dict:
    return {
        "variant": variant,
        "metrics": {"test_accuracy": final},
        "curves": {"accuracy": accuracy},
    }


def test_efficiency_options_are_the_scripts_flags() -> None:
    # launch/benchmark_efficiency.py builds the options from its flags, one field each.
    from absl import flags

    values = flags.FlagValues()
    for field in dataclasses.fields(efficiency.Options):
        default = getattr(efficiency.Options(), field.name)
        define = {tuple: flags.DEFINE_list, float: flags.DEFINE_float, int: flags.DEFINE_integer}
        value = list(default) if isinstance(default, tuple) else default
        define.get(type(default), flags.DEFINE_string)(field.name, value, "", flag_values=values)
    values(["prog", "--seeds=3,4", "--override=num_cpu_replicas=2"])
    options = efficiency.Options.from_flags(values)
    assert options.seeds == ("3", "4") and options.override == ("num_cpu_replicas=2",)
    assert efficiency._flags_for(options, "baseline", 3, 16)[-1] == ("--config.num_cpu_replicas=2")
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.seeds = ("0",)  # type: ignore[misc]


def test_accuracy_plot_zooms_to_where_the_variants_differ() -> None:
    runs = [
        _run("a", 0.88, [(10, 0.5), (100, 0.88)]),
        _run("a", 0.90, [(10, 0.6), (100, 0.90)]),
        _run("b", 0.86, [(5, 0.7), (50, 0.91), (80, 0.86)]),
        _run("diverged", 0.10, [(3, 0.1), (9, 0.1)]),
    ]
    low, high, trained = efficiency.accuracy_window(runs)
    # Best mean 0.89 (a); "diverged" (0.10) is more than 10 points below and left out.
    # Lowest final of a and b: 0.86; highest evaluation: 0.91; spread 0.05, pad 0.0125.
    assert trained == ["a", "b"]
    assert low == pytest.approx(0.86 - 0.0125) and high == pytest.approx(0.91 + 0.0025)


def test_seed_band_pairs_each_seeds_evaluations() -> None:
    x, mean, low, high = efficiency._seed_band(
        [[(10, 0.5), (20, 0.7), (30, 0.8)], [(12, 0.6), (18, 0.9)]]
    )
    # Up to the shorter seed: evaluations (10, 12) and (20, 18).
    np.testing.assert_allclose(x, [11, 19])
    np.testing.assert_allclose(mean, [0.55, 0.8])
    np.testing.assert_allclose(low, [0.5, 0.7])
    np.testing.assert_allclose(high, [0.6, 0.9])


def test_rolling_mean_is_centered_and_skips_nan() -> None:
    smoothed = efficiency._rolling_mean([1.0, 2.0, float("nan"), 4.0, 5.0], 3)
    # Windows: [1, 2], [1, 2, -], [2, -, 4], [-, 4, 5], [4, 5] (edges use what they have).
    np.testing.assert_allclose(smoothed, [1.5, 1.5, 3.0, 4.5, 4.5])


def test_run_plan_rotates_the_variants_per_seed() -> None:
    plan = efficiency.run_plan(["a", "b", "c"], [0, 1, 2])
    assert plan[:3] == [("a", 0), ("b", 0), ("c", 0)]
    assert plan[3:6] == [("b", 1), ("c", 1), ("a", 1)]
    assert plan[6:] == [("c", 2), ("a", 2), ("b", 2)]


def test_time_to_accuracy_is_the_first_evaluation_at_the_target() -> None:
    run = {
        "curves": {
            "accuracy": [(10, 0.5), (20, 0.8), (30, 0.79), (40, 0.9)],
            "accuracy_seconds": [(4.0, 0.5), (9.0, 0.8), (13.0, 0.79), (20.0, 0.9)],
            "accuracy_examples": [(320, 0.5), (960, 0.8), (1600, 0.79), (2200, 0.9)],
        }
    }
    assert efficiency.time_to_accuracy(run, 0.8) == {
        "seconds": 9.0,
        "steps": 20.0,
        "examples": 960.0,
    }
    assert efficiency.time_to_accuracy(run, 0.85)["seconds"] == 20.0
    assert efficiency.time_to_accuracy(run, 0.95) is None


def test_batch_by_tenth_and_the_similarity_modes_table() -> None:
    # Budget 10 base steps; progress before each step: 0, 1, 2, 5 -> tenths 0, 1, 2, 5.
    run = {
        "variant": "simigrad_adascale",
        "curves": {
            "batch_size": [(1, 10.0), (2, 20.0), (3, 30.0), (4, 50.0)],
            "progress": [(1, 1.0), (2, 2.0), (3, 5.0), (4, 10.0)],
        },
        "metrics": {"base_steps": 10, "optimizer_steps": 4},
    }
    tenths = efficiency.batch_by_tenth(run)
    assert tenths[:3] == [10.0, 20.0, 30.0] and tenths[5] == 50.0
    assert sum(np.isnan(tenths)) == 6
    # The same run as "estimated" but every batch 5% larger: within 10%, MET; 20%: NOT.
    for factor, verdict in ((1.05, "- MET"), (1.2, "- NOT MET")):
        other = {
            **run,
            "variant": "simigrad_estimated",
            "curves": {
                **run["curves"],
                "batch_size": [(s, b * factor) for s, b in run["curves"]["batch_size"]],
            },
        }
        lines = efficiency.similarity_modes([run, other])
        assert lines[-1].startswith(verdict), lines[-1]
        assert "(5 compared," in lines[-1]  # steps and the four tenths with steps


def test_similarity_modes_reports_the_seed_to_seed_spread_of_each_mode() -> None:
    """The 10% criterion's noise floor: the same comparison between two seeds of a mode."""

    def run(variant: str, factor: float, steps: int) -> dict:
        # Budget 10 base steps; one step in each of tenths 0, 1, 2 and 5 (as above).
        return {
            "variant": variant,
            "curves": {
                "batch_size": [
                    (s, b * factor) for s, b in ((1, 10.0), (2, 20.0), (3, 30.0), (4, 50.0))
                ],
                "progress": [(1, 1.0), (2, 2.0), (3, 5.0), (4, 10.0)],
            },
            "metrics": {"base_steps": 10, "optimizer_steps": steps},
        }

    runs = [
        run("simigrad_adascale", 1.0, 4),
        run("simigrad_adascale", 1.3, 4),  # every batch 30% larger, same steps
        run("simigrad_estimated", 1.0, 4),
    ]
    lines = efficiency.similarity_modes(runs)
    floor = [line for line in lines if line.startswith("- same mode")]
    # Only exact has two seeds: its four tenths deviate by |1.3 - 1| = 30%, steps by 0.
    assert floor == [
        "- same mode, seed against seed (the criterion's noise floor): exact: steps 1.000, "
        "largest deviation 30.0% (2 seeds, 5 compared)"
    ]


def test_similarity_modes_says_which_ratios_the_seeds_decide() -> None:
    """With several seeds per mode, a bootstrap interval of each ratio: a tenth whose
    seeds agree is decided (inside or outside 0.9-1.1), a tenth whose seeds scatter is
    not."""

    def run(variant: str, first: float, second: float, steps: int) -> dict:
        # Budget 10 base steps; one step in tenth 0 (batch `first`), one in tenth 5.
        return {
            "variant": variant,
            "curves": {"batch_size": [(1, first), (2, second)], "progress": [(1, 5.0), (2, 10.0)]},
            "metrics": {"base_steps": 10, "optimizer_steps": steps},
        }

    # Tenth 1: both modes 100 +- 1 (ratio ~1.00, decided inside); tenth 6: exact 100 +- 1,
    # estimated 150 +- 1 (ratio ~1.5, decided outside); steps: exact 100 +- 1, estimated
    # 60 or 140 (ratio 1.0 on average, the interval wide: undecided).
    runs = [run("simigrad_adascale", 100.0 + d, 100.0 - d, 100 + round(d)) for d in (-1, 0, 1)]
    runs += [
        run("simigrad_estimated", 100.0 + d, 150.0 + d, steps)
        for d, steps in ((-1, 60), (0, 140), (1, 100))
    ]
    lines = efficiency.similarity_modes(runs)
    row = next(line for line in lines if line.startswith("| 95% interval"))
    cells = [c.strip() for c in row.strip("|").split("|")][1:]
    low, high = (float(v) for v in cells[1].split("-"))  # tenth 1
    assert 0.97 < low <= 1.0 <= high < 1.03
    low, high = (float(v) for v in cells[6].split("-"))  # tenth 6
    assert low > 1.45 and high < 1.55
    low, high = (float(v) for v in cells[0].split("-"))  # steps
    assert low < 0.9 and high > 1.1
    assert cells[2] == "-"  # tenth 3: no steps in either mode
    verdict = next(line for line in lines if line.startswith("- by the intervals"))
    assert verdict.startswith(
        "- by the intervals: 1 of 3 ratios surely within 10% (the interval inside 0.90-1.10), "
        "1 surely outside"
    ), verdict


def test_ablation_benchmark_removes_what_it_names() -> None:
    """launch/ablate_step.py reaches into the engine (`_last_fn`, `_gradients_fn`, the
    roll-back's methods): each ablation must still remove its part. The op counts of the
    traced steps prove it: `k1_branches` drops the last micro-step's two conds per replica
    (2 replicas: 4 `If` ops fewer), `rollback` drops ops but no branch (the small model
    has no per-device variables, so the engine has no roll-back branch)."""
    result = script(
        "ablate_step.py",
        "--replicas=2",
        "--models=small",
        "--rounds=2",
        "--steps=2",
        "--warmup=1",
        "--ablations=k1_branches,rollback",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    rows = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0] in ("plain", "engine", "k1_branches", "rollback"):
            rows[cells[0]] = (float(cells[2]), int(cells[5]), int(cells[6]))
    assert set(rows) == {"plain", "engine", "k1_branches", "rollback"}, result.stdout
    assert rows["plain"][0] == 1.0
    (_, ops, branches), (_, k1_ops, k1_branches) = rows["engine"], rows["k1_branches"]
    assert branches - k1_branches == 4 and k1_ops < ops
    (_, rb_ops, rb_branches) = rows["rollback"]
    assert rb_branches == branches and rb_ops < ops


def test_paired_similarity_readings_agree_on_two_replicas(tmp_path: Path) -> None:
    """launch/similarity_paired.py on 2 replicas: estimated mode's reading is then exact
    mode's cosine of its two groups (one replica each; docs/algorithms.md), so the paired
    readings must agree draw for draw, and the controller settles at the same batch on
    both. Proves the script feeds both formulas the same gradients, groups them as the
    engine does, and that its snapshot run trained. (The target 0.25 puts the digits
    model's readings at step 3 on both sides of it, so a settling point exists.)"""
    outdir = tmp_path / "paired"
    result = script(
        "similarity_paired.py",
        f"--outdir={outdir}",
        f"--config={ROOT / 'configs' / 'digits.py'}",
        "--config.policy.target_similarity=0.25",
        "--snapshot_steps=3",
        "--iterates=2",  # steps 2 and 3, three draws each
        "--ks=1,2,3,4",
        "--draws=6",
        "--bootstrap=20",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((outdir / "results.json").read_text())
    rows = results["rows"]
    assert [(r["step"], r["k"], r["batch"]) for r in rows] == [(3, k, 16 * k) for k in (1, 2, 3, 4)]
    checked = 0
    for r in rows:
        assert len(r["exact"]) == len(r["estimated"]) == 6
        np.testing.assert_allclose(r["estimated"], r["exact"], rtol=1e-9, atol=1e-12)
        assert all(-1.0 <= c <= 1.0 for c in r["exact"])
        checked += len(r["exact"])
    assert checked == 24
    assert len(set(rows[0]["exact"])) == 6  # six different draws, not one repeated
    (settled,) = results["settled"]
    assert settled["step"] == 3 and 16 <= settled["exact"] <= 64
    assert settled["ratio"] == 1.0 and settled["interval"] == [1.0, 1.0]
    (followed,) = results["followed"]  # one interval: steps 1-3, from the initial 16
    assert followed["steps"] == [1, 3] and followed["exact"] == followed["estimated"]
    assert 16 <= followed["exact"] <= 64
    # The report rebuilt from results.json alone is the same report.
    report = (outdir / "results.md").read_text()
    (outdir / "results.md").unlink()
    again = script(
        "similarity_paired.py",
        f"--outdir={outdir}",
        f"--config={ROOT / 'configs' / 'digits.py'}",
        "--config.policy.target_similarity=0.25",
        "--report_only",
        "--bootstrap=20",
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert (outdir / "results.md").read_text() == report
    assert (outdir / "snapshots" / "step2" / "checkpoint").exists()
    assert (outdir / "snapshots" / "step3" / "checkpoint").exists()
    assert "| 3 | 4 | 64 | 6 |" in (outdir / "results.md").read_text()


def _lm_run(variant: str, seed: int, bits: list[tuple[int, float]], batch: int) -> dict:
    """A run with a constant batch: examples and host seconds (0.5 s a step) at each
    evaluation follow from the batch; its final value is its last evaluation's."""
    return {
        "variant": variant,
        "seed": seed,
        "clock": "",
        "metrics": {"test_bits_per_byte": bits[-1][1]},
        "curves": {
            "bits_per_byte": bits,
            "accuracy": [(s, 0.0) for s, _ in bits],
            "accuracy_examples": [(s * batch, 0.0) for s, _ in bits],
            "accuracy_seconds": [(0.5 * s, 0.0) for s, _ in bits],
            "batch_size": [(s, float(batch)) for s in range(1, bits[-1][0] + 1)],
        },
    }


def test_policy_table_on_a_lower_is_better_metric_by_hand() -> None:
    runs = [
        # Thresholds, seed by seed: the baseline's final, 2.10 (seed 0) and 2.30 (seed 1);
        # each baseline reaches its own at its last evaluation: steps 30 and 30.
        _lm_run("baseline", 0, [(10, 3.0), (20, 2.4), (30, 2.10)], 32),
        _lm_run("baseline", 1, [(10, 3.1), (20, 2.5), (30, 2.30)], 32),
        # critical_warmup: seed 0 reaches 2.10 at step 10 (640 examples, 5 s); seed 1
        # reaches 2.30 at step 20 (1,280 examples, 10 s): means 15, 960, 7.5.
        _lm_run("critical_warmup", 0, [(10, 2.05), (20, 2.0)], 64),
        _lm_run("critical_warmup", 1, [(10, 2.4), (20, 2.25)], 64),
        # seesaw: seed 0 ends at 2.5 > 2.10, never there.
        _lm_run("seesaw", 0, [(10, 2.9), (20, 2.5)], 32),
        _lm_run("seesaw", 1, [(10, 2.9), (20, 2.2)], 32),
        # a seed without a baseline run compares with nothing: left out.
        _lm_run("seesaw", 7, [(10, 2.0)], 32),
    ]
    from absl import app

    with pytest.raises(app.UsageError, match=r"--metric=accuracy: the runs of \['baseline'"):
        efficiency.policy_table(runs[:2], "accuracy", None, [8])  # they have no test_accuracy
    text, result = efficiency.policy_table(runs, "bits_per_byte", None, [8])
    assert result["target"] == pytest.approx(2.20)  # the mean threshold, for the text
    rows = result["rows"]
    assert rows["baseline"]["steps"] == 30 and rows["baseline"]["examples"] == 960
    warm = rows["critical_warmup"]
    assert (warm["steps"], warm["examples"], warm["seconds"]) == (15, 960, 7.5)
    assert rows["seesaw"]["seeds"] == 2 and rows["seesaw"]["reached"] == 1
    assert "steps" not in rows["seesaw"]
    # 15 / 30 = 0.5 of the steps, 960 / 960 = 1.0 of the examples: within the target;
    # host seconds 7.5 / 15 (baseline: 0.5 s x 30 steps).
    assert result["verdicts"][0] == (
        "MET: a policy reaches the baseline's final bits_per_byte in <= 0.5x its steps "
        "with <= 1.5x its examples: critical_warmup"
    )
    assert (
        "| critical_warmup | 2 | 2.1250 ± 0.1768 | 15 (0.50×) | 960 (1.00×) | 8 (0.50×) |" in text
    )
    # Final values against the baselines' mean 2.20 (lower is better): critical_warmup
    # 2.125 is better (-3.41 %: fine); seesaw (2.5 + 2.2) / 2 = 2.35 is worse by 6.82 %.
    assert result["verdicts"][1] == (
        "NOT MET: no mean final bits_per_byte worse than the baseline's by more than 1 %: "
        "seesaw (+6.82 %)"
    )

    # Priced GPU seconds: every step of critical_warmup is a batch of 64; 10 and 20 steps
    # to the thresholds of seeds 0 and 1: a mean of 15 steps.
    from tf_adabatch.app import factories

    model = factories.load_step_time_model("cifar10_resnet18_t4")
    _, priced = efficiency.policy_table(runs, "bits_per_byte", "cifar10_resnet18_t4", [8])
    assert priced["rows"]["critical_warmup"]["gpu8"] == pytest.approx(
        15 * model.step_seconds(64, 8), rel=1e-12
    )
    # A goodput run under a virtual clock: its own row; its recorded seconds are the
    # clock's, so the host-seconds column stays empty, and it is priced only at its N.
    clocked = _lm_run("goodput", 0, [(10, 2.05)], 64)
    clocked["clock"] = "cifar10_resnet18_t4x8"
    _, priced = efficiency.policy_table(
        [*runs, clocked], "bits_per_byte", "cifar10_resnet18_t4", [1, 8]
    )
    row = priced["rows"]["goodput (cifar10_resnet18_t4x8)"]
    assert "seconds" not in row and "gpu1" not in row
    assert row["gpu8"] == pytest.approx(10 * model.step_seconds(64, 8), rel=1e-12)
