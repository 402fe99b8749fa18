"""Checkpoints of a job's workdir: finding, restoring, checking and repairing them.

Resuming takes the newest checkpoint that reads back intact (not what the `checkpoint`
state file says): a damaged newer one is renamed `ckpt-N.damaged-<time>.*` with a
one-line warning, never deleted or overwritten; if checkpoints exist but none is
readable, or `fingerprint.json` shows another job wrote them, the resume stops with
`ResumeError` rather than start over. A kill during a save leaves `ckpt-N_temp*`
files, never recorded: `clean_temporaries` removes them before a resume. A kill during
the manager's rotation (it deletes an old checkpoint's index, then its data) leaves an
older checkpoint's data without its index (or an index without its data):
`set_aside_leftovers` renames those `ckpt-N.leftover-<time>.*` once a newer checkpoint
was restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from typing import Any, Protocol

import keras
import ml_collections
import tensorflow as tf

from tf_adabatch.app import records

__all__ = [
    "FINGERPRINT",
    "SETTINGS",
    "ResumeError",
    "changed_settings",
    "check_fingerprint",
    "checkpoint_numbers",
    "clean_temporaries",
    "fingerprint",
    "restore_newest_readable",
    "set_aside",
    "set_aside_leftovers",
    "settings",
    "write_fingerprint",
    "write_json_atomically",
    "write_settings",
]


class ResumeError(RuntimeError):
    """The workdir's checkpoints cannot be resumed: none is readable, or another job wrote them.

    >>> issubclass(ResumeError, RuntimeError)
    True
    """


# A checkpoint's own files (a kill during a save leaves `ckpt-N_temp*` instead).
_CKPT_FILE = re.compile(r"^ckpt-(\d+)\.(index|data-\d+-of-\d+)$")
FINGERPRINT = "fingerprint.json"
SETTINGS = "config.json"


def checkpoint_numbers(directory: str) -> list[int]:
    """Numbers of the checkpoints with any file in `directory`, newest first.

    Read from the files themselves, not the `checkpoint` state file (which can be
    damaged, or name a checkpoint whose files are damaged).

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> for name in ("ckpt-2.index", "ckpt-10.data-00000-of-00001", "ckpt-3_temp", "checkpoint"):
    ...     open(os.path.join(directory, name), "w").close()
    >>> checkpoint_numbers(directory)
    [10, 2]
    """
    if not os.path.isdir(directory):
        return []
    found = {int(m.group(1)) for name in os.listdir(directory) if (m := _CKPT_FILE.match(name))}
    return sorted(found, reverse=True)


def clean_temporaries(directory: str) -> list[str]:
    """Removes what a kill during a save left behind (`ckpt-N_temp*`, never recorded:
    the shards of a save that was not merged into `ckpt-N.*`). Returns their names.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(directory, "ckpt-3_temp", "part-0"))
    >>> open(os.path.join(directory, "ckpt-2.index"), "w").close()
    >>> clean_temporaries(directory)
    ['ckpt-3_temp']
    >>> os.listdir(directory)
    ['ckpt-2.index']
    """
    if not os.path.isdir(directory):
        return []
    removed = []
    for name in sorted(os.listdir(directory)):
        if re.match(r"^ckpt-\d+_temp", name):
            path = os.path.join(directory, name)
            if os.path.isdir(path):
                tf.io.gfile.rmtree(path)
            else:
                os.remove(path)
            removed.append(name)
    return removed


def set_aside_leftovers(directory: str, restored: int) -> list[str]:
    """Renames the incomplete checkpoints older than `restored` (the one resumed from):
    data without its index, an index without its data, or some of its data shards
    missing, as a kill inside the manager's rotation or a save leaves them. Their files
    become `ckpt-N.leftover-<time>.*` (kept, never deleted: an unreadable piece is
    still the user's), and the `checkpoint` state file names the complete ones left.

    Returns:
      One "ckpt-N (what was missing)" per checkpoint set aside.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> for name in ("ckpt-1.data-00000-of-00001", "ckpt-2.index",
    ...              "ckpt-3.index", "ckpt-3.data-00000-of-00001"):
    ...     open(os.path.join(directory, name), "w").close()
    >>> set_aside_leftovers(directory, 3)
    ['ckpt-1 (no index)', 'ckpt-2 (no data)']
    >>> checkpoint_numbers(directory), len(os.listdir(directory))
    ([3], 5)
    """
    found: dict[int, set[str]] = {}
    for name in os.listdir(directory):
        m = _CKPT_FILE.match(name)
        if m and int(m.group(1)) < restored:
            found.setdefault(int(m.group(1)), set()).add(m.group(2))
    stamp = time.strftime("%Y%m%dT%H%M%S")
    moved = []
    for number in sorted(found):
        parts = found[number]
        data = sorted(p for p in parts if p != "index")
        totals = {int(p.rsplit("-of-", 1)[1]) for p in data}
        missing = None
        if "index" not in parts:
            missing = "no index"
        elif not data:
            missing = "no data"
        elif len(totals) != 1 or len(data) != min(totals):
            missing = f"{len(data)} data shards of {max(totals)}"
        if missing is not None:
            _move_aside(directory, number, stamp, "leftover")
            moved.append(f"ckpt-{number} ({missing})")
    if moved:
        left = [
            n
            for n in sorted(checkpoint_numbers(directory))
            if n <= restored and os.path.exists(os.path.join(directory, f"ckpt-{n}.index"))
        ]
        if left:
            _write_state_file(directory, left)
    return moved


def _short(err: BaseException) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:160]}"


def _read_every_tensor(prefix: str) -> None:
    """Opens the checkpoint and reads every tensor (the bundle reader checks each checksum)."""
    reader = tf.train.load_checkpoint(prefix)
    for name in reader.get_variable_to_shape_map():
        reader.get_tensor(name)


def _move_aside(directory: str, number: int, stamp: str, label: str = "damaged") -> str:
    """Renames ckpt-N's files to ckpt-N.<label>-<stamp>.* (kept, never reused or deleted)."""
    for name in os.listdir(directory):
        m = _CKPT_FILE.match(name)
        if m and int(m.group(1)) == number:
            new = f"ckpt-{number}.{label}-{stamp}.{m.group(2)}"
            os.replace(os.path.join(directory, name), os.path.join(directory, new))
    return f"ckpt-{number}.{label}-{stamp}.*"


def set_aside(directory: str, number: int, label: str) -> str:
    """Moves checkpoint `number` out of the resume's way: its files are renamed
    `ckpt-N.<label>-<time>.*` (kept for inspection, never deleted), and the `checkpoint`
    state file names the ones left (or is removed if none is). Returns the new name.

    >>> import tempfile
    >>> v = tf.Variable(0.0)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 3)
    >>> _ = manager.save(1); _ = manager.save(2)
    >>> set_aside(manager.directory, 2, "diverged")  # doctest: +ELLIPSIS
    'ckpt-2.diverged-....*'
    >>> checkpoint_numbers(manager.directory), os.path.basename(
    ...     tf.train.latest_checkpoint(manager.directory))
    ([1], 'ckpt-1')
    """
    moved = _move_aside(directory, number, time.strftime("%Y%m%dT%H%M%S"), label)
    left = sorted(checkpoint_numbers(directory))
    if left:
        _write_state_file(directory, left)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.remove(os.path.join(directory, "checkpoint"))
    return moved


class Restorable(Protocol):
    """What `restore_newest_readable` restores into: `tf.train.Checkpoint`, `Trainer`."""

    def restore(self, save_path: str) -> Any: ...


def restore_newest_readable(
    checkpoint: Restorable, directory: str, *, repair: bool = True
) -> tuple[str | None, list[str]]:
    """Restores the newest checkpoint in `directory` that reads back intact.

    The candidates are the `ckpt-N.*` files themselves, newest first (the `checkpoint`
    state file is not trusted). A checkpoint is intact if every tensor reads back
    (checksums included) and the restore succeeds. With `repair`, the damaged newer
    ones are renamed `ckpt-N.damaged-<time>.*` (never deleted, and their numbers free
    for new saves) and the state file is rewritten to the intact ones, so that a
    `CheckpointManager` created afterwards neither deletes nor overwrites anything
    it could not read.

    Args:
      checkpoint: the objects to restore into: a `tf.train.Checkpoint`, or anything
        whose `restore(prefix)` returns its load status (a `tf_adabatch.Trainer`, which
        restores checkpoints of another topology).
      directory: a `CheckpointManager` directory.
      repair: rename damaged checkpoints and rewrite the state file (the chief only).

    Returns:
      (the restored prefix or None if there is no checkpoint, one note per damaged
      checkpoint passed over).

    Raises:
      ResumeError: checkpoints exist but none is readable (nothing is renamed then),
        or one does not fit `checkpoint` (another job's).

    Example (the newest checkpoint's index is lost; the older one is restored):

    >>> import tempfile
    >>> v = tf.Variable(0.0)
    >>> manager = tf.train.CheckpointManager(tf.train.Checkpoint(v=v), tempfile.mkdtemp(), 3)
    >>> _ = v.assign(1.0); _ = manager.save(1); _ = v.assign(2.0); path = manager.save(2)
    >>> os.remove(path + ".index")
    >>> prefix, notes = restore_newest_readable(tf.train.Checkpoint(v=v), manager.directory)
    >>> os.path.basename(prefix), float(v.numpy()), len(notes)
    ('ckpt-1', 1.0, 1)
    """
    numbers = checkpoint_numbers(directory)
    damaged: list[tuple[int, str]] = []
    for number in numbers:
        prefix = os.path.join(directory, f"ckpt-{number}")
        try:
            if not tf.io.gfile.exists(prefix + ".index"):
                raise FileNotFoundError(f"{prefix}.index is missing")
            # Any failure to read a file back means it is damaged (the reader raises
            # OpErrors, but also IndexError for a truncated data file).
            _read_every_tensor(prefix)
        except Exception as err:
            damaged.append((number, _short(err)))
            continue
        try:
            # Objects of the file that `checkpoint` lacks (the launcher's run record,
            # restored on its own) are expected: not warned about.
            checkpoint.restore(prefix).assert_existing_objects_matched().expect_partial()
        except (tf.errors.OpError, IndexError) as err:  # read back above: rare
            damaged.append((number, _short(err)))
            continue
        except (AssertionError, ValueError) as err:
            raise ResumeError(
                f"Cannot resume from {prefix}: it does not fit this job's model or "
                f"optimizer ({_short(err)}). Use a new --workdir, or the config it was written with."
            ) from err
        notes = []
        stamp = time.strftime("%Y%m%dT%H%M%S")
        for bad, reason in damaged:
            moved = _move_aside(directory, bad, stamp) if repair else "left in place"
            notes.append(f"ckpt-{bad} is damaged ({reason}); {moved}")
        if repair:
            # An older checkpoint without its index is what a kill in the middle of the
            # manager's rotation leaves (the index is deleted first): not listed.
            listed = [
                n
                for n in sorted(numbers)
                if n <= number and os.path.exists(os.path.join(directory, f"ckpt-{n}.index"))
            ]
            _write_state_file(directory, listed)
        return prefix, notes
    if damaged:
        listing = "; ".join(f"ckpt-{n}: {reason}" for n, reason in damaged)
        raise ResumeError(
            f"No readable checkpoint in {directory} (all left in place): {listing}. "
            "Restore them from a backup, or use a new --workdir to start over."
        )
    return None, []


def _write_state_file(directory: str, numbers: list[int]) -> None:
    """Rewrites the `checkpoint` state file (a text CheckpointState proto) atomically.

    The newest of `numbers` becomes the latest; all get their index file's time, after
    `last_preserved_timestamp`, so that a `CheckpointManager` manages (and, past
    `max_to_keep`, deletes) them as if it had saved them.
    """
    times = [os.path.getmtime(os.path.join(directory, f"ckpt-{n}.index")) for n in numbers]
    times = [min(t, time.time()) for t in times]
    lines = [f'model_checkpoint_path: "ckpt-{numbers[-1]}"']
    lines += [f'all_model_checkpoint_paths: "ckpt-{n}"' for n in numbers]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in times]
    lines.append(f"last_preserved_timestamp: {min(times) - 1.0!r}")
    tmp = os.path.join(directory, f"checkpoint.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(tmp, os.path.join(directory, "checkpoint"))


def fingerprint(
    config: ml_collections.ConfigDict, model: keras.Model, num_classes: int
) -> dict[str, Any]:
    """What a resumed job must share with the one that wrote the checkpoints.

    Not in it (resuming may change them): replicas, workers, micro-batch size, policy
    bounds and targets, learning rate and schedule, evaluation settings, max_steps.

    >>> from configs import synthetic
    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, name="out")])
    >>> fingerprint(synthetic.get_config(), model, 2)["variables"]
    ['kernel(3, 2)', 'bias(2,)']
    """
    return {
        "model": config.model,
        "dataset": config.dataset,
        "seed": int(config.seed),
        "num_classes": int(num_classes),
        "input_shape": [int(d) for d in model.inputs[0].shape[1:]],
        "loss": "sparse_categorical_crossentropy(from_logits=True)",
        "optimizer": (
            "AdamW"
            if config.optimizer.name == "adamw"
            else "SGD with momentum"
            if config.optimizer.momentum
            else "SGD"
        ),
        "policy.kind": config.policy.kind,
        # In order, short names (layer names get process-dependent suffixes).
        "variables": [f"{v.name}{tuple(int(d) for d in v.shape)}" for v in model.weights],
    }


def check_fingerprint(directory: str, current: dict[str, Any]) -> None:
    """Refuses a resume whose fingerprint differs from the stored one (one line).

    The stored one is `fingerprint.json`; if that is missing, unreadable or not a JSON
    object (after one `warning:` line), the copy in the newest checkpoint that has
    one (`records.RunRecord`). Without either, nothing says which job wrote the
    checkpoints, and the resume is refused. A directory without checkpoints has
    nothing to check.

    Raises:
      ResumeError: naming every field that differs, or that no fingerprint is left.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> write_fingerprint(directory, {"seed": 0, "model": "mlp"})
    >>> check_fingerprint(directory, {"seed": 0, "model": "mlp"})  # the same job: fine
    >>> check_fingerprint(directory, {"seed": 1, "model": "mlp"})  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tf_adabatch.app.checkpoints.ResumeError: Cannot resume from ...: another job wrote it; differing fields: seed 0 (checkpoint) vs 1 (now). ...
    """
    path = os.path.join(directory, FINGERPRINT)
    stored = _read_json(path)
    if stored is not _ABSENT and not isinstance(stored, dict):
        print(f"warning: ignoring {path}: not a JSON object", file=sys.stderr)
        stored = _ABSENT
    if stored is _ABSENT and checkpoint_numbers(directory):
        stored, readable = _fingerprint_in_checkpoints(directory)
        if stored is None and not readable:
            return  # none reads: the restore says so, naming each one
        if stored is None:
            raise ResumeError(
                f"Cannot resume from {directory}: {FINGERPRINT} is missing or unreadable and "
                "no checkpoint there holds a fingerprint (they predate it), so nothing says "
                f"which job wrote them. Restore {FINGERPRINT} from a backup, or use a new "
                "--workdir."
            )
    if stored is _ABSENT:
        return  # no checkpoints: nothing to resume
    differ = []
    for key, value in current.items():
        if stored.get(key) != value:
            if key == "variables":
                old = list(stored.get(key) or [])
                first = next(
                    (
                        i
                        for i, pair in enumerate(zip(old, value, strict=False))
                        if len(set(pair)) > 1
                    ),
                    min(len(old), len(value)),
                )
                differ.append(
                    f"variables ({len(old)} in the checkpoint, {len(value)} now; the first "
                    f"difference at #{first}: {[*old, '-'][first]} vs {[*value, '-'][first]})"
                )
            else:
                differ.append(f"{key} {stored.get(key)!r} (checkpoint) vs {value!r} (now)")
    if differ:
        raise ResumeError(
            f"Cannot resume from {directory}: another job wrote it; differing fields: "
            f"{'; '.join(differ)}. Use a new --workdir, or the config it was written with."
        )


def _fingerprint_in_checkpoints(directory: str) -> tuple[dict[str, Any] | None, bool]:
    """(The fingerprint saved in the newest checkpoint that holds one and reads, or None;
    whether any checkpoint could be read at all)."""
    readable = False
    for number in checkpoint_numbers(directory):
        try:
            stored = records.stored_fingerprint(os.path.join(directory, f"ckpt-{number}"))
        except Exception:  # a damaged checkpoint: try the next one
            continue
        readable = True
        if stored is not None:
            return stored, True
    return None, readable


def write_fingerprint(directory: str, current: dict[str, Any]) -> None:
    """Writes `directory/fingerprint.json` atomically (a kill leaves the old one or the new).

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> write_fingerprint(directory, {"seed": 0})
    >>> sorted(os.listdir(directory))
    ['fingerprint.json']
    """
    write_json_atomically(os.path.join(directory, FINGERPRINT), current)


def settings(config: ml_collections.ConfigDict) -> dict[str, Any]:
    """The config as flat `{"section.field": value}` (JSON types), for `config.json`.

    >>> c = ml_collections.ConfigDict({"seed": 0, "optimizer": {"learning_rate": 0.05}})
    >>> settings(c)
    {'optimizer.learning_rate': 0.05, 'seed': 0}
    """
    flat: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        for key, value in node.items():
            if isinstance(value, dict):
                walk(f"{prefix}{key}.", value)
            else:
                # Round-trips through JSON, so a stored value compares equal to a fresh one.
                flat[f"{prefix}{key}"] = json.loads(json.dumps(value, default=str))

    walk("", config.to_dict())
    return dict(sorted(flat.items()))


def changed_settings(directory: str, current: dict[str, Any]) -> list[str]:
    """The fields of `directory/config.json` (the run that wrote the checkpoints) that
    `current` changes, as `"field old -> new"`; [] without a readable file.

    A resume may change these on purpose (a longer run, a lower learning rate); the
    list makes a change by mistake visible. What it must not change is the fingerprint's.

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> write_settings(directory, {"optimizer.learning_rate": 0.05, "seed": 0})
    >>> changed_settings(directory, {"optimizer.learning_rate": 0.01, "seed": 0, "new": 1})
    ['new (absent) -> 1', 'optimizer.learning_rate 0.05 -> 0.01']
    >>> changed_settings(tempfile.mkdtemp(), {"seed": 0})  # no config.json: nothing known
    []
    """
    path = os.path.join(directory, SETTINGS)
    stored = _read_json(path)
    if stored is _ABSENT:
        return []
    if not isinstance(stored, dict):
        print(f"warning: ignoring {path}: not a JSON object", file=sys.stderr)
        return []
    missing = object()
    changes = []
    for key in sorted(set(stored) | set(current)):
        old, new = stored.get(key, missing), current.get(key, missing)
        if old != new:
            changes.append(
                f"{key} {'(absent)' if old is missing else repr(old)} -> "
                f"{'(absent)' if new is missing else repr(new)}"
            )
    return changes


def write_settings(directory: str, current: dict[str, Any]) -> None:
    """Writes `directory/config.json` atomically: the settings of the run now writing
    checkpoints there (see `settings`).

    >>> import tempfile
    >>> directory = tempfile.mkdtemp()
    >>> write_settings(directory, {"seed": 0})
    >>> json.load(open(os.path.join(directory, SETTINGS)))
    {'seed': 0}
    """
    write_json_atomically(os.path.join(directory, SETTINGS), current)


_ABSENT = object()  # `_read_json`: no file, or one that does not read as JSON


def _read_json(path: str) -> Any:
    """The JSON value in `path`; `_ABSENT` if there is no file, and also (after one
    `warning:` line) if it cannot be read or parsed: a record beside the checkpoints
    never stops a resume by being damaged itself."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return _ABSENT
    except (OSError, ValueError) as err:
        print(f"warning: ignoring unreadable {path} ({_short(err)})", file=sys.stderr)
        return _ABSENT


def write_json_atomically(
    path: str, value: Any, *, indent: int = 1, sort_keys: bool = True
) -> None:
    """Writes `value` as JSON to `path` through a temporary file and a rename: a kill or
    a failed write (disk full, a file-size limit) leaves the old file or the new one,
    never a part (the temporary file is removed on failure).

    Raises:
      OSError: the write or the rename failed.

    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.json")
    >>> write_json_atomically(path, {"b": 1, "a": 2})
    >>> json.load(open(path)), os.listdir(os.path.dirname(path))
    ({'a': 2, 'b': 1}, ['a.json'])
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(value, f, indent=indent, sort_keys=sort_keys)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise
