r"""The launcher: flags in, `tf_adabatch.app.run(config, workdir)` out.

    python -m tf_adabatch.app --config=fashion_mnist --workdir=workdir/fashion_mnist
    tf-adabatch-train --config=fashion_mnist --workdir=workdir/fashion_mnist   # the same
    python launch/train.py --config=configs/fashion_mnist.py --workdir=...    # a checkout

`--config` takes a shipped config by name (`fashion_mnist`, `synthetic`, `text_lm`, ...;
`tf_adabatch.app.resources.config_names()`) or a config file's path (copy a shipped one
from the repository's `configs/` and edit it). Override any field:
`--config.policy.target_similarity=0.3`; `--config.FIELD=None` sets a field that may be
None (e.g. `--config.train.max_consecutive_skips=None`: never stop). The config is locked,
so a mistyped field is an error that names the closest existing one. Rerunning the same
command on the same workdir resumes from its newest intact checkpoint.

Exit codes (each with one line on stderr): 0 done; 2 bad flag, config or workdir, a
workdir another live run holds, checkpoints that cannot be resumed, or a file of the run
that cannot be written (disk full, a file-size limit, a read-only folder); 3 diverged:
stopped on `train.max_consecutive_skips` non-finite steps in a row, or ended with its
loss exploding, its last steps skipped or a non-finite test loss (the message names the
checkpoint to go back to); 138 multi-worker: lost a worker; 143 (128 + SIGTERM)
preempted: a SIGTERM made every worker save a checkpoint at the same optimizer step
(rerun the same command to resume; `--config.train.preemption=False` lets SIGTERM kill
the job instead); 130 (128 + SIGINT) Ctrl-C: the same save, then stop; a second Ctrl-C
quits at once without saving.
"""

from __future__ import annotations

import os
import re
import sys
import traceback
from typing import NoReturn

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app, flags
from ml_collections import config_flags

from tf_adabatch._quiet_import import import_tensorflow_quietly

# The entry points (`run_cli`, `main`, `parse_flags`) run absl; the one pure helper:
__all__ = ["resolve_config_argument"]

_CONFIG = config_flags.DEFINE_config_file(
    "config",
    None,
    "A shipped config by name (fashion_mnist, synthetic, text_lm, ...) or a config file.",
    lock_config=True,
)
_WORKDIR = flags.DEFINE_string(
    "workdir", None, "Output folder (checkpoints, TensorBoard, metrics)."
)
flags.mark_flags_as_required(["config", "workdir"])
_NONE = re.compile(r"^--config\.([A-Za-z_][\w.]*)=None$")


def fail(message: str) -> NoReturn:
    """One line on stderr, exit code 2."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> None:
    del argv  # positional arguments are refused by `parse_flags`
    from absl import logging

    logging.set_verbosity(logging.WARNING)  # TensorFlow's INFO lines drown the progress bar
    import_tensorflow_quietly()
    from tf_adabatch.app import (
        WORKER_LOST_EXIT_CODE,
        ConfigError,
        Diverged,
        Preempted,
        ResumeError,
        WorkerLostError,
        WriteError,
        run,
    )
    from tf_adabatch.engine import NonFiniteGradientsError

    try:
        run(_CONFIG.value, _WORKDIR.value)
    except (ConfigError, ResumeError, WriteError) as err:
        fail(str(err))
    except (NonFiniteGradientsError, Diverged) as err:
        # No checkpoint was written while steps were skipped or the loss exploded: the
        # message names the newest one, which predates them.
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        sys.exit(3)
    except WorkerLostError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(WORKER_LOST_EXIT_CODE)
    except Preempted as err:
        print(f"preempted: {err}", file=sys.stderr)
        sys.exit(err.exit_code)


def _interrupted() -> NoReturn:
    """A Ctrl-C outside the run's watch (start-up), or a second one: one line, exit 130."""
    print(
        "interrupted: stopped at once; nothing was saved after the newest checkpoint "
        "(rerun the same command to resume from it)",
        file=sys.stderr,
    )
    sys.exit(130)


