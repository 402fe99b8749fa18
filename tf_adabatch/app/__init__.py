"""The application: one training job from an ml_collections config (`run(config, workdir)`).

Not imported by `tf_adabatch`: the core library needs only TensorFlow, Keras and
TensorBoard; this package also needs the `launch` extra (`pip install -e '.[launch]'`:
absl-py, ml-collections, tensorflow-datasets).

>>> from tf_adabatch import app
>>> "run" in app.__all__
True
"""

from tf_adabatch.app.loop import (
    POLICIES,
    STRATEGIES,
    ConfigError,
    ResumeError,
    WorkerLostError,
    make_strategy,
    restore_newest_readable,
    run,
    validate_config,
)

__all__ = [
    "POLICIES",
    "STRATEGIES",
    "ConfigError",
    "ResumeError",
    "WorkerLostError",
    "make_strategy",
    "restore_newest_readable",
    "run",
    "validate_config",
]
