"""TensorFlow's import with its C++ start-up lines filtered by TF_CPP_MIN_LOG_LEVEL.

Imports nothing of TensorFlow itself: `tf_adabatch/__init__.py` calls it before its first
TensorFlow import when the environment sets TF_CPP_MIN_LOG_LEVEL (the launchers set it).

>>> import_tensorflow_quietly()  # TensorFlow is imported already: nothing to do
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

__all__ = ["import_tensorflow_quietly"]


def import_tensorflow_quietly() -> None:
    """Imports TensorFlow with its C++ start-up lines filtered by TF_CPP_MIN_LOG_LEVEL.

    TensorFlow's C++ logging writes to stderr before it is configured, ignoring
    TF_CPP_MIN_LOG_LEVEL, and two of its libraries each print the same lines. The
    import's stderr is captured and the lines at or above the level are printed once.
    """
    if "tensorflow" in sys.modules:
        return
    value = os.environ.get("TF_CPP_MIN_LOG_LEVEL", "0").strip()
    level = int(value) if value.isdigit() else 0  # an unreadable level filters nothing
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            shown: list[str] = []
            for line in captured.read().decode(errors="replace").splitlines():
                severity = "IWEF".find(line[:1]) if re.match(r"^[IWEF]\d{4} ", line) else 3
                if "before absl::InitializeLog()" in line or severity < level:
                    continue
                message = line.split("] ", 1)[-1]  # the same line, another timestamp
                if all(message != seen.split("] ", 1)[-1] for seen in shown):
                    shown.append(line)
            for line in shown:
                print(line, file=sys.stderr)
