"""Step clocks: what an optimizer step costs, measured on this host or priced by a profile.

The engine times every optimizer step on the host. A *clock* turns that measurement into
the seconds the step is charged: `WallClock` (the default) charges what the host
measured; `VirtualClock` charges what a `StepTimeModel` predicts for the same step on
`devices` accelerators, so a run trained for real on a CPU reports (and the goodput
policy learns) the step times of a GPU cluster. The batch choices, the weights and
every statistic are those of the real run: only the charged seconds differ.

`StepTimeModel` is the step-time model of Pollux (Qiao et al., OSDI 2021, section 4.1),
written for this project, with the all-reduce term of a ring: one optimizer step of k
micro-steps with m examples per device on N devices over `nodes` machines costs

    t_compute(m) = compute_fixed + compute_per_example * m
    t_sync(N)    = 0                                              (N = 1)
                 = fixed + bandwidth * (N - 1) / N + latency * (N - 1)
                   (the intra-node triple when nodes = 1, the inter-node triple else:
                   the slowest link sets the all-reduce's pace)
                   + pair_extra                                   (exactly 2 machines)
    t_step       = (k - 1) * t_compute(m) + (t_compute(m)^g + t_sync(N)^g)^(1/g)

with g >= 1 the overlap of the last backward pass with the all-reduce (g = 1: none,
g -> inf: full). `(N - 1) / N` is the share of the gradient a ring all-reduce moves
through each link (NCCL's "bus bandwidth" factor), `N - 1` its hops. `pair_extra` is
what the measurements show and no ring formula does: on every workload of the Pollux
traces, an all-reduce over exactly two machines is slower than one over three or four
(docs/benchmarks.md, "Measured GPU profiles").

>>> model = StepTimeModel(compute_fixed=0.01, compute_per_example=0.001,
...                       inter_fixed=0.05, overlap=1.0, gpus_per_node=4,
...                       max_local_batch=64)
>>> round(model.step_seconds(global_batch=64, devices=1), 4)   # 0.01 + 0.064
0.074
>>> round(model.step_seconds(global_batch=512, devices=8), 4)  # 0.074 + 0.05 on 2 nodes
0.124
>>> round(model.step_seconds(global_batch=1024, devices=8), 4) # 2 micro-steps of 64
0.198
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from tf_adabatch._checks import is_real

__all__ = ["Clock", "StepTimeModel", "VirtualClock", "WallClock", "charge"]


@dataclasses.dataclass(frozen=True)
class StepTimeModel:
    """Seconds of one optimizer step on N accelerators (see the module docstring).

    All terms are seconds and non-negative; `overlap` >= 1. `gpus_per_node` is how many
    devices one machine holds (devices fill machines in order: 8 devices of 4 per node
    are 2 machines). `max_local_batch` is the largest batch per device the profile
    measured: a larger one is split into micro-steps of at most that size, the extra
    ones charged as gradient accumulation (compute only).

    >>> model = StepTimeModel(compute_fixed=0.02, compute_per_example=0.001, gpus_per_node=4)
    >>> model.nodes(8), round(model.step_seconds(global_batch=256, devices=1), 3)
    (2, 0.276)
    """

    compute_fixed: float
    compute_per_example: float
    intra_fixed: float = 0.0
    intra_bandwidth: float = 0.0
    intra_latency: float = 0.0
    inter_fixed: float = 0.0
    inter_bandwidth: float = 0.0
    inter_latency: float = 0.0
    pair_extra: float = 0.0
    overlap: float = 1.0
    gpus_per_node: int = 1
    max_local_batch: int = 2**31 - 1

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if field.name in ("gpus_per_node", "max_local_batch"):
                ok = isinstance(value, int) and not isinstance(value, bool) and value >= 1
                rule = "an integer >= 1"
            elif field.name == "overlap":
                ok = is_real(value) and 1.0 <= value < math.inf
                rule = "a finite number >= 1"
            else:
                ok = is_real(value) and 0.0 <= value < math.inf
                rule = "a finite number >= 0 (seconds)"
            if not ok:
                raise ValueError(
                    f"StepTimeModel: argument `{field.name}` must be {rule}. "
                    f"Received: {field.name}={value!r}"
                )

    def compute_seconds(self, local_batch: float) -> float:
        """Forward and backward of `local_batch` examples on one device."""
        return self.compute_fixed + self.compute_per_example * local_batch

    def sync_seconds(self, devices: int, nodes: int) -> float:
        """The gradient all-reduce over `devices` devices on `nodes` machines."""
        if devices <= 1:
            return 0.0
        if nodes <= 1:
            fixed, bandwidth, latency = self.intra_fixed, self.intra_bandwidth, self.intra_latency
        else:
            fixed, bandwidth, latency = self.inter_fixed, self.inter_bandwidth, self.inter_latency
            if nodes == 2:
                fixed += self.pair_extra
        return fixed + bandwidth * (devices - 1) / devices + latency * (devices - 1)

    def nodes(self, devices: int) -> int:
        """Machines that `devices` devices fill, `gpus_per_node` each."""
        return -(-devices // self.gpus_per_node)

    def placement_seconds(
        self, local_batch: float, devices: int, nodes: int, accumulation_steps: int = 1
    ) -> float:
        """One step of `accumulation_steps` micro-steps of `local_batch` examples per device."""
        compute = self.compute_seconds(local_batch)
        sync = self.sync_seconds(devices, nodes)
        g = self.overlap
        last = (compute**g + sync**g) ** (1.0 / g) if sync > 0.0 else compute
        return (accumulation_steps - 1) * compute + last

    def step_seconds(self, global_batch: float, devices: int) -> float:
        """An optimizer step of `global_batch` examples split evenly over `devices` devices.

        A share above `max_local_batch` runs as ceil(share / max_local_batch) micro-steps
        of equal size.
        """
        share = global_batch / devices
        steps = max(1, math.ceil(share / self.max_local_batch - 1e-9))
        return self.placement_seconds(share / steps, devices, self.nodes(devices), steps)


class Clock:
    """What a step is charged: `seconds(measured, batch_size, accumulation_steps)`.

    `name` says where the seconds come from (metrics.json's "clock", the summaries).
    `measures_host` is True when the charge is the host's measurement (a step that
    traced is then not charged to the throughput model: its time is the trace's).

    A scripted clock, for tests and what-ifs: one second per micro-step.

    >>> class PerMicroStep(Clock):
    ...     name, measures_host = "scripted", False
    ...     def seconds(self, measured, batch_size, accumulation_steps):
    ...         return float(accumulation_steps)
    >>> PerMicroStep().seconds(0.01, batch_size=64, accumulation_steps=4)
    4.0
    """

    name = "clock"
    measures_host = True

    def seconds(self, measured: float, batch_size: int, accumulation_steps: int) -> float:
        raise NotImplementedError


class WallClock(Clock):
    """The host's own time: each step is charged what it took here (the default).

    >>> WallClock().seconds(0.25, batch_size=64, accumulation_steps=2)
    0.25
    """

    name = "wall"

    def seconds(self, measured: float, batch_size: int, accumulation_steps: int) -> float:
        return measured

    def __repr__(self) -> str:
        return "WallClock()"


class VirtualClock(Clock):
    """Charges every step what `model` predicts on `devices` devices for its global batch.

    The host's measurement is ignored: the run trains for real here, and is priced as
    if it ran on the profiled hardware. Its `name` is "virtual:<profile>x<devices>".

    >>> model = StepTimeModel(compute_fixed=0.01, compute_per_example=0.001,
    ...                       inter_fixed=0.05, gpus_per_node=4)
    >>> clock = VirtualClock(model, devices=8, profile="example")
    >>> clock.name, round(clock.seconds(3.0, batch_size=512, accumulation_steps=1), 4)
    ('virtual:examplex8', 0.124)
    >>> VirtualClock(model, devices=0)
    Traceback (most recent call last):
    ...
    ValueError: VirtualClock: argument `devices` must be an integer >= 1. Received: devices=0
    """

    measures_host = False

    def __init__(self, model: StepTimeModel, devices: int, *, profile: str = "profile") -> None:
        if not isinstance(model, StepTimeModel):
            raise TypeError(
                f"VirtualClock: argument `model` must be a `tf_adabatch.StepTimeModel`. "
                f"Received: model={model!r}"
            )
        if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
            raise ValueError(
                "VirtualClock: argument `devices` must be an integer >= 1. "
                f"Received: devices={devices!r}"
            )
        self.model = model
        self.devices = devices
        self.profile = profile
        self.name = f"virtual:{profile}x{devices}"

    def seconds(self, measured: float, batch_size: int, accumulation_steps: int) -> float:
        return self.model.step_seconds(batch_size, self.devices)

    def __repr__(self) -> str:
        return f"VirtualClock({self.profile!r}, devices={self.devices})"


def charge(
    clock: Clock, seconds: float, batch_sizes: Any, accumulation_steps: Any, *, traced: bool
) -> np.ndarray:
    """What `clock` charges each of the steps one call of the engine took.

    `seconds` is the host's time for the whole call; the call's steps share it
    equally (the host does not see them apart). A host-timed call that traced is
    charged NaN: its time is the trace's.

    >>> charge(WallClock(), 0.3, [64, 128], [1, 2], traced=False).tolist()
    [0.15, 0.15]
    >>> charge(WallClock(), 0.3, [64], [1], traced=True).tolist()
    [nan]
    """
    if traced and clock.measures_host:
        return np.full(len(batch_sizes), np.nan)
    each = seconds / len(batch_sizes)
    return np.array(
        [
            clock.seconds(each, int(b), int(k))
            for b, k in zip(batch_sizes, accumulation_steps, strict=True)
        ],
        dtype=np.float64,
    )
