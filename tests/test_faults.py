"""Fault campaign: kills during training and during saves, and damage to the newest
checkpoint, on one workdir; the rerun always finishes where an uninterrupted run does.

One chain of processes on the synthetic config (SimiGrad + AdaScale, 2 replicas,
`deterministic=True`, a checkpoint every 2 optimizer steps, `max_to_keep=2`):

    run A, killed at a random micro-batch     -> damage the newest checkpoint
    run B, killed inside its 2nd save (shards written, not merged: ckpt-N_temp/ left)
                                              -> damage the newest checkpoint
    run C, killed inside its 2nd save (files complete, not yet in the state file)
                                              -> damage the newest checkpoint, garble the
                                                 state file
    run D, to the end

Damage kinds (order drawn with a fixed seed): truncate the `.data` file, flip bytes in
it, delete the `.index`, garble the `checkpoint` state file. After each fault the next
run must print "Resumed from <the newest intact checkpoint>" (computed here from the
files and the damage done, independently of the code under test), warn once per damaged
checkpoint, and keep it renamed aside; the last run's final checkpoint must equal an
uninterrupted run's (every variable, 1e-6) and its metrics likewise.

    python -m pytest tests/test_faults.py -q -p no:randomly
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from helpers import checkpoint_values

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300
OVERRIDES = {
    "deterministic": True,
    "train.base_epochs": 0.35,  # 12 optimizer steps, 136 micro-batches of 16
    "train.checkpoint_every_steps": 2,
    "train.eval_every_base_epochs": 1.0,  # one evaluation, at the end
    "policy.target_similarity": 0.3,  # the batch adapts
}
DAMAGES = ("truncate", "flip", "delete_index", "garble_state")


def worker(workdir: Path, fault: dict) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        str(ROOT / "tests" / "fault_worker.py"),
        str(ROOT / "configs" / "synthetic.py"),
        str(workdir),
        json.dumps(OVERRIDES),
        json.dumps(fault),
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT)


def complete(ckpt_dir: Path) -> list[int]:
    """Numbers of the checkpoints whose index and data files are both there, newest first."""
    numbers = {int(p.name[5:-6]) for p in ckpt_dir.glob("ckpt-*.index") if p.name[5:-6].isdigit()}
    return sorted(
        (n for n in numbers if (ckpt_dir / f"ckpt-{n}.data-00000-of-00001").exists()),
        reverse=True,
    )


def damage(ckpt_dir: Path, kind: str, number: int, rng: np.random.Generator) -> None:
    data = ckpt_dir / f"ckpt-{number}.data-00000-of-00001"
    if kind == "truncate":
        blob = data.read_bytes()
        data.write_bytes(blob[: len(blob) // 2])
    elif kind == "flip":
        blob = bytearray(data.read_bytes())
        for offset in rng.choice(len(blob), size=8, replace=False):
            blob[offset] ^= 0xFF
        data.write_bytes(bytes(blob))
    elif kind == "delete_index":
        (ckpt_dir / f"ckpt-{number}.index").unlink()
    else:  # the state file: garbage that is not a CheckpointState proto
        (ckpt_dir / "checkpoint").write_bytes(rng.bytes(64) + b"\nmodel_checkpoint_path: {")


def test_kills_and_damage_then_rerun_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    rng = np.random.default_rng(20261203)
    full = worker(tmp_path / "full", {})
    assert full.returncode == 0, full.stderr[-3000:]

    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    order = list(rng.permutation(DAMAGES))
    # garble_state damages no checkpoint: give it to run C, which also gets one more.
    order.remove("garble_state")
    faults = [
        ({"micro_batch": int(rng.integers(24, 44))}, [order[0]]),
        ({"save": 2, "at": "merge"}, [order[1]]),
        ({"save": 2, "at": "record"}, [order[2], "garble_state"]),
    ]
    scenarios = {"kill_train": 0, "kill_merge": 0, "kill_record": 0, **dict.fromkeys(DAMAGES, 0)}
    resumes = 0
    expected_resume: int | None = None
    damaged: list[int] = []
    for fault, damages in [*faults, ({}, [])]:
        result = worker(run, fault)
        if expected_resume is not None:  # every run after the first resumes
            assert f"Resumed from {ckpts / f'ckpt-{expected_resume}'}:" in result.stdout, (
                f"expected ckpt-{expected_resume} ({fault}):\n{result.stdout[-1500:]}\n"
                f"{result.stderr[-1500:]}"
            )
            for number in damaged:  # one warning each, the files kept aside
                assert result.stderr.count(f"warning: ckpt-{number} is damaged") == 1, (
                    result.stderr[-2000:]
                )
                assert list(ckpts.glob(f"ckpt-{number}.damaged-*")), number
            resumes += 1
        assert not list(ckpts.glob("*_temp*")) or fault.get("at") == "merge"
        if not fault:
            assert result.returncode == 0, result.stderr[-3000:]
            break
        assert result.returncode == -9, f"not killed ({fault}): {result.stderr[-2000:]}"
        newest = complete(ckpts)
        assert len(newest) >= 2, f"{fault}: checkpoints {newest}"
        if fault.get("at") == "merge":  # the kill left the unmerged shards behind
            assert list(ckpts.glob("ckpt-*_temp*")), "no ckpt-N_temp left by the merge kill"
            scenarios["kill_merge"] += 1
        elif fault.get("at") == "record":  # complete files the state file does not name
            assert f'model_checkpoint_path: "ckpt-{newest[0]}"' not in (
                (ckpts / "checkpoint").read_text()
            )
            scenarios["kill_record"] += 1
        else:
            scenarios["kill_train"] += 1
        damaged = []
        for kind in damages:
            damage(ckpts, kind, newest[0], rng)
            scenarios[kind] += 1
            if kind != "garble_state":
                damaged.append(newest[0])
        expected_resume = newest[1] if damaged else newest[0]

    assert resumes == 3
    assert scenarios == {
        "kill_train": 1,
        "kill_merge": 1,
        "kill_record": 1,
        "truncate": 1,
        "flip": 1,
        "delete_index": 1,
        "garble_state": 1,
    }
    assert not list(ckpts.glob("*_temp*"))  # cleaned by the next run
    expected, got = checkpoint_values(tmp_path / "full"), checkpoint_values(run)
    assert set(got) == set(expected)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-6, atol=1e-6, err_msg=name)
    full_metrics = json.loads((tmp_path / "full" / "metrics.json").read_text())
    run_metrics = json.loads((run / "metrics.json").read_text())
    for key in ("optimizer_steps", "examples_seen", "test_accuracy", "test_loss"):
        assert run_metrics[key] == full_metrics[key], key
