"""Installs tf_adabatch. `pip install -e .` for the library (TensorFlow, Keras, TensorBoard),
`pip install -e '.[launch]'` for the application too (configs, launch/), `pip install -e '.[test]'`
to develop.

The repository's top-level `configs/` (the shipped job configs, the measured step-time profiles
and the traces they were fitted to) is installed as the package `tf_adabatch.app.configs`: one
copy of each file, read by the application through `importlib.resources`
(`tf_adabatch.app.resources`), the same in a checkout and in a wheel.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

# What the application needs beyond the core library (listed again in `bench` and `test`:
# an extra cannot reliably require another).
LAUNCH = [
    "absl-py>=2.0",
    "ml-collections>=0.1.1",
    "tensorflow-datasets>=4.9",
    # tfds 4.9.x needs it for a custom builder's download_and_prepare on 3.11.
    "importlib_resources>=6",
    # launch/fit_profiles.py fits the measured GPU step-time profiles (least squares).
    "scipy>=1.10",
]

HERE = Path(__file__).parent
# The version lives in the package (`tf_adabatch.__version__`); read, not imported (importing
# would need TensorFlow at build time).
VERSION = re.search(
    r'^__version__ = "([^"]+)"$',
    (HERE / "tf_adabatch" / "__init__.py").read_text(encoding="utf-8"),
    re.MULTILINE,
).group(1)  # type: ignore[union-attr]

# configs/ -> tf_adabatch.app.configs (and its sub-packages), data files included.
CONFIG_PACKAGES = {
    "tf_adabatch.app.configs": "configs",
    "tf_adabatch.app.configs.profiles": "configs/profiles",
}

setup(
    name="tf_adabatch",
    version=VERSION,
    description="Adaptive batch sizes (SimiGrad) and AdaScale learning rates for tf.distribute and Keras.",
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    # An SPDX expression (setuptools deprecates the License classifiers in its favour).
    license="Apache-2.0",
    license_files=["LICENSE"],
    classifiers=[
        "Development Status :: 3 - Alpha",
        "Intended Audience :: Developers",
        "Intended Audience :: Science/Research",
        "Operating System :: POSIX :: Linux",
        "Programming Language :: Python :: 3",
        "Programming Language :: Python :: 3 :: Only",
        "Programming Language :: Python :: 3.11",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
    keywords="tensorflow keras distributed-training adaptive-batch-size adascale simigrad",
    # project_urls: none yet; the repository has no public address to name.
    packages=[*find_packages(include=["tf_adabatch", "tf_adabatch.*"]), *CONFIG_PACKAGES],
    package_dir=CONFIG_PACKAGES,
    # The measured traces the profiles were fitted to (tf_adabatch.app.step_time_fit and the
    # replays read them), with their README and LICENSE.
    package_data={"tf_adabatch.app.configs.profiles": ["pollux_traces/*", "pollux_traces/*/*"]},
    entry_points={"console_scripts": ["tf-adabatch-train = tf_adabatch.app.cli:run_cli"]},
    # Tested on CPython 3.11 (CI and the version matrix).
    python_requires=">=3.11",
    install_requires=[
        # What the version matrix passes (.ci/version_matrix.sh, docs/versions.md): TF
        # 2.16-2.21 with Keras 3.10-3.15. Before 3.10 Keras keeps one copy of its metric
        # variables for all replicas (wrong losses and metrics on more than one); the
        # private behaviours the engine relies on are pinned per release by
        # tests/test_keras_private.py. Raise a bound when the matrix passes a new pair.
        "tensorflow>=2.16,<2.22",
        "keras>=3.10,<3.16",
        # TF 2.21 no longer installs TensorBoard; tf.summary needs it.
        "tensorboard>=2.16",
    ],
    extras_require={
        # The application (tf_adabatch.app, configs/, launch/): configs, flags, datasets.
        "launch": LAUNCH,
        # launch/benchmark_efficiency.py draws its plots with matplotlib.
        "bench": [*LAUNCH, "matplotlib>=3.7"],
        "test": [
            *LAUNCH,
            "build>=1.0",  # tests/test_packaging.py and .ci/wheel_smoke build the sdist and wheel
            "pytest>=8",
            "pytest-xdist>=3.5",  # the suite runs in two processes (pyproject addopts)
            "matplotlib>=3.7",  # the benchmark smoke test
            "hypothesis>=6.100",
            "scikit-learn>=1.3",
            # Exact versions: a formatter or checker upgrade must not fail CI by itself.
            "ruff==0.17.6",
            "mypy==2.4.1",
        ],
    },
)
