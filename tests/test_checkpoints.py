"""Resuming `app.run`: damaged checkpoints, another job's checkpoints, temporaries.

In-process, one device, the synthetic config: a base workdir with ckpt-2 and ckpt-4
(a checkpoint every 2 optimizer steps), copied for each test. The kills themselves,
in a subprocess, are tests/test_faults.py's.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import tensorflow as tf

from configs import synthetic
from tf_adabatch import app
from tf_adabatch.app import checkpoints


def config(**overrides):
    c = synthetic.get_config()
    c.strategy = "one_device"
    c.train.checkpoint_every_steps = 2
    c.train.max_steps = 4
    c.train.eval_every_base_epochs = 100.0  # only the final evaluation
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = c
        for parent in parents:
            node = node[parent]
        node[leaf] = value
    return c


@pytest.fixture(scope="module")
def base_run(tmp_path_factory) -> Path:
    workdir = tmp_path_factory.mktemp("base")
    app.run(config(), str(workdir), verbose=0)
    return workdir


@pytest.fixture
def workdir(base_run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(base_run, copy)
    assert sorted(p.name for p in (copy / "checkpoints").glob("ckpt-*.index")) == [
        "ckpt-2.index",
        "ckpt-4.index",
    ]
    return copy


def files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def damage(ckpt_dir: Path, kind: str, number: int) -> None:
    data = ckpt_dir / f"ckpt-{number}.data-00000-of-00001"
    if kind == "truncate":
        data.write_bytes(data.read_bytes()[:100])
    elif kind == "flip":
        blob = bytearray(data.read_bytes())
        for offset in range(7, len(blob), 97):  # a byte in every 97, all over the file
            blob[offset] ^= 0x5A
        data.write_bytes(bytes(blob))
    elif kind == "delete_index":
        (ckpt_dir / f"ckpt-{number}.index").unlink()
    elif kind == "delete_data":
        data.unlink()
    elif kind == "garble_index":
        (ckpt_dir / f"ckpt-{number}.index").write_bytes(b"not an index" * 10)
    else:
        raise ValueError(kind)


@pytest.mark.parametrize(
    "kind", ["truncate", "flip", "delete_index", "delete_data", "garble_index"]
)
def test_damaged_newest_checkpoint_is_passed_over_kept_aside_and_its_number_reused(
    workdir: Path, kind: str, capsys
) -> None:
    ckpts = workdir / "checkpoints"
    damage(ckpts, kind, 4)
    damaged = {n: b for n, b in files(ckpts).items() if n.startswith("ckpt-4.")}
    metrics = app.run(config(**{"train.max_steps": 6}), str(workdir))
    out, err = capsys.readouterr()
    # Resumed from the older intact checkpoint, with one warning line naming the damage.
    assert f"Resumed from {ckpts / 'ckpt-2'}: step 2," in out
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and warnings[0].startswith("warning: ckpt-4 is damaged ("), err
    assert warnings[0].endswith(f"resuming from {ckpts / 'ckpt-2'}")
    # The damaged files were renamed, not deleted or overwritten: same bytes.
    aside = {
        re.sub(r"\.damaged-\d{8}T\d{6}", "", p.name): p.read_bytes()
        for p in ckpts.glob("ckpt-4.damaged-*")
    }
    assert aside == damaged
    # Training went on from step 2 and saved a new, readable ckpt-4 and ckpt-6.
    assert metrics["optimizer_steps"] == 6
    assert tf.train.latest_checkpoint(str(ckpts)) == str(ckpts / "ckpt-6")
    reader = tf.train.load_checkpoint(str(ckpts / "ckpt-4"))
    assert int(reader.get_tensor("adabatch/steps/.ATTRIBUTES/VARIABLE_VALUE")) == 4
    # max_to_keep=2 deleted the intact ckpt-2 (restored, so known readable) only after
    # two newer saves; nothing else was deleted.
    kept = sorted(p.name for p in ckpts.iterdir() if re.fullmatch(r"ckpt-\d+\.index", p.name))
    assert kept == ["ckpt-4.index", "ckpt-6.index"]


def test_garbled_state_file_is_ignored_and_rewritten(workdir: Path, capsys) -> None:
    ckpts = workdir / "checkpoints"
    (ckpts / "checkpoint").write_bytes(b"\x00\xffgarbage {{{")
    app.run(config(**{"train.max_steps": 6}), str(workdir))
    out, err = capsys.readouterr()
    assert f"Resumed from {ckpts / 'ckpt-4'}: step 4," in out
    assert "warning: ckpt-" not in err
    assert tf.train.latest_checkpoint(str(ckpts)) == str(ckpts / "ckpt-6")


def test_no_readable_checkpoint_stops_and_changes_nothing(workdir: Path) -> None:
    ckpts = workdir / "checkpoints"
    damage(ckpts, "truncate", 4)
    damage(ckpts, "delete_index", 2)
    before = files(ckpts)
    with pytest.raises(
        app.ResumeError,
        match=r"No readable checkpoint in .*checkpoints \(all left in place\): ckpt-4: .*; ckpt-2: FileNotFoundError",
    ):
        app.run(config(**{"train.max_steps": 6}), str(workdir), verbose=0)
    assert files(ckpts) == before


def test_leftovers_of_killed_saves_are_set_aside_with_one_line(workdir: Path, capsys) -> None:
    """Issue 42: a kill inside the manager's rotation leaves an old checkpoint's data
    without its index (or the reverse); a kill inside a save, ckpt-N_temp/. The next
    start resumes from ckpt-4, renames the two incomplete older ones
    `ckpt-N.leftover-<time>.*` with their bytes intact, removes the temporary, and says
    so in one line."""
    ckpts = workdir / "checkpoints"
    data = "data-00000-of-00001"
    (ckpts / f"ckpt-1.{data}").write_bytes((ckpts / f"ckpt-2.{data}").read_bytes())
    (ckpts / "ckpt-3.index").write_bytes((ckpts / "ckpt-2.index").read_bytes())
    (ckpts / "ckpt-6_temp").mkdir()
    (ckpts / "ckpt-6_temp" / "part-00000-of-00001.index").write_bytes(b"partial")
    orphans = {f"ckpt-1.{data}": "ckpt-1.leftover-", "ckpt-3.index": "ckpt-3.leftover-"}
    before = {name: (ckpts / name).read_bytes() for name in orphans}
    metrics = app.run(config(**{"train.max_steps": 5}), str(workdir))
    out, err = capsys.readouterr()
    assert f"Resumed from {ckpts / 'ckpt-4'}: step 4," in out
    assert metrics["optimizer_steps"] == 5
    lines = [line for line in err.splitlines() if "leftover" in line]
    assert lines == [
        "warning: leftovers of killed saves: removed the unmerged save temporaries "
        "ckpt-6_temp; set aside ckpt-1 (no index), ckpt-3 (no data) as "
        f"ckpt-N.leftover-<time>.* in {ckpts}"
    ], err
    checked = 0
    for name, prefix in orphans.items():
        suffix = name.split(".", 1)[1]
        (moved,) = [p for p in ckpts.iterdir() if p.name.startswith(prefix)]
        assert moved.name.endswith(f".{suffix}") and moved.read_bytes() == before[name]
        assert not (ckpts / name).exists()
        checked += 1
    assert checked == 2
    assert not list(ckpts.glob("*_temp*"))
    assert checkpoints.checkpoint_numbers(str(ckpts)) == [5, 4]


def test_stale_save_temporaries_are_removed_and_allowed_changes_resume(
    workdir: Path, capsys
) -> None:
    """A kill during a save leaves ckpt-N_temp/; the next run removes it. Replicas,
    micro-batch, learning rate, policy bounds and eval settings may change."""
    ckpts = workdir / "checkpoints"
    (ckpts / "ckpt-6_temp").mkdir()
    (ckpts / "ckpt-6_temp" / "part-00000-of-00001.index").write_bytes(b"partial")
    changed = config(
        **{
            "train.max_steps": 5,
            "micro_batch_size": 8,
            "optimizer.learning_rate": 0.01,
            "policy.max_batch_size": 512,
            "train.eval_batch_size": 100,
        }
    )
    metrics = app.run(changed, str(workdir))
    out, _ = capsys.readouterr()
    assert f"Resumed from {ckpts / 'ckpt-4'}: step 4," in out
    assert metrics["optimizer_steps"] == 5
    assert not list(ckpts.glob("*_temp*"))
    # Allowed, but named: the base run's settings (configs/synthetic.py with this
    # module's overrides) against the changed ones, sorted by field.
    assert (
        "Settings changed since these checkpoints were written: micro_batch_size 16 -> 8; "
        "optimizer.learning_rate 0.05 -> 0.01; policy.max_batch_size 256 -> 512; "
        "train.eval_batch_size 256 -> 100; train.max_steps 4 -> 5\n"
    ) in out


def test_a_resume_names_changed_settings_only_and_records_the_new_ones(
    workdir: Path, capsys
) -> None:
    """config.json holds the settings of the run writing the checkpoints; a resume with
    the same config names nothing, one with a longer max_steps names that field alone and
    then records it (so the next resume compares against it)."""
    stored = workdir / "checkpoints" / checkpoints.SETTINGS
    assert json.loads(stored.read_text()) == checkpoints.settings(config())
    app.run(config(), str(workdir))
    out, _ = capsys.readouterr()
    assert "Resumed from" in out and "Settings changed" not in out
    app.run(config(**{"train.max_steps": 6}), str(workdir))
    out, _ = capsys.readouterr()
    assert "Settings changed since these checkpoints were written: train.max_steps 4 -> 6\n" in out
    assert json.loads(stored.read_text())["train.max_steps"] == 6
    stored.write_text("{not json")  # unreadable: a warning, and the resume goes on
    metrics = app.run(config(**{"train.max_steps": 7}), str(workdir))
    out, err = capsys.readouterr()
    assert metrics["optimizer_steps"] == 7 and "Settings changed" not in out
    assert f"warning: ignoring unreadable {stored}" in err
    stored.write_text("[1, 2]")  # JSON, but not the settings' object: the same
    metrics = app.run(config(**{"train.max_steps": 8}), str(workdir))
    out, err = capsys.readouterr()
    assert metrics["optimizer_steps"] == 8 and "Settings changed" not in out
    assert f"warning: ignoring {stored}: not a JSON object" in err


@pytest.mark.parametrize(
    "field,value,expected",
    [
        ("dataset", "digits", "dataset 'synthetic' (checkpoint) vs 'digits' (now)"),
        ("optimizer.momentum", 0.0, "optimizer 'SGD with momentum' (checkpoint) vs 'SGD' (now)"),
        (
            "policy.kind",
            "noise_scale",
            "policy.kind 'simigrad' (checkpoint) vs 'noise_scale' (now)",
        ),
        ("seed", 3, "seed 0 (checkpoint) vs 3 (now)"),
    ],
)
def test_another_jobs_checkpoints_are_refused_naming_the_fields(
    workdir: Path, field: str, value, expected: str
) -> None:
    before = files(workdir / "checkpoints")
    with pytest.raises(app.ResumeError, match=re.escape(expected)) as info:
        app.run(config(**{field: value}), str(workdir), verbose=0)
    assert "another job wrote it" in str(info.value) and "\n" not in str(info.value)
    assert files(workdir / "checkpoints") == before


@pytest.mark.parametrize("damage_kind", ["deleted", "garbled", "not an object"])
def test_a_lost_fingerprint_file_is_recovered_from_the_checkpoint(
    workdir: Path, damage_kind: str, capsys
) -> None:
    """fingerprint.json deleted or damaged beside checkpoints: the copy saved in the
    newest checkpoint still refuses another seed (nothing touched), and the same job
    resumes and writes the file back with the original record."""
    path = workdir / "checkpoints" / checkpoints.FINGERPRINT
    original = json.loads(path.read_text())
    if damage_kind == "deleted":
        path.unlink()
    else:
        path.write_text("{not json" if damage_kind == "garbled" else "[1, 2]")
    before = files(workdir / "checkpoints")
    with pytest.raises(app.ResumeError, match=re.escape("seed 0 (checkpoint) vs 3 (now)")):
        app.run(config(seed=3), str(workdir), verbose=0)
    assert files(workdir / "checkpoints") == before
    warned = capsys.readouterr().err
    assert ("warning: ignoring" in warned) == (damage_kind != "deleted"), warned
    app.run(config(**{"train.max_steps": 6}), str(workdir), verbose=0)
    assert json.loads(path.read_text()) == original


def test_checkpoints_without_any_fingerprint_are_refused_with_one_line(tmp_path: Path) -> None:
    """Checkpoints holding no fingerprint (written before they did) and no
    fingerprint.json: nothing says which job wrote them, so the resume is refused."""
    directory = tmp_path / "checkpoints"
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(v=tf.Variable(1.0)), str(directory), max_to_keep=1
    )
    manager.save(checkpoint_number=2)
    before = files(directory)
    with pytest.raises(app.ResumeError) as info:
        app.run(config(), str(tmp_path), verbose=0)
    message = str(info.value)
    assert "fingerprint.json is missing or unreadable and no checkpoint there holds a " in message
    assert "\n" not in message and files(directory) == before


def test_a_model_that_does_not_fit_the_data_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(
        app.ConfigError,
        match=r"Config fields `model`, `dataset`: model 'cnn' cannot take dataset 'synthetic' inputs of shape \(8, 8, 1\)",
    ):
        app.run(config(model="cnn"), str(tmp_path), verbose=0)


def test_a_resume_on_another_batch_unit_keeps_the_global_batch(tmp_path: Path, capsys) -> None:
    """Replicas x micro-batch changes between runs (16 -> 32; this process cannot change
    its logical devices, so the micro-batch changes: the same unit, the same code path).
    Restored as is, k would double the batch; it must stay the saved k x 16, or the
    nearest multiple of 32 within SimiGrad's bounds, [64, 256] on resuming (one replica
    in exact mode needs two micro-steps: at least 2 x 32)."""
    from tf_adabatch import summaries

    adapting = {"policy.target_similarity": 0.3}  # the batch grows in the first steps
    app.run(config(**adapting, **{"train.max_steps": 4}), str(tmp_path), verbose=0)
    reader = tf.train.load_checkpoint(str(tmp_path / "checkpoints"))
    keys = reader.get_variable_to_shape_map()

    def saved(name: str) -> int:
        (key,) = [k for k in keys if k.startswith(f"adabatch/{name}/")]
        return int(reader.get_tensor(key))

    assert saved("batch_unit") == 16
    batch = saved("accumulation_steps") * 16
    expected = min(max(round(batch / 32) * 32, 64), 256)
    bounds = {"policy.min_batch_size": 64, "policy.initial_batch_size": 64}
    resumed = config(**adapting, **bounds, **{"train.max_steps": 5, "micro_batch_size": 32})
    capsys.readouterr()
    app.run(resumed, str(tmp_path), verbose=1)
    out = capsys.readouterr().out
    assert "(replicas x micro-batch; it was 16)" in out and f"global batch {batch}" in out
    logged = dict(
        summaries.read_scalars(str(tmp_path / "tensorboard" / "train"))["adabatch/batch_size"]
    )
    assert logged[5] == expected, (batch, logged)


def test_an_older_checkpoint_half_deleted_by_a_killed_rotation_does_not_stop_the_resume(
    tmp_path: Path,
) -> None:
    """A SIGKILL while the manager rotates (it deletes an old checkpoint's index, then its
    data) leaves an older ckpt-N with data and no index. The resume restores the newest
    and rewrites the state file without it (it raised FileNotFoundError, seen once in a
    loaded full suite run, 2026-12-07)."""
    v = tf.Variable(0.0)
    manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), str(tmp_path), 3)
    for n in (1, 2, 3):
        v.assign(float(n))
        manager.save(checkpoint_number=n)
    (tmp_path / "ckpt-1.index").unlink()  # the rotation's first deletion, then the kill
    v.assign(0.0)
    prefix, notes = checkpoints.restore_newest_readable(
        tf.train.Checkpoint(v=v), str(tmp_path), repair=True
    )
    assert prefix.endswith("ckpt-3") and float(v.numpy()) == 3.0 and notes == []
    state = tf.train.get_checkpoint_state(str(tmp_path))
    assert [p.rsplit("/", 1)[-1] for p in state.all_model_checkpoint_paths] == ["ckpt-2", "ckpt-3"]


def test_two_resumes_on_other_replica_counts_keep_the_global_batch_written_by_hand(
    tmp_path: Path,
) -> None:
    """The batch unit (replicas x micro-batch 8) goes 16 -> 24 -> 8 over two resumes, with
    k = 5 saved on the first: global batch 80. On 3 replicas the nearest multiple of 24
    is 72 (80 / 24 = 3.33: k = 3); on one replica 72 is reachable (k = 9); SimiGrad's
    bounds [48, 240] hold all three. Expected, by
    hand: batches 80, 72, 72; units 16, 24, 8 in each saved state."""
    import keras

    import tf_adabatch

    from conftest import get_strategy

    def trainer(replicas: int) -> tf_adabatch.Trainer:
        strategy = get_strategy(replicas)
        with strategy.scope():
            model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.1)
        return tf_adabatch.Trainer(
            model,
            loss="mse",
            optimizer=optimizer,
            micro_batch_size=8,
            policy=tf_adabatch.SimiGradPolicy(
                0.5, initial_batch_size=48, min_batch_size=48, max_batch_size=240
            ),
            similarity="exact",
            strategy=strategy,
        )

    first = trainer(2)
    first.state.accumulation_steps.assign(5)
    assert first.batch_size == 80 and int(first.state.batch_unit.numpy()) == 16
    path = first.checkpoint.save(str(tmp_path / "a" / "ckpt"))
    batches, units = [80], [16]
    for replicas in (3, 1):
        resumed = trainer(replicas)
        resumed.restore(path)
        assert resumed.engine.carry_batch_over() is not None  # another unit: it says so
        batches.append(resumed.batch_size)
        units.append(int(resumed.state.batch_unit.numpy()))
        path = resumed.checkpoint.save(str(tmp_path / f"r{replicas}" / "ckpt"))
    assert batches == [80, 72, 72] and units == [16, 24, 8]
