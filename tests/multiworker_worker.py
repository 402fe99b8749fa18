"""One worker of a MultiWorkerMirroredStrategy run (started by test_multiworker.py).

Usage: python multiworker_worker.py OUT.npz STEPS [loop|fit]   (TF_CONFIG set by the caller)

"loop" trains with `tf_adabatch.Trainer` and a static batch; "fit" with `model.fit`
through `tf_adabatch.attach` and the SimiGrad policy.
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


def main(out: str, steps: int, mode: str) -> None:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    model = mlp(strategy)
    with strategy.scope():
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
    if mode == "fit":
        fit(strategy, model, optimizer, out, steps)
        return
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


def fit(strategy, model, optimizer, out: str, steps: int) -> None:
    with strategy.scope():
        model.compile(optimizer=optimizer, loss="mse")
    policy = tf_adabatch.SimiGradPolicy(
        0.6, initial_batch_size=2 * M, min_batch_size=2 * M, max_batch_size=16 * M
    )
    tf_adabatch.attach(model, micro_batch_size=M, policy=policy)
    x, y = regression_data(4096)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    data = (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(2 * M, drop_remainder=True)
        .with_options(options)
    )
    per_step: list[tuple[float, float]] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: per_step.append((logs["batch_size"], logs["gain"]))
    )
    model.fit(data, epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[record])
    np.savez(
        out,
        *[v.numpy() for v in model.trainable_variables],
        gains=np.array([g for _, g in per_step]),
        batch=np.array([b for b, _ in per_step]),
    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "loop")
