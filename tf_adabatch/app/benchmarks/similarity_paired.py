r"""Exact against estimated similarity on the same gradients: a paired measurement.

The logic of `launch/similarity_paired.py`, whose flags are the fields of `Options`:

    python launch/similarity_paired.py --outdir=workdir/similarity_paired \
        --snapshot_steps=5,60,150,300 --ks=1,2,3,4,5,6 --draws=150 --iterates=5

Two training runs, one per similarity mode, differ in their batch sizes for two reasons:
the modes read the same gradients differently, and the runs then go on to different
weights and data (seed noise: on Fashion-MNIST two seeds of one mode differ by up to 40%
in a tenth of the run's average batch). This measures the first reason alone.

An exact-mode run of --config is taken to each of --snapshot_steps (the launcher,
`python -m tf_adabatch.app`, with `train.max_steps`, resuming its own checkpoints; the run and its kept snapshots are reused
if they are there). The readings vary a lot from one iterate of training to the next, so
--iterates=n --iterate_spacing=d pools the checkpoints of steps S-(n-1)d, ..., S-d, S for
each snapshot step S (the draws split evenly among them). At each, N replicas x k micro-batches drawn from the
training data give the micro-gradients, summed per replica and per group as the engine
does (group A:
micro-gradient i of replica r with i*N + r even), and both modes' readings come from the
SAME gradients through the library's own formulas: exact mode's cosine of the two groups
(`stats.cosine_similarity`) and estimated mode's reading from the replicas' norms
(`stats.replica_similarity`, N >= 2).

Reported per snapshot and batch B = N k m: the two modes' mean and median readings, the
paired mean difference, and the share of readings below the target (what the SimiGrad
controller acts on: a reading below the target grows the batch, else it shrinks, so the
batch settles where that share is about one half), with 95% bootstrap intervals over the
draws (paired: one resample of the draws for both modes; the draws are resampled, not the
checkpoints, so with few checkpoints the intervals leave out how the next checkpoints would
differ). With N = 2 the two readings are
equal draw for draw (a check of the measurement). Gradients are float32 (the engine's);
the products are float64. Runs on one device (no strategy): the replicas are simulated by
the micro-batches' layout, so the snapshot run's replica count is the config's.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from absl import app

from tf_adabatch.app.benchmarks import FlagOptions

__all__ = [
    "Options",
    "follow",
    "group_a_mask",
    "interval",
    "paired_row",
    "settled_batch",
]


@dataclass(frozen=True)
class Options(FlagOptions):
    """The measurement's options: the flags of `launch/similarity_paired.py` but `--config`
    (the config, its file and its overrides are arguments of `run`).

    >>> Options(ks=["1", "2"]).ks
    ('1', '2')
    """

    outdir: str = "workdir/similarity_paired"
    snapshot_steps: tuple[str, ...] = ("5", "60", "150", "300")
    ks: tuple[str, ...] = ("1", "2", "4")
    draws: int = 200
    iterates: int = 1
    iterate_spacing: int = 1
    report_only: bool = False
    bootstrap: int = 2000
    seed: int = 0
    timeout_per_stage: int = 1800


def group_a_mask(num_replicas: int, k: int) -> np.ndarray:
    """[k, N] booleans: micro-gradient i of replica r is in exact mode's group A.

    The engine's rule (`measure.ExactGroups`): (i * N + r) even.

    >>> group_a_mask(2, 2).astype(int).tolist()
    [[1, 0], [1, 0]]
    >>> group_a_mask(3, 2).astype(int).tolist()
    [[1, 0, 1], [0, 1, 0]]
    """
    i, r = np.meshgrid(np.arange(k), np.arange(num_replicas), indexing="ij")
    return (i * num_replicas + r) % 2 == 0


def interval(
    values: np.ndarray, stat: Callable[[np.ndarray], Any], resamples: np.ndarray
) -> tuple[float, float, float]:
    """stat over the draws, and its 95% bootstrap interval (rows of `resamples` index draws).

    >>> v = np.arange(10.0)
    >>> interval(v, np.mean, np.random.default_rng(0).integers(0, 10, (500, 10)))[0]
    4.5
    """
    boot = np.array([stat(values[idx]) for idx in resamples])
    low, high = np.quantile(boot, [0.025, 0.975])
    return float(stat(values)), float(low), float(high)


def train_to(
    options: Options, config_path: str, overrides: Sequence[str], workdir: Path, step: int
) -> Path:
    """The run's checkpoint at `step` (trains, resuming, if it is not kept yet)."""
    kept = workdir / "snapshots" / f"step{step}"
    if (kept / "checkpoint").exists():
        return kept
    command = [
        sys.executable,
        "-m",
        "tf_adabatch.app",
        f"--config={config_path}",
        f"--workdir={workdir / 'run'}",
        *overrides,
        f"--config.train.max_steps={step}",  # last: absl keeps the last value of a flag
    ]
    log = workdir / f"train_to_step{step}.log"
    print(f"Training the exact-mode run to step {step} (its output: {log})", flush=True)
    with open(log, "w") as out:
        done = subprocess.run(
            command, stdout=out, stderr=subprocess.STDOUT, timeout=options.timeout_per_stage
        )
    if done.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(command)} failed (exit {done.returncode}):\n{tail}")
    source = workdir / "run" / "checkpoints"
    files = sorted(source.glob(f"ckpt-{step}.*"))
    if not files:
        raise RuntimeError(
            f"No checkpoint ckpt-{step} in {source} after training to it: the run is past "
            f"step {step} already (a snapshot is kept only when it is asked for before the "
            "run passes it). Use a new --outdir."
        )
    tmp = kept.with_name(kept.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in files:
        shutil.copy2(f, tmp / f.name)
    (tmp / "checkpoint").write_text(f'model_checkpoint_path: "ckpt-{step}"\n')
    tmp.rename(kept)
    return kept


def load_weights(model: Any, snapshot: Path) -> None:
    """The trained weights of the run's checkpoint into `model`.

    The trainer's checkpoint holds the model's variables through the Keras optimizer
    (`optimizer/_trainable_variables/<i>`, in the model's order): a Keras detail, so
    the names, the count and every shape are checked.
    """
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(snapshot))
    shapes = reader.get_variable_to_shape_map()
    key = "optimizer/_trainable_variables/{}/.ATTRIBUTES/VARIABLE_VALUE"
    stored = sum(1 for name in shapes if name.startswith("optimizer/_trainable_variables/"))
    if stored != len(model.trainable_variables):
        raise RuntimeError(
            f"{snapshot}: {stored} stored model variables, the model has "
            f"{len(model.trainable_variables)} (has the checkpoint layout changed?)"
        )
    for i, variable in enumerate(model.trainable_variables):
        value = reader.get_tensor(key.format(i))
        if tuple(value.shape) != tuple(variable.shape):
            raise RuntimeError(f"{snapshot}: variable {i} is {value.shape}, model {variable.shape}")
        variable.assign(value)


