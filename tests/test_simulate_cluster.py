"""tf_adabatch.app.simulation.cluster (launch/simulate_cluster.py): the cluster projection
against closed forms.

The expected values are derived here from the formulas of the issue (ring all-reduce,
T(N, B), AdaScale's gain r = (v + g) / (v / S + g) with v = tr(Sigma)/B0 and
g = |G|^2), written in plain numpy: never from a run of the simulator. The synthetic
TensorBoard logs are written with the real writer (`summaries.write_step`) and dyadic
values, which float32 summaries store exactly.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf
from ml_collections import config_dict

from tf_adabatch import summaries
from tf_adabatch.app import resources
from tf_adabatch.app.simulation import cluster as sc

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "launch" / "simulate_cluster.py"
B0 = 16
PARAMS = {"dense/kernel": [10, 3], "dense/bias": [3]}  # 33 parameters, 132 bytes


def closed_gain(g: float, v: float, batch: float, b0: float = B0) -> float:
    """AdaScale's gain with sigma^2 = v = tr(Sigma)/B0 and mu^2 = g, S = B / B0."""
    return (v + g) / (v / (batch / b0) + g)


def closed_step_time(p: dict, n: int, batch: float, nbytes: float) -> float:
    """T(N, B) = fixed + spe * B / min(N, P) + 2 (N-1)/N bytes / bw + 2 (N-1) latency."""
    parallel = n if p["parallel_devices"] is None else min(n, p["parallel_devices"])
    ring = 0.0
    if n > 1:
        ring = 2 * (n - 1) / n * nbytes / p["bandwidth_bytes_per_second"]
        ring += 2 * (n - 1) * p["latency_seconds"]
    return p["fixed_seconds"] + p["seconds_per_example"] * batch / parallel + ring


def profile(**overrides) -> config_dict.ConfigDict:
    values = dict(
        name="toy",
        seconds_per_example=2**-10,
        fixed_seconds=2**-5,
        bandwidth_bytes_per_second=2.0**20,
        latency_seconds=2**-12,
        min_examples_per_device=1,
        parallel_devices=None,
        max_devices=8,
    )
    values.update(overrides)
    return config_dict.ConfigDict(values)


