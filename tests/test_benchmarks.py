"""Smoke runs of the benchmark scripts (tiny sizes), so that they cannot rot.

The full benchmarks are not part of the suite; their results are in docs/benchmarks.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 600


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
    ]
    result = script("benchmark_efficiency.py", *flags)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    results = json.loads((outdir / "results.json").read_text())
    assert [row["variant"] for row in results["rows"]] == [
        "baseline",
        "linear_16x",
        "adascale_16x",
        "simigrad_adascale",
        "simigrad_sqrt",
    ]
    # digits: 1,497 training images, B0 = 16: the budget is ceil(0.5 * 1497 / 16) = 47
    # base steps; the baseline takes exactly that many steps of 16 examples, and the
    # static large-batch runs use batch 4 x 16 = 64 throughout.
    by = {run["variant"]: run for run in results["runs"]}
    base = by["baseline"]["metrics"]
    assert base["optimizer_steps"] == 47 and base["average_batch_size"] == 16
    for variant in ("linear_16x", "adascale_16x"):
        assert by[variant]["metrics"]["average_batch_size"] == 64
    # Linear scaling advances progress by S = 4 per step: ceil(47 / 4) = 12 steps.
    assert by["linear_16x"]["metrics"]["optimizer_steps"] == 12
    for run in results["runs"]:
        curves, metrics = run["curves"], run["metrics"]
        # The examples axis is the running sum of the logged batch sizes; it must end
        # at the examples the run reports.
        assert sum(b for _, b in curves["batch_size"]) == metrics["examples_seen"]
        assert len(curves["batch_size"]) == metrics["optimizer_steps"]
        assert curves["accuracy"][-1][1] == pytest.approx(metrics["test_accuracy"])
    table = (outdir / "results.md").read_text()
    assert "| simigrad_adascale | 1 |" in table
    assert "simigrad_adascale:" in table and "adascale_16x:" in table  # the verdicts
    for png in ("accuracy.png", "adaptation.png"):
        assert (outdir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # A second call reuses the finished runs instead of training again.
    again = script("benchmark_efficiency.py", *flags)
    assert again.returncode == 0 and (outdir / "results.md").read_text() == table


def test_overhead_benchmark_smoke() -> None:
    result = script(
        "benchmark_overhead.py",
        "--replicas=2,4",
        "--models=small",
        "--rounds=2",
        "--steps=2",
        "--warmup=1",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    for variant in ("plain", "estimated", "exact", "fit"):
        assert f"| {variant} |" in result.stdout
    # Two configurations, each in its own process, and the summary of both.
    assert "| 2 | small |" in result.stdout and "| 4 | small |" in result.stdout
