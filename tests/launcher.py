"""launch/train.py as subprocesses, for the multi-process tests: one process or several
MultiWorkerMirroredStrategy workers on 127.0.0.1, waiting (bounded), signalling once the
first checkpoint exists, and comparing a finished run with an uninterrupted one.

Output goes to files beside the workdir, not pipes: a pipe nobody reads while waiting can
fill and block the process.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tf_adabatch import summaries
from tf_adabatch.app.checkpoints import checkpoint_numbers

from helpers import checkpoint_values

ROOT = Path(__file__).resolve().parent.parent
HERE = ROOT / "tests"
TIMEOUT_S = 240


def start_workers(
    workdir: Path,
    ports: list[int],
    *,
    placement: Callable[[int], dict[str, str]] | None = None,
    extra_flags: tuple[str, ...] = (),
) -> list[subprocess.Popen]:
    """launch/train.py on the synthetic config as MultiWorkerMirroredStrategy workers.

    `placement(index)`: the environment variables that place worker `index` (default:
    TF_CONFIG over `ports`); `extra_flags` are appended to the command line.
    """
    logs = workdir.parent
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
    procs = []
    for index in range(len(ports)):
        placed = (
            placement(index)
            if placement
            else {
                "TF_CONFIG": json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                )
            }
        )
        env = dict(os.environ, **placed)
        cmd = [
            sys.executable,
            str(ROOT / "launch" / "train.py"),
            f"--config={ROOT / 'configs' / 'synthetic.py'}",
            f"--workdir={workdir}",
            "--config.strategy=multi_worker",
            "--config.deterministic=True",
            "--config.train.base_epochs=1.0",
            "--config.train.checkpoint_every_steps=5",
            *extra_flags,
        ]
        paths = (logs / f"{workdir.name}-{index}.out", logs / f"{workdir.name}-{index}.err")
        with open(paths[0], "w") as out, open(paths[1], "w") as err:
            proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=err, text=True)
        proc.logs = paths  # type: ignore[attr-defined]
        procs.append(proc)
    return procs


def finish(procs: list[subprocess.Popen], timeout: float = TIMEOUT_S) -> list[tuple[int, str, str]]:
    """Waits for every worker (killing all on timeout): [(exit code, stderr, stdout)]."""
    try:
        codes = [p.wait(timeout=timeout) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return [
        (code, p.logs[1].read_text(), p.logs[0].read_text())
        for code, p in zip(codes, procs, strict=True)
    ]


def start(workdir: Path, *flags: str) -> subprocess.Popen:
    """launch/train.py on the synthetic config (2 mirrored replicas) with `flags`."""
    cmd = [
        sys.executable,
        str(ROOT / "launch" / "train.py"),
        f"--config={ROOT / 'configs' / 'synthetic.py'}",
        f"--workdir={workdir}",
        *flags,
    ]
    paths = (workdir.parent / f"{workdir.name}.out", workdir.parent / f"{workdir.name}.err")
    with open(paths[0], "w") as out, open(paths[1], "w") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, text=True, cwd=ROOT)
    proc.logs = paths  # type: ignore[attr-defined]
    return proc


def signal_after_first_checkpoint(proc: subprocess.Popen, ckpts: Path) -> int:
    """SIGTERM once `ckpts` has a checkpoint; returns the newest step saved at that time."""
    deadline = time.monotonic() + TIMEOUT_S
    while not (numbers := checkpoint_numbers(str(ckpts))):
        assert proc.poll() is None, "the run ended before its first checkpoint"
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGTERM)
    return numbers[0]


def wait(proc: subprocess.Popen) -> tuple[int, str, str]:
    try:
        code = proc.wait(timeout=TIMEOUT_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, proc.logs[1].read_text(), proc.logs[0].read_text()  # type: ignore[attr-defined]


def assert_same_end(
    full: Path, run: Path, *, extra_saves: int = 0, workers: tuple[Path, ...] = ()
) -> None:
    """`run` ended as the uninterrupted `full`: final checkpoint, batch and gain per step, metrics.

    `extra_saves`: saves `run` made that `full` did not (`save_counter` counts saves, not
    training: a preemption's save is one more, unless a periodic save had just taken
    that step); `workers`: the non-chief workers' output folders, whose metrics must
    match too.
    """
    expected, got = checkpoint_values(full), checkpoint_values(run)
    assert set(got) == set(expected)
    counter = "save_counter/.ATTRIBUTES/VARIABLE_VALUE"
    assert got.pop(counter) == expected.pop(counter) + extra_saves
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    full_tb = summaries.read_scalars(str(full / "tensorboard" / "train"))
    run_tb = summaries.read_scalars(str(run / "tensorboard" / "train"))
    for tag in ("adabatch/batch_size", "adabatch/gain"):
        assert run_tb[tag] == full_tb[tag], tag
    full_metrics = json.loads((full / "metrics.json").read_text())
    for outdir in (run, *workers):
        metrics = json.loads((outdir / "metrics.json").read_text())
        assert metrics == {
            **full_metrics,
            "wall_time_s": metrics["wall_time_s"],  # timings differ run to run
            "train_seconds": metrics["train_seconds"],
            "processes": metrics["processes"],  # the resumed run took several
        }
