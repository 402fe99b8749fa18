"""Resuming a launcher run on another topology (issue 14): 1 -> 4 -> 2 -> 3 -> 1 replicas,
2 workers -> 1.

Each mirrored segment is a separate process (a process cannot change its logical devices,
and a second MirroredStrategy over the same devices in one process crashes): replicas
through tests/resume_worker.py (`tf_adabatch.app.run`, as launch/train.py calls it),
workers through launch/train.py itself (tests/launcher.py's `start_workers`). One-device
segments run `app.run` in this process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
from test_checkpoints import config

from launch.multiworker import free_ports
from tf_adabatch import app, summaries

from helpers import checkpoint_values
from launcher import finish, start_workers

HERE = Path(__file__).resolve().parent
SYNTHETIC = str(HERE.parent / "configs" / "synthetic.py")
TIMEOUT_S = 240

# A global batch of 96 = 1 x 8 x 12 = 4 x 8 x 3 = 2 x 8 x 6 = 3 x 8 x 4: reachable on 1,
# 4, 2 and 3 replicas of micro-batch 8. It is also the base batch, so AdaScale's scale
# S = 1 and its gain is 1 whatever the statistics (which do depend on the replica count):
# the learning rate, hence the trajectory, depends on the data alone.
M, BATCH = 8, 96
SEGMENTS = ((1, 2), (4, 4), (2, 6), (3, 8), (1, 10))  # (replicas, run until this step)


def overrides(replicas: int, max_steps: int) -> dict:
    """The synthetic config with a static batch of 96 on `replicas` replicas of 8 examples,
    estimated similarity: on one replica its differenced estimator carries the previous
    gradient in checkpoints, which a run on several replicas neither writes nor reads."""
    return {
        "similarity": "estimated",
        "num_cpu_replicas": replicas,
        "micro_batch_size": M,
        "base_batch_size": BATCH,
        "policy.kind": "static",
        "policy.initial_batch_size": BATCH,
        "train.base_epochs": 1.0,
        "train.max_steps": max_steps,
        "train.checkpoint_every_steps": 3,
        "train.eval_every_base_epochs": 100.0,  # the final evaluation only
    }


def run_app(workdir: Path, replicas: int, max_steps: int) -> str:
    """`app.run` on `replicas` mirrored replicas in a subprocess (deterministic ops): stdout."""
    proc = subprocess.run(
        [
            sys.executable,
            str(HERE / "resume_worker.py"),
            SYNTHETIC,
            str(workdir),
            "0",
            json.dumps({**overrides(replicas, max_steps), "deterministic": True}),
        ],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def per_step(workdir: Path, tag: str) -> dict[int, float]:
    return dict(summaries.read_scalars(str(workdir / "tensorboard" / "train"))[f"adabatch/{tag}"])


def one_device(workdir: Path, max_steps: int, capsys) -> str:
    """`app.run` on one device in this process: stdout."""
    capsys.readouterr()
    app.run(config(**overrides(1, max_steps), strategy="one_device"), str(workdir), verbose=1)
    return capsys.readouterr().out


def test_one_four_two_three_one_replicas_keep_the_batch_and_the_trajectory(
    tmp_path: Path, capsys
) -> None:
    # The uninterrupted run, in this process on one device (k = 12): see below.
    full = tmp_path / "full"
    one_device(full, SEGMENTS[-1][1], capsys)
    run = tmp_path / "run"
    previous_replicas, done = None, 0
    carries = []  # does each segment's last checkpoint hold a previous gradient?
    for replicas, until in SEGMENTS:
        out = one_device(run, until, capsys) if replicas == 1 else run_app(run, replicas, until)
        carries.append(any(k.startswith("carried/") for k in checkpoint_values(run)))
        if previous_replicas is None:
            assert "Resumed from" not in out
        else:
            assert f"Resumed from {run / 'checkpoints' / f'ckpt-{done}'}: step {done}," in out
            # The one-line carry-over: the unit changed, the global batch did not; back on
            # one replica the differenced estimator starts over (the checkpoint, written on
            # 3, has no previous gradient: it restores all the same).
            unit, saved = replicas * M, previous_replicas * M
            carried = [line for line in out.splitlines() if line.startswith("Resumed on")]
            restart = " The differenced estimator starts over (no previous gradient)."
            assert carried == [
                f"Resumed on a batch unit of {unit} (replicas x micro-batch; it was {saved}): "
                f"global batch {BATCH} kept (k = {BATCH // unit})." + (restart if unit == M else "")
            ], out[-2000:]
        previous_replicas, done = replicas, until
    # The one-replica segments wrote the previous gradient; the others did not.
    assert carries == [True, False, False, False, True]

    steps = range(1, SEGMENTS[-1][1] + 1)
    batch = per_step(run, "batch_size")
    assert [batch[s] for s in steps] == [BATCH] * len(steps)  # 4 replicas' k = 3 would give
    # 48 on 2 replicas and 72 on 3 if k were restored as is; 3's k = 4 gives 32 on one.
    k = per_step(run, "accumulation_steps")
    assert [k[s] for s in steps] == [12] * 2 + [3] * 2 + [6] * 2 + [4] * 2 + [12] * 2
    # Examples seen continue across the resumes: 96 per step, no step lost or repeated.
    seen = per_step(run, "samples_seen")
    assert [seen[s] for s in steps] == [BATCH * s for s in steps]
    # Progress tau is monotone, and here (gain 1 at S = 1) exactly one per step.
    tau = per_step(run, "progress")
    np.testing.assert_allclose([tau[s] for s in steps], list(steps), rtol=1e-6)

    # The same examples in the same order reach every step (one input pipeline; step t
    # takes micro-batches 12(t-1) .. 12t-1 of the same seeded stream on any replica
    # count, one device included), so the trajectory is the uninterrupted run's up to
    # float32 rounding: not bit-identical, because the gradient of a step is summed over
    # 12 micro-batches in another grouping and order (k micro-steps on each of 4, 2 or 3
    # replicas, then the all-reduce; 12 micro-steps on one device). Measured here: at
    # most 3e-8 on weights of order 0.1-0.4 after 9 steps (4 -> 2 -> 3 replicas, an
    # earlier version of this test); the tolerance is 1e-6.
    expected, got = checkpoint_values(full), checkpoint_values(run)
    compared = [n for n in expected if n.startswith(("model/", "optimizer/"))]
    assert len(compared) >= 6, sorted(expected)  # weights, biases and their momenta
    for name in compared:
        np.testing.assert_allclose(got[name], expected[name], rtol=0, atol=1e-6, err_msg=name)
    lr_full, lr_run = per_step(full, "learning_rate"), per_step(run, "learning_rate")
    np.testing.assert_allclose([lr_run[s] for s in steps], [lr_full[s] for s in steps])


def test_two_workers_then_one_process_keep_the_batch(tmp_path: Path, capsys) -> None:
    """A 2-worker run (1 replica each, micro-batch 16, static batch 32: k = 1) resumed by
    one process on one device (unit 16: k = 2). Not compared with an uninterrupted run:
    each worker's input pipeline shuffles its own half of the data, one process shuffles
    all of it and skips as many examples, so the examples after the resume are another
    draw (within this epoch some repeat, others are left out), not the continuation."""
    run = tmp_path / "run"
    static = ("--config.policy.kind=static", "--config.policy.initial_batch_size=32")
    for code, err, _ in finish(
        start_workers(run, free_ports(2), extra_flags=(*static, "--config.train.max_steps=4"))
    ):
        assert code == 0, err[-3000:]
    assert (run / "worker-1").is_dir()  # two workers ran (worker 1 saved on its own)
    saved = checkpoint_values(run)
    unit_key = next(n for n in saved if n.startswith("adabatch/batch_unit/"))
    assert int(saved[unit_key]) == 2 * 16

    # The single process: `app.run` in this process, as launch/train.py calls it.
    single = config(
        **{
            "deterministic": False,  # process-wide; ops on one CPU device are repeatable anyway
            "policy.kind": "static",
            "policy.initial_batch_size": 32,
            "train.base_epochs": 1.0,
            "train.checkpoint_every_steps": 5,
            "train.max_steps": 8,
        }
    )
    capsys.readouterr()
    app.run(single, str(run), verbose=1)
    out, err = capsys.readouterr()
    assert f"Resumed from {run / 'checkpoints' / 'ckpt-4'}: step 4," in out
    assert (
        "Resumed on a batch unit of 16 (replicas x micro-batch; it was 32): "
        "global batch 32 kept (k = 2)." in out
    ), out[-2000:]
    steps = range(1, 9)
    batch, k = per_step(run, "batch_size"), per_step(run, "accumulation_steps")
    assert [batch[s] for s in steps] == [32] * 8
    assert [k[s] for s in steps] == [1] * 4 + [2] * 4
    seen = per_step(run, "samples_seen")
    assert [seen[s] for s in steps] == [32 * s for s in steps]
    # Progress tau: one per step (static batch 32 = the base batch: S = 1, gain 1),
    # carried over at the resume.
    tau = per_step(run, "progress")
    np.testing.assert_allclose([tau[s] for s in steps], list(steps), rtol=1e-6)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["optimizer_steps"], metrics["examples_seen"], metrics["replicas"]) == (
        8,
        256,
        1,
    )
    assert not re.search(r"^warning:", err, flags=re.M), err[-2000:]