def _config_file_error(err: BaseException, argv: list[str]) -> str | None:
    """'--config: FILE line N: ...' when `err` came from the config file itself."""
    path = next((a.split("=", 1)[1] for a in argv if a.startswith("--config=")), None)
    if path is None:
        return None
    path = os.path.abspath(path.split(":", 1)[0])  # FILE:override
    # ml_collections wraps some errors (the original is then the cause or context).
    chain: list[BaseException] = [err]
    while len(chain) < 10 and (chain[-1].__cause__ or chain[-1].__context__):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)  # type: ignore[arg-type]
    for cause in chain:
        if (
            isinstance(cause, SyntaxError)
            and cause.filename
            and os.path.abspath(cause.filename) == path
        ):
            return f"--config: {path} line {cause.lineno}: {cause.msg}"
        lines = [
            frame.lineno
            for frame in traceback.extract_tb(cause.__traceback__)
            if os.path.abspath(frame.filename) == path
        ]
        if lines:
            return f"--config: {path} line {lines[-1]}: {type(cause).__name__}: {cause}"
    if isinstance(err, OSError):  # ml_collections reports a missing file on first use
        return f"--config: {err}"
    return None


def _flag_error(err: BaseException) -> str:
    message = " ".join(str(err).replace("\\'", "'").replace("\\n", " ").split())
    if len(message) > 1 and message[0] == message[-1] and message[0] in "'\"":
        message = message[1:-1]
    # "flag --config.x=abc: invalid literal for int() with base 10: 'abc'"
    m = re.match(
        r"flag --config\.([\w.]+)=(.*?): (invalid literal for int|could not convert)", message
    )
    if m:
        kind = "an integer" if m.group(3).startswith("invalid literal") else "a number"
        return f"Config field `{m.group(1)}` must be {kind}. Received: {m.group(1)}={m.group(2)!r}"
    return message


def resolve_config_argument(argv: list[str]) -> list[str]:
    """`argv` with `--config=NAME` (a shipped config's name) replaced by that config's file.

    Paths are kept as they are (`--config=configs/x.py`, `--config=x.py:arg`).

    Raises:
      ValueError: a name that is no shipped config (the message lists them).

    >>> resolve_config_argument(["train", "--config=my.py", "--workdir=w"])
    ['train', '--config=my.py', '--workdir=w']
    >>> resolved = resolve_config_argument(["train", "--config", "synthetic"])
    >>> resolved[2].endswith(os.path.join("configs", "synthetic.py"))
    True
    """
    from tf_adabatch.app import resources

    resolved = list(argv)
    for i, arg in enumerate(resolved):
        if arg == "--":
            break
        if arg.startswith("--config="):
            resolved[i] = "--config=" + resources.config_path(arg[len("--config=") :])
        elif arg == "--config" and i + 1 < len(resolved):
            resolved[i + 1] = resources.config_path(resolved[i + 1])
    return resolved


def run_cli() -> None:
    """The console script `tf-adabatch-train`, `python -m tf_adabatch.app`, launch/train.py.

    `--help` shows this module's usage and its flags, whichever file started it (absl
    shows the main module's docstring and the flags it defines).
    """
    sys.modules["__main__"].__doc__ = __doc__
    for flag in (_CONFIG, _WORKDIR):
        flags.FLAGS.register_key_flag_for_module(sys.argv[0], flags.FLAGS[flag.name])
    try:
        app.run(main, flags_parser=parse_flags)
    except KeyboardInterrupt:
        _interrupted()


def parse_flags(argv: list[str]) -> list[str]:
    """absl's parsing, with any bad flag, override or config file reported as one line, exit 2.

    `--config.FIELD=None` is applied after parsing (absl cannot parse None for a
    typed field); positional arguments are refused.
    """
    # Config files import `tf_adabatch` (their base), hence TensorFlow: import it first,
    # quietly, so that loading the config prints none of its start-up lines.
    import_tensorflow_quietly()  # a no-op when `import tf_adabatch` did it
    try:
        argv = resolve_config_argument(argv)
        sys.argv = resolve_config_argument(sys.argv)  # ml_collections reads sys.argv too
    except ValueError as err:
        fail(str(err))
    nones = [m.group(1) for a in argv[1:] if (m := _NONE.match(a))]
    try:
        rest = flags.FLAGS([a for a in argv if not _NONE.match(a)])
        config = _CONFIG.value
        config.keys()  # a config that failed to load raises on first use
    except Exception as err:  # reported as one line, whatever it is
        fail(_config_file_error(err, argv) or _flag_error(err))
    if len(rest) > 1:
        fail(f"unexpected positional argument(s): {' '.join(rest[1:])} (flags are --name=value)")
    for field in nones:
        *parents, leaf = field.split(".")
        try:
            node = config
            for parent in parents:
                node = node[parent]
            node[leaf] = None
        except (AttributeError, KeyError, TypeError, ValueError) as err:
            fail(f"flag --config.{field}=None: {_flag_error(err)}")
    return rest


if __name__ == "__main__":
    run_cli()
