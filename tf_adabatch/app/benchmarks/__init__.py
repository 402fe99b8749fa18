"""Benchmarks: the logic of the repository's benchmark scripts, as tested package modules.

- `efficiency`: statistical efficiency and time to accuracy of the batch-size policies and
  learning-rate rules (`launch/benchmark_efficiency.py`), each run by the launcher
  `python -m tf_adabatch.app`;
- `similarity_paired`: exact against estimated similarity on the same gradients
  (`launch/similarity_paired.py`).

Each takes its script's flags as a frozen `Options`; matplotlib (the `bench` extra) is
imported only by the plotting functions.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

__all__: list[str] = []  # the modules are the API: import them by name


class FlagOptions:
    """Base of a benchmark's frozen `Options` dataclass: one field per flag of its script.

    List values become tuples (absl gives lists; a frozen dataclass should hold tuples),
    and `from_flags` reads every field from absl's flag values by name.

    >>> from dataclasses import dataclass
    >>> @dataclass(frozen=True)
    ... class Options(FlagOptions):
    ...     seeds: tuple[str, ...] = ("0",)
    >>> Options(seeds=["1", "2"]).seeds
    ('1', '2')
    >>> class Flags:
    ...     seeds = ["3"]
    >>> Options.from_flags(Flags()).seeds
    ('3',)
    """

    def __post_init__(self) -> None:
        for field in fields(self):  # type: ignore[arg-type]
            value = getattr(self, field.name)
            if isinstance(value, list):
                object.__setattr__(self, field.name, tuple(value))

    @classmethod
    def from_flags(cls, values: Any) -> Any:
        """The options from absl's flag values (`flags.FLAGS`), read by field name."""
        return cls(**{field.name: getattr(values, field.name) for field in fields(cls)})  # type: ignore[arg-type]
