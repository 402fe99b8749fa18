"""The reference values of AdaptDL's own goodput function, computed once in a scratch
environment (NOT run by the project or its tests; it needs AdaptDL's goodput.py, which
the project does not ship or copy).

    python3 -m venv /tmp/adaptdl_env
    /tmp/adaptdl_env/bin/pip install numpy scipy autograd
    git -C <a clone of petuum/adaptdl> show \
        542e123e50e98e4a7a7132d36c4af06c9437f6e4:adaptdl/adaptdl/goodput.py > /tmp/goodput.py
    /tmp/adaptdl_env/bin/python docs/benchmarks/adaptdl_reference/compute_reference.py \
        /tmp/goodput.py > docs/benchmarks/adaptdl_reference/values.json

For ImageNet and CIFAR-10 (configs/profiles/pollux_traces/, the Pollux traces): AdaptDL's
`fit_perf_params` on every measured row (accumulation time = step_time - sync_time,
optimizer step time = step_time, as the Pollux simulator reads the traces), then, for
N = 1, 2, 4, ..., 64 GPUs packed 4 per machine and at every epoch of the smallest-batch
run's logged gradient statistics (`validation-<B_init>.csv`: grad_sqr, grad_var),
`GoodputFunction.optimize` (batch in [max(B_init, N min_local), the largest validated
batch], accumulation allowed), and the goodput of the smallest batch, evaluated with the
same function. Output: JSON on stdout.
"""

import csv
import importlib.util
import json
import math
import os
import sys

import numpy as np

TRACES = os.path.join(
    os.path.dirname(__file__), "..", "..", "..", "configs", "profiles", "pollux_traces"
)
DEVICES = (1, 2, 4, 8, 16, 32, 64)
GPUS_PER_NODE = 4


def rows(folder):
    out = []
    with open(os.path.join(folder, "placements.csv")) as f:
        for r in csv.DictReader(f):
            p = r["placement"]
            out.append(
                (
                    len(p),
                    sum(map(int, p)),
                    int(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
            )
    with open(os.path.join(folder, "scalability.csv")) as f:
        for r in csv.DictReader(f):
            out.append(
                (
                    int(r["num_nodes"]),
                    int(r["num_replicas"]),
                    int(r["local_bsz"]),
                    float(r["step_time"]),
                    float(r["sync_time"]),
                )
            )
    return np.array(out, dtype=float)


def main(goodput_path):
    spec = importlib.util.spec_from_file_location("adaptdl_goodput", goodput_path)
    goodput = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(goodput)
    result = {}
    for workload in ("imagenet", "cifar10"):
        folder = os.path.join(TRACES, workload)
        data = rows(folder)
        nodes, replicas, local, step, sync = data.T
        perf = goodput.fit_perf_params(nodes, replicas, local, step - sync, step)
        batches = sorted(
            int(name[len("validation-") : -4])
            for name in os.listdir(folder)
            if name.startswith("validation-")
        )
        init, largest = batches[0], batches[-1]
        min_local, max_local = int(local.min()), int(local.max())
        with open(os.path.join(folder, f"validation-{init}.csv")) as f:
            epochs = [
                (float(r["progress"]), float(r["grad_sqr"]), float(r["grad_var"]))
                for r in csv.DictReader(f)
            ]
        per_n = {}
        for n in DEVICES:
            num_nodes = math.ceil(n / GPUS_PER_NODE)
            smallest = max(init, min_local * n)
            if smallest > largest:
                continue
            points = []
            for epoch, (progress, sqr, var) in enumerate(epochs):
                fn = goodput.GoodputFunction(perf, (sqr, var), init)
                best, atomic, accum = fn.optimize(
                    num_nodes,
                    n,
                    max_batch_size=largest,
                    atomic_bsz_range=(min_local, max_local),
                    accumulation=True,
                )
                atomic_min = math.ceil(smallest / n - 1e-8)
                accum_min = math.ceil(atomic_min / max_local - 1e-8) - 1
                atomic_min = math.ceil(atomic_min / (accum_min + 1) - 1e-8)
                base = float(fn.evaluate(num_nodes, n, atomic_min, accum_min))
                points.append(
                    {
                        "epoch": epoch,
                        "progress": progress,
                        "grad_sqr": sqr,
                        "grad_var": var,
                        "batch": int(n * atomic * (accum + 1)),
                        "atomic_bsz": int(atomic),
                        "accum_steps": int(accum),
                        "goodput": float(best),
                        "smallest_batch": int(n * atomic_min * (accum_min + 1)),
                        "smallest_goodput": base,
                        "speedup": float(best) / base,
                    }
                )
            per_n[str(n)] = points
        result[workload] = {
            "perf_params": dict(zip(goodput.PerfParams._fields, map(float, perf), strict=True)),
            "init_batch_size": init,
            "max_batch_size": largest,
            "min_local_bsz": min_local,
            "max_local_bsz": max_local,
            "devices": per_n,
        }
    result["source"] = (
        "petuum/adaptdl 542e123e50e98e4a7a7132d36c4af06c9437f6e4 adaptdl/adaptdl/goodput.py"
    )
    json.dump(result, sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
