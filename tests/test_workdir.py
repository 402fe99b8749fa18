"""The second day on the launcher: one run per workdir, records that survive resumes,
diverged runs, Ctrl-C, and writes that fail with one line.

Written as the user's command lines (`launch/train.py` in a subprocess, the synthetic
config) where the exit code and stderr are the promise, in-process (`app.run`)
otherwise.
"""

from __future__ import annotations

import json
import math
import re
import resource
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tensorflow as tf

import tf_adabatch
from configs import synthetic
from tf_adabatch import app
from tf_adabatch.app.checkpoints import checkpoint_numbers
from tf_adabatch.app.preemption import PreemptionWatch
from tf_adabatch.app.workdir import LOCK_FILE

from launcher import ROOT, TIMEOUT_S, start, wait

FLAGS = (
    "--config.deterministic=True",
    "--config.train.base_epochs=3.0",  # about 75 optimizer steps
    "--config.train.checkpoint_every_steps=4",
)


def config(**overrides):
    c = synthetic.get_config()
    c.strategy = "one_device"
    c.train.eval_every_base_epochs = 100.0  # only the final evaluation
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = c
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return c


def errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


def wait_for(predicate, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while not predicate():
        assert proc.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"no {what} in time"
        time.sleep(0.02)


# ------------------------------------------------------------------ one run per workdir


def test_a_second_launcher_on_a_live_run_exits_2_naming_it_and_the_first_finishes(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    first = start(run, *FLAGS)
    lock = run / LOCK_FILE
    wait_for(lambda: lock.exists() and lock.read_text().strip(), first, "lock record")
    second = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "train.py"),
         f"--config={ROOT / 'configs' / 'synthetic.py'}", f"--workdir={run}", *FLAGS],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
    )  # fmt: skip
    assert second.returncode == 2 and "Traceback" not in second.stderr, second.stderr[-2000:]
    (line,) = errors(second.stderr)
    holder = json.loads(lock.read_text())
    assert holder["pid"] == first.pid and holder["host"] == socket.gethostname()
    assert line.startswith(
        f"error: Argument `workdir` is in use by another run: pid {first.pid} on "
        f"{socket.gethostname()} since {holder['started']}"
    ), line
    code, err, _ = wait(first)
    assert code == 0, err[-3000:]  # unharmed
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["processes"] == 1 and metrics["optimizer_steps"] > 20

    # A rerun of the finished job: the lock is free again, and its records stay or grow.
    code, err, _out = wait(start(run, *FLAGS))
    assert code == 0, err[-3000:]
    again = json.loads((run / "metrics.json").read_text())
    assert again["optimizer_steps"] == metrics["optimizer_steps"]
    assert again["train_seconds"] >= metrics["train_seconds"]
    assert again["wall_time_s"] >= metrics["wall_time_s"]


def test_the_records_accumulate_over_kills(tmp_path: Path) -> None:
    """3 SIGKILLs (each after a new checkpoint), then a rerun to the end. The killed
    processes' time up to their last save is in the checkpoints' records, so the final
    `train_seconds` is not the last process's share alone (what it was: 5.2 s against
    10.8 s after 10 kills) and cannot exceed the time the processes lived."""
    code, err, _ = wait(start(tmp_path / "full", *FLAGS))
    assert code == 0, err[-3000:]
    full = json.loads((tmp_path / "full" / "metrics.json").read_text())

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    lifetimes, recorded = [], []
    for target in (16, 36, 56):  # of about 75 steps: the last process trains ~20
        began = time.monotonic()
        proc = start(run, *FLAGS)
        wait_for(lambda t=target: (checkpoint_numbers(str(ckpts)) or [0])[0] >= t, proc, "ckpt")
        proc.kill()
        proc.wait(timeout=TIMEOUT_S)
        lifetimes.append(time.monotonic() - began)
        newest = tf.train.latest_checkpoint(str(ckpts))
        reader = tf.train.load_checkpoint(newest)
        recorded.append(
            (
                float(reader.get_tensor("run/train_seconds/.ATTRIBUTES/VARIABLE_VALUE")),
                int(reader.get_tensor("run/processes/.ATTRIBUTES/VARIABLE_VALUE")),
            )
        )
    began = time.monotonic()
    code, err, _ = wait(start(run, *FLAGS))
    lifetimes.append(time.monotonic() - began)
    assert code == 0, err[-3000:]
    metrics = json.loads((run / "metrics.json").read_text())
    assert [n for _, n in recorded] == [1, 2, 3] and metrics["processes"] == 4
    seconds = [s for s, _ in recorded] + [metrics["train_seconds"]]
    assert seconds == sorted(seconds) and seconds[0] > 0, seconds  # accumulating
    assert metrics["optimizer_steps"] == full["optimizer_steps"]
    assert metrics["train_seconds"] >= 0.9 * full["train_seconds"], (metrics, full)
    assert metrics["train_seconds"] <= sum(lifetimes), (metrics, lifetimes)
    assert metrics["wall_time_s"] >= metrics["train_seconds"]


