r"""Step-time overhead of tf_adabatch's statistics, measured side by side in one run.

    python launch/benchmark_overhead.py --replicas=2,4 --models=small,cnn --micro_batch=32

For each replica count and model (~100k and ~1M parameters), four variants on the same
strategy, model architecture and data, one micro-step per optimizer step (k = 1, where
any per-step overhead weighs most):
  plain      a plain tf.distribute step: gradients -> optimizer.apply_gradients
             (Keras all-reduces inside), no statistics
  estimated  the AdaptiveEngine, estimated similarity (scalar statistics only)
  exact      the AdaptiveEngine, exact group similarity (stacked [A, B] all-reduce)
  fit        stock Keras: the compiled `model.fit` step (`model.train_function`, what
             `fit` calls once per batch), loss tracking included
  estimated_no_rollback
             estimated, with the roll-back's per-step copies of the model's and the
             optimizer's variables switched off: their cost is estimated / this

The variants run in interleaved rounds (plain, estimated, exact, plain, ...) so that a
noisy, shared machine slows them alike; the script prints each variant's median step
time, the spread (min-max of the round medians) and the ratios to `plain`.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

FLAGS = flags.FLAGS
flags.DEFINE_list("replicas", ["2", "4"], "Logical CPU replica counts (MirroredStrategy).")
flags.DEFINE_integer("micro_batch", 32, "Examples per replica per micro-step.")
flags.DEFINE_list("models", ["small", "cnn"], "small: ~100k parameters; cnn: ~1M.")
flags.DEFINE_integer("rounds", 7, "Interleaved rounds.")
flags.DEFINE_integer("steps", 10, "Timed optimizer steps per variant per round.")
flags.DEFINE_integer("warmup", 3, "Untimed steps per variant before the rounds.")
flags.DEFINE_integer("timeout", 1800, "Seconds allowed per configuration (subprocess).")


def build_model(kind: str):
    import keras

    keras.utils.set_random_seed(0)
    layers = keras.layers
    if kind == "cnn":
        body = [
            layers.Conv2D(32, 3, activation="relu"),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(512, activation="relu"),
        ]
    else:
        body = [
            layers.Conv2D(16, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(32, 3, activation="relu"),
            layers.MaxPooling2D(),
            layers.Flatten(),
            layers.Dense(128, activation="relu"),
        ]
    return keras.Sequential([keras.Input((28, 28, 1)), *body, layers.Dense(10)])


def make_dataset(global_batch: int):
    """Random 28x28x1 images and 10 classes, batched with the global batch, repeated."""
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    x = rng.normal(size=(global_batch * 8, 28, 28, 1)).astype("float32")
    y = rng.integers(0, 10, size=(global_batch * 8,)).astype("int32")
    return (
        tf.data.Dataset.from_tensor_slices((x, y))
        .repeat()
        .batch(global_batch, drop_remainder=True)
        .prefetch(4)
    )


def make_loss():
    import keras

    return keras.losses.SparseCategoricalCrossentropy(from_logits=True)


def make_plain_step(strategy, model_kind: str, dataset, global_batch: int, steps_per_call: int = 1):
    """A plain tf.distribute step (gradients -> `apply_gradients`, Keras all-reduces
    inside): `(step(iterator), distributed iterator, model)`. With `steps_per_call` > 1
    the call runs that many steps in a `tf.range` loop (a plain `steps_per_execution`)."""
    import keras
    import tensorflow as tf

    loss = make_loss()
    with strategy.scope():
        model = build_model(model_kind)
        optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
        optimizer.build(model.trainable_variables)

    def plain_replica_step(data):
        xb, yb = data
        with tf.GradientTape() as tape:
            per_example = loss.call(yb, model(xb, training=True))
            value = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
        optimizer.apply_gradients(
            zip(
                tape.gradient(value, model.trainable_variables),
                model.trainable_variables,
                strict=True,
            )
        )
        return value

    @tf.function
    def plain_step(iterator):
        if steps_per_call == 1:
            strategy.run(plain_replica_step, args=(next(iterator),))
        else:
            for _ in tf.range(steps_per_call):
                strategy.run(plain_replica_step, args=(next(iterator),))

    return plain_step, iter(strategy.experimental_distribute_dataset(dataset)), model


def make_trainer(strategy, model_kind: str, similarity: str, micro_batch: int):
    """A `tf_adabatch.Trainer` on a fresh model (SGD with momentum, k = 1)."""
    import keras

    import tf_adabatch

    with strategy.scope():
        model = build_model(model_kind)
        opt = keras.optimizers.SGD(0.01, momentum=0.9)
    return tf_adabatch.Trainer(
        model,
        loss=make_loss(),
        optimizer=opt,
        micro_batch_size=micro_batch,
        similarity=similarity,
        strategy=strategy,
    )


def disable_rollback(engine) -> None:
    """Switches the roll-back's per-step copies (and their finiteness check) off on
    this engine; call it before the engine's first step (it acts when tracing)."""
    import tensorflow as tf

    rollback = engine._rollback
    rollback.save = lambda: None
    rollback.restore_local = lambda: None
    rollback.restore_mirrored = lambda: None
    rollback.all_finite = lambda: tf.constant(True)


