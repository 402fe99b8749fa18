"""Simulation: the home of the code that replays or projects runs instead of training.

- `cluster`: projects a finished run's time to its final progress onto hardware profiles
  we do not have (`launch/simulate_cluster.py`), and fits this machine's profile to the
  engine's measured step times.

The replays of the Pollux / AdaptDL workload traces (`tf_adabatch.app.goodput_replay`,
`tf_adabatch.app.step_time_fit`) are to join this package later.
"""
