"""One worker of a MultiWorkerMirroredStrategy run (started by test_multiworker.py).

Usage: python multiworker_worker.py OUT.npz STEPS   (TF_CONFIG set by the caller)
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

import tf_adabatch

from helpers import mlp, regression_data

M = 4


def main(out: str, steps: int) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    trainer = tf_adabatch.Trainer(
        model,
        loss="mse",
        optimizer=optimizer,
        micro_batch_size=M,
        policy=tf_adabatch.StaticPolicy(2 * M * 2),
        strategy=strategy,
    )
    x, y = regression_data(2 * M * 2 * steps + 64)

    def dataset_fn(ctx: tf.distribute.InputContext) -> tf.data.Dataset:
        # Micro-batch block j goes to replica j mod 2, as MirroredStrategy splits it.
        ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(M, drop_remainder=True)
        return ds.shard(ctx.num_input_pipelines, ctx.input_pipeline_id)

    history = trainer.fit(dataset_fn, steps=steps, verbose=0)
    np.savez(
        out,
        *[v.numpy() for v in model.trainable_variables],
        gains=np.array(history["gain"]),
        similarity=np.array(history["similarity"]),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
