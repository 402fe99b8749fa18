"""The package as a wheel carries what it reads at run time, and its metadata is true.

The wheel is built here from a copy of the files setup.py reads (the checkout is left
untouched), as `python -m build` does (sdist first, the wheel from the sdist), then read as
a zip. .ci/wheel_smoke installs such a wheel outside the checkout and runs it.
"""

from __future__ import annotations

import email.parser
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

import tf_adabatch
from tf_adabatch.app import factories, resources, step_time_fit

ROOT = Path(__file__).resolve().parent.parent
# What setup.py reads: everything else in the checkout is not part of the package.
BUILD_INPUTS = ("setup.py", "pyproject.toml", "README.md", "LICENSE", "tf_adabatch", "configs")


def tracked(folder: str) -> list[str]:
    """The files git tracks under `folder` (what a fresh clone has), relative to it."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", folder],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    return [os.path.relpath(path, folder) for path in out]


@pytest.fixture(scope="module")
def dist(tmp_path_factory) -> Path:
    """dist/ with the sdist and the wheel built from a copy of the build inputs."""
    src = tmp_path_factory.mktemp("src")
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(
                ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info")
            )
        else:
            shutil.copy2(ROOT / name, src / name)
    out = src / "dist"
    result = subprocess.run(
        [sys.executable, "-m", "build", "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return out


def wheel_files(dist: Path) -> dict[str, bytes]:
    (wheel,) = dist.glob("tf_adabatch-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


def test_the_wheel_carries_every_config_profile_and_trace_byte_for_byte(dist: Path) -> None:
    """One source of truth: each tracked file of configs/ is in the wheel, under
    tf_adabatch/app/configs/, with the same bytes; nothing of the repository's tools
    (tests/, launch/) is."""
    files = wheel_files(dist)
    expected = tracked("configs")
    # configs (8 + __init__), 9 profiles + __init__, 6 workloads' traces + README + LICENSE.
    assert len(expected) > 60
    checked = 0
    for rel in expected:
        name = f"tf_adabatch/app/configs/{rel}"
        assert name in files, f"{name} missing from the wheel"
        assert files[name] == (ROOT / "configs" / rel).read_bytes(), rel
        checked += 1
    assert checked == len(expected)
    assert not [n for n in files if n.startswith(("tests/", "launch/", "configs/"))]
    # The sdist (the wheel was built from it) carries them too.
    (sdist,) = dist.glob("tf_adabatch-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {f"configs/{rel}" for rel in expected} <= names


def test_the_wheel_metadata(dist: Path) -> None:
    """Version from the package, license, Python range, the console script."""
    files = wheel_files(dist)
    (metadata,) = [n for n in files if n.endswith(".dist-info/METADATA")]
    meta = email.parser.Parser().parsestr(files[metadata].decode())
    assert meta["Name"] == "tf_adabatch"
    assert meta["Version"] == tf_adabatch.__version__
    assert meta["Requires-Python"] == ">=3.11"
    assert meta["License"] == "Apache-2.0"
    assert "Programming Language :: Python :: 3.11" in meta.get_all("Classifier")
    assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith("LICENSE") for n in files)
    (entry_points,) = [n for n in files if n.endswith(".dist-info/entry_points.txt")]
    assert "tf-adabatch-train = tf_adabatch.app.cli:run_cli" in files[entry_points].decode()
    assert "tf_adabatch/app/__main__.py" in files


def test_what_the_code_reads_is_found_through_the_package() -> None:
    """Every measured profile loads by name, every workload's traces are there, and
    every shipped config resolves by name, all below the package's configs folder."""
    configs = resources.configs_dir()
    assert os.path.samefile(configs, resources.profiles_dir().rsplit(os.sep, 1)[0])
    names = factories.measured_profiles()
    assert len(names) == 6
    for name in names:
        assert factories.load_step_time_model(name).gpus_per_node == 4
    for workload in step_time_fit.WORKLOADS:
        assert os.path.isfile(os.path.join(step_time_fit.TRACES, workload, "placements.csv"))
    shipped = resources.config_names()
    assert {"fashion_mnist", "synthetic", "text_lm", "digits"} <= set(shipped)
    for name in shipped:
        assert os.path.samefile(resources.config_path(name), os.path.join(configs, f"{name}.py"))