def micro_gradients_fn(model: Any) -> Any:
    """A compiled function: micro-batches [M, m, ...] to one flat gradient each, [M, P].

    Built once per model (its variables are reassigned between checkpoints, not replaced),
    so it traces once per micro-batch layout, not once per call.
    """
    import keras
    import tensorflow as tf

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function(reduce_retracing=True)
    def micro_gradients(xb: Any, yb: Any) -> Any:
        def one(args: Any) -> Any:
            with tf.GradientTape() as tape:
                loss = loss_fn(args[1], model(args[0], training=True))
            grads = tape.gradient(loss, model.trainable_variables)
            return tf.concat([tf.reshape(g, [-1]) for g in grads], 0)

        return tf.map_fn(one, (xb, yb), fn_output_signature=tf.float32)

    return micro_gradients


def readings(
    micro_gradients: Any,
    x: np.ndarray,
    y: np.ndarray,
    num_replicas: int,
    k: int,
    micro: int,
    draws: int,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: (exact, estimated) similarity of one batch of N k m examples."""
    from tf_adabatch import stats

    in_a = group_a_mask(num_replicas, k)
    exact, estimated = [], []
    for _ in range(draws):
        idx = rng.choice(len(x), num_replicas * k * micro, replace=False)
        grads = micro_gradients(
            x[idx].reshape(num_replicas * k, micro, *x.shape[1:]),
            y[idx].reshape(num_replicas * k, micro),
        )
        g = grads.numpy().astype(np.float64).reshape(k, num_replicas, -1)
        h = g.sum(0)  # the replicas' sums
        a, b = g[in_a].sum(0), g[~in_a].sum(0)
        norms_sq = np.einsum("rp,rp->r", h, h)
        total = h.sum(0)
        exact.append(float(stats.cosine_similarity(a @ b, a @ a, b @ b)))
        estimated.append(
            float(
                stats.replica_similarity(
                    total @ total, norms_sq.sum(), np.sqrt(norms_sq).sum(), num_replicas
                )
            )
        )
    return np.array(exact), np.array(estimated)


def paired_row(
    exact: np.ndarray, estimated: np.ndarray, target: float, resamples: np.ndarray
) -> dict:
    """The two modes' readings of the same draws, compared (`resamples`: the bootstrap).

    >>> row = paired_row(np.array([0.25, 0.75]), np.array([0.5, 0.75]), 0.5,
    ...                  np.array([[0, 1], [1, 1]]))
    >>> row["exact_below"], row["estimated_below"]
    (0.5, 0.0)
    >>> row["mean_difference"][0], row["below_difference"][0]
    (0.125, -0.5)
    """

    def below(v: np.ndarray) -> float:
        return float(np.mean(v < target))

    both = np.stack([exact, estimated], 1)
    return {
        "draws": len(exact),
        "exact_mean": float(exact.mean()),
        "estimated_mean": float(estimated.mean()),
        "exact_median": float(np.median(exact)),
        "estimated_median": float(np.median(estimated)),
        "exact_below": below(exact),
        "estimated_below": below(estimated),
        "mean_difference": interval(both, lambda v: np.mean(v[:, 1] - v[:, 0]), resamples),
        "below_difference": interval(both, lambda v: below(v[:, 1]) - below(v[:, 0]), resamples),
        "exact": exact.tolist(),
        "estimated": estimated.tolist(),
    }


def settled_batch(moves: dict[int, tuple[int, int]], grow: dict[int, float]) -> tuple[float, float]:
    """Where the SimiGrad controller settles if the weights stood still: the mean batch.

    `moves[B] = (smaller, larger)`: the policy's batch after a reading above and below
    the target; `grow[B]`: the share of readings below the target at B. With moves to
    neighbours only (one micro-step unit each way, as SimiGrad's 10% steps are up to ten
    units), the batch is a birth-death chain whose stationary distribution is
    pi(B_{j+1}) / pi(B_j) = grow_j / (1 - grow_{j+1}); the largest batch measured keeps a
    reading below the target where it is (truncation). Returns the mean batch and the
    stationary mass at that largest batch (large: measure larger batches).

    >>> moves = {128: (128, 256), 256: (128, 384), 384: (256, 384)}
    >>> mean, top = settled_batch(moves, {128: 0.5, 256: 0.5, 384: 0.5})  # pi 1:1:1
    >>> mean, round(top, 3)
    (256.0, 0.333)
    >>> mean, top = settled_batch(moves, {128: 0.5, 256: 0.5, 384: 0.0})  # pi 2:2:1
    >>> round(mean, 6), top
    (230.4, 0.2)
    """
    sizes = sorted(grow)
    if sorted(moves) != sizes:
        raise ValueError(f"moves and grow must cover the same batches: {sorted(moves)}, {sizes}")
    for j, size in enumerate(sizes):
        smaller, larger = moves[size]
        # Down to the neighbour (at the smallest batch: staying, the policy's minimum);
        # up to the neighbour (at the largest measured: anywhere, truncated).
        want_smaller = sizes[j - 1] if j > 0 else size
        if smaller != want_smaller or (j + 1 < len(sizes) and larger != sizes[j + 1]):
            raise ValueError(
                f"the policy moves batch {size} to {moves[size]}, not to measured neighbours"
            )
    weights = [1.0]
    for j in range(1, len(sizes)):
        leave_down = 1.0 - grow[sizes[j]]
        if leave_down <= 0.0:
            raise ValueError(f"Every reading at batch {sizes[j]} grows it: measure larger batches")
        weights.append(weights[-1] * grow[sizes[j - 1]] / leave_down)
    pi = np.array(weights) / sum(weights)
    return float(pi @ np.array(sizes, float)), float(pi[-1])


def follow(
    moves: dict[int, tuple[int, int]],
    grow_at: dict[int, dict[int, float]],
    start: int,
    runs: int,
    rng: np.random.Generator,
) -> np.ndarray:
    """The controller's mean batch at each step 1..last when the readings change in time.

    `grow_at[step][B]`: the share of readings below the target at batch B measured at
    `step`, interpolated linearly between the measured steps (the first snapshot's
    before it). `runs` simulated controllers start at batch `start` and move as
    `moves` says (the largest batch keeps a growing reading where it is). A less noisy
    reading, whose share is further from one half where the batch is off its settling
    point, follows a moving settling point more closely.

    >>> moves = {128: (128, 256), 256: (128, 256)}
    >>> rng = np.random.default_rng(0)
    >>> follow(moves, {1: {128: 1.0, 256: 0.0}, 3: {128: 1.0, 256: 0.0}}, 128, 10, rng).tolist()
    [128.0, 256.0, 128.0]

    Halfway between a step where 256 always shrinks and one where it always grows, half
    the runs shrink: the mean at step 3 is about (128 + 256) / 2.

    >>> path = follow(moves, {1: {128: 1.0, 256: 0.0}, 3: {128: 1.0, 256: 1.0}}, 128, 4000, rng)
    >>> path[:2].tolist(), round(path[2] / 64)
    ([128.0, 256.0], 3)
    """
    steps = sorted(grow_at)
    sizes = sorted(moves)
    index = {b: i for i, b in enumerate(sizes)}
    down = np.array([index[moves[b][0]] for b in sizes])
    up = np.array([index.get(moves[b][1], i) for i, b in enumerate(sizes)])
    table = np.array([[grow_at[s][b] for b in sizes] for s in steps])
    # Each batch's share at every step 1..last, interpolated once (rows: steps).
    every = np.arange(1, steps[-1] + 1)
    grow = np.stack([np.interp(every, steps, table[:, j]) for j in range(len(sizes))], axis=1)
    batch = np.array(sizes, float)
    state = np.full(runs, index[start])
    means = []
    for shares in grow:
        means.append(float(np.mean(batch[state])))
        grows = rng.random(runs) < shares[state]
        state = np.where(grows, up[state], down[state])
    return np.array(means)


def policy_moves(config: Any, unit: int, rows: list[dict]) -> dict[int, tuple[int, int]]:
    """The config's policy's moves (after a reading above, below the target) per batch."""
    from tf_adabatch.app import factories
    from tf_adabatch.policies import StepStats

    policy = factories.make_policy(config)
    policy.build(batch_unit=unit)
    moves = {}
    for size in sorted({r["batch"] for r in rows}):
        above = int(policy.next_batch_size(size, StepStats.make(similarity=1.0)))
        below = int(policy.next_batch_size(size, StepStats.make(similarity=0.0)))
        moves[size] = (above, below)
    return moves


def settling(
    options: Options, rows: list[dict], moves: dict[int, tuple[int, int]], target: float
) -> dict:
    """Per snapshot: where the controller settles on each mode's readings (`settled_batch`),
    the ratio, and its 95% bootstrap interval (the draws resampled per batch, paired)."""
    rng = np.random.default_rng(options.seed + 1)
    snapshots, lines = [], []
    for step in sorted({r["step"] for r in rows}):
        mine = {r["batch"]: r for r in rows if r["step"] == step}
        mine_moves = {b: moves[b] for b in mine}
        share = {
            b: {m: np.asarray(r[m]) < target for m in ("exact", "estimated")}
            for b, r in mine.items()
        }
        try:
            result = {
                m: settled_batch(mine_moves, {b: r[f"{m}_below"] for b, r in mine.items()})
                for m in ("exact", "estimated")
            }
        except ValueError as err:
            lines.append(f"- step {step}: no settling point ({err})")
            continue
        ratios = []
        for _ in range(options.bootstrap):
            picked = {
                b: rng.integers(0, len(v["exact"]), len(v["exact"])) for b, v in share.items()
            }
            try:
                means = [
                    settled_batch(
                        mine_moves, {b: float(v[m][picked[b]].mean()) for b, v in share.items()}
                    )[0]
                    for m in ("exact", "estimated")
                ]
            except ValueError:
                continue  # a resample where every reading at some batch grows it
            ratios.append(means[1] / means[0])
        low, high = np.quantile(ratios, [0.025, 0.975]) if ratios else (np.nan, np.nan)
        (exact, exact_top), (estimated, estimated_top) = result["exact"], result["estimated"]
        snapshots.append(
            {
                "step": step,
                "exact": exact,
                "estimated": estimated,
                "ratio": estimated / exact,
                "interval": [float(low), float(high)],
                "top_mass": [exact_top, estimated_top],
            }
        )
        lines.append(
            f"- step {step}: the controller settles at a mean batch of {exact:.0f} on exact "
            f"readings, {estimated:.0f} on estimated ones: {estimated / exact:.3f} "
            f"({low:.3f} to {high:.3f}; mass at the largest batch measured "
            f"{exact_top:.2f}, {estimated_top:.2f})"
        )
    header = (
        "\nWhere the SimiGrad controller would settle at each snapshot (weights held still; "
        "`settled_batch`: needs every batch from the smallest up, one unit apart):\n\n"
    )
    return {"snapshots": snapshots, "report": header + "\n".join(lines) + "\n"}


def following(
    options: Options, rows: list[dict], moves: dict[int, tuple[int, int]], start: int
) -> dict:
    """The controller simulated along the run (`follow`), 4,000 runs per mode, from the
    policy's initial batch: mean batch between consecutive snapshot steps, and the ratio."""
    sizes = sorted(moves)
    grow_at: dict[str, dict[int, dict[int, float]]] = {"exact": {}, "estimated": {}}
    for r in rows:  # each row's share of readings below the target (`paired_row`)
        for mode in grow_at:
            grow_at[mode].setdefault(r["step"], {})[r["batch"]] = r[f"{mode}_below"]
    measured = [sorted(g) for g in grow_at["exact"].values()]
    if start not in sizes or any(m != sizes for m in measured):
        note = "every snapshot must measure the same batches, the initial batch among them"
        return {"intervals": [], "report": f"\nNo simulated run ({note}).\n"}
    paths = {
        mode: follow(moves, grow, start, 4000, np.random.default_rng(options.seed + 2))
        for mode, grow in grow_at.items()
    }
    steps = sorted(grow_at["exact"])
    bounds = list(zip([0, *steps[:-1]], steps, strict=True))
    intervals, lines = [], []
    for low, high in bounds:
        exact, estimated = (float(paths[m][low:high].mean()) for m in ("exact", "estimated"))
        intervals.append({"steps": [low + 1, high], "exact": exact, "estimated": estimated})
        lines.append(
            f"- steps {low + 1}-{high}: mean batch {exact:.0f} (exact), {estimated:.0f} "
            f"(estimated): {estimated / exact:.3f}"
        )
    header = (
        "\nThe controller along the run (simulated, 4,000 runs per mode from batch "
        f"{start}; each batch's share of readings below the target interpolated linearly "
        "between the snapshot steps; the shares' own sampling noise is not propagated):\n\n"
    )
    return {"intervals": intervals, "report": header + "\n".join(lines) + "\n"}


def summarise(rows: list[dict], target: float) -> str:
    """The markdown report of the rows' statistics."""
    fmt = lambda s: f"{s[0]:+.4f} ({s[1]:+.4f} to {s[2]:+.4f})"  # noqa: E731
    lines = [
        f"Target similarity {target}; 95% bootstrap intervals over the draws in brackets.",
        "",
        "| step | k | batch | draws | exact mean | estimated mean | estimated - exact (mean) "
        "| exact median | estimated median | share < target: exact | estimated "
        "| estimated - exact (share) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['step']} | {r['k']} | {r['batch']} | {r['draws']} | {r['exact_mean']:.4f} "
            f"| {r['estimated_mean']:.4f} | {fmt(r['mean_difference'])} "
            f"| {r['exact_median']:.4f} | {r['estimated_median']:.4f} "
            f"| {r['exact_below']:.3f} | {r['estimated_below']:.3f} "
            f"| {fmt(r['below_difference'])} |"
        )
    return "\n".join(lines) + "\n"


def measure(
    options: Options,
    config: Any,
    config_path: str,
    overrides: Sequence[str],
    outdir: Path,
    steps: list[int],
    ks: list[int],
    target: float,
) -> list[dict]:
    """Both modes' readings at every snapshot step and k: one `paired_row` each."""
    from tf_adabatch.app.data import pipeline
    from tf_adabatch.app.models import build_model

    num_replicas, micro = int(config.num_cpu_replicas), int(config.micro_batch_size)
    (x, y), _, num_classes = pipeline.load_arrays(config.dataset, seed=config.seed)
    model = build_model(config.model, x.shape[1:], num_classes, seed=config.seed)
    gradients = micro_gradients_fn(model)
    rng = np.random.default_rng(options.seed)
    rows, started = [], time.time()
    iterates = options.iterates
    for step in steps:
        # The readings vary from one iterate of training to the next (|G| along the
        # trajectory): each snapshot step pools `iterates` checkpoints.
        models = []
        for back in reversed(range(iterates)):
            at = step - back * options.iterate_spacing
            load_weights(model, train_to(options, config_path, overrides, outdir, at))
            models.append([v.numpy() for v in model.trainable_variables])
        for k in ks:
            parts = []
            for i, weights in enumerate(models):
                for variable, value in zip(model.trainable_variables, weights, strict=True):
                    variable.assign(value)
                share = options.draws // iterates + (i < options.draws % iterates)
                parts.append(readings(gradients, x, y, num_replicas, k, micro, share, rng))
            exact = np.concatenate([p[0] for p in parts])
            estimated = np.concatenate([p[1] for p in parts])
            resamples = rng.integers(0, len(exact), (options.bootstrap, len(exact)))
            rows.append(paired_row(exact, estimated, target, resamples))
            rows[-1].update(step=step, k=k, batch=num_replicas * k * micro)
            r = rows[-1]
            print(
                f"step {step} k {k} (batch {r['batch']}): exact {r['exact_mean']:.4f}, "
                f"estimated {r['estimated_mean']:.4f}; below {target}: "
                f"{r['exact_below']:.3f} vs {r['estimated_below']:.3f} "
                f"({time.time() - started:.0f} s)",
                flush=True,
            )
    return rows


def run(options: Options, config: Any, config_path: str, overrides: Sequence[str]) -> None:
    """Measures (or with `report_only` reads back) the rows, then writes and prints the report.

    Args:
      options: the script's flags.
      config: the exact-mode run's config (a `ConfigDict`, overrides applied).
      config_path: its file, for the snapshot run.
      overrides: the `--config.FIELD=VALUE` arguments, passed on to the snapshot run.

    Raises:
      absl.app.UsageError: a config or flag the measurement cannot use (named).
      RuntimeError: a snapshot run that failed, or a checkpoint it did not keep.
    """
    if config.similarity != "exact":
        raise app.UsageError("The snapshot run is exact mode: leave config.similarity exact.")
    num_replicas, micro = int(config.num_cpu_replicas), int(config.micro_batch_size)
    if num_replicas < 2:
        raise app.UsageError(
            f"Estimated mode pairs replicas: config.num_cpu_replicas must be >= 2. "
            f"Received: {num_replicas}"
        )
    steps = sorted({int(s) for s in options.snapshot_steps})
    ks = [int(k) for k in options.ks]
    if not steps or not ks or min(ks) < 1 or options.iterates < 1:
        raise app.UsageError(
            "--snapshot_steps, --ks and --iterates must be positive integers. "
            f"Received: {list(options.snapshot_steps)}, {list(options.ks)}, {options.iterates}"
        )
    span = (options.iterates - 1) * options.iterate_spacing
    if options.iterate_spacing < 1 or steps[0] - span < 1 or options.draws < 2 * options.iterates:
        raise app.UsageError(
            "Each snapshot step S pools steps S-(n-1)d, ..., S (n = --iterates, d = "
            "--iterate_spacing >= 1): S-(n-1)d >= 1, and --draws >= 2n. Received: "
            f"snapshot_steps={list(options.snapshot_steps)}, iterates={options.iterates}, "
            f"iterate_spacing={options.iterate_spacing}, draws={options.draws}"
        )
    outdir = Path(options.outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    target = float(config.policy.target_similarity)
    if options.report_only:
        rows = json.loads((outdir / "results.json").read_text())["rows"]
    else:
        rows = measure(options, config, config_path, overrides, outdir, steps, ks, target)
    moves = policy_moves(config, num_replicas * micro, rows)
    settled = settling(options, rows, moves, target)
    followed = following(options, rows, moves, int(config.policy.initial_batch_size))
    report = summarise(rows, target) + settled["report"] + followed["report"]
    (outdir / "results.md").write_text(report)
    (outdir / "results.json").write_text(
        json.dumps(
            {
                "target": target,
                "rows": rows,
                "settled": settled["snapshots"],
                "followed": followed["intervals"],
            }
        )
    )
    print(report)
    print(f"Written: {outdir / 'results.md'}, {outdir / 'results.json'}")
