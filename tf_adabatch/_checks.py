"""Argument checks shared by the public classes: one rule, one message shape.

Integers may be of any integer type (`int`, `np.int64`, ...; what configs and numpy code
hand over) but not bool; the value is returned as a Python int.

>>> import numpy as np
>>> integer("batch_size", np.int64(64))
64
>>> integer("steps", True, minimum=0)
Traceback (most recent call last):
...
ValueError: Argument `steps` must be a non-negative integer. Received: steps=True
"""

from __future__ import annotations

import numbers
from collections.abc import Callable


def integer(name: str, value: object, *, minimum: int = 1) -> int:
    """`value` as a Python int if it is an integer >= `minimum` (1 or 0), else a ValueError
    naming the argument, the rule and the value received."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        rule = "a positive integer" if minimum == 1 else "a non-negative integer"
        raise ValueError(f"Argument `{name}` must be {rule}. Received: {name}={value!r}")
    return int(value)


def is_real(value: object) -> bool:
    """Whether `value` is a real number (any numeric type, numpy's included), not a bool.

    >>> import numpy as np
    >>> is_real(np.float32(0.5)), is_real(True), is_real("0.5")
    (True, False, False)
    """
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def real(name: str, value: object, rule: str, ok: Callable[[float], bool]) -> float:
    """`value` as a float if it is a real number (not a bool) and `ok(value)`, else a
    ValueError naming the argument, the `rule` and the value received.

    >>> import math
    >>> real("factor", 2, "a finite number > 0", lambda v: 0 < v < math.inf)
    2.0
    >>> real("factor", float("inf"), "a finite number > 0", lambda v: 0 < v < math.inf)
    Traceback (most recent call last):
    ...
    ValueError: Argument `factor` must be a finite number > 0. Received: factor=inf
    """
    if not is_real(value) or not ok(float(value)):  # type: ignore[arg-type]
        raise ValueError(f"Argument `{name}` must be {rule}. Received: {name}={value!r}")
    return float(value)  # type: ignore[arg-type]