def measure(replicas: int, model_kind: str) -> dict[str, list[float]]:
    """Seconds per step of each variant, one entry per interleaved round."""
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    global_micro = replicas * FLAGS.micro_batch
    dataset = make_dataset(global_micro)
    loss = make_loss()

    steps = {}
    plain_step, plain_iterator, model = make_plain_step(strategy, model_kind, dataset, global_micro)
    print(
        f"\nmodel: {model_kind}, {model.count_params():,} parameters; {replicas} replicas x micro-batch {FLAGS.micro_batch}"
    )
    steps["plain"] = (plain_step, plain_iterator)
    for mode in ("estimated", "exact"):
        trainer = make_trainer(strategy, model_kind, mode, FLAGS.micro_batch)
        steps[mode] = (trainer.engine.train_step, iter(trainer.distribute(dataset)))
    # The roll-back's share: estimated mode with the per-step copies (and their
    # finiteness check) switched off on this one engine, before its first trace.
    trainer = make_trainer(strategy, model_kind, "estimated", FLAGS.micro_batch)
    disable_rollback(trainer.engine)
    steps["estimated_no_rollback"] = (trainer.engine.train_step, iter(trainer.distribute(dataset)))
    with strategy.scope():
        stock = build_model(model_kind)
        stock.compile(keras.optimizers.SGD(0.01, momentum=0.9), loss=loss)
        stock.optimizer.build(stock.trainable_variables)  # as `fit` does before its first step
    # What `fit` runs per batch (steps_per_execution=1), on the same distributed input.
    stock.make_train_function()
    steps["fit"] = (
        stock.train_function,
        iter(strategy.experimental_distribute_dataset(dataset)),
    )

    def timed(name: str, count: int) -> float:
        fn, iterator = steps[name]
        start = time.perf_counter()
        for _ in range(count):
            out = fn(iterator)
        # Wait for the device: read a weight back (the step's last effect) or the loss.
        # (the engine's logs are NumPy values, read from the device already)
        np.asarray(model.trainable_variables[0] if name == "plain" else out["loss"])
        return (time.perf_counter() - start) / count

    for name in steps:
        timed(name, FLAGS.warmup)
    per_round: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(FLAGS.rounds):
        order = list(steps) if r % 2 == 0 else list(reversed(steps))
        for name in order:
            per_round[name].append(timed(name, FLAGS.steps))
    base = statistics.median(per_round["plain"])
    print(
        f"| variant | median ms/step | spread (min-max of {FLAGS.rounds} rounds) | ratio to plain |"
    )
    print("|---|---|---|---|")
    for name, times in per_round.items():
        med = statistics.median(times)
        print(
            f"| {name} | {1e3 * med:.1f} | {1e3 * min(times):.1f}-{1e3 * max(times):.1f} | {med / base:.3f} |"
        )
    # Paired ratios: within each round, so drifts of the machine cancel.
    for name in ("estimated", "exact", "fit", "estimated_no_rollback"):
        ratios = [t / p for t, p in zip(per_round[name], per_round["plain"], strict=True)]
        print(
            f"{name}/plain paired per round: median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})"
        )
    return per_round


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    counts = [int(r) for r in FLAGS.replicas]
    unknown = sorted(set(FLAGS.models) - {"small", "cnn"})
    if unknown or min(counts) < 2:
        # One replica's exact mode needs two micro-steps per step: not comparable at k = 1.
        raise app.UsageError(
            f"--models must be among small, cnn and --replicas >= 2. Received: {FLAGS.models}, {counts}"
        )
    if len(counts) == 1 and len(FLAGS.models) == 1:
        import tensorflow as tf

        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * counts[0]
        )
        per_round = measure(counts[0], FLAGS.models[0])
        base = statistics.median(per_round["plain"])
        ratios = {name: statistics.median(t) / base for name, t in per_round.items()}
        print("RESULT " + json.dumps(ratios), flush=True)
        return
    # One process per configuration: collective instances of several strategies over
    # the same devices in one process collide.
    summary = []
    common = [f"--micro_batch={FLAGS.micro_batch}", f"--rounds={FLAGS.rounds}"]
    common += [f"--steps={FLAGS.steps}", f"--warmup={FLAGS.warmup}"]
    for replicas in counts:
        for kind in FLAGS.models:
            cmd = [sys.executable, os.path.abspath(__file__), f"--replicas={replicas}"]
            out = subprocess.run(
                [*cmd, f"--models={kind}", *common],
                capture_output=True,
                text=True,
                timeout=FLAGS.timeout,
                check=True,
            ).stdout
            print("\n".join(line for line in out.splitlines() if not line.startswith("RESULT")))
            result = next(line for line in out.splitlines() if line.startswith("RESULT "))
            summary.append((replicas, kind, json.loads(result[len("RESULT ") :])))
    print("\n| replicas | model | estimated / plain | exact / plain | fit / plain |")
    print("|---|---|---|---|---|")
    for replicas, kind, r in summary:
        print(f"| {replicas} | {kind} | {r['estimated']:.3f} | {r['exact']:.3f} | {r['fit']:.3f} |")


if __name__ == "__main__":
    app.run(main)