def write_run(workdir: Path, batches, grad_sqr, grad_var, *, fingerprint=PARAMS) -> np.ndarray:
    """Logs one step per entry with a gain and progress consistent with the moments;
    returns the progress after each step (float64)."""
    gains = np.array(
        [closed_gain(g, v, b) for g, v, b in zip(grad_sqr, grad_var, batches, strict=True)]
    )
    progress = np.cumsum(gains)
    writer = tf.summary.create_file_writer(str(workdir / "tensorboard" / summaries.TRAIN_RUN))
    for t, (b, g, v, r, tau) in enumerate(
        zip(batches, grad_sqr, grad_var, gains, progress, strict=True)
    ):
        logs = {"batch_size": b, "gain": r, "grad_sqr": g, "grad_var": v, "progress": tau}
        summaries.write_step(writer, t + 1, {**logs, "loss": 1.0})
    writer.close()
    (workdir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (workdir / "checkpoints" / "fingerprint.json").write_text(
        json.dumps({"variables": fingerprint})
    )
    return progress


def test_ring_allreduce_and_step_time_closed_forms() -> None:
    p = profile(parallel_devices=2)
    nbytes = 2.0**16
    bw, lat = p.bandwidth_bytes_per_second, p.latency_seconds
    # Ring: 2 (N-1)/N bytes / bw + 2 (N-1) latency, worked out by hand for N = 1, 2, 4.
    assert sc.allreduce_seconds(p, 1, nbytes) == 0.0
    assert sc.allreduce_seconds(p, 2, nbytes) == pytest.approx(nbytes / bw + 2 * lat, rel=1e-12)
    assert sc.allreduce_seconds(p, 4, nbytes) == pytest.approx(
        1.5 * nbytes / bw + 6 * lat, rel=1e-12
    )
    checked = 0
    for n in (1, 2, 4, 8, 64):
        for batch in (16, 64, 256):
            expected = closed_step_time(dict(p), n, batch, nbytes)
            assert float(sc.step_seconds(p, n, batch, nbytes)) == pytest.approx(expected, rel=1e-12)
            checked += 1
    assert checked == 15
    # Two logical devices on two cores compute twice as fast as one; four no faster than two.
    free = profile(parallel_devices=2, latency_seconds=0.0)  # compute only, beyond the fixed cost
    compute = [float(sc.step_seconds(free, n, 256, 0.0)) - free.fixed_seconds for n in (1, 2, 4)]
    assert compute[0] == pytest.approx(2 * compute[1]) and compute[1] == pytest.approx(compute[2])


def test_static_b0_time_is_steps_times_step_time(tmp_path: Path) -> None:
    steps = 40
    progress = write_run(tmp_path, [B0] * steps, [0.5] * steps, [2.0] * steps)
    run = sc.read_run(str(tmp_path))
    assert run.base_batch_size == B0  # inferred from the logged gains
    assert run.num_parameters == 33 and run.final_tau == pytest.approx(progress[-1])
    p = profile(min_examples_per_device=2)
    checked = 0
    for n in (1, 2, 4, 8):
        result = sc.simulate(run, p, n)["static_b0"]
        # gain 1 at B0: tau += 1, so ceil(final tau) steps.
        assert result.steps == math.ceil(progress[-1]) == steps
        expected = steps * closed_step_time(dict(p), n, B0, 33 * 4)
        assert result.seconds == pytest.approx(expected, rel=1e-12)
        checked += 1
    assert checked == 4
    # N = 16 would need 16 x 2 = 32 > B0 examples: infeasible, not clamped.
    result = sc.simulate(run, p, 16)["static_b0"]
    assert result.seconds is None and result.steps is None and "B0 = 16 < " in result.reason


def test_adascale_tau_per_step_is_the_gain_at_the_current_moments(tmp_path: Path) -> None:
    # Three segments of moments along tau: low, middle and high noise.
    g = [1.0] * 10 + [0.25] * 10 + [0.0625] * 10
    v = [0.5] * 10 + [4.0] * 10 + [16.0] * 10
    logged = write_run(tmp_path, [B0] * 30, g, v)
    run = sc.read_run(str(tmp_path), base_batch_size=B0)
    tau_before_logged = np.concatenate([[0.0], logged[:-1]])
    result = sc.simulate(run, profile(), 1)["adascale_16x"]
    tau, checked = 0.0, 0
    for batch, after in zip(result.batches, result.taus, strict=True):
        # The logged step whose progress-before is the last <= tau holds the moments.
        i = max(j for j, t in enumerate(tau_before_logged) if t <= tau * (1 + 1e-9))
        assert batch == 16 * B0
        assert after - tau == pytest.approx(closed_gain(g[i], v[i], 16 * B0), rel=1e-9)
        tau = after
        checked += 1
    assert checked == result.steps >= 3
    assert result.taus[-1] >= logged[-1] * (1 - 1e-6) > result.taus[-2]
    expected = result.steps * closed_step_time(dict(profile()), 1, 16 * B0, 33 * 4)
    assert result.seconds == pytest.approx(expected, rel=1e-12)


def test_replay_uses_the_recorded_batches(tmp_path: Path) -> None:
    batches = [16, 32, 48, 64, 32, 96, 128, 256, 16, 64] * 2
    g = [0.5] * 20
    v = [8.0] * 20
    logged = write_run(tmp_path, batches, g, v)
    run = sc.read_run(str(tmp_path), base_batch_size=B0)
    # One device: exactly the run's trajectory.
    result = sc.simulate(run, profile(), 1)["simigrad_replay"]
    assert result.batches == batches and result.raised_steps == 0
    np.testing.assert_allclose(result.taus, logged, rtol=1e-6)
    expected = sum(closed_step_time(dict(profile()), 1, b, 33 * 4) for b in batches)
    assert result.seconds == pytest.approx(expected, rel=1e-12)
    # 32 devices x 2 examples: recorded batches under 64 run at 64, and are counted.
    p = profile(min_examples_per_device=2)
    result = sc.simulate(run, p, 32)["simigrad_replay"]
    tau_before = np.concatenate([[0.0], logged[:-1]])
    tau, raised, checked = 0.0, 0, 0
    for batch, after in zip(result.batches, result.taus, strict=True):
        i = max(j for j, t in enumerate(tau_before) if t <= tau * (1 + 1e-9))
        assert batch == max(batches[i], 64)
        assert after - tau == pytest.approx(closed_gain(g[i], v[i], batch), rel=1e-9)
        raised += batches[i] < 64
        tau = after
        checked += 1
    assert checked == result.steps and raised == result.raised_steps > 0
    # Beyond 16 B0 = 256 examples (N = 256 x 2): infeasible, reported.
    result = sc.simulate(run, p, 256)["simigrad_replay"]
    assert result.seconds is None and "16 B0 = 256" in result.reason


def test_goodput_picks_the_argmax_of_gain_over_step_time(tmp_path: Path) -> None:
    g = [1.0] * 8 + [0.25] * 8 + [2.0**-6] * 8
    v = [0.25] * 8 + [4.0] * 8 + [16.0] * 8
    logged = write_run(tmp_path, [B0] * 24, g, v)
    run = sc.read_run(str(tmp_path), base_batch_size=B0)
    tau_before = np.concatenate([[0.0], logged[:-1]])
    p = profile(min_examples_per_device=2, fixed_seconds=2**-4, latency_seconds=2**-8)
    checked, distinct = 0, set()
    for n in (1, 2, 4, 8, 16, 64):
        result = sc.simulate(run, p, n)["goodput"]
        tau = 0.0
        for batch, after in zip(result.batches, result.taus, strict=True):
            i = max(j for j, t in enumerate(tau_before) if t <= tau * (1 + 1e-9))
            # Brute force over every batch in [B0, 16 B0] that N devices can split.
            reachable = [
                b
                for b in range(B0, 16 * B0 + 1)
                if b % n == 0 and b // n >= p.min_examples_per_device
            ]
            rates = [
                closed_gain(g[i], v[i], b) / closed_step_time(dict(p), n, b, 33 * 4)
                for b in reachable
            ]
            assert batch == reachable[int(np.argmax(rates))]
            assert after - tau == pytest.approx(closed_gain(g[i], v[i], batch), rel=1e-9)
            distinct.add(batch)
            tau = after
            checked += 1
    assert checked > 20
    assert len(distinct) >= 3  # the choice moves with the noise and with N
    # 256 devices x 2 examples > 16 B0: nothing reachable.
    result = sc.simulate(run, p, 256)["goodput"]
    assert result.seconds is None and "no multiple of N = 256" in result.reason


def test_logged_gain_of_a_real_run_is_adascale_gain_of_its_logged_moments(tmp_path: Path) -> None:
    from configs import synthetic
    from tf_adabatch import app, stats

    config = synthetic.get_config()
    config.strategy, config.similarity, config.train.max_steps = "one_device", "estimated", 12
    app.run(config, str(tmp_path), verbose=0)
    scalars = summaries.read_scalars(str(tmp_path / "tensorboard" / summaries.TRAIN_RUN))
    col = {
        n: np.array([v for _, v in scalars[f"adabatch/{n}"]])
        for n in ("gain", "grad_sqr", "grad_var", "batch_size")
    }
    b0 = config.base_batch_size
    # grad_var is tr(Sigma) / B0: the gain formula with trace_sigma = grad_var * B0.
    recomputed = stats.adascale_gain(col["grad_sqr"], col["grad_var"] * b0, col["batch_size"], b0)
    np.testing.assert_allclose(np.asarray(recomputed), col["gain"], rtol=1e-5)
    assert len(col["gain"]) == 12 and np.max(col["gain"]) > 1.05  # not all trivially 1
    run = sc.read_run(str(tmp_path))
    assert run.base_batch_size == b0  # inferred
    # The model's parameters: the synthetic MLP, 8x8 inputs, 64 hidden, 10 classes.
    assert run.num_parameters == 64 * 64 + 64 + 64 * 10 + 10
    result = sc.simulate(run, profile(), 1)["simigrad_replay"]
    assert result.batches == [int(b) for b in col["batch_size"]]
    progress = [v for _, v in scalars["adabatch/progress"]]
    np.testing.assert_allclose(result.taus, progress, rtol=1e-5)


BAD_FIELDS = [
    ("seconds_per_example", 0.0, "a number > 0"),
    ("fixed_seconds", -1.0, "a number >= 0"),
    ("bandwidth_bytes_per_second", "fast", "a number > 0"),
    ("latency_seconds", float("nan"), "a number >= 0"),
    ("min_examples_per_device", 0, "an integer >= 1"),
    ("min_examples_per_device", 1.5, "an integer >= 1"),
    ("parallel_devices", 0, "None (every device) or an integer >= 1"),
    ("max_devices", True, "an integer >= 1"),
    ("name", "", "a non-empty string"),
]


def test_bad_profile_fields_are_named_with_rule_and_value() -> None:
    checked = 0
    for name, value, rule in BAD_FIELDS:
        p = profile()
        with p.ignore_type():
            p[name] = value
        with pytest.raises(sc.SimulationError) as err:
            sc.check_profile(p, "x.py")
        assert str(err.value) == (
            f"Profile x.py: field `{name}` must be {rule}. Received: {name}={value!r}"
        )
        checked += 1
    assert checked == len(BAD_FIELDS)
    p = profile()
    del p["latency_seconds"]
    with pytest.raises(sc.SimulationError, match="field `latency_seconds` is missing"):
        sc.check_profile(p)
    with pytest.raises(sc.SimulationError, match=r"Received: --max_devices=0"):
        sc.device_counts(0)


def test_shipped_profiles_load_and_state_their_assumptions() -> None:
    paths = sorted((ROOT / "configs" / "profiles").glob("*.py"))
    # The measured GPU profiles (the virtual clock's, tests/test_clock.py) are another kind.
    measured = [p.name for p in paths if 'config.kind = "measured"' in p.read_text()]
    assert len(measured) == 6
    names = [p.name for p in paths if p.name != "__init__.py" and p.name not in measured]
    assert names == ["assumed_ethernet_64gpu.py", "assumed_nvlink_8gpu.py", "this_machine.py"]
    for name in names:
        loaded = sc.load_profile(str(ROOT / "configs" / "profiles" / name))
        assert loaded.name == name[:-3]
    for name in ("assumed_ethernet_64gpu.py", "assumed_nvlink_8gpu.py"):
        doc = (ROOT / "configs" / "profiles" / name).read_text()
        assert "ASSUMED" in doc and "not" in doc and "measured" in doc


def test_this_machine_profile_is_the_fit_of_the_saved_measurement() -> None:
    saved = json.loads((ROOT / "docs/benchmarks/cluster_measure.json").read_text())
    report, _ = sc.validate_model(saved, cores=2, bandwidth=saved["bandwidth"])
    assert len(report["rows"]) == 12  # 1, 2, 4 replicas x 4 values of k
    mine = sc.load_profile(str(ROOT / "configs/profiles/this_machine.py"))
    assert mine.parallel_devices == report["parallel_devices"]
    assert mine.bandwidth_bytes_per_second == saved["bandwidth"]
    checked = 0
    for name, value in report["fit"].items():
        assert mine[name] == pytest.approx(value, rel=5e-3, abs=1e-9), name
        checked += 1
    assert checked == 3


def test_fingerprint_formats_give_the_parameter_count(tmp_path: Path) -> None:
    write_run(tmp_path, [B0] * 3, [0.5] * 3, [2.0] * 3, fingerprint=["kernel(10, 3)", "bias(3,)"])
    assert sc.read_run(str(tmp_path)).num_parameters == 33


def run_script(*args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
        cwd=ROOT,
    )


def own_lines(stderr: str) -> list[str]:
    """The script's own lines on stderr: TensorFlow's C++ log lines (`E0000 ...`, such as
    its failed cuInit on a machine without a GPU driver; the package imports TensorFlow
    before the flags are checked) are left out, as in tests/test_launch.py."""
    return [line for line in stderr.strip().splitlines() if not re.match(r"^[IWEF]\d{4} ", line)]


def test_cli_refuses_bad_flags_and_profiles_with_one_line(tmp_path: Path) -> None:
    done = run_script(f"--run={tmp_path}", "--max_devices=0")
    assert done.returncode == 2
    assert own_lines(done.stderr) == [
        "error: Flag `--max_devices` must be an integer >= 1. Received: --max_devices=0"
    ]
    bad = tmp_path / "bad.py"
    bad.write_text(
        (ROOT / "configs/profiles/assumed_nvlink_8gpu.py").read_text().replace("= 100e9", "= -1.0")
    )
    done = run_script(f"--run={tmp_path}", f"--profile={bad}")
    assert done.returncode == 2
    assert own_lines(done.stderr) == [
        f"error: Profile {bad}: field `bandwidth_bytes_per_second` must be a number > 0. "
        "Received: bandwidth_bytes_per_second=-1.0"
    ]


def test_cli_writes_table_json_and_plot(tmp_path: Path) -> None:
    write_run(tmp_path, [16, 32, 64, 128] * 3, [0.5] * 12, [8.0] * 12)
    out = tmp_path / "projection"
    done = run_script(
        f"--run={tmp_path}",
        "--profile=configs/profiles/assumed_nvlink_8gpu.py",
        "--max_devices=4",
        f"--out={out}",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "| 4 | " in done.stdout and (out.with_suffix(".png")).stat().st_size > 1000
    saved = json.loads(out.with_suffix(".json").read_text())
    run = sc.read_run(str(tmp_path))
    expected = sc.simulate(
        run, sc.load_profile(str(ROOT / "configs/profiles/assumed_nvlink_8gpu.py")), 4
    )
    row = saved["profiles"]["assumed_nvlink_8gpu"]["rows"][2]
    assert row["devices"] == 4
    checked = 0
    for strategy in sc.STRATEGIES:
        assert row[strategy]["seconds"] == pytest.approx(expected[strategy].seconds, rel=1e-12)
        checked += 1
    assert checked == 4


def test_profiles_by_name_or_checkout_path_resolve_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no configs/ here: names and checkout paths go to the package
    shipped = os.path.join(resources.profiles_dir(), "assumed_nvlink_8gpu.py")
    for given in ("assumed_nvlink_8gpu", "configs/profiles/assumed_nvlink_8gpu.py"):
        assert sc.resolve_profile(given) == shipped
        assert sc.load_profile(sc.resolve_profile(given)).name == "assumed_nvlink_8gpu"
    mine = tmp_path / "mine.py"
    mine.write_text((ROOT / "configs/profiles/assumed_nvlink_8gpu.py").read_text())
    assert sc.resolve_profile("mine.py") == "mine.py"  # a file here wins over the package
    with pytest.raises(sc.SimulationError, match="must name a profile file"):
        sc.load_profile(sc.resolve_profile("no_such_profile"))


def test_measure_worker_runs_from_the_package_outside_the_checkout(tmp_path: Path) -> None:
    # measure() spawns this command: the package's module, not a script of the checkout.
    command = sc.worker_command(1, [1], 1)
    assert command[1:3] == ["-m", "tf_adabatch.app.simulation.cluster"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, check=False, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["num_parameters"] > 0
    assert [(r["replicas"], r["k"], r["batch"], len(r["seconds"])) for r in result["rows"]] == [
        (1, 1, 32, 1)
    ]
