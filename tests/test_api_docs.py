"""Every public class and function documents itself with an example that runs.

The examples run as doctests (`pytest --doctest-modules`); this test makes sure that
every name in a module's `__all__` has one.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = [
    "tf_adabatch",
    "tf_adabatch.stats",
    "tf_adabatch.state",
    "tf_adabatch.policies",
    "tf_adabatch.schedules",
    "tf_adabatch.engine",
    "tf_adabatch.trainer",
    "tf_adabatch.fit",
    "tf_adabatch.callbacks",
    "tf_adabatch.summaries",
    "tf_adabatch.app.models",
    "tf_adabatch.app",
    "tf_adabatch.app.config",
    "tf_adabatch.app.factories",
    "tf_adabatch.app.checkpoints",
    "tf_adabatch.app.workers",
    "tf_adabatch.app.loop",
    "tf_adabatch.app.data",
    "tf_adabatch.app.data.pipeline",
    "tf_adabatch.app.data.fashion_mnist",
]


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
