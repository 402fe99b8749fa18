r"""Runs N workers of launch/train.py on this machine (127.0.0.1), for trying multi-worker.

    python launch/multiworker.py --num_workers=2 --timeout=600 -- \
        --config=configs/digits.py --workdir=workdir/digits_mw

Each worker gets TF_CONFIG with the cluster (free loopback ports) and its index, and
`--config.strategy=multi_worker` and the same --workdir; worker i > 0 writes its log to
WORKDIR/worker-i.log, worker 0 to this terminal. All workers are stopped if one
fails or the timeout passes; the exit code is the first failing worker's (4 if it was
killed by a signal, as launch/train.py's code for a lost worker; 124 on timeout). Worker 0 (the
chief) writes checkpoints, TensorBoard logs and metrics into WORKDIR, worker i > 0 into
WORKDIR/worker-i (MultiWorkerMirroredStrategy needs every worker to save); all resume
from the chief's checkpoints, so rerunning the same command resumes.

On a real cluster, use SLURM's environment (`--config.cluster=slurm`,
launch/slurm/train.sbatch), a Kubeflow TFJob (launch/k8s/tfjob.yaml), or set TF_CONFIG
on each machine yourself, e.g. for worker 1 of 2:

    TF_CONFIG='{"cluster": {"worker": ["host0:12345", "host1:12345"]}, "task": {"type": "worker", "index": 1}}' \
        python launch/train.py --config=configs/fashion_mnist.py --workdir=/shared/run --config.strategy=multi_worker
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

from absl import app, flags

_NUM_WORKERS = flags.DEFINE_integer("num_workers", 2, "Worker processes to start.", lower_bound=1)
_TIMEOUT = flags.DEFINE_integer(
    "timeout", 1800, "Seconds before every worker is stopped.", lower_bound=1
)

# launch/train.py's exit code for a multi-worker run that lost a worker
# (tf_adabatch.app.WORKER_LOST_EXIT_CODE; not imported: this launcher starts without TensorFlow).
LOST_WORKER = 138
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "train.py")


def free_ports(count: int) -> list[int]:
    """`count` distinct free TCP ports on 127.0.0.1."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def launch(train_args: list[str], num_workers: int, timeout: float) -> int:
    """Starts the workers, waits for all, stops all on the first failure; returns the exit code."""
    workdir = next((a.split("=", 1)[1] for a in train_args if a.startswith("--workdir=")), None)
    if workdir is None:
        print("error: pass --workdir=... after `--`", file=sys.stderr)
        return 2
    os.makedirs(workdir, exist_ok=True)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(num_workers)]}
    procs: list[subprocess.Popen] = []
    logs = []
    try:
        for index in range(num_workers):
            env = dict(
                os.environ,
                TF_CONFIG=json.dumps(
                    {"cluster": cluster, "task": {"type": "worker", "index": index}}
                ),
            )
            log = open(os.path.join(workdir, f"worker-{index}.log"), "a")  # noqa: SIM115 - closed below
            logs.append(log)
            out = None if index == 0 else log
            procs.append(
                subprocess.Popen(
                    [sys.executable, TRAIN, *train_args, "--config.strategy=multi_worker"],
                    env=env,
                    stdout=out,
                    stderr=subprocess.STDOUT if out else None,
                )
            )
        deadline = time.monotonic() + timeout
        while True:
            codes = [p.poll() for p in procs]
            failed = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
            if failed:
                index, code = failed[0]
                if code < 0:  # killed by a signal: a lost worker, as train.py's exit 138
                    name = signal.Signals(-code).name
                    print(
                        f"error: worker {index} was killed ({name}); stopping the others. "
                        "Rerun the same command to resume from the chief's last checkpoint.",
                        file=sys.stderr,
                    )
                    return LOST_WORKER
                print(
                    f"error: worker {index} exited with {code}; stopping the others",
                    file=sys.stderr,
                )
                return code
            if all(c == 0 for c in codes):
                return 0
            if time.monotonic() > deadline:
                print(
                    f"error: timeout after {timeout:.0f} s; stopping the workers", file=sys.stderr
                )
                return 124
            time.sleep(0.5)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()


def main(argv: list[str]) -> None:
    sys.exit(launch(argv[1:], _NUM_WORKERS.value, _TIMEOUT.value))


if __name__ == "__main__":
    app.run(main)