# ------------------------------------------------------------------ diverged runs


def diverging(**overrides):
    """Learning rate 1e6: the loss explodes within a few steps, then every gradient
    overflows (non-finite steps are skipped)."""
    return config(
        **{
            "policy.kind": "static",
            "lr.rule": "none",
            "optimizer.learning_rate": 1e6,
            "train.checkpoint_every_steps": 1,
            **overrides,
        }
    )


def test_a_resume_that_diverges_leaves_the_good_checkpoint_for_a_sane_rerun(
    tmp_path: Path, capsys
) -> None:
    """The user resumes a healthy run with a learning rate 60 times too large: the
    loss explodes within a few steps. The checkpoint written on the way (its weights'
    loss already worse than early training) is set aside (kept, renamed), none is
    written while the loss explodes, and the run ends as diverged naming the newest
    checkpoint left, the healthy run's, which a rerun at the sane rate resumes from."""
    sane = {"optimizer.learning_rate": 0.05, "train.checkpoint_every_steps": 4}
    app.run(diverging(**sane, **{"train.max_steps": 8}), str(tmp_path), verbose=0)
    ckpts = tmp_path / "checkpoints"
    assert checkpoint_numbers(str(ckpts)) == [8, 4]
    capsys.readouterr()
    with pytest.raises(app.Diverged, match=r"its training loss exploded") as info:
        app.run(
            diverging(**{**sane, "optimizer.learning_rate": 3.0, "train.max_steps": 40}),
            str(tmp_path),
            verbose=0,
        )
    assert checkpoint_numbers(str(ckpts))[0] == 8
    assert "A rerun of this workdir resumes from ckpt-8, the newest checkpoint left" in str(
        info.value
    )
    aside = sorted(int(p.name.split(".")[0][5:]) for p in ckpts.glob("ckpt-*.diverged-*.index"))
    assert aside and all(step > 8 for step in aside), aside
    warned = capsys.readouterr().err
    assert warned.count("warning: the training loss right after ckpt-") == len(aside), warned
    # The user's fix: the sane learning rate, the same workdir. It resumes and finishes.
    metrics = app.run(diverging(**sane, **{"train.max_steps": 40}), str(tmp_path), verbose=1)
    assert f"Resumed from {ckpts / 'ckpt-8'}:" in capsys.readouterr().out
    # Counted from ckpt-8's record: the diverged process's records went aside with it.
    assert math.isfinite(metrics["test_loss"]) and metrics["processes"] == 2


def test_a_run_that_explodes_at_once_leaves_no_checkpoint_to_resume(tmp_path: Path) -> None:
    """Learning rate 1e6 explodes with the first update: the one checkpoint is set
    aside, the error says a rerun starts over, and one at a sane rate does."""
    with pytest.raises(tf_adabatch.NonFiniteGradientsError) as info:
        app.run(diverging(**{"train.max_consecutive_skips": 3}), str(tmp_path), verbose=0)
    assert "a rerun of this workdir starts over from step 0" in str(info.value)
    assert checkpoint_numbers(str(tmp_path / "checkpoints")) == []
    metrics = app.run(
        diverging(**{"optimizer.learning_rate": 0.05, "train.max_steps": 8}),
        str(tmp_path),
        verbose=0,
    )
    assert math.isfinite(metrics["test_loss"]) and metrics["optimizer_steps"] == 8


