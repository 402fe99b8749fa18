"""Installs tf_adabatch. `pip install -e .` for the library (TensorFlow, Keras, TensorBoard),
`pip install -e '.[launch]'` for the application too (configs, launch/), `pip install -e '.[test]'`
to develop."""

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

setup(
    name="tf_adabatch",
    version="0.1.0",
    description="Adaptive batch sizes (SimiGrad) and AdaScale learning rates for tf.distribute and Keras.",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["tf_adabatch", "tf_adabatch.*"]),
    python_requires=">=3.10",
    install_requires=[
        # Keras 3 comes with TF >= 2.16. The upper bounds are the newest versions the
        # suite ran on: the engine relies on two private Keras behaviours (the
        # optimizer's internal all-reduce and the order of `Model.losses`), pinned by
        # tests/test_keras_private.py; raise the bounds when that test passes.
        "tensorflow>=2.16,<2.22",
        "keras>=3.3,<3.16",
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
