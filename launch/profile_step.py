r"""Where one optimizer step's time goes: a per-part breakdown from TensorFlow's profiler.

    python launch/profile_step.py --replicas=2 --models=small,cnn --ks=1,4 --micro_batch=32

For each model and k (micro-steps per optimizer step), the variants are built with
launch/benchmark_overhead.py's functions on one `MirroredStrategy` over logical CPUs:

  plain      a plain tf.distribute step over the same examples (one batch of k x the
             micro-batch per replica: gradients -> `apply_gradients`, Keras all-reduces)
  estimated  `AdaptiveEngine.train_step`, estimated similarity
  exact      `AdaptiveEngine.train_step`, exact group similarity

Each variant is warmed up, then `--steps` steps of each are captured, interleaved, with
`tf.profiler.experimental.start/stop` into `--logdir` (open it in TensorBoard's profile
tab to see the trace). The script reads the trace back: the `XSpace` protobuf
(`*.xplane.pb`) the profiler writes, through TensorFlow's own `xplane_pb2`. On the host
plane every executed op is an event named after its node; the engine's ops carry the name
scopes of `tf_adabatch.measure.SCOPES` (micro-step, accumulate, gradient all-reduce,
scalar all-reduce, statistics, apply-or-skip, roll-back, policy), the plain step's ops
Keras's (the optimizer's ops under its name). Each step is a `tf.profiler.experimental.Trace`
region on the calling thread; per part and step the script reports

  wall  the union of the part's op intervals (all threads) inside the step, in ms
  op    the sum of the part's op durations (CPU time spent in its kernels), in ms

and, per variant, `step` (the traced region), `function` (the `tf.function` call as
the executor ran it) and `host` = step - function: what `train_step` spends on the
host around the graph (reading values back with `.numpy()`, timing, building logs).
`other` is the function's wall time no part's ops cover (executor scheduling, loop and
`tf.cond` control flow, ops outside the scopes). The machine is shared: read the parts
as shares of a step, not as absolute times.
"""

from __future__ import annotations

import collections
import glob
import os
import re
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from launch import benchmark_overhead as bo

FLAGS = flags.FLAGS
# --replicas, --models, --micro_batch, --steps and --warmup are benchmark_overhead.py's
# flags (imported with it); here --replicas takes one count.
flags.DEFINE_list("ks", ["1", "4"], "Micro-steps per optimizer step.")
flags.DEFINE_string("logdir", None, "Profiler output directory (default: a temporary one).")
flags.DEFINE_list("variants", ["plain", "estimated", "exact"], "Among plain, estimated, exact.")
FLAGS.set_default("replicas", ["2"])
FLAGS.set_default("steps", 10)
FLAGS.set_default("warmup", 5)

STEP_REGION = "adabatch_profiled_step"
# Parts of the plain step, by the name scopes Keras gives its ops.
PLAIN_PARTS = ("optimizer", "all_reduce")


def replicas() -> int:
    if len(FLAGS.replicas) != 1:
        raise app.UsageError(f"--replicas takes one count here. Received: {FLAGS.replicas}")
    return int(FLAGS.replicas[0])


def engine_parts() -> tuple[str, ...]:
    from tf_adabatch import measure

    return tuple(measure.SCOPES.values())


OP_EVENT = re.compile(r"^[^\s:]+:[A-Za-z0-9_]+$")  # "scope/node:OpType", one per executed op


def part_of(node: str, parts: tuple[str, ...]) -> str | None:
    """The part whose name scope the op's node name carries (the innermost one).

    A scope entered twice in one graph is uniquified by TensorFlow ("scope_1/").
    """
    found, best = None, -1
    for part in parts:
        for match in re.finditer(re.escape(part) + r"(?:_\d+)?/", node):
            if match.start() > best:
                found, best = part, match.start()
    return found