def test_after_an_exploding_update_the_error_says_what_a_rerun_at_a_sane_rate_does(
    tmp_path: Path, capsys
) -> None:
    """Issue 42: learning rate 1e30 (the synthetic config's own policy and rule): the
    first update is finite but enormous, its checkpoint is written, and the next steps'
    updates are not finite (skipped) until the run stops. The checkpoint holds the
    exploded weights: the error must not recommend it. Whatever the error says a rerun
    does (resume from ckpt-N, or start over), the rerun at 0.05 does exactly that and
    finishes with a finite test loss."""
    c = {"train.checkpoint_every_steps": 1, "train.max_consecutive_skips": 5}
    with pytest.raises(tf_adabatch.NonFiniteGradientsError) as info:
        app.run(config(**c, **{"optimizer.learning_rate": 1e30}), str(tmp_path), verbose=0)
    message = str(info.value)
    resumes = re.search(r"A rerun of this workdir resumes from (ckpt-\d+)", message)
    starts_over = "a rerun of this workdir starts over from step 0" in message
    assert bool(resumes) != starts_over, message
    ckpts = tmp_path / "checkpoints"
    aside = sorted(p.name for p in ckpts.glob("ckpt-*.diverged-*.index"))
    assert aside, (message, sorted(p.name for p in ckpts.iterdir()))
    capsys.readouterr()
    metrics = app.run(
        config(**c, **{"optimizer.learning_rate": 0.05, "train.max_steps": 8}),
        str(tmp_path),
        verbose=1,
    )
    out = capsys.readouterr().out
    if resumes:
        assert f"Resumed from {ckpts / resumes.group(1)}:" in out, out
    else:
        assert "Resumed from" not in out, out
    assert math.isfinite(metrics["test_loss"]) and metrics["optimizer_steps"] == 8


def test_a_run_whose_steps_are_all_skipped_does_not_end_as_a_success(tmp_path: Path) -> None:
    """With `max_consecutive_skips=None` nothing stops the skipping: the run reaches its
    budget with its last steps skipped, which is divergence, not success (the loss guard
    off, so that this rule alone decides)."""
    with pytest.raises(app.Diverged, match=r"The run diverged: its last \d+ steps were skipped"):
        app.run(
            diverging(
                **{
                    "train.max_consecutive_skips": None,
                    "train.max_steps": 12,
                    "train.divergence_factor": None,
                }
            ),
            str(tmp_path),
            verbose=0,
        )
    assert not (tmp_path / "metrics.json").exists()


def test_a_checkpoint_whose_weights_explode_is_set_aside_at_once_while_the_run_goes_on() -> None:
    """The guard's promise (docs/reliability.md): a checkpoint is judged by the loss of
    the weights it holds, the next step's; if that loss explodes, the checkpoint is set
    aside right then, before the run stops or is killed, so a rerun never resumes from
    it. Losses by hand, factor 10: windows of means 1.5 (the first), 0.3 and 0.2 (the
    best); 1.2 is below the first window's mean: kept; 80 is above 1.5 and above
    10 x 0.2 = 2: exploding."""
    from tf_adabatch.app.records import DivergenceGuard, RunRecord

    aside: list[tuple[int, float]] = []
    guard = DivergenceGuard(
        RunRecord({}), factor=10.0, set_aside=lambda step, loss: aside.append((step, loss))
    )
    for window, checkpoint in (((2.0, 1.0), 2), ((0.5, 0.1), 4)):
        for loss in window:
            guard.observe(loss)
        assert guard.save_point()
        guard.saved(checkpoint)
    guard.observe(0.2)  # ckpt-4's weights are fine
    assert aside == [] and guard.save_point()
    guard.saved(6)
    guard.observe(1.2)  # ckpt-6: 6x the best window, but better than the first: kept
    assert aside == [] and guard.save_point()
    guard.saved(8)
    guard.observe(80.0)  # ckpt-8's weights explode: aside at once, and no save now
    assert aside == [(8, 80.0)] and not guard.save_point()


def test_the_divergence_guard_needs_a_factor_above_one() -> None:
    with pytest.raises(
        app.ConfigError, match=r"`train.divergence_factor` must be a finite number > 1"
    ):
        app.validate_config(config(**{"train.divergence_factor": 0.5}))
    app.validate_config(config(**{"train.divergence_factor": None}))  # the guard off


