"""launch/train.py end to end: every shipped config, resume after a kill, bad input."""

from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from configs import base
from tf_adabatch import experiment
from tf_adabatch.data import pipeline
from tf_adabatch.models import build_model

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = sorted(p.name for p in (ROOT / "configs").glob("*.py") if p.name != "__init__.py")
TIMEOUT_S = 300
FAST = [
    "--config.train.max_steps=3",
    "--config.num_cpu_replicas=2",
    "--config.train.eval_batch_size=2000",
]


def launch(
    config: str, workdir: Path, *flags: str, timeout: int = TIMEOUT_S
) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / config}",
        f"--workdir={workdir}",
        *flags,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def accuracy_of_saved_weights(config: str, workdir: Path) -> float:
    """Test accuracy of the latest checkpoint in `workdir`, without the Trainer."""
    module = importlib.import_module(f"configs.{config[: -len('.py')]}")
    cfg = module.get_config()
    _, (x_test, y_test), num_classes = pipeline.load_arrays(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg.model, x_test.shape[1:], num_classes, seed=cfg.seed + 1)
    latest = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
    tf.train.Checkpoint(model=model).read(latest).expect_partial().assert_existing_objects_matched()
    logits = model.predict(x_test, batch_size=1000, verbose=0)
    return float(np.mean(np.argmax(logits, axis=-1) == np.asarray(y_test).ravel()))


@pytest.mark.parametrize("config", CONFIGS)
def test_every_config_runs_a_few_steps(config: str, tmp_path: Path) -> None:
    dataset = importlib.import_module(f"configs.{config[: -len('.py')]}").get_config().dataset
    if dataset == "fashion_mnist" and not Path("/usr/share/datasets/fashion-mnist").is_dir():
        pytest.skip("needs Debian's dataset-fashion-mnist (no network here)")
    result = launch(config, tmp_path, *FAST)
    assert result.returncode == 0, result.stderr[-3000:]
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["optimizer_steps"] == 3
    # The reported accuracy equals an independent evaluation of the saved weights: the
    # final checkpoint restored into a fresh model, predicted with plain Keras.
    assert metrics["test_accuracy"] == pytest.approx(
        accuracy_of_saved_weights(config, tmp_path), abs=1e-6
    )
    assert (tmp_path / "tensorboard" / "train").is_dir() and (tmp_path / "checkpoints").is_dir()
    assert "Final test accuracy" in result.stdout


def test_killed_run_resumes_from_its_last_checkpoint(tmp_path: Path) -> None:
    flags = ["--config.train.checkpoint_every_steps=5", "--config.train.base_epochs=200"]
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={tmp_path}",
        *flags,
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + TIMEOUT_S
        while not list((tmp_path / "checkpoints").glob("ckpt-*.index")):
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.time() < deadline, "no checkpoint in time"
            time.sleep(0.2)
        time.sleep(1.0)  # let it train on past the checkpoint
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    # The checkpoint the manager will restore (a kill can land between writing a
    # checkpoint's files and recording it as the latest).
    latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert latest is not None
    saved = [int(latest.rsplit("-", 1)[1])]
    result = launch(
        "synthetic.py", tmp_path, *flags, "--config.train.max_steps=" + str(saved[-1] + 5)
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"Resumed from {tmp_path / 'checkpoints' / f'ckpt-{saved[-1]}'}" in result.stdout
    assert json.loads((tmp_path / "metrics.json").read_text())["optimizer_steps"] == saved[-1] + 5


def test_mistyped_field_fails_with_a_suggestion(tmp_path: Path) -> None:
    result = launch("synthetic.py", tmp_path, "--config.policy.target_similarty=0.3", timeout=120)
    assert result.returncode != 0
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "error: 'target_similarty' Did you mean \"target_similarity\"" in result.stderr


def test_bad_value_fails_with_one_clear_line(tmp_path: Path) -> None:
    result = launch("synthetic.py", tmp_path, "--config.policy.target_similarity=1.3", timeout=120)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        "error: Config `policy`: Argument `target_similarity` must be in (0, 1). Received: target_similarity=1.3"
        in result.stderr.splitlines()
    )


@pytest.mark.parametrize(
    "field,value,match",
    [
        (
            "dataset",
            "cifar10",
            r"Config field `dataset` must be one of \('fashion_mnist', 'digits', 'synthetic'\). Received: dataset='cifar10'",
        ),
        (
            "strategy",
            "horovod",
            r"Config field `strategy` must be one of .* Received: strategy='horovod'",
        ),
        (
            "lr.rule",
            "cubic",
            r"Config field `lr.rule` must be one of \(.adascale., .sqrt., .linear., .none.\). Received: lr.rule=.cubic.",
        ),
        (
            "lr.gain_power",
            2.0,
            r"Config `lr`: Argument `gain_power` must be in \(0, 1\]. Received: gain_power=2.0",
        ),
        (
            "policy.min_batch_size",
            4096,
            r"Config `policy`: Argument `min_batch_size` must be <= `max_batch_size`",
        ),
        (
            "policy.max_batch_size",
            2000,
            r"Config field `policy.max_batch_size` must be a multiple of num_cpu_replicas x micro_batch_size = 128 to be reachable. Received: policy.max_batch_size=2000",
        ),
        (
            "base_batch_size",
            0,
            r"Config field `base_batch_size` must be >= 1. Received: base_batch_size=0",
        ),
        ("train.base_epochs", -1.0, r"Config field `train.base_epochs` must be > 0"),
        (
            "train.max_consecutive_skips",
            0,
            r"Config field `train.max_consecutive_skips` must be None or >= 1. Received: train.max_consecutive_skips=0",
        ),
    ],
)
def test_validate_config_names_field_rule_and_value(field: str, value, match: str) -> None:
    config = base.get_config()
    parent, _, leaf = field.rpartition(".")
    (config[parent] if parent else config)[leaf] = value
    with pytest.raises(experiment.ConfigError, match=match):
        experiment.validate_config(config)


def test_missing_config_file_fails_with_one_clear_line(tmp_path: Path) -> None:
    result = launch("no_such_config.py", tmp_path, timeout=120)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert any(
        line.startswith("error: --config:") and "No such file" in line
        for line in result.stderr.splitlines()
    )


def test_local_multiworker_launcher_trains_digits_with_two_workers(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "multiworker.py"),
        "--num_workers=2",
        f"--timeout={TIMEOUT_S}",
        "--",
        f"--config={ROOT / 'configs' / 'digits.py'}",
        f"--workdir={tmp_path}",
        "--config.train.base_epochs=4",
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S + 60, cwd=ROOT)
    assert result.returncode == 0, (result.stderr + (tmp_path / "worker-1.log").read_text())[-3000:]
    chief = json.loads((tmp_path / "metrics.json").read_text())
    other = json.loads((tmp_path / "worker-1" / "metrics.json").read_text())
    assert chief["replicas"] == 2
    for key in ("test_accuracy", "test_loss", "optimizer_steps", "examples_seen", "progress"):
        assert chief[key] == other[key]
    assert chief["test_accuracy"] > 0.8
