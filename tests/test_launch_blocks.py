"""The launcher with `train.steps_per_execution` and `train.rollback`.

Blocks of steps change when the loop's actions act (at a block's end), not what is
trained: the same run with blocks of 3 and with one step per call ends with the same
checkpointed weights, state and metrics, has a summary of every step, and is charged
the same virtual seconds; its checkpoints are taken at the ends of the blocks that pass
a multiple of `checkpoint_every_steps`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from configs import synthetic
from tf_adabatch import summaries
from tf_adabatch.app import loop, run
from tf_adabatch.app.checkpoints import checkpoint_numbers

from helpers import checkpoint_values


def _config(steps_per_execution: int, **train: object):
    config = synthetic.get_config()
    config.strategy = "one_device"
    config.deterministic = True
    config.train.max_steps = 10
    config.train.checkpoint_every_steps = 4
    config.train.steps_per_execution = steps_per_execution
    config.clock.profile, config.clock.devices = "bert_squad_t4", 8
    for name, value in train.items():
        setattr(config.train, name, value)
    return config


def test_blocks_of_steps_train_the_same_run_and_checkpoint_at_block_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    saves: list[int] = []
    save = loop.RecordingCheckpointManager.save

    def recorded(self, checkpoint_number=None, **kwargs):  # the launcher keeps the last 2
        saves.append(int(checkpoint_number))
        return save(self, checkpoint_number, **kwargs)

    monkeypatch.setattr(loop.RecordingCheckpointManager, "save", recorded)
    metrics, saved = {}, {}
    for n in (1, 3):
        metrics[n] = run(_config(n), str(tmp_path / f"spe{n}"), verbose=0)
        saved[n], saves[:] = list(saves), []
    # One step per call: a save at every multiple of 4 and the final one. Blocks of 3
    # end at steps 3, 6, 9, 10: 6 passes 4, 9 passes 8, 10 is the final save.
    assert saved == {1: [4, 8, 10], 3: [6, 9, 10]}
    assert sorted(checkpoint_numbers(str(tmp_path / "spe3" / "checkpoints"))) == [9, 10]
    one, three = checkpoint_values(tmp_path / "spe1"), checkpoint_values(tmp_path / "spe3")
    assert set(one) == set(three) and len(one) > 10
    for name, value in one.items():
        np.testing.assert_array_equal(three[name], value, err_msg=name)
    for key in ("optimizer_steps", "examples_seen", "test_loss", "test_accuracy"):
        assert metrics[3][key] == metrics[1][key], key
    # Every step's virtual price is charged once (ChargeSteps takes the block's sum).
    assert metrics[1]["optimizer_steps"] == 10
    assert metrics[3]["train_seconds"] == pytest.approx(metrics[1]["train_seconds"], rel=1e-12)
    board = {
        n: summaries.read_scalars(str(tmp_path / f"spe{n}" / "tensorboard" / "train"))
        for n in (1, 3)
    }
    sizes = board[3]["adabatch/batch_size"]
    assert [step for step, _ in sizes] == list(range(1, 11))
    assert sizes == board[1]["adabatch/batch_size"]
    assert len({b for _, b in sizes}) > 1  # the policy did change the batch


def test_rollback_stop_reaches_the_engine_from_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    engines = []
    original = loop.Trainer

    def recording(*args, **kwargs):
        trainer = original(*args, **kwargs)
        engines.append(trainer.engine)
        return trainer

    monkeypatch.setattr(loop, "Trainer", recording)
    metrics = run(_config(1, rollback="stop", max_steps=2), str(tmp_path), verbose=0)
    assert len(engines) == 1 and engines[0].rollback_mode == "stop"
    assert engines[0].memory()["rollback"] == 0  # no copy of the weights and slots
    assert metrics["optimizer_steps"] == 2
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["optimizer_steps"] == 2
