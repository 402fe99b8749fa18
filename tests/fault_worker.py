"""`tf_adabatch.app.run` in a subprocess that SIGKILLs itself at a chosen point.

    python tests/fault_worker.py CONFIG WORKDIR OVERRIDES_JSON FAULT_JSON

FAULT_JSON is one of
  {}                                  no fault: run to the end
  {"micro_batch": i}                  when the input pipeline hands over micro-batch i
                                      (counted from 0 in this process): anywhere in a step
  {"save": n, "at": "merge"}          inside this process's n-th checkpoint save, after its
                                      shards are written to ckpt-N_temp/ and before they
                                      are merged into ckpt-N.* (leaves ckpt-N_temp behind)
  {"save": n, "at": "record"}         after ckpt-N.* are complete, before the
                                      CheckpointManager records them in its state file

The save hooks wrap TensorFlow internals (`gen_io_ops.merge_v2_checkpoints`, called
eagerly by the one-task saver, and `CheckpointManager._record_state`); tests/test_faults.py
checks the traces each kill leaves, so a TensorFlow change that bypasses a hook fails
there instead of going unnoticed. Used by tests/test_faults.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from resume_worker import load_config


def kill() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    config_path, workdir, overrides, fault_json = sys.argv[1:]
    import tensorflow as tf
    from tensorflow.python.checkpoint import checkpoint_management
    from tensorflow.python.ops import gen_io_ops

    from tf_adabatch import app
    from tf_adabatch.app.data import pipeline

    config = load_config(config_path, overrides)

    fault = json.loads(fault_json)
    if "micro_batch" in fault:
        original_fn = pipeline.train_dataset_fn

        def maybe_kill(index: tf.Tensor) -> tf.Tensor:
            if int(index) == fault["micro_batch"]:
                kill()
            return index

        def killing_dataset_fn(*args, **kwargs):
            dataset_fn = original_fn(*args, **kwargs)

            def fn(ctx):
                def tap(i, batch):
                    done = tf.py_function(maybe_kill, [i], tf.int64)
                    with tf.control_dependencies([done]):
                        return tf.nest.map_structure(tf.identity, batch)

                return dataset_fn(ctx).enumerate().map(tap)

            return fn

        pipeline.train_dataset_fn = killing_dataset_fn
    elif fault.get("at") == "merge":
        merge = gen_io_ops.merge_v2_checkpoints
        calls = [0]

        def killing_merge(*args, **kwargs):
            calls[0] += 1
            if calls[0] == fault["save"]:
                kill()
            return merge(*args, **kwargs)

        gen_io_ops.merge_v2_checkpoints = killing_merge
    elif fault.get("at") == "record":
        record = checkpoint_management.CheckpointManager._record_state
        calls = [0]

        def killing_record(self):
            calls[0] += 1  # twice per save: record, delete old ones, record again
            if calls[0] == 2 * fault["save"] - 1:
                kill()
            return record(self)

        checkpoint_management.CheckpointManager._record_state = killing_record
    app.run(config, workdir, verbose=1)


if __name__ == "__main__":
    main()
