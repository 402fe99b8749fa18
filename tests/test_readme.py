"""The README cannot rot: its Python examples run, and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_exactly_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    setup = [b.strip() for b in bash_blocks() if "pip install" in b]
    assert len(setup) == 2
    main_job, tests = setup
    assert "launch/train.py --config=configs/fashion_mnist.py" in main_job
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()


@pytest.mark.parametrize("index", range(len(python_blocks())))
def test_python_examples_run(index: int, capsys) -> None:
    namespace: dict = {}
    exec(compile(python_blocks()[index], f"README.md[python {index}]", "exec"), namespace)
    engine = namespace.get("engine")
    if engine is not None:  # the model.fit quick start: 2 epochs of 50 optimizer steps
        assert int(engine.state.steps.numpy()) == 100
        assert max(namespace["history"].history["batch_size"]) > 32
    trainer = namespace.get("trainer")
    if trainer is not None:  # the quick start: the budget was reached with a grown batch
        assert trainer.progress >= 400
        assert trainer.batch_size > 32
        assert len(namespace["history"]["loss"]) < 400
