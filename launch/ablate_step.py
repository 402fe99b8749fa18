r"""What is left of the adaptive step's fixed cost: the engine with parts removed, timed side by side.

    python launch/ablate_step.py --replicas=2 --models=small --rounds=40 --steps=15 \
        --ablations=k1_branches,rollback,k1_branches+rollback

A development benchmark for issue 16 (docs/step_cost.md). Beside the plain tf.distribute
step of `launch/benchmark_overhead.py` and the unchanged engine (`engine`), each
ablation builds one more engine with parts of its step removed before its first trace,
and all of them run in interleaved rounds in one process (one `MirroredStrategy`), so a
noisy machine slows them alike. An ablated engine computes WRONG results: it exists to
show how much time a part costs, i.e. how far removing it would bring the ratio to the
plain step. Ablations (join several with '+'):

  k1_branches  the last micro-step's two `tf.cond`s (add the earlier micro-steps' sums;
               the replica's squared norm over them) replaced by their k = 1 side
               (wrong for k > 1; the benchmark runs k = 1)
  rollback     the roll-back's per-step copies, finiteness check and restores
               (`benchmark_overhead.disable_rollback`)

Prints, for each variant, the median step time, its ratio to the plain step's median,
the median of the per-round paired ratios, the ratio of the fastest deciles (this
machine's noise only ever slows a round down), and the ops of its traced step, all
of them and the branches (`If`, `StatelessIf`): the proof that an ablation took effect.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
import types

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import benchmark_overhead as bench

# --replicas, --models (one value each), --micro_batch, --rounds, --steps and --warmup
# are benchmark_overhead's flags.
FLAGS = flags.FLAGS
flags.DEFINE_enum("similarity", "estimated", ["estimated", "exact"], "The engines' mode.")
flags.DEFINE_list("ablations", ["k1_branches", "rollback"], "Variants, parts joined by '+'.")


def without_k1_branches(engine) -> None:
    """The last micro-step without its branches, as with k = 1 (timing only)."""
    from tf_adabatch.measure import micro_scalars

    def last_micro_step(self, data, micro_index):
        del micro_index  # k = 1: no earlier micro-steps
        grads, data_loss = self._gradients_fn(data)
        scalars = micro_scalars(grads, data_loss)
        local_sq = scalars[0] if self.measurement.uses_replica_norms else None
        return self.measurement.reduce(list(grads), scalars, local_sq)

    if not engine.measurement.fuses_last_micro_step:
        raise app.UsageError("k1_branches needs a measurement that fuses the last micro-step")
    engine._last_fn = types.MethodType(last_micro_step, engine)


ABLATIONS = {"k1_branches": without_k1_branches, "rollback": bench.disable_rollback}


def count_ops(function, iterator) -> tuple[int, int]:
    """(all ops, `If` and `StatelessIf` ops) of the traced graph of `function(iterator)`
    (a `tf.function` that has already run on it; the branches' own ops not counted)."""
    ops = function.get_concrete_function(iterator).graph.get_operations()
    return len(ops), sum(op.type in ("If", "StatelessIf") for op in ops)


def measure(variants: list[str]) -> tuple[dict[str, list[float]], dict[str, tuple[int, int]]]:
    import numpy as np
    import tensorflow as tf

    replicas, micro, kind = int(FLAGS.replicas[0]), FLAGS.micro_batch, FLAGS.models[0]
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas)])
    dataset = bench.make_dataset(replicas * micro)
    plain, plain_iterator, model = bench.make_plain_step(strategy, kind, dataset, replicas * micro)
    steps = {"plain": (plain, plain_iterator)}
    traced = {"plain": plain}
    for variant in variants:
        trainer = bench.make_trainer(strategy, kind, FLAGS.similarity, micro)
        for part in variant.split("+") if variant != "engine" else []:
            ABLATIONS[part](trainer.engine)
        steps[variant] = (trainer.engine.train_step, iter(trainer.distribute(dataset)))
        traced[variant] = trainer.engine._step_fn
    weight = model.trainable_variables[0]

    def timed(name: str, count: int) -> float:
        fn, iterator = steps[name]
        start = time.perf_counter()
        for _ in range(count):
            out = fn(iterator)
        np.asarray(weight if name == "plain" else out["loss"])  # wait for the device
        return (time.perf_counter() - start) / count

    for name in steps:
        timed(name, FLAGS.warmup)
    per_round: dict[str, list[float]] = {name: [] for name in steps}
    for r in range(FLAGS.rounds):
        for name in list(steps) if r % 2 == 0 else list(reversed(steps)):
            per_round[name].append(timed(name, FLAGS.steps))
    ops = {name: count_ops(traced[name], steps[name][1]) for name in steps}
    return per_round, ops


def report(per_round: dict[str, list[float]], ops: dict[str, tuple[int, int]]) -> list[str]:
    """Markdown rows: median ms, ratio of medians, paired median ratio, fastest-decile
    ratio, ops and branch ops.

    >>> report({"plain": [1.0, 2.0, 1.0], "engine": [1.5, 2.0, 1.2]},
    ...        {"plain": (90, 0), "engine": (400, 7)})[3]
    '| engine | 1500.00 | 1.500 | 1.200 | 1.200 | 400 | 7 |'
    """
    plain = per_round["plain"]
    decile = len(plain) // 10

    def fast(times: list[float]) -> float:
        return sorted(times)[decile]

    lines = [
        "| variant | median ms/step | ratio to plain | paired per round | fastest decile "
        "| ops | branch ops |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, times in per_round.items():
        paired = statistics.median(t / p for t, p in zip(times, plain, strict=True))
        lines.append(
            f"| {name} | {1e3 * statistics.median(times):.2f} "
            f"| {statistics.median(times) / statistics.median(plain):.3f} "
            f"| {paired:.3f} | {fast(times) / fast(plain):.3f} | {ops[name][0]} | {ops[name][1]} |"
        )
    return lines


def main(argv: list[str]) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    unknown = {p for v in FLAGS.ablations for p in v.split("+")} - set(ABLATIONS)
    one = len(FLAGS.replicas) == 1 and len(FLAGS.models) == 1
    if unknown or not one or int(FLAGS.replicas[0]) < 2 or FLAGS.models[0] not in ("small", "cnn"):
        raise app.UsageError(
            f"--ablations must be made of {sorted(ABLATIONS)} joined by '+'; --replicas one "
            "count >= 2; --models one of small, cnn. Received: "
            f"--ablations={','.join(FLAGS.ablations)} --replicas={','.join(FLAGS.replicas)} "
            f"--models={','.join(FLAGS.models)}"
        )
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * int(FLAGS.replicas[0])
    )
    per_round, ops = measure(["engine", *FLAGS.ablations])
    print(
        f"\n{FLAGS.models[0]} model, {FLAGS.replicas[0]} replicas x micro-batch {FLAGS.micro_batch}, "
        f"{FLAGS.similarity} similarity, k = 1; {FLAGS.rounds} rounds of {FLAGS.steps} steps:\n"
    )
    print("\n".join(report(per_round, ops)))


if __name__ == "__main__":
    app.run(main)
