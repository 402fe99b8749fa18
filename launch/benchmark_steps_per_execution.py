r"""Step cost with several optimizer steps per call, measured side by side in one run.

    python launch/benchmark_steps_per_execution.py --replicas=2 --models=small --steps=32

On one strategy (logical CPU replicas), one model architecture (~100k parameters) and
the same data, k = 1 (one micro-step per optimizer step, where a per-step cost weighs
most), each of these runs the same number of optimizer steps per timed call:

  keras_N          stock Keras: `compile(steps_per_execution=N)` and the train function
                   `fit` calls (loss tracking included); no statistics
  plain_N          a plain tf.distribute step (gradients -> `apply_gradients`; no loss
                   tracking), N of them per call in a `tf.range` loop: the denominator
                   where stock Keras cannot run N steps per call (2 replicas here)
  attach_MODE_N    `tf_adabatch.attach` + the same train function (`fit`'s), N steps a
                   call, similarity MODE (estimated / exact)
  trainer_MODE_N   `Trainer.fit(steps=--steps, steps_per_execution=N, verbose=0)`, one
                   call per round
  trainer_MODE_stop_N  the same with rollback="stop" (with --stop_variants): no per-step
                   copy of the weights and slots

for N in --per_call (default 1 and 8). The variants run in interleaved rounds (the order
reversed every other round) so that a shared, noisy machine slows them alike; the script
prints each one's median time per optimizer step, the spread over rounds, and the
ratios to stock Keras and to the plain loop at the same N, paired within each round. If
stock Keras cannot run N steps per call on this strategy, its ratio is to stock Keras at
N = 1 and the table says so.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import benchmark_overhead as bench

# --replicas and --models (one value each), --micro_batch, --rounds and --steps (here:
# optimizer steps per variant per round, a multiple of each N) are benchmark_overhead's.
FLAGS = flags.FLAGS
flags.DEFINE_list("per_call", ["1", "8"], "Optimizer steps per call (steps_per_execution).")
flags.DEFINE_list("modes", ["estimated", "exact"], "The engine's similarity modes to time.")
flags.DEFINE_bool(
    "stop_variants",
    False,
    "Also time Trainer.fit with rollback='stop' (trainer_MODE_stop_N): the share of the "
    "roll-back's per-step copies.",
)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    per_call = [int(n) for n in FLAGS.per_call]
    if (
        not set(FLAGS.modes) <= {"estimated", "exact"}
        or min(per_call) < 1
        or any(FLAGS.steps % n for n in per_call)
        or len(FLAGS.replicas) != 1
        or len(FLAGS.models) != 1
    ):
        raise app.UsageError(
            "--per_call must be positive integers dividing --steps; one --replicas and one "
            "--models; --modes estimated and/or exact. Received: "
            f"modes={FLAGS.modes}, per_call={FLAGS.per_call}, steps={FLAGS.steps}, "
            f"replicas={FLAGS.replicas}, models={FLAGS.models}"
        )
    replicas, model_kind = int(FLAGS.replicas[0]), FLAGS.models[0]
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas
    )
    import keras

    import tf_adabatch

    build_model, make_dataset, make_loss = bench.build_model, bench.make_dataset, bench.make_loss
    strategy = (
        tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
        if replicas > 1
        else tf.distribute.get_strategy()
    )
    global_micro = replicas * FLAGS.micro_batch
    dataset = make_dataset(global_micro)
    calls: dict[str, tuple] = {}  # name -> (call(), steps per call)

    for n in per_call:
        with strategy.scope():
            stock = build_model(model_kind)
            stock.compile(
                keras.optimizers.SGD(0.01, momentum=0.9), loss=make_loss(), steps_per_execution=n
            )
            stock.optimizer.build(stock.trainable_variables)
        stock.make_train_function()
        iterator = iter(strategy.experimental_distribute_dataset(dataset))
        calls[f"keras_{n}"] = (lambda f=stock.train_function, it=iterator: f(it)["loss"], n)
        plain, plain_iterator, plain_model = bench.make_plain_step(
            strategy, model_kind, dataset, global_micro, steps_per_call=n
        )
        calls[f"plain_{n}"] = (
            lambda f=plain, it=plain_iterator, w=plain_model.trainable_variables[0]: (
                f(it),
                w.value,
            )[1],
            n,
        )
        # One replica's exact mode needs k >= 2 micro-steps: not comparable at k = 1.
        for mode in FLAGS.modes if replicas > 1 else ("estimated",):
            with strategy.scope():
                model = build_model(model_kind)
                model.compile(keras.optimizers.SGD(0.01, momentum=0.9), loss=make_loss())
            model.steps_per_execution = n
            tf_adabatch.attach(model, micro_batch_size=FLAGS.micro_batch, similarity=mode)
            model._adabatch_fit.plan = (n, None)  # what fit's epoch enumeration sets
            iterator = iter(strategy.experimental_distribute_dataset(dataset))
            calls[f"attach_{mode}_{n}"] = (
                lambda f=model.train_function, it=iterator: f(it)["loss"],
                n,
            )
            for rollback in ("copy", "stop") if FLAGS.stop_variants else ("copy",):
                with strategy.scope():
                    model = build_model(model_kind)
                    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
                trainer = tf_adabatch.Trainer(
                    model,
                    loss=make_loss(),
                    optimizer=optimizer,
                    micro_batch_size=FLAGS.micro_batch,
                    similarity=mode,
                    strategy=strategy,
                    rollback=rollback,
                )
                iterator = iter(trainer.distribute(dataset))
                # One `fit` of all the round's steps (its set-up paid once, as in use).
                name = f"trainer_{mode}_{n}" if rollback == "copy" else f"trainer_{mode}_stop_{n}"
                calls[name] = (
                    lambda t=trainer, it=iterator, n=n: t.fit(
                        it, steps=FLAGS.steps, verbose=0, steps_per_execution=n
                    )["loss"],
                    FLAGS.steps,
                )

    failed: dict[str, str] = {}

    def timed(name: str) -> float:
        call, n = calls[name]
        start = time.perf_counter()
        for _ in range(FLAGS.steps // n):
            out = call()
        # Waits for the device (once per round): a loss, or the plain loop's first kernel.
        keras.ops.convert_to_numpy(out if not isinstance(out, list) else out[-1]).ravel()[:1]
        return (time.perf_counter() - start) / FLAGS.steps

    for name in list(calls):  # trace, and drop what cannot run here
        try:
            timed(name)
            timed(name)
        except Exception as error:  # reported below, not hidden
            failed[name] = f"{type(error).__name__}: {str(error).splitlines()[0][:160]}"
            del calls[name]
    per_round: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(FLAGS.rounds):
        for name in list(calls) if r % 2 == 0 else list(reversed(calls)):
            per_round[name].append(timed(name))
    print(
        f"\nmodel: {model_kind}; {replicas} replicas x micro-batch {FLAGS.micro_batch}, k = 1; "
        f"{FLAGS.steps} optimizer steps per variant per round, {FLAGS.rounds} rounds"
    )
    for name, why in failed.items():
        print(f"{name}: does not run here ({why})")
    print(
        "\n| variant | median ms/step | spread (min-max of rounds) | vs stock Keras (paired) "
        "| vs plain loop, same N (paired) |"
    )
    print("|---|---|---|---|---|")

    def paired(times: list[float], base: str) -> str:
        if base not in per_round:
            return "-"
        ratios = [t / b for t, b in zip(times, per_round[base], strict=True)]
        return f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f})"

    for name, times in per_round.items():
        n = int(name.rsplit("_", 1)[1])
        base = f"keras_{n}" if f"keras_{n}" in per_round else "keras_1"
        against = "" if base == f"keras_{n}" else f" (vs {base})"
        print(
            f"| {name} | {1e3 * statistics.median(times):.2f} | "
            f"{1e3 * min(times):.2f}-{1e3 * max(times):.2f} | "
            f"{paired(times, base)}{against} | {paired(times, f'plain_{n}')} |"
        )


if __name__ == "__main__":
    app.run(main)
