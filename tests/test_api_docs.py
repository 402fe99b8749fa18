"""Every public class and function documents itself with an example that runs; the core
library imports none of the application's dependencies.

The examples run as doctests (`pytest --doctest-modules`); this test makes sure that
every name in a module's `__all__` has one.
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _public_modules() -> list[str]:
    """Every public module of the package (no leading underscore), found on disk: a new
    module cannot be left out of the check."""
    import pkgutil

    import tf_adabatch

    names = ["tf_adabatch"]
    for info in pkgutil.walk_packages(tf_adabatch.__path__, "tf_adabatch."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return sorted(names)


MODULES = _public_modules()


def test_the_module_list_covers_the_package() -> None:
    assert {"tf_adabatch.engine", "tf_adabatch.measure", "tf_adabatch.app.loop"} <= set(MODULES)
    assert len(MODULES) >= 25


def public_objects():
    for name in MODULES:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                yield f"{name}.{attr}", obj


@pytest.mark.parametrize(
    "name,obj", list(public_objects()), ids=lambda v: v if isinstance(v, str) else ""
)
def test_has_docstring_with_example(name: str, obj: object) -> None:
    doc = inspect.getdoc(obj) or ""
    assert doc, f"{name} has no docstring"
    assert ">>>" in doc, f"{name}'s docstring has no example"


# The library's own dependencies are TensorFlow, Keras and TensorBoard; the application's
# (`tf_adabatch.app`: ml_collections, TensorFlow Datasets, absl's flags) are an extra.
CORE_ONLY = r"""
import json, sys
import tf_adabatch
app_deps = ("ml_collections", "tensorflow_datasets")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in app_deps)
for name in app_deps:  # from here on, any import of them fails
    sys.modules[name] = None
blocked = []
for name in app_deps:
    try:
        __import__(name)
    except ImportError:
        blocked.append(name)
import keras, numpy as np, tensorflow as tf
model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
trainer = tf_adabatch.Trainer(
    model, loss="mse", optimizer=keras.optimizers.SGD(0.1), micro_batch_size=4,
    policy=tf_adabatch.StaticPolicy(4), similarity="estimated",
)
x = np.arange(24, dtype="float32").reshape(8, 3) / 24.0
data = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4, drop_remainder=True)
trainer.fit(data, steps=2, verbose=0)
print(json.dumps({
    "loaded": loaded,
    "blocked": blocked,
    "app": "tf_adabatch.app" in sys.modules,
    "steps": int(trainer.state.steps.numpy()),
    "samples": int(trainer.state.samples_seen.numpy()),
}))
"""


def test_the_core_library_needs_neither_ml_collections_nor_tfds() -> None:
    """`import tf_adabatch` loads neither (nor the application); with both imports made
    to fail, a Trainer on the default strategy still trains: 2 steps of a static batch
    of 4 (one replica, one micro-batch of 4) are 2 optimizer steps and 8 examples."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2"}
    result = subprocess.run(
        [sys.executable, "-c", CORE_ONLY],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["loaded"] == []
    assert report["blocked"] == ["ml_collections", "tensorflow_datasets"]
    assert report["app"] is False
    assert (report["steps"], report["samples"]) == (2, 8)