# ------------------------------------------------------------------ Ctrl-C


def test_ctrl_c_saves_at_the_step_boundary_and_a_second_one_quits_at_once(tmp_path: Path) -> None:
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = start(run, *FLAGS)
    wait_for(lambda: checkpoint_numbers(str(ckpts)), proc, "first checkpoint")
    proc.send_signal(signal.SIGINT)
    code, err, _ = wait(proc)
    assert code == 130 and "Traceback" not in err, err[-3000:]
    saved = checkpoint_numbers(str(ckpts))[0]
    assert f"preempted: checkpoint ckpt-{saved} written at step {saved}" in err
    assert "Ctrl-C again to quit at once" in err

    # The rerun resumes from it.
    code, err, out = wait(start(run, *FLAGS))
    assert code == 0 and f"Resumed from {ckpts / f'ckpt-{saved}'}:" in out, err[-3000:]


def test_a_second_ctrl_c_quits_at_once(capsys) -> None:
    """In process, deterministic: `signal.raise_signal` delivers the Ctrl-C to this
    thread, so its handler runs before the call returns (`os.kill` to the process may be
    delivered to one of TensorFlow's threads, and the handler then runs a little later:
    the likely cause of this test's one failure, in a long-lived process with many
    threads, 2026-12-08). The first asks for the save;
    the second raises KeyboardInterrupt, which launch/train.py turns into one line and
    exit 130."""
    watch = PreemptionWatch()
    try:
        signal.raise_signal(signal.SIGINT)
        assert watch.signalled and watch.signum == signal.SIGINT
        assert "Ctrl-C again to quit at once" in capsys.readouterr().err
        with pytest.raises(KeyboardInterrupt):
            signal.raise_signal(signal.SIGINT)
    finally:
        watch.close()
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    # launch/train.py's line for it (in its own process: its absl flags are global).
    quit_ = subprocess.run(
        [sys.executable, "-c", "from launch import train; train._interrupted()"],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
    )  # fmt: skip
    assert quit_.returncode == 130, quit_.stderr[-2000:]
    assert quit_.stderr.startswith("interrupted: stopped at once; nothing was saved")


# ------------------------------------------------------------------ writes that fail


def test_a_metrics_file_that_cannot_be_written_is_one_line_and_the_checkpoints_stay(
    tmp_path: Path,
) -> None:
    (tmp_path / "metrics.json").mkdir()  # a folder where the file goes
    with pytest.raises(app.WriteError, match=r"cannot write .*metrics.json: IsADirectoryError"):
        app.run(config(**{"train.max_steps": 4}), str(tmp_path), verbose=0)
    assert checkpoint_numbers(str(tmp_path / "checkpoints")) == [4]
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_a_file_size_limit_stops_the_launcher_with_one_line(tmp_path: Path) -> None:
    """RLIMIT_FSIZE of 24 KiB: above what TensorFlow writes before the first checkpoint
    (AutoGraph's 7.5 KiB files, the first events), below that checkpoint's 43 KiB. Its
    write fails (EFBIG; Python ignores SIGXFSZ): exit 2 with one line, and nothing the
    run wrote before is lost."""
    run = tmp_path / "run"

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (24576, 24576))

    result = subprocess.run(
        [sys.executable, str(ROOT / "launch" / "train.py"),
         f"--config={ROOT / 'configs' / 'synthetic.py'}", f"--workdir={run}", *FLAGS],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT, preexec_fn=limit,
    )  # fmt: skip
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    (line,) = errors(result.stderr)
    assert line.startswith(f"error: cannot write {run / 'checkpoints'}"), line
    assert json.loads((run / "checkpoints" / "fingerprint.json").read_text())["seed"] == 0


def test_an_unwritable_output_folder_stops_the_run_before_training(tmp_path: Path) -> None:
    """A file where `tensorboard/` goes (as root, the stand-in for a read-only folder):
    one `WriteError` naming it, before any step or checkpoint."""
    (tmp_path / "tensorboard").write_text("")
    with pytest.raises(
        app.WriteError, match=r"cannot write .*tensorboard/train: .*nothing was trained"
    ):
        app.run(config(**{"train.max_steps": 2}), str(tmp_path), verbose=0)
    assert checkpoint_numbers(str(tmp_path / "checkpoints")) == []
