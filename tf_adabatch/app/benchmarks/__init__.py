"""Benchmarks: the logic of the repository's benchmark scripts, as tested package modules.

- `efficiency`: statistical efficiency and time to accuracy of the batch-size policies and
  learning-rate rules (`launch/benchmark_efficiency.py`), each run by the launcher
  `python -m tf_adabatch.app`;
- `similarity_paired`: exact against estimated similarity on the same gradients
  (`launch/similarity_paired.py`).

Each takes its script's flags as a frozen `Options`; matplotlib (the `bench` extra) is
imported only by the plotting functions.
"""

__all__: list[str] = []  # the modules are the API: import them by name
