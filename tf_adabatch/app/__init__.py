"""The application: one training job from an ml_collections config (`run(config, workdir)`).

Not imported by `tf_adabatch`: the core library needs only TensorFlow, Keras and
TensorBoard; this package also needs the `launch` extra (`pip install -e '.[launch]'`:
absl-py, ml-collections, tensorflow-datasets). Its modules, by job:

- `config`: `validate_config` (the library's own rules, reported against config fields);
- `factories`: strategy, durations, model, policy, learning rate, optimizer;
- `checkpoints`: resuming from the newest intact checkpoint, the job's fingerprint;
- `workers`: multi-worker identity, the same-checkpoint check, a lost worker;
- `cluster`: where the workers are (TF_CONFIG or SLURM, TensorFlow's cluster resolvers);
- `preemption`: SIGTERM or Ctrl-C -> a checkpoint at an agreed optimizer step -> `Preempted`;
- `records`: what a run accumulates over its processes (in every checkpoint), divergence;
- `workdir`: one run per workdir (a lock), one-line write errors;
- `loop`: `run`, the outer loop with its evaluate / checkpoint / summary actions;
- `data`, `models`: the datasets and the small models the shipped configs use.

>>> from tf_adabatch import app
>>> "run" in app.__all__
True
"""

from tf_adabatch.app.checkpoints import ResumeError, restore_newest_readable
from tf_adabatch.app.config import ConfigError, validate_config
from tf_adabatch.app.factories import POLICIES, STRATEGIES, make_strategy
from tf_adabatch.app.loop import run
from tf_adabatch.app.preemption import PREEMPTED_EXIT_CODE, Preempted
from tf_adabatch.app.records import Diverged
from tf_adabatch.app.workdir import WorkdirBusy, WriteError
from tf_adabatch.app.workers import WORKER_LOST_EXIT_CODE, WorkerLostError

__all__ = [
    "POLICIES",
    "PREEMPTED_EXIT_CODE",
    "STRATEGIES",
    "WORKER_LOST_EXIT_CODE",
    "ConfigError",
    "Diverged",
    "Preempted",
    "ResumeError",
    "WorkdirBusy",
    "WorkerLostError",
    "WriteError",
    "make_strategy",
    "restore_newest_readable",
    "run",
    "validate_config",
]
