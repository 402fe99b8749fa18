"""Issue 42: when something goes wrong the run says what happened, not something false.

- the launcher's evaluation on two replicas at a batch smaller than the replicas;
- a non-finite test evaluation with a healthy training loss is not a divergence.

(`Trainer.evaluate` at every batch size: tests/test_trainer_evaluate.py; skipped steps
under `attach`: tests/test_fit_keras.py; checkpoints: tests/test_checkpoints.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from configs import synthetic
from tf_adabatch import app
from tf_adabatch.app.data import pipeline
from tf_adabatch.app.models import build_model
from tf_adabatch.app.records import EvaluationNotFinite

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300


def config(**overrides):
    c = synthetic.get_config()
    c.train.max_steps = 3
    c.train.eval_every_base_epochs = 100.0  # only the final evaluation
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = c
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return c


def test_launcher_evaluation_at_batch_1_on_two_replicas_equals_one_device_keras(
    tmp_path: Path,
) -> None:
    """`train.eval_batch_size=1` on the synthetic config's two replicas: every batch
    leaves a replica without examples (the loss was NaN and the run ended "diverged").
    The reported test loss and accuracy equal stock Keras's `evaluate` of the final
    checkpoint's weights on one device at the same batch size (loss within 1e-6)."""
    workdir = tmp_path / "run"
    overrides = {"train.max_steps": 3, "train.eval_batch_size": 1}
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "resume_worker.py"),
        str(ROOT / "configs" / "synthetic.py"),
        str(workdir),
        "0",
        json.dumps({**overrides, "train.eval_every_base_epochs": 100.0}),
    ]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert metrics["replicas"] == 2 and metrics["optimizer_steps"] == 3

    cfg = synthetic.get_config()
    _, (x_test, y_test), num_classes = pipeline.load_arrays(cfg.dataset, seed=cfg.seed)
    model = build_model(cfg.model, x_test.shape[1:], num_classes, seed=cfg.seed + 1)
    latest = tf.train.latest_checkpoint(str(workdir / "checkpoints"))
    assert latest.endswith("ckpt-3")
    tf.train.Checkpoint(model=model).read(latest).expect_partial().assert_existing_objects_matched()
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"]
    )
    expected = model.evaluate(x_test, y_test, batch_size=1, verbose=0, return_dict=True)
    assert np.isfinite(expected["loss"])
    assert metrics["test_loss"] == pytest.approx(expected["loss"], abs=1e-6)
    assert metrics["test_accuracy"] == pytest.approx(expected["accuracy"], abs=1e-7)


def test_a_non_finite_test_set_with_a_finite_training_loss_is_not_called_a_divergence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One test image of pixels at 3e38 makes the test loss NaN; the weights are fine
    (training's loss at them is finite). The run stops with `EvaluationNotFinite`,
    saying training did not diverge, and sets no checkpoint aside."""
    load = pipeline.load_arrays

    def poisoned(name, *, seed=0):
        (x, y), (x_test, y_test), classes = load(name, seed=seed)
        x_test = x_test.copy()
        x_test[5] = 3e38  # overflows to inf in the dense layers: NaN logits
        return (x, y), (x_test, y_test), classes

    monkeypatch.setattr(pipeline, "load_arrays", poisoned)
    c = config(strategy="one_device", **{"train.checkpoint_every_steps": 3})
    with pytest.raises(EvaluationNotFinite) as caught:
        app.run(c, str(tmp_path), verbose=0)
    message = str(caught.value)
    assert "training did not diverge" in message, message
    assert "no checkpoint was set aside (newest: ckpt-3)" in message, message
    assert "rerun with a lower learning rate" not in message
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert not [n for n in names if "diverged" in n], names
    assert "ckpt-3.index" in names
    assert not (tmp_path / "metrics.json").exists()
