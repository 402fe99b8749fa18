"""One run per workdir, and writes that fail with one line.

`WorkdirLock` keeps a second launcher off a folder a live run holds: an exclusive
`flock` on `<folder>/run.lock`, taken before anything in the folder is read and held
until the run ends. The kernel drops it when the holder dies, however it dies (killed,
out of memory, machine lost), so a dead run never blocks the next one; the file keeps
the holder's pid, host and start time for the message. Multi-worker runs share a
workdir on purpose: each process locks its own folder (the chief the workdir, worker
i `worker-<i>`), so the workers of one job never block each other, and a second job on
the same workdir is refused by the chief's lock.

`WriteError` is what a failed write of the run's own files becomes (disk full, a file
size limit, a read-only folder): one line naming the file and the reason.
"""

from __future__ import annotations

import datetime
import fcntl
import json
import os
import socket
from typing import Any

from tf_adabatch.app.config import ConfigError

__all__ = [
    "LOCK_FILE",
    "WorkdirBusy",
    "WorkdirLock",
    "WriteError",
    "check_writable",
    "short_error",
]

LOCK_FILE = "run.lock"


class WorkdirBusy(ConfigError):
    """Another live run holds the workdir (`launch/train.py` exits 2).

    >>> issubclass(WorkdirBusy, ConfigError)
    True
    """


class WriteError(RuntimeError):
    """A file of the run could not be written (`launch/train.py` exits 2, one line).

    >>> print(WriteError("/w/metrics.json", OSError(28, "No space left on device")))
    cannot write /w/metrics.json: OSError: [Errno 28] No space left on device
    """

    def __init__(self, path: str, err: BaseException, consequence: str = "") -> None:
        tail = f"; {consequence}" if consequence else ""
        super().__init__(f"cannot write {path}: {short_error(err)}{tail}")
        self.path = path


def short_error(err: BaseException) -> str:
    """`Type: first line of the message` (at most 200 characters).

    >>> short_error(ValueError("bad\\nvalue"))
    'ValueError: bad'
    """
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:200]}"


def check_writable(*folders: str) -> None:
    """Creates each folder if needed and writes (then removes) a probe file in it, so that
    a read-only `checkpoints/` or `tensorboard/`, or a file in a folder's place, stops the
    run with one line before it trains rather than with a traceback later.

    Raises:
      WriteError: naming the first folder that cannot be written.

    >>> import tempfile
    >>> root = tempfile.mkdtemp()
    >>> check_writable(os.path.join(root, "tensorboard", "train"))
    >>> open(os.path.join(root, "checkpoints"), "w").close()  # a file where a folder goes
    >>> check_writable(os.path.join(root, "checkpoints"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tf_adabatch.app.workdir.WriteError: cannot write .../checkpoints: FileExistsError: ...
    """
    for folder in folders:
        try:
            os.makedirs(folder, exist_ok=True)
            probe = os.path.join(folder, f".write-test-{os.getpid()}")
            with open(probe, "w", encoding="utf-8"):
                pass
            os.remove(probe)
        except OSError as err:
            raise WriteError(folder, err, "nothing was trained") from err


class WorkdirLock:
    """An exclusive lock on `folder` for this process's run (see the module docstring).

    Args:
      folder: the folder to hold (created if needed).

    Raises:
      WorkdirBusy: a live process holds it; the message names its pid, host and start.
      WriteError: the lock file cannot be created.

    Example:

    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> lock = WorkdirLock(folder)
    >>> WorkdirLock(folder)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tf_adabatch.app.workdir.WorkdirBusy: Argument `workdir` is in use by another run: pid ... on ... since ...
    >>> lock.release()
    >>> WorkdirLock(folder).release()  # free again
    """

    def __init__(self, folder: str) -> None:
        self.path = os.path.join(folder, LOCK_FILE)
        try:
            os.makedirs(folder, exist_ok=True)
            self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise WriteError(self.path, err) from err
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            holder = self._holder()
            os.close(self._fd)
            self._fd = None
            raise WorkdirBusy(
                f"Argument `workdir` is in use by another run: {holder} (lock {self.path}). "
                "Wait for it to end or stop it, or use another --workdir. "
                f"Received: workdir={os.path.dirname(self.path)!r}"
            ) from err
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        }
        try:
            os.ftruncate(self._fd, 0)
            os.pwrite(self._fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError:
            pass  # the lock holds without its description

    def _holder(self) -> str:
        try:
            with open(self.path, encoding="utf-8") as f:
                record: Any = json.loads(f.read() or "{}")
            return f"pid {record['pid']} on {record['host']} since {record['started']}"
        except (OSError, ValueError, KeyError, TypeError):
            return "a process that has not described itself yet"

    def release(self) -> None:
        """Releases the lock (the file stays; the next run reuses it)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
