"""Simulation: the home of the code that replays or projects runs instead of training.

- `cluster`: projects a finished run's time to its final progress onto hardware profiles
  we do not have (`launch/simulate_cluster.py`), and fits this machine's profile to the
  engine's measured step times;
- `workloads`: replays whole training jobs of the Pollux traces' six workloads (static
  batches from the traces alone, the library's policies at decision points) to the time to
  each workload's target (`launch/replay_workloads.py`).

The goodput rule's replay on the traces' statistics (`tf_adabatch.app.goodput_replay`) and
the step-time fit (`tf_adabatch.app.step_time_fit`) are to join this package later.
"""

__all__: list[str] = []  # the modules are the API: import them by name
