"""`launch/train.py`'s job in a subprocess, optionally killed (SIGKILL) mid-run.

    python tests/resume_worker.py CONFIG WORKDIR KILL_AT '{"train.max_steps": 30}'


With KILL_AT > 0 the process sends itself SIGKILL when its input pipeline hands over
micro-batch number KILL_AT (counted from 0 in this process): a hard kill at a chosen
micro-step, wherever the training step is at that moment. Used by
tests/test_reliability.py.
"""

from __future__ import annotations

import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def load_config(config_path: str, overrides: str):
    """The config file's `get_config()` with the JSON `{"a.b": value}` overrides set
    (also used by tests/fault_worker.py)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("config", config_path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for key, value in json.loads(overrides).items():
        *parents, leaf = key.split(".")
        node = config
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return config


def main() -> None:
    config_path, workdir, kill_at, overrides = sys.argv[1:]
    import tensorflow as tf

    from tf_adabatch import app
    from tf_adabatch.app.data import pipeline

    config = load_config(config_path, overrides)

    if int(kill_at) > 0:
        original = pipeline.train_dataset_fn

        def maybe_kill(index: tf.Tensor) -> tf.Tensor:
            if int(index) == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
            return index

        def killing_dataset_fn(*args, **kwargs):
            dataset_fn = original(*args, **kwargs)

            def fn(ctx):
                def tap(i, batch):
                    done = tf.py_function(maybe_kill, [i], tf.int64)
                    with tf.control_dependencies([done]):
                        return tf.nest.map_structure(tf.identity, batch)

                return dataset_fn(ctx).enumerate().map(tap)

            return fn

        pipeline.train_dataset_fn = killing_dataset_fn
    app.run(config, workdir, verbose=1)


if __name__ == "__main__":
    main()
