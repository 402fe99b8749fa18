"""The README cannot rot: its Python examples run, and CI runs its test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README, flags=re.S)


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README, flags=re.S)


def test_readme_has_exactly_the_two_setup_commands_and_ci_runs_the_test_one() -> None:
    # The two set-up commands install editable from the checkout; the wheel's path
    # (tested below) installs non-editable.
    setup = [b.strip() for b in bash_blocks() if "pip install -e" in b]
    assert len(setup) == 2
    main_job, tests = setup
    assert "launch/train.py --config=configs/fashion_mnist.py" in main_job
    # The application's dependencies are an extra: the bare install could not run it.
    assert 'pip install -e ".[launch]"' in main_job
    assert "pytest" in tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert tests in ci.splitlines()


def test_the_readme_wheel_path_is_the_one_ci_smokes() -> None:
    """The README's install-from-wheel commands are what .ci/wheel_smoke runs (there in
    a fresh virtual environment outside the checkout)."""
    wheel = [b for b in bash_blocks() if "python -m build" in b]
    assert len(wheel) == 1
    smoke = (ROOT / ".ci" / "wheel_smoke").read_text(encoding="utf-8")
    for needed in ("python -m build", "python -m tf_adabatch.app --config=", "[launch]"):
        assert needed in wheel[0] and needed in smoke, needed
    assert "pip install -e" not in smoke


def test_the_readme_has_exactly_the_two_quick_starts() -> None:
    """Block 0: the custom loop (`trainer`); block 1: model.fit (`engine`). A README edit
    that renames or drops one must update the checks below, not skip them."""
    blocks = python_blocks()
    assert len(blocks) == 2
    assert "trainer = " in blocks[0] and "engine = " not in blocks[0]
    assert "engine = " in blocks[1] and "trainer = " not in blocks[1]


def run_block(index: int) -> dict:
    namespace: dict = {}
    exec(compile(python_blocks()[index], f"README.md[python {index}]", "exec"), namespace)
    return namespace


def test_custom_loop_quick_start_reaches_its_budget_with_a_grown_batch() -> None:
    namespace = run_block(0)
    trainer = namespace["trainer"]
    assert trainer.progress >= 400
    assert trainer.batch_size > 32
    assert len(namespace["history"]["loss"]) < 400


def test_model_fit_quick_start_runs_two_epochs_of_50_steps_with_a_grown_batch() -> None:
    namespace = run_block(1)
    engine = namespace["engine"]
    assert int(engine.state.steps.numpy()) == 100
    assert max(namespace["history"].history["batch_size"]) > 32
