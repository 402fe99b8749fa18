r"""Bytes of variables the engine holds against the model's own, per roll-back mode.

    python launch/engine_memory.py --replicas=2 --models=small,cnn

For each model (`launch/benchmark_overhead.py`'s, ~100k and ~1M parameters) and
optimizer (SGD with momentum, Adam), on one MirroredStrategy over logical CPU replicas,
builds an `AdaptiveEngine` with `rollback="copy"` (the default) and `rollback="stop"`
and prints `AdaptiveEngine.memory()`: bytes on all devices together of the model's
variables, the optimizer's, the roll-back's copies, the measurement's accumulators and
buffers (exact similarity) and the adaptive state, and the engine's share against the
model's. Nothing is trained; the numbers follow from the variables' shapes.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import benchmark_overhead as bench

# --replicas (one value) and --models (any of small, cnn) are benchmark_overhead's.
FLAGS = flags.FLAGS


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    if len(FLAGS.replicas) != 1 or int(FLAGS.replicas[0]) < 2:
        raise app.UsageError(f"One --replicas >= 2. Received: {FLAGS.replicas}")
    replicas = int(FLAGS.replicas[0])
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    import keras

    import tf_adabatch

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    optimizers = {
        "SGD+momentum": lambda: keras.optimizers.SGD(0.01, momentum=0.9),
        "Adam": lambda: keras.optimizers.Adam(1e-3),
    }
    print(f"{replicas} replicas (MirroredStrategy); bytes on all devices together\n")
    print(
        "| model | optimizer | rollback | model | optimizer | roll-back copies | "
        "measurement | state | engine's / model's |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for kind in FLAGS.models:
        for name, make in optimizers.items():
            for mode in ("copy", "stop"):
                with strategy.scope():
                    model = bench.build_model(kind)
                    optimizer = make()
                engine = tf_adabatch.AdaptiveEngine(
                    model,
                    loss=bench.make_loss(),
                    optimizer=optimizer,
                    strategy=strategy,
                    micro_batch_size=32,
                    similarity="exact",
                    rollback=mode,
                )
                m = engine.memory()
                added = m["rollback"] + m["measurement"] + m["state"]
                print(
                    f"| {kind} ({model.count_params():,} parameters) | {name} | {mode} | "
                    f"{m['model']:,} | {m['optimizer']:,} | {m['rollback']:,} | "
                    f"{m['measurement']:,} | {m['state']:,} | {added / m['model']:.2f} |"
                )


if __name__ == "__main__":
    app.run(main)