def union_length(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for a, b in sorted(intervals):
        if end is None or a > end:
            total += b - a
            end = b
        elif b > end:
            total += b - end
            end = b
    return total


def read_host_events(logdir: str):
    """Host-plane events as (thread, name, start_ps, end_ps, stats)."""
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb"))
    if len(paths) != 1:
        raise RuntimeError(f"Expected one profile in {logdir}, found {paths}")
    space = xplane_pb2.XSpace()
    with open(paths[0], "rb") as f:
        space.ParseFromString(f.read())
    events = []
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
        for line in plane.lines:
            base_ps = line.timestamp_ns * 1000
            for ev in line.events:
                meta = plane.event_metadata[ev.metadata_id]
                stats = {}
                for st in list(meta.stats) + list(ev.stats):
                    key = stat_names.get(st.metadata_id, str(st.metadata_id))
                    which = st.WhichOneof("value")
                    value = getattr(st, which) if which else None
                    if which == "ref_value":
                        value = plane.stat_metadata[st.ref_value].name
                    stats[key] = value
                start = base_ps + ev.offset_ps
                events.append((line.id, meta.name, start, start + ev.duration_ps, stats))
    return events


def build_variants(strategy, model_kind: str, k: int) -> dict:
    """name -> (step(iterator), iterator), all on `strategy`."""
    unit = replicas() * FLAGS.micro_batch
    variants = {}
    for name in FLAGS.variants:
        if name == "plain":
            step, iterator, _ = bo.make_plain_step(
                strategy, model_kind, bo.make_dataset(k * unit), k * unit
            )
            variants[name] = (step, iterator)
        else:
            trainer = bo.make_trainer(strategy, model_kind, name, FLAGS.micro_batch)
            trainer.engine.set_batch_size(k * unit)
            variants[name] = (
                trainer.engine.train_step,
                iter(trainer.distribute(bo.make_dataset(unit))),
            )
    return variants


def profile(variants: dict, logdir: str) -> None:
    import tensorflow as tf

    for step, iterator in variants.values():
        for _ in range(FLAGS.warmup):
            step(iterator)
    tf.profiler.experimental.start(logdir)
    try:
        for i in range(FLAGS.steps):
            for name, (step, iterator) in variants.items():
                with tf.profiler.experimental.Trace(STEP_REGION, variant=name, step_num=i):
                    out = step(iterator)
                    if out is None:  # the plain step returns nothing; it ran synchronously
                        pass
    finally:
        tf.profiler.experimental.stop()


def breakdown(events, variant: str, parts: tuple[str, ...]) -> dict:
    """{row: (wall ms, op ms)}, medians over the variant's profiled steps.

    `parts`: the name scopes to attribute ops to (empty: the plain step's parts).
    """
    steps = sorted(
        (
            (t, a, b)
            for t, name, a, b, st in events
            if name == STEP_REGION and st.get("variant") == variant
        ),
        key=lambda r: r[1],
    )
    if not steps:
        raise RuntimeError(f"No profiled step of {variant!r} in the trace")
    ops = [e for e in events if OP_EVENT.match(e[1])]
    per_step = collections.defaultdict(list)  # row -> [(wall, op) per step]
    for thread, start, end in steps:
        # The tf.function call as the executor ran it: the longest "__inference" event
        # on the calling thread inside the region.
        calls = [
            e
            for e in events
            if e[0] == thread and start <= e[2] and e[3] <= end and "__inference" in e[1]
        ]
        func = max(calls, key=lambda e: e[3] - e[2]) if calls else None
        fstart, fend = (func[2], func[3]) if func else (start, end)
        intervals = collections.defaultdict(list)
        for e in ops:
            if fstart <= e[2] and e[3] <= fend:
                node = e[1].rsplit(":", 1)[0]
                part = part_of(node, parts) if parts else plain_part(node)
                if part is not None:
                    intervals[part].append((e[2], e[3]))
        rows = {
            "step": (end - start, 0),
            "function": (fend - fstart, 0),
            "host": ((end - start) - (fend - fstart), 0),
        }
        for part, spans in intervals.items():
            rows[part] = (union_length(spans), sum(b - a for a, b in spans))
        covered = union_length([span for spans in intervals.values() for span in spans])
        rows["other"] = ((fend - fstart) - covered, 0)
        for row, value in rows.items():
            per_step[row].append(value)
    return {
        row: (
            statistics.median(w for w, _ in values) / 1e9,  # ps -> ms
            statistics.median(o for _, o in values) / 1e9,
        )
        for row, values in per_step.items()
    }


def plain_part(node: str) -> str | None:
    lowered = node.lower()
    if "collective" in lowered or "allreduce" in lowered or "all_reduce" in lowered:
        return "all_reduce"
    if "sgd" in lowered or "optimizer" in lowered:
        return "optimizer"
    return "forward_backward"


ROWS = (
    ("step", "step (traced region, host included)"),
    ("host", "host round trips (train_step outside the graph)"),
    ("function", "the tf.function call"),
    ("adabatch_micro_step", "micro-step loop: forward/backward"),
    ("adabatch_accumulate", "accumulators"),
    ("adabatch_grad_allreduce", "gradient all-reduce"),
    ("adabatch_scalar_allreduce", "scalar all-reduce"),
    ("adabatch_statistics", "statistics"),
    ("adabatch_apply", "apply-or-skip"),
    ("adabatch_rollback", "roll-back (save, check, restore)"),
    ("adabatch_policy", "policy, counters"),
    ("forward_backward", "plain: forward/backward"),
    ("all_reduce", "plain: gradient all-reduce"),
    ("optimizer", "plain: optimizer apply"),
    ("other", "other (executor, control flow, unscoped)"),
)


def print_table(model_kind: str, k: int, table: dict) -> None:
    variants = list(table)
    print(
        f"\n{model_kind}, {replicas()} replicas, k = {k}, micro-batch {FLAGS.micro_batch}: "
        f"ms per optimizer step, wall (op), median of {FLAGS.steps} profiled steps"
    )
    print("| part | " + " | ".join(variants) + " |")
    print("|---|" + "---|" * len(variants))
    for key, label in ROWS:
        if not any(key in table[v] for v in variants):
            continue
        cells = []
        for v in variants:
            if key not in table[v]:
                cells.append("")
                continue
            wall, op = table[v][key]
            cells.append(f"{wall:.2f} ({op:.2f})" if op else f"{wall:.2f}")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


def main(argv) -> None:
    if len(argv) > 1:
        raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * replicas()
    )
    # One strategy per process (a second one over the same devices collides).
    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(replicas())])
    root = FLAGS.logdir or tempfile.mkdtemp(prefix="adabatch-profile-")
    started = time.perf_counter()
    for model_kind in FLAGS.models:
        for k in (int(k) for k in FLAGS.ks):
            variants = build_variants(strategy, model_kind, k)
            logdir = os.path.join(root, f"{model_kind}_k{k}")
            profile(variants, logdir)
            events = read_host_events(logdir)
            table = {
                name: breakdown(events, name, () if name == "plain" else engine_parts())
                for name in variants
            }
            print_table(model_kind, k, table)
    print(
        f"\nprofiles in {root} (TensorBoard: tensorboard --logdir {root}); "
        f"{time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    app.run(main)
