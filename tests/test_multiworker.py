"""MultiWorkerMirroredStrategy: 2 worker processes on 127.0.0.1 run the custom loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

import tf_adabatch
from launch.multiworker import free_ports

from conftest import get_strategy
from helpers import global_micro_batches, mlp, regression_data, weights

HERE = Path(__file__).resolve().parent
STEPS = 4
M = 4
TIMEOUT_S = 240


def run_workers(
    tmp_path: Path, num_workers: int = 2, mode: str = "loop"
) -> list[dict[str, np.ndarray]]:
    ports = free_ports(num_workers)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    try:
        for index in range(num_workers):
            env = dict(os.environ)
            env["TF_CONFIG"] = json.dumps(
                {"cluster": cluster, "task": {"type": "worker", "index": index}}
            )
            env["PYTHONPATH"] = os.pathsep.join(
                [str(HERE), str(HERE.parent), env.get("PYTHONPATH", "")]
            )
            log = open(tmp_path / f"worker{index}.log", "w")  # noqa: SIM115 - closed below
            procs.append(
                (
                    subprocess.Popen(
                        [
                            sys.executable,
                            str(HERE / "multiworker_worker.py"),
                            str(tmp_path / f"w{index}.npz"),
                            str(STEPS),
                            mode,
                        ],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                    ),
                    log,
                )
            )
        for proc, _ in procs:
            proc.wait(timeout=TIMEOUT_S)
    finally:
        for proc, log in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            log.close()
    for index, (proc, _) in enumerate(procs):
        if proc.returncode != 0:
            tail = (tmp_path / f"worker{index}.log").read_text()[-3000:]
            pytest.fail(f"worker {index} exited with {proc.returncode}:\n{tail}")
    return [dict(np.load(tmp_path / f"w{i}.npz")) for i in range(num_workers)]


def test_two_workers_agree_and_match_two_mirrored_replicas(tmp_path: Path) -> None:
    results = run_workers(tmp_path)
    names = [k for k in results[0] if k.startswith("arr_")]
    for name in [*names, "gains", "similarity"]:
        np.testing.assert_array_equal(results[0][name], results[1][name])

    # The same data and seed on 2 replicas of MirroredStrategy in this process.
    strategy = get_strategy(2)
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(2 * M * 2),
        strategy=strategy,
    )
    x, y = regression_data(2 * M * 2 * STEPS + 64)
    history = trainer.fit(global_micro_batches(x, y, 2 * M), steps=STEPS, verbose=0)
    for w, name in zip(weights(model), sorted(names, key=lambda n: int(n[4:])), strict=True):
        np.testing.assert_allclose(results[0][name], w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results[0]["gains"], history["gain"], rtol=1e-5)
    np.testing.assert_allclose(
        results[0]["similarity"], history["similarity"], rtol=1e-4, atol=1e-6
    )


def test_model_fit_with_simigrad_on_two_workers_ends_with_identical_weights(tmp_path: Path) -> None:
    results = run_workers(tmp_path, mode="fit")
    assert "batch" in results[0]  # the fit path ran
    for name in results[0]:
        np.testing.assert_array_equal(results[0][name], results[1][name])
    assert np.isfinite(results[0]["gains"]).all()
