"""Runs `launch/train.py`'s own parsing and `main` on many command lines in ONE process.

    python tests/launch_cases.py CASES.json

CASES.json maps a case name to an argv (without the program name). For each case the
flags are parsed by `train.parse_flags` and `train.main` runs, exactly as
`app.run(main, flags_parser=parse_flags)` does, with stdout and stderr captured; an
exception other than `SystemExit` is recorded with its traceback on the captured stderr
(exit code 1, as Python would exit). The last line printed is a JSON object mapping each
case to `{"code": ..., "stderr": ..., "stdout": ...}`.

Why: each refusal of a bad flag or config used to start its own Python with TensorFlow
(~10 s each here). Refusals happen before any training, so one process can check them
all; tests/test_launch.py keeps real subprocesses for the exit codes themselves.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def run_case(argv: list[str]) -> dict:
    # Imported here, not at the top: pytest imports this file (doctests), and
    # launch/train.py defines absl flags other scripts' tests define too.
    from absl import flags

    from launch import train

    out, err = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    sys.argv = [str(train.__file__), *argv]  # ml_collections reads overrides from sys.argv
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            train.main(train.parse_flags(list(sys.argv)))
        except SystemExit as exit_:
            code = exit_.code
        except Exception:  # recorded, as the interpreter would print it
            traceback.print_exc()
            code = 1
        finally:
            flags.FLAGS.unparse_flags()
            for name in [n for n in flags.FLAGS if n.startswith("config.")]:
                delattr(flags.FLAGS, name)  # overrides are defined anew on each parse
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


def main() -> None:
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    results = {name: run_case(argv) for name, argv in cases.items()}
    print(json.dumps(results))


if __name__ == "__main__":
    main()
